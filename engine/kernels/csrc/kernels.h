/* The fused CPU kernels' entry points (one file per family beside this header) and the
 * structs Python fills for them. engine/kernels/native.py binds each prototype below through
 * ctypes and builds a ctypes Structure from each typedef: declare them here and nowhere else.
 * Functions returning int return FERRY_OK or FERRY_ENOMEM (ferry.h). */
#ifndef FERRY_KERNELS_H
#define FERRY_KERNELS_H

#include "ferry.h"
#include "quant.h"
#include "proj.h"

/* norm.c: out[r] = rms_norm(x[r]) * w (residual: residual += x first, norm of the sum) */
int ferry_rms_norm(void *x, void *residual, const void *w, void *out, int64_t rows, int dim,
                   float eps, int dt);
/* norm.c: each of `heads` head vectors (dim values, contiguous) of each token row (row_stride
 * elements apart) through rms_norm(v) * w, in place: Qwen3's and Gemma 3's QK-norm */
int ferry_head_norm(void *x, int64_t row_stride, int64_t tokens, int heads, int dim,
                    const void *w, float eps, int dt);

/* rotary.c: rotate `heads` head vectors of each token row in place (rotate_half convention) */
int ferry_rotary(void *x, int64_t row_stride, int64_t tokens, int heads, int dim,
                 const void *cos, const void *sin, int dt);

/* activation.c: out[r] = silu(gate) * up (gelu_tanh(gate) * up) for rows [gate (n) | up (n)] */
int ferry_silu_mul(const void *gate_up, void *out, int64_t rows, int n, int dt);
int ferry_gelu_tanh_mul(const void *gate_up, void *out, int64_t rows, int n, int dt);
/* one row of either, no OpenMP region (moe.c runs rows inside its own); g: 2n floats of
 * scratch; gelu: GELU-tanh, else SiLU */
void gated_row(const void *gate_up, void *out, int n, int dt, int gelu, float *g);

/* kv_store.c: new tokens' K/V rows (in dt) into one layer of the paged pool (in pool_dt) */
void ferry_store_kv(const void *kv, int64_t row_stride, const int64_t *slots, int64_t tokens,
                    void *pool, int kv_heads, int page_size, int dim, int dt, int pool_dt);

/* attention.c: one query row per entry attends over its cached K/V in the pool (the last
 * `window` positions; 0: all): a decode step, or a prefill row (entries sharing a table, one
 * position apart, are taken together); q and out in dt, the pool in pool_dt */
int ferry_decode_attention(const void *q, int64_t q_stride, const void *pool,
                           const int32_t *page_ids, const int64_t *page_starts,
                           const int32_t *kv_lens, int64_t seqs, int heads, int kv_heads,
                           int dim, int page_size, float scale, void *out, int dt, int pool_dt,
                           int window);

/* encoder.c: an encoder layer's steps between its products, for inputs packed one after
 * another (`lengths` tokens each). Attention: each token's query over the keys and values of
 * its own input's tokens, both ways (no mask within an input), per head; qkv [tokens,
 * 3 heads dim] (q | k | v columns) in dt, out [tokens, heads dim] in out_dt. Inputs longer
 * than max_len (> 0) are skipped: their rows of out are the caller's to fill. */
int ferry_encoder_attention(const void *qkv, int dt, const int64_t *lengths, int64_t inputs,
                            int64_t max_len, int heads, int dim, float scale, void *out,
                            int out_dt);
/* encoder.c: out[r] = layer_norm(x[r] + y[r]) * w + b over float32 rows (y in y_dt, NULL:
 * x's norm alone; out may be x), and where out16 is not NULL its bf16 copy, the input of
 * a next product that multiplies in bf16 */
int ferry_add_layer_norm(const float *x, const void *y, int y_dt, const float *w,
                         const float *b, float eps, int64_t rows, int dim, float *out,
                         void *out16);

/* gemv_bf16.c: y = x @ w.T (+ bias) for a few bf16 rows */
int ferry_gemv_bf16(const void *x, const void *w, const void *bias, void *y, int rows,
                    int64_t in, int64_t out);

/* argmax.c: out[r] = index of the largest logit of row r (first on ties, first NaN) */
int ferry_argmax(const void *logits, int64_t rows, int64_t n, int dt, int64_t *out);

/* moe.c: the mixture-of-experts MLP over float32 rows: softmax over the router's logits, the
 * top_k experts per row (weights renormalised where `normalize`), each expert's gated MLP on
 * the rows that chose it, the weighted outputs summed in the row's order of choice */
typedef struct {
    ferry_proj router;          /* [experts, hidden], float32 bias-free */
    const void *gate_up, *down; /* ferry_proj[experts] each: [2 inter, hidden], [hidden, inter] */
    int32_t experts, top_k, normalize, gelu;
    int64_t inter;
} ferry_moe;

int ferry_moe_mlp(const ferry_moe *M, const float *x, int64_t rows, int64_t hidden, float *out);

/* decode_layer.c: one decoder layer of a decode round (its products: proj.h).
 * A layer's weights in the activations' dt (norms) and its slice of the KV pool. A pre-norm
 * layer adds the attention output to the residual in post_norm; a sandwich layer (Gemma 3:
 * ffn_norm set) norms the attention output by post_norm, adds it in ffn_norm, and norms the
 * MLP's output by out_norm. */
typedef struct {
    const void *input_norm, *post_norm, *q_norm, *k_norm; /* q/k norms: NULL unless set */
    const void *ffn_norm, *out_norm;                      /* NULL: a pre-norm layer */
    ferry_proj qkv, o, gate_up, down;
    const ferry_moe *moe; /* the MLP is this mixture of experts (float32), not gate_up/down */
    void *pages; /* this layer of the KV pool, [pages, 2, kv_heads, page_size, dim] */
    int32_t window; /* attention over the last `window` positions (0: all) */
    int32_t gelu;   /* the MLP's activation: 1 GELU-tanh, 0 SiLU */
    int32_t rope;   /* ferry_decode_layers: its rotary tables, round->rope[rope] */
    int32_t local;  /* ferry_decode_layers: its K/V places, round->pool[local] */
} ferry_layer;

typedef struct {
    int64_t hidden, inter;
    int heads, kv_heads, dim, page_size;
    float eps, scale;
    int pool_dt, pad; /* the KV pool's dt */
} ferry_dims;

int ferry_decode_layer(const ferry_layer *L, const ferry_dims *D, int dt, int64_t rows,
                       void *x, void *residual, int first, const void *cos, const void *sin,
                       const int64_t *slots, const int32_t *page_ids, const int64_t *page_starts,
                       const int32_t *kv_lens, void *scratch);

/* A decode round's inputs that layers share: the rotary tables (cos, sin) of each of the
 * model's ropes, and the K/V places of each pool (the full layers', then the local ones') */
typedef struct {
    const void *cos, *sin;
} ferry_rope;

typedef struct {
    const int64_t *slots;
    const int32_t *page_ids;
    const int64_t *page_starts;
    const int32_t *kv_lens;
} ferry_places;

typedef struct {
    ferry_rope rope[2];
    ferry_places pool[2];
} ferry_round;

/* ferry_decode_layer over layers[0..n) in turn (the first starts the residual): one call a
 * round instead of one a layer */
int ferry_decode_layers(const ferry_layer *layers, int n, const ferry_dims *D, int dt,
                        int64_t rows, void *x, void *residual, const ferry_round *round,
                        void *scratch);

/* team.c: keep thread i of the calling thread's OpenMP team of `count` on CPU cpus[i];
 * returns the threads kept so (0 where none can be) */
int ferry_pin_team(const int32_t *cpus, int count);

#endif /* FERRY_KERNELS_H */
