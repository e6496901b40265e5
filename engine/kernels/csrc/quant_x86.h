/* Small helpers of the x86 dot-product files (quant_simd.h's includers, quant_dot_avx512.c),
 * compiled into each with that file's target: the includer defines INL (static inline, with
 * its target attribute) first. */
#ifndef FERRY_QUANT_X86_H
#define FERRY_QUANT_X86_H

/* the sum of 8 float lanes */
INL float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* the sum of 8 int32 lanes (exact) */
INL int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* the sums of the 8 int32 lanes of a, b, c and d, in lanes 0..3 (exact) */
INL __m128i hsum4_i32(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* the sums of the 8 int32 lanes of each of p[0..7], in lanes 0..7 (exact). Blends and one
 * in-lane shuffle a step rather than vphaddd, whose two shuffles a step all queue on the one
 * shuffle port the block decoding needs too */
INL __m256i pair_sums(__m256i a, __m256i b) { /* [a01 b01 a23 b23 | a45 b45 a67 b67] */
    __m256i x = _mm256_blend_epi32(a, b, 0xaa), y = _mm256_blend_epi32(b, a, 0xaa);
    return _mm256_add_epi32(x, _mm256_shuffle_epi32(y, 0xb1));
}

INL __m256i quad_sums(__m256i ab, __m256i cd) { /* [a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 ...] */
    __m256i x = _mm256_blend_epi32(ab, cd, 0xcc), y = _mm256_blend_epi32(cd, ab, 0xcc);
    return _mm256_add_epi32(x, _mm256_shuffle_epi32(y, 0x4e));
}

INL __m256i hsum8_i32(const __m256i *p) {
    __m256i u = quad_sums(pair_sums(p[0], p[1]), pair_sums(p[2], p[3]));
    __m256i v = quad_sums(pair_sums(p[4], p[5]), pair_sums(p[6], p[7]));
    return _mm256_add_epi32(_mm256_blend_epi32(u, v, 0xf0), _mm256_permute2x128_si256(u, v, 0x21));
}

/* the float16 at p (a block's scale), in one F16C instruction */
INL float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of nibbles -> 32 bytes: the low nibbles (values 0..15), then the high ones */
INL __m256i nibbles(const uint8_t *qs) {
    /* a broadcast load and a blend: no cross-half insert on the shuffle port */
    __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    t = _mm256_blend_epi32(t, _mm256_srli_epi16(t, 4), 0xf0);
    return _mm256_and_si256(t, _mm256_set1_epi8(15));
}

/* bit j of 32 -> byte j = 0x10 or 0 */
INL __m256i bits16(const uint8_t *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(16));
}

/* Q4_K / Q5_K: declares lo and hi, chunk c (64 weights) of a block as bytes: lo the first 32
 * (low nibbles), hi the next 32 (high nibbles), each with Q5_K's fifth bit from hb; m4 and one
 * are the caller's 15s and 1s. A macro, not an inline function: that one changes the register
 * allocation of q_deq_row_avx2, this one is the same code as written out. */
#define Q45K_CHUNK(lo, hi, qs, hb, c, five)                                                   \
    __m256i bits_ = _mm256_loadu_si256((const __m256i *)((qs) + 32 * (c)));                  \
    __m256i lo = _mm256_and_si256(bits_, m4);                                                 \
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits_, 4), m4);                           \
    if (five) {                                                                               \
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(                                           \
            _mm256_and_si256(_mm256_srli_epi16(hb, 2 * (c)), one), 4));                       \
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(                                           \
            _mm256_and_si256(_mm256_srli_epi16(hb, 2 * (c) + 1), one), 4));                   \
    }

/* Q6_K: values 128n + 32k.. (k < 4) of a block as bytes 0..63, from its ql bytes 64n.. (l0)
 * and 64n + 32.. (l1) and its qh bytes 32n.. (h); m4 and m3 are 15s and 3s */
INL __m256i q6k_quarter(__m256i l0, __m256i l1, __m256i h, const int k, __m256i m4,
                        __m256i m3) {
    __m256i l = k & 1 ? l1 : l0;
    if (k >= 2) l = _mm256_srli_epi16(l, 4);
    return _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_slli_epi16(
        _mm256_and_si256(_mm256_srli_epi16(h, 2 * k), m3), 4));
}

/* Q4_K / Q5_K scales and mins of one block as 16 bytes: the 8 scales, then the 8 mins, in
 * vector registers only (a scalar unpacking and its move into a vector register cost a
 * third of the block's time). `s`: the block's 12 scale bytes and 4 more (its first
 * quants, unused). Scale and min j < 4: s[j] & 63 and s[j + 4] & 63; scale and min
 * j + 4: the low and the high nibble of s[j + 8], with the top two bits of s[j] and
 * s[j + 4] as bits 4 and 5. */
INL __m128i k4_scale_bytes(const uint8_t *s) {
    const __m128i x = _mm_loadu_si128((const __m128i *)s);
    const __m128i a = _mm_shuffle_epi8(x, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7,
                                                        8, 9, 10, 11));
    const __m128i top = _mm_shuffle_epi8(x, _mm_setr_epi8(-128, -128, -128, -128, 0, 1, 2, 3,
                                                          -128, -128, -128, -128, 4, 5, 6, 7));
    const __m128i low = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63,
                                                       63, 63, 0, 0, 0, 0));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(a, 4), _mm_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
    /* bits 6 and 7 of each byte to bits 4 and 5 (a 16-bit shift: the mask drops what the
     * next byte shifts in) */
    const __m128i two = _mm_and_si128(_mm_srli_epi16(top, 2), _mm_set1_epi8(0x30));
    return _mm_or_si128(_mm_or_si128(low, high), two);
}

#endif /* FERRY_QUANT_X86_H */
