// mulmat_bench: time (and check) ggml's CPU matrix product W x X for a few input columns.
//
// W is a rows x cols weight matrix (ggml: ne00 = cols, ne01 = rows) of type f16, q8_0 or q4_K
// with random values, placed in the buffer type llama.cpp would choose for a weight (the first
// CPU "extra" buffer type - AMX, repacked - that supports the product, else the plain CPU buffer;
// --plain forces the plain one, --buft NAME a named extra one, e.g. CPU_REPACK). X is cols x n, f32. For every shape, every n of the list is timed
// in rounds (all configurations interleaved), and the median per configuration is reported.
//
// --check compares every product with a naive reference on the dequantized weights (double
// accumulation) and reports the normalized mean squared error that test-backend-ops uses
// (threshold 5e-4 for MUL_MAT); the exit status is 1 when one is over the threshold.
//
// --invariance computes every column of every n-column product again as a product of its own (one
// column, the same graph shape a single-token decode has) and counts the floats whose bits differ
// ("mismatches"); the exit status is 1 when one does. A batch-invariant kernel has none.
//
// build: cc -O2 -std=c11 mulmat_bench.c -I<ggml include> -L<lib> -lggml -lggml-base -lggml-cpu -lm
// usage: mulmat_bench --type q8_0 --shape 262144x1536 --shape 6144x1536 --n 1,2,3,4,5,6,7,8
//                     [--threads 2] [--rounds 7] [--plain] [--check] [--invariance] [--seed 1]
// output: one JSON object on stdout.

#define _POSIX_C_SOURCE 199309L

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SHAPES 32
#define MAX_N      64

struct shape {
    int64_t rows;
    int64_t cols;
};

struct config {
    int                   n;
    struct ggml_context * ctx;
    ggml_backend_buffer_t buf;
    struct ggml_cgraph  * graph;
    struct ggml_tensor  * x;
    struct ggml_tensor  * y;
    double              * ms;     // [rounds] wall clock
    double              * cpu;    // [rounds] process CPU time
};

struct weight {
    struct shape          shape;
    struct ggml_context * ctx;
    ggml_backend_buffer_t buf;
    struct ggml_tensor  * w;
    const char          * buft_name;
    void                * host;     // the quantized rows as set (kept for --check)
    struct config         cfg[MAX_N];
};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// CPU time of the whole process: with one thread, a measure that time slices lost to other
// processes on a shared machine do not inflate
static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static uint64_t rng_state = 1;

// uniform on [-sqrt(3), sqrt(3)] (unit variance): xorshift64*, reproducible and cheap
static float rng_value(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    const double u = ((rng_state * 2685821657736338717ULL) >> 11) * (1.0 / 9007199254740992.0);
    return (float) ((2.0 * u - 1.0) * 1.7320508075688772);
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a;
    const double y = *(const double *) b;
    return (x > y) - (x < y);
}

static double median(const double * v, int n) {
    double * s = malloc(n * sizeof(double));
    memcpy(s, v, n * sizeof(double));
    qsort(s, n, sizeof(double), cmp_double);
    const double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    free(s);
    return m;
}

// the buffer type llama.cpp would pick for this weight (see weight_buft_supported in llama-model.cpp)
static ggml_backend_buffer_type_t pick_buft(ggml_backend_dev_t dev, struct ggml_tensor * w, int plain, const char * want) {
    if (plain) {
        return ggml_backend_cpu_buffer_type();
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (get_extra) {
        struct ggml_init_params ip = { 4 * ggml_tensor_overhead(), NULL, true };
        struct ggml_context * ctx = ggml_init(ip);
        struct ggml_tensor * x  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 512);
        struct ggml_tensor * op = ggml_mul_mat(ctx, w, x);
        for (ggml_backend_buffer_type_t * b = get_extra(dev); b && *b; b++) {
            if (want && strcmp(ggml_backend_buft_name(*b), want) != 0) {
                continue;
            }
            ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(*b, 0);
            w->buffer = dummy;
            const bool ok = ggml_backend_dev_supports_op(dev, op);
            w->buffer = NULL;
            ggml_backend_buffer_free(dummy);
            if (ok) {
                ggml_free(ctx);
                return *b;
            }
        }
        ggml_free(ctx);
    }
    return ggml_backend_cpu_buffer_type();
}

static void fill_weight(struct weight * wt, enum ggml_type type) {
    const int64_t rows = wt->shape.rows;
    const int64_t cols = wt->shape.cols;
    const size_t  row_size = ggml_row_size(type, cols);
    wt->host = malloc(row_size * rows);
    const int64_t chunk = 4096;
    float * tmp = malloc(sizeof(float) * cols * chunk);
    const float scale = 1.0f / sqrtf((float) cols);
    for (int64_t r = 0; r < rows; r += chunk) {
        const int64_t nr = r + chunk <= rows ? chunk : rows - r;
        for (int64_t i = 0; i < nr * cols; i++) {
            tmp[i] = scale * rng_value();
        }
        ggml_quantize_chunk(type, tmp, (char *) wt->host + r * row_size, 0, nr, cols, NULL);
    }
    free(tmp);
    ggml_backend_tensor_set(wt->w, wt->host, 0, row_size * rows);
}

// normalized mean squared error of y against the reference on the dequantized weights
static double check_product(const struct weight * wt, enum ggml_type type, const struct config * c) {
    const int64_t rows = wt->shape.rows;
    const int64_t cols = wt->shape.cols;
    const size_t  row_size = ggml_row_size(type, cols);
    const struct ggml_type_traits * tt = ggml_get_type_traits(type);
    float * x = malloc(sizeof(float) * cols * c->n);
    float * y = malloc(sizeof(float) * rows * c->n);
    float * wrow = malloc(sizeof(float) * cols);
    ggml_backend_tensor_get(c->x, x, 0, sizeof(float) * cols * c->n);
    ggml_backend_tensor_get(c->y, y, 0, sizeof(float) * rows * c->n);
    double err = 0.0, ref2 = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        tt->to_float((const char *) wt->host + r * row_size, wrow, cols);
        for (int j = 0; j < c->n; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < cols; k++) {
                acc += (double) wrow[k] * x[j * cols + k];
            }
            const double d = y[j * rows + r] - acc;
            err  += d * d;
            ref2 += acc * acc;
        }
    }
    free(x);
    free(y);
    free(wrow);
    return err / ref2;
}

// floats of the n-column product whose bits differ from the same column computed alone
static int64_t count_mismatches(ggml_backend_t backend, const struct weight * wt, const struct config * c) {
    const int64_t rows = wt->shape.rows;
    const int64_t cols = wt->shape.cols;
    struct ggml_init_params gp = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context * ctx = ggml_init(gp);
    struct ggml_tensor * x1 = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, 1);
    struct ggml_tensor * y1 = ggml_mul_mat(ctx, wt->w, x1);
    struct ggml_cgraph * graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, y1);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    float * x = malloc(sizeof(float) * cols * c->n);
    float * y = malloc(sizeof(float) * rows * c->n);
    float * col = malloc(sizeof(float) * rows);
    ggml_backend_tensor_get(c->x, x, 0, sizeof(float) * cols * c->n);
    ggml_backend_tensor_get(c->y, y, 0, sizeof(float) * rows * c->n);
    int64_t bad = 0;
    for (int j = 0; j < c->n; j++) {
        ggml_backend_tensor_set(x1, x + j * cols, 0, sizeof(float) * cols);
        ggml_backend_graph_compute(backend, graph);
        ggml_backend_tensor_get(y1, col, 0, sizeof(float) * rows);
        for (int64_t r = 0; r < rows; r++) {
            bad += memcmp(&col[r], &y[j * rows + r], sizeof(float)) != 0;
        }
    }
    free(x);
    free(y);
    free(col);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return bad;
}

static int parse_list(const char * s, int * out, int max) {
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char * comma = strchr(s, ',');
        if (!comma) {
            break;
        }
        s = comma + 1;
    }
    return n;
}

static void usage(void) {
    fprintf(stderr, "usage: mulmat_bench --type f16|q8_0|q4_K --shape ROWSxCOLS [--shape ...] --n 1,2,...\n"
                    "                    [--threads 2] [--rounds 7] [--warmup 2] [--plain | --buft NAME] [--check] [--invariance] [--seed 1]\n");
    exit(2);
}

int main(int argc, char ** argv) {
    enum ggml_type type = GGML_TYPE_F16;
    const char * type_name = "f16";
    struct shape shapes[MAX_SHAPES];
    int n_shapes = 0;
    int ns[MAX_N] = { 1 };
    int n_ns = 1;
    int threads = 2;
    int rounds = 7;
    int warmup = 2;
    int plain = 0;
    int check = 0;
    int invariance = 0;
    const char * want_buft = NULL;

    for (int i = 1; i < argc; i++) {
        const char * a = argv[i];
        const char * v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--plain")) { plain = 1; continue; }
        if (!strcmp(a, "--check")) { check = 1; continue; }
        if (!strcmp(a, "--invariance")) { invariance = 1; continue; }
        if (!v) { usage(); }
        i++;
        if (!strcmp(a, "--type")) {
            type_name = v;
            if      (!strcmp(v, "f16"))  type = GGML_TYPE_F16;
            else if (!strcmp(v, "q8_0")) type = GGML_TYPE_Q8_0;
            else if (!strcmp(v, "q4_K")) type = GGML_TYPE_Q4_K;
            else if (!strcmp(v, "f32"))  type = GGML_TYPE_F32;
            else if (!strcmp(v, "q4_0")) type = GGML_TYPE_Q4_0;
            else if (!strcmp(v, "q6_K")) type = GGML_TYPE_Q6_K;
            else if (!strcmp(v, "q5_K")) type = GGML_TYPE_Q5_K;
            else if (!strcmp(v, "bf16")) type = GGML_TYPE_BF16;
            else usage();
        } else if (!strcmp(a, "--shape")) {
            if (n_shapes == MAX_SHAPES || sscanf(v, "%" SCNd64 "x%" SCNd64, &shapes[n_shapes].rows, &shapes[n_shapes].cols) != 2) {
                usage();
            }
            n_shapes++;
        } else if (!strcmp(a, "--n"))       { n_ns = parse_list(v, ns, MAX_N);
        } else if (!strcmp(a, "--threads")) { threads = atoi(v);
        } else if (!strcmp(a, "--rounds"))  { rounds = atoi(v);
        } else if (!strcmp(a, "--warmup"))  { warmup = atoi(v);
        } else if (!strcmp(a, "--buft"))    { want_buft = v;
        } else if (!strcmp(a, "--seed"))    { rng_state = (uint64_t) atoll(v) * 0x9E3779B97F4A7C15ULL + 1;
        } else { usage(); }
    }
    if (n_shapes == 0 || n_ns == 0 || rounds < 1) {
        usage();
    }

    ggml_backend_load_all();
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_t backend = ggml_backend_dev_init(dev, NULL);
    ggml_backend_cpu_set_n_threads(backend, threads);

    struct weight * weights = calloc(n_shapes, sizeof(struct weight));
    for (int s = 0; s < n_shapes; s++) {
        struct weight * wt = &weights[s];
        wt->shape = shapes[s];
        struct ggml_init_params ip = { ggml_tensor_overhead(), NULL, true };
        wt->ctx = ggml_init(ip);
        wt->w = ggml_new_tensor_2d(wt->ctx, type, wt->shape.cols, wt->shape.rows);
        // named as a model's output matrix: on x86, Q6_K is repacked only there (patch 0117)
        ggml_set_name(wt->w, "output.weight");
        ggml_backend_buffer_type_t buft = pick_buft(dev, wt->w, plain, want_buft);
        wt->buft_name = ggml_backend_buft_name(buft);
        wt->buf = ggml_backend_alloc_ctx_tensors_from_buft(wt->ctx, buft);
        ggml_backend_buffer_set_usage(wt->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        fill_weight(wt, type);

        for (int c = 0; c < n_ns; c++) {
            struct config * cf = &wt->cfg[c];
            cf->n = ns[c];
            struct ggml_init_params gp = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
            cf->ctx = ggml_init(gp);
            cf->x = ggml_new_tensor_2d(cf->ctx, GGML_TYPE_F32, wt->shape.cols, cf->n);
            cf->y = ggml_mul_mat(cf->ctx, wt->w, cf->x);
            cf->graph = ggml_new_graph(cf->ctx);
            ggml_build_forward_expand(cf->graph, cf->y);
            cf->buf = ggml_backend_alloc_ctx_tensors(cf->ctx, backend);
            float * x = malloc(sizeof(float) * wt->shape.cols * cf->n);
            for (int64_t i = 0; i < wt->shape.cols * cf->n; i++) {
                x[i] = rng_value();
            }
            ggml_backend_tensor_set(cf->x, x, 0, sizeof(float) * wt->shape.cols * cf->n);
            free(x);
            cf->ms  = calloc(rounds, sizeof(double));
            cf->cpu = calloc(rounds, sizeof(double));
        }
    }

    // rounds: every (shape, n) once per round, the order rotated from round to round
    const int n_cfg = n_shapes * n_ns;
    for (int r = -warmup; r < rounds; r++) {
        for (int i = 0; i < n_cfg; i++) {
            const int k = (i + (r < 0 ? 0 : r) * 7) % n_cfg;
            struct config * cf = &weights[k / n_ns].cfg[k % n_ns];
            const double c0 = cpu_ms();
            const double t0 = now_ms();
            ggml_backend_graph_compute(backend, cf->graph);
            const double t1 = now_ms();
            const double c1 = cpu_ms();
            if (r >= 0) {
                cf->ms[r]  = t1 - t0;
                cf->cpu[r] = c1 - c0;
            }
        }
    }

    int bad = 0;
    printf("{\"type\": \"%s\", \"threads\": %d, \"rounds\": %d, \"results\": [", type_name, threads, rounds);
    for (int s = 0; s < n_shapes; s++) {
        struct weight * wt = &weights[s];
        for (int c = 0; c < n_ns; c++) {
            struct config * cf = &wt->cfg[c];
            printf("%s\n  {\"rows\": %" PRId64 ", \"cols\": %" PRId64 ", \"n\": %d, \"buft\": \"%s\", \"median_ms\": %.4f, \"ms\": [",
                   s + c ? "," : "", wt->shape.rows, wt->shape.cols, cf->n, wt->buft_name, median(cf->ms, rounds));
            for (int r = 0; r < rounds; r++) {
                printf("%s%.4f", r ? ", " : "", cf->ms[r]);
            }
            printf("], \"median_cpu_ms\": %.4f", median(cf->cpu, rounds));
            if (check) {
                const double nmse = check_product(wt, type, cf);
                bad |= !(nmse <= 5e-4);
                printf(", \"nmse\": %.3e", nmse);
            }
            if (invariance) {
                const int64_t mismatches = count_mismatches(backend, wt, cf);
                bad |= mismatches != 0;
                printf(", \"mismatches\": %" PRId64, mismatches);
            }
            printf("}");
        }
    }
    printf("\n]}\n");

    for (int s = 0; s < n_shapes; s++) {
        for (int c = 0; c < n_ns; c++) {
            ggml_backend_buffer_free(weights[s].cfg[c].buf);
            ggml_free(weights[s].cfg[c].ctx);
            free(weights[s].cfg[c].ms);
            free(weights[s].cfg[c].cpu);
        }
        ggml_backend_buffer_free(weights[s].buf);
        ggml_free(weights[s].ctx);
        free(weights[s].host);
    }
    free(weights);
    ggml_backend_free(backend);
    return bad;
}
