/* AVX-VNNI dot products (quant_simd.h, quant_lanes.h); quant_matmul.c calls them where the
 * CPU has it. */
#define QS_TARGET "avx2,fma,f16c,avxvnni"
#define QS_VNNI 1
#define QS_SUFFIX vnni
#include "quant_simd.h"

#ifdef Q_HAVE_AVX2
#define QL_VNNI 1
#define QL_SUFFIX vnni
#include "quant_lanes.h"
#include "quant_lanes_k.h"
#endif
