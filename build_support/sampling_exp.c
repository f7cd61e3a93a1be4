/* exp over a row of logits, vectorized: the softmax weights of a verify round's candidates (sampling_round.c)
   and a row's log-sum-exp (sampling_logprobs.c). At Gemma 4's 262,144 tokens libm's exp() in float64 took
   ~1 ms a row, more than the rest of a round. After sampling_prefilter.c (its SSE2 header). */

/* exp(x) for x <= 0 (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-5 polynomial in r, then 2^n in the
   exponent); below -87 the result is 0 (a float's exp would be denormal there: nothing a sum of exps notices) */
#define MTP_EXP_LOW   -87.0f
#define MTP_LOG2E      1.44269504088896341f
#define MTP_LN2_HI     0.693359375f
#define MTP_LN2_LO    -2.12194440e-4f
#define MTP_EXP_P0     1.9875691500e-4f
#define MTP_EXP_P1     1.3981999507e-3f
#define MTP_EXP_P2     8.3334519073e-3f
#define MTP_EXP_P3     4.1665795894e-2f
#define MTP_EXP_P4     1.6666665459e-1f
#define MTP_EXP_P5     5.0000001201e-1f

static float mtp_exp_nonpositive(float x) {
    if (!(x >= MTP_EXP_LOW)) { /* NaN and -inf too */
        return 0.0f;
    }
    const int32_t e = (int32_t) (x * MTP_LOG2E - 0.5f); /* toward zero: the nearest integer for x <= 0 */
    const float r = (x - (float) e * MTP_LN2_HI) - (float) e * MTP_LN2_LO;
    float y = ((((MTP_EXP_P0 * r + MTP_EXP_P1) * r + MTP_EXP_P2) * r + MTP_EXP_P3) * r + MTP_EXP_P4) * r + MTP_EXP_P5;
    y = y * r * r + r + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = (e + 127) << 23;
    return y * scale.f;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MTP_HAVE_AVX2_PATH 1

/* mtp_exp_weights' loop, eight at a time with FMA, for the CPUs that have AVX2 (the module is built for the
   baseline x86-64, SSE2 only): the same polynomial, 3-4x as fast */
__attribute__((target("avx2,fma")))
static double mtp_exp_weights_avx2(const float * x_in, int32_t n, float top, double * out, int32_t * done) {
    const __m256 vtop = _mm256_set1_ps(top), low = _mm256_set1_ps(MTP_EXP_LOW), log2e = _mm256_set1_ps(MTP_LOG2E);
    const __m256 half = _mm256_set1_ps(0.5f), hi = _mm256_set1_ps(MTP_LN2_HI), lo = _mm256_set1_ps(MTP_LN2_LO);
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(x_in + i), vtop);
        const __m256 keep = _mm256_cmp_ps(x, low, _CMP_GE_OQ); /* false for NaN and -inf too */
        const __m256 xk = _mm256_and_ps(x, keep);
        const __m256i e = _mm256_cvttps_epi32(_mm256_fmsub_ps(xk, log2e, half));
        const __m256 ef = _mm256_cvtepi32_ps(e);
        const __m256 r = _mm256_fnmadd_ps(ef, lo, _mm256_fnmadd_ps(ef, hi, xk));
        __m256 y = _mm256_set1_ps(MTP_EXP_P0);
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(MTP_EXP_P1));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(MTP_EXP_P2));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(MTP_EXP_P3));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(MTP_EXP_P4));
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(MTP_EXP_P5));
        y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(y, r), r, r), one);
        const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
        y = _mm256_and_ps(_mm256_mul_ps(y, scale), keep);
        const __m256d y0 = _mm256_cvtps_pd(_mm256_castps256_ps128(y)), y1 = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
        if (out != NULL) {
            _mm256_storeu_pd(out + i, y0);
            _mm256_storeu_pd(out + i + 4, y1);
        }
        acc0 = _mm256_add_pd(acc0, y0);
        acc1 = _mm256_add_pd(acc1, y1);
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(acc0, acc1));
    *done = i;
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}
#endif

/* the tests' switch: the baseline path on a CPU that has AVX2 too, so that one machine checks both */
static int mtp_exp_baseline = 0;

static void mtp_sampling_use_baseline(int on) {
    mtp_exp_baseline = on;
}

/* The weights exp(x[i] - top) for i in [0, n), each computed in float (top: the maximum of x), written to out
   as float64 unless out is NULL; returns their sum, in float64. */
static double mtp_exp_weights(const float * x, int32_t n, float top, double * out) {
    int32_t i = 0;
    double sum = 0.0;
#if defined(MTP_HAVE_AVX2_PATH)
    if (!mtp_exp_baseline && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        sum = mtp_exp_weights_avx2(x, n, top, out, &i);
    } else
#endif
    {
#if defined(__SSE2__)
        const __m128 vtop = _mm_set1_ps(top), low = _mm_set1_ps(MTP_EXP_LOW), log2e = _mm_set1_ps(MTP_LOG2E);
        const __m128 half = _mm_set1_ps(0.5f), hi = _mm_set1_ps(MTP_LN2_HI), lo = _mm_set1_ps(MTP_LN2_LO);
        const __m128 one = _mm_set1_ps(1.0f);
        __m128d acc0 = _mm_setzero_pd(), acc1 = _mm_setzero_pd();
        for (; i + 4 <= n; i += 4) {
            const __m128 v = _mm_sub_ps(_mm_loadu_ps(x + i), vtop);
            const __m128 keep = _mm_cmpge_ps(v, low); /* false for NaN and -inf too */
            const __m128i e = _mm_cvttps_epi32(_mm_sub_ps(_mm_mul_ps(_mm_and_ps(v, keep), log2e), half));
            const __m128 ef = _mm_cvtepi32_ps(e);
            const __m128 r = _mm_sub_ps(_mm_sub_ps(_mm_and_ps(v, keep), _mm_mul_ps(ef, hi)), _mm_mul_ps(ef, lo));
            __m128 y = _mm_set1_ps(MTP_EXP_P0);
            y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(MTP_EXP_P1));
            y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(MTP_EXP_P2));
            y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(MTP_EXP_P3));
            y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(MTP_EXP_P4));
            y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(MTP_EXP_P5));
            y = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(y, r), r), r), one);
            const __m128 scale = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(e, _mm_set1_epi32(127)), 23));
            y = _mm_and_ps(_mm_mul_ps(y, scale), keep);
            const __m128d y0 = _mm_cvtps_pd(y), y1 = _mm_cvtps_pd(_mm_movehl_ps(y, y));
            if (out != NULL) {
                _mm_storeu_pd(out + i, y0);
                _mm_storeu_pd(out + i + 2, y1);
            }
            acc0 = _mm_add_pd(acc0, y0);
            acc1 = _mm_add_pd(acc1, y1);
        }
        double lanes[2];
        _mm_storeu_pd(lanes, _mm_add_pd(acc0, acc1));
        sum = lanes[0] + lanes[1];
#endif
    }
    for (; i < n; ++i) {
        const double w = mtp_exp_nonpositive(x[i] - top);
        if (out != NULL) {
            out[i] = w;
        }
        sum += w;
    }
    return sum;
}

