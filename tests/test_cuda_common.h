/* test_cuda_common.h - shared by tests/test_cuda_*.c: the device gate and the normalised error.
 *
 * Without a CUDA device (or in a build without CUDA) a test prints "SKIP: no CUDA device" and exits
 * 0, so `make test` passes on CI machines; with PXQ_TEST_CUDA=1 (set by `make test-cuda`) the same
 * situation is a failure. */
#ifndef PXQ_TEST_CUDA_COMMON_H
#define PXQ_TEST_CUDA_COMMON_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PXQ_CUDA
#include <cuda_runtime_api.h>
#endif

/* -1: a device is there, run; otherwise the exit code to return at once. */
static inline int cuda_test_gate(const char *name) {
    int n = 0;
#ifdef PXQ_CUDA
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
#endif
    if (n > 0) return -1;
    const char *req = getenv("PXQ_TEST_CUDA");
    if (req && strcmp(req, "1") == 0) {
        fprintf(stderr, "%s: FAIL: no CUDA device (PXQ_TEST_CUDA=1 asks for one)\n", name);
        return 1;
    }
    printf("SKIP: no CUDA device (%s)\n", name);
    return 0;
}

/* ||a - b|| / ||b|| in double; NaN anywhere gives +inf. */
static inline double norm_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
