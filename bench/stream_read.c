// stream_read: this machine's streaming read bandwidth, the ceiling of a decode that reads every weight once.
//
// Each of --threads threads sums its share of a --mib MiB buffer (vector loads, 4 independent accumulators)
// --rounds times; the best round's bytes / seconds is printed as JSON ({"gb_s": ..., "threads": ...}).
// build: cc -O2 -march=native -fopenmp stream_read.c -o stream_read
#define _POSIX_C_SOURCE 199309L
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char ** argv) {
    int threads = 2, rounds = 5;
    size_t mib = 1024;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--mib")) mib = (size_t) atoll(argv[i + 1]);
        else { fprintf(stderr, "usage: stream_read [--threads 2] [--rounds 5] [--mib 1024]\n"); return 2; }
    }
    const size_t n = mib * 1024 * 1024 / sizeof(uint64_t);
    uint64_t * buf = aligned_alloc(64, n * sizeof(uint64_t));
    // first touch by the threads that read it, so the pages are spread as the reads will be
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) {
        buf[i] = i;
    }
    double best = 0.0;
    uint64_t total = 0;
    for (int r = 0; r < rounds; r++) {
        const double t0 = now_s();
        uint64_t sum = 0;
        #pragma omp parallel for num_threads(threads) schedule(static) reduction(+:sum)
        for (size_t i = 0; i < n; i += 4) {
            sum += buf[i] + buf[i + 1] + buf[i + 2] + buf[i + 3];
        }
        const double dt = now_s() - t0;
        total += sum;
        const double gbs = n * sizeof(uint64_t) / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("{\"gb_s\": %.2f, \"threads\": %d, \"mib\": %zu, \"checksum\": %llu}\n", best, threads, mib, (unsigned long long) (total & 0xffff));
    free(buf);
    return 0;
}
