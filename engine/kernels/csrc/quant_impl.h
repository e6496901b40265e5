/* Internal to the quant*.c files: block layouts, quantized activations, the dot-product
 * table. Nothing here is called from Python (no ferry_ names). */
#ifndef FERRY_QUANT_IMPL_H
#define FERRY_QUANT_IMPL_H

#include "quant.h"

/* FERRY_CPU's cap (engine/kernels/cpu_level.py defines these only when it takes something
 * away): the dot-product paths allowed (bit p for path p) and whether bf16/AMX may run */
#ifndef FERRY_PATH_MASK
#define FERRY_PATH_MASK 15
#endif
#ifndef FERRY_CPU_BF16
#define FERRY_CPU_BF16 1
#endif

enum {
    QT_F32 = 0, QT_F16 = 1, QT_Q4_0 = 2, QT_Q4_1 = 3, QT_Q5_0 = 6, QT_Q8_0 = 8,
    QT_Q4_K = 12, QT_Q5_K = 13, QT_Q6_K = 14, QT_BF16 = 30
};

/* activations of 32-block weights: x ~= d * qs, s = d * sum(qs) (llama.cpp's Q8_1) */
typedef struct {
    float d;
    float s;
    int8_t qs[32];
} qa32;

/* activations of K-quant weights: one scale per 256, sums per 16 (llama.cpp's Q8_K) */
typedef struct {
    float d;
    int16_t bsums[16];
    int8_t qs[256];
} qa256;

enum { ACT_F32 = 0, ACT_32 = 1, ACT_256 = 2 };

/* out[r] = dot(weight row `w` of nb blocks, activation row r), r < R <= QMAX_R; activation
 * row r starts at act + r * astride bytes (float32 rows for ACT_F32, nb = in there) */
enum { QMAX_R = 4 };
typedef void (*qdot_fn)(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,
                        float *out);

/* "Rows in lanes" (quant_lanes.h): the activations of QL_ROWS rows, one 32-value block,
 * interleaved so one 32-byte vector holds values 4k..4k+3 of each row: a 4-byte group of
 * weights broadcast against it gives every row's partial sum in its own int32 lane, and no
 * row's sum needs a horizontal add. d, s: each row's qa32 scale and scaled sum; sum: its
 * integer sum (subtracted times the weight's zero point where weights run unsigned). */
enum { QL_ROWS = 8, QL_MAX_G = 4 }; /* rows per lane group; groups per pass over a weight row */
typedef struct {
    int8_t qs[8][32]; /* [quad k][row r * 4 + j] = row r's value 4k + j */
    float d[QL_ROWS];
    float s[QL_ROWS];
    int32_t sum[QL_ROWS];
} ql32;

/* The same for the K-quants (quant_lanes_k.h), one 256-value block of QL_ROWS rows: qs as
 * ql32's; d each row's qa256 scale; sums the rows' integer sums that the weights' mins
 * (Q4_K, Q5_K: pair p < 4, lane 2r + t = row r's sum of values 32(2p + t).. + 31) or Q6_K's
 * -32 (pair p < 8, lane 2r + t = row r's sum of values 16(2p + t).. + 15) multiply, in pairs
 * of int16 for one vpmaddwd. */
typedef struct {
    int8_t qs[64][32]; /* [quad k][row r * 4 + j] = row r's value 4k + j */
    int16_t sums[8][16];
    float d[QL_ROWS];
} qlk;

/* out[(i * QL_MAX_G + g) * QL_ROWS + r] = dot(weight row i < nw <= QL_MAX_W of nb blocks of
 * type qt at w + i * wstride, row r of lane group g), g < G <= QL_MAX_G; group g's blocks
 * (ql32, or qlk for the K-quants) at act + g * nb. Each row's floats are the same operations,
 * in the same order, as the one-row SIMD dot products (quant_simd.h dot32, dot_q45k, dot_q6k) */
enum { QL_MAX_W = 2 };
typedef void (*qlanes_fn)(int qt, const uint8_t *w, int64_t wstride, int nw, int64_t nb,
                          const void *act, int G, float *out);
/* out[i] = dot(weight row i < n <= Q_CHUNK of nb blocks of the 32-value type qt at
 * w + i * wstride, the one qa32 activation row at act): quant_simd.h's rows32, the same bits
 * as the rows-in-lanes kernels */
typedef void (*qrows_fn)(int qt, const uint8_t *w, int64_t wstride, int n, int64_t nb,
                         const void *act, float *out);

typedef struct {
    int qtype;
    int block;      /* values per block */
    int bytes;      /* bytes per block */
    int act;        /* ACT_* */
    qdot_fn plain;
    qdot_fn avx2;   /* NULL where not built */
    qdot_fn vnni;   /* NULL where not built */
    qdot_fn avx512; /* NULL where not built or not written (then vnni serves) */
} qtype_info;

const qtype_info *q_info(int qtype);
/* w's type is known and its shape whole blocks of it (quant_matmul.c); *info: the type */
int q_valid(const ferry_weight *w, const qtype_info **info);

/* Ask for the weight bytes Q_AHEAD past a block before they are needed: a row's dot product
 * does too little work per byte for the hardware prefetcher alone to keep memory busy, and the
 * rows of a thread's share are read back to back, so the bytes ahead are the next ones it
 * reads. 8 KB ahead: a one-token product that streams its weights from memory (8 weight rows
 * a step in rows32) keeps more of them in flight than at 4 KB, and the rounds of many rows,
 * which compute more per byte, lose nothing (docs/kernels.md, Thresholds). (Prefetches never fault, past
 * the end of the weight neither.) */
#ifndef Q_AHEAD
#define Q_AHEAD 8192
#endif
/* Into which cache: 3 (L1 and below) where nothing says otherwise; the build passes 2 (L2)
 * for AMD's cores, where L1 prefetches of a one-token product's short rows (an LM head of
 * 640 columns) left the weight streaming at half the memory's speed (cpu_level.tuning) */
#ifndef Q_PREFETCH_LOCALITY
#define Q_PREFETCH_LOCALITY 3
#endif
#define Q_PREFETCH(blk, bytes)                                                               \
    for (int pf_ = 0; pf_ < (bytes); pf_ += 64)                                              \
    __builtin_prefetch((const char *)(blk) + Q_AHEAD + pf_, 0, Q_PREFETCH_LOCALITY)

/* a qdot_fn `name` with attributes `attr` calling body(R) with R a compile-time constant in
 * each case, so the row loops unroll */
#define Q_ENTRY(attr, name, body)                                                            \
    attr void name(const uint8_t *w, int64_t nb, const void *act, int64_t astride, int R,     \
                   float *out) {                                                             \
        switch (R) {                                                                         \
        case 1: body(1); break;                                                              \
        case 2: body(2); break;                                                              \
        case 3: body(3); break;                                                              \
        default: body(4); break;                                                             \
        }                                                                                    \
    }

/* quant_act.c: one activation row of n values (n % 32 or % 256 == 0) */
void q_act32(const float *x, int64_t n, qa32 *out);
void q_act256(const float *x, int64_t n, qa256 *out);
/* n <= QL_ROWS quantized rows (row r at rows + r * astride bytes, nb blocks) -> nb ql32, the
 * lanes past n zero */
void q_pack_lanes32(const void *rows, int n, int64_t astride, int64_t nb, ql32 *out);
/* 2 <= n <= 4 rows as a half group (quant_lanes.h, q_half32_*): qs[k] for k < 4 holds the
 * rows' values 4k.. in its first 16 bytes and 4k + 16.. in its last 16; two rows as a pair,
 * qs[0] and qs[1] holding two groups of each (quant_lanes.h) */
void q_pack_half32(const void *rows, int n, int64_t astride, int64_t nb, ql32 *out);
/* n <= QL_ROWS qa256 rows -> nb qlk for weights of type qt, the lanes past n zero */
void q_pack_lanes_k(const void *rows, int n, int64_t astride, int64_t nb, int qt, qlk *out);

/* Q4_K / Q5_K's 12 bytes of 6-bit scales and mins, decoded on 32-bit words: the 8 scales'
 * bytes in *sc, the 8 mins' in *m, the first in the low byte (llama.cpp's kmask layout) */
static inline void q_scale_min_k4_words(const uint8_t *s, uint64_t *sc, uint64_t *m) {
    uint32_t u[3];
    memcpy(u, s, 12);
    *sc = (uint64_t)(u[0] & 0x3f3f3f3fu) |
          (uint64_t)((u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u)) << 32;
    *m = (uint64_t)(u[1] & 0x3f3f3f3fu) |
         (uint64_t)(((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u)) << 32;
}

static inline void q_scale_min_k4(const uint8_t *s, uint8_t sc[8], uint8_t m[8]) {
    uint64_t a, b;
    q_scale_min_k4_words(s, &a, &b);
    memcpy(sc, &a, 8); /* little-endian, as every CPU the kernels build for: byte j, scale j */
    memcpy(m, &b, 8);
}

static inline float q_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return ferry_f16_to_f32(h);
}

/* the dot products, one per type: quant_dot.c plain C; quant_simd.h AVX2 and AVX-VNNI (and
 * AVX512-VNNI for the 32-value blocks); quant_dot_avx512.c AVX512-VNNI for the K-quants */
#define Q_DOTS(suffix)                                                                      \
    void q_dot_f32_##suffix(const uint8_t *, int64_t, const void *, int64_t, int, float *);  \
    void q_dot_f16_##suffix(const uint8_t *, int64_t, const void *, int64_t, int, float *);  \
    void q_dot_bf16_##suffix(const uint8_t *, int64_t, const void *, int64_t, int, float *); \
    void q_dot_q4_0_##suffix(const uint8_t *, int64_t, const void *, int64_t, int, float *); \
    void q_dot_q4_1_##suffix(const uint8_t *, int64_t, const void *, int64_t, int, float *); \
    void q_dot_q5_0_##suffix(const uint8_t *, int64_t, const void *, int64_t, int, float *); \
    void q_dot_q8_0_##suffix(const uint8_t *, int64_t, const void *, int64_t, int, float *); \
    void q_dot_q4_k_##suffix(const uint8_t *, int64_t, const void *, int64_t, int, float *); \
    void q_dot_q5_k_##suffix(const uint8_t *, int64_t, const void *, int64_t, int, float *); \
    void q_dot_q6_k_##suffix(const uint8_t *, int64_t, const void *, int64_t, int, float *);
Q_DOTS(plain)
#if defined(__x86_64__) || defined(__i386__)
#define Q_HAVE_AVX2 1
Q_DOTS(avx2)
Q_DOTS(vnni)
void q_dot_q4_0_avx512(const uint8_t *, int64_t, const void *, int64_t, int, float *);
void q_dot_q4_1_avx512(const uint8_t *, int64_t, const void *, int64_t, int, float *);
void q_dot_q5_0_avx512(const uint8_t *, int64_t, const void *, int64_t, int, float *);
void q_dot_q8_0_avx512(const uint8_t *, int64_t, const void *, int64_t, int, float *);
void q_dot_q4_k_avx512(const uint8_t *, int64_t, const void *, int64_t, int, float *);
void q_dot_q5_k_avx512(const uint8_t *, int64_t, const void *, int64_t, int, float *);
void q_dot_q6_k_avx512(const uint8_t *, int64_t, const void *, int64_t, int, float *);
void q_lanes32_avx2(int, const uint8_t *, int64_t, int, int64_t, const void *, int, float *);
void q_lanes32_vnni(int, const uint8_t *, int64_t, int, int64_t, const void *, int, float *);
void q_lanes32_avx512(int, const uint8_t *, int64_t, int, int64_t, const void *, int, float *);
void q_half32_avx2(int, const uint8_t *, int64_t, int, int64_t, const void *, int, float *);
void q_half32_vnni(int, const uint8_t *, int64_t, int, int64_t, const void *, int, float *);
void q_half32_avx512(int, const uint8_t *, int64_t, int, int64_t, const void *, int, float *);
void q_rows32_avx2(int, const uint8_t *, int64_t, int, int64_t, const void *, float *);
void q_rows32_vnni(int, const uint8_t *, int64_t, int, int64_t, const void *, float *);
void q_rows32_avx512(int, const uint8_t *, int64_t, int, int64_t, const void *, float *);
void q_lanes_k_avx2(int, const uint8_t *, int64_t, int, int64_t, const void *, int, float *);
void q_lanes_k_vnni(int, const uint8_t *, int64_t, int, int64_t, const void *, int, float *);
void q_lanes_k_avx512(int, const uint8_t *, int64_t, int, int64_t, const void *, int, float *);
int q_deq_row_avx2(int qt, const uint8_t *src, int64_t in, void *dst, int bf);
int q_deq_row_avx512bf16(int qt, const uint8_t *src, int64_t in, void *dst, int bf);
void q_to_bf16_avx2(const float *src, int64_t n, uint16_t *dst);
#endif

/* quant_tiles.c: one row dequantized to bfloat16, rounded to nearest even (tmp: `in` floats
 * of scratch); and whether the CPU has AVX512-BF16 */
void q_row_bf16(int qt, const uint8_t *src, int64_t in, uint16_t *dst, float *tmp);
int q_cpu_bf16(void);

/* ferry_qgemm_bf16 over n <= Q_GEMM_PARTS weights of one `in` side by side in y's columns
 * (part i from the sum of the outs before it; bias, if any, over all of them), in one OpenMP
 * region that rounds and packs x once: a split projection's parts (q/k/v, gate/up) as one
 * product, each output's bits those of its part's own call */
enum { Q_GEMM_PARTS = 4 };
int q_gemm_parts(const float *x, int64_t rows, int64_t x_stride, const ferry_weight *w, int n,
                 const float *bias, float *y, int64_t y_stride);

/* ferry_qmatmul in parts (quant_matmul.c), for a caller that runs many products in one
 * OpenMP region (moe.c): q_plan_make quantizes (and packs into lanes) x's rows, in a region
 * of its own only where `parallel` (else call it from one thread); q_plan_chunk(p, c) writes
 * output columns [Q_CHUNK c, Q_CHUNK (c + 1)) of y, c < p->chunks, from any thread with no
 * region; q_plan_free. Whichever thread runs a chunk, the bits are ferry_qmatmul's. */
enum { Q_CHUNK = 8 };
typedef struct {
    const ferry_weight *w;
    const qtype_info *info;
    const float *bias;
    float *y;
    int64_t y_stride, rows, chunks;
    qdot_fn dot;
    qlanes_fn lanes, half; /* NULL: none */
    qrows_fn rows1;        /* one row left past the lanes (a one-token product); NULL: none */
    const void *act;       /* the activation rows the dot products read, astride bytes apart */
    int64_t astride;
    void *buf;    /* the quantized rows (NULL where the dot products read x's floats) */
    char *packed; /* lane groups, then the half group */
    size_t unit;  /* bytes of one packed block */
    int64_t groups, halves, full, lane_rows;
} q_plan;
int q_plan_make(q_plan *p, const float *x, int64_t rows, int64_t x_stride, const ferry_weight *w,
                const float *bias, float *y, int64_t y_stride, int parallel);
void q_plan_chunk(const q_plan *p, int64_t c);
void q_plan_free(q_plan *p);

/* the dot products' path in force (0 plain, 1 AVX2, 2 AVX-VNNI, 3 AVX-512
 * VNNI; ferry_qpath caps it) */
int q_active_path(void);

#endif /* FERRY_QUANT_IMPL_H */
