// fa_rows: is CPU flash attention batch-invariant, and right? For n = 1..8 query rows, ggml_flash_attn_ext over one
// random K/V (n_kv cells, the first `used` of them visible causally) is computed once with all n rows and once
// per row alone (the same row of the causal mask); the output floats whose bits differ are counted. Each batch is
// also computed by the CPU backend's reference path (use_ref: one row at a time over the whole KV, no chunks,
// no tiles) and the largest difference reported, relative to the output's largest magnitude; --prompt P does the
// same for a P-row batch (the tiled prompt path from 64 rows).
// usage: fa_rows [--n-kv 256] [--used 40] [--dk 128] [--heads 4] [--kv-heads 1] [--threads 2]
//                [--k-type f16] [--v-type f16] [--prompt 0]
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

static enum ggml_type type_named(const char * name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * tn = ggml_type_name((enum ggml_type) t);
        if (tn && !strcmp(tn, name)) return (enum ggml_type) t;
    }
    fprintf(stderr, "unknown type %s\n", name);
    exit(2);
}

static enum ggml_type k_type = GGML_TYPE_F16, v_type = GGML_TYPE_F16;

static struct run build(ggml_backend_t be, int n, int n_kv, int dk, int h, int hkv) {
    struct run r;
    struct ggml_init_params ip = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    r.ctx = ggml_init(ip);
    r.q = ggml_new_tensor_4d(r.ctx, GGML_TYPE_F32, dk, n, h, 1);
    r.k = ggml_new_tensor_4d(r.ctx, k_type, dk, n_kv, hkv, 1);
    r.v = ggml_new_tensor_4d(r.ctx, v_type, dk, n_kv, hkv, 1);
    r.m = ggml_new_tensor_4d(r.ctx, GGML_TYPE_F16, n_kv, n, 1, 1);
    r.out = ggml_flash_attn_ext(r.ctx, r.q, r.k, r.v, r.m, 1.0f / sqrtf((float) dk), 0.0f, 0.0f);
    ggml_prec_set_acc(r.out, GGML_PREC_F32);
    r.g = ggml_new_graph(r.ctx);
    ggml_build_forward_expand(r.g, r.out);
    r.buf = ggml_backend_alloc_ctx_tensors(r.ctx, be);
    return r;
}

// the output of the n query rows qa (layout [dk, n, h]) under mask rows (n x n_kv), by the fast or the reference path
static float * attend(ggml_backend_t be, struct run * r, const float * qa, const ggml_fp16_t * mask, int use_ref) {
    ggml_backend_cpu_set_use_ref(be, use_ref);
    ggml_backend_tensor_set(r->q, qa, 0, ggml_nbytes(r->q));
    ggml_backend_tensor_set(r->m, mask, 0, ggml_nbytes(r->m));
    ggml_backend_graph_compute(be, r->g);
    ggml_backend_cpu_set_use_ref(be, 0);
    float * y = malloc(ggml_nbytes(r->out));
    ggml_backend_tensor_get(r->out, y, 0, ggml_nbytes(r->out));
    return y;
}

// the largest |a - b| over the largest |b|
static double rel_err(const float * a, const float * b, int64_t n) {
    double e = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double) a[i] - b[i]));
        m = fmax(m, fabs((double) b[i]));
    }
    return m > 0.0 ? e / m : e;
}

// K (or V) data of n_kv cells x hkv heads in type t, from the floats src
static void set_kv(struct ggml_tensor * t, const float * src, int dk, int rows) {
    void * data = malloc(ggml_row_size(t->type, dk) * rows);
    ggml_quantize_chunk(t->type, src, data, 0, rows, dk, NULL);
    ggml_backend_tensor_set(t, data, 0, ggml_nbytes(t));
    free(data);
}

// a run of n query rows over the K / V floats kv (K, then V), in the types asked for
static struct run build_filled(ggml_backend_t be, int n, int n_kv, int dk, int h, int hkv, const float * kv) {
    struct run r = build(be, n, n_kv, dk, h, hkv);
    set_kv(r.k, kv, dk, n_kv * hkv);
    set_kv(r.v, kv + dk * n_kv * hkv, dk, n_kv * hkv);
    return r;
}

// the causal mask of n query rows at positions used - n .. used - 1: row i sees cells [0, used - n + i]
static ggml_fp16_t * causal_mask(int n, int n_kv, int used) {
    ggml_fp16_t * mask = malloc(sizeof(ggml_fp16_t) * n_kv * n);
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < n_kv; c++) mask[i * n_kv + c] = ggml_fp32_to_fp16(c <= used - n + i ? 0.0f : -INFINITY);
    }
    return mask;
}

int main(int argc, char ** argv) {
    int n_kv = 256, used = 40, dk = 128, h = 4, hkv = 1, threads = 2, prompt = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n-kv")) n_kv = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--used")) used = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dk")) dk = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--heads")) h = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--kv-heads")) hkv = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--k-type")) k_type = type_named(argv[i + 1]);
        else if (!strcmp(argv[i], "--v-type")) v_type = type_named(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompt")) prompt = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    ggml_backend_t be = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
    ggml_backend_cpu_set_n_threads(be, threads);
    const int n_max = 8;
    // K, V, and the queries of n_max tokens at positions used - n_max .. used - 1
    float * kv = malloc(sizeof(float) * dk * n_kv * hkv * 2);
    for (int i = 0; i < dk * n_kv * hkv * 2; i++) kv[i] = rnd();
    float * q = malloc(sizeof(float) * dk * n_max * h);
    for (int i = 0; i < dk * n_max * h; i++) q[i] = rnd() * 2.0f;
    int bad_total = 0;
    double ref_err = 0.0;
    printf("{\"n_kv\": %d, \"used\": %d, \"k_type\": \"%s\", \"v_type\": \"%s\", \"results\": [",
           n_kv, used, ggml_type_name(k_type), ggml_type_name(v_type));
    for (int n = 1; n <= n_max; n++) {
        struct run all = build_filled(be, n, n_kv, dk, h, hkv, kv), one = build_filled(be, 1, n_kv, dk, h, hkv, kv);
        ggml_fp16_t * mask = causal_mask(n, n_kv, used);
        float * qa = malloc(sizeof(float) * dk * n * h);
        for (int i = 0; i < n; i++) {
            for (int hh = 0; hh < h; hh++) memcpy(qa + (hh * n + i) * dk, q + (hh * n_max + i) * dk, sizeof(float) * dk);
        }
        float * ya = attend(be, &all, qa, mask, 0);   // [dk, h, n]
        float * yr = attend(be, &all, qa, mask, 1);
        ref_err = fmax(ref_err, rel_err(ya, yr, (int64_t) dk * h * n));
        free(yr);
        int bad = 0;
        float * q1 = malloc(sizeof(float) * dk * h);
        for (int i = 0; i < n; i++) {
            for (int hh = 0; hh < h; hh++) memcpy(q1 + hh * dk, qa + (hh * n + i) * dk, sizeof(float) * dk);
            float * y1 = attend(be, &one, q1, mask + i * n_kv, 0);
            for (int j = 0; j < dk * h; j++) bad += memcmp(&y1[j], &ya[i * dk * h + j], sizeof(float)) != 0;
            free(y1);
        }
        printf("%s{\"n\": %d, \"mismatches\": %d}", n > 1 ? ", " : "", n, bad);
        bad_total += bad;
        free(mask); free(qa); free(ya); free(q1);
        ggml_backend_buffer_free(all.buf); ggml_free(all.ctx); ggml_backend_buffer_free(one.buf); ggml_free(one.ctx);
    }
    printf("], \"ref_rel_err\": %.3g", ref_err);
    if (prompt > 0) {
        // a prompt of `prompt` rows at positions used - prompt .. used - 1, against the reference path
        struct run p = build_filled(be, prompt, n_kv, dk, h, hkv, kv);
        ggml_fp16_t * mask = causal_mask(prompt, n_kv, used);
        float * qa = malloc(sizeof(float) * dk * prompt * h);
        for (int i = 0; i < dk * prompt * h; i++) qa[i] = rnd() * 2.0f;
        float * ya = attend(be, &p, qa, mask, 0);
        float * yr = attend(be, &p, qa, mask, 1);
        printf(", \"prompt\": %d, \"prompt_ref_rel_err\": %.3g", prompt, rel_err(ya, yr, (int64_t) dk * h * prompt));
        free(mask); free(qa); free(ya); free(yr);
        ggml_backend_buffer_free(p.buf); ggml_free(p.ctx);
    }
    printf("}\n");
    ggml_backend_free(be);
    free(kv); free(q);
    return bad_total != 0;
}
