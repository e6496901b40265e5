/* One decoder layer of a decode round in one call: float32 activations, products over
 * ferry_weight (quant.h) weights, the KV pool in any dt. */
#include "kernels.h"

/* y [rows, out] = x [rows, in] @ P.T (+ bias), part by part into y's column slices, as
 * engine.execution.model.linear_kernels multiplies a (split) quantized weight */
static int product(const ferry_proj *P, const float *x, int64_t rows, int64_t in, float *y,
                   int64_t out) {
    int64_t col = 0;
    for (int i = 0; i < P->parts; i++) {
        const ferry_weight *w = &P->part[i];
        if (w->in != in || col + w->out > out) return FERRY_EQUANT;
        FERRY_TRY(ferry_qmatmul(x, rows, in, w, P->bias ? P->bias + col : NULL, y + col, out));
        col += w->out;
    }
    return col == out ? FERRY_OK : FERRY_EQUANT;
}

/* The kernels in the order DecoderLayer.forward calls them for a float32 model, so the result
 * equals that path's. x [rows, hidden] float32: the previous layer's output in, this layer's
 * out; residual [rows, hidden] the running sum (`first`: start it from x). scratch: rows x
 * (2 hidden + (heads + 2 kv_heads) dim + heads dim + 3 inter) floats (ops.layer_scratch). */
int ferry_decode_layer_f32(const ferry_qlayer *L, const ferry_dims *D, int64_t rows, float *x,
                           float *residual, int first, const float *cos, const float *sin,
                           const int64_t *slots, const int32_t *page_ids,
                           const int64_t *page_starts, const int32_t *kv_lens, float *scratch) {
    const int h = D->heads, kvh = D->kv_heads, d = D->dim, F = FERRY_F32;
    const int64_t hidden = D->hidden, inter = D->inter, qkv_n = (int64_t)(h + 2 * kvh) * d;
    float *normed = scratch, *qkv = normed + rows * hidden;
    float *attn = qkv + rows * qkv_n, *proj = attn + rows * (int64_t)h * d;
    float *gate_up = proj + rows * hidden, *act = gate_up + rows * 2 * inter;
    if (first) {
        memcpy(residual, x, (size_t)(rows * hidden) * sizeof(float));
        FERRY_TRY(ferry_rms_norm(x, NULL, L->input_norm, normed, rows, (int)hidden, D->eps, F));
    } else {
        FERRY_TRY(ferry_rms_norm(x, residual, L->input_norm, normed, rows, (int)hidden, D->eps,
                                 F));
    }
    FERRY_TRY(product(&L->qkv, normed, rows, hidden, qkv, qkv_n));
    if (L->q_norm)
        for (int64_t t = 0; t < rows; t++) {
            float *row = qkv + t * qkv_n;
            FERRY_TRY(ferry_rms_norm(row, NULL, L->q_norm, row, h, d, D->eps, F));
            FERRY_TRY(ferry_rms_norm(row + (int64_t)h * d, NULL, L->k_norm, row + (int64_t)h * d,
                                     kvh, d, D->eps, F));
        }
    FERRY_TRY(ferry_rotary(qkv, qkv_n, rows, h + kvh, d, cos, sin, F));
    ferry_store_kv(qkv + (int64_t)h * d, qkv_n, slots, rows, L->pages, kvh, D->page_size, d, F,
                   D->pool_dt);
    FERRY_TRY(ferry_decode_attention(qkv, qkv_n, L->pages, page_ids, page_starts, kv_lens, rows,
                                     h, kvh, d, D->page_size, D->scale, attn, F, D->pool_dt));
    FERRY_TRY(product(&L->o, attn, rows, (int64_t)h * d, proj, hidden));
    FERRY_TRY(ferry_rms_norm(proj, residual, L->post_norm, normed, rows, (int)hidden, D->eps, F));
    FERRY_TRY(product(&L->gate_up, normed, rows, hidden, gate_up, 2 * inter));
    FERRY_TRY(ferry_silu_mul(gate_up, act, rows, (int)inter, F));
    FERRY_TRY(product(&L->down, act, rows, inter, x, hidden));
    return FERRY_OK;
}
