/* An encoder layer's steps between its products (BERT family): bidirectional attention over
 * each packed input's own tokens, and the residual add with LayerNorm. For short inputs the
 * torch ops' fixed cost (dispatch, a parallel region each, padding several inputs to one
 * block) outweighed their work; engine/execution/model/architectures/encoders/bert.py
 * (encode_native) calls these, and leaves a long input's attention to torch's kernel. */
#include "kernels.h"

/* up to QB query rows of one head at a time: their scores over a key block share each load */
#define QB 4

/* scores s[r][j] = q[r] . k[j] for QB rows of q (qs: [QB, dim], already scaled) over n keys
 * of kt ([dim, np]: K transposed, np = n rounded up to 8, the padding zero) */
static void head_scores(const float *qs, int rows, const float *kt, int64_t np, int dim,
                        float *s) {
    int64_t j = 0;
#ifdef FERRY_AVX2
    for (; j + 8 <= np; j += 8) {
        __m256 acc[QB];
        for (int r = 0; r < QB; r++) acc[r] = _mm256_setzero_ps();
        for (int c = 0; c < dim; c++) {
            const __m256 k = _mm256_loadu_ps(kt + (int64_t)c * np + j);
            for (int r = 0; r < QB; r++)
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(qs[r * dim + c]), k, acc[r]);
        }
        for (int r = 0; r < rows; r++) _mm256_storeu_ps(s + r * np + j, acc[r]);
    }
#endif
    for (; j < np; j++)
        for (int r = 0; r < rows; r++) {
            float acc = 0.f;
            for (int c = 0; c < dim; c++) acc += qs[r * dim + c] * kt[(int64_t)c * np + j];
            s[r * np + j] = acc;
        }
}

/* o[r] = sum_j p[r][j] v[j] for QB rows of probabilities p ([QB, np]) over v ([n, dim]) */
static void head_values(const float *p, int rows, int64_t np, const float *v, int64_t n,
                        int dim, float *o) {
    int c = 0;
#ifdef FERRY_AVX2
    for (; c + 16 <= dim; c += 16) {
        __m256 acc[QB][2];
        for (int r = 0; r < QB; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j++) {
            const __m256 v0 = _mm256_loadu_ps(v + j * dim + c);
            const __m256 v1 = _mm256_loadu_ps(v + j * dim + c + 8);
            for (int r = 0; r < QB; r++) {
                const __m256 pr = _mm256_set1_ps(p[r * np + j]);
                acc[r][0] = _mm256_fmadd_ps(pr, v0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(pr, v1, acc[r][1]);
            }
        }
        for (int r = 0; r < rows; r++) {
            _mm256_storeu_ps(o + r * dim + c, acc[r][0]);
            _mm256_storeu_ps(o + r * dim + c + 8, acc[r][1]);
        }
    }
#endif
    for (; c < dim; c++)
        for (int r = 0; r < rows; r++) {
            float acc = 0.f;
            for (int64_t j = 0; j < n; j++) acc += p[r * np + j] * v[j * dim + c];
            o[r * dim + c] = acc;
        }
}

/* one (input, head): n tokens from row s0. Scratch: kt [dim, np], v [n, dim], q and o
 * [QB, dim] each, scores [QB, np] */
static void attend_head(const char *qkv, int dt, int64_t s0, int64_t n, int64_t stride,
                        int64_t hidden, int h, int dim, float scale, char *out, int out_dt,
                        float *buf) {
    const size_t es = ferry_elem(dt), oes = ferry_elem(out_dt);
    const int64_t np = (n + 7) / 8 * 8;
    float *kt = buf, *v = kt + np * dim, *q = v + n * dim, *o = q + QB * dim, *sc = o + QB * dim;
    for (int64_t j = 0; j < n; j++) {
        const char *row = qkv + (size_t)((s0 + j) * stride) * es;
        ferry_load_row(row + (size_t)(hidden + (int64_t)h * dim) * es, dt, q, dim);
        for (int c = 0; c < dim; c++) kt[(int64_t)c * np + j] = q[c];
        ferry_load_row(row + (size_t)(2 * hidden + (int64_t)h * dim) * es, dt, v + j * dim, dim);
    }
    for (int c = 0; c < dim; c++)
        for (int64_t j = n; j < np; j++) kt[(int64_t)c * np + j] = 0.f;
    for (int64_t t0 = 0; t0 < n; t0 += QB) {
        const int rows = n - t0 < QB ? (int)(n - t0) : QB;
        for (int r = 0; r < QB; r++) {
            float *qr = q + r * dim;
            if (r < rows) {
                ferry_load_row(qkv + (size_t)((s0 + t0 + r) * stride + (int64_t)h * dim) * es,
                               dt, qr, dim);
                for (int c = 0; c < dim; c++) qr[c] *= scale;
            } else {
                memset(qr, 0, (size_t)dim * sizeof(float));
            }
        }
        head_scores(q, rows, kt, np, dim, sc);
        for (int r = 0; r < rows; r++) ferry_softmax(sc + r * np, (int)n);
        head_values(sc, rows, np, v, n, dim, o);
        for (int r = 0; r < rows; r++)
            ferry_store_row(out + (size_t)((s0 + t0 + r) * hidden + (int64_t)h * dim) * oes,
                            out_dt, o + r * dim, dim);
    }
}

int ferry_encoder_attention(const void *qkv, int dt, const int64_t *lengths, int64_t inputs,
                            int64_t max_len, int heads, int dim, float scale, void *out,
                            int out_dt) {
    const int64_t hidden = (int64_t)heads * dim, stride = 3 * hidden;
    int64_t *starts = (int64_t *)malloc((size_t)(inputs > 0 ? inputs : 1) * sizeof(int64_t));
    if (!starts) return FERRY_ENOMEM;
    int64_t longest = 0, total = 0, work = 0;
    for (int64_t i = 0; i < inputs; i++) {
        starts[i] = total;
        total += lengths[i];
        if (max_len > 0 && lengths[i] > max_len) continue; /* the caller's */
        longest = lengths[i] > longest ? lengths[i] : longest;
        work += lengths[i] * lengths[i];
    }
    const int64_t pairs = inputs * heads;
    int failed = 0;
    /* the (input, head) pairs are independent: split over the team unless the whole round is
     * a few thousand multiply-adds, less than waking the team costs */
#pragma omp parallel if (work * hidden >= (1 << 16))
    {
        const size_t np = (size_t)(longest + 7) / 8 * 8;
        float *buf = ferry_scratch((np * dim + (size_t)longest * dim + 2 * QB * (size_t)dim +
                                    QB * np) * sizeof(float), &failed);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < pairs; p++) {
            if (!buf) continue; /* the call fails as a whole; the team still meets the barrier */
            const int64_t i = p / heads, n = lengths[i];
            if (n > 0 && (max_len <= 0 || n <= max_len))
                attend_head((const char *)qkv, dt, starts[i], n, stride, hidden,
                            (int)(p % heads), dim, scale, (char *)out, out_dt, buf);
        }
        free(buf);
    }
    free(starts);
    return failed ? FERRY_ENOMEM : FERRY_OK;
}

int ferry_add_layer_norm(const float *x, const void *y, int y_dt, const float *w,
                         const float *b, float eps, int64_t rows, int dim, float *out,
                         void *out16) {
    int failed = 0;
#pragma omp parallel if (rows * dim >= (1 << 15))
    {
        float *h = ferry_scratch((size_t)dim * sizeof(float), &failed);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!h) continue;
            const float *xr = x + r * dim;
            if (y) {
                ferry_load_row((const char *)y + (size_t)(r * dim) * ferry_elem(y_dt), y_dt, h,
                               dim);
                for (int i = 0; i < dim; i++) h[i] += xr[i];
            } else {
                memcpy(h, xr, (size_t)dim * sizeof(float));
            }
            float mean = 0.f, var = 0.f;
#pragma omp simd reduction(+ : mean)
            for (int i = 0; i < dim; i++) mean += h[i];
            mean /= (float)dim;
#pragma omp simd reduction(+ : var)
            for (int i = 0; i < dim; i++) var += (h[i] - mean) * (h[i] - mean);
            const float rstd = 1.0f / sqrtf(var / (float)dim + eps);
            float *o = out + r * dim;
            for (int i = 0; i < dim; i++) o[i] = (h[i] - mean) * rstd * w[i] + b[i];
            if (out16) ferry_store_row((uint16_t *)out16 + r * dim, FERRY_BF16, o, dim);
        }
        free(h);
    }
    return failed ? FERRY_ENOMEM : FERRY_OK;
}
