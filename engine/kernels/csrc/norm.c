/* RMS norm, optionally fused with the residual add before it, and per head (QK-norm). */
#include "kernels.h"

/* one row of dim float32 values in place: round(h / rms(h)) * w */
static void norm_row(float *h, const float *wf, int dim, float eps, int dt) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < dim; i++) ss += h[i] * h[i];
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int i = 0; i < dim; i++) h[i] *= inv;
    ferry_round_row(h, dim, dt);
    for (int i = 0; i < dim; i++) h[i] *= wf[i];
}

/* tokens x heads rows of dim values: a token's heads contiguous, tokens `stride` values apart
 * in x, residual and out alike */
static int norm_rows(void *x, void *residual, const void *w, void *out, int64_t tokens,
                     int heads, int64_t stride, int dim, float eps, int dt) {
    const size_t es = ferry_elem(dt);
    const int64_t rows = tokens * heads;
    int failed = 0;
    /* rows are independent: split over the team where there are enough of them (a prefill
     * chunk's, a big decode round's, or their per-head QK-norm's); each row's steps are the same
     * either way */
#pragma omp parallel if (rows * dim >= (1 << 13))
    {
        float *h = ferry_scratch((size_t)dim * 3 * sizeof(float), &failed);
        float *wf = NULL, *tmp = NULL;
        if (h) {
            wf = h + dim;
            tmp = h + 2 * dim;
            ferry_load_row(w, dt, wf, dim);
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!h) continue; /* the call fails as a whole; the team still meets the barrier */
            const size_t at = ((size_t)(r / heads) * stride + (size_t)(r % heads) * dim) * es;
            ferry_load_row((char *)x + at, dt, h, dim);
            if (residual) {
                ferry_load_row((char *)residual + at, dt, tmp, dim);
                for (int i = 0; i < dim; i++) h[i] += tmp[i];
                ferry_round_row(h, dim, dt);
                ferry_store_row((char *)residual + at, dt, h, dim);
            }
            norm_row(h, wf, dim, eps, dt);
            ferry_store_row((char *)out + at, dt, h, dim);
        }
        free(h);
    }
    return failed ? FERRY_ENOMEM : FERRY_OK;
}

/* out[r] = rms_norm(x[r]) * w, as Hugging Face's LlamaRMSNorm rounds: normalise in float32,
 * round to dt, multiply by the weight, round. With `residual` (non-NULL) first
 * residual[r] += x[r] (rounded to dt) and normalise the sum: the decoder's residual add and
 * the next norm in one pass. out may be x when residual is NULL. */
int ferry_rms_norm(void *x, void *residual, const void *w, void *out, int64_t rows, int dim,
                   float eps, int dt) {
    return norm_rows(x, residual, w, out, rows, 1, dim, dim, eps, dt);
}

int ferry_head_norm(void *x, int64_t row_stride, int64_t tokens, int heads, int dim,
                    const void *w, float eps, int dt) {
    return norm_rows(x, NULL, w, x, tokens, heads, row_stride, dim, eps, dt);
}
