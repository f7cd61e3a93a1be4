// Checks ggml's CPU ARGMAX (patch 0128) against the loop it replaced, on rows built to catch a wrong pick:
// ties (the answer is the last index of the maximum), the maximum in the vector part or in the tail, +-0,
// infinities, rows of -inf, NaNs (which restart the loop's running maximum), short rows (the loop itself).
// Prints one JSON object: rows checked, rows whose index differs, and the first such row's case.
//
// usage: argmax_check [threads]

#include "ggml.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t next_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

// ggml's argmax before the patch: a running maximum, the index of the last value equal to it
static int reference(const float * x, int n) {
    float max = -INFINITY;
    int idx = 0;
    for (int i = 0; i < n; ++i) {
        max = max > x[i] ? max : x[i];
        if (max == x[i]) { idx = i; }
    }
    return idx;
}

enum { N_CASES = 9 };
static const char * case_names[N_CASES] = { "random", "ties", "max in tail", "signed zeros", "+inf twice",
                                            "all -inf", "nan", "nan last", "few values" };

static void fill(float * x, int n, int c) {
    for (int i = 0; i < n; ++i) {  // coarse values: ties happen by themselves too
        x[i] = (float) ((int) (next_u64() % 2001) - 1000) / 64.0f;
    }
    const int a = (int) (next_u64() % (uint64_t) n);
    const int b = (int) (next_u64() % (uint64_t) n);
    switch (c) {
        case 1: x[a] = 100.0f; x[b] = 100.0f; break;
        case 2: x[n - 1 - (int) (next_u64() % 7)] = 100.0f; break;
        case 3: for (int i = 0; i < n; ++i) { x[i] = -1.0f; } x[a] = 0.0f; x[b] = -0.0f; break;
        case 4: x[a] = INFINITY; x[b] = INFINITY; break;
        case 5: for (int i = 0; i < n; ++i) { x[i] = -INFINITY; } break;
        case 6: x[a] = NAN; x[b] = 100.0f; break;
        case 7: x[n - 1] = NAN; break;
        default: break;
    }
}

int main(int argc, char ** argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    const int sizes[] = { 262144, 262147, 4099, 200, 71, 64, 63, 9, 1 };
    const int n_sizes = (int) (sizeof(sizes) / sizeof(sizes[0]));
    const int rows = 24;
    int checked = 0, wrong = 0, first_size = 0, first_case = -1;
    for (int si = 0; si < n_sizes; ++si) {
        const int n = sizes[si];
        struct ggml_init_params ip = { (size_t) n * rows * sizeof(float) + rows * sizeof(int32_t)
                                       + 4 * ggml_tensor_overhead() + ggml_graph_overhead() + 1024, NULL, false };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, rows);
        struct ggml_tensor * y = ggml_argmax(ctx, x);
        struct ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, y);
        for (int r = 0; r < rows; ++r) {
            fill((float *) x->data + (size_t) r * n, n, n < 16 ? 8 : r % N_CASES);
        }
        if (ggml_graph_compute_with_ctx(ctx, gf, threads) != GGML_STATUS_SUCCESS) {
            printf("{\"error\": \"compute failed\"}\n");
            return 2;
        }
        for (int r = 0; r < rows; ++r) {
            const int want = reference((const float *) x->data + (size_t) r * n, n);
            const int got = ((const int32_t *) y->data)[r];
            checked++;
            if (got != want) {
                if (wrong++ == 0) { first_size = n; first_case = n < 16 ? 8 : r % N_CASES; }
            }
        }
        ggml_free(ctx);
    }
    printf("{\"rows\": %d, \"wrong\": %d, \"first_wrong\": \"%s, %d values\"}\n", checked, wrong,
           first_case >= 0 ? case_names[first_case] : "none", first_size);
    return 0;
}
