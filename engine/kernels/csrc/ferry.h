/* Shared by every kernel file: dtype codes and conversions, row load/store, error codes and
 * the one SIMD guard (FERRY_AVX2) with the vector helpers built on it.
 *
 * Plain C with raw pointers (called through ctypes), compiled once per machine by
 * engine/kernels/native.py, which also reads the prototypes of the csrc/ headers to bind
 * them: a non-static `ferry_*` prototype in a header is the one declaration of its signature.
 * dt codes: 0 = float32, 1 = bfloat16, 2 = float16. Arithmetic is float32; 16-bit results are
 * rounded to nearest even where the torch ops they replace round.
 * OpenMP comes from the libgomp torch already loaded, so there is one team per thread.
 */
#ifndef FERRY_H
#define FERRY_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#define FERRY_AVX2 1
#include <immintrin.h>
#endif

enum { FERRY_F32 = 0, FERRY_BF16 = 1, FERRY_F16 = 2 };

/* what the kernels that allocate return: 0, or FERRY_ENOMEM when malloc failed (the caller
 * raises MemoryError; nothing was half-written that the torch path would not redo) */
enum { FERRY_OK = 0, FERRY_ENOMEM = -1 };

/* return a failing kernel's code from the caller */
#define FERRY_TRY(call)                     \
    do {                                    \
        int ferry_rc_ = (call);             \
        if (ferry_rc_ != FERRY_OK) return ferry_rc_; \
    } while (0)

/* a float's bits and back (memcpy: no aliasing questions; compiles to a register move) */
static inline uint32_t ferry_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float ferry_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float ferry_bf16_to_f32(uint16_t v) {
    return ferry_bits_f32((uint32_t)v << 16);
}

static inline uint16_t ferry_f32_to_bf16(float f) {
    uint32_t u = ferry_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE half: exact widening (subnormals included) */
static inline float ferry_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1fu) {
        u = sign | 0x7f800000u | (man << 13); /* inf / NaN */
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    return ferry_bits_f32(u);
}

/* round to nearest even, as torch's .half(); overflow -> inf, NaN stays NaN */
static inline uint16_t ferry_f32_to_f16(float f) {
    uint32_t u = ferry_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;
    if (a >= 0x477ff000u) return sign | 0x7c00u; /* rounds to >= 65520: inf */
    if (a < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (a < 0x33000000u) return sign; /* below half the smallest subnormal */
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* 14 .. 24 */
        uint32_t half = man >> shift, rest = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1u))) half++;
        return sign | (uint16_t)half;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

static inline float ferry_round_dt(float f, int dt) {
    if (dt == FERRY_BF16) return ferry_bf16_to_f32(ferry_f32_to_bf16(f));
    if (dt == FERRY_F16) return ferry_f16_to_f32(ferry_f32_to_f16(f));
    return f;
}

/* v[0..n) rounded to dt and back, in place (nothing to do for float32). A pass of its own:
 * a loop that rounds each value as it computes it keeps a dt test per value and does not
 * vectorize even for float32 */
static inline void ferry_round_row(float *v, int64_t n, int dt) {
    if (dt == FERRY_F32) return;
    for (int64_t i = 0; i < n; i++) v[i] = ferry_round_dt(v[i], dt);
}

/* rows of n values between float32 and a storage dtype (FERRY_F32 / BF16 / F16) */
static inline void ferry_load_row(const void *src, int dt, float *dst, int64_t n) {
    const uint16_t *s = (const uint16_t *)src;
    int64_t i = 0;
    if (dt == FERRY_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
#if defined(FERRY_AVX2) && defined(__F16C__)
    /* eight at a time (both widenings are exact): a float16 KV pool's rows are read this way
     * by decode attention, row by row */
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(s + i));
        _mm256_storeu_ps(dst + i, dt == FERRY_BF16
            ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
            : _mm256_cvtph_ps(v));
    }
#endif
    for (; i < n; i++)
        dst[i] = dt == FERRY_BF16 ? ferry_bf16_to_f32(s[i]) : ferry_f16_to_f32(s[i]);
}

static inline void ferry_store_row(void *dst, int dt, const float *src, int64_t n) {
    uint16_t *d = (uint16_t *)dst;
    int64_t i = 0;
    if (dt == FERRY_F32) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
#if defined(FERRY_AVX2) && defined(__F16C__)
    if (dt == FERRY_F16) /* round to nearest even, as ferry_f32_to_f16 and torch round */
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128((__m128i *)(d + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++)
        d[i] = dt == FERRY_BF16 ? ferry_f32_to_bf16(src[i]) : ferry_f32_to_f16(src[i]);
}

static inline size_t ferry_elem(int dt) { return dt == FERRY_F32 ? 4 : 2; }

/* a thread's scratch of `bytes` inside a parallel region, or NULL with *failed set (the
 * thread then skips its rows but still meets the team's barriers; the call fails as a whole) */
static inline void *ferry_scratch(size_t bytes, int *failed) {
    void *p = malloc(bytes);
    if (!p) {
#pragma omp atomic write
        *failed = 1;
    }
    return p;
}

#ifdef FERRY_AVX2
/* e^x for 8 floats: Cephes' expf (range reduction by ln 2, degree-6 polynomial), within
 * ~2 float ulp; NaN stays NaN through the caller's own arithmetic */
static inline __m256 ferry_exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                   _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* lane k of the result = the sum of v[k]'s eight lanes */
static inline __m256 ferry_sum8x8(const __m256 v[8]) {
    __m256 ab = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 cd = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(ab, cd, 0x20),
                         _mm256_permute2f128_ps(ab, cd, 0x31));
}

static inline float ferry_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif /* FERRY_AVX2 */

/* softmax of sc[0..len) in place (attention's, decode and encoder alike) */
static inline void ferry_softmax(float *sc, int len) {
    float mx = -INFINITY, sum = 0.f;
    int p = 0;
#ifdef FERRY_AVX2
    if (len >= 8) { /* the maximum is the same in any order; one scalar chain was ~5% here */
        __m256 vm = _mm256_loadu_ps(sc);
        for (p = 8; p + 8 <= len; p += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(sc + p));
        float lanes[8];
        _mm256_storeu_ps(lanes, vm);
        for (int k = 0; k < 8; k++) mx = lanes[k] > mx ? lanes[k] : mx;
    }
#endif
    for (; p < len; p++) mx = sc[p] > mx ? sc[p] : mx;
    p = 0;
#ifdef FERRY_AVX2
    __m256 vsum = _mm256_setzero_ps(), vmx = _mm256_set1_ps(mx);
    for (; p + 8 <= len; p += 8) {
        __m256 e = ferry_exp8(_mm256_sub_ps(_mm256_loadu_ps(sc + p), vmx));
        _mm256_storeu_ps(sc + p, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vsum);
    for (int k = 0; k < 8; k++) sum += lanes[k];
#endif
    for (; p < len; p++) {
        sc[p] = expf(sc[p] - mx);
        sum += sc[p];
    }
    float inv = 1.0f / sum;
    for (p = 0; p < len; p++) sc[p] *= inv;
}

#endif /* FERRY_H */
