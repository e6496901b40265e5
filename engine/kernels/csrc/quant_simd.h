/* The SIMD dot products of one weight row with R <= 4 activation rows, and of up to 8 weight
 * rows of the 32-value types with one activation row (rows32), written once and compiled
 * three times: quant_dot_avx2.c (AVX2), quant_dot_vnni.c (AVX-VNNI: one vpdpbusd
 * where AVX2 needs vpmaddubsw + vpmaddwd) and quant_dot_avx512_32.c (AVX512-VNNI on 256-bit
 * vectors, the 32-value block types only: QS_BLOCKS32_ONLY). Each weight block is decoded once
 * into bytes and multiplied with every row (unsigned weight bytes x signed activation bytes).
 * The includer defines QS_TARGET (a target attribute string), QS_VNNI (0, 1: AVX-VNNI, 2:
 * AVX512-VNNI) and QS_SUFFIX.
 * Same integer sums per block as quant_dot.c; the block types' float steps across blocks are
 * those of the rows-in-lanes kernels (see rows32, dot_q45k). */
#include "quant_impl.h"

#ifdef Q_HAVE_AVX2
#include <immintrin.h>

#define QS_CAT(a, b) a##b
#define QS_CAT2(a, b) QS_CAT(a, b)
#define TGT __attribute__((target(QS_TARGET)))
#define INL static inline __attribute__((always_inline)) TGT
#define ROW(act, astride, r) ((const char *)(act) + (int64_t)(r) * (astride))

#include "quant_x86.h"

/* acc + the 8 int32 lanes' sums of 4 products u * s over 32 bytes: u unsigned, s signed
 * (without VNNI, vpmaddubsw's pair sums saturate past 32,767: u < 128 there, or small) */
INL __m256i dot_us_acc(__m256i acc, __m256i u, __m256i s) {
#if QS_VNNI == 2
    return _mm256_dpbusd_epi32(acc, u, s);
#elif QS_VNNI
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                                                   _mm256_set1_epi16(1)));
#endif
}

/* the same from zero */
INL __m256i dot_us(__m256i u, __m256i s) { return dot_us_acc(_mm256_setzero_si256(), u, s); }

/* acc + sum of pairs p * s (16-bit lanes, 8 int32 sums): one vpdpwssd with VNNI */
INL __m256i madd_acc(__m256i acc, __m256i p, __m256i s) {
#if QS_VNNI == 2
    return _mm256_dpwssd_epi32(acc, p, s);
#elif QS_VNNI
    return _mm256_dpwssd_avx_epi32(acc, p, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
#endif
}

/* the same for signed weight bytes w: |w| x (s with w's sign) */
INL __m256i dot_ss(__m256i w, __m256i s) {
    return dot_us(_mm256_sign_epi8(w, w), _mm256_sign_epi8(s, w));
}

/* --- float rows ------------------------------------------------------------------------ */
INL __m256 load8(const uint8_t *w, int kind, int64_t i) {
    if (kind == QT_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i v = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (kind == QT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    return _mm256_cvtph_ps(v);
}

INL float scalar(const uint8_t *w, int kind, int64_t i) {
    if (kind == QT_F32) return ((const float *)w)[i];
    uint16_t h;
    memcpy(&h, w + 2 * i, 2);
    return kind == QT_BF16 ? ferry_bf16_to_f32(h) : _cvtsh_ss(h);
}

INL void dot_float(const uint8_t *w, int64_t n, const void *act, int64_t astride, const int R,
                   float *out, int kind) {
    /* two fused multiply-add chains per row, the same for every R (see dot32) */
    __m256 acc[2][QMAX_R];
    for (int u = 0; u < 2; u++)
        for (int r = 0; r < R; r++) acc[u][r] = _mm256_setzero_ps();
    int64_t i = 0;
    const int width = kind == QT_F32 ? 4 : 2;
    for (; i + 16 <= n; i += 16) {
        Q_PREFETCH(w + i * width, 16 * width);
        for (int u = 0; u < 2; u++) {
            __m256 wv = load8(w, kind, i + 8 * u);
            for (int r = 0; r < R; r++)
                acc[u][r] = _mm256_fmadd_ps(
                    wv, _mm256_loadu_ps((const float *)ROW(act, astride, r) + i + 8 * u),
                    acc[u][r]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 wv = load8(w, kind, i);
        for (int r = 0; r < R; r++)
            acc[0][r] = _mm256_fmadd_ps(
                wv, _mm256_loadu_ps((const float *)ROW(act, astride, r) + i), acc[0][r]);
    }
    for (int r = 0; r < R; r++) {
        float s = hsum(_mm256_add_ps(acc[0][r], acc[1][r]));
        const float *x = (const float *)ROW(act, astride, r);
        for (int64_t j = i; j < n; j++) s += scalar(w, kind, j) * x[j];
        out[r] = s;
    }
}

/* --- 32-value blocks ------------------------------------------------------------------- */
/* a block's weights as unsigned bytes, value = byte - ZERO32(qt) (Q4_1: its min aside);
 * Q8_0 only where vpdpbusd takes 255 * 127 without saturating (VNNI) */
#define ZERO32(qt) ((qt) == QT_Q4_0 ? 8 : (qt) == QT_Q5_0 ? 16 : (qt) == QT_Q8_0 ? 128 : 0)
#define UNSIGNED32(qt) ((qt) != QT_Q8_0 || QS_VNNI)
INL __m256i decode32_u(const uint8_t *blk, int qt) {
    switch (qt) {
    case QT_Q4_0: return nibbles(blk + 2);
    case QT_Q4_1: return nibbles(blk + 4);
    case QT_Q5_0: {
#if QS_VNNI == 2
        uint32_t qh;
        memcpy(&qh, blk + 2, 4);
        __m256i n = nibbles(blk + 6);
        return _mm256_mask_add_epi8(n, (__mmask32)qh, n, _mm256_set1_epi8(16));
#else
        return _mm256_or_si256(nibbles(blk + 6), bits16(blk + 2));
#endif
    }
    default:
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)),
                                _mm256_set1_epi8((char)0x80));
    }
}

/* decoded block: signed (Q4_0, Q5_0, Q8_0) or unsigned with a min (Q4_1) */
INL __m256i decode32(const uint8_t *blk, int qt) {
    if (qt == QT_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m256i u = decode32_u(blk, qt);
    return ZERO32(qt) ? _mm256_sub_epi8(u, _mm256_set1_epi8((char)ZERO32(qt))) : u;
}

/* the float16 at offset `at` of 8 rows, in one vector */
INL __m128i f16x8(const uint8_t *const *row, int64_t at) {
    uint16_t h;
    memcpy(&h, row[0] + at, 2);
    __m128i v = _mm_cvtsi32_si128(h);
#define F16X8_LANE(i) memcpy(&h, row[i] + at, 2), v = _mm_insert_epi16(v, h, i)
    F16X8_LANE(1); F16X8_LANE(2); F16X8_LANE(3); F16X8_LANE(4);
    F16X8_LANE(5); F16X8_LANE(6); F16X8_LANE(7);
#undef F16X8_LANE
    return v;
}

/* One activation row against n <= 8 weight rows (a chunk of a one-token product): a block's
 * integer sums of the 8 rows in the lanes of one vector (one add tree for 8 rows), the
 * activation block loaded once for all rows, and the float steps of all rows at once. Every
 * row: acc = fma(d_w * d_x, the block's exact integer sum, acc) block after block, plus Q4_1's
 * off = fma(min, s_x, off); y = acc + off: lane by lane the float operations of the
 * rows-in-lanes kernels (quant_lanes.h), so a row's result is the same bits whichever kernel
 * takes it and however many rows come along. Rows past n repeat row 0 (their lanes are
 * dropped). */
INL void rows32(const uint8_t *w, int64_t wstride, int n, int64_t nb, const qa32 *a, float *out,
                const int qt, const int bytes) {
    const uint8_t *row[8];
    for (int i = 0; i < 8; i++) row[i] = w + (i < n ? i : 0) * wstride;
    __m256 acc = _mm256_setzero_ps(), off = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[b].qs);
        /* every row's sums start at -zero * y's (so they end exact), where weights run
         * unsigned: no sign moves per row */
        const __m256i base = UNSIGNED32(qt) && ZERO32(qt)
            ? _mm256_sub_epi32(_mm256_setzero_si256(),
                               dot_us(_mm256_set1_epi8((char)ZERO32(qt)), y))
            : _mm256_setzero_si256();
        __m256i p[8];
        for (int i = 0; i < 8; i++) {
            const uint8_t *blk = row[i] + b * bytes;
            Q_PREFETCH(blk, bytes);
            if (UNSIGNED32(qt)) {
                p[i] = dot_us_acc(base, decode32_u(blk, qt), y);
            } else {
                __m256i q = decode32(blk, qt);
                p[i] = dot_ss(q, y);
            }
        }
        const __m256 dw = _mm256_cvtph_ps(f16x8(row, b * bytes));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a[b].d)),
                              _mm256_cvtepi32_ps(hsum8_i32(p)), acc);
        if (qt == QT_Q4_1)
            off = _mm256_fmadd_ps(_mm256_cvtph_ps(f16x8(row, b * bytes + 2)),
                                  _mm256_set1_ps(a[b].s), off);
    }
    float y[8];
    _mm256_storeu_ps(y, _mm256_add_ps(acc, off));
    for (int i = 0; i < n; i++) out[i] = y[i];
}

TGT void QS_CAT2(q_rows32_, QS_SUFFIX)(int qt, const uint8_t *w, int64_t wstride, int n,
                                       int64_t nb, const void *act, float *out) {
    const qa32 *a = (const qa32 *)act;
    switch (qt) {
    case QT_Q4_0: rows32(w, wstride, n, nb, a, out, QT_Q4_0, 18); break;
    case QT_Q4_1: rows32(w, wstride, n, nb, a, out, QT_Q4_1, 20); break;
    case QT_Q5_0: rows32(w, wstride, n, nb, a, out, QT_Q5_0, 22); break;
    default: rows32(w, wstride, n, nb, a, out, QT_Q8_0, 34); break;
    }
}

/* --- K-quants -------------------------------------------------------------------------- */
/* Per row and block the exact integer total and mins, then acc = fma(d * d_x, total, acc),
 * macc = fma(dmin * d_x, mins, macc); y = acc - macc (Q6_K: no mins, the -32 in the total):
 * the float steps of the rows-in-lanes kernels (quant_lanes_k.h), lane by lane, so a row's
 * result is the same bits whichever kernel takes it. One horizontal add a row per block. */
INL void dot_q45k(const uint8_t *w, int64_t nb, const void *act, int64_t astride, const int R,
                  float *out, int five) {
    const int bytes = five ? 176 : 144;
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    /* vpshufb controls on the block's 16 scale bytes (k4_scale_bytes) in both halves: scale
     * j as 16 words (byte j, then a zero byte); the mins as m0 m0 m1 m1 ... m7 m7, to pair
     * with the activation's sums of 16 */
    __m256i pick[8];
    for (int j = 0; j < 8; j++) pick[j] = _mm256_set1_epi16((short)(0x8000 | j));
    const __m256i mpick = _mm256_setr_epi16(
        (short)0x8008, (short)0x8008, (short)0x8009, (short)0x8009, (short)0x800a,
        (short)0x800a, (short)0x800b, (short)0x800b, (short)0x800c, (short)0x800c,
        (short)0x800d, (short)0x800d, (short)0x800e, (short)0x800e, (short)0x800f,
        (short)0x800f);
    float acc[QMAX_R], macc[QMAX_R];
    for (int r = 0; r < R; r++) acc[r] = macc[r] = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes, *qs = blk + (five ? 48 : 16);
        Q_PREFETCH(blk, bytes);
        /* the scales and mins unpacked in vector registers, not byte by byte */
        const __m256i sm = _mm256_broadcastsi128_si256(k4_scale_bytes(blk + 4));
        __m256i hb = five ? _mm256_loadu_si256((const __m256i *)(blk + 16))
                          : _mm256_setzero_si256();
        __m256i sumi[QMAX_R], sumh[QMAX_R]; /* two chains: the low and the high nibbles */
        for (int r = 0; r < R; r++) sumi[r] = sumh[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            Q45K_CHUNK(lo, hi, qs, hb, c, five);
            __m256i slo = _mm256_shuffle_epi8(sm, pick[2 * c]);
            __m256i shi = _mm256_shuffle_epi8(sm, pick[2 * c + 1]);
            for (int r = 0; r < R; r++) {
                const int8_t *y = ((const qa256 *)ROW(act, astride, r) + b)->qs + 64 * c;
                __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)y));
                __m256i phi =
                    _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y + 32)));
                sumi[r] = madd_acc(sumi[r], plo, slo);
                sumh[r] = madd_acc(sumh[r], phi, shi);
            }
        }
        const __m256i mins = _mm256_shuffle_epi8(sm, mpick);
        float d = f16(blk), dmin = f16(blk + 2);
        for (int r = 0; r < R; r++) {
            const qa256 *a = (const qa256 *)ROW(act, astride, r) + b;
            /* the row's total and its mins (sum of min g x the sums of 16 of group g), exact */
            __m128i u = hsum4_i32(_mm256_add_epi32(sumi[r], sumh[r]), _mm256_madd_epi16(
                _mm256_loadu_si256((const __m256i *)a->bsums), mins), _mm256_setzero_si256(),
                _mm256_setzero_si256());
            acc[r] = __builtin_fmaf(d * a->d, (float)_mm_cvtsi128_si32(u), acc[r]);
            macc[r] = __builtin_fmaf(dmin * a->d, (float)_mm_extract_epi32(u, 1), macc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r] - macc[r];
}

INL void dot_q6k(const uint8_t *w, int64_t nb, const void *act, int64_t astride, const int R,
                 float *out) {
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    float acc[QMAX_R];
    for (int r = 0; r < R; r++) acc[r] = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * 210;
        Q_PREFETCH(blk, 210);
        const int8_t *sc = (const int8_t *)blk + 192;
        __m256i sumi[QMAX_R], sumh[QMAX_R]; /* two chains: even and odd groups of 32 */
        for (int r = 0; r < R; r++) sumi[r] = sumh[r] = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            __m256i b1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n));
            __m256i b2 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
            __m256i q[4];
            for (int k = 0; k < 4; k++) q[k] = q6k_quarter(b1, b2, h, k, m4, m3);
            for (int k = 0; k < 4; k++) {
                __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[8 * n + 2 * k + 1]),
                                             _mm_set1_epi16(sc[8 * n + 2 * k]));
                for (int r = 0; r < R; r++) {
                    const int8_t *y =
                        ((const qa256 *)ROW(act, astride, r) + b)->qs + 128 * n + 32 * k;
                    __m256i p = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)y));
                    if (k & 1) sumh[r] = madd_acc(sumh[r], p, s);
                    else sumi[r] = madd_acc(sumi[r], p, s);
                }
            }
        }
        for (int r = 0; r < R; r++) sumi[r] = _mm256_add_epi32(sumi[r], sumh[r]);
        float d = f16(blk + 208);
        for (int r = 0; r < R; r++) {
            const qa256 *a = (const qa256 *)ROW(act, astride, r) + b;
            int32_t o = 0;
            for (int g = 0; g < 16; g++) o += sc[g] * a->bsums[g];
            /* the -32 of every value */
            acc[r] = __builtin_fmaf(d * a->d, (float)(hsum_i32(sumi[r]) - 32 * o), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = acc[r];
}


#define B_F32(R) dot_float(w, nb, act, astride, R, out, QT_F32)
#define B_F16(R) dot_float(w, nb, act, astride, R, out, QT_F16)
#define B_BF16(R) dot_float(w, nb, act, astride, R, out, QT_BF16)
/* the 32-value types' dot products: each activation row against the one weight row through
 * rows32 (ferry_qmatmul itself takes these types through the lanes, the half groups and
 * rows32's 8 weight rows; the entries name the path and serve any other caller) */
#define B_ROWS32(R, qt, bytes)                                                                \
    for (int r = 0; r < (R); r++)                                                             \
    rows32(w, 0, 1, nb, (const qa32 *)ROW(act, astride, r), out + r, qt, bytes)
#define B_Q4_0(R) B_ROWS32(R, QT_Q4_0, 18)
#define B_Q4_1(R) B_ROWS32(R, QT_Q4_1, 20)
#define B_Q5_0(R) B_ROWS32(R, QT_Q5_0, 22)
#define B_Q8_0(R) B_ROWS32(R, QT_Q8_0, 34)
#define B_Q4_K(R) dot_q45k(w, nb, act, astride, R, out, 0)
#define B_Q5_K(R) dot_q45k(w, nb, act, astride, R, out, 1)
#define B_Q6_K(R) dot_q6k(w, nb, act, astride, R, out)

Q_ENTRY(TGT, QS_CAT2(q_dot_q4_0_, QS_SUFFIX), B_Q4_0)
Q_ENTRY(TGT, QS_CAT2(q_dot_q4_1_, QS_SUFFIX), B_Q4_1)
Q_ENTRY(TGT, QS_CAT2(q_dot_q5_0_, QS_SUFFIX), B_Q5_0)
Q_ENTRY(TGT, QS_CAT2(q_dot_q8_0_, QS_SUFFIX), B_Q8_0)
#ifndef QS_BLOCKS32_ONLY
Q_ENTRY(TGT, QS_CAT2(q_dot_f32_, QS_SUFFIX), B_F32)
Q_ENTRY(TGT, QS_CAT2(q_dot_f16_, QS_SUFFIX), B_F16)
Q_ENTRY(TGT, QS_CAT2(q_dot_bf16_, QS_SUFFIX), B_BF16)
Q_ENTRY(TGT, QS_CAT2(q_dot_q4_k_, QS_SUFFIX), B_Q4_K)
Q_ENTRY(TGT, QS_CAT2(q_dot_q5_k_, QS_SUFFIX), B_Q5_K)
Q_ENTRY(TGT, QS_CAT2(q_dot_q6_k_, QS_SUFFIX), B_Q6_K)
#endif
#endif /* Q_HAVE_AVX2 */
