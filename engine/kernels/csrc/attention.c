/* Decode attention straight from the paged KV pool (no gather copy). */
#include <omp.h>

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

enum { ROWS_MAX = 8 }; /* query rows of one sequence attended together (a prefill tile) */

/* each query row's scores over the tile's positions [0, len) -> its attention weights: the
 * softmax over its own range [lo_r - lo, end_r - lo) (row rj belongs to tile row rj / group),
 * zero elsewhere, so summing V over the whole tile adds exact zeros for it */
static void weights(float *scores, int64_t max_len, int nrows, int len, const int *lo_r,
                    const int *end_r, int lo, int group) {
    for (int rj = 0; rj < nrows; rj++) {
        float *sc = scores + (size_t)rj * max_len;
        int a = lo_r[rj / group] - lo, b = end_r[rj / group] - lo;
        ferry_softmax(sc + a, b - a);
        memset(sc, 0, (size_t)a * sizeof(float));
        memset(sc + b, 0, (size_t)(len - b) * sizeof(float));
    }
}

/* The vector path (AVX2 + F16C, head size a multiple of 8) reads K and V rows straight from
 * the pool, widening eight values at a time in registers, and blocks the work so that one
 * load serves several query rows (K) or several positions' sums stay in registers (V).
 * Bits: a score is one 8-lane FMA chain over the dim, summed as ferry_sum8x8 sums, times
 * scale; an output value is one FMA chain over the tile's positions in order (with AVX-512,
 * 16 output values to a vector: the same chain in every lane). Neither depends
 * on which rows or positions share a block, so a row's result is the same alone or in a
 * prefill tile. */
#if defined(FERRY_AVX2) && defined(__F16C__)
#define ATT_VECTOR 1
#define ATT_INLINE static inline __attribute__((always_inline))

#ifdef __AVX512VL__ /* 32 vector registers */
enum { K_POS = 4, V_VECS = 4 };
#else
enum { K_POS = 2, V_VECS = 2 };
#endif
enum { Q_BLOCK = 4 };  /* query rows a block: K_POS * Q_BLOCK chains, 8 per ferry_sum8x8 */
enum { V_BLOCK = 16 }; /* V rows summed while the next block's are fetched */

/* eight values of a pool row from element i, as float32 (the widenings are exact) */
ATT_INLINE __m256 kv_load8(const char *row, int pool_dt, int i) {
    if (pool_dt == FERRY_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    return pool_dt == FERRY_F16
        ? _mm256_cvtph_ps(h)
        : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* the query rows of the block from j0: rj[j] for j < the returned count (at most Q_BLOCK),
 * a short block's other entries repeating j0 (read, never written) */
ATT_INLINE int row_block(int j0, int nrows, int rj[Q_BLOCK]) {
    int nq = nrows - j0 < Q_BLOCK ? nrows - j0 : Q_BLOCK;
    for (int j = 0; j < Q_BLOCK; j++) rj[j] = j0 + (j < nq ? j : 0);
    return nq;
}

/* out[j][a] = scale * (qs[j] . kr[a]) for j < nq, a < npos */
ATT_INLINE void k_block(const float *const qs[Q_BLOCK], int nq, const char *const kr[K_POS],
                        int npos, int pool_dt, int dim, float scale, float *const out[Q_BLOCK]) {
    __m256 acc[K_POS][Q_BLOCK]; /* [position][row]: two positions' rows = 8 chains in a row */
    for (int a = 0; a < K_POS; a++)
        for (int j = 0; j < Q_BLOCK; j++) acc[a][j] = _mm256_setzero_ps();
    for (int i = 0; i < dim; i += 8) {
        __m256 k[K_POS];
        for (int a = 0; a < K_POS; a++) k[a] = kv_load8(kr[a], pool_dt, i);
        for (int j = 0; j < nq; j++) {
            __m256 qv = _mm256_loadu_ps(qs[j] + i);
            for (int a = 0; a < K_POS; a++) acc[a][j] = _mm256_fmadd_ps(qv, k[a], acc[a][j]);
        }
    }
    for (int a = 0; a < K_POS; a += 2) {
        float sums[8];
        _mm256_storeu_ps(sums, _mm256_mul_ps(ferry_sum8x8(acc[a]), _mm256_set1_ps(scale)));
        for (int b = 0; b < 2 && a + b < npos; b++)
            for (int j = 0; j < nq; j++) out[j][a + b] = sums[b * Q_BLOCK + j];
    }
}

/* scores[rj][p] for the tile's nrows query rows (qf, dim apart) and positions [0, len) */
ATT_INLINE void k_scores(const float *qf, int nrows, const char *kv, int pool_dt,
                         const int64_t *offs, int len, int dim, float scale, float *scores,
                         int64_t max_len) {
    for (int p0 = 0; p0 < len; p0 += K_POS) {
        const char *kr[K_POS];
        int npos = len - p0 < K_POS ? len - p0 : K_POS;
        for (int a = 0; a < K_POS; a++) {
            if (p0 + a + AHEAD < len) kv_prefetch(kv, pool_dt, offs[p0 + a + AHEAD], dim);
            kr[a] = kv_at(kv, pool_dt, offs[a < npos ? p0 + a : p0]); /* a short block repeats */
        }
        for (int j0 = 0; j0 < nrows; j0 += Q_BLOCK) {
            int rj[Q_BLOCK], nq = row_block(j0, nrows, rj);
            const float *qs[Q_BLOCK];
            float *out[Q_BLOCK];
            for (int j = 0; j < Q_BLOCK; j++) {
                qs[j] = qf + (size_t)rj[j] * dim;
                out[j] = scores + (size_t)rj[j] * max_len + p0;
            }
            switch (nq) { /* constant row counts: the chains stay in registers */
            case 1: k_block(qs, 1, kr, npos, pool_dt, dim, scale, out); break;
            case 2: k_block(qs, 2, kr, npos, pool_dt, dim, scale, out); break;
            case 3: k_block(qs, 3, kr, npos, pool_dt, dim, scale, out); break;
            default: k_block(qs, 4, kr, npos, pool_dt, dim, scale, out); break;
            }
        }
    }
}

/* acc[j][c] += w[j][u] * V_u[c] over u < m in order, for j < nq, VECS vectors of values a
 * pass from c0 to c1 */
ATT_INLINE void v_pass(const char *const *vr, int m, int pool_dt, const float *const w[Q_BLOCK],
                       float *const acc[Q_BLOCK], int nq, int vecs, int c0, int c1) {
    for (int c = c0; c + 8 * vecs <= c1; c += 8 * vecs) {
        __m256 x[Q_BLOCK][V_VECS];
        for (int j = 0; j < nq; j++)
            for (int k = 0; k < vecs; k++) x[j][k] = _mm256_loadu_ps(acc[j] + c + 8 * k);
        for (int u = 0; u < m; u++) {
            __m256 v[V_VECS];
            for (int k = 0; k < vecs; k++) v[k] = kv_load8(vr[u], pool_dt, c + 8 * k);
            for (int j = 0; j < nq; j++) {
                __m256 wj = _mm256_set1_ps(w[j][u]);
                for (int k = 0; k < vecs; k++) x[j][k] = _mm256_fmadd_ps(wj, v[k], x[j][k]);
            }
        }
        for (int j = 0; j < nq; j++)
            for (int k = 0; k < vecs; k++) _mm256_storeu_ps(acc[j] + c + 8 * k, x[j][k]);
    }
}

#ifdef __AVX512F__
/* sixteen values of a pool row from element i, as float32 */
ATT_INLINE __m512 kv_load16(const char *row, int pool_dt, int i) {
    if (pool_dt == FERRY_F32) return _mm512_loadu_ps((const float *)row + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + i));
    return pool_dt == FERRY_F16
        ? _mm512_cvtph_ps(h)
        : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* v_pass on 16-value vectors: each lane's chain is the one v_pass runs (a 16-value vector is
 * two 8-value ones side by side), so the sums are the same bits, in half the instructions */
ATT_INLINE void v_pass16(const char *const *vr, int m, int pool_dt,
                         const float *const w[Q_BLOCK], float *const acc[Q_BLOCK], int nq,
                         int c0, int c1) {
    for (int c = c0; c + 16 * V_VECS <= c1; c += 16 * V_VECS) {
        __m512 x[Q_BLOCK][V_VECS];
        for (int j = 0; j < nq; j++)
            for (int k = 0; k < V_VECS; k++) x[j][k] = _mm512_loadu_ps(acc[j] + c + 16 * k);
        for (int u = 0; u < m; u++) {
            __m512 v[V_VECS];
            for (int k = 0; k < V_VECS; k++) v[k] = kv_load16(vr[u], pool_dt, c + 16 * k);
            for (int j = 0; j < nq; j++) {
                __m512 wj = _mm512_set1_ps(w[j][u]);
                for (int k = 0; k < V_VECS; k++) x[j][k] = _mm512_fmadd_ps(wj, v[k], x[j][k]);
            }
        }
        for (int j = 0; j < nq; j++)
            for (int k = 0; k < V_VECS; k++) _mm512_storeu_ps(acc[j] + c + 16 * k, x[j][k]);
    }
}
#endif

ATT_INLINE void v_block(const char *const *vr, int m, int pool_dt, int dim,
                        const float *const w[Q_BLOCK], float *const acc[Q_BLOCK], int nq) {
    int done = 0;
#ifdef __AVX512F__
    done = dim - dim % (16 * V_VECS);
    v_pass16(vr, m, pool_dt, w, acc, nq, 0, done);
#endif
    int wide = dim - (dim - done) % (8 * V_VECS);
    v_pass(vr, m, pool_dt, w, acc, nq, V_VECS, done, wide);
    v_pass(vr, m, pool_dt, w, acc, nq, 1, wide, dim);
}

/* acc[rj] = sum over positions [0, len) of scores[rj][p] * V_p (a row's weights are zero
 * outside its own range) */
ATT_INLINE void v_sums(const float *scores, int64_t max_len, int nrows, const char *kv,
                       int pool_dt, const int64_t *offs, int64_t v_step, int len, int dim,
                       float *acc) {
    for (int t0 = 0; t0 < len; t0 += V_BLOCK) {
        int m = len - t0 < V_BLOCK ? len - t0 : V_BLOCK;
        const char *vr[V_BLOCK];
        for (int u = 0; u < m; u++) vr[u] = kv_at(kv, pool_dt, offs[t0 + u] + v_step);
        for (int u = t0 + V_BLOCK; u < len && u < t0 + 2 * V_BLOCK; u++)
            kv_prefetch(kv, pool_dt, offs[u] + v_step, dim);
        for (int j0 = 0; j0 < nrows; j0 += Q_BLOCK) {
            int rj[Q_BLOCK], nq = row_block(j0, nrows, rj);
            const float *w[Q_BLOCK];
            float *a[Q_BLOCK];
            for (int j = 0; j < Q_BLOCK; j++) {
                w[j] = scores + (size_t)rj[j] * max_len + t0;
                a[j] = acc + (size_t)rj[j] * dim;
            }
            switch (nq) {
            case 1: v_block(vr, m, pool_dt, dim, w, a, 1); break;
            case 2: v_block(vr, m, pool_dt, dim, w, a, 2); break;
            case 3: v_block(vr, m, pool_dt, dim, w, a, 3); break;
            default: v_block(vr, m, pool_dt, dim, w, a, 4); break;
            }
        }
    }
}

/* both, for one pool dtype known at compile time (the loads' widening folds) */
ATT_INLINE void attend_vector(const float *qf, int nrows, const char *kv, int pool_dt,
                              const int64_t *offs, int64_t v_step, int len, int dim,
                              float scale, float *scores, int64_t max_len, float *acc,
                              const int *lo_r, const int *end_r, int lo, int group) {
    k_scores(qf, nrows, kv, pool_dt, offs, len, dim, scale, scores, max_len);
    for (int u = 0; u < len && u < V_BLOCK; u++) kv_prefetch(kv, pool_dt, offs[u] + v_step, dim);
    weights(scores, max_len, nrows, len, lo_r, end_r, lo, group);
    v_sums(scores, max_len, nrows, kv, pool_dt, offs, v_step, len, dim, acc);
}
#endif /* vector path */

/* The same without vectors (no AVX2, or a head size off the 8-value blocks) */
static void attend_plain(const float *qf, int nrows, const char *kv, int pool_dt,
                         const int64_t *offs, int64_t v_step, int len, int dim, float scale,
                         float *scores, int64_t max_len, float *acc, float *kf,
                         const int *lo_r, const int *end_r, int lo, int group) {
    for (int p = 0; p < len; p++) {
        if (p + AHEAD < len) kv_prefetch(kv, pool_dt, offs[p + AHEAD], dim);
        const float *kr = kv_row(kv, pool_dt, offs[p], dim, kf);
        for (int rj = 0; rj < nrows; rj++) {
            const float *qj = qf + (size_t)rj * dim;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < dim; i++) dot += qj[i] * kr[i];
            scores[(size_t)rj * max_len + p] = dot * scale;
        }
    }
    weights(scores, max_len, nrows, len, lo_r, end_r, lo, group);
    for (int p = 0; p < len; p++) {
        if (p + AHEAD < len) kv_prefetch(kv, pool_dt, offs[p + AHEAD] + v_step, dim);
        const float *vr = kv_row(kv, pool_dt, offs[p] + v_step, dim, kf);
        for (int rj = 0; rj < nrows; rj++) {
            float w = scores[(size_t)rj * max_len + p], *aj = acc + (size_t)rj * dim;
#pragma omp simd
            for (int i = 0; i < dim; i++) aj[i] += w * vr[i];
        }
    }
}

/* One new token per sequence over its cached K/V. Entry s has kv_lens[s] positions on pages
 * page_ids[page_starts[s]...] and attends over the last `window` of them (window 0: all; a
 * sliding-window layer's); its query heads are rows of q (q_stride elements apart), head h
 * attends with kv head h / (heads/kv_heads). Scores, softmax and the weighted sum run in
 * float32; q and out ([entries, heads * dim]) are in dt, the pool in pool_dt.
 * A prefill part comes as one entry per query row, each ending at its own position: entries
 * that share a page table (the same page_starts) and follow one another position by position
 * form a tile of up to ROWS_MAX rows, whose K/V rows are found and read once for all of
 * them. Each row's arithmetic is the same alone or in a tile.
 * Work is split over (tile, kv head) pairs across the OpenMP team, and where there are fewer
 * pairs than threads (one chat's step on a model with one or two KV heads, as Gemma 3's) over
 * parts of each pair's query heads too: a part reads the same K/V rows, and each head's
 * arithmetic is the same in any part. */
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
    /* parts: the fewest that divide the group and give every thread an item */
    const int64_t pairs = tiles * kv_heads, threads = omp_get_max_threads();
    int parts = 1;
    while (pairs * parts < threads && parts < group) {
        parts++;
        while (group % parts) parts++;
    }
    const int sub = group / parts; /* query heads of a part */
#pragma omp parallel
    {
        const size_t rg = (size_t)rows_cap * sub; /* (row, head) pairs of a part */
        float *qf = ferry_scratch(rg * dim * sizeof(float), &failed);
        float *acc = ferry_scratch(rg * dim * sizeof(float), &failed);
        float *kf = ferry_scratch((size_t)dim * sizeof(float), &failed);
        float *scores = ferry_scratch(rg * max_len * sizeof(float), &failed);
        int64_t *offs = ferry_scratch((size_t)max_len * sizeof(int64_t), &failed);
        int ok = qf && acc && kf && scores && offs;
#pragma omp for schedule(dynamic, 1)
        for (int64_t work = 0; work < pairs * parts; work++) {
            if (!ok) continue; /* the call fails as a whole; other threads finish their share */
            int64_t t = work / parts / kv_heads, s0 = first[t];
            int n = (int)(first[t + 1] - s0), g = (int)(work / parts % kv_heads), nrows = n * sub;
            int h0 = g * group + (int)(work % parts) * sub; /* the part's first query head */
            /* row r attends positions [lo_r, end_r); the tile reads [lo, end) */
            int lo_r[ROWS_MAX], end_r[ROWS_MAX];
            for (int r = 0; r < n; r++) {
                end_r[r] = kv_lens[s0 + r];
                lo_r[r] = window > 0 && end_r[r] > window ? end_r[r] - window : 0;
            }
            const int lo = lo_r[0], end = end_r[n - 1], len = end - lo;
            kv_offsets(page_ids + page_starts[s0], lo, len, g, kv_heads, page_size, dim, offs);
            for (int p = 0; p < len && p < AHEAD; p++) kv_prefetch(kv, pool_dt, offs[p], dim);
            /* query rows rj = r * sub + j, float32 */
            for (int r = 0; r < n; r++)
                for (int j = 0; j < sub; j++)
                    ferry_load_row((const char *)q + ((size_t)(s0 + r) * q_stride +
                                                      (size_t)(h0 + j) * dim) * es,
                                   dt, qf + ((size_t)r * sub + j) * dim, dim);
            memset(acc, 0, (size_t)nrows * dim * sizeof(float));
#ifdef ATT_VECTOR
            if (dim % 8 == 0) {
                switch (pool_dt) { /* each dtype's loads compiled in */
                case FERRY_F16:
                    attend_vector(qf, nrows, kv, FERRY_F16, offs, v_step, len, dim, scale,
                                  scores, max_len, acc, lo_r, end_r, lo, sub);
                    break;
                case FERRY_BF16:
                    attend_vector(qf, nrows, kv, FERRY_BF16, offs, v_step, len, dim, scale,
                                  scores, max_len, acc, lo_r, end_r, lo, sub);
                    break;
                default:
                    attend_vector(qf, nrows, kv, FERRY_F32, offs, v_step, len, dim, scale,
                                  scores, max_len, acc, lo_r, end_r, lo, sub);
                    break;
                }
            } else
#endif
                attend_plain(qf, nrows, kv, pool_dt, offs, v_step, len, dim, scale, scores,
                             max_len, acc, kf, lo_r, end_r, lo, sub);
            for (int rj = 0; rj < nrows; rj++)
                ferry_store_row((char *)out + ((size_t)(s0 + rj / sub) * heads +
                                               (size_t)(h0 + rj % sub)) * dim * es,
                                dt, acc + (size_t)rj * dim, dim);
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
