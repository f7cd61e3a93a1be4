// fa_decode: time a decode's flash attention alone, per KV cache type, the types interleaved run by run.
//
// One ggml_flash_attn_ext on the CPU backend: ROWS query rows (a decode of that many tokens) of HEADS query heads
// over one KV head of N_KV cells of head size DK, every cell visible (or only the last VISIBLE, as a sliding
// window sees a full-size cache), 2 threads. The defaults are a full-attention layer of the E2B-sized model (8
// query heads of 512 on one KV head). Each type gets its graph once; then the graphs run in turns, REPS rounds,
// so that a slow phase of a shared VM falls on every type alike; per type the median, the fastest run and the
// median's ratio to the first type's are printed. What it measures is the kernel: the K / V bytes are random
// values quantized by the type, the time does not depend on them.
//
// build (after any `make install`, from the repository root):
//   B=build/cp310-abi3-linux_x86_64
//   cc -O2 bench/fa_decode.c -Ivendor/llama.cpp/ggml/include -L$B/bin -lggml -lggml-base -lggml-cpu -lm
//      -Wl,-rpath,$PWD/$B/bin -o /tmp/fa_decode      (one line)
// usage: fa_decode [--n-kv 32768] [--dk 512] [--heads 8] [--rows 1] [--reps 9] [--visible N] TYPE [TYPE ...]
//        fa_decode --rows 4 f16 turbo3 q8_0      (LD_PRELOAD a libggml-cpu.so to time another build)
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_TYPES 16

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static enum ggml_type type_named(const char * name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * tn = ggml_type_name((enum ggml_type) t);
        if (tn && !strcmp(tn, name)) return (enum ggml_type) t;
    }
    fprintf(stderr, "unknown type %s\n", name);
    exit(2);
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

// the graph of one type, its K and V filled with the same random values quantized by the type
static struct ggml_cgraph * build(ggml_backend_t be, enum ggml_type t, int n_kv, int dk, int heads, int rows,
                                  int visible, size_t * kv_bytes) {
    struct ggml_init_params ip = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, dk, rows, heads, 1);
    struct ggml_tensor * k = ggml_new_tensor_4d(ctx, t, dk, n_kv, 1, 1);
    struct ggml_tensor * v = ggml_new_tensor_4d(ctx, t, dk, n_kv, 1, 1);
    struct ggml_tensor * m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, rows, 1, 1);
    struct ggml_tensor * out = ggml_flash_attn_ext(ctx, q, k, v, m, 1.0f, 0.0f, 0.0f);  // Gemma 4: scale 1
    ggml_prec_set_acc(out, GGML_PREC_F32);
    struct ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, out);
    ggml_backend_alloc_ctx_tensors(ctx, be);

    float * f = malloc(sizeof(float) * dk * n_kv);
    srand(7);
    for (int i = 0; i < dk * n_kv; i++) f[i] = (float) rand() / RAND_MAX - 0.5f;
    void * data = malloc(ggml_row_size(t, dk) * n_kv);
    ggml_quantize_chunk(t, f, data, 0, n_kv, dk, NULL);
    ggml_backend_tensor_set(k, data, 0, ggml_nbytes(k));
    ggml_backend_tensor_set(v, data, 0, ggml_nbytes(v));
    float * qa = malloc(ggml_nbytes(q));
    for (size_t i = 0; i < ggml_nbytes(q) / sizeof(float); i++) qa[i] = 0.05f * ((float) rand() / RAND_MAX - 0.5f);
    ggml_backend_tensor_set(q, qa, 0, ggml_nbytes(q));
    ggml_fp16_t * mask = malloc(sizeof(ggml_fp16_t) * n_kv * rows);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < n_kv; c++) mask[r * n_kv + c] = ggml_fp32_to_fp16(c < n_kv - visible ? -INFINITY : 0.0f);
    }
    ggml_backend_tensor_set(m, mask, 0, ggml_nbytes(m));
    free(f); free(data); free(qa); free(mask);
    *kv_bytes = ggml_nbytes(k) + ggml_nbytes(v);
    return g;
}

int main(int argc, char ** argv) {
    int n_kv = 32768, dk = 512, heads = 8, rows = 1, reps = 9, visible = -1;
    const char * types[MAX_TYPES];
    int n_types = 0;
    for (int i = 1; i < argc; i++) {
        int * opt = !strcmp(argv[i], "--n-kv") ? &n_kv : !strcmp(argv[i], "--dk") ? &dk : !strcmp(argv[i], "--heads") ? &heads :
                    !strcmp(argv[i], "--rows") ? &rows : !strcmp(argv[i], "--reps") ? &reps : !strcmp(argv[i], "--visible") ? &visible : NULL;
        if (opt && i + 1 < argc) {
            *opt = atoi(argv[++i]);
        } else if (n_types < MAX_TYPES) {
            types[n_types++] = argv[i];
        }
    }
    if (n_types == 0 || reps < 1) {
        fprintf(stderr, "usage: fa_decode [--n-kv N] [--dk D] [--heads H] [--rows R] [--reps N] [--visible N] TYPE [TYPE ...]\n");
        return 2;
    }
    if (visible < 0 || visible > n_kv) visible = n_kv;

    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, 2);
    struct ggml_cgraph * graphs[MAX_TYPES];
    size_t kv_bytes[MAX_TYPES];
    double * times = malloc(sizeof(double) * reps * n_types);
    for (int i = 0; i < n_types; i++) {
        graphs[i] = build(be, type_named(types[i]), n_kv, dk, heads, rows, visible, &kv_bytes[i]);
        ggml_backend_graph_compute(be, graphs[i]);  // warm: pages touched, threads up
    }
    for (int r = 0; r < reps; r++) {
        for (int i = 0; i < n_types; i++) {
            const double t0 = now();
            ggml_backend_graph_compute(be, graphs[i]);
            times[i * reps + r] = now() - t0;
        }
    }
    printf("flash attention, %d row(s) x %d heads of %d over %d cells (%d visible), 2 threads, %d rounds\n",
           rows, heads, dk, n_kv, visible, reps);
    double first = 0.0;
    for (int i = 0; i < n_types; i++) {
        double * x = times + i * reps;
        qsort(x, reps, sizeof(double), cmp_double);
        if (i == 0) first = x[reps / 2];
        printf("%-8s median %8.3f ms  fastest %8.3f ms  K+V %7.1f MB  vs %s %.2f\n", types[i], x[reps / 2] * 1e3,
               x[0] * 1e3, kv_bytes[i] / 1e6, types[0], x[reps / 2] / first);
    }
    return 0;
}
