/* bf16 matrix-vector products for a few rows. */
#include "kernels.h"

#ifdef FERRY_AVX2
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
        for (int r = 0; r < R; r++) res[k * 4 + r] = ferry_hsum(acc[k][r]);
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
        for (int64_t i = 0; i < in; i++) s += ferry_bf16_to_f32(w[i]) * x[r * in + i];
        res[r] = s;
    }
}

/* y[r, o] = sum_i x[r, i] * w[o, i] (+ bias[o]) for a few rows of x and a bf16 weight
 * [out, in], all bf16, accumulated in float32 and rounded once. Bound by reading the weight
 * at batch 1 like torch's kernel, but unlike torch's emulated bf16 product it stays there for
 * 2-4 rows, so a few concurrent chats decode almost as fast as one. */
int ferry_gemv_bf16(const void *x, const void *w, const void *bias, void *y, int rows,
                    int64_t in, int64_t out) {
    const uint16_t *wb = (const uint16_t *)w, *bb = (const uint16_t *)bias;
    uint16_t *yb = (uint16_t *)y;
    float *xf = (float *)malloc((size_t)rows * in * sizeof(float) * 2);
    if (!xf) return FERRY_ENOMEM;
    float *xp = xf + rows * in;
    ferry_load_row(x, FERRY_BF16, xf, rows * in);
    int64_t simd_out = 0;
#ifdef FERRY_AVX2
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
                        yb[(g + r) * out + o + k] = ferry_f32_to_bf16(
                            res[k * 4 + r] + (bb ? ferry_bf16_to_f32(bb[o + k]) : 0.f));
            }
        }
    }
#endif
#pragma omp parallel for schedule(static) if (out - simd_out > 64)
    for (int64_t o = simd_out; o < out; o++)
        for (int r = 0; r < rows; r++) {
            float res;
            dot_plain(wb + o * in, in, xf + (int64_t)r * in, 1, &res);
            yb[r * out + o] = ferry_f32_to_bf16(res + (bb ? ferry_bf16_to_f32(bb[o]) : 0.f));
        }
    free(xf);
    return FERRY_OK;
}
