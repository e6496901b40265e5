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

/* the row at `off` (elements) */
static inline const char *kv_at(const char *pool, int pool_dt, int64_t off) {
    return pool + off * (int64_t)ferry_elem(pool_dt);
}

/* that row as float32: the pool's own bytes where it holds float32 (no copy), else converted
 * into `buf` */
static inline const float *kv_row(const char *pool, int pool_dt, int64_t off, int dim,
                                  float *buf) {
    const char *row = kv_at(pool, pool_dt, off);
    if (pool_dt == FERRY_F32) return (const float *)row;
    ferry_load_row(row, pool_dt, buf, dim);
    return buf;
}

/* the cache lines of the row at `off`: a sequence's pages lie anywhere in the pool, so the
 * hardware prefetcher loses the thread at every page, and the rows' loads waited on memory */
static inline void kv_prefetch(const char *pool, int pool_dt, int64_t off, int dim) {
    const char *row = kv_at(pool, pool_dt, off);
    for (int b = 0; b < dim * (int)ferry_elem(pool_dt); b += 64) __builtin_prefetch(row + b);
}

enum { AHEAD = 16 }; /* rows prefetched ahead of the one read */

enum { V_TILE = 64 };
enum { ROWS_MAX = 8 }; /* query rows of one sequence attended together (a prefill tile) */

/* q . k for 8 K rows at once, scaled: each position's dot is the sum of one 8-lane chain over
 * the dim, whichever block and call it falls in, so a row's scores do not depend on the
 * rows beside it */
#ifdef FERRY_AVX2
static inline void dots8(const float *qj, const float *const kr[8], int dim, float scale,
                         float *out) {
    __m256 dots[8]; /* eight chains side by side, q loaded once */
    for (int k = 0; k < 8; k++) dots[k] = _mm256_setzero_ps();
    for (int i = 0; i < dim; i += 8) {
        __m256 qv = _mm256_loadu_ps(qj + i);
        for (int k = 0; k < 8; k++)
            dots[k] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[k] + i), dots[k]);
    }
    _mm256_storeu_ps(out, _mm256_mul_ps(ferry_sum8x8(dots), _mm256_set1_ps(scale)));
}
#endif

/* softmax of sc[0..len) in place */
static void softmax(float *sc, int len) {
    float mx = -INFINITY, sum = 0.f;
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
    for (p = 0; p < len; p++) sc[p] *= inv;
}

/* One new token per sequence over its cached K/V. Entry s has kv_lens[s] positions on pages
 * page_ids[page_starts[s]...] and attends over the last `window` of them (window 0: all; a
 * sliding-window layer's); its query heads are rows of q (q_stride elements apart), head h
 * attends with kv head h / (heads/kv_heads). Scores, softmax and the weighted sum run in
 * float32; q and out ([entries, heads * dim]) are in dt, the pool in pool_dt.
 * A prefill part comes as one entry per query row, each ending at its own position: entries
 * that share a page table (the same page_starts) and follow one another position by position
 * form a tile of up to ROWS_MAX rows, whose K/V rows are found and widened once for all of
 * them. Each row's arithmetic is the same alone or in a tile.
 * Work is split over (tile, kv head) pairs across the OpenMP team. */
int ferry_decode_attention(const void *q, int64_t q_stride, const void *pool,
                           const int32_t *page_ids, const int64_t *page_starts,
                           const int32_t *kv_lens, int64_t seqs, int heads, int kv_heads,
                           int dim, int page_size, float scale, void *out, int dt, int pool_dt,
                           int window) {
    size_t es = ferry_elem(dt);
    const char *kv = (const char *)pool;
    const int64_t v_step = (int64_t)kv_heads * page_size * dim; /* K row -> its V row */
    int group = heads / kv_heads, failed = 0;
    int64_t max_len = 8;
    for (int64_t s = 0; s < seqs; s++)
        if (kv_lens[s] + 8 > max_len) max_len = kv_lens[s] + 8; /* + padding of a last block */
    /* tiles: first[t] .. first[t + 1] - 1 */
    int64_t *first = (int64_t *)malloc((size_t)(seqs + 1) * sizeof(int64_t));
    if (!first) return FERRY_ENOMEM;
    int64_t tiles = 0, rows_cap = 1; /* the largest tile's rows */
    for (int64_t s = 0; s < seqs; s++) {
        if (s == 0 || s - first[tiles - 1] == ROWS_MAX || page_starts[s] != page_starts[s - 1] ||
            kv_lens[s] != kv_lens[s - 1] + 1)
            first[tiles++] = s;
        if (s - first[tiles - 1] + 1 > rows_cap) rows_cap = s - first[tiles - 1] + 1;
    }
    first[tiles] = seqs;
#pragma omp parallel
    {
        const size_t rg = (size_t)rows_cap * group; /* (row, head) pairs of a tile */
        float *qf = ferry_scratch(rg * dim * sizeof(float), &failed);
        float *acc = ferry_scratch(rg * dim * sizeof(float), &failed);
        float *kf = ferry_scratch((size_t)dim * V_TILE * sizeof(float), &failed);
        float *scores = ferry_scratch(rg * max_len * sizeof(float), &failed);
        int64_t *offs = ferry_scratch((size_t)max_len * sizeof(int64_t), &failed);
        int ok = qf && acc && kf && scores && offs;
#pragma omp for schedule(dynamic, 1)
        for (int64_t work = 0; work < tiles * kv_heads; work++) {
            if (!ok) continue; /* the call fails as a whole; other threads finish their share */
            int64_t t = work / kv_heads, s0 = first[t];
            int n = (int)(first[t + 1] - s0), g = (int)(work % kv_heads);
            /* row r attends positions [lo_r, end_r); the tile reads [lo, end) */
            int lo_r[ROWS_MAX], end_r[ROWS_MAX];
            for (int r = 0; r < n; r++) {
                end_r[r] = kv_lens[s0 + r];
                lo_r[r] = window > 0 && end_r[r] > window ? end_r[r] - window : 0;
            }
            const int lo = lo_r[0], end = end_r[n - 1], len = end - lo;
            kv_offsets(page_ids + page_starts[s0], lo, len, g, kv_heads, page_size, dim, offs);
            for (int p = 0; p < len && p < AHEAD; p++) kv_prefetch(kv, pool_dt, offs[p], dim);
            for (int r = 0; r < n; r++)
                for (int j = 0; j < group; j++)
                    ferry_load_row((const char *)q + ((size_t)(s0 + r) * q_stride +
                                                      (size_t)(g * group + j) * dim) * es,
                                   dt, qf + ((size_t)r * group + j) * dim, dim);
            /* scores[(r, j)][p - lo] for every position of the tile (a row ignores those
             * outside its own range) */
            int p0 = 0;
#ifdef FERRY_AVX2
            if (dim % 8 == 0) /* blocks of eight positions; a last short block padded */
                for (; p0 < len; p0 += 8) {
                    const float *kr[8];
                    for (int k = 0; k < 8; k++) {
                        if (p0 + k + AHEAD < len) kv_prefetch(kv, pool_dt, offs[p0 + k + AHEAD], dim);
                        kr[k] = p0 + k < len ? kv_row(kv, pool_dt, offs[p0 + k], dim, kf + k * dim)
                                             : kr[0];
                    }
                    for (int rj = 0; rj < n * group; rj++)
                        dots8(qf + (size_t)rj * dim, kr, dim, scale,
                              scores + (size_t)rj * max_len + p0);
                }
#endif
            for (int p = p0; p < len; p++) {
                if (p + AHEAD < len) kv_prefetch(kv, pool_dt, offs[p + AHEAD], dim);
                const float *kr = kv_row(kv, pool_dt, offs[p], dim, kf);
                for (int rj = 0; rj < n * group; rj++) {
                    const float *qj = qf + (size_t)rj * dim;
                    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                    for (int i = 0; i < dim; i++) dot += qj[i] * kr[i];
                    scores[(size_t)rj * max_len + p] = dot * scale;
                }
            }
            for (int p = 0; p < len && p < AHEAD; p++) kv_prefetch(kv, pool_dt, offs[p] + v_step, dim);
            for (int r = 0; r < n; r++)
                for (int j = 0; j < group; j++)
                    softmax(scores + ((size_t)r * group + j) * max_len + (lo_r[r] - lo),
                            end_r[r] - lo_r[r]);
            /* acc[(r, j)] = sum over its positions p of score * V[p], each value summed in
             * position order; V widened a tile at a time into kf, once for every row and head */
            memset(acc, 0, (size_t)n * group * dim * sizeof(float));
            for (int t0 = 0; t0 < len; t0 += V_TILE) {
                int m = len - t0 < V_TILE ? len - t0 : V_TILE;
                const float *vr[V_TILE];
                for (int u = 0; u < m; u++) {
                    if (t0 + u + AHEAD < len)
                        kv_prefetch(kv, pool_dt, offs[t0 + u + AHEAD] + v_step, dim);
                    vr[u] = kv_row(kv, pool_dt, offs[t0 + u] + v_step, dim, kf + (size_t)u * dim);
                }
                for (int r = 0; r < n; r++) {
                    /* this row's positions within the V tile: [a, b) */
                    int a = lo_r[r] - lo - t0, b = end_r[r] - lo - t0;
                    a = a < 0 ? 0 : a;
                    b = b > m ? m : b;
                    for (int j = 0; a < b && j < group; j++) {
                        const float *sc = scores + ((size_t)r * group + j) * max_len + t0;
                        float *aj = acc + ((size_t)r * group + j) * dim;
                        int c = 0;
#ifdef FERRY_AVX2
                        for (; c + 64 <= dim; c += 64) { /* 64 values in registers a pass */
                            __m256 x[8];
                            for (int k = 0; k < 8; k++) x[k] = _mm256_loadu_ps(aj + c + k * 8);
                            for (int u = a; u < b; u++) {
                                __m256 w = _mm256_set1_ps(sc[u]);
                                for (int k = 0; k < 8; k++)
                                    x[k] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vr[u] + c + k * 8), x[k]);
                            }
                            for (int k = 0; k < 8; k++) _mm256_storeu_ps(aj + c + k * 8, x[k]);
                        }
#endif
                        for (int u = a; u < b; u++) {
                            float w = sc[u];
                            const float *v = vr[u];
#pragma omp simd
                            for (int i = c; i < dim; i++) aj[i] += w * v[i];
                        }
                    }
                }
            }
            for (int r = 0; r < n; r++)
                for (int j = 0; j < group; j++)
                    ferry_store_row((char *)out + ((size_t)(s0 + r) * heads + (size_t)(g * group + j)) * dim * es,
                                    dt, acc + ((size_t)r * group + j) * dim, dim);
        }
        free(qf);
        free(acc);
        free(kf);
        free(scores);
        free(offs);
    }
    free(first);
    return failed ? FERRY_ENOMEM : FERRY_OK;
}
