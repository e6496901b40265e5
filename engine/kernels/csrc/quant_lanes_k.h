/* Rows in lanes for the K-quants (Q4_K, Q5_K, Q6_K): quant_lanes.h's scheme on 256-value
 * blocks of QL_ROWS rows (qlk, quant_impl.h). A weight block is unpacked to 256 unsigned
 * bytes once (Q6_K without its -32); for each scale group (32 values of Q4_K / Q5_K, 16 of
 * Q6_K) its 4-byte groups are broadcast against the rows' matching 4 bytes, and the group's
 * row sums times its scale make up each row's exact integer total of the block. The mins of
 * Q4_K / Q5_K and Q6_K's -32 are integers too: the rows' sums (qlk.sums) times the block's
 * mins or scales, in one vpmaddwd per pair. Then per row and block, as the one-row dot
 * products do (quant_simd.h dot_q45k, dot_q6k; quant_dot_avx512.c):
 *     acc = fma(d * d_x, total, acc), Q4_K / Q5_K also macc = fma(dmin * d_x, mins, macc);
 *     y = acc - macc (Q6_K: y = acc).
 * Included after quant_lanes.h (its ql_dot, QL_SPLIT4, QL_PIN, QL_CAT2) by the same three
 * files. */

/* the 256 weights of a block in order, one byte each */
INL void qk_unpack(const uint8_t *blk, const int qt, uint32_t quad[64]) {
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i v[8];
    if (qt == QT_Q6_K) {
        const __m256i m3 = _mm256_set1_epi8(3);
        for (int n = 0; n < 2; n++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
            for (int k = 0; k < 4; k++) v[4 * n + k] = q6k_quarter(l0, l1, h, k, m4, m3);
        }
    } else {
        const int five = qt == QT_Q5_K;
        const __m256i one = _mm256_set1_epi8(1);
        const uint8_t *qs = blk + (five ? 48 : 16);
        __m256i hb = five ? _mm256_loadu_si256((const __m256i *)(blk + 16))
                          : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            Q45K_CHUNK(lo, hi, qs, hb, c, five);
            v[2 * c] = lo;
            v[2 * c + 1] = hi;
        }
    }
    for (int i = 0; i < 8; i++) _mm256_storeu_si256((__m256i *)quad + i, v[i]);
}

/* W weight rows (wstride bytes apart) against G lane groups: each activation vector loaded
 * serves the W rows; out + i * QK_OUT: weight row i's QL_MAX_G * QL_ROWS results */
enum { QK_OUT = QL_MAX_G * QL_ROWS };
INL void qk_body(const uint8_t *w, int64_t wstride, const int W, int64_t nb, const qlk *act,
                 const int G, const int qt, float *out) {
    const int six = qt == QT_Q6_K, bytes = qt == QT_Q4_K ? 144 : qt == QT_Q5_K ? 176 : 210;
    const int NS = six ? 16 : 8, QS = 64 / NS; /* scale groups a block, 4-byte groups in one */
    __m256 acc[QL_MAX_W][QL_MAX_G], macc[QL_MAX_W][QL_MAX_G];
    for (int i = 0; i < W; i++)
        for (int g = 0; g < G; g++) acc[i][g] = macc[i][g] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        uint32_t quad[QL_MAX_W][64];
        /* the scales, and the multipliers of qlk.sums as int16 pairs */
        int32_t sc[QL_MAX_W][16], mul[QL_MAX_W][8];
        float d[QL_MAX_W], dmin[QL_MAX_W];
        for (int i = 0; i < W; i++) {
            const uint8_t *blk = w + i * wstride + b * bytes;
            Q_PREFETCH(blk, bytes);
            qk_unpack(blk, qt, quad[i]);
            /* widened in vectors: the scalar unpacking cost a fifth of the kernel's time */
            if (six) {
                __m128i s = _mm_loadu_si128((const __m128i *)(blk + 192));
                _mm256_storeu_si256((__m256i *)sc[i], _mm256_cvtepi8_epi32(s));
                _mm256_storeu_si256((__m256i *)sc[i] + 1,
                                    _mm256_cvtepi8_epi32(_mm_srli_si128(s, 8)));
                /* int16 pairs, little end first: (s[2p], s[2p + 1]) */
                _mm256_storeu_si256((__m256i *)mul[i], _mm256_cvtepi8_epi16(s));
            } else {
                __m128i sm = k4_scale_bytes(blk + 4); /* the 8 scales, then the 8 mins */
                _mm256_storeu_si256((__m256i *)sc[i], _mm256_cvtepu8_epi32(sm));
                _mm_storeu_si128((__m128i *)mul[i], _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8)));
            }
            d[i] = f16(blk + (six ? 208 : 0));
            dmin[i] = six ? 0.f : f16(blk + 2);
        }
        __m256i tot[QL_MAX_W][QL_MAX_G];
        for (int i = 0; i < W; i++)
            for (int g = 0; g < G; g++) tot[i][g] = _mm256_setzero_si256();
        for (int j = 0; j < NS; j++) {
#if QL_VNNI
            /* vpdpbusd sums the group, one 32-bit multiply applies the scale */
            __m256i s[QL_MAX_W][QL_MAX_G];
            for (int i = 0; i < W; i++)
                for (int g = 0; g < G; g++) s[i][g] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int kk = 0; kk < QS; kk++) {
                const int k = QS * j + kk;
                __m256i wq[QL_MAX_W];
                for (int i = 0; i < W; i++) wq[i] = _mm256_set1_epi32((int)quad[i][k]);
                for (int g = 0; g < G; g++) {
                    __m256i y = _mm256_loadu_si256((const __m256i *)act[g * nb + b].qs[k]);
                    for (int i = 0; i < W; i++) s[i][g] = ql_dot(s[i][g], wq[i], y);
                }
            }
            for (int i = 0; i < W; i++) {
                __m256i scale = _mm256_set1_epi32(sc[i][j]);
                for (int g = 0; g < G; g++)
                    tot[i][g] = _mm256_add_epi32(tot[i][g], _mm256_mullo_epi32(s[i][g], scale));
            }
#else
            /* the scale in vpmaddwd's multiplier, where ql_dot has ones; before it, NH of
             * vpmaddubsw's 16-bit pair sums added in 16 bits (|.| <= 2 * 15 * 127 each for
             * Q4_K, 2 * 31 * 127 for Q5_K, 2 * 63 * 127 for Q6_K: no overflow), one widening
             * for NH of them; exact, so the sums are the same */
            const int NH = qt == QT_Q4_K ? 8 : qt == QT_Q5_K ? 4 : 2;
            __m256i scale[QL_MAX_W];
            for (int i = 0; i < W; i++) scale[i] = _mm256_set1_epi16((int16_t)sc[i][j]);
            for (int k0 = 0; k0 < QS; k0 += NH) {
                __m256i h[QL_MAX_W][QL_MAX_G];
                for (int i = 0; i < W; i++)
                    for (int g = 0; g < G; g++) h[i][g] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int kk = 0; kk < NH; kk++) {
                    const int k = QS * j + k0 + kk;
                    __m256i wq[QL_MAX_W];
                    for (int i = 0; i < W; i++) wq[i] = _mm256_set1_epi32((int)quad[i][k]);
                    for (int g = 0; g < G; g++) {
                        __m256i y = _mm256_loadu_si256((const __m256i *)act[g * nb + b].qs[k]);
                        for (int i = 0; i < W; i++) {
                            h[i][g] = _mm256_add_epi16(h[i][g], _mm256_maddubs_epi16(wq[i], y));
                            QL_PIN(h[i][g]);
                        }
                    }
                }
                for (int i = 0; i < W; i++)
                    for (int g = 0; g < G; g++)
                        tot[i][g] = _mm256_add_epi32(tot[i][g],
                                                     _mm256_madd_epi16(h[i][g], scale[i]));
            }
#endif
        }
        for (int g = 0; g < G; g++) {
            const qlk *a = act + g * nb + b;
            __m256 dx = _mm256_loadu_ps(a->d);
            for (int i = 0; i < W; i++) {
                __m256i o = _mm256_setzero_si256();
                for (int p = 0; p < (six ? 8 : 4); p++)
                    o = _mm256_add_epi32(o, _mm256_madd_epi16(
                        _mm256_loadu_si256((const __m256i *)a->sums[p]),
                        _mm256_set1_epi32(mul[i][p])));
                if (six) /* the -32 of every value */
                    tot[i][g] = _mm256_sub_epi32(tot[i][g], _mm256_slli_epi32(o, 5));
                else
                    macc[i][g] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin[i]), dx),
                                                 _mm256_cvtepi32_ps(o), macc[i][g]);
                acc[i][g] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(d[i]), dx),
                                            _mm256_cvtepi32_ps(tot[i][g]), acc[i][g]);
            }
        }
    }
    for (int i = 0; i < W; i++)
        for (int g = 0; g < G; g++)
            _mm256_storeu_ps(out + i * QK_OUT + QL_ROWS * g,
                             six ? acc[i][g] : _mm256_sub_ps(acc[i][g], macc[i][g]));
}

#define QK_GROUPS(qt)                                                                        \
    switch (G) {                                                                             \
    case 1: qk_body(w, wstride, W, nb, act, 1, qt, out); break;                              \
    case 2: qk_body(w, wstride, W, nb, act, 2, qt, out); break;                              \
    case 3: qk_body(w, wstride, W, nb, act, 3, qt, out); break;                              \
    default:                                                                                 \
        if (QL_SPLIT4) {                                                                     \
            qk_body(w, wstride, W, nb, act, 2, qt, out);                                     \
            qk_body(w, wstride, W, nb, act + 2 * nb, 2, qt, out + 2 * QL_ROWS);              \
        } else {                                                                             \
            qk_body(w, wstride, W, nb, act, 4, qt, out);                                     \
        }                                                                                    \
        break;                                                                               \
    }
#define QK_ROWS(qt)                                                                          \
    if (nw == 2) {                                                                           \
        const int W = 2;                                                                     \
        QK_GROUPS(qt);                                                                       \
    } else {                                                                                 \
        const int W = 1;                                                                     \
        QK_GROUPS(qt);                                                                       \
    }

TGT void QL_CAT2(q_lanes_k_, QL_SUFFIX)(int qt, const uint8_t *w, int64_t wstride, int nw,
                                        int64_t nb, const void *pk, int G, float *out) {
    const qlk *act = (const qlk *)pk;
    switch (qt) {
    case QT_Q4_K: QK_ROWS(QT_Q4_K); break;
    case QT_Q5_K: QK_ROWS(QT_Q5_K); break;
    default: QK_ROWS(QT_Q6_K); break;
    }
}
#undef QK_ROWS
#undef QK_GROUPS
