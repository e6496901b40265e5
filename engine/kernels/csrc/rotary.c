/* Rotary position embedding in place. */
#include "kernels.h"

/* Hugging Face's rotate_half convention: for each of `heads` head vectors (dim values,
 * contiguous) of each token row (row_stride elements apart), x1' = x1 cos - x2 sin,
 * x2' = x2 cos + x1 sin over the two halves, computed as torch's x * cos + roll(x, dim / 2) *
 * sin with the model's [tokens, dim] tables in dt (cos = [c | c], sin = [-s | s]). */
int ferry_rotary(void *x, int64_t row_stride, int64_t tokens, int heads, int dim,
                 const void *cos, const void *sin, int dt) {
    int half = dim / 2, failed = 0;
    size_t es = ferry_elem(dt);
    /* tokens are independent: split over the team for a prefill chunk's or a big round's */
#pragma omp parallel if (tokens * heads * dim >= (1 << 13))
    {
        float *v = ferry_scratch((size_t)dim * 4 * sizeof(float), &failed);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; t++) {
            if (!v) continue; /* the call fails as a whole; the team still meets the barrier */
            float *c = v + dim, *s = v + 2 * dim, *r = v + 3 * dim;
            ferry_load_row((const char *)cos + (size_t)t * dim * es, dt, c, dim);
            ferry_load_row((const char *)sin + (size_t)t * dim * es, dt, s, dim);
            for (int hd = 0; hd < heads; hd++) {
                char *p = (char *)x + ((size_t)t * row_stride + (size_t)hd * dim) * es;
                ferry_load_row(p, dt, v, dim);
                /* as torch computes x*cos + roll(x)*sin: the product x*cos rounds to dt */
                for (int i = 0; i < dim; i++) r[i] = v[i] * c[i];
                ferry_round_row(r, dim, dt);
                for (int i = 0; i < half; i++) {
                    r[i] += v[i + half] * s[i];
                    r[i + half] += v[i] * s[i + half];
                }
                ferry_store_row(p, dt, r, dim);
            }
        }
        free(v);
    }
    return failed ? FERRY_ENOMEM : FERRY_OK;
}
