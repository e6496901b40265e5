/* Fused CPU kernels for the small per-layer operations of a decoder step.
 *
 * Why: at batch 1 a step's matrix products are bound by reading the weights (~18 ms here);
 * the ~25 other eager torch ops per layer (norm, rotary, KV store, gather, softmax, ...) cost
 * ~10 ms more in dispatch and tiny loops. Each function below replaces several of them with
 * one call, and decode attention reads K/V straight from the paged pool (no gather copy).
 *
 * Plain C with raw pointers (called through ctypes), compiled once per machine by
 * engine/kernels/native.py. dt: 0 = float32, 1 = bfloat16. Arithmetic is float32; bfloat16
 * results are rounded to nearest even where the torch ops they replace round.
 * OpenMP comes from the libgomp torch already loaded, so there is one team per thread.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { F32 = 0, BF16 = 1 };

static inline float bf16_to_f32(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float round_dt(float f, int dt) {
    return dt == BF16 ? bf16_to_f32(f32_to_bf16(f)) : f;
}

static inline void load_row(const void *src, int dt, float *dst, int n) {
    if (dt == F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (int i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    }
}

static inline void store_row(void *dst, int dt, const float *src, int n) {
    if (dt == F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else {
        uint16_t *d = (uint16_t *)dst;
        for (int i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
    }
}

static inline size_t elem(int dt) { return dt == F32 ? 4 : 2; }

/* out[r] = rms_norm(x[r]) * w, as Hugging Face's LlamaRMSNorm rounds: normalise in float32,
 * round to dt, multiply by the weight, round. With `residual` (non-NULL) first
 * residual[r] += x[r] (rounded to dt) and normalise the sum: the decoder's residual add and
 * the next norm in one pass. out may be x when residual is NULL. */
void ferry_rms_norm(void *x, void *residual, const void *w, void *out, int64_t rows, int dim,
                    float eps, int dt) {
    size_t es = elem(dt);
    float *h = (float *)malloc((size_t)dim * 3 * sizeof(float));
    float *wf = h + dim, *tmp = h + 2 * dim;
    load_row(w, dt, wf, dim);
    for (int64_t r = 0; r < rows; r++) {
        char *xr = (char *)x + (size_t)r * dim * es;
        load_row(xr, dt, h, dim);
        if (residual) {
            char *rr = (char *)residual + (size_t)r * dim * es;
            load_row(rr, dt, tmp, dim);
            for (int i = 0; i < dim; i++) h[i] = round_dt(h[i] + tmp[i], dt);
            store_row(rr, dt, h, dim);
        }
        float ss = 0.f;
#pragma omp simd reduction(+ : ss)
        for (int i = 0; i < dim; i++) ss += h[i] * h[i];
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) h[i] = wf[i] * round_dt(h[i] * inv, dt);
        store_row((char *)out + (size_t)r * dim * es, dt, h, dim);
    }
    free(h);
}

/* Rotary embedding in place, Hugging Face's rotate_half convention: for each of `heads`
 * head vectors (dim values, contiguous) of each token row (row_stride elements apart),
 * x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin over the two halves, computed as torch's
 * x * cos + roll(x, dim / 2) * sin with the model's [tokens, dim] tables in dt
 * (cos = [c | c], sin = [-s | s]). */
void ferry_rotary(void *x, int64_t row_stride, int64_t tokens, int heads, int dim,
                  const void *cos, const void *sin, int dt) {
    int half = dim / 2;
    size_t es = elem(dt);
    float *v = (float *)malloc((size_t)dim * 3 * sizeof(float));
    float *c = v + dim, *s = v + 2 * dim;
    for (int64_t t = 0; t < tokens; t++) {
        load_row((const char *)cos + (size_t)t * dim * es, dt, c, dim);
        load_row((const char *)sin + (size_t)t * dim * es, dt, s, dim);
        for (int hd = 0; hd < heads; hd++) {
            char *p = (char *)x + ((size_t)t * row_stride + (size_t)hd * dim) * es;
            load_row(p, dt, v, dim);
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                /* as torch computes x*cos + roll(x)*sin: the product x*cos rounds to dt */
                v[i] = round_dt(a * c[i], dt) + b * s[i];
                v[i + half] = round_dt(b * c[i + half], dt) + a * s[i + half];
            }
            store_row(p, dt, v, dim);
        }
    }
    free(v);
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define FERRY_AVX2 1

/* e^x for 8 floats: Cephes' expf (range reduction by ln 2, degree-6 polynomial), within
 * ~2 float ulp; NaN stays NaN through the caller's own arithmetic */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                   _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* eight values of a float32 or bf16 row, from element `at`, as float32 */
static inline __m256 load8(const char *row, int dt, int at) {
    if (dt == F32) return _mm256_loadu_ps((const float *)row + at);
    __m128i v = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + at));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

/* lane k of the result = the sum of v[k]'s eight lanes */
static inline __m256 sum8x8(const __m256 v[8]) {
    __m256 ab = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 cd = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20),
                         _mm256_permute2f128_ps(ab, cd, 0x31));
}
#endif

/* out[r, i] = silu(gate) * up for gate_up rows [gate (n) | up (n)], rounding silu's result
 * to dt first as the separate torch ops do. */
void ferry_silu_mul(const void *gate_up, void *out, int64_t rows, int n, int dt) {
    size_t es = elem(dt);
    float *g = (float *)malloc((size_t)n * 2 * sizeof(float));
    float *u = g + n;
    for (int64_t r = 0; r < rows; r++) {
        const char *src = (const char *)gate_up + (size_t)r * 2 * n * es;
        load_row(src, dt, g, n);
        load_row(src + (size_t)n * es, dt, u, n);
        int i = 0;
#ifdef FERRY_AVX2
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(g + i);
            __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
            _mm256_storeu_ps(g + i, _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
        }
#endif
        for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i]));
        for (i = 0; i < n; i++) g[i] = round_dt(g[i], dt) * u[i];
        store_row((char *)out + (size_t)r * n * es, dt, g, n);
    }
    free(g);
}

/* Store new tokens' K and V into the paged pool (one layer, [pages, 2, kv_heads, page_size,
 * dim]): token t's kv rows [2, kv_heads, dim] (row_stride elements apart) go to slot slots[t]. */
void ferry_store_kv(const void *kv, int64_t row_stride, const int64_t *slots, int64_t tokens,
                    void *pool, int kv_heads, int page_size, int dim, int dt) {
    size_t es = elem(dt), row = (size_t)dim * es;
    for (int64_t t = 0; t < tokens; t++) {
        int64_t page = slots[t] / page_size, off = slots[t] % page_size;
        const char *src = (const char *)kv + (size_t)t * row_stride * es;
        for (int c = 0; c < 2; c++)
            for (int hd = 0; hd < kv_heads; hd++) {
                size_t block = ((size_t)page * 2 + c) * kv_heads + hd;
                memcpy((char *)pool + (block * page_size + off) * row,
                       src + ((size_t)c * kv_heads + hd) * row, row);
            }
    }
}

/* Attention of one new token per sequence over its cached K/V, read straight from the pool.
 * Sequence s has kv_lens[s] positions on pages page_ids[page_starts[s]...]; its query heads
 * are rows of q (q_stride elements apart), head h attends with kv head h / (heads/kv_heads).
 * Scores, softmax and the weighted sum run in float32; out is [seqs, heads * dim] in dt.
 * Work is split over (sequence, kv head) pairs across the OpenMP team. */
void ferry_decode_attention(const void *q, int64_t q_stride, const void *pool,
                            const int32_t *page_ids, const int64_t *page_starts,
                            const int32_t *kv_lens, int64_t seqs, int heads, int kv_heads,
                            int dim, int page_size, float scale, void *out, int dt) {
    size_t es = elem(dt);
    int group = heads / kv_heads;
    int64_t max_len = 0;
    for (int64_t s = 0; s < seqs; s++)
        if (kv_lens[s] > max_len) max_len = kv_lens[s];
#pragma omp parallel
    {
        float *qf = (float *)malloc((size_t)group * dim * sizeof(float));
        float *acc = (float *)malloc((size_t)group * dim * sizeof(float));
        float *kf = (float *)malloc((size_t)dim * 8 * sizeof(float));
        float *scores = (float *)malloc((size_t)group * (max_len > 0 ? max_len : 1) * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int64_t work = 0; work < seqs * kv_heads; work++) {
            int64_t s = work / kv_heads;
            int g = (int)(work % kv_heads);
            int len = kv_lens[s];
            const int32_t *pages = page_ids + page_starts[s];
            for (int j = 0; j < group; j++)
                load_row((const char *)q + ((size_t)s * q_stride + (size_t)(g * group + j) * dim) * es,
                         dt, qf + j * dim, dim);
            int p0 = 0;
#ifdef FERRY_AVX2
            if (dim % 8 == 0) /* eight positions at a time: one reduction for 8 dots */
                for (; p0 + 8 <= len; p0 += 8) {
                    for (int k = 0; k < 8; k++) {
                        int p = p0 + k;
                        size_t block = ((size_t)pages[p / page_size] * 2 + 0) * kv_heads + g;
                        load_row((const char *)pool + (block * page_size + p % page_size) * dim * es,
                                 dt, kf + k * dim, dim);
                    }
                    for (int j = 0; j < group; j++) {
                        const float *qj = qf + j * dim;
                        __m256 acc[8];
                        for (int k = 0; k < 8; k++) {
                            __m256 a = _mm256_setzero_ps();
                            for (int i = 0; i < dim; i += 8)
                                a = _mm256_fmadd_ps(_mm256_loadu_ps(qj + i),
                                                    _mm256_loadu_ps(kf + k * dim + i), a);
                            acc[k] = a;
                        }
                        _mm256_storeu_ps(scores + (size_t)j * len + p0,
                                         _mm256_mul_ps(sum8x8(acc), _mm256_set1_ps(scale)));
                    }
                }
#endif
            for (int p = p0; p < len; p++) {
                size_t block = ((size_t)pages[p / page_size] * 2 + 0) * kv_heads + g;
                load_row((const char *)pool + (block * page_size + p % page_size) * dim * es, dt,
                         kf, dim);
                for (int j = 0; j < group; j++) {
                    const float *qj = qf + j * dim;
                    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                    for (int i = 0; i < dim; i++) dot += qj[i] * kf[i];
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
                    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + p), vmx));
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
                            size_t block = ((size_t)pages[p / page_size] * 2 + 1) * kv_heads + g;
                            const char *row = (const char *)pool +
                                ((block * page_size + p % page_size) * dim + c) * es;
                            __m256 w = _mm256_set1_ps(sc[p]);
                            for (int k = 0; k < 8; k++)
                                a[k] = _mm256_fmadd_ps(w, load8(row, dt, k * 8), a[k]);
                        }
                        for (int k = 0; k < 8; k++)
                            _mm256_storeu_ps(acc + j * dim + c + k * 8, a[k]);
                    }
                for (int j = 0; j < group; j++)
                    store_row((char *)out + ((size_t)s * heads + (size_t)(g * group + j)) * dim * es,
                              dt, acc + j * dim, dim);
                continue;
            }
#endif
            memset(acc, 0, (size_t)group * dim * sizeof(float));
            for (int p = 0; p < len; p++) {
                size_t block = ((size_t)pages[p / page_size] * 2 + 1) * kv_heads + g;
                load_row((const char *)pool + (block * page_size + p % page_size) * dim * es, dt,
                         kf, dim);
                for (int j = 0; j < group; j++) {
                    float w = scores[(size_t)j * len + p], *aj = acc + j * dim;
#pragma omp simd
                    for (int i = 0; i < dim; i++) aj[i] += w * kf[i];
                }
            }
            for (int j = 0; j < group; j++)
                store_row((char *)out + ((size_t)s * heads + (size_t)(g * group + j)) * dim * es,
                          dt, acc + j * dim, dim);
        }
        free(qf);
        free(acc);
        free(kf);
        free(scores);
    }
}

/* y[r, o] = sum_i x[r, i] * w[o, i] (+ bias[o]) for a few rows of x and a bf16 weight
 * [out, in], all bf16, accumulated in float32 and rounded once. Bound by reading the weight at
 * batch 1 (~15 GB/s here, like torch's kernel), but unlike torch's emulated bf16 product it
 * stays there for 2-4 rows (torch: 2x / 4x slower per row), so a few concurrent chats decode
 * almost as fast as one. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Weights are widened 16 at a time by interleaving zeros below each bf16 (in-lane unpacks:
 * cheaper than a lane-crossing widen), which yields elements {0-3, 8-11} and {4-7, 12-15};
 * x is stored once in that order (xp), so the products pair up. KW weight rows x R x rows
 * accumulators, constants after inlining, so they stay in registers. */
static inline __attribute__((always_inline)) void dot_block(
        const uint16_t *w, int64_t in, const float *xp, int KW, int R, float *res) {
    const __m256i zero = _mm256_setzero_si256();
    __m256 acc[4][4];
    for (int k = 0; k < KW; k++)
        for (int r = 0; r < R; r++) acc[k][r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < in; i += 16) {
        for (int k = 0; k < KW; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + k * in + i));
            __m256 lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
            __m256 hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
            for (int r = 0; r < R; r++) {
                acc[k][r] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xp + r * in + i), acc[k][r]);
                acc[k][r] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xp + r * in + i + 8), acc[k][r]);
            }
        }
    }
    for (int k = 0; k < KW; k++)
        for (int r = 0; r < R; r++) res[k * 4 + r] = hsum(acc[k][r]);
}

static void gemv_simd(const uint16_t *w, const float *xp, int64_t in, int KW, int R,
                      float *res) {
    if (KW == 4) {
        if (R == 1) dot_block(w, in, xp, 4, 1, res);
        else dot_block(w, in, xp, 4, 2, res);
    } else {
        switch (R) {
        case 1: dot_block(w, in, xp, 2, 1, res); break;
        case 2: dot_block(w, in, xp, 2, 2, res); break;
        case 3: dot_block(w, in, xp, 2, 3, res); break;
        default: dot_block(w, in, xp, 2, 4, res); break;
        }
    }
}
#endif

static void dot_plain(const uint16_t *w, int64_t in, const float *x, int R, float *res) {
    for (int r = 0; r < R; r++) {
        float s = 0.f;
        for (int64_t i = 0; i < in; i++) s += bf16_to_f32(w[i]) * x[r * in + i];
        res[r] = s;
    }
}

void ferry_gemv_bf16(const void *x, const void *w, const void *bias, void *y, int rows,
                     int64_t in, int64_t out) {
    const uint16_t *wb = (const uint16_t *)w, *bb = (const uint16_t *)bias;
    uint16_t *yb = (uint16_t *)y;
    float *xf = (float *)malloc((size_t)rows * in * sizeof(float) * 2);
    float *xp = xf + rows * in;
    load_row(x, BF16, xf, (int)(rows * in));
    int64_t simd_out = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (in % 16 == 0) {
        for (int64_t i = 0; i < rows * in; i += 16)
            for (int j = 0; j < 4; j++) {
                xp[i + j] = xf[i + j];
                xp[i + 4 + j] = xf[i + 8 + j];
                xp[i + 8 + j] = xf[i + 4 + j];
                xp[i + 12 + j] = xf[i + 12 + j];
            }
        /* 4 weight rows per block for 1-2 rows of x, else 2; more than 4 rows of x go in
         * groups of 4 over the same weight block, which is then read from L1 */
        int kw = rows <= 2 ? 4 : 2;
        int64_t blocks = out / kw;
        simd_out = blocks * kw;
#pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            float res[16];
            int64_t o = b * kw;
            for (int g = 0; g < rows; g += 4) {
                int R = rows - g < 4 ? rows - g : 4;
                gemv_simd(wb + o * in, xp + (int64_t)g * in, in, kw, R, res);
                for (int k = 0; k < kw; k++)
                    for (int r = 0; r < R; r++)
                        yb[(g + r) * out + o + k] =
                            f32_to_bf16(res[k * 4 + r] + (bb ? bf16_to_f32(bb[o + k]) : 0.f));
            }
        }
    }
#endif
#pragma omp parallel for schedule(static) if (out - simd_out > 64)
    for (int64_t o = simd_out; o < out; o++)
        for (int r = 0; r < rows; r++) {
            float res;
            dot_plain(wb + o * in, in, xf + (int64_t)r * in, 1, &res);
            yb[r * out + o] = f32_to_bf16(res + (bb ? bf16_to_f32(bb[o]) : 0.f));
        }
    free(xf);
}

/* out[r] = index of the largest of logits[r, 0:n] (the first one on ties; the first NaN if
 * any, as torch.argmax). Greedy sampling's argmax over a 49k vocabulary took torch ~0.2 ms
 * per row in bf16 here. */
void ferry_argmax(const void *logits, int64_t rows, int64_t n, int dt, int64_t *out) {
#pragma omp parallel for schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        float *v = (float *)malloc((size_t)n * sizeof(float));
        load_row((const char *)logits + (size_t)r * n * elem(dt), dt, v, (int)n);
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
}

/* One decoder layer of a decode round (one new token per sequence, a few sequences, bf16
 * weights): the same kernels, in the same order, as the Python layer (engine/model/llama.py,
 * DecoderLayer.forward) calls them one by one, so the results are identical; one call per
 * layer instead of ~10 saves their Python and ctypes overhead (~20% of a batch-1 step). */
typedef struct {
    const void *input_norm, *post_norm, *q_norm, *k_norm; /* q/k norms: NULL unless Qwen3 */
    const void *qkv_w, *qkv_b, *o_w, *o_b, *gate_up_w, *gate_up_b, *down_w, *down_b;
    void *pages; /* this layer of the KV pool, [pages, 2, kv_heads, page_size, dim] */
} ferry_layer;

typedef struct {
    int64_t hidden, inter;
    int heads, kv_heads, dim, page_size;
    float eps, scale;
} ferry_dims;

/* x [rows, hidden]: the previous layer's output in, this layer's out; residual [rows, hidden]
 * the running sum (`first`: start it from x). scratch: rows x (2 hidden + (heads + 2 kv_heads)
 * dim + heads dim + 3 inter) bf16 values (ops.decode_layer sizes it). */
void ferry_decode_layer(const ferry_layer *L, const ferry_dims *D, int64_t rows, void *x,
                        void *residual, int first, const void *cos, const void *sin,
                        const int64_t *slots, const int32_t *page_ids, const int64_t *page_starts,
                        const int32_t *kv_lens, void *scratch) {
    const int h = D->heads, kvh = D->kv_heads, d = D->dim;
    const int64_t hidden = D->hidden, qkv_n = (int64_t)(h + 2 * kvh) * d;
    uint16_t *normed = (uint16_t *)scratch, *qkv = normed + rows * hidden;
    uint16_t *attn = qkv + rows * qkv_n, *proj = attn + rows * (int64_t)h * d;
    uint16_t *gate_up = proj + rows * hidden, *act = gate_up + rows * 2 * D->inter;
    if (first) {
        memcpy(residual, x, (size_t)(rows * hidden) * 2);
        ferry_rms_norm(x, NULL, L->input_norm, normed, rows, (int)hidden, D->eps, BF16);
    } else {
        ferry_rms_norm(x, residual, L->input_norm, normed, rows, (int)hidden, D->eps, BF16);
    }
    ferry_gemv_bf16(normed, L->qkv_w, L->qkv_b, qkv, (int)rows, hidden, qkv_n);
    if (L->q_norm)
        for (int64_t t = 0; t < rows; t++) {
            uint16_t *row = qkv + t * qkv_n;
            ferry_rms_norm(row, NULL, L->q_norm, row, h, d, D->eps, BF16);
            ferry_rms_norm(row + (int64_t)h * d, NULL, L->k_norm, row + (int64_t)h * d, kvh, d,
                           D->eps, BF16);
        }
    ferry_rotary(qkv, qkv_n, rows, h + kvh, d, cos, sin, BF16);
    ferry_store_kv(qkv + (int64_t)h * d, qkv_n, slots, rows, L->pages, kvh, D->page_size, d, BF16);
    ferry_decode_attention(qkv, qkv_n, L->pages, page_ids, page_starts, kv_lens, rows, h, kvh, d,
                           D->page_size, D->scale, attn, BF16);
    ferry_gemv_bf16(attn, L->o_w, L->o_b, proj, (int)rows, (int64_t)h * d, hidden);
    ferry_rms_norm(proj, residual, L->post_norm, normed, rows, (int)hidden, D->eps, BF16);
    ferry_gemv_bf16(normed, L->gate_up_w, L->gate_up_b, gate_up, (int)rows, hidden, 2 * D->inter);
    ferry_silu_mul(gate_up, act, rows, (int)D->inter, BF16);
    ferry_gemv_bf16(act, L->down_w, L->down_b, x, (int)rows, D->inter, hidden);
}
