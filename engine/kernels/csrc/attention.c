/* Decode attention straight from the paged KV pool (no gather copy). */
#include "kernels.h"

/* where row p of a sequence's K (half 0) or V (half 1) for kv head g lies in the pool */
static inline const char *kv_at(const void *pool, int pool_dt, const int32_t *pages, int p,
                                int half, int g, int kv_heads, int page_size, int dim) {
    size_t block = ((size_t)pages[p / page_size] * 2 + half) * kv_heads + g;
    return (const char *)pool + (block * page_size + p % page_size) * dim * ferry_elem(pool_dt);
}

/* that row as float32: the pool's own bytes where it holds float32 (no copy), else converted
 * into `buf` */
static inline const float *kv_row(const void *pool, int pool_dt, const int32_t *pages, int p,
                                  int half, int g, int kv_heads, int page_size, int dim,
                                  float *buf) {
    const char *row = kv_at(pool, pool_dt, pages, p, half, g, kv_heads, page_size, dim);
    if (pool_dt == FERRY_F32) return (const float *)row;
    ferry_load_row(row, pool_dt, buf, dim);
    return buf;
}

/* One new token per sequence over its cached K/V. Sequence s has kv_lens[s] positions on
 * pages page_ids[page_starts[s]...] and attends over the last `window` of them (window 0:
 * all; a sliding-window layer's); its query heads are rows of q (q_stride elements apart),
 * head h attends with kv head h / (heads/kv_heads). Scores, softmax and the weighted sum run
 * in float32; q and out ([seqs, heads * dim]) are in dt, the pool in pool_dt.
 * Work is split over (sequence, kv head) pairs across the OpenMP team. */
int ferry_decode_attention(const void *q, int64_t q_stride, const void *pool,
                           const int32_t *page_ids, const int64_t *page_starts,
                           const int32_t *kv_lens, int64_t seqs, int heads, int kv_heads,
                           int dim, int page_size, float scale, void *out, int dt, int pool_dt,
                           int window) {
    size_t es = ferry_elem(dt), pes = ferry_elem(pool_dt);
    int group = heads / kv_heads, failed = 0;
    int64_t max_len = 0;
    for (int64_t s = 0; s < seqs; s++)
        if (kv_lens[s] > max_len) max_len = kv_lens[s];
#pragma omp parallel
    {
        float *qf = (float *)malloc((size_t)group * dim * sizeof(float));
        float *acc = (float *)malloc((size_t)group * dim * sizeof(float));
        float *kf = (float *)malloc((size_t)dim * 8 * sizeof(float));
        float *scores = (float *)malloc((size_t)group * (max_len > 0 ? max_len : 1) * sizeof(float));
        int ok = qf && acc && kf && scores;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t work = 0; work < seqs * kv_heads; work++) {
            if (!ok) continue; /* the call fails as a whole; other threads finish their share */
            int64_t s = work / kv_heads;
            int g = (int)(work % kv_heads);
            int all = kv_lens[s];
            /* positions [lo, all) attend: p below counts from lo */
            int lo = window > 0 && all > window ? all - window : 0, len = all - lo;
            const int32_t *pages = page_ids + page_starts[s];
            for (int j = 0; j < group; j++)
                ferry_load_row((const char *)q + ((size_t)s * q_stride + (size_t)(g * group + j) * dim) * es,
                               dt, qf + j * dim, dim);
            int p0 = 0;
#ifdef FERRY_AVX2
            if (dim % 8 == 0) /* eight positions at a time: one reduction for 8 dots */
                for (; p0 + 8 <= len; p0 += 8) {
                    const float *kr[8];
                    for (int k = 0; k < 8; k++)
                        kr[k] = kv_row(pool, pool_dt, pages, lo + p0 + k, 0, g, kv_heads, page_size,
                                       dim, kf + k * dim);
                    for (int j = 0; j < group; j++) {
                        const float *qj = qf + j * dim;
                        __m256 dots[8];
                        for (int k = 0; k < 8; k++) {
                            __m256 a = _mm256_setzero_ps();
                            for (int i = 0; i < dim; i += 8)
                                a = _mm256_fmadd_ps(_mm256_loadu_ps(qj + i),
                                                    _mm256_loadu_ps(kr[k] + i), a);
                            dots[k] = a;
                        }
                        _mm256_storeu_ps(scores + (size_t)j * len + p0,
                                         _mm256_mul_ps(ferry_sum8x8(dots), _mm256_set1_ps(scale)));
                    }
                }
#endif
            for (int p = p0; p < len; p++) {
                const float *kr = kv_row(pool, pool_dt, pages, lo + p, 0, g, kv_heads, page_size, dim,
                                         kf);
                for (int j = 0; j < group; j++) {
                    const float *qj = qf + j * dim;
                    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                    for (int i = 0; i < dim; i++) dot += qj[i] * kr[i];
                    scores[(size_t)j * len + p] = dot * scale;
                }
            }
            for (int j = 0; j < group; j++) {
                float *sc = scores + (size_t)j * len, mx = -INFINITY, sum = 0.f;
                for (int p = 0; p < len; p++) mx = sc[p] > mx ? sc[p] : mx;
                int p = 0;
#ifdef FERRY_AVX2
                __m256 vsum = _mm256_setzero_ps(), vmx = _mm256_set1_ps(mx);
                for (; p + 8 <= len; p += 8) {
                    __m256 e = ferry_exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + p), vmx));
                    _mm256_storeu_ps(sc + p, e);
                    vsum = _mm256_add_ps(vsum, e);
                }
                float lanes[8];
                _mm256_storeu_ps(lanes, vsum);
                for (int k = 0; k < 8; k++) sum += lanes[k];
#endif
                for (; p < len; p++) {
                    sc[p] = expf(sc[p] - mx);
                    sum += sc[p];
                }
                float inv = 1.0f / sum;
                for (int p = 0; p < len; p++) sc[p] *= inv;
            }
#ifdef FERRY_AVX2
            if (dim % 64 == 0) { /* 64 output values per pass, accumulated in registers */
                for (int j = 0; j < group; j++)
                    for (int c = 0; c < dim; c += 64) {
                        __m256 a[8];
                        for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
                        const float *sc = scores + (size_t)j * len;
                        for (int p = 0; p < len; p++) {
                            const char *row = kv_at(pool, pool_dt, pages, lo + p, 1, g, kv_heads,
                                                    page_size, dim) + c * pes;
                            __m256 w = _mm256_set1_ps(sc[p]);
                            for (int k = 0; k < 8; k++)
                                a[k] = _mm256_fmadd_ps(w, ferry_load8(row, pool_dt, k * 8), a[k]);
                        }
                        for (int k = 0; k < 8; k++)
                            _mm256_storeu_ps(acc + j * dim + c + k * 8, a[k]);
                    }
                for (int j = 0; j < group; j++)
                    ferry_store_row((char *)out + ((size_t)s * heads + (size_t)(g * group + j)) * dim * es,
                                    dt, acc + j * dim, dim);
                continue;
            }
#endif
            memset(acc, 0, (size_t)group * dim * sizeof(float));
            for (int p = 0; p < len; p++) {
                const float *vr = kv_row(pool, pool_dt, pages, lo + p, 1, g, kv_heads, page_size, dim,
                                         kf);
                for (int j = 0; j < group; j++) {
                    float w = scores[(size_t)j * len + p], *aj = acc + j * dim;
#pragma omp simd
                    for (int i = 0; i < dim; i++) aj[i] += w * vr[i];
                }
            }
            for (int j = 0; j < group; j++)
                ferry_store_row((char *)out + ((size_t)s * heads + (size_t)(g * group + j)) * dim * es,
                                dt, acc + j * dim, dim);
        }
        free(qf);
        free(acc);
        free(kf);
        free(scores);
    }
    return failed ? FERRY_ENOMEM : FERRY_OK;
}
