/* Greedy sampling's row-wise argmax. */
#include "kernels.h"

/* out[r] = index of the largest of logits[r, 0:n] (the first one on ties; the first NaN if
 * any, as torch.argmax). */
int ferry_argmax(const void *logits, int64_t rows, int64_t n, int dt, int64_t *out) {
    int failed = 0;
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        float *v = (float *)malloc((size_t)n * sizeof(float));
        if (!v) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
        ferry_load_row((const char *)logits + (size_t)r * n * ferry_elem(dt), dt, v, n);
        float best = -INFINITY;
        int nan = 0;
#pragma omp simd reduction(max : best) reduction(| : nan)
        for (int64_t i = 0; i < n; i++) {
            best = v[i] > best ? v[i] : best;
            nan |= v[i] != v[i];
        }
        int64_t idx = 0;
        for (int64_t i = 0; i < n; i++)
            if (nan ? v[i] != v[i] : v[i] == best) {
                idx = i;
                break;
            }
        out[r] = idx;
        free(v);
    }
    return failed ? FERRY_ENOMEM : FERRY_OK;
}
