/* AVX2 dot products (quant_simd.h), compiled for AVX2 whatever -march says; quant_matmul.c
 * calls them only where the CPU has AVX2, FMA and F16C. */
#pragma GCC optimize("fp-contract=off") /* dequantization rounds as gguf-py: no fused mul-add */
#define QS_TARGET "avx2,fma,f16c"
#define QS_VNNI 0
#define QS_SUFFIX avx2
#include "quant_simd.h"
