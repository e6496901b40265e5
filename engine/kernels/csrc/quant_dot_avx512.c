/* AVX-512 dot products of the K-quants (Q4_K, Q5_K, Q6_K) with R <= 4 activation rows:
 * 64 weights per instruction where quant_simd.h takes 32, and the scales and mins of a block
 * unpacked with vector shuffles instead of byte by byte. The integer sums of every block and
 * the float steps across blocks are those of the other paths (quant_simd.h dot_q45k).
 * quant_matmul.c calls these where the CPU has AVX512-BW, -VL and -VNNI; so too the
 * rows-in-lanes kernels (quant_lanes.h, quant_lanes_k.h) built here. */
#include "quant_impl.h"

#ifdef Q_HAVE_AVX2
#include <immintrin.h>

#define TGT __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define INL static inline __attribute__((always_inline)) TGT
#define ROW(act, astride, r) ((const qa256 *)((const char *)(act) + (int64_t)(r) * (astride)))

#include "quant_x86.h"

/* 32 words (vpermw indices, vpsrlvw counts): words 0..15 count up from lo, words 16..31 from
 * hi, by one every `step` words */
INL __m512i words(int lo, int hi, int step) {
    int16_t v[32];
    for (int i = 0; i < 32; i++) v[i] = (int16_t)((i < 16 ? lo : hi) + (i % 16) / step);
    return _mm512_loadu_si512(v);
}

/* sum over a block's four chunks of 64 values of scale x (q x y), y the block's activation
 * bytes, in 16 int32 lanes (two chains) */
INL __m512i block_sum(const __m512i q[4], const __m512i sc[4], const int8_t *y) {
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int c = 0; c < 4; c += 2) {
        __m512i p0 = _mm512_maddubs_epi16(q[c], _mm512_loadu_si512(y + 64 * c));
        __m512i p1 = _mm512_maddubs_epi16(q[c + 1], _mm512_loadu_si512(y + 64 * c + 64));
        s0 = _mm512_dpwssd_epi32(s0, p0, sc[c]);
        s1 = _mm512_dpwssd_epi32(s1, p1, sc[c + 1]);
    }
    return _mm512_add_epi32(s0, s1);
}

/* 16 int32 lanes added into 8 (exact) */
INL __m256i fold512(__m512i s) {
    return _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
}

/* the scales of R <= 4 activation rows' block b, in lanes 0..R-1 (the others 0) */
INL __m128 rows_d(const void *act, int64_t astride, const int R, int64_t b) {
    return _mm_setr_ps(ROW(act, astride, 0)[b].d, R > 1 ? ROW(act, astride, 1)[b].d : 0.f,
                       R > 2 ? ROW(act, astride, 2)[b].d : 0.f,
                       R > 3 ? ROW(act, astride, 3)[b].d : 0.f);
}

/* the 64 values of chunk c (32 bytes at qs): the low nibbles, then the high ones; a
 * broadcast load and a masked shift, no cross-lane insert */
INL __m512i k4_chunk(const uint8_t *qs, const int c, __m512i m4) {
    __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * c)));
    return _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xffff0000u, v, 4), m4);
}

/* vpshufb controls: for chunk c, words of scale 2c (first 256 bits) and 2c + 1 (the rest),
 * each the scale byte and a zero; for the mins, words m0 m0 m1 m1 ... m7 m7 */
INL void k4_controls(__m512i ctl[4], __m256i *mctl) {
    int8_t v[64], m[32];
    for (int c = 0; c < 4; c++) {
        for (int i = 0; i < 64; i += 2) {
            v[i] = (int8_t)(2 * c + (i >= 32));
            v[i + 1] = (int8_t)0x80;
        }
        ctl[c] = _mm512_loadu_si512(v);
    }
    for (int i = 0; i < 32; i += 2) {
        m[i] = (int8_t)(8 + i / 4);
        m[i + 1] = (int8_t)0x80;
    }
    *mctl = _mm256_loadu_si256((const __m256i *)m);
}

/* one Q4_K / Q5_K block against one activation block: the scaled sum (t) and the mins'
 * sum (m), 8 int32 lanes each, their lane sums exact */
INL void k45_block(const uint8_t *blk, const qa256 *a, const int five, const __m512i pair[4],
                   const __m512i ctl[4], __m256i mctl, __m256i *t, __m256i *m) {
    const __m512i m4 = _mm512_set1_epi8(15), one = _mm512_set1_epi8(1);
    const uint8_t *qs = blk + (five ? 48 : 16);
    __m128i sb = k4_scale_bytes(blk + 4);
    __m512i sb512 = _mm512_broadcast_i32x4(sb);
    __m512i hb = five ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)))
                      : _mm512_setzero_si512();
    __m512i q[4], sc[4];
    for (int c = 0; c < 4; c++) {
        q[c] = k4_chunk(qs, c, m4);
        if (five)
            q[c] = _mm512_or_si512(q[c], _mm512_slli_epi16(_mm512_and_si512(
                _mm512_srlv_epi16(hb, pair[c]), one), 4));
        sc[c] = _mm512_shuffle_epi8(sb512, ctl[c]);
    }
    *t = fold512(block_sum(q, sc, a->qs));
    *m = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums),
                           _mm256_shuffle_epi8(_mm512_castsi512_si256(sb512), mctl));
}

/* one activation row: two blocks a step, their four lane sums in one add tree; the float
 * steps of every block are those of dot_q45k (lanes 0 and 1: the total and the mins) */
INL void dot_q45k_one(const uint8_t *w, int64_t nb, const void *act, const int five,
                      float *out) {
    const int bytes = five ? 176 : 144;
    __m512i pair[4];
    for (int c = 0; c < 4; c++) pair[c] = words(2 * c, 2 * c + 1, 16);
    __m512i ctl[4];
    __m256i mctl;
    k4_controls(ctl, &mctl);
    const qa256 *a = (const qa256 *)act;
    __m128 acc = _mm_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *blk = w + b * bytes;
        Q_PREFETCH(blk, 2 * bytes);
        __m256i t0, m0, t1, m1;
        k45_block(blk, a + b, five, pair, ctl, mctl, &t0, &m0);
        k45_block(blk + bytes, a + b + 1, five, pair, ctl, mctl, &t1, &m1);
        __m128 u = _mm_cvtepi32_ps(hsum4_i32(t0, m0, t1, m1));
        /* d and dmin of each block: two float16, loaded straight into a vector register */
        __m128 dm0 = _mm_cvtph_ps(_mm_loadu_si32(blk));
        __m128 dm1 = _mm_cvtph_ps(_mm_loadu_si32(blk + bytes));
        acc = _mm_fmadd_ps(_mm_mul_ps(dm0, _mm_set1_ps(a[b].d)), u, acc);
        acc = _mm_fmadd_ps(_mm_mul_ps(dm1, _mm_set1_ps(a[b + 1].d)), _mm_movehl_ps(u, u), acc);
    }
    if (b < nb) {
        const uint8_t *blk = w + b * bytes;
        __m256i t0, m0;
        k45_block(blk, a + b, five, pair, ctl, mctl, &t0, &m0);
        __m128 dm0 = _mm_cvtph_ps(_mm_loadu_si32(blk));
        acc = _mm_fmadd_ps(_mm_mul_ps(dm0, _mm_set1_ps(a[b].d)),
                           _mm_cvtepi32_ps(hsum4_i32(t0, m0, t0, m0)), acc);
    }
    out[0] = _mm_cvtss_f32(_mm_sub_ss(acc, _mm_movehdup_ps(acc)));
}

INL void dot_q45k(const uint8_t *w, int64_t nb, const void *act, int64_t astride, const int R,
                  float *out, const int five) {
    const int bytes = five ? 176 : 144;
    const __m512i m4 = _mm512_set1_epi8(15), one = _mm512_set1_epi8(1);
    /* chunk c's 64 values: the first 32 take scale 2c and Q5_K's bit 2c of qh, the next 32
     * scale and bit 2c + 1 (one vector serves as vpermw indices and vpsrlvw counts); the mins
     * pair up the sums of 16 */
    __m512i pair[4];
    for (int c = 0; c < 4; c++) pair[c] = words(2 * c, 2 * c + 1, 16);
    const __m256i midx = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14,
                                           15, 15);
    /* acc and macc (quant_simd.h dot_q45k): one row in lanes 0 and 1 of acc, more rows in
     * lane r of acc and macc */
    __m128 acc = _mm_setzero_ps(), macc = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes, *qs = blk + (five ? 48 : 16);
        Q_PREFETCH(blk, bytes);
        __m256i sm = _mm256_cvtepu8_epi16(k4_scale_bytes(blk + 4));
        __m512i sm512 = _mm512_castsi256_si512(sm);
        __m256i mins = _mm256_permutexvar_epi16(midx, sm);
        __m512i hb = five ? _mm512_broadcast_i64x4(
                                _mm256_loadu_si256((const __m256i *)(blk + 16)))
                          : _mm512_setzero_si512();
        __m512i q[4], sc[4];
        for (int c = 0; c < 4; c++) {
            /* 64 values of chunk c: the low nibbles of its 32 bytes, then the high ones */
            __m256i t = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m512i v =
                _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1);
            q[c] = _mm512_and_si512(v, m4);
            if (five)
                q[c] = _mm512_or_si512(q[c], _mm512_slli_epi16(_mm512_and_si512(
                    _mm512_srlv_epi16(hb, pair[c]), one), 4));
            sc[c] = _mm512_permutexvar_epi16(pair[c], sm512);
        }
        uint32_t dd; /* d and dmin, the block's two float16 */
        memcpy(&dd, blk, 4);
        __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dd));
        __m256i t[QMAX_R], m[QMAX_R];
        for (int r = 0; r < QMAX_R; r++) {
            const qa256 *a = ROW(act, astride, r) + b;
            t[r] = m[r] = _mm256_setzero_si256();
            if (r >= R) continue;
            t[r] = fold512(block_sum(q, sc, a->qs));
            m[r] = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), mins);
        }
        if (R == 1) { /* the total and the mins in one add tree, in lanes 0 and 1 */
            __m128i u = hsum4_i32(t[0], m[0], t[0], m[0]);
            acc = _mm_fmadd_ps(_mm_mul_ps(dm, _mm_set1_ps(ROW(act, astride, 0)[b].d)),
                               _mm_cvtepi32_ps(u), acc);
        } else {
            __m128 dx = rows_d(act, astride, R, b);
            acc = _mm_fmadd_ps(_mm_mul_ps(_mm_broadcastss_ps(dm), dx),
                               _mm_cvtepi32_ps(hsum4_i32(t[0], t[1], t[2], t[3])), acc);
            macc = _mm_fmadd_ps(_mm_mul_ps(_mm_permute_ps(dm, 0x55), dx),
                                _mm_cvtepi32_ps(hsum4_i32(m[0], m[1], m[2], m[3])), macc);
        }
    }
    if (R == 1) {
        out[0] = _mm_cvtss_f32(_mm_sub_ss(acc, _mm_movehdup_ps(acc)));
    } else {
        float y[4];
        _mm_storeu_ps(y, _mm_sub_ps(acc, macc));
        for (int r = 0; r < R; r++) out[r] = y[r];
    }
}

INL void dot_q6k(const uint8_t *w, int64_t nb, const void *act, int64_t astride, const int R,
                 float *out) {
    const __m512i m4 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(3);
    /* the high bits of the two halves of each 64 values sit 2 bits apart in qh */
    const __m512i sh_lo = words(0, 2, 16), sh_hi = words(4, 6, 16);
    __m512i sidx[4]; /* values 64k..64k+63 take scales 4k..4k+3, one per 16 (8 words) */
    for (int k = 0; k < 4; k++) sidx[k] = words(4 * k, 4 * k + 2, 8);
    __m128 acc = _mm_setzero_ps(); /* lane r: row r */
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * 210;
        Q_PREFETCH(blk, 210);
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        __m512i sc512 = _mm512_castsi256_si512(sc16);
        __m512i q[4], sc[4];
        for (int n = 0; n < 2; n++) {
            __m512i l = _mm512_loadu_si512(blk + 64 * n);
            __m512i h = _mm512_broadcast_i64x4(
                _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n)));
            q[2 * n] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(
                _mm512_and_si512(_mm512_srlv_epi16(h, sh_lo), m3), 4));
            q[2 * n + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                           _mm512_slli_epi16(_mm512_and_si512(
                                               _mm512_srlv_epi16(h, sh_hi), m3), 4));
        }
        for (int k = 0; k < 4; k++) sc[k] = _mm512_permutexvar_epi16(sidx[k], sc512);
        __m256i t[QMAX_R];
        for (int r = 0; r < QMAX_R; r++) {
            const qa256 *a = ROW(act, astride, r) + b;
            t[r] = _mm256_setzero_si256();
            if (r >= R) continue;
            /* the -32 of every value: 32 * sum(scale * sum of 16), exactly */
            __m256i o = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a->bsums), sc16);
            t[r] = _mm256_sub_epi32(fold512(block_sum(q, sc, a->qs)), _mm256_slli_epi32(o, 5));
        }
        __m128i u = R == 1 ? hsum4_i32(t[0], t[0], t[0], t[0]) : hsum4_i32(t[0], t[1], t[2], t[3]);
        acc = _mm_fmadd_ps(_mm_mul_ps(_mm_set1_ps(f16(blk + 208)), rows_d(act, astride, R, b)),
                           _mm_cvtepi32_ps(u), acc);
    }
    float y[4];
    _mm_storeu_ps(y, acc);
    for (int r = 0; r < R; r++) out[r] = y[r];
}

#define B_Q4_K(R) \
    (R == 1 ? dot_q45k_one(w, nb, act, 0, out) : dot_q45k(w, nb, act, astride, R, out, 0))
#define B_Q5_K(R) \
    (R == 1 ? dot_q45k_one(w, nb, act, 1, out) : dot_q45k(w, nb, act, astride, R, out, 1))
#define B_Q6_K(R) dot_q6k(w, nb, act, astride, R, out)
Q_ENTRY(TGT, q_dot_q4_k_avx512, B_Q4_K)
Q_ENTRY(TGT, q_dot_q5_k_avx512, B_Q5_K)
Q_ENTRY(TGT, q_dot_q6_k_avx512, B_Q6_K)

/* the rows-in-lanes kernels, on 256-bit vectors with AVX512-VNNI */
#define QL_VNNI 2
#define QL_SUFFIX avx512
#include "quant_lanes.h"
#include "quant_lanes_k.h"
#endif /* Q_HAVE_AVX2 */
