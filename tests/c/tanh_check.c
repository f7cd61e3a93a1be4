// Checks ggml's CPU tanh op (patches 0105-0106) against libm's tanh in double precision.
//
// Computes GGML_OP_TANH on the CPU backend with 2 threads over a contiguous f32 tensor of
// shape [n, rows] (a long row like final logit softcapping over a vocabulary, and a few rows),
// then prints one JSON object: the worst error in ulps, where, and whether the special values
// (NaN, +-inf, +-0, denormals, huge inputs) came out as tanh defines them.
//
// With "softcap" as the second argument the graph is final logit softcapping instead,
// 30 * tanh(x / 30) as three ops (SCALE -> TANH -> SCALE, which the CPU backend fuses), and the output
// also carries a hash of the result's bits, to compare with GGML_CPU_DISABLE_FUSION=1.
//
// usage: tanh_check [threads] [softcap]

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t ulp_distance(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, sizeof(ia));
    memcpy(&ib, &b, sizeof(ib));
    // map the sign-magnitude order of floats onto the integers
    const int64_t la = ia < 0 ? (int64_t) INT32_MIN - ia : ia;
    const int64_t lb = ib < 0 ? (int64_t) INT32_MIN - ib : ib;
    return la > lb ? la - lb : lb - la;
}

int main(int argc, char ** argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    const int softcap = argc > 2 && strcmp(argv[2], "softcap") == 0;
    const float cap = 30.0f;
    const int64_t n = 262147;  // not a multiple of any vector width: the scalar tail runs too
    const int64_t rows = 3;
    const int64_t total = n * rows;

    struct ggml_init_params ip = { (size_t) total * sizeof(float) * 4 + 8 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, false };
    struct ggml_context * ctx = ggml_init(ip);
    struct ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, rows);
    struct ggml_tensor * y = softcap ? ggml_scale(ctx, ggml_tanh(ctx, ggml_scale(ctx, x, 1.0f/cap)), cap) : ggml_tanh(ctx, x);
    struct ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);

    float * xd = (float *) x->data;
    // a dense sweep over [-12, 12] (where tanh is not yet +-1), then special values
    const float range = softcap ? 12.0f*cap : 12.0f;
    for (int64_t i = 0; i < total; ++i) {
        xd[i] = -range + 2.0f*range * (float) ((double) i / (double) total);
    }
    const float specials[] = { NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-30f, -1e-30f, 1e-45f, -1e-45f,
                               0.25f, -0.25f, nextafterf(0.25f, 0.0f), 20.0f, -20.0f, 89.0f, -105.0f, 3e38f, -3e38f };
    const int n_specials = (int) (sizeof(specials) / sizeof(specials[0]));
    for (int i = 0; i < n_specials; ++i) {
        xd[i * 7919] = specials[i];
    }

    if (ggml_graph_compute_with_ctx(ctx, gf, threads) != GGML_STATUS_SUCCESS) {
        printf("{\"error\": \"compute failed\"}\n");
        return 2;
    }

    const float * yd = (const float *) y->data;
    int64_t worst = 0;
    float worst_x = 0.0f;
    int specials_ok = 1;
    for (int64_t i = 0; i < total; ++i) {
        const float ref = softcap ? (float) (cap * tanh((double) (xd[i] * (1.0f/cap))))
                                  : (float) tanh((double) xd[i]);
        if (isnan(ref)) {
            specials_ok &= isnan(yd[i]) ? 1 : 0;
            continue;
        }
        if (ref == 0.0f) {  // tanh(+-0) = +-0, and the sign must survive
            specials_ok &= (yd[i] == 0.0f && signbit(yd[i]) == signbit(ref)) ? 1 : 0;
            continue;
        }
        const int64_t d = ulp_distance(yd[i], ref);
        if (d > worst) {
            worst = d;
            worst_x = xd[i];
        }
    }
    for (int i = 0; i < n_specials; ++i) {
        const float v = yd[i * 7919];
        const float ref = softcap ? (float) (cap * tanh((double) (specials[i] * (1.0f/cap))))
                                  : (float) tanh((double) specials[i]);
        if (!(isnan(ref) ? isnan(v) : (v == ref || ulp_distance(v, ref) <= 8))) {
            specials_ok = 0;
        }
    }
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over the output's bytes
    for (size_t i = 0; i < (size_t) total * sizeof(float); ++i) {
        hash = (hash ^ ((const unsigned char *) yd)[i]) * 1099511628211ull;
    }
    printf("{\"n\": %lld, \"worst_ulp\": %lld, \"worst_x\": %.9g, \"specials_ok\": %s, \"hash\": \"%016llx\"}\n",
           (long long) total, (long long) worst, worst_x, specials_ok ? "true" : "false", (unsigned long long) hash);
    ggml_free(ctx);
    return 0;
}
