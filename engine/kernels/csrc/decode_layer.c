/* One decoder layer of a decode round in one call: bf16 activations over bf16 weights, or
 * float32 activations over ferry_weight (quant.h) weights; the KV pool in dims->pool_dt. */
#include "kernels.h"
#include "quant_impl.h"

/* One new token per sequence, a few sequences: the kernels in the order the Python layer
 * (engine/execution/model/decoder.py, DecoderLayer.forward; architectures/gemma3.py for a
 * sandwich layer) calls them one by one, so the results are identical; one call per layer
 * instead of ~10 saves their Python and ctypes overhead. dt: FERRY_BF16 or FERRY_F32, of x,
 * residual, cos, sin and scratch. x [rows, hidden]: the previous layer's output in, this
 * layer's out; residual [rows, hidden] the running sum (`first`: start it from x). cos, sin:
 * this layer's rope tables. scratch: rows x (2 hidden + (heads + 2 kv_heads) dim + heads dim
 * + 3 inter) values (layer_ops.layer_scratch sizes it). */
int ferry_decode_layer(const ferry_layer *L, const ferry_dims *D, int dt, int64_t rows,
                       void *x, void *residual, int first, const void *cos, const void *sin,
                       const int64_t *slots, const int32_t *page_ids, const int64_t *page_starts,
                       const int32_t *kv_lens, void *scratch) {
    const int h = D->heads, kvh = D->kv_heads, d = D->dim;
    const int64_t hidden = D->hidden, inter = D->inter, qkv_n = (int64_t)(h + 2 * kvh) * d;
    const size_t es = ferry_elem(dt);
    char *normed = (char *)scratch, *qkv = normed + rows * hidden * es;
    char *attn = qkv + rows * qkv_n * es, *proj = attn + rows * (int64_t)h * d * es;
    char *gate_up = proj + rows * hidden * es, *act = gate_up + rows * 2 * inter * es;
    if (first) {
        memcpy(residual, x, (size_t)(rows * hidden) * es);
        FERRY_TRY(ferry_rms_norm(x, NULL, L->input_norm, normed, rows, (int)hidden, D->eps, dt));
    } else {
        FERRY_TRY(ferry_rms_norm(x, residual, L->input_norm, normed, rows, (int)hidden, D->eps,
                                 dt));
    }
    FERRY_TRY(ferry_proj_product(&L->qkv, normed, rows, hidden, qkv, qkv_n, dt));
    if (L->q_norm) {
        FERRY_TRY(ferry_head_norm(qkv, qkv_n, rows, h, d, L->q_norm, D->eps, dt));
        FERRY_TRY(ferry_head_norm(qkv + (int64_t)h * d * es, qkv_n, rows, kvh, d, L->k_norm,
                                  D->eps, dt));
    }
    FERRY_TRY(ferry_rotary(qkv, qkv_n, rows, h + kvh, d, cos, sin, dt));
    ferry_store_kv(qkv + (int64_t)h * d * es, qkv_n, slots, rows, L->pages, kvh, D->page_size, d,
                   dt, D->pool_dt);
    FERRY_TRY(ferry_decode_attention(qkv, qkv_n, L->pages, page_ids, page_starts, kv_lens, rows,
                                     h, kvh, d, D->page_size, D->scale, attn, dt, D->pool_dt,
                                     L->window));
    FERRY_TRY(ferry_proj_product(&L->o, attn, rows, (int64_t)h * d, proj, hidden, dt));
    if (L->ffn_norm) {
        FERRY_TRY(ferry_rms_norm(proj, NULL, L->post_norm, proj, rows, (int)hidden, D->eps, dt));
        FERRY_TRY(ferry_rms_norm(proj, residual, L->ffn_norm, normed, rows, (int)hidden, D->eps,
                                 dt));
    } else {
        FERRY_TRY(ferry_rms_norm(proj, residual, L->post_norm, normed, rows, (int)hidden, D->eps,
                                 dt));
    }
    if (L->moe) {
        if (dt != FERRY_F32) return FERRY_EQUANT;
        FERRY_TRY(ferry_moe_mlp(L->moe, (const float *)normed, rows, hidden, (float *)x));
    } else {
        FERRY_TRY(ferry_proj_product(&L->gate_up, normed, rows, hidden, gate_up, 2 * inter, dt));
        FERRY_TRY((L->gelu ? ferry_gelu_tanh_mul : ferry_silu_mul)(gate_up, act, rows,
                                                                   (int)inter, dt));
        FERRY_TRY(ferry_proj_product(&L->down, act, rows, inter, x, hidden, dt));
    }
    if (L->out_norm)
        FERRY_TRY(ferry_rms_norm(x, NULL, L->out_norm, x, rows, (int)hidden, D->eps, dt));
    return FERRY_OK;
}

int ferry_decode_layers(const ferry_layer *layers, int n, const ferry_dims *D, int dt,
                        int64_t rows, void *x, void *residual, const ferry_round *round,
                        void *scratch) {
    for (int i = 0; i < n; i++) {
        const ferry_layer *L = &layers[i];
        if (L->rope < 0 || L->rope > 1 || L->local < 0 || L->local > 1) return FERRY_EQUANT;
        const ferry_rope *r = &round->rope[L->rope];
        const ferry_places *p = &round->pool[L->local];
        FERRY_TRY(ferry_decode_layer(L, D, dt, rows, x, residual, i == 0, r->cos, r->sin,
                                     p->slots, p->page_ids, p->page_starts, p->kv_lens,
                                     scratch));
    }
    return FERRY_OK;
}
