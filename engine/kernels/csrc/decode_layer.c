/* One decoder layer of a decode round in one call (bf16 weights and activations). */
#include "kernels.h"

/* One new token per sequence, a few sequences: the same kernels, in the same order, as the
 * Python layer (engine/execution/model/llama.py, DecoderLayer.forward) calls them one by one,
 * so the results are identical; one call per layer instead of ~10 saves their Python and
 * ctypes overhead.
 * x [rows, hidden]: the previous layer's output in, this layer's out; residual [rows, hidden]
 * the running sum (`first`: start it from x). scratch: rows x (2 hidden + (heads + 2 kv_heads)
 * dim + heads dim + 3 inter) bf16 values (ops.layer_scratch sizes it). */
int ferry_decode_layer(const ferry_layer *L, const ferry_dims *D, int64_t rows, void *x,
                       void *residual, int first, const void *cos, const void *sin,
                       const int64_t *slots, const int32_t *page_ids, const int64_t *page_starts,
                       const int32_t *kv_lens, void *scratch) {
    const int h = D->heads, kvh = D->kv_heads, d = D->dim, B = FERRY_BF16;
    const int64_t hidden = D->hidden, qkv_n = (int64_t)(h + 2 * kvh) * d;
    uint16_t *normed = (uint16_t *)scratch, *qkv = normed + rows * hidden;
    uint16_t *attn = qkv + rows * qkv_n, *proj = attn + rows * (int64_t)h * d;
    uint16_t *gate_up = proj + rows * hidden, *act = gate_up + rows * 2 * D->inter;
    if (first) {
        memcpy(residual, x, (size_t)(rows * hidden) * 2);
        FERRY_TRY(ferry_rms_norm(x, NULL, L->input_norm, normed, rows, (int)hidden, D->eps,
                                 B));
    } else {
        FERRY_TRY(ferry_rms_norm(x, residual, L->input_norm, normed, rows, (int)hidden, D->eps, B));
    }
    FERRY_TRY(ferry_gemv_bf16(normed, L->qkv_w, L->qkv_b, qkv, (int)rows, hidden, qkv_n));
    if (L->q_norm)
        for (int64_t t = 0; t < rows; t++) {
            uint16_t *row = qkv + t * qkv_n;
            FERRY_TRY(ferry_rms_norm(row, NULL, L->q_norm, row, h, d, D->eps, B));
            FERRY_TRY(ferry_rms_norm(row + (int64_t)h * d, NULL, L->k_norm, row + (int64_t)h * d, kvh,
                               d, D->eps, B));
        }
    FERRY_TRY(ferry_rotary(qkv, qkv_n, rows, h + kvh, d, cos, sin, B));
    ferry_store_kv(qkv + (int64_t)h * d, qkv_n, slots, rows, L->pages, kvh, D->page_size, d, B,
                   B);
    FERRY_TRY(ferry_decode_attention(qkv, qkv_n, L->pages, page_ids, page_starts, kv_lens, rows, h,
                               kvh, d, D->page_size, D->scale, attn, B, B));
    FERRY_TRY(ferry_gemv_bf16(attn, L->o_w, L->o_b, proj, (int)rows, (int64_t)h * d, hidden));
    FERRY_TRY(ferry_rms_norm(proj, residual, L->post_norm, normed, rows, (int)hidden, D->eps, B));
    FERRY_TRY(ferry_gemv_bf16(normed, L->gate_up_w, L->gate_up_b, gate_up, (int)rows, hidden,
                        2 * D->inter));
    FERRY_TRY(ferry_silu_mul(gate_up, act, rows, (int)D->inter, B));
    FERRY_TRY(ferry_gemv_bf16(act, L->down_w, L->down_b, x, (int)rows, D->inter, hidden));
    return FERRY_OK;
}
