/* Rows in lanes: one weight row of 32-value blocks (Q4_0, Q4_1, Q5_0, Q8_0) against up to
 * QL_MAX_G groups of QL_ROWS activation rows (ql32, quant_impl.h). Each block is unpacked to
 * bytes once; each 4-byte group of it is broadcast and multiplied with the 8 rows' matching
 * 4 bytes, so each int32 lane sums one row (no horizontal adds), and the float steps run 8
 * rows per instruction. Weights run unsigned (plus their zero point, taken back exactly as
 * zero * the row's integer sum); without VNNI, Q8_0 keeps its sign on the activations.
 * Included after quant_x86.h's helpers by quant_dot_avx2.c (QL_VNNI 0), quant_dot_vnni.c
 * (1: AVX-VNNI) and quant_dot_avx512.c (2: AVX512-VNNI on 256-bit vectors, 32 registers);
 * the includer defines INL, TGT and QL_SUFFIX. */
/* four groups in a pass need more than 16 vector registers: the AVX2 and AVX-VNNI paths
 * run them as two passes of two (each row's floats are the same either way) */
#ifndef QL_SPLIT4
#define QL_SPLIT4 (QL_VNNI != 2)
#endif
#define QL_CAT(a, b) a##b
#define QL_CAT2(a, b) QL_CAT(a, b)

/* acc + the 8 lanes' sums of 4 products u * a (u unsigned bytes, a signed) */
INL __m256i ql_dot(__m256i acc, __m256i u, __m256i a) {
#if QL_VNNI == 1
    return _mm256_dpbusd_avx_epi32(acc, u, a);
#elif QL_VNNI == 2
    return _mm256_dpbusd_epi32(acc, u, a);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, a),
                                                   _mm256_set1_epi16(1)));
#endif
}

/* a block's 32 weights as bytes: unsigned with a zero point for the 4- and 5-bit types (and
 * Q8_0 with VNNI: +128), Q8_0's signed bytes without */
INL __m256i ql_unpack(const uint8_t *blk, const int qt) {
    switch (qt) {
    case QT_Q4_0: return nibbles(blk + 2);
    case QT_Q4_1: return nibbles(blk + 4);
    case QT_Q5_0: return _mm256_or_si256(nibbles(blk + 6), bits16(blk + 2));
    default:
        return QL_VNNI ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)),
                                          _mm256_set1_epi8((char)0x80))
                       : _mm256_loadu_si256((const __m256i *)(blk + 2));
    }
}

INL void ql_body(const uint8_t *w, int64_t nb, const ql32 *act, const int G, const int qt,
                 float *out) {
    const int bytes = qt == QT_Q4_0 ? 18 : qt == QT_Q4_1 ? 20 : qt == QT_Q5_0 ? 22 : 34;
    /* log2 of the zero point the unsigned weights carry; -1: none */
    const int zshift = qt == QT_Q4_0 ? 3 : qt == QT_Q5_0 ? 4 : qt == QT_Q8_0 && QL_VNNI ? 7 : -1;
    enum { NC_MAX = 4 };
    const int NC = G <= 2 ? 4 : 2;
    __m256 acc[QL_MAX_G], off[QL_MAX_G];
    for (int g = 0; g < G; g++) acc[g] = off[g] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes;
        Q_PREFETCH(blk, bytes);
        uint32_t quad[8];
        _mm256_storeu_si256((__m256i *)quad, ql_unpack(blk, qt));
        /* the integer sums in NC chains per group (about 8 in all), so the multiply-adds
         * do not wait on one another; exact, so the split changes nothing */
        __m256i isum[QL_MAX_G][NC_MAX];
        for (int g = 0; g < G; g++) {
            for (int c = 1; c < NC; c++) isum[g][c] = _mm256_setzero_si256();
            isum[g][0] = zshift < 0 ? _mm256_setzero_si256()
                                    : _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(
                                          _mm256_loadu_si256(
                                              (const __m256i *)act[g * nb + b].sum), zshift));
        }
        for (int k = 0; k < 8; k++) {
            __m256i wq = _mm256_set1_epi32((int)quad[k]);
            const int c = k % NC;
            if (qt == QT_Q8_0 && !QL_VNNI) {
                __m256i wa = _mm256_sign_epi8(wq, wq);
                for (int g = 0; g < G; g++)
                    isum[g][c] = ql_dot(isum[g][c], wa, _mm256_sign_epi8(_mm256_loadu_si256(
                        (const __m256i *)act[g * nb + b].qs[k]), wq));
            } else {
                for (int g = 0; g < G; g++)
                    isum[g][c] = ql_dot(isum[g][c], wq, _mm256_loadu_si256(
                        (const __m256i *)act[g * nb + b].qs[k]));
            }
        }
        for (int g = 0; g < G; g++)
            for (int c = 1; c < NC; c++) isum[g][0] = _mm256_add_epi32(isum[g][0], isum[g][c]);
        __m256 d = _mm256_set1_ps(f16(blk));
        for (int g = 0; g < G; g++)
            acc[g] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(act[g * nb + b].d)),
                                     _mm256_cvtepi32_ps(isum[g][0]), acc[g]);
        if (qt == QT_Q4_1) {
            __m256 m = _mm256_set1_ps(f16(blk + 2));
            for (int g = 0; g < G; g++)
                off[g] = _mm256_fmadd_ps(m, _mm256_loadu_ps(act[g * nb + b].s), off[g]);
        }
    }
    for (int g = 0; g < G; g++) _mm256_storeu_ps(out + QL_ROWS * g, _mm256_add_ps(acc[g], off[g]));
}

/* G and the type as compile-time constants, so the group loops unroll */
#define QL_GROUPS(qt)                                                                        \
    switch (G) {                                                                             \
    case 1: ql_body(w, nb, act, 1, qt, out); break;                                          \
    case 2: ql_body(w, nb, act, 2, qt, out); break;                                          \
    case 3: ql_body(w, nb, act, 3, qt, out); break;                                          \
    default:                                                                                 \
        if (QL_SPLIT4) {                                                                     \
            ql_body(w, nb, act, 2, qt, out);                                                 \
            ql_body(w, nb, act + 2 * nb, 2, qt, out + 2 * QL_ROWS);                          \
        } else {                                                                             \
            ql_body(w, nb, act, 4, qt, out);                                                 \
        }                                                                                    \
        break;                                                                               \
    }

TGT void QL_CAT2(q_lanes32_, QL_SUFFIX)(int qt, const uint8_t *w, int64_t nb, const ql32 *act,
                                        int G, float *out) {
    switch (qt) {
    case QT_Q4_0: QL_GROUPS(QT_Q4_0); break;
    case QT_Q4_1: QL_GROUPS(QT_Q4_1); break;
    case QT_Q5_0: QL_GROUPS(QT_Q5_0); break;
    default: QL_GROUPS(QT_Q8_0); break;
    }
}
