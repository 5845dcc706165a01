/* bench_membw.c - the read bandwidth of this machine's memory: the roofline of a CPU decode step,
 * which reads its weights and writes almost nothing (pxq bench's own CPU roofline is memcpy, which
 * reads and writes: docs/PERF.md). Built with the tests, never run by `make test`; tools/peer-bench.sh
 * runs it beside the engines.
 *
 *   build/tests/bench_membw [THREADS [MIB]]     -> one line: "read GB/s: X (T threads, M MiB, best of 7)"
 *
 * Each thread sums its own contiguous part of one MIB-MiB buffer (default 1024: past the caches, L3 included)
 * as 64-bit words with 8 independent accumulators (the compiler vectorises the loop; AVX2 loads where
 * the CPU has them); GB/s = bytes read / wall time of the slowest thread, best of 7 passes. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

struct part {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
};

__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *p, size_t n) {
    uint64_t a[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) a[k] += p[i + k];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

static uint64_t sum_base(const uint64_t *p, size_t n) {
    uint64_t a[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) a[k] += p[i + k];
    return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

static int have_avx2;

static void *run(void *v) {
    struct part *pt = v;
    pt->sum = have_avx2 ? sum_avx2(pt->p, pt->n) : sum_base(pt->p, pt->n);
    return NULL;
}

int main(int argc, char **argv) {
    const int nt = argc > 1 ? atoi(argv[1]) : 1;
    const size_t mib = argc > 2 ? (size_t)atoi(argv[2]) : 1024;
    if (nt < 1 || nt > 256 || mib < 1) return fprintf(stderr, "usage: bench_membw [THREADS [MIB]]\n"), 2;
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
    const size_t n = mib << 17; /* 64-bit words */
    uint64_t *buf = xmalloc(n * sizeof *buf);
    for (size_t i = 0; i < n; i++) buf[i] = i; /* touch every page */
    double best = 1e30;
    uint64_t check = 0;
    for (int pass = 0; pass < 7; pass++) {
        pthread_t th[256];
        struct part pt[256];
        const double t0 = now_sec();
        for (int t = 0; t < nt; t++) {
            const size_t a = n / nt * t, b = t == nt - 1 ? n : n / nt * (t + 1);
            pt[t] = (struct part){buf + a, b - a, 0};
            if (t) pthread_create(&th[t], NULL, run, &pt[t]);
        }
        run(&pt[0]);
        for (int t = 1; t < nt; t++) pthread_join(th[t], NULL);
        const double dt = now_sec() - t0;
        best = dt < best ? dt : best;
        for (int t = 0; t < nt; t++) check += pt[t].sum;
    }
    printf("read GB/s: %.2f (%d threads, %zu MiB, best of 7; checksum %llu)\n", (double)n * 8 / best / 1e9, nt, mib,
           (unsigned long long)(check & 0xffff));
    free(buf);
    return 0;
}
