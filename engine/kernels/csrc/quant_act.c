/* Quantizing float32 rows: activations per call (both dot-product paths use these same
 * routines, so their integer parts agree exactly), and weights to Q8_0 / Q4_0 at load. */
#include "quant_impl.h"

/* max |v[j]| over n values; a NaN is passed over, as fmaxf would (which stays a libm call per
 * value without -ffinite-math-only) */
static inline float abs_max(const float *v, int n) {
    float amax = 0.f;
    int j = 0;
#ifdef FERRY_AVX2
    __m256 m = _mm256_setzero_ps();
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (; j + 8 <= n; j += 8) /* max_ps returns its second operand when either is NaN */
        m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v + j), magnitude), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
#endif
    for (; j < n; j++) {
        float a = fabsf(v[j]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* per 32 values: d = max|x| / 127, qs = round-to-nearest-even(x / d) */
void q_act32(const float *x, int64_t n, qa32 *out) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *v = x + b * 32;
        float amax = abs_max(v, 32);
        float d = amax / 127.f, id = d > 0.f ? 127.f / amax : 0.f;
        int32_t sum = 0;
        for (int j = 0; j < 32; j++) {
            int q = (int)nearbyintf(v[j] * id);
            out[b].qs[j] = (int8_t)q;
            sum += q;
        }
        out[b].d = d;
        out[b].s = d * (float)sum;
    }
}

/* per 256 values: one scale, and the sum of each 16 quantized values */
void q_act256(const float *x, int64_t n, qa256 *out) {
    for (int64_t b = 0; b < n / 256; b++) {
        const float *v = x + b * 256;
        float amax = abs_max(v, 256);
        float d = amax / 127.f, id = d > 0.f ? 127.f / amax : 0.f;
        for (int j = 0; j < 256; j++) out[b].qs[j] = (int8_t)(int)nearbyintf(v[j] * id);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += out[b].qs[g * 16 + j];
            out[b].bsums[g] = (int16_t)s;
        }
        out[b].d = d;
    }
}

/* gguf-py's Q8_0 (= ggml's reference): d = amax / 127 in float32, qs = roundf(x * (1 / d)) */
static void quantize_q8_0(const float *v, uint8_t *blk) {
    float amax = abs_max(v, 32);
    float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    uint16_t h = ferry_f32_to_f16(d);
    memcpy(blk, &h, 2);
    for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)roundf(v[j] * id);
}

/* gguf-py's Q4_0: d = (the value of largest magnitude, first one on ties) / -8,
 * q = min(15, trunc(x * (1 / d) + 8.5)) */
static void quantize_q4_0(const float *v, uint8_t *blk) {
    float amax = 0.f, max = 0.f;
    for (int j = 0; j < 32; j++) {
        if (fabsf(v[j]) > amax) {
            amax = fabsf(v[j]);
            max = v[j];
        }
    }
    float d = max / -8.f, id = d != 0.f ? 1.f / d : 0.f;
    uint16_t h = ferry_f32_to_f16(d);
    memcpy(blk, &h, 2);
    for (int j = 0; j < 16; j++) {
        float a = truncf(v[j] * id + 8.5f), b = truncf(v[j + 16] * id + 8.5f);
        uint8_t qa = a >= 15.f ? 15 : (uint8_t)a, qb = b >= 15.f ? 15 : (uint8_t)b;
        blk[2 + j] = (uint8_t)(qa | (qb << 4));
    }
}

int ferry_qquantize(const float *x, int64_t rows, int64_t in, int qtype, void *out) {
    if ((qtype != QT_Q8_0 && qtype != QT_Q4_0) || in % 32 != 0 || rows < 0) return FERRY_EQUANT;
    int bytes = qtype == QT_Q8_0 ? 34 : 18;
    int64_t nb = in / 32;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *dst = (uint8_t *)out + r * nb * bytes;
        for (int64_t b = 0; b < nb; b++) {
            if (qtype == QT_Q8_0)
                quantize_q8_0(x + r * in + b * 32, dst + b * bytes);
            else
                quantize_q4_0(x + r * in + b * 32, dst + b * bytes);
        }
    }
    return FERRY_OK;
}

void q_pack_lanes32(const void *rows, int n, int64_t astride, int64_t nb, ql32 *out) {
    for (int64_t b = 0; b < nb; b++) {
        memset(&out[b], 0, sizeof out[b]); /* lanes from n on: zero rows */
        for (int r = 0; r < n; r++) {
            const qa32 *a = (const qa32 *)((const char *)rows + r * astride) + b;
            int32_t sum = 0;
            for (int j = 0; j < 32; j++) sum += a->qs[j];
            for (int k = 0; k < 8; k++) memcpy(&out[b].qs[k][4 * r], a->qs + 4 * k, 4);
            out[b].d[r] = a->d;
            out[b].s[r] = a->s;
            out[b].sum[r] = sum;
        }
    }
}

void q_pack_half32(const void *rows, int n, int64_t astride, int64_t nb, ql32 *out) {
    for (int64_t b = 0; b < nb; b++) {
        memset(&out[b], 0, sizeof out[b]);
        for (int r = 0; r < n; r++) {
            const qa32 *a = (const qa32 *)((const char *)rows + r * astride) + b;
            int32_t sum = 0;
            for (int j = 0; j < 32; j++) sum += a->qs[j];
            for (int k = 0; k < 4; k++) {
                /* a pair: vector k / 2 holds groups k of both rows, then k + 1 (and k + 4,
                 * k + 5 in the high half); else vector k group k (k + 4) of every row */
                int v = n == 2 ? k / 2 : k, at = n == 2 ? 8 * (k % 2) + 4 * r : 4 * r;
                memcpy(&out[b].qs[v][at], a->qs + 4 * k, 4);
                memcpy(&out[b].qs[v][16 + at], a->qs + 16 + 4 * k, 4);
            }
            out[b].d[r] = a->d;
            out[b].s[r] = a->s;
            out[b].sum[r] = sum;
        }
    }
}

void q_pack_lanes_k(const void *rows, int n, int64_t astride, int64_t nb, int qt, qlk *out) {
    for (int64_t b = 0; b < nb; b++) {
        memset(&out[b], 0, sizeof out[b]);
        for (int r = 0; r < n; r++) {
            const qa256 *a = (const qa256 *)((const char *)rows + r * astride) + b;
            for (int k = 0; k < 64; k++) memcpy(&out[b].qs[k][4 * r], a->qs + 4 * k, 4);
            for (int i = 0; i < 16; i++) /* pair i / 2, lane 2r + i % 2 */
                out[b].sums[i / 2][2 * r + i % 2] =
                    qt == QT_Q6_K ? a->bsums[i]
                    : i < 8       ? (int16_t)(a->bsums[2 * i] + a->bsums[2 * i + 1])
                                  : 0;
            out[b].d[r] = a->d;
        }
    }
}
