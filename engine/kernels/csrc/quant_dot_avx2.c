/* AVX2 dot products (quant_simd.h), compiled for AVX2 whatever -march says; quant_matmul.c
 * calls them only where the CPU has AVX2, FMA and F16C. */
#pragma GCC optimize("fp-contract=off") /* dequantization rounds as gguf-py: no fused mul-add */
#define QS_TARGET "avx2,fma,f16c"
#define QS_VNNI 0
#define QS_SUFFIX avx2
#include "quant_simd.h"

#ifdef Q_HAVE_AVX2
#define QL_VNNI 0
#define QL_SUFFIX avx2
#include "quant_lanes.h"
#include "quant_lanes_k.h"

#define QD_TARGET QS_TARGET
#define QD_SUFFIX avx2
#define QD_CVT512 0
#include "quant_deq.h"
#undef QD_TARGET
#undef QD_SUFFIX
#undef QD_CVT512
#define QD_TARGET QS_TARGET ",avx512f,avx512vl,avx512bw,avx512bf16"
#define QD_SUFFIX avx512bf16
#define QD_CVT512 1
#include "quant_deq.h"
#endif
