/* AVX512-VNNI dot products of the 32-value block types (Q4_0, Q4_1, Q5_0, Q8_0), on 256-bit
 * vectors: quant_simd.h compiled a third time, with the EVEX vpdpbusd and, for Q5_0, the
 * fifth bits applied through a mask register (one masked add) instead of spread to bytes. quant_matmul.c calls them where the CPU has AVX512-BW, -VL and -VNNI (the K-quants'
 * are quant_dot_avx512.c's). Same integer sums and float steps as the other paths. */
#define QS_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define QS_VNNI 2
#define QS_SUFFIX avx512
#define QS_BLOCKS32_ONLY 1
#include "quant_simd.h"
