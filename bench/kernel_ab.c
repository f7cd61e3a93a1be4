// kernel_ab: time one few-column kernel of several builds of libggml-cpu in one process, call by call.
//
// On a shared VM the machine's speed moves by 10-30 % between processes (and within one, for seconds), so two
// builds timed by separate runs of mulmat_bench differed by as much at n = 1, where their code was the same.
// Here every build is dlopen'ed (RTLD_LOCAL: each keeps its own symbols) and its repacked few-column kernel --
// ggml_gemv_cols_q4_K_8x8_q8_K or ggml_gemv_cols_q6_K_8x8_q8_K -- is called on the same weights and activations,
// the builds alternated call by call (the order reversed every other call); per column count the median call is
// reported in ns per block of 8 weight rows, with its ratio to the first build, and whether every build gave the
// same bits. No graph, no threads: one core, the kernel alone, the weights in the cache level their size picks.
//
// The weights are random bytes in the repacked layout (scales set to a small half so that sums stay finite): the
// time of these kernels does not depend on the values.
//
// build: cc -O2 -std=c11 kernel_ab.c -ldl -o kernel_ab
// usage: kernel_ab q4_K|q6_K ROWS CALLS LIB [LIB ...]
//        kernel_ab q4_K 512 2001 /tmp/before/libggml-cpu.so build/cpu-variants/native/src/libggml-cpu.so

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_LIBS  8
#define MAX_CALLS 8192
#define COLS      1536  // the E2B width: 6 super blocks a row
#define Q8_K_SIZE 292   // block_q8_K: float d, 256 int8, 16 int16 sums

typedef void (*kernel_fn)(int, float *, size_t, const void *, const void *, int, int);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}

static double ts[MAX_LIBS][MAX_CALLS];

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s q4_K|q6_K ROWS CALLS LIB [LIB ...]\n", argv[0]);
        return 2;
    }
    const int q6 = strcmp(argv[1], "q6_K") == 0;
    if (!q6 && strcmp(argv[1], "q4_K") != 0) {
        fprintf(stderr, "type must be q4_K or q6_K\n");
        return 2;
    }
    const int rows = atoi(argv[2]), calls = atoi(argv[3]), n_libs = argc - 4;
    if (rows <= 0 || rows % 8 || calls <= 0 || calls > MAX_CALLS || n_libs > MAX_LIBS) {
        fprintf(stderr, "ROWS: a multiple of 8; CALLS: 1..%d; at most %d libraries\n", MAX_CALLS, MAX_LIBS);
        return 2;
    }
    const char * sym = q6 ? "ggml_gemv_cols_q6_K_8x8_q8_K" : "ggml_gemv_cols_q4_K_8x8_q8_K";
    // block_q4_Kx8: d, dmin (8 halves each), 96 bytes of scales, 1024 of quants; block_q6_Kx8: d (8 halves), 128
    // scales, 1024 + 512 bytes of quants
    const size_t block = q6 ? 16 + 128 + 1536 : 32 + 96 + 1024;
    const int n_halves = q6 ? 8 : 16;
    kernel_fn fn[MAX_LIBS];
    for (int i = 0; i < n_libs; i++) {
        void * h = dlopen(argv[4 + i], RTLD_NOW | RTLD_LOCAL);
        if (h == NULL || (fn[i] = (kernel_fn) dlsym(h, sym)) == NULL) {
            fprintf(stderr, "%s: %s\n", argv[4 + i], h ? "no kernel" : dlerror());
            return 1;
        }
    }
    const int nb = COLS / 256;
    const size_t n_blocks = (size_t) rows / 8 * nb;
    uint8_t * w = aligned_alloc(64, n_blocks * block);
    uint8_t * a = aligned_alloc(64, ((size_t) 8 * nb * Q8_K_SIZE + 63) / 64 * 64);
    srand(1);
    for (size_t i = 0; i < n_blocks * block; i++) {
        w[i] = (uint8_t) rand();
    }
    for (size_t b = 0; b < n_blocks; b++) {
        uint16_t * d = (uint16_t *) (w + b * block);
        for (int j = 0; j < n_halves; j++) {
            d[j] = 0x2000;  // 2^-7
        }
    }
    for (int i = 0; i < 8 * nb * Q8_K_SIZE; i++) {
        a[i] = (uint8_t) (rand() % 200);
    }
    for (int c = 0; c < 8 * nb; c++) {
        const float d = 0.01f;
        memcpy(a + (size_t) c * Q8_K_SIZE, &d, sizeof d);
    }
    float * out[MAX_LIBS];
    for (int i = 0; i < n_libs; i++) {
        out[i] = aligned_alloc(64, (size_t) 8 * rows * sizeof(float));
    }
    printf("%s, %d x %d (%.2f MB), ns per 8-row block: median of %d calls alternated (ratio to the first)\n",
           argv[1], rows, COLS, n_blocks * block / 1e6, calls);
    for (int n = 1; n <= 8; n++) {
        for (int r = 0; r < calls; r++) {
            for (int j = 0; j < n_libs; j++) {
                const int i = (r & 1) ? n_libs - 1 - j : j;
                const double t0 = now();
                fn[i](COLS, out[i], rows, w, a, n, rows);
                ts[i][r] = now() - t0;
            }
        }
        int same = 1;
        for (int i = 1; i < n_libs; i++) {
            same &= memcmp(out[0], out[i], (size_t) n * rows * sizeof(float)) == 0;
        }
        printf("n=%d", n);
        double ns[MAX_LIBS];
        for (int i = 0; i < n_libs; i++) {
            qsort(ts[i], calls, sizeof(double), cmp_double);
            ns[i] = ts[i][calls / 2] * 1e9 / n_blocks;
            printf("  %8.1f (%.3f)", ns[i], ns[i] / ns[0]);
        }
        printf("  %s\n", same ? "same bits" : "BITS DIFFER");
    }
    return 0;
}
