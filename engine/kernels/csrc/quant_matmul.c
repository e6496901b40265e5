/* ferry_qmatmul: y = x @ W.T over block-quantized W. The activation rows are quantized once
 * per call (int8 per 32 or per 256 values), then output rows are split over the OpenMP team
 * in chunks; each weight row is read once per group of up to 4 activation rows, or, for the
 * block types on the SIMD paths, once per QL_MAX_G groups of QL_ROWS rows in lanes
 * (quant_lanes.h, quant_lanes_k.h). The same steps as a q_plan (quant_impl.h) serve a caller
 * that runs many small products in one region of its own (moe.c). */
#include "quant_impl.h"

#ifdef Q_HAVE_AVX2
#define SIMD(name) q_dot_##name##_avx2, q_dot_##name##_vnni
#define AVX512(name) q_dot_##name##_avx512
#else
#define SIMD(name) NULL, NULL
#define AVX512(name) NULL
#endif
#define T(qt, bs, by, act, name, wide) {qt, bs, by, act, q_dot_##name##_plain, SIMD(name), wide}

static const qtype_info TYPES[] = {
    T(QT_F32, 1, 4, ACT_F32, f32, NULL),
    T(QT_F16, 1, 2, ACT_F32, f16, NULL),
    T(QT_BF16, 1, 2, ACT_F32, bf16, NULL),
    T(QT_Q4_0, 32, 18, ACT_32, q4_0, AVX512(q4_0)),
    T(QT_Q4_1, 32, 20, ACT_32, q4_1, AVX512(q4_1)),
    T(QT_Q5_0, 32, 22, ACT_32, q5_0, AVX512(q5_0)),
    T(QT_Q8_0, 32, 34, ACT_32, q8_0, AVX512(q8_0)),
    T(QT_Q4_K, 256, 144, ACT_256, q4_k, AVX512(q4_k)),
    T(QT_Q5_K, 256, 176, ACT_256, q5_k, AVX512(q5_k)),
    T(QT_Q6_K, 256, 210, ACT_256, q6_k, AVX512(q6_k)),
};

const qtype_info *q_info(int qtype) {
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].qtype == qtype) return &TYPES[i];
    return NULL;
}

/* the paths this CPU runs, bit p for path p: 0 plain C, 1 AVX2 (with FMA and F16C), 2 AVX-VNNI,
 * 3 AVX-512 VNNI (with BW and VL). A CPU may have 3 and not 2 (Ice Lake, Zen 4): there the
 * types without AVX-512 dot products run AVX2. */
static int cpu_paths(void) {
    static int has = -1;
    if (has < 0) {
        int h = 1;
#ifdef Q_HAVE_AVX2
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            __builtin_cpu_supports("f16c")) {
            h |= 2;
            if (__builtin_cpu_supports("avxvnni")) h |= 4;
            if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx512vnni"))
                h |= 8;
        }
#endif
        has = h & FERRY_PATH_MASK;
    }
    return has;
}

static int path_cap = 3; /* the most ferry_qpath lets ferry_qmatmul use */

int q_active_path(void) {
    int p = path_cap;
    while (p > 0 && !(cpu_paths() >> p & 1)) p--;
    return p;
}

int ferry_qpath(int cap) {
    path_cap = cap < 0 || cap > 3 ? 3 : cap;
    return q_active_path();
}

static qdot_fn pick(const qtype_info *info) {
    int p = q_active_path();
    if (p == 3 && info->avx512) return info->avx512;
    if (p >= 2 && info->vnni && (cpu_paths() & 4)) return info->vnni;
    if (p >= 1 && info->avx2) return info->avx2;
    return info->plain;
}

/* the rows-in-lanes kernels (quant_lanes.h, quant_lanes_k.h) of the path in force, *half:
 * the one for 2-4 rows (none for the K-quants: those rows take the dot products); NULL for
 * plain C and for the types without them (their rows all go through the dot products) */
static qlanes_fn pick_lanes(const qtype_info *info, qlanes_fn *half) {
    *half = NULL;
#ifdef Q_HAVE_AVX2
    int qt = info->qtype, k = info->act == ACT_256;
    if (qt != QT_Q4_0 && qt != QT_Q4_1 && qt != QT_Q5_0 && qt != QT_Q8_0 && !k) return NULL;
    int p = q_active_path();
    if (p == 3) return k ? q_lanes_k_avx512 : (*half = q_half32_avx512, q_lanes32_avx512);
    if (p >= 2 && (cpu_paths() & 4))
        return k ? q_lanes_k_vnni : (*half = q_half32_vnni, q_lanes32_vnni);
    if (p >= 1) return k ? q_lanes_k_avx2 : (*half = q_half32_avx2, q_lanes32_avx2);
#else
    (void)info;
#endif
    return NULL;
}

/* quant_simd.h's rows32 of the path pick() takes, for the 32-value block types; NULL else */
static qrows_fn pick_rows1(const qtype_info *info) {
#ifdef Q_HAVE_AVX2
    if (info->act != ACT_32 || info->block != 32) return NULL;
    qdot_fn dot = pick(info);
    if (dot == info->avx512) return q_rows32_avx512;
    if (dot == info->vnni) return q_rows32_vnni;
    if (dot == info->avx2) return q_rows32_avx2;
#else
    (void)info;
#endif
    return NULL;
}

int ferry_qlanes(int qtype) {
    const qtype_info *info = q_info(qtype);
    qlanes_fn half;
    return info && pick_lanes(info, &half) ? QL_ROWS : 0;
}

int ferry_qtype_path(int qtype) {
    const qtype_info *info = q_info(qtype);
    if (!info) return -1;
    qdot_fn f = pick(info);
    return f == info->avx512 ? 3 : f == info->vnni ? 2 : f == info->avx2 ? 1 : 0;
}

int q_valid(const ferry_weight *w, const qtype_info **info) {
    *info = q_info(w->qtype);
    if (!*info || w->in <= 0 || w->out < 0 || w->in % (*info)->block != 0) return 0;
    return w->row_bytes == w->in / (*info)->block * (*info)->bytes;
}

/* activation row r of p quantized (into p->buf) */
static void quantize_row(const q_plan *p, const float *x, int64_t x_stride, int64_t r) {
    char *dst = (char *)p->buf + r * p->astride;
    if (p->info->act == ACT_32)
        q_act32(x + r * x_stride, p->w->in, (qa32 *)dst);
    else
        q_act256(x + r * x_stride, p->w->in, (qa256 *)dst);
}

/* lane group g of p's quantized rows packed (into p->packed); g == p->groups: the half group */
static void pack_group(const q_plan *p, int64_t g) {
    int64_t nb = p->w->in / p->info->block, r0 = g * QL_ROWS, n = p->lane_rows - r0;
    const char *a = (const char *)p->buf + r0 * p->astride;
    void *dst = p->packed + (size_t)(g * nb) * p->unit;
    if (g == p->groups)
        q_pack_half32(a, (int)n, p->astride, nb, dst);
    else if (p->info->act == ACT_256)
        q_pack_lanes_k(a, n < QL_ROWS ? (int)n : QL_ROWS, p->astride, nb, p->info->qtype, dst);
    else
        q_pack_lanes32(a, n < QL_ROWS ? (int)n : QL_ROWS, p->astride, nb, dst);
}

int q_plan_make(q_plan *p, const float *x, int64_t rows, int64_t x_stride, const ferry_weight *w,
                const float *bias, float *y, int64_t y_stride, int parallel) {
    const qtype_info *info;
    memset(p, 0, sizeof *p);
    if (!q_valid(w, &info) || rows < 0) return FERRY_EQUANT;
    p->w = w;
    p->info = info;
    p->bias = bias;
    p->y = y;
    p->y_stride = y_stride;
    p->rows = rows;
    if (rows == 0 || w->out == 0) return FERRY_OK; /* no chunks */
    p->chunks = (w->out + Q_CHUNK - 1) / Q_CHUNK;
    p->dot = pick(info);
    int64_t nb = w->in / info->block;
    p->act = x;
    p->astride = x_stride * 4;
    if (info->act != ACT_F32) {
        size_t unit = info->act == ACT_32 ? sizeof(qa32) : sizeof(qa256);
        p->astride = nb * (int64_t)unit;
        p->act = p->buf = malloc((size_t)(rows * p->astride));
        if (!p->buf) return FERRY_ENOMEM;
        if (parallel && rows >= 8) {
#pragma omp parallel for schedule(static)
            for (int64_t r = 0; r < rows; r++) quantize_row(p, x, x_stride, r);
        } else {
            for (int64_t r = 0; r < rows; r++) quantize_row(p, x, x_stride, r);
        }
    }
    /* whole groups of QL_ROWS rows in lanes (a last one of 5-7 rows too, zero rows filling
     * its other lanes), 2-4 left over in a half group where the type has one, the rest (and
     * everything on plain C, or of types without lanes) through the dot products: the same
     * float steps for every row whichever way it goes */
    p->lanes = pick_lanes(info, &p->half);
    /* the AVX-512 K-quant dot products (64 values an instruction, a block's weights held in
     * registers for 4 rows) beat a single lane group: the lanes take over from two */
    if (info->act == ACT_256 && p->dot == info->avx512 && rows < 2 * QL_ROWS) p->lanes = NULL;
    int64_t rem = p->lanes ? rows % QL_ROWS : rows;
    p->groups = p->lanes ? rows / QL_ROWS + (rem >= 5) : 0;
    p->halves = p->lanes && p->half && rem >= 2 && rem <= 4;
    p->full = p->groups * QL_ROWS < rows ? p->groups * QL_ROWS : rows; /* rows in whole lanes */
    p->lane_rows = p->halves ? rows : p->full; /* rows in lanes, halves included */
    p->rows1 = rows - p->lane_rows == 1 ? pick_rows1(info) : NULL;
    p->unit = info->act == ACT_256 ? sizeof(qlk) : sizeof(ql32); /* a packed block */
    int64_t packs = p->groups + p->halves;
    if (packs) {
        p->packed = malloc((size_t)(packs * nb) * p->unit);
        if (!p->packed) {
            q_plan_free(p);
            return FERRY_ENOMEM;
        }
        if (parallel && packs >= 2) {
#pragma omp parallel for schedule(static)
            for (int64_t g = 0; g < packs; g++) pack_group(p, g);
        } else {
            for (int64_t g = 0; g < packs; g++) pack_group(p, g);
        }
    }
    return FERRY_OK;
}

/* chunk c's columns for lane groups [g_lo, g_hi), and with `tail` the rows past the lanes */
static void q_plan_part(const q_plan *p, int64_t c, int64_t g_lo, int64_t g_hi, int tail) {
    const ferry_weight *w = p->w;
    const float *bias = p->bias;
    float *y = p->y;
    const int64_t nb = w->in / p->info->block, rows = p->rows, y_stride = p->y_stride;
    const int64_t full = p->full;
    const uint8_t *wd = (const uint8_t *)w->data;
    int64_t o1 = (c + 1) * Q_CHUNK < w->out ? (c + 1) * Q_CHUNK : w->out;
    const int64_t o0 = c * Q_CHUNK, n = o1 - o0;
    float bo[Q_CHUNK]; /* the chunk's bias, for all three kinds of rows below */
    for (int64_t i = 0; i < n; i++) bo[i] = bias ? bias[o0 + i] : 0.f;
    for (int64_t g0 = g_lo; g0 < g_hi; g0 += QL_MAX_G) {
        int G = g_hi - g0 < QL_MAX_G ? (int)(g_hi - g0) : QL_MAX_G;
        /* the chunk's columns for G groups' rows, then written row by row: a row's columns
         * are adjacent in y (column by column, every store went to another row's line) */
        float part[Q_CHUNK * QL_MAX_G * QL_ROWS];
        for (int64_t o = o0; o < o1; o += QL_MAX_W) {
            int nw = o1 - o < QL_MAX_W ? (int)(o1 - o) : QL_MAX_W;
            p->lanes(p->info->qtype, wd + o * w->row_bytes, w->row_bytes, nw, nb,
                     p->packed + (size_t)(g0 * nb) * p->unit, G,
                     part + (o - o0) * QL_MAX_G * QL_ROWS);
        }
        int64_t r1 = full - g0 * QL_ROWS < G * QL_ROWS ? full - g0 * QL_ROWS : G * QL_ROWS;
        for (int64_t r = 0; r < r1; r++) {
            float *yr = y + (g0 * QL_ROWS + r) * y_stride + o0;
            for (int64_t i = 0; i < n; i++) yr[i] = part[i * QL_MAX_G * QL_ROWS + r] + bo[i];
        }
    }
    if (!tail) return;
    if (p->halves) {
        for (int64_t o = o0; o < o1; o++) {
            float part[4];
            p->half(p->info->qtype, wd + o * w->row_bytes, 0, 1, nb,
                    p->packed + (size_t)(p->groups * nb) * p->unit, (int)(rows - full), part);
            for (int64_t r = full; r < rows; r++) y[r * y_stride + o] = part[r - full] + bo[o - o0];
        }
    }
    _Static_assert(Q_CHUNK == 8, "rows32 takes a chunk's weight rows in 8 lanes");
    if (p->rows1) { /* the chunk's weight rows against the one row left, at once */
        float part[Q_CHUNK];
        const int64_t r = p->lane_rows;
        p->rows1(p->info->qtype, wd + o0 * w->row_bytes, w->row_bytes, (int)n, nb,
                 (const char *)p->act + r * p->astride, part);
        for (int64_t i = 0; i < n; i++) y[r * y_stride + o0 + i] = part[i] + bo[i];
        return;
    }
    for (int64_t r0 = p->lane_rows; r0 < rows; r0 += QMAX_R) {
        int R = rows - r0 < QMAX_R ? (int)(rows - r0) : QMAX_R;
        const char *a = (const char *)p->act + r0 * p->astride;
        for (int64_t o = o0; o < o1; o++) {
            float part[QMAX_R];
            p->dot(wd + o * w->row_bytes, nb, a, p->astride, R, part);
            for (int r = 0; r < R; r++) y[(r0 + r) * y_stride + o] = part[r] + bo[o - o0];
        }
    }
}

void q_plan_chunk(const q_plan *p, int64_t c) { q_plan_part(p, c, 0, p->groups, 1); }

void q_plan_free(q_plan *p) {
    free(p->packed);
    free(p->buf);
    p->packed = NULL;
    p->buf = NULL;
}

/* packed activation bytes of a block of rows: well within any x86 core's L2 (512 KB on AMD
 * Zen 2-4) beside W's chunk; 128 KB measured best of 128-512 (docs/kernels.md, Thresholds) */
enum { Q_BLOCK_BYTES = 1 << 17 };

int ferry_qmatmul(const float *x, int64_t rows, int64_t x_stride, const ferry_weight *w,
                  const float *bias, float *y, int64_t y_stride) {
    q_plan p;
    int rc = q_plan_make(&p, x, rows, x_stride, w, bias, y, y_stride, 1);
    if (rc) return rc;
    /* output rows split over the team, Q_CHUNK an item. A few rows stream the weight at
     * memory speed: one contiguous share a thread. Many rows compute longer per weight row:
     * runs of a 32nd taken as threads come free, so a thread the OS lends to another for a
     * while (the server's own threads share the cores) does not hold the others up */
    const int64_t chunks = p.chunks;
    if (rows < QL_ROWS) {
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < chunks; c++) q_plan_chunk(&p, c);
        q_plan_free(&p);
        return FERRY_OK;
    }
    /* Many rows go in blocks of lane groups whose packed rows stay in a core's L2 while each
     * chunk of W passes over them (W read once a block); one pass over all the rows per chunk
     * read them from the L3 or memory out / Q_CHUNK times. A block is whole passes of
     * QL_MAX_G groups, so a row's bits are the same either way */
    const int64_t group_bytes = (int64_t)p.unit * (w->in / p.info->block);
    int64_t per = group_bytes ? Q_BLOCK_BYTES / group_bytes / QL_MAX_G * QL_MAX_G : 0;
    if (per < QL_MAX_G) per = QL_MAX_G;
    const int64_t blocks = p.groups > 2 * per ? (p.groups + per - 1) / per : 1;
    if (blocks == 1) per = p.groups;
    const int64_t run = chunks >= 64 ? chunks / 32 : 2;
#pragma omp parallel for schedule(dynamic, run)
    for (int64_t i = 0; i < blocks * chunks; i++) {
        const int64_t b = i / chunks, g_hi = (b + 1) * per;
        q_plan_part(&p, i % chunks, b * per, g_hi < p.groups ? g_hi : p.groups, b == blocks - 1);
    }
    q_plan_free(&p);
    return FERRY_OK;
}
