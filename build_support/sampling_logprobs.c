/* One row's log-softmax at the emitted token and its best alternatives (mtp_bindings.generation.logprobs):
   the prefilter's candidates, then one vectorized exp-sum over the row. After sampling_round.c (its status
   codes). */

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

/* mtp_exp_sum's loop, eight at a time with FMA, for the CPUs that have AVX2 (the module is built for the
   baseline x86-64, SSE2 only): the same polynomial, 3-4x as fast */
__attribute__((target("avx2,fma")))
static double mtp_exp_sum_avx2(const float * row, int32_t n, float top, int32_t * done) {
    const __m256 vtop = _mm256_set1_ps(top), low = _mm256_set1_ps(MTP_EXP_LOW), log2e = _mm256_set1_ps(MTP_LOG2E);
    const __m256 half = _mm256_set1_ps(0.5f), hi = _mm256_set1_ps(MTP_LN2_HI), lo = _mm256_set1_ps(MTP_LN2_LO);
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(row + i), vtop);
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
        acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(y)));
        acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)));
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

/* sum over row[0..n) of exp(row[i] - top), in float64: top is the row's maximum */
static double mtp_exp_sum(const float * row, int32_t n, float top) {
#if defined(MTP_HAVE_AVX2_PATH)
    if (!mtp_exp_baseline && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        int32_t done = 0;
        double sum = mtp_exp_sum_avx2(row, n, top, &done);
        for (; done < n; ++done) {
            sum += mtp_exp_nonpositive(row[done] - top);
        }
        return sum;
    }
#endif
    int32_t i = 0;
    double sum = 0.0;
#if defined(__SSE2__)
    const __m128 vtop = _mm_set1_ps(top), low = _mm_set1_ps(MTP_EXP_LOW), log2e = _mm_set1_ps(MTP_LOG2E);
    const __m128 half = _mm_set1_ps(0.5f), hi = _mm_set1_ps(MTP_LN2_HI), lo = _mm_set1_ps(MTP_LN2_LO);
    const __m128 one = _mm_set1_ps(1.0f);
    __m128d acc0 = _mm_setzero_pd(), acc1 = _mm_setzero_pd();
    for (; i + 4 <= n; i += 4) {
        const __m128 x = _mm_sub_ps(_mm_loadu_ps(row + i), vtop);
        const __m128 keep = _mm_cmpge_ps(x, low); /* false for NaN and -inf too */
        const __m128i e = _mm_cvttps_epi32(_mm_sub_ps(_mm_mul_ps(_mm_and_ps(x, keep), log2e), half));
        const __m128 ef = _mm_cvtepi32_ps(e);
        const __m128 r = _mm_sub_ps(_mm_sub_ps(_mm_and_ps(x, keep), _mm_mul_ps(ef, hi)), _mm_mul_ps(ef, lo));
        __m128 y = _mm_set1_ps(MTP_EXP_P0);
        y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(MTP_EXP_P1));
        y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(MTP_EXP_P2));
        y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(MTP_EXP_P3));
        y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(MTP_EXP_P4));
        y = _mm_add_ps(_mm_mul_ps(y, r), _mm_set1_ps(MTP_EXP_P5));
        y = _mm_add_ps(_mm_add_ps(_mm_mul_ps(_mm_mul_ps(y, r), r), r), one);
        const __m128 scale = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(e, _mm_set1_epi32(127)), 23));
        y = _mm_and_ps(_mm_mul_ps(y, scale), keep);
        acc0 = _mm_add_pd(acc0, _mm_cvtps_pd(y));
        acc1 = _mm_add_pd(acc1, _mm_cvtps_pd(_mm_movehl_ps(y, y)));
    }
    double lanes[2];
    _mm_storeu_pd(lanes, _mm_add_pd(acc0, acc1));
    sum = lanes[0] + lanes[1];
#endif
    for (; i < n; ++i) {
        sum += mtp_exp_nonpositive(row[i] - top);
    }
    return sum;
}

/* The log-softmax of row[0..n): its log-sum-exp in *out_lse, and the k (<= n) most likely tokens, highest logit
   first (the lower id of a tie first), in top_ids with their log-probabilities in top_logprobs. scratch: room
   for n ids. Returns how many were written (k), or MTP_ROUND_ERR_MEMORY. */
static int32_t mtp_row_logprobs(const float * row, int32_t n, int32_t k, int32_t * scratch, int32_t * top_ids,
                                double * top_logprobs, double * out_lse) {
    if (row == NULL || n < 1 || k < 0 || k > n || out_lse == NULL || (k > 0 && (scratch == NULL || top_ids == NULL || top_logprobs == NULL))) {
        return MTP_ROUND_ERR_CHAIN;
    }
    float top = -INFINITY;
    int32_t m = -1;
    if (k > 0) {
        m = mtp_top_k_superset(row, n, k, scratch);
        if (m == -2) {
            return MTP_ROUND_ERR_MEMORY;
        }
        if (m < 0) { /* a short row: every token is a candidate */
            for (int32_t i = 0; i < n; ++i) {
                scratch[i] = i;
            }
            m = n;
        }
        for (int32_t j = 0; j < m; ++j) { /* the candidates hold the row's maximum */
            top = row[scratch[j]] > top ? row[scratch[j]] : top;
        }
    } else {
        top = mtp_row_max(row, n, NULL);
    }
    const double lse = (double) top + log(mtp_exp_sum(row, n, top));
    *out_lse = lse;
    for (int32_t j = 0; j < k; ++j) { /* a selection of the k best among the candidates */
        int32_t best = j;
        for (int32_t c = j + 1; c < m; ++c) {
            const float a = row[scratch[c]], b = row[scratch[best]];
            if (a > b || (a == b && scratch[c] < scratch[best])) {
                best = c;
            }
        }
        const int32_t t = scratch[j];
        scratch[j] = scratch[best];
        scratch[best] = t;
        top_ids[j] = scratch[j];
        top_logprobs[j] = (double) row[scratch[j]] - lse;
    }
    return k;
}
