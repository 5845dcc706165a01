/* mma_stub.cpp - run_moe.sh's stand-in for src/cuda/matmul_mma.cu: the int8 tensor-core kernels
 * (mma.sync) are not emulated, so moe_q8_mma_supported says 0 and test_cuda_moe skips them. */
#include <stdint.h>
struct cuda_weight;
typedef struct CUstream_st *cudaStream_t;
extern "C" {
int moe_q8_mma_supported(const struct cuda_weight *, int) { return 0; }
void moe_q8_mma_tune(int, int) {}
void moe_q8_mma_cuda(float *, int, const struct cuda_weight *, int, const int32_t *, const int32_t *, const int32_t *, int,
                     const int8_t *, const float *, int, int, cudaStream_t) {}
}
