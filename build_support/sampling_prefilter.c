/* The sampler chain's top-k prefilter (mtp_bindings.generation.chain.top_k_superset) and the vectorized block
   maxima it and the others use. C compiled into the cffi module: build_support/gen_ffi.py appends the
   build_support/sampling_*.c files to the module's source after llama.h, in the order of HELPERS_C there. At
   Gemma 4's 262,144 tokens numpy took 90-220 us a row for what is one pass over the row here. */
#include <math.h>
#include <stdlib.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#define MTP_TOP_K_BLOCK 128

static float mtp_block_max(const float * x, int32_t n) {
    int32_t i = 0;
    float m = x[0];
#if defined(__SSE2__)
    if (n >= 32) {
        /* eight running maxima: one max's latency is four of its issue slots */
        __m128 a[8];
        for (int j = 0; j < 8; ++j) {
            a[j] = _mm_loadu_ps(x + 4 * j);
        }
        for (i = 32; i + 32 <= n; i += 32) {
            for (int j = 0; j < 8; ++j) {
                a[j] = _mm_max_ps(a[j], _mm_loadu_ps(x + i + 4 * j));
            }
        }
        for (int j = 1; j < 8; ++j) {
            a[0] = _mm_max_ps(a[0], a[j]);
        }
        float v[4];
        _mm_storeu_ps(v, a[0]);
        m = v[0] > v[1] ? v[0] : v[1];
        m = m > v[2] ? m : v[2];
        m = m > v[3] ? m : v[3];
    }
#elif defined(__ARM_NEON) && defined(__aarch64__)
    if (n >= 4) {
        float32x4_t a = vld1q_f32(x);
        for (i = 4; i + 4 <= n; i += 4) {
            a = vmaxq_f32(a, vld1q_f32(x + i));
        }
        m = vmaxvq_f32(a);
    }
#endif
    for (; i < n; ++i) {
        m = x[i] > m ? x[i] : m;
    }
    return m;
}

/* the maximum of row[0..n), and in *block the first MTP_TOP_K_BLOCK-token block that holds it (NULL: not asked) */
static float mtp_row_max(const float * row, int32_t n, int32_t * block) {
    float best = -INFINITY;
    int32_t best_block = 0;
    for (int32_t b = 0; b * MTP_TOP_K_BLOCK < n; ++b) {
        const int32_t len = b * MTP_TOP_K_BLOCK + MTP_TOP_K_BLOCK <= n ? MTP_TOP_K_BLOCK : n - b * MTP_TOP_K_BLOCK;
        const float m = mtp_block_max(row + b * MTP_TOP_K_BLOCK, len);
        if (m > best || b == 0) {
            best = m;
            best_block = b;
        }
    }
    if (block != NULL) {
        *block = best_block;
    }
    return best;
}

/* the k-th highest of a[0..n) (1 <= k <= n), reordering a: Hoare's selection */
static float mtp_kth_highest(float * a, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1;
    const int32_t want = k - 1;
    while (lo < hi) {
        const float pivot = a[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) {
                const float t = a[i]; a[i] = a[j]; a[j] = t;
                i++; j--;
            }
        }
        if (want <= j) {
            hi = j;
        } else if (want >= i) {
            lo = i;
        } else {
            break;
        }
    }
    return a[want];
}

/* The ids (ascending) of a few tokens of row[0..n) among which are its k highest logits, with every token
   tied with the k-th highest: the k-th highest of the blocks' maxima is k distinct values, so each of the k
   highest logits is at least that floor, and only the blocks whose maximum reaches it are read again. Those
   above the floor where they are k or more (a row with many tokens at one floor value, as a scaled pair's
   padding, keeps none of them), else those at or above it. Returns how many ids were written to out (room for
   n), -1 where that saves nothing (fewer than 8 k blocks), -2 when out of memory. */
static int32_t mtp_top_k_superset(const float * row, int32_t n, int32_t k, int32_t * out) {
    const int32_t B = MTP_TOP_K_BLOCK;
    const int32_t n_blocks = (n + B - 1) / B;
    if (k <= 0 || n / B < 8 * k) {
        return -1;
    }
    float * maxima = (float *) malloc(2 * (size_t) n_blocks * sizeof(float));
    if (maxima == NULL) {
        return -2;
    }
    float * scratch = maxima + n_blocks;
    for (int32_t b = 0; b < n_blocks; ++b) {
        const int32_t len = b * B + B <= n ? B : n - b * B;
        maxima[b] = scratch[b] = mtp_block_max(row + b * B, len);
    }
    const float floor = mtp_kth_highest(scratch, n_blocks, k);
    int32_t m = 0;
    for (int strict = 1; strict >= 0; --strict) {
        m = 0;
        for (int32_t b = 0; b < n_blocks; ++b) {
            if (strict ? maxima[b] > floor : maxima[b] >= floor) {
                const int32_t end = b * B + B <= n ? b * B + B : n;
                for (int32_t i = b * B; i < end; ++i) {
                    if (strict ? row[i] > floor : row[i] >= floor) {
                        out[m++] = i;
                    }
                }
            }
        }
        if (m >= k) {
            break;
        }
    }
    free(maxima);
    return m;
}

