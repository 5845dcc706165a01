/* probe_check.h - CK(call): a CUDA runtime call whose error ends the probe with its file, line and
 * message (exit 1). Used by the probes here through ffn_common.cuh. */
#ifndef PXQ_DEV_PROBE_CHECK_H
#define PXQ_DEV_PROBE_CHECK_H

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CK(x)                                                                             \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#endif
