/* RMS norm, optionally fused with the residual add before it. */
#include "kernels.h"

/* out[r] = rms_norm(x[r]) * w, as Hugging Face's LlamaRMSNorm rounds: normalise in float32,
 * round to dt, multiply by the weight, round. With `residual` (non-NULL) first
 * residual[r] += x[r] (rounded to dt) and normalise the sum: the decoder's residual add and
 * the next norm in one pass. out may be x when residual is NULL. */
int ferry_rms_norm(void *x, void *residual, const void *w, void *out, int64_t rows, int dim,
                   float eps, int dt) {
    size_t es = ferry_elem(dt);
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
            char *xr = (char *)x + (size_t)r * dim * es;
            ferry_load_row(xr, dt, h, dim);
            if (residual) {
                char *rr = (char *)residual + (size_t)r * dim * es;
                ferry_load_row(rr, dt, tmp, dim);
                for (int i = 0; i < dim; i++) h[i] = ferry_round_dt(h[i] + tmp[i], dt);
                ferry_store_row(rr, dt, h, dim);
            }
            float ss = 0.f;
#pragma omp simd reduction(+ : ss)
            for (int i = 0; i < dim; i++) ss += h[i] * h[i];
            float inv = 1.0f / sqrtf(ss / (float)dim + eps);
            for (int i = 0; i < dim; i++) h[i] = wf[i] * ferry_round_dt(h[i] * inv, dt);
            ferry_store_row((char *)out + (size_t)r * dim * es, dt, h, dim);
        }
        free(h);
    }
    return failed ? FERRY_ENOMEM : FERRY_OK;
}
