// Checks ggml's CPU GET_ROWS on quantized weights against the type's reference dequantizer, bit for bit.
//
// For each type, quantizes a rows x cols matrix of random floats (ggml_quantize_chunk), gathers rows by a list of
// ids (every row once, shuffled, and some twice) with GGML_OP_GET_ROWS on the CPU backend, and compares each
// gathered row with ggml_get_type_traits(type)->to_float of that row. Prints one JSON object: per type, the
// floats whose bits differ. Patch 0127 gives Q6_K an AVX2 dequantizer there (the centroid head's gather).
//
// usage: get_rows_check [threads]

#include "ggml.h"
#include "ggml-cpu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 88172645463325252ull;

static uint64_t next_u64(void) {  // xorshift64
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float next_normal(void) {  // sum of uniforms: tails are not the point here
    float s = 0.0f;
    for (int i = 0; i < 4; ++i) {
        s += (float) (next_u64() >> 40) / (float) (1 << 24) - 0.5f;
    }
    return s;
}

int main(int argc, char ** argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    const enum ggml_type types[] = { GGML_TYPE_Q6_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q8_0 };
    const int64_t cols = 1536;
    const int64_t rows = 300;
    const int64_t n_ids = rows + 37;

    printf("{");
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); ++t) {
        const enum ggml_type type = types[t];
        const size_t row_size = ggml_row_size(type, cols);
        struct ggml_init_params ip = { rows * row_size + (size_t) (n_ids * cols + rows * cols) * sizeof(float) + n_ids * 4
                                       + 8 * ggml_tensor_overhead() + ggml_graph_overhead() + 4096, NULL, false };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * w   = ggml_new_tensor_2d(ctx, type, cols, rows);
        struct ggml_tensor * ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_ids);
        struct ggml_tensor * out = ggml_get_rows(ctx, w, ids);
        struct ggml_cgraph * gf  = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);

        float * src = malloc(rows * cols * sizeof(float));
        for (int64_t i = 0; i < rows * cols; ++i) {
            src[i] = next_normal() * (1.0f + (float) (i / cols % 7));  // rows of different scales
        }
        ggml_quantize_chunk(type, src, w->data, 0, rows, cols, NULL);

        int32_t * id = (int32_t *) ids->data;
        for (int64_t i = 0; i < n_ids; ++i) {
            id[i] = (int32_t) (i < rows ? i : next_u64() % rows);
        }
        for (int64_t i = rows - 1; i > 0; --i) {  // shuffle the first pass
            const int64_t j = (int64_t) (next_u64() % (uint64_t) (i + 1));
            const int32_t tmp = id[i]; id[i] = id[j]; id[j] = tmp;
        }

        if (ggml_graph_compute_with_ctx(ctx, gf, threads) != GGML_STATUS_SUCCESS) {
            printf("\"error\": \"compute failed\"}\n");
            return 2;
        }

        const ggml_to_float_t to_float = ggml_get_type_traits(type)->to_float;
        float * ref = malloc(cols * sizeof(float));
        int64_t mismatches = 0;
        for (int64_t i = 0; i < n_ids; ++i) {
            to_float((const char *) w->data + id[i] * row_size, ref, cols);
            for (int64_t c = 0; c < cols; ++c) {  // bits, not values: -0.0f and 0.0f differ
                mismatches += memcmp(&ref[c], (const float *) out->data + i * cols + c, sizeof(float)) != 0;
            }
        }
        printf("%s\"%s\": %lld", t ? ", " : "", ggml_type_name(type), (long long) mismatches);
        free(ref);
        free(src);
        ggml_free(ctx);
    }
    printf("}\n");
    return 0;
}
