/* Plain-C dot products of one weight row with R activation rows (CPUs without AVX2, and the
 * reference the AVX2 path is tested against). Integer sums per block, float across blocks. */
#include "quant_impl.h"

#define ROW(act, astride, r) ((const char *)(act) + (int64_t)(r) * (astride))

static inline float weight_at(const uint8_t *w, int kind, int64_t i) {
    if (kind == QT_F32) return ((const float *)w)[i];
    uint16_t h;
    memcpy(&h, w + 2 * i, 2);
    return kind == QT_BF16 ? ferry_bf16_to_f32(h) : ferry_f16_to_f32(h);
}

/* float weights: n values, float32 activations */
static void dot_float(const uint8_t *w, int64_t n, const void *act, int64_t astride, int R,
                      float *out, int kind) {
    for (int r = 0; r < R; r++) {
        const float *x = (const float *)ROW(act, astride, r);
        float acc = 0.f;
        for (int64_t i = 0; i < n; i++) acc += weight_at(w, kind, i) * x[i];
        out[r] = acc;
    }
}

/* one entry point per type, all with the qdot_fn signature */
#define ENTRY(name, call)                                                                    \
    void q_dot_##name##_plain(const uint8_t *w, int64_t nb, const void *act, int64_t astride, \
                              int R, float *out) {                                           \
        call;                                                                                \
    }
ENTRY(f32, dot_float(w, nb, act, astride, R, out, QT_F32))
ENTRY(f16, dot_float(w, nb, act, astride, R, out, QT_F16))
ENTRY(bf16, dot_float(w, nb, act, astride, R, out, QT_BF16))

/* 32-value blocks: q[j] the weight's integer values (signed, or unsigned with an offset) */
static inline int32_t idot32(const int8_t *q, const int8_t *a) {
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (int32_t)q[j] * a[j];
    return s;
}

/* a 32-value block's integer values and scale; *min: Q4_1's offset (0 for the others) */
static inline float decode32(const uint8_t *blk, int qt, int8_t q[32], float *min) {
    *min = 0.f;
    if (qt == QT_Q8_0) {
        memcpy(q, blk + 2, 32);
        return q_f16(blk);
    }
    uint32_t qh = 0;
    const uint8_t *qs = blk + (qt == QT_Q4_0 ? 2 : qt == QT_Q4_1 ? 4 : 6);
    if (qt == QT_Q5_0) memcpy(&qh, blk + 2, 4);
    int zero = qt == QT_Q4_0 ? 8 : qt == QT_Q5_0 ? 16 : 0;
    for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
        int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        q[j] = (int8_t)(lo - zero);
        q[j + 16] = (int8_t)(hi - zero);
    }
    if (qt == QT_Q4_1) *min = q_f16(blk + 2);
    return q_f16(blk);
}

static void dot32(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,
                  float *out, int qt, int bytes) {
    for (int r = 0; r < R; r++) {
        const qa32 *a = (const qa32 *)ROW(act, astride, r);
        float acc = 0.f, off = 0.f;
        for (int64_t b = 0; b < nb; b++) {
            int8_t q[32];
            float min, d = decode32(w + b * bytes, qt, q, &min);
            acc += d * a[b].d * (float)idot32(q, a[b].qs);
            if (qt == QT_Q4_1) off += min * a[b].s; /* the min times sum(x) */
        }
        out[r] = acc + off;
    }
}

ENTRY(q4_0, dot32(w, nb, act, astride, R, out, QT_Q4_0, 18))
ENTRY(q4_1, dot32(w, nb, act, astride, R, out, QT_Q4_1, 20))
ENTRY(q5_0, dot32(w, nb, act, astride, R, out, QT_Q5_0, 22))
ENTRY(q8_0, dot32(w, nb, act, astride, R, out, QT_Q8_0, 34))

/* K-quants: sumi = sum_g scale_g * dot_g (int), mins = sum_g min_g * sum(x_g) (int) */
static void dot_q45_k(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,
                      float *out, int five) {
    int bytes = five ? 176 : 144;
    for (int r = 0; r < R; r++) {
        const qa256 *a = (const qa256 *)ROW(act, astride, r);
        float acc = 0.f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * bytes, *qh = blk + 16, *qs = blk + (five ? 48 : 16);
            uint8_t sc[8], m[8];
            q_scale_min_k4(blk + 4, sc, m);
            int32_t sumi = 0, mins = 0;
            for (int c = 0; c < 4; c++) { /* 64 values: low nibbles, then high nibbles */
                int32_t lo = 0, hi = 0;
                for (int l = 0; l < 32; l++) {
                    int ql = qs[32 * c + l] & 15, qu = qs[32 * c + l] >> 4;
                    if (five) {
                        ql |= ((qh[l] >> (2 * c)) & 1) << 4;
                        qu |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                    }
                    lo += ql * a[b].qs[64 * c + l];
                    hi += qu * a[b].qs[64 * c + 32 + l];
                }
                sumi += sc[2 * c] * lo + sc[2 * c + 1] * hi;
            }
            for (int g = 0; g < 8; g++) mins += m[g] * (a[b].bsums[2 * g] + a[b].bsums[2 * g + 1]);
            acc += q_f16(blk) * a[b].d * (float)sumi - q_f16(blk + 2) * a[b].d * (float)mins;
        }
        out[r] = acc;
    }
}

ENTRY(q4_k, dot_q45_k(w, nb, act, astride, R, out, 0))
ENTRY(q5_k, dot_q45_k(w, nb, act, astride, R, out, 1))

/* Q6_K: 16 groups of 16 with int8 scales; values 0..63 stored, 32 subtracted (via bsums) */
static void dot_q6_k(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,
                     float *out) {
    for (int r = 0; r < R; r++) {
        const qa256 *a = (const qa256 *)ROW(act, astride, r);
        float acc = 0.f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * 210, *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)blk + 192;
            int32_t sumi = 0;
            for (int n = 0; n < 2; n++) {
                for (int k = 0; k < 4; k++) { /* 32 values at 128n + 32k */
                    int32_t s16[2] = {0, 0};
                    for (int l = 0; l < 32; l++) {
                        int lowbits = k & 1 ? ql[64 * n + 32 + l] : ql[64 * n + l];
                        int q = (k < 2 ? lowbits & 15 : lowbits >> 4) |
                                (((qh[32 * n + l] >> (2 * k)) & 3) << 4);
                        s16[l >> 4] += q * a[b].qs[128 * n + 32 * k + l];
                    }
                    sumi += sc[8 * n + 2 * k] * s16[0] + sc[8 * n + 2 * k + 1] * s16[1];
                }
            }
            int32_t off = 0;
            for (int g = 0; g < 16; g++) off += sc[g] * a[b].bsums[g];
            acc += q_f16(blk + 208) * a[b].d * (float)(sumi - 32 * off);
        }
        out[r] = acc;
    }
}

ENTRY(q6_k, dot_q6_k(w, nb, act, astride, R, out))
