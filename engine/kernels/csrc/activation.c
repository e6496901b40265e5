/* SiLU-gated activation of the MLP. */
#include "kernels.h"

/* out[r, i] = silu(gate) * up for gate_up rows [gate (n) | up (n)], rounding silu's result
 * to dt first as the separate torch ops do. */
int ferry_silu_mul(const void *gate_up, void *out, int64_t rows, int n, int dt) {
    size_t es = ferry_elem(dt);
    float *g = (float *)malloc((size_t)n * 2 * sizeof(float));
    if (!g) return FERRY_ENOMEM;
    float *u = g + n;
    for (int64_t r = 0; r < rows; r++) {
        const char *src = (const char *)gate_up + (size_t)r * 2 * n * es;
        ferry_load_row(src, dt, g, n);
        ferry_load_row(src + (size_t)n * es, dt, u, n);
        int i = 0;
#ifdef FERRY_AVX2
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(g + i);
            __m256 e = ferry_exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
            _mm256_storeu_ps(g + i, _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
        }
#endif
        for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i]));
        for (i = 0; i < n; i++) g[i] = ferry_round_dt(g[i], dt) * u[i];
        ferry_store_row((char *)out + (size_t)r * n * es, dt, g, n);
    }
    free(g);
    return FERRY_OK;
}
