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

/* the float16 at p (a block's scale), in one F16C instruction */
INL float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

#endif /* FERRY_QUANT_X86_H */
