/* Rows in lanes: one weight row of 32-value blocks (Q4_0, Q4_1, Q5_0, Q8_0) against up to
 * QL_MAX_G groups of QL_ROWS activation rows (ql32, quant_impl.h). Each block is unpacked to
 * bytes once; each 4-byte group of it is broadcast and multiplied with the 8 rows' matching
 * 4 bytes, so each int32 lane sums one row (no horizontal adds), and the float steps run 8
 * rows per instruction. Weights run unsigned (plus their zero point, taken back exactly as
 * zero * the row's integer sum); without VNNI, Q8_0 keeps its sign on the activations.
 * Included after quant_x86.h's helpers by quant_dot_avx2.c (QL_VNNI 0), quant_dot_vnni.c
 * (1: AVX-VNNI) and quant_dot_avx512.c (2: AVX512-VNNI on 256-bit vectors, 32 registers);
 * the includer defines INL, TGT and QL_SUFFIX. */
/* where four groups in a pass need more than 16 vector registers, the AVX2 and AVX-VNNI paths
 * run them as two passes of two (each row's floats are the same either way): the K-quants
 * (quant_lanes_k.h, two weight rows a pass) and, here, Q5_0; the other 32-value types fit
 * four groups in one pass (Q4_1's offsets in a pass of their own, sums pinned: QL_PIN) */
#ifndef QL_SPLIT4
#define QL_SPLIT4 (QL_VNNI != 2)
#endif
#define QL_SPLIT4_32(qt) (QL_SPLIT4 && (qt) == QT_Q5_0)
/* a sum kept in a register where it is made: else GCC reorders the chains into trees whose
 * products, all live at once, spill out of AVX2's 16 registers (AVX-512's 32 hold them) */
#if QL_VNNI == 2
#define QL_PIN(v) ((void)0)
#else
#define QL_PIN(v) __asm__("" : "+x"(v))
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

/* a block's 4-byte group k of weights broadcast to all 8 lanes. The 4-bit types hold their 16
 * bytes in both 128-bit halves (lo: the low nibbles, values 0..15; hi: the high ones), so an
 * in-half shuffle broadcasts any group (cheaper than a cross-half permute, and no round trip
 * through memory); Q5_0 permutes its unpacked bytes u; Q8_0 loads the 4 bytes */
INL __m256i ql_quad(const uint8_t *blk, const int qt, __m256i lo, __m256i hi, __m256i u,
                    const int k) {
    if (qt == QT_Q8_0) {
        int32_t q;
        memcpy(&q, blk + 2 + 4 * k, 4);
        __m256i b = _mm256_set1_epi32(q);
        return QL_VNNI ? _mm256_xor_si256(b, _mm256_set1_epi8((char)0x80)) : b;
    }
    if (qt == QT_Q5_0) return _mm256_permutevar8x32_epi32(u, _mm256_set1_epi32(k));
    return _mm256_shuffle_epi32(k < 4 ? lo : hi, (k & 3) * 0x55);
}

INL void ql_body(const uint8_t *w, int64_t nb, const ql32 *act, const int G, const int qt,
                 float *out) {
    const int bytes = qt == QT_Q4_0 ? 18 : qt == QT_Q4_1 ? 20 : qt == QT_Q5_0 ? 22 : 34;
    /* log2 of the zero point the unsigned weights carry; -1: none */
    const int zshift = qt == QT_Q4_0 ? 3 : qt == QT_Q5_0 ? 4 : qt == QT_Q8_0 && QL_VNNI ? 7 : -1;
    enum { NC_MAX = 4 };
    const int NC = G <= 2 ? 4 : QL_VNNI == 2 ? 2 : 1;
    __m256 acc[QL_MAX_G], off[QL_MAX_G];
    for (int g = 0; g < G; g++) acc[g] = off[g] = _mm256_setzero_ps();
    /* Q4_1's offsets (its mins times the rows' scaled sums): the same chain per row, in a pass
     * of its own so the main loop holds G fewer registers */
    if (qt == QT_Q4_1)
        for (int64_t b = 0; b < nb; b++) {
            __m256 m = _mm256_set1_ps(f16(w + b * bytes + 2));
            for (int g = 0; g < G; g++)
                off[g] = _mm256_fmadd_ps(m, _mm256_loadu_ps(act[g * nb + b].s), off[g]);
        }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes;
        Q_PREFETCH(blk, bytes);
        __m256i lo = _mm256_setzero_si256(), hi = lo, u = lo;
        if (qt == QT_Q4_0 || qt == QT_Q4_1) {
            __m256i v = _mm256_broadcastsi128_si256(
                _mm_loadu_si128((const __m128i *)(blk + (qt == QT_Q4_0 ? 2 : 4))));
            lo = _mm256_and_si256(v, _mm256_set1_epi8(15));
            hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15));
        } else if (qt == QT_Q5_0) {
            u = ql_unpack(blk, qt);
        }
        /* the integer sums in NC chains per group, so the multiply-adds do not wait on one
         * another; exact, so the split changes nothing */
        __m256i isum[QL_MAX_G][NC_MAX];
        for (int g = 0; g < G; g++) {
            for (int c = 1; c < NC; c++) isum[g][c] = _mm256_setzero_si256();
            isum[g][0] = zshift < 0 ? _mm256_setzero_si256()
                                    : _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(
                                          _mm256_loadu_si256(
                                              (const __m256i *)act[g * nb + b].sum), zshift));
        }
#if !QL_VNNI
        /* 4-bit weights: the 16-bit pair sums of vpmaddubsw (|.| <= 2 * 15 * 127) added in
         * 16 bits over the block's 8 groups (<= 30480, no overflow), widened once: a third of
         * the instructions; exact, so the sums are the same */
        if (qt == QT_Q4_0 || qt == QT_Q4_1) {
            __m256i h[QL_MAX_G];
            for (int g = 0; g < G; g++) h[g] = _mm256_setzero_si256();
            for (int k = 0; k < 8; k++) {
                __m256i wq = ql_quad(blk, qt, lo, hi, u, k);
                for (int g = 0; g < G; g++) {
                    h[g] = _mm256_add_epi16(h[g], _mm256_maddubs_epi16(wq, _mm256_loadu_si256(
                        (const __m256i *)act[g * nb + b].qs[k])));
                    QL_PIN(h[g]);
                }
            }
            for (int g = 0; g < G; g++)
                isum[g][0] = _mm256_add_epi32(isum[g][0],
                                              _mm256_madd_epi16(h[g], _mm256_set1_epi16(1)));
        } else
#endif
        for (int k = 0; k < 8; k++) {
            __m256i wq = ql_quad(blk, qt, lo, hi, u, k);
            const int c = k % NC;
            if (qt == QT_Q8_0 && !QL_VNNI) {
                __m256i wa = _mm256_sign_epi8(wq, wq);
                for (int g = 0; g < G; g++) {
                    isum[g][c] = ql_dot(isum[g][c], wa, _mm256_sign_epi8(_mm256_loadu_si256(
                        (const __m256i *)act[g * nb + b].qs[k]), wq));
                    QL_PIN(isum[g][c]);
                }
            } else {
                for (int g = 0; g < G; g++) {
                    isum[g][c] = ql_dot(isum[g][c], wq, _mm256_loadu_si256(
                        (const __m256i *)act[g * nb + b].qs[k]));
                    QL_PIN(isum[g][c]);
                }
            }
        }
        for (int g = 0; g < G; g++)
            for (int c = 1; c < NC; c++) isum[g][0] = _mm256_add_epi32(isum[g][0], isum[g][c]);
        __m256 d = _mm256_set1_ps(f16(blk));
        for (int g = 0; g < G; g++)
            acc[g] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_loadu_ps(act[g * nb + b].d)),
                                     _mm256_cvtepi32_ps(isum[g][0]), acc[g]);
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
        if (QL_SPLIT4_32(qt)) {                                                              \
            ql_body(w, nb, act, 2, qt, out);                                                 \
            ql_body(w, nb, act + 2 * nb, 2, qt, out + 2 * QL_ROWS);                          \
        } else {                                                                             \
            ql_body(w, nb, act, 4, qt, out);                                                 \
        }                                                                                    \
        break;                                                                               \
    }

INL void ql_row(int qt, const uint8_t *w, int64_t nb, const ql32 *act, int G, float *out) {
    switch (qt) {
    case QT_Q4_0: QL_GROUPS(QT_Q4_0); break;
    case QT_Q4_1: QL_GROUPS(QT_Q4_1); break;
    case QT_Q5_0: QL_GROUPS(QT_Q5_0); break;
    default: QL_GROUPS(QT_Q8_0); break;
    }
}

/* one weight row at a time (the activations of a pass stay in cache between them) */
TGT void QL_CAT2(q_lanes32_, QL_SUFFIX)(int qt, const uint8_t *w, int64_t wstride, int nw,
                                        int64_t nb, const void *pk, int G, float *out) {
    for (int i = 0; i < nw; i++)
        ql_row(qt, w + i * wstride, nb, (const ql32 *)pk, G, out + i * QL_MAX_G * QL_ROWS);
}

/* 2-4 rows (a half group, packed by q_pack_half32): a vector holds 4 rows' values 4k..4k+3 in
 * its low half and 4k+16..4k+19 in its high half, so one in-half broadcast of the unpacked
 * block (vpshufd) serves both; the halves' sums are added at the end. Two rows (pair) hold
 * two 4-byte groups per half instead, and take two multiply-adds a block. Same float steps. */
INL void qh_body(const uint8_t *w, int64_t nb, const ql32 *act, const int qt, const int pair,
                 float *out) {
    const int bytes = qt == QT_Q4_0 ? 18 : qt == QT_Q4_1 ? 20 : qt == QT_Q5_0 ? 22 : 34;
    const int zshift = qt == QT_Q4_0 ? 3 : qt == QT_Q5_0 ? 4 : qt == QT_Q8_0 && QL_VNNI ? 7 : -1;
    __m128 acc = _mm_setzero_ps(), off = _mm_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * bytes;
        Q_PREFETCH(blk, bytes);
        const ql32 *a = act + b;
        __m256i u = ql_unpack(blk, qt);
        __m256i isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int k = 0; k < (pair ? 2 : 4); k++) {
            /* pair: groups 2k, 2k, 2k + 1, 2k + 1 of each half */
            __m256i wq = pair ? _mm256_shuffle_epi32(u, k ? 0xfa : 0x50)
                              : _mm256_shuffle_epi32(u, k * 0x55);
            __m256i y = _mm256_loadu_si256((const __m256i *)a->qs[k]);
            if (qt == QT_Q8_0 && !QL_VNNI)
                isum[k & 1] =
                    ql_dot(isum[k & 1], _mm256_sign_epi8(wq, wq), _mm256_sign_epi8(y, wq));
            else
                isum[k & 1] = ql_dot(isum[k & 1], wq, y);
        }
        __m256i t = _mm256_add_epi32(isum[0], isum[1]);
        __m128i is = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
        if (pair) /* rows 0, 1, 0, 1: the two groups of each row added */
            is = _mm_add_epi32(is, _mm_shuffle_epi32(is, 0x4e));
        if (zshift >= 0)
            is = _mm_sub_epi32(
                is, _mm_slli_epi32(_mm_loadu_si128((const __m128i *)a->sum), zshift));
        acc = _mm_fmadd_ps(_mm_mul_ps(_mm_set1_ps(f16(blk)), _mm_loadu_ps(a->d)),
                           _mm_cvtepi32_ps(is), acc);
        if (qt == QT_Q4_1)
            off = _mm_fmadd_ps(_mm_set1_ps(f16(blk + 2)), _mm_loadu_ps(a->s), off);
    }
    _mm_storeu_ps(out, _mm_add_ps(acc, off));
}

INL void qh_row(int qt, const uint8_t *w, int64_t nb, const ql32 *act, int G, float *out) {
    /* here G is the row count: 2 rows are packed as a pair */
#define QH_PAIR(qt)                                                                          \
    if (G == 2)                                                                              \
        qh_body(w, nb, act, qt, 1, out);                                                     \
    else                                                                                     \
        qh_body(w, nb, act, qt, 0, out)
    switch (qt) {
    case QT_Q4_0: QH_PAIR(QT_Q4_0); break;
    case QT_Q4_1: QH_PAIR(QT_Q4_1); break;
    case QT_Q5_0: QH_PAIR(QT_Q5_0); break;
    default: QH_PAIR(QT_Q8_0); break;
    }
#undef QH_PAIR
}

TGT void QL_CAT2(q_half32_, QL_SUFFIX)(int qt, const uint8_t *w, int64_t wstride, int nw,
                                       int64_t nb, const void *pk, int G, float *out) {
    for (int i = 0; i < nw; i++)
        qh_row(qt, w + i * wstride, nb, (const ql32 *)pk, G, out + i * QL_MAX_G * QL_ROWS);
}
