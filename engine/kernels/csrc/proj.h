/* proj.c: a projection, the matrix product the fused decode layer (decode_layer.c) and the
 * mixture-of-experts MLP (moe.c) both run; below both, so neither file depends on the other
 * for it. */
#ifndef FERRY_PROJ_H
#define FERRY_PROJ_H

#include "ferry.h"
#include "quant.h"

/* A projection: row-stacked parts (q, k, v or gate, up; several only when their types
 * differ); float32 activations multiply any ferry_weight type, bf16 ones one bf16 part
 * (ferry_gemv_bf16). The bias is in the activations' dt. */
typedef struct {
    ferry_weight part[3];
    int32_t parts, pad;
    const void *bias; /* [sum of the parts' out] or NULL */
} ferry_proj;

/* y [rows, out] = x [rows, in] @ P.T (+ bias), in dt */
int ferry_proj_product(const ferry_proj *P, const void *x, int64_t rows, int64_t in, void *y,
                       int64_t out, int dt);

#endif
