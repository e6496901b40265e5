/* Products over GGUF block-quantized weights (issue 12), plus their dequantization and the
 * Q8_0 / Q4_0 quantizer used by `--quantize`. Weights stay in their block format: row o of a
 * weight is `row_bytes` bytes of blocks (ggml's layout), rows back to back.
 * qtype: ggml type ids F32=0 F16=1 Q4_0=2 Q4_1=3 Q5_0=6 Q8_0=8 Q4_K=12 Q5_K=13 Q6_K=14 BF16=30.
 * Functions return FERRY_OK, FERRY_ENOMEM (ferry.h) or FERRY_EQUANT (a type or shape these
 * kernels do not take; quant.py checks first, so this is the last line of defence). */
#ifndef FERRY_QUANT_H
#define FERRY_QUANT_H

#include "ferry.h"

enum { FERRY_EQUANT = -2 };

typedef struct {
    int32_t qtype;
    int32_t pad;
    const void *data; /* [out, row_bytes] */
    int64_t in;
    int64_t out;
    int64_t row_bytes;
} ferry_weight;

/* y[r, o] = sum_i x[r, i] * W[o, i] (+ bias[o]); x float32 [rows, x_stride], y float32
 * [rows, y_stride]. Opens its own OpenMP region over output rows: call from serial code. */
int ferry_qmatmul(const float *x, int64_t rows, int64_t x_stride, const ferry_weight *w,
                  const float *bias, float *y, int64_t y_stride);

/* the same product for many rows in Intel AMX tiles (W dequantized to bfloat16 32 rows at a
 * time, x rounded to bfloat16, float32 sums); W's `in` must be a multiple of 32. Returns
 * FERRY_EQUANT where the CPU or the kernel gives no AMX (ferry_qgemm_available says so). */
int ferry_qgemm_bf16(const float *x, int64_t rows, int64_t x_stride, const ferry_weight *w,
                     const float *bias, float *y, int64_t y_stride);
int ferry_qgemm_available(void);

/* whether ferry_qgemm_bf16 takes this product of `rows` rows, as quant.quant_matmul decides
 * for a Linear: AMX here and the best dot products in force (not capped by ferry_qpath or
 * FERRY_CPU), rows from quant.MANY_ROWS_AMX_LANES on for the types in lanes (ferry_qlanes)
 * and quant.MANY_ROWS_AMX for the others, W not float32, its `in` whole 32s. (From
 * quant.AMX_MAX_ROWS on, quant_matmul turns to torch's tiles, which C has not: it stays.) */
int ferry_qgemm_takes(const ferry_weight *w, int64_t rows);

/* on = 1: ferry_qgemm_takes takes nothing, so that every product multiplies a row as it would
 * alone, in the dot products or lanes (invariance.set_batch_invariant); 0: off, AMX takes
 * many rows again; -1: leaves it. Returns the setting now. */
int ferry_qinvariant(int on);

/* out[k] = row ids[k] of W ([n, in]), dt FERRY_F32 (exact) or FERRY_BF16 (rounded to nearest
 * even); ids NULL: rows 0..n-1 */
int ferry_qdequantize(const ferry_weight *w, const int64_t *ids, int64_t n, void *out, int dt);

/* float32 x [rows, in] -> rows of Q8_0 or Q4_0 blocks at out, bit for bit gguf-py's quantize */
int ferry_qquantize(const float *x, int64_t rows, int64_t in, int qtype, void *out);

/* which dot products ferry_qmatmul runs: 0 plain C, 1 AVX2, 2 AVX-VNNI, 3 AVX-512
 * VNNI (the K-quants; the other types run AVX-VNNI or AVX2 there). cap: the most it may
 * use from now on (the tests compare the paths on one machine), -1 the CPU's best; returns
 * the path that will run */
int ferry_qpath(int cap);

/* how many rows ferry_qmatmul now multiplies at once in lanes for weights of `qtype` (a
 * whole group's, QL_ROWS), 0 where it has no such kernel (that type, or plain C) */
int ferry_qlanes(int qtype);

/* the path ferry_qmatmul runs for weights of `qtype` now (the K-quants alone have AVX-512
 * dot products), -1 for a type it does not take */
int ferry_qtype_path(int qtype);

#endif /* FERRY_QUANT_H */
