/* The mixture-of-experts MLP (Qwen3-MoE) over float32 rows, in one call: the router,
 * the choice of experts, and each chosen expert's gated MLP over just the rows that chose it
 * (so an expert's blocks are read once per call, and only when some row chose it). Both the
 * layer-by-layer path (engine/execution/model/layers/moe.py) and the fused decode layer call
 * it, so the two agree bit for bit. */
#include "kernels.h"

/* the top_k largest of p[0..n) (the lower index first on ties), largest first */
static void top_k(const float *p, int n, int k, int32_t *idx, float *val) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= idx[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        idx[j] = best;
        val[j] = p[best];
    }
}

/* row r's choice: softmax of its logits, the top k, renormalised where asked */
static void route(const ferry_moe *M, float *logits, int32_t *idx, float *w) {
    const int n = M->experts, k = M->top_k;
    float mx = logits[0], sum = 0.f;
    for (int e = 1; e < n; e++) mx = logits[e] > mx ? logits[e] : mx;
    for (int e = 0; e < n; e++) sum += logits[e] = expf(logits[e] - mx);
    for (int e = 0; e < n; e++) logits[e] /= sum;
    top_k(logits, n, k, idx, w);
    if (M->normalize) {
        float s = 0.f;
        for (int j = 0; j < k; j++) s += w[j];
        for (int j = 0; j < k; j++) w[j] /= s;
    }
}

int ferry_moe_mlp(const ferry_moe *M, const float *x, int64_t rows, int64_t hidden, float *out) {
    const int n = M->experts, k = M->top_k;
    const int64_t inter = M->inter;
    const ferry_proj *gate_up = (const ferry_proj *)M->gate_up;
    const ferry_proj *down = (const ferry_proj *)M->down;
    if (k < 1 || k > n || rows <= 0) return rows == 0 ? FERRY_OK : FERRY_EQUANT;
    /* logits [rows, n]; idx, w [rows, k]; xs [rows, hidden] the rows of one expert;
     * gu [rows, 2 inter]; act [rows, inter]; ys [rows * k, hidden]: (row, choice) outputs */
    size_t floats = (size_t)(rows * n + rows * k + rows * hidden + rows * 2 * inter +
                             rows * inter + rows * k * hidden);
    float *logits = (float *)malloc(floats * sizeof(float));
    int32_t *idx = (int32_t *)malloc((size_t)(rows * k) * sizeof(int32_t));
    int64_t *which = (int64_t *)malloc((size_t)rows * sizeof(int64_t));
    int rc = FERRY_ENOMEM;
    if (!logits || !idx || !which) goto done;
    float *w = logits + rows * n, *xs = w + rows * k, *gu = xs + rows * hidden;
    float *act = gu + rows * 2 * inter, *ys = act + rows * inter;
    if ((rc = proj_product(&M->router, x, rows, hidden, logits, n, FERRY_F32))) goto done;
    for (int64_t r = 0; r < rows; r++) route(M, logits + r * n, idx + r * k, w + r * k);
    for (int e = 0; e < n; e++) {
        int64_t m = 0; /* the (row, choice) slots that chose e, in row order */
        for (int64_t s = 0; s < rows * k; s++)
            if (idx[s] == e) {
                which[m] = s;
                memcpy(xs + m * hidden, x + (s / k) * hidden, (size_t)hidden * sizeof(float));
                m++;
            }
        if (!m) continue;
        if ((rc = proj_product(&gate_up[e], xs, m, hidden, gu, 2 * inter, FERRY_F32))) goto done;
        rc = (M->gelu ? ferry_gelu_tanh_mul : ferry_silu_mul)(gu, act, m, (int)inter, FERRY_F32);
        if (rc || (rc = proj_product(&down[e], act, m, inter, xs, hidden, FERRY_F32))) goto done;
        for (int64_t i = 0; i < m; i++)
            memcpy(ys + which[i] * hidden, xs + i * hidden, (size_t)hidden * sizeof(float));
    }
    /* out[r] = w0 y0 + w1 y1 + ..., added in the order of choice */
    for (int64_t r = 0; r < rows; r++) {
        float *o = out + r * hidden;
        for (int j = 0; j < k; j++) {
            const float *y = ys + (r * k + j) * hidden, wj = w[r * k + j];
            if (j == 0)
                for (int64_t i = 0; i < hidden; i++) o[i] = y[i] * wj;
            else
                for (int64_t i = 0; i < hidden; i++) o[i] += y[i] * wj;
        }
    }
    rc = FERRY_OK;
done:
    free(logits);
    free(idx);
    free(which);
    return rc;
}
