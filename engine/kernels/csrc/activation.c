/* The gated MLP's activations: act(gate) * up, SiLU or GELU-tanh (Gemma). */
#include "kernels.h"

/* gelu_tanh(x) = 0.5 x (1 + tanh(y)) = x * sigmoid(2y), y = sqrt(2/pi) (x + 0.044715 x^3):
 * the SiLU form x / (1 + exp(-z)) with z = 2y instead of x */
#define GELU_C 1.5957691216057308f /* 2 sqrt(2/pi) */
#define GELU_K 0.044715f

/* one row: out[i] = act(gate[i]) * up[i] for gate_up's row [gate (n) | up (n)], rounding
 * act's result to dt first as the separate torch ops do; g: 2n floats of scratch */
void gated_row(const void *gate_up, void *out, int n, int dt, int gelu, float *g) {
    size_t es = ferry_elem(dt);
    float *u = g + n;
    ferry_load_row(gate_up, dt, g, n);
    ferry_load_row((const char *)gate_up + (size_t)n * es, dt, u, n);
    int i = 0;
#ifdef FERRY_AVX2
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(g + i), z = v;
        if (gelu)
            z = _mm256_mul_ps(_mm256_set1_ps(GELU_C),
                              _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_K), v),
                                              _mm256_mul_ps(v, v), v));
        __m256 e = ferry_exp8(_mm256_sub_ps(_mm256_setzero_ps(), z));
        _mm256_storeu_ps(g + i, _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
#endif
    for (; i < n; i++) {
        float v = g[i], z = gelu ? GELU_C * fmaf(GELU_K * v, v * v, v) : v;
        g[i] = v / (1.0f + expf(-z));
    }
    ferry_round_row(g, n, dt);
    for (i = 0; i < n; i++) g[i] *= u[i];
    ferry_store_row(out, dt, g, n);
}

/* every row of gate_up [rows, 2n] -> out [rows, n]. gelu: GELU-tanh, else SiLU. */
static int gated(const void *gate_up, void *out, int64_t rows, int n, int dt, int gelu) {
    size_t es = ferry_elem(dt);
    int failed = 0;
    /* rows are independent: split over the team for a prefill chunk's */
#pragma omp parallel if (rows * n >= (1 << 15))
    {
        float *g = ferry_scratch((size_t)n * 2 * sizeof(float), &failed);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!g) continue; /* the call fails as a whole; the team still meets the barrier */
            gated_row((const char *)gate_up + (size_t)r * 2 * n * es,
                      (char *)out + (size_t)r * n * es, n, dt, gelu, g);
        }
        free(g);
    }
    return failed ? FERRY_ENOMEM : FERRY_OK;
}

int ferry_silu_mul(const void *gate_up, void *out, int64_t rows, int n, int dt) {
    return gated(gate_up, out, rows, n, dt, 0);
}

int ferry_gelu_tanh_mul(const void *gate_up, void *out, int64_t rows, int n, int dt) {
    return gated(gate_up, out, rows, n, dt, 1);
}
