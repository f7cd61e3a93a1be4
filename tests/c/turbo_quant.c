// turbo_quant: the TurboQuant KV types (patch 0118) measured through ggml's public API.
//   distortion: random unit vectors of d = 128, 256, 512 (isotropic: rotating them changes nothing) are quantized
//     (ggml_quantize_chunk) and dequantized (to_float): D = E|x - x'|^2, the inner-product error
//     E(<q,x> - <q,x'>)^2 against Gaussian q, and the slope E<q,x'><q,x> / E<q,x>^2 = E<x,x'>; for turbo2/3/4, q4_0,
//     iq4_nl and q8_0. The same for vectors with a few large channels (a K cache's outliers), as stored and after
//     a Hadamard rotation (the KV cache rotates every turbo row).
//   dot: the CPU's vec_dot of a turbo row against a q8_0 query equals the dot of the dequantized rows.
//   fa: ggml_flash_attn_ext over turbo K/V equals it over the same K/V dequantized to f32 (the query's q8_0
//     rounding apart, which q8_0 K/V, also measured, share), for n = 1 and 4 query rows, GQA 4, heads 128 and 256,
//     under and past 512 cells.
// usage: turbo_quant [--vectors 4000] [--threads 2]      output: one JSON object
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 12345;
static double uni(void) {
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (((rng * 2685821657736338717ULL) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static float gauss(void) { return (float) (sqrt(-2.0 * log(uni())) * cos(6.283185307179586 * uni())); }

// in-place orthonormal Walsh-Hadamard transform of n (a power of 2) values
static void fwht(float * x, int n) {
    for (int h = 1; h < n; h *= 2) {
        for (int i = 0; i < n; i += 2 * h) {
            for (int j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b; x[j + h] = a - b;
            }
        }
    }
    const float s = 1.0f / sqrtf((float) n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

static void unit(float * x, int d) {
    double s = 0;
    for (int i = 0; i < d; i++) s += (double) x[i] * x[i];
    const float inv = (float) (1.0 / sqrt(s));
    for (int i = 0; i < d; i++) x[i] *= inv;
}

// kind 0: isotropic; 1: 4 channels x8 and a bias of 0.5 per channel (as stored); 2: kind 1 after a rotation
static void make_vector(float * x, int d, int kind) {
    for (int i = 0; i < d; i++) x[i] = gauss();
    if (kind > 0) {
        for (int c = 0; c < 4; c++) x[(c * 37) % d] = 8.0f * x[(c * 37) % d] + 6.0f;
        unit(x, d);
        if (kind == 2) fwht(x, d);
    }
    unit(x, d);
}

static void distortion(enum ggml_type type, int d, int kind, int n_vec, int first) {
    const size_t row = ggml_row_size(type, d);
    float * x = malloc(sizeof(float) * d), * y = malloc(sizeof(float) * d), * q = malloc(sizeof(float) * d);
    void * buf = malloc(row);
    double mse = 0, ip_err = 0, xy = 0, xx = 0;
    for (int v = 0; v < n_vec; v++) {
        make_vector(x, d, kind);
        ggml_quantize_chunk(type, x, buf, 0, 1, d, NULL);
        ggml_get_type_traits(type)->to_float(buf, y, d);
        double e = 0, a = 0, b = 0, c = 0;
        for (int i = 0; i < d; i++) {
            q[i] = gauss();
            e += (double) (x[i] - y[i]) * (x[i] - y[i]);
            a += (double) q[i] * x[i];
            b += (double) q[i] * y[i];
            c += (double) x[i] * y[i];
        }
        // E_q <q,x'><q,x> = <x,x'> and E_q <q,x>^2 = |x|^2 = 1: the slope without q's sampling noise
        mse += e; ip_err += (a - b) * (a - b); xy += c; xx += 1.0;
    }
    // q ~ N(0, I): E<q, x - x'>^2 = |x - x'|^2, so ip_err / n_vec estimates D too
    printf("%s{\"type\": \"%s\", \"d\": %d, \"input\": \"%s\", \"D\": %.6g, \"ip_D\": %.6g, \"slope\": %.6g}",
           first ? "" : ", ", ggml_type_name(type), d, kind == 0 ? "isotropic" : kind == 1 ? "outliers" : "outliers-rotated",
           mse / n_vec, ip_err / n_vec, xy / xx);
    free(x); free(y); free(q); free(buf);
}

static void dot_check(enum ggml_type type, int d, int first) {
    const struct ggml_type_traits_cpu * tc = ggml_get_type_traits_cpu(type);
    const struct ggml_type_traits_cpu * q8 = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0);
    float * k = malloc(sizeof(float) * d), * qv = malloc(sizeof(float) * d);
    float * kd = malloc(sizeof(float) * d), * qd = malloc(sizeof(float) * d);
    void * kb = malloc(ggml_row_size(type, d)), * qb = malloc(ggml_row_size(GGML_TYPE_Q8_0, d));
    double worst = 0;
    for (int t = 0; t < 200; t++) {
        make_vector(k, d, 0); make_vector(qv, d, 0);
        const float scale = 0.1f + 10.0f * (float) uni();
        for (int i = 0; i < d; i++) { k[i] *= scale; qv[i] *= 3.0f; }
        tc->from_float(k, kb, d);
        q8->from_float(qv, qb, d);
        float got;
        tc->vec_dot(d, &got, 0, kb, 0, qb, 0, 1);
        ggml_get_type_traits(type)->to_float(kb, kd, d);
        ggml_get_type_traits(GGML_TYPE_Q8_0)->to_float(qb, qd, d);
        double want = 0, mag = 0;
        for (int i = 0; i < d; i++) { want += (double) kd[i] * qd[i]; mag += fabs((double) kd[i] * qd[i]); }
        const double rel = fabs(got - want) / mag;
        if (rel > worst) worst = rel;
    }
    printf("%s{\"type\": \"%s\", \"d\": %d, \"max_rel_err\": %.3g}", first ? "" : ", ", ggml_type_name(type), d, worst);
    free(k); free(qv); free(kd); free(qd); free(kb); free(qb);
}

// flash attention over (K, V) of `type` against the same values dequantized to f32; returns the NMSE
static double fa_check(ggml_backend_t be, enum ggml_type type, int dk, int n, int n_kv, int h, int hkv) {
    struct ggml_init_params ip = { 32 * ggml_tensor_overhead() + 2 * ggml_graph_overhead(), NULL, true };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * q  = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, dk, n, h, 1);
    struct ggml_tensor * kt = ggml_new_tensor_4d(ctx, type, dk, n_kv, hkv, 1);
    struct ggml_tensor * vt = ggml_new_tensor_4d(ctx, type, dk, n_kv, hkv, 1);
    struct ggml_tensor * kf = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, dk, n_kv, hkv, 1);
    struct ggml_tensor * vf = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, dk, n_kv, hkv, 1);
    struct ggml_tensor * m  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, n, 1, 1);
    const float sc = 1.0f / sqrtf((float) dk);
    struct ggml_tensor * ot = ggml_flash_attn_ext(ctx, q, kt, vt, m, sc, 0.0f, 0.0f);
    struct ggml_tensor * of = ggml_flash_attn_ext(ctx, q, kf, vf, m, sc, 0.0f, 0.0f);
    ggml_prec_set_acc(ot, GGML_PREC_F32);
    ggml_prec_set_acc(of, GGML_PREC_F32);
    struct ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, ot);
    ggml_build_forward_expand(g, of);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);

    const int64_t nkv_el = (int64_t) dk * n_kv * hkv;
    float * src = malloc(sizeof(float) * nkv_el), * deq = malloc(sizeof(float) * nkv_el);
    void * qbuf = malloc(ggml_nbytes(kt));
    for (int which = 0; which < 2; which++) {
        for (int64_t i = 0; i < nkv_el; i++) src[i] = 2.0f * gauss();
        ggml_quantize_chunk(type, src, qbuf, 0, nkv_el / dk, dk, NULL);
        ggml_get_type_traits(type)->to_float(qbuf, deq, nkv_el);
        ggml_backend_tensor_set(which ? vt : kt, qbuf, 0, ggml_nbytes(kt));
        ggml_backend_tensor_set(which ? vf : kf, deq, 0, ggml_nbytes(kf));
    }
    float * qv = malloc(sizeof(float) * dk * n * h);
    for (int i = 0; i < dk * n * h; i++) qv[i] = 2.0f * gauss();
    ggml_backend_tensor_set(q, qv, 0, ggml_nbytes(q));
    ggml_fp16_t * mask = malloc(sizeof(ggml_fp16_t) * n_kv * n);
    const int used = n_kv - 8;  // the last rows see causally up to their own position
    for (int r = 0; r < n; r++) {
        for (int c = 0; c < n_kv; c++) {
            mask[r * n_kv + c] = ggml_fp32_to_fp16(c <= used - n + r ? 0.0f : -INFINITY);
        }
    }
    ggml_backend_tensor_set(m, mask, 0, ggml_nbytes(m));
    ggml_backend_graph_compute(be, g);
    const int64_t n_out = ggml_nelements(ot);
    float * a = malloc(sizeof(float) * n_out), * b = malloc(sizeof(float) * n_out);
    ggml_backend_tensor_get(ot, a, 0, ggml_nbytes(ot));
    ggml_backend_tensor_get(of, b, 0, ggml_nbytes(of));
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n_out; i++) { err += (double) (a[i] - b[i]) * (a[i] - b[i]); ref += (double) b[i] * b[i]; }
    free(src); free(deq); free(qbuf); free(qv); free(mask); free(a); free(b);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return err / ref;
}

int main(int argc, char ** argv) {
    int n_vec = 4000, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--vectors")) n_vec = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    ggml_cpu_init();
    const enum ggml_type types[] = { GGML_TYPE_TURBO2_0, GGML_TYPE_TURBO3_0, GGML_TYPE_TURBO4_0,
                                     GGML_TYPE_Q4_0, GGML_TYPE_IQ4_NL, GGML_TYPE_Q8_0 };
    const int dims[] = { 128, 256, 512 };
    printf("{\"distortion\": [");
    int first = 1;
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        for (int kind = 0; kind < 3; kind++) {
            for (int di = 0; di < 3; di++) {
                if (kind > 0 && dims[di] != 256) continue;
                distortion(types[t], dims[di], kind, n_vec, first);
                first = 0;
            }
        }
    }
    printf("], \"dot\": [");
    first = 1;
    for (int t = 0; t < 3; t++) {
        for (int di = 0; di < 3; di++) { dot_check(types[t], dims[di], first); first = 0; }
    }
    printf("], \"fa\": [");
    ggml_backend_t be = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, NULL);
    ggml_backend_cpu_set_n_threads(be, threads);
    first = 1;
    const int shapes[][3] = { { 128, 1, 256 }, { 128, 4, 256 }, { 256, 1, 1024 }, { 256, 4, 1024 } };  // dk, n, n_kv
    const enum ggml_type fa_types[] = { GGML_TYPE_TURBO2_0, GGML_TYPE_TURBO3_0, GGML_TYPE_TURBO4_0, GGML_TYPE_Q8_0 };
    for (int t = 0; t < 4; t++) {
        for (int s = 0; s < 4; s++) {
            const double e = fa_check(be, fa_types[t], shapes[s][0], shapes[s][1], shapes[s][2], 8, 2);
            printf("%s{\"type\": \"%s\", \"dk\": %d, \"n\": %d, \"n_kv\": %d, \"nmse\": %.3g}", first ? "" : ", ",
                   ggml_type_name(fa_types[t]), shapes[s][0], shapes[s][1], shapes[s][2], e);
            first = 0;
        }
    }
    printf("]}\n");
    ggml_backend_free(be);
    return 0;
}
