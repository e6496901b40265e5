/* A projection's product (proj.h): the one matrix product of the fused decode layer
 * (decode_layer.c) and of the mixture-of-experts MLP (moe.c), kept below both. */
#include "proj.h"
#include "kernels.h"
#include "quant_impl.h"

/* bf16 (dt): P's one part is a bf16 matrix (ferry_gemv_bf16); float32: part by part into y's
 * column slices, as engine.execution.model.linear_kernels multiplies a (split) quantized
 * weight, each part in the kernel quant.quant_matmul picks for it (ferry_qgemm_takes) */
int ferry_proj_product(const ferry_proj *P, const void *x, int64_t rows, int64_t in, void *y,
                       int64_t out, int dt) {
    if (dt == FERRY_BF16) {
        const ferry_weight *w = &P->part[0];
        if (P->parts != 1 || w->in != in || w->out != out) return FERRY_EQUANT;
        return ferry_gemv_bf16(x, w->data, P->bias, y, (int)rows, in, out);
    }
    const float *bias = (const float *)P->bias;
    int together = P->parts > 1; /* every part in the AMX kernel: one region for all */
    int64_t total = 0;
    for (int i = 0; i < P->parts; i++) {
        together &= P->part[i].in == in && ferry_qgemm_takes(&P->part[i], rows);
        total += P->part[i].out;
    }
    if (together && total == out)
        return q_gemm_parts((const float *)x, rows, in, P->part, P->parts, bias, (float *)y, out);
    int64_t col = 0;
    for (int i = 0; i < P->parts; i++) {
        const ferry_weight *w = &P->part[i];
        if (w->in != in || col + w->out > out) return FERRY_EQUANT;
        FERRY_TRY((ferry_qgemm_takes(w, rows) ? ferry_qgemm_bf16 : ferry_qmatmul)(
            (const float *)x, rows, in, w, bias ? bias + col : NULL, (float *)y + col, out));
        col += w->out;
    }
    return col == out ? FERRY_OK : FERRY_EQUANT;
}
