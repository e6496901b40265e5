/* ferry_qgemm_bf16: y = x @ W.T over block-quantized W for tens of rows (big decode rounds;
 * quant.py leaves longer prefill chunks to torch's oneDNN, faster there) in Intel AMX tiles.
 * One OpenMP region: the activation rows are rounded to bfloat16 once, in the pair layout
 * AMX wants for its B operand; then each thread dequantizes 32 weight rows at a time into
 * its own scratch (the whole float weight never exists) and multiplies them with every
 * activation row by tdpbf16ps (bf16 pairs, float32 sums).
 * W's rows are the A operand (row-major, as dequantized), x the B operand, so a C tile holds
 * 16 outputs x 16 rows and is written to y transposed. */
#define _GNU_SOURCE /* syscall() */
#include "quant_impl.h"

static int invariant; /* ferry_qinvariant: no product of many rows in tiles */

int ferry_qinvariant(int on) {
    if (on >= 0) invariant = on != 0;
    return invariant;
}

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define G_TGT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

enum { G_T = 16, G_K = 32, G_O = 2 * G_T, G_R = 2 * G_T }; /* tile side, k per op, per block */

/* AMX-BF16 and AVX512-BF16 on the CPU, and the kernel's permission for the tile state */
static int g_cpu(void) {
    static int has = -1;
    if (has < 0) {
        unsigned a, b, c, d;
        has = 0;
        if (q_cpu_bf16() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) &&
            (d >> 24 & 1))
            has = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                          18 /* XFEATURE_XTILEDATA */) == 0;
    }
    return has;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* tmm0-3: C (2 weight groups x 2 row groups), tmm4-5: A (weight rows), tmm6-7: B (x) */
G_TGT static void configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = G_T;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* x rows [rows, in] float32 -> bf16 B tiles: group g of 16 rows, k-chunk c:
 * xp[((g * chunks + c) * 16 + k / 2) * 32 + 2 * r + k % 2] = x[16 g + r][32 c + k] */
G_TGT static void pack_rows(const float *x, int64_t x_stride, int64_t rows, int64_t in,
                            int64_t g, uint16_t *xp) {
    const int64_t chunks = in / G_K;
    for (int64_t c = 0; c < chunks; c++) {
        uint16_t *dst = xp + (g * chunks + c) * (G_T * G_K);
        for (int r = 0; r < G_T; r++) {
            int64_t row = g * G_T + r;
            __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
            if (row < rows) {
                lo = _mm512_loadu_ps(x + row * x_stride + c * G_K);
                hi = _mm512_loadu_ps(x + row * x_stride + c * G_K + 16);
            }
            uint16_t v[G_K];
            _mm512_storeu_si512(v, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
            for (int k = 0; k < G_K; k++) dst[(k / 2) * G_K + 2 * r + (k & 1)] = v[k];
        }
    }
}

/* one block of weight rows [o0, o0 + n), n <= 32, dequantized into wb [32, in] */
G_TGT static void block(const ferry_weight *w, int64_t o0, int64_t n, const uint16_t *xp,
                        int64_t groups, const float *bias, float *y, int64_t y_stride,
                        int64_t rows, uint16_t *wb, float *tmp) {
    const int64_t in = w->in, chunks = in / G_K, ws = in * 2;
    for (int64_t k = 0; k < n; k++)
        q_row_bf16(w->qtype, (const uint8_t *)w->data + (o0 + k) * w->row_bytes, in,
                   wb + k * in, tmp);
    if (n < G_O) memset(wb + n * in, 0, (size_t)((G_O - n) * in) * 2);
    float c[4][G_T * G_T];
    /* c[t][o * G_T + r] for o = 0..15: one row r's outputs */
    const __m512i down = _mm512_mullo_epi32(_mm512_set1_epi32(G_T),
                                            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                              11, 12, 13, 14, 15));
    for (int64_t g = 0; g < groups; g += 2) {
        const uint16_t *b0 = xp + g * chunks * (G_T * G_K), *b1 = b0 + chunks * (G_T * G_K);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t k = 0; k < chunks; k++) {
            _tile_loadd(4, wb + k * G_K, ws);
            _tile_loadd(5, wb + G_T * in + k * G_K, ws);
            _tile_loadd(6, b0 + k * (G_T * G_K), 64);
            _tile_loadd(7, b1 + k * (G_T * G_K), 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, c[0], 64);
        _tile_stored(1, c[1], 64);
        _tile_stored(2, c[2], 64);
        _tile_stored(3, c[3], 64);
        /* c[t][o][r]: weight group t / 2, row group g + t % 2; each row r of y gets its 16
         * outputs in one store (y's rows lie a multiple of 4 KB apart in the default model's
         * shapes: storing them value by value down a column thrashed one L1 set) */
        for (int t = 0; t < 4; t++) {
            int64_t ob = o0 + (t / 2) * G_T, rb = (g + t % 2) * G_T;
            int64_t no = o0 + n - ob < G_T ? o0 + n - ob : G_T;
            int64_t nr = rows - rb < G_T ? rows - rb : G_T;
            if (no <= 0 || nr <= 0) continue;
            __mmask16 m = (__mmask16)((1u << no) - 1);
            __m512 add = bias ? _mm512_maskz_loadu_ps(m, bias + ob) : _mm512_setzero_ps();
            for (int64_t r = 0; r < nr; r++)
                _mm512_mask_storeu_ps(y + (rb + r) * y_stride + ob, m,
                                      _mm512_add_ps(_mm512_i32gather_ps(down, c[t] + r, 4), add));
        }
    }
}

int ferry_qgemm_available(void) { return g_cpu(); }

int ferry_qgemm_takes(const ferry_weight *w, int64_t rows) {
    /* quant.many_rows: MANY_ROWS_AMX_K for the K-quants (256-value blocks) in lanes,
     * MANY_ROWS_AMX_LANES for the other types in lanes, MANY_ROWS_AMX for the rest */
    const int from = !ferry_qlanes(w->qtype) ? 8 : q_info(w->qtype)->act == ACT_256 ? 24 : 16;
    return rows >= from && !invariant && w->qtype != QT_F32 && w->in % G_K == 0 &&
           q_active_path() == 3 && g_cpu();
}

/* parts w[0..n) side by side in y's columns (part i from column `col` = the outs before it),
 * one bias over all of them: x packed once, every part's blocks in one region */
G_TGT int q_gemm_parts(const float *x, int64_t rows, int64_t x_stride, const ferry_weight *w,
                       int n, const float *bias, float *y, int64_t y_stride) {
    const qtype_info *info;
    if (!g_cpu() || n < 1 || n > Q_GEMM_PARTS || rows < 0) return FERRY_EQUANT;
    int64_t first[Q_GEMM_PARTS + 1], col[Q_GEMM_PARTS]; /* part i's blocks from first[i] */
    first[0] = 0;
    for (int i = 0; i < n; i++) {
        if (!q_valid(&w[i], &info) || w[i].in % G_K != 0 || w[i].in != w[0].in)
            return FERRY_EQUANT;
        first[i + 1] = first[i] + (w[i].out + G_O - 1) / G_O;
        col[i] = i ? col[i - 1] + w[i - 1].out : 0;
    }
    if (rows == 0 || first[n] == 0) return FERRY_OK;
    const int64_t in = w[0].in, groups = (rows + G_R - 1) / G_R * 2, blocks = first[n];
    uint16_t *xp = (uint16_t *)malloc((size_t)(groups * G_T * in) * 2);
    if (!xp) return FERRY_ENOMEM;
    int failed = 0;
#pragma omp parallel
    {
        uint16_t *wb = (uint16_t *)malloc((size_t)(G_O * in) * 2);
        float *tmp = (float *)malloc((size_t)in * sizeof(float));
        if (!wb || !tmp) {
#pragma omp atomic write
            failed = 1;
        }
        configure();
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) pack_rows(x, x_stride, rows, in, g, xp);
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            if (!wb || !tmp) continue;
            int i = 0;
            while (b >= first[i + 1]) i++;
            const int64_t o0 = (b - first[i]) * G_O;
            const int64_t m = w[i].out - o0 < G_O ? w[i].out - o0 : G_O;
            block(&w[i], o0, m, xp, groups, bias ? bias + col[i] : NULL, y + col[i], y_stride,
                  rows, wb, tmp);
        }
        _tile_release();
        free(wb);
        free(tmp);
    }
    free(xp);
    return failed ? FERRY_ENOMEM : FERRY_OK;
}

int ferry_qgemm_bf16(const float *x, int64_t rows, int64_t x_stride, const ferry_weight *w,
                     const float *bias, float *y, int64_t y_stride) {
    return q_gemm_parts(x, rows, x_stride, w, 1, bias, y, y_stride);
}

#else
int ferry_qgemm_available(void) { return 0; }

int ferry_qgemm_takes(const ferry_weight *w, int64_t rows) {
    (void)w, (void)rows;
    return 0;
}

int ferry_qgemm_bf16(const float *x, int64_t rows, int64_t x_stride, const ferry_weight *w,
                     const float *bias, float *y, int64_t y_stride) {
    (void)x, (void)rows, (void)x_stride, (void)w, (void)bias, (void)y, (void)y_stride;
    return FERRY_EQUANT;
}

int q_gemm_parts(const float *x, int64_t rows, int64_t x_stride, const ferry_weight *w, int n,
                 const float *bias, float *y, int64_t y_stride) {
    (void)x, (void)rows, (void)x_stride, (void)w, (void)n, (void)bias, (void)y, (void)y_stride;
    return FERRY_EQUANT;
}
#endif
