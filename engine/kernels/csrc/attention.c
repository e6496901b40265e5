/* Decode attention straight from the paged KV pool (no gather copy). */
#include "kernels.h"

/* The pool is [pages, 2 (K, V), kv_heads, page_size, dim]: a sequence's K rows for one kv
 * head lie page_size to a page, contiguous within it; its V rows one (kv_heads * page_size *
 * dim)-element step further. offs[i] (elements): where K row lo + i lies, found page by page
 * so no position pays a division. */
static void kv_offsets(const int32_t *pages, int lo, int len, int g, int kv_heads,
                       int page_size, int dim, int64_t *offs) {
    int pg = lo / page_size, in = lo % page_size;
    for (int i = 0; i < len; i++) {
        offs[i] = (((int64_t)pages[pg] * 2 * kv_heads + g) * page_size + in) * dim;
        if (++in == page_size) {
            in = 0;
            pg++;
        }
    }
}

/* that row as float32: the pool's own bytes where it holds float32 (no copy), else converted
 * into `buf` */
static inline const float *kv_row(const char *pool, int pool_dt, int64_t off, int dim,
                                  float *buf) {
    const char *row = pool + off * (int64_t)ferry_elem(pool_dt);
    if (pool_dt == FERRY_F32) return (const float *)row;
    ferry_load_row(row, pool_dt, buf, dim);
    return buf;
}

/* the cache lines of the row at `off`: a sequence's pages lie anywhere in the pool, so the
 * hardware prefetcher loses the thread at every page, and the rows' loads waited on memory */
static inline void kv_prefetch(const char *pool, int pool_dt, int64_t off, int dim) {
    const char *row = pool + off * (int64_t)ferry_elem(pool_dt);
    for (int b = 0; b < dim * (int)ferry_elem(pool_dt); b += 64) __builtin_prefetch(row + b);
}

enum { AHEAD = 16 }; /* rows prefetched ahead of the one read */

enum { V_TILE = 64 }; /* V rows widened to float32 at a time, for all the group's heads */

/* One new token per sequence over its cached K/V. Sequence s has kv_lens[s] positions on
 * pages page_ids[page_starts[s]...] and attends over the last `window` of them (window 0:
 * all; a sliding-window layer's); its query heads are rows of q (q_stride elements apart),
 * head h attends with kv head h / (heads/kv_heads). Scores, softmax and the weighted sum run
 * in float32; q and out ([seqs, heads * dim]) are in dt, the pool in pool_dt. K and V rows
 * are widened once for all the query heads that share them.
 * Work is split over (sequence, kv head) pairs across the OpenMP team. */
int ferry_decode_attention(const void *q, int64_t q_stride, const void *pool,
                           const int32_t *page_ids, const int64_t *page_starts,
                           const int32_t *kv_lens, int64_t seqs, int heads, int kv_heads,
                           int dim, int page_size, float scale, void *out, int dt, int pool_dt,
                           int window) {
    size_t es = ferry_elem(dt);
    const char *kv = (const char *)pool;
    const int64_t v_step = (int64_t)kv_heads * page_size * dim; /* K row -> its V row */
    int group = heads / kv_heads, failed = 0;
    int64_t max_len = 1;
    for (int64_t s = 0; s < seqs; s++)
        if (kv_lens[s] > max_len) max_len = kv_lens[s];
#pragma omp parallel
    {
        float *qf = (float *)malloc((size_t)group * dim * sizeof(float));
        float *acc = (float *)malloc((size_t)group * dim * sizeof(float));
        float *kf = (float *)malloc((size_t)dim * V_TILE * sizeof(float));
        float *scores = (float *)malloc((size_t)group * max_len * sizeof(float));
        int64_t *offs = (int64_t *)malloc((size_t)max_len * sizeof(int64_t));
        int ok = qf && acc && kf && scores && offs;
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
            kv_offsets(page_ids + page_starts[s], lo, len, g, kv_heads, page_size, dim, offs);
            for (int p = 0; p < len && p < AHEAD; p++) kv_prefetch(kv, pool_dt, offs[p], dim);
            for (int j = 0; j < group; j++)
                ferry_load_row((const char *)q + ((size_t)s * q_stride + (size_t)(g * group + j) * dim) * es,
                               dt, qf + j * dim, dim);
            int p0 = 0;
#ifdef FERRY_AVX2
            if (dim % 8 == 0) /* eight positions at a time: one reduction for 8 dots */
                for (; p0 + 8 <= len; p0 += 8) {
                    const float *kr[8];
                    for (int k = 0; k < 8; k++) {
                        if (p0 + k + AHEAD < len) kv_prefetch(kv, pool_dt, offs[p0 + k + AHEAD], dim);
                        kr[k] = kv_row(kv, pool_dt, offs[p0 + k], dim, kf + k * dim);
                    }
                    for (int j = 0; j < group; j++) {
                        const float *qj = qf + j * dim;
                        __m256 dots[8]; /* eight chains side by side, q loaded once */
                        for (int k = 0; k < 8; k++) dots[k] = _mm256_setzero_ps();
                        for (int i = 0; i < dim; i += 8) {
                            __m256 qv = _mm256_loadu_ps(qj + i);
                            for (int k = 0; k < 8; k++)
                                dots[k] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[k] + i), dots[k]);
                        }
                        _mm256_storeu_ps(scores + (size_t)j * len + p0,
                                         _mm256_mul_ps(ferry_sum8x8(dots), _mm256_set1_ps(scale)));
                    }
                }
#endif
            for (int p = p0; p < len; p++) {
                if (p + AHEAD < len) kv_prefetch(kv, pool_dt, offs[p + AHEAD], dim);
                const float *kr = kv_row(kv, pool_dt, offs[p], dim, kf);
                for (int j = 0; j < group; j++) {
                    const float *qj = qf + j * dim;
                    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                    for (int i = 0; i < dim; i++) dot += qj[i] * kr[i];
                    scores[(size_t)j * len + p] = dot * scale;
                }
            }
            for (int p = 0; p < len && p < AHEAD; p++) kv_prefetch(kv, pool_dt, offs[p] + v_step, dim);
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
            /* acc[j] = sum over p of scores[j][p] * V[p], each value summed in position order;
             * V widened a tile at a time into kf, once for every head of the group */
            memset(acc, 0, (size_t)group * dim * sizeof(float));
            for (int t0 = 0; t0 < len; t0 += V_TILE) {
                int n = len - t0 < V_TILE ? len - t0 : V_TILE;
                const float *vr[V_TILE];
                for (int t = 0; t < n; t++) {
                    if (t0 + t + AHEAD < len)
                        kv_prefetch(kv, pool_dt, offs[t0 + t + AHEAD] + v_step, dim);
                    vr[t] = kv_row(kv, pool_dt, offs[t0 + t] + v_step, dim, kf + (size_t)t * dim);
                }
                for (int j = 0; j < group; j++) {
                    const float *sc = scores + (size_t)j * len + t0;
                    float *aj = acc + j * dim;
                    int c = 0;
#ifdef FERRY_AVX2
                    for (; c + 64 <= dim; c += 64) { /* 64 values in registers a pass */
                        __m256 a[8];
                        for (int k = 0; k < 8; k++) a[k] = _mm256_loadu_ps(aj + c + k * 8);
                        for (int t = 0; t < n; t++) {
                            __m256 w = _mm256_set1_ps(sc[t]);
                            for (int k = 0; k < 8; k++)
                                a[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr[t] + c + k * 8), a[k]);
                        }
                        for (int k = 0; k < 8; k++) _mm256_storeu_ps(aj + c + k * 8, a[k]);
                    }
#endif
                    for (int t = 0; t < n; t++) {
                        float w = sc[t];
                        const float *v = vr[t];
#pragma omp simd
                        for (int i = c; i < dim; i++) aj[i] += w * v[i];
                    }
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
        free(offs);
    }
    return failed ? FERRY_ENOMEM : FERRY_OK;
}
