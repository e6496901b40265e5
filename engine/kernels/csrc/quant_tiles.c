/* Dequantization of whole rows to float32, exactly as gguf-py's dequantize (same float32
 * operations in the same order: no fused multiply-add, which would round once less). */
#pragma GCC optimize("fp-contract=off")
#include "quant_impl.h"

#ifdef Q_HAVE_AVX2
/* AVX512-BF16 (vcvtneps2bf16: round to nearest even, as torch; it flushes subnormals, which
 * a block's d * q never is), with AVX512-BW's word permutes for the K-quants' tables */
int q_cpu_bf16(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = FERRY_CPU_BF16 && __builtin_cpu_supports("avx512bf16") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
    }
    return has;
}
#else
int q_cpu_bf16(void) { return 0; }
#endif

static void row_f32(int qt, const uint8_t *src, int64_t in, float *dst) {
    int64_t nb;
#ifdef Q_HAVE_AVX2
    if (q_active_path() >= 1 && q_deq_row_avx2(qt, src, in, dst, 0)) return;
#endif
    switch (qt) {
    case QT_F32: memcpy(dst, src, (size_t)in * 4); return;
    case QT_F16:
        for (int64_t i = 0; i < in; i++) dst[i] = q_f16(src + 2 * i);
        return;
    case QT_BF16:
        for (int64_t i = 0; i < in; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = ferry_bf16_to_f32(h);
        }
        return;
    case QT_Q4_0:
    case QT_Q4_1:
    case QT_Q5_0:
    case QT_Q8_0:
        nb = in / 32;
        for (int64_t b = 0; b < nb; b++) {
            float *o = dst + 32 * b;
            if (qt == QT_Q8_0) {
                const uint8_t *k = src + 34 * b;
                float d = q_f16(k);
                for (int j = 0; j < 32; j++) o[j] = (float)(int8_t)k[2 + j] * d;
            } else if (qt == QT_Q4_0) {
                const uint8_t *k = src + 18 * b;
                float d = q_f16(k);
                for (int j = 0; j < 16; j++) {
                    o[j] = d * (float)((k[2 + j] & 15) - 8);
                    o[j + 16] = d * (float)((k[2 + j] >> 4) - 8);
                }
            } else if (qt == QT_Q4_1) {
                const uint8_t *k = src + 20 * b;
                float d = q_f16(k), m = q_f16(k + 2);
                for (int j = 0; j < 16; j++) {
                    o[j] = d * (float)(k[4 + j] & 15) + m;
                    o[j + 16] = d * (float)(k[4 + j] >> 4) + m;
                }
            } else {
                const uint8_t *k = src + 22 * b;
                float d = q_f16(k);
                uint32_t qh;
                memcpy(&qh, k + 2, 4);
                for (int j = 0; j < 16; j++) {
                    o[j] = d * (float)((int)((k[6 + j] & 15) | (((qh >> j) & 1) << 4)) - 16);
                    int hi = (int)((k[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
                    o[j + 16] = d * (float)(hi - 16);
                }
            }
        }
        return;
    case QT_Q4_K:
    case QT_Q5_K:
        nb = in / 256;
        for (int64_t b = 0; b < nb; b++) {
            int five = qt == QT_Q5_K;
            const uint8_t *k = src + (five ? 176 : 144) * b, *qh = k + 16;
            const uint8_t *qs = k + (five ? 48 : 16);
            float d = q_f16(k), dmin = q_f16(k + 2), *o = dst + 256 * b;
            uint8_t sc[8], m[8];
            q_scale_min_k4(k + 4, sc, m);
            for (int c = 0; c < 4; c++) {
                float d1 = d * (float)sc[2 * c], m1 = dmin * (float)m[2 * c];
                float d2 = d * (float)sc[2 * c + 1], m2 = dmin * (float)m[2 * c + 1];
                for (int l = 0; l < 32; l++) {
                    int lo = qs[32 * c + l] & 15, hi = qs[32 * c + l] >> 4;
                    if (five) {
                        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                    }
                    o[64 * c + l] = d1 * (float)lo - m1;
                    o[64 * c + 32 + l] = d2 * (float)hi - m2;
                }
            }
        }
        return;
    case QT_Q6_K:
        nb = in / 256;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *k = src + 210 * b, *ql = k, *qh = k + 128;
            const int8_t *sc = (const int8_t *)k + 192;
            float d = q_f16(k + 208), *o = dst + 256 * b;
            for (int n = 0; n < 2; n++) {
                for (int kk = 0; kk < 4; kk++) {
                    for (int l = 0; l < 32; l++) {
                        int low = kk & 1 ? ql[64 * n + 32 + l] : ql[64 * n + l];
                        int q = ((kk < 2 ? low & 15 : low >> 4) |
                                 (((qh[32 * n + l] >> (2 * kk)) & 3) << 4)) - 32;
                        float s = d * (float)sc[8 * n + 2 * kk + (l >> 4)];
                        o[128 * n + 32 * kk + l] = s * (float)q;
                    }
                }
            }
        }
        return;
    }
}

void q_row_bf16(int qt, const uint8_t *src, int64_t in, uint16_t *dst, float *tmp) {
#ifdef Q_HAVE_AVX2
    if (q_active_path() >= 2 && q_cpu_bf16() && q_deq_row_avx512bf16(qt, src, in, dst, 1))
        return;
    if (q_active_path() >= 1 && q_deq_row_avx2(qt, src, in, dst, 1)) return;
#endif
    row_f32(qt, src, in, tmp);
#ifdef Q_HAVE_AVX2
    if (q_active_path() >= 1) {
        q_to_bf16_avx2(tmp, in, dst);
        return;
    }
#endif
    for (int64_t i = 0; i < in; i++) dst[i] = ferry_f32_to_bf16(tmp[i]);
}

int ferry_qdequantize(const ferry_weight *w, const int64_t *ids, int64_t n, void *out, int dt) {
    const qtype_info *info;
    if (!q_valid(w, &info) || (dt != FERRY_F32 && dt != FERRY_BF16)) return FERRY_EQUANT;
    for (int64_t k = 0; k < n; k++)
        if (ids && (ids[k] < 0 || ids[k] >= w->out)) return FERRY_EQUANT;
    if (!ids && n > w->out) return FERRY_EQUANT;
    int failed = 0;
#pragma omp parallel if (n >= 16)
    {
        float *tmp = dt == FERRY_BF16 ? (float *)malloc((size_t)w->in * sizeof(float)) : NULL;
        if (dt == FERRY_BF16 && !tmp) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t k = 0; k < n; k++) {
            int64_t o = ids ? ids[k] : k;
            const uint8_t *src = (const uint8_t *)w->data + o * w->row_bytes;
            if (dt == FERRY_F32)
                row_f32(w->qtype, src, w->in, (float *)out + k * w->in);
            else if (tmp) /* bfloat16 tiles for torch's bf16 matmul */
                q_row_bf16(w->qtype, src, w->in, (uint16_t *)out + k * w->in, tmp);
        }
        free(tmp);
    }
    return failed ? FERRY_ENOMEM : FERRY_OK;
}
