// fa_rows: is CPU flash attention batch-invariant? For n = 1..8 query rows, ggml_flash_attn_ext over one
// random K/V (f16, n_kv cells, the first `used` of them visible causally) is computed once with all n rows
// and once per row alone (the same row of the causal mask); the output floats whose bits differ are counted.
// usage: fa_rows [--n-kv 256] [--used 40] [--dk 128] [--heads 4] [--kv-heads 1] [--threads 2]
// output: one JSON object; exit status 1 when a row differs.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 7;
static float rnd(void) {
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (float) (((rng * 2685821657736338717ULL) >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

struct run { struct ggml_context * ctx; ggml_backend_buffer_t buf; struct ggml_cgraph * g;
             struct ggml_tensor * q, * k, * v, * m, * out; };

static struct run build(ggml_backend_t be, int n, int n_kv, int dk, int h, int hkv) {
    struct run r;
    struct ggml_init_params ip = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    r.ctx = ggml_init(ip);
    r.q = ggml_new_tensor_4d(r.ctx, GGML_TYPE_F32, dk, n, h, 1);
    r.k = ggml_new_tensor_4d(r.ctx, GGML_TYPE_F16, dk, n_kv, hkv, 1);
    r.v = ggml_new_tensor_4d(r.ctx, GGML_TYPE_F16, dk, n_kv, hkv, 1);
    r.m = ggml_new_tensor_4d(r.ctx, GGML_TYPE_F16, n_kv, n, 1, 1);
    r.out = ggml_flash_attn_ext(r.ctx, r.q, r.k, r.v, r.m, 1.0f / sqrtf((float) dk), 0.0f, 0.0f);
    ggml_prec_set_acc(r.out, GGML_PREC_F32);
    r.g = ggml_new_graph(r.ctx);
    ggml_build_forward_expand(r.g, r.out);
    r.buf = ggml_backend_alloc_ctx_tensors(r.ctx, be);
    return r;
}

int main(int argc, char ** argv) {
    int n_kv = 256, used = 40, dk = 128, h = 4, hkv = 1, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n-kv")) n_kv = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--used")) used = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dk")) dk = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) h = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv-heads")) hkv = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    ggml_backend_t be = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
    ggml_backend_cpu_set_n_threads(be, threads);
    const int n_max = 8;
    // K, V, and the queries of n_max tokens at positions used - n_max .. used - 1
    ggml_fp16_t * kv = malloc(sizeof(ggml_fp16_t) * dk * n_kv * hkv * 2);
    for (int i = 0; i < dk * n_kv * hkv * 2; i++) kv[i] = ggml_fp32_to_fp16(rnd());
    float * q = malloc(sizeof(float) * dk * n_max * h);
    for (int i = 0; i < dk * n_max * h; i++) q[i] = rnd() * 2.0f;
    int bad_total = 0;
    printf("{\"n_kv\": %d, \"used\": %d, \"results\": [", n_kv, used);
    for (int n = 1; n <= n_max; n++) {
        struct run all = build(be, n, n_kv, dk, h, hkv), one = build(be, 1, n_kv, dk, h, hkv);
        ggml_backend_tensor_set(all.k, kv, 0, ggml_nbytes(all.k));
        ggml_backend_tensor_set(all.v, kv + dk * n_kv * hkv, 0, ggml_nbytes(all.v));
        ggml_backend_tensor_set(one.k, kv, 0, ggml_nbytes(one.k));
        ggml_backend_tensor_set(one.v, kv + dk * n_kv * hkv, 0, ggml_nbytes(one.v));
        // row i is the query of position used - n + i: it sees cells [0, used - n + i]
        ggml_fp16_t * mask = malloc(sizeof(ggml_fp16_t) * n_kv * n);
        float * qa = malloc(sizeof(float) * dk * n * h);
        for (int i = 0; i < n; i++) {
            for (int c = 0; c < n_kv; c++) mask[i * n_kv + c] = ggml_fp32_to_fp16(c <= used - n + i ? 0.0f : -INFINITY);
            for (int hh = 0; hh < h; hh++) memcpy(qa + (hh * n + i) * dk, q + (hh * n_max + i) * dk, sizeof(float) * dk);
        }
        ggml_backend_tensor_set(all.q, qa, 0, ggml_nbytes(all.q));
        ggml_backend_tensor_set(all.m, mask, 0, ggml_nbytes(all.m));
        ggml_backend_graph_compute(be, all.g);
        float * ya = malloc(ggml_nbytes(all.out));
        ggml_backend_tensor_get(all.out, ya, 0, ggml_nbytes(all.out));   // [dk, h, n]
        int bad = 0;
        float * y1 = malloc(ggml_nbytes(one.out));
        float * q1 = malloc(sizeof(float) * dk * h);
        for (int i = 0; i < n; i++) {
            for (int hh = 0; hh < h; hh++) memcpy(q1 + hh * dk, qa + (hh * n + i) * dk, sizeof(float) * dk);
            ggml_backend_tensor_set(one.q, q1, 0, ggml_nbytes(one.q));
            ggml_backend_tensor_set(one.m, mask + i * n_kv, 0, ggml_nbytes(one.m));
            ggml_backend_graph_compute(be, one.g);
            ggml_backend_tensor_get(one.out, y1, 0, ggml_nbytes(one.out));
            for (int j = 0; j < dk * h; j++) bad += memcmp(&y1[j], &ya[i * dk * h + j], sizeof(float)) != 0;
        }
        printf("%s{\"n\": %d, \"mismatches\": %d}", n > 1 ? ", " : "", n, bad);
        bad_total += bad;
        free(mask); free(qa); free(ya); free(y1); free(q1);
        ggml_backend_buffer_free(all.buf); ggml_free(all.ctx); ggml_backend_buffer_free(one.buf); ggml_free(one.ctx);
    }
    printf("]}\n");
    ggml_backend_free(be);
    free(kv); free(q);
    return bad_total != 0;
}
