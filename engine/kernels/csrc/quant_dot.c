/* Plain-C dot products of one weight row with R activation rows (CPUs without AVX2, and the
 * reference the AVX2 path is tested against). Integer sums per block, float across blocks. */
#include "quant_impl.h"

#define ROW(act, astride, r) ((const char *)(act) + (int64_t)(r) * (astride))

void q_dot_f32_plain(const uint8_t *w, int64_t n, const void *act, int64_t astride, int R,
                     float *out) {
    const float *wf = (const float *)w;
    for (int r = 0; r < R; r++) {
        const float *x = (const float *)ROW(act, astride, r);
        float acc = 0.f;
        for (int64_t i = 0; i < n; i++) acc += wf[i] * x[i];
        out[r] = acc;
    }
}

void q_dot_f16_plain(const uint8_t *w, int64_t n, const void *act, int64_t astride, int R,
                     float *out) {
    for (int r = 0; r < R; r++) {
        const float *x = (const float *)ROW(act, astride, r);
        float acc = 0.f;
        for (int64_t i = 0; i < n; i++) acc += q_f16(w + 2 * i) * x[i];
        out[r] = acc;
    }
}

void q_dot_bf16_plain(const uint8_t *w, int64_t n, const void *act, int64_t astride, int R,
                      float *out) {
    const uint16_t *wb = (const uint16_t *)w;
    for (int r = 0; r < R; r++) {
        const float *x = (const float *)ROW(act, astride, r);
        float acc = 0.f;
        for (int64_t i = 0; i < n; i++) acc += ferry_bf16_to_f32(wb[i]) * x[i];
        out[r] = acc;
    }
}

/* 32-value blocks: q[j] the weight's integer values (signed, or unsigned with an offset) */
static inline int32_t idot32(const int8_t *q, const int8_t *a) {
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (int32_t)q[j] * a[j];
    return s;
}

void q_dot_q4_0_plain(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,
                      float *out) {
    for (int r = 0; r < R; r++) {
        const qa32 *a = (const qa32 *)ROW(act, astride, r);
        float acc = 0.f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * 18;
            int8_t q[32];
            for (int j = 0; j < 16; j++) {
                q[j] = (int8_t)((blk[2 + j] & 15) - 8);
                q[j + 16] = (int8_t)((blk[2 + j] >> 4) - 8);
            }
            acc += q_f16(blk) * a[b].d * (float)idot32(q, a[b].qs);
        }
        out[r] = acc;
    }
}

void q_dot_q4_1_plain(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,
                      float *out) {
    for (int r = 0; r < R; r++) {
        const qa32 *a = (const qa32 *)ROW(act, astride, r);
        float acc = 0.f, off = 0.f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * 20;
            int8_t q[32];
            for (int j = 0; j < 16; j++) {
                q[j] = (int8_t)(blk[4 + j] & 15);
                q[j + 16] = (int8_t)(blk[4 + j] >> 4);
            }
            acc += q_f16(blk) * a[b].d * (float)idot32(q, a[b].qs);
            off += q_f16(blk + 2) * a[b].s; /* the min times sum(x) */
        }
        out[r] = acc + off;
    }
}

void q_dot_q5_0_plain(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,
                      float *out) {
    for (int r = 0; r < R; r++) {
        const qa32 *a = (const qa32 *)ROW(act, astride, r);
        float acc = 0.f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * 22;
            uint32_t qh;
            memcpy(&qh, blk + 2, 4);
            int8_t q[32];
            for (int j = 0; j < 16; j++) {
                q[j] = (int8_t)(((blk[6 + j] & 15) | (((qh >> j) & 1) << 4)) - 16);
                q[j + 16] = (int8_t)(((blk[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
            }
            acc += q_f16(blk) * a[b].d * (float)idot32(q, a[b].qs);
        }
        out[r] = acc;
    }
}

void q_dot_q8_0_plain(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,
                      float *out) {
    for (int r = 0; r < R; r++) {
        const qa32 *a = (const qa32 *)ROW(act, astride, r);
        float acc = 0.f;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * 34;
            acc += q_f16(blk) * a[b].d * (float)idot32((const int8_t *)blk + 2, a[b].qs);
        }
        out[r] = acc;
    }
}

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

void q_dot_q4_k_plain(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,
                      float *out) {
    dot_q45_k(w, nb, act, astride, R, out, 0);
}

void q_dot_q5_k_plain(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,
                      float *out) {
    dot_q45_k(w, nb, act, astride, R, out, 1);
}

/* Q6_K: 16 groups of 16 with int8 scales; values 0..63 stored, 32 subtracted (via bsums) */
void q_dot_q6_k_plain(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,
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
