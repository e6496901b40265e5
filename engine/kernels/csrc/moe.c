/* The mixture-of-experts MLP (Qwen3-MoE) over float32 rows, in one call: the router,
 * the choice of experts, and each chosen expert's gated MLP over just the rows that chose it
 * (so an expert's blocks are read once per call, and only when some row chose it). Both the
 * layer-by-layer path (engine/execution/model/layers/moe.py) and the fused decode layer call
 * it, so the two agree bit for bit.
 * A decode round gives most experts a row or two: their products, each too small to be worth
 * an OpenMP region, run together in one (q_plan work items, ferry_qmatmul's own bits), so a
 * layer opens a few regions instead of two per expert. An expert with many rows (a prefill
 * chunk's, or one the AMX kernel takes) runs its products one by one as a Linear would. */
#include "kernels.h"
#include "quant_impl.h"

/* experts with fewer rows share the one region (which also bounds the buffers they share, at
 * experts x 15 rows; more rows run one expert at a time from row 0) */
enum { SHARED_ROWS = 16 };
#define PARTS (int)(sizeof(((ferry_proj *)0)->part) / sizeof(ferry_weight))

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

/* the plans of one expert's product (P's parts side by side in y's columns, as
 * ferry_proj_product), no OpenMP region */
static int plan_parts(const ferry_proj *P, const float *x, int64_t m, int64_t in, float *y,
                      int64_t out, q_plan *plans) {
    int64_t col = 0;
    for (int i = 0; i < P->parts; i++) {
        const ferry_weight *w = &P->part[i];
        const float *bias = (const float *)P->bias;
        if (w->in != in || col + w->out > out) return FERRY_EQUANT;
        FERRY_TRY(q_plan_make(&plans[i], x, m, in, w, bias ? bias + col : NULL, y + col, out, 0));
        col += w->out;
    }
    return col == out ? FERRY_OK : FERRY_EQUANT;
}

/* whether expert e's m rows run their products one by one (ferry_proj_product) */
static int own_products(const ferry_moe *M, int e, int64_t m) {
    if (m >= SHARED_ROWS) return 1;
    const ferry_proj *gu = &((const ferry_proj *)M->gate_up)[e];
    const ferry_proj *dn = &((const ferry_proj *)M->down)[e];
    for (int i = 0; i < gu->parts; i++)
        if (ferry_qgemm_takes(&gu->part[i], m)) return 1;
    for (int i = 0; i < dn->parts; i++)
        if (ferry_qgemm_takes(&dn->part[i], m)) return 1;
    return 0;
}

/* first[p]: the number of plan p's first work item (its chunks follow the plans' before it);
 * returns the items of all np plans */
static int64_t number_items(const q_plan *plans, int np, int64_t *first) {
    int64_t items = 0;
    for (int p = 0; p < np; p++) {
        first[p] = items;
        items += plans[p].chunks;
    }
    return items;
}

/* item i of a product list: the plan it belongs to and its chunk (plans' chunks in order) */
static void run_item(q_plan *plans, const int64_t *first, int nplans, int64_t i) {
    int lo = 0, hi = nplans - 1; /* the last plan whose first item is <= i */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (first[mid] <= i) lo = mid; else hi = mid - 1;
    }
    q_plan_chunk(&plans[lo], i - first[lo]);
}

/* the experts in `shared` (their rows at off[e] of xs, in slot order) through their gated MLPs
 * in one OpenMP region: every gate_up product's chunks, then the activations, then every
 * down product's chunks; the outputs land in xs over the inputs */
static int run_shared(const ferry_moe *M, const int32_t *shared, int ns, const int64_t *cnt,
                      const int64_t *off, float *xs, float *gu, float *act, int64_t hidden) {
    const int64_t inter = M->inter;
    const ferry_proj *gate_up = (const ferry_proj *)M->gate_up;
    const ferry_proj *down = (const ferry_proj *)M->down;
    const int np = ns * PARTS; /* plan slots: expert j's parts from j * PARTS */
    q_plan *plans = (q_plan *)calloc((size_t)np * 2, sizeof(q_plan));
    int64_t *first = (int64_t *)malloc((size_t)np * 2 * sizeof(int64_t));
    int rc = FERRY_ENOMEM;
    if (!plans || !first) goto done;
    q_plan *gplans = plans, *dplans = plans + np;
    int64_t *gfirst = first, *dfirst = first + np, gitems = 0, ditems = 0; /* set in the region */
    int bad = FERRY_OK;
#pragma omp parallel
    {
        /* the gate_up plans (each quantizes its expert's rows) */
#pragma omp for schedule(dynamic, 1)
        for (int j = 0; j < ns; j++) {
            int e = shared[j];
            int r = plan_parts(&gate_up[e], xs + off[e] * hidden, cnt[e], hidden,
                               gu + off[e] * 2 * inter, 2 * inter, gplans + j * PARTS);
            if (r) {
#pragma omp atomic write
                bad = r;
            }
        }
#pragma omp single /* implicit barrier after: every thread sees gfirst */
        gitems = number_items(gplans, np, gfirst);
        if (!bad) {
#pragma omp for schedule(guided, 4)
            for (int64_t i = 0; i < gitems; i++) run_item(gplans, gfirst, np, i);
        }
        /* activations, and the down plans over them */
        int failed = 0;
        float *g = (float *)ferry_scratch((size_t)inter * 2 * sizeof(float), &failed);
        if (failed) {
#pragma omp atomic write
            bad = FERRY_ENOMEM;
        }
#pragma omp for schedule(dynamic, 1)
        for (int j = 0; j < ns; j++) {
            if (!g) continue; /* the call fails as a whole; the team still meets the barrier */
            int e = shared[j];
            for (int64_t i = off[e]; i < off[e] + cnt[e]; i++)
                gated_row(gu + i * 2 * inter, act + i * inter, (int)inter, FERRY_F32, M->gelu, g);
            int r = plan_parts(&down[e], act + off[e] * inter, cnt[e], inter,
                               xs + off[e] * hidden, hidden, dplans + j * PARTS);
            if (r) {
#pragma omp atomic write
                bad = r;
            }
        }
        free(g);
#pragma omp single
        ditems = number_items(dplans, np, dfirst);
        if (!bad) {
#pragma omp for schedule(guided, 4)
            for (int64_t i = 0; i < ditems; i++) run_item(dplans, dfirst, np, i);
        }
    }
    rc = bad;
done:
    if (plans)
        for (int p = 0; p < 2 * np; p++) q_plan_free(&plans[p]);
    free(plans);
    free(first);
    return rc;
}

int ferry_moe_mlp(const ferry_moe *M, const float *x, int64_t rows, int64_t hidden, float *out) {
    const int n = M->experts, k = M->top_k;
    const int64_t inter = M->inter;
    const ferry_proj *gate_up = (const ferry_proj *)M->gate_up;
    const ferry_proj *down = (const ferry_proj *)M->down;
    if (k < 1 || k > n || rows <= 0) return rows == 0 ? FERRY_OK : FERRY_EQUANT;
    /* slots: (row, choice) pairs, s = row * k + choice. cnt[e]: how many slots chose expert e;
     * off[e]: where its rows start in `order` (and, for a shared expert, in xs/gu/act);
     * order[off[e] + i]: its i-th slot, in row order. shared, own: the experts of each kind */
    int64_t *cnt = (int64_t *)calloc((size_t)n * 3, sizeof(int64_t));
    int64_t *order = (int64_t *)malloc((size_t)(rows * k) * sizeof(int64_t));
    int32_t *idx = (int32_t *)malloc((size_t)(rows * k + 2 * n) * sizeof(int32_t));
    float *logits = (float *)malloc((size_t)(rows * n + rows * k) * sizeof(float));
    float *xs = NULL, *ys = NULL;
    int rc = FERRY_ENOMEM;
    if (!cnt || !order || !idx || !logits) goto done;
    int64_t *off = cnt + n, *fill = off + n;
    int32_t *shared = idx + rows * k, *own = shared + n;
    float *w = logits + rows * n;
    if ((rc = ferry_proj_product(&M->router, x, rows, hidden, logits, n, FERRY_F32))) goto done;
    for (int64_t r = 0; r < rows; r++) route(M, logits + r * n, idx + r * k, w + r * k);
    for (int64_t s = 0; s < rows * k; s++) cnt[idx[s]]++;
    int ns = 0, no = 0;
    int64_t S = 0, most = 0; /* the shared experts' rows; the most rows of an own expert */
    for (int e = 0; e < n; e++)
        if (cnt[e] && own_products(M, e, cnt[e])) {
            own[no++] = e;
            most = cnt[e] > most ? cnt[e] : most;
        } else if (cnt[e]) {
            shared[ns++] = e;
            off[e] = S;
            S += cnt[e];
        }
    for (int64_t j = 0, at = S; j < no; j++) { /* own experts' slots after the shared ones */
        off[own[j]] = at;
        at += cnt[own[j]];
    }
    for (int64_t s = 0; s < rows * k; s++) order[off[idx[s]] + fill[idx[s]]++] = s;
    /* xs [B, hidden]: an expert's input rows, then its output rows; gu [B, 2 inter]; act
     * [B, inter]; B: the shared experts' rows together, or one own expert's. ys [rows * k,
     * hidden]: each slot's output */
    int64_t B = S > most ? S : most;
    xs = (float *)malloc((size_t)(B * (hidden + 3 * inter)) * sizeof(float));
    ys = (float *)malloc((size_t)(rows * k * hidden) * sizeof(float));
    if (!xs || !ys) goto done;
    float *gu = xs + B * hidden, *act = gu + B * 2 * inter;
    if (ns) {
        for (int64_t i = 0; i < S; i++)
            memcpy(xs + i * hidden, x + (order[i] / k) * hidden, (size_t)hidden * sizeof(float));
        if ((rc = run_shared(M, shared, ns, cnt, off, xs, gu, act, hidden))) goto done;
        for (int64_t i = 0; i < S; i++)
            memcpy(ys + order[i] * hidden, xs + i * hidden, (size_t)hidden * sizeof(float));
    }
    for (int j = 0; j < no; j++) { /* each from row 0 of the buffers */
        const int e = own[j];
        const int64_t m = cnt[e], *which = order + off[e];
        for (int64_t i = 0; i < m; i++)
            memcpy(xs + i * hidden, x + (which[i] / k) * hidden, (size_t)hidden * sizeof(float));
        rc = ferry_proj_product(&gate_up[e], xs, m, hidden, gu, 2 * inter, FERRY_F32);
        if (rc) goto done;
        rc = (M->gelu ? ferry_gelu_tanh_mul : ferry_silu_mul)(gu, act, m, (int)inter, FERRY_F32);
        if (rc || (rc = ferry_proj_product(&down[e], act, m, inter, xs, hidden, FERRY_F32)))
            goto done;
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
    free(cnt);
    free(order);
    free(idx);
    free(logits);
    free(xs);
    free(ys);
    return rc;
}
