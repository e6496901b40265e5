/* Dequantization of one row with AVX2, included by quant_dot_avx2.c twice: plain AVX2, and
 * with AVX512-BF16's one-instruction float -> bfloat16 rounding for bf16 tiles. The includer
 * defines QD_TARGET, QD_SUFFIX and QD_CVT512 (0/1) after including quant_simd.h. */
#undef QD_TGT
#undef QD_INL
#define QD_TGT __attribute__((target(QD_TARGET)))
#define QD_INL static inline __attribute__((always_inline)) QD_TGT

/* 8 floats -> 8 bfloat16, rounded to nearest even (NaNs from arithmetic are quiet already) */
QD_INL __m128i QS_CAT2(bf16x8_, QD_SUFFIX)(__m256 v) {
#if QD_CVT512
    return (__m128i)_mm256_cvtneps_pbh(v);
#else
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i bias = _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff));
    u = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
#endif
}

/* 32 bytes q -> 32 values d * q + m (sub: d * q - m; neither: d * q), the same float32
 * operations as gguf-py, stored as float32 or (bf) rounded to bfloat16; d01 scales the first
 * 16 values, d23 the last 16 (Q6_K's groups of 16) */
QD_INL void QS_CAT2(store16x2_, QD_SUFFIX)(void *dst, int64_t at, int bf, __m256i q, __m256 d01,
                                             __m256 d23, __m256 m, int op) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
#if QD_CVT512
    if (bf) { /* the same float32 operations 16 at a time, and one rounding for all 32 */
        __m512 v[2] = {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)),
                       _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi))};
        __m512 d[2] = {_mm512_broadcastss_ps(_mm256_castps256_ps128(d01)),
                       _mm512_broadcastss_ps(_mm256_castps256_ps128(d23))};
        __m512 m16 = _mm512_broadcastss_ps(_mm256_castps256_ps128(m));
        for (int k = 0; k < 2; k++) {
            v[k] = _mm512_mul_ps(d[k], v[k]);
            if (op > 0) v[k] = _mm512_add_ps(v[k], m16);
            if (op < 0) v[k] = _mm512_sub_ps(v[k], m16);
        }
        _mm512_storeu_si512((uint16_t *)dst + at, (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]));
        return;
    }
#endif
    __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; k++) {
        __m256 v = _mm256_mul_ps(k < 2 ? d01 : d23,
                                 _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[k])));
        if (op > 0) v = _mm256_add_ps(v, m);
        if (op < 0) v = _mm256_sub_ps(v, m);
        if (bf)
            _mm_storeu_si128((__m128i *)((uint16_t *)dst + at + 8 * k),
                             QS_CAT2(bf16x8_, QD_SUFFIX)(v));
        else
            _mm256_storeu_ps((float *)dst + at + 8 * k, v);
    }
}

#if QD_CVT512
/* Q4_K / Q5_K, 64 values as bf16: the first 32 (bytes lo, 0..15 or 0..31) d1 * q - m1, the
 * next 32 (hi) d2 * q - m2. Each half takes one of 16 (Q5_K: 32) values, so they are computed
 * once, with store16x2's float32 operations and rounding, into a table of bf16 words, and
 * looked up 32 at a time (vpermw): the same bits in fewer instructions. */
QD_INL void QS_CAT2(lut64_, QD_SUFFIX)(void *dst, int64_t at, __m256i lo, __m256i hi, float d1,
                                         float m1, float d2, float m2, int five) {
    const __m512 k0 = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    uint16_t *out = (uint16_t *)dst + at;
    if (!five) { /* words 0..15: the first half's table, 16..31 the second's */
        __m512 a = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d1), k0), _mm512_set1_ps(m1));
        __m512 b = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d2), k0), _mm512_set1_ps(m2));
        __m512i lut = (__m512i)_mm512_cvtne2ps_pbh(b, a);
        __m512i il = _mm512_cvtepu8_epi16(lo);
        __m512i ih = _mm512_or_si512(_mm512_cvtepu8_epi16(hi), _mm512_set1_epi16(16));
        _mm512_storeu_si512(out, _mm512_permutexvar_epi16(il, lut));
        _mm512_storeu_si512(out + 32, _mm512_permutexvar_epi16(ih, lut));
        return;
    }
    const __m512 k1 = _mm512_add_ps(k0, _mm512_set1_ps(16.f));
    float dd[2] = {d1, d2}, mm[2] = {m1, m2};
    __m256i q[2] = {lo, hi};
    for (int h = 0; h < 2; h++) {
        __m512 d = _mm512_set1_ps(dd[h]), m = _mm512_set1_ps(mm[h]);
        __m512i lut = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(_mm512_mul_ps(d, k1), m),
                                                   _mm512_sub_ps(_mm512_mul_ps(d, k0), m));
        _mm512_storeu_si512(out + 32 * h,
                            _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(q[h]), lut));
    }
}
#endif

QD_INL void QS_CAT2(store32_, QD_SUFFIX)(void *dst, int64_t at, int bf, __m256i q, __m256 d,
                                           __m256 m, int op) {
    QS_CAT2(store16x2_, QD_SUFFIX)(dst, at, bf, q, d, d, m, op);
}

/* returns 0 where the type has no AVX2 decoder here (the caller's plain loop runs) */
QD_TGT int QS_CAT2(q_deq_row_, QD_SUFFIX)(int qt, const uint8_t *src, int64_t in, void *dst,
                                          int bf) {
    const __m256 zero = _mm256_setzero_ps();
    switch (qt) {
    case QT_Q4_0: case QT_Q5_0: case QT_Q8_0: case QT_Q4_1: {
        int bytes = qt == QT_Q4_0 ? 18 : qt == QT_Q5_0 ? 22 : qt == QT_Q8_0 ? 34 : 20;
        for (int64_t b = 0; b < in / 32; b++) {
            const uint8_t *k = src + b * bytes;
            Q_PREFETCH(k, bytes);
            __m256 m = qt == QT_Q4_1 ? _mm256_set1_ps(f16(k + 2)) : zero;
            QS_CAT2(store32_, QD_SUFFIX)(dst, 32 * b, bf, decode32(k, qt), _mm256_set1_ps(f16(k)),
                                         m, qt == QT_Q4_1);
        }
        return 1;
    }
    case QT_Q4_K: case QT_Q5_K: {
        const int five = qt == QT_Q5_K, bytes = five ? 176 : 144;
        const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
        for (int64_t b = 0; b < in / 256; b++) {
            const uint8_t *k = src + b * bytes, *qs = k + (five ? 48 : 16);
            Q_PREFETCH(k, bytes);
            float d = f16(k), dmin = f16(k + 2);
            uint8_t sc[8], mn[8];
            q_scale_min_k4(k + 4, sc, mn);
            __m256i hb = five ? _mm256_loadu_si256((const __m256i *)(k + 16))
                              : _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                Q45K_CHUNK(lo, hi, qs, hb, c, five);
                int64_t at = 256 * b + 64 * c;
                const float d1 = d * (float)sc[2 * c], m1 = dmin * (float)mn[2 * c];
                const float d2 = d * (float)sc[2 * c + 1], m2 = dmin * (float)mn[2 * c + 1];
#if QD_CVT512
                if (bf) { /* a sub-block's values are one of 16 (32): look them up */
                    QS_CAT2(lut64_, QD_SUFFIX)(dst, at, lo, hi, d1, m1, d2, m2, five);
                    continue;
                }
#endif
                QS_CAT2(store32_, QD_SUFFIX)(dst, at, bf, lo, _mm256_set1_ps(d1),
                                             _mm256_set1_ps(m1), -1);
                QS_CAT2(store32_, QD_SUFFIX)(dst, at + 32, bf, hi, _mm256_set1_ps(d2),
                                             _mm256_set1_ps(m2), -1);
            }
        }
        return 1;
    }
    case QT_Q6_K: {
        const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
        const __m256i k32 = _mm256_set1_epi8(32);
        for (int64_t b = 0; b < in / 256; b++) {
            const uint8_t *k = src + b * 210;
            Q_PREFETCH(k, 210);
            const int8_t *sc = (const int8_t *)k + 192;
            float d = f16(k + 208);
            for (int n = 0; n < 2; n++) {
                __m256i b1 = _mm256_loadu_si256((const __m256i *)(k + 64 * n));
                __m256i b2 = _mm256_loadu_si256((const __m256i *)(k + 64 * n + 32));
                __m256i h = _mm256_loadu_si256((const __m256i *)(k + 128 + 32 * n));
                __m256i lows[4] = {_mm256_and_si256(b1, m4), _mm256_and_si256(b2, m4),
                                   _mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(b2, 4), m4)};
                for (int kk = 0; kk < 4; kk++) {
                    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(h, 2 * kk), m3);
                    __m256i q = _mm256_sub_epi8(_mm256_or_si256(lows[kk], _mm256_slli_epi16(hi, 4)),
                                                k32);
                    QS_CAT2(store16x2_, QD_SUFFIX)(
                        dst, 256 * b + 128 * n + 32 * kk, bf, q,
                        _mm256_set1_ps(d * (float)sc[8 * n + 2 * kk]),
                        _mm256_set1_ps(d * (float)sc[8 * n + 2 * kk + 1]), zero, 0);
                }
            }
        }
        return 1;
    }
    default: return 0;
    }
}


#if !QD_CVT512
QD_TGT void QS_CAT2(q_to_bf16_, QD_SUFFIX)(const float *src, int64_t n, uint16_t *dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        if (!_mm256_testz_ps(nan, nan)) break; /* the scalar loop quiets NaNs */
        _mm_storeu_si128((__m128i *)(dst + i), QS_CAT2(bf16x8_, QD_SUFFIX)(v));
    }
    for (; i < n; i++) dst[i] = ferry_f32_to_bf16(src[i]);
}
#endif
