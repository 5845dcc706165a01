/* probe.cuh - %globaltimer stamps inside kernels, for finding where a small kernel's time goes
 * (a build with -DPXQ_PROBE only, `make PROBE=1`; without it every macro is empty).
 * Block (0,0,0)'s thread 0 stamps slot s of the kernel's ring entry; each translation unit has its
 * own buffers (no relocatable device code). At exit the host prints, per kernel id and slot, the
 * mean over the last PROBE_RING launches of (slot s - slot 1), slot 1 being the stamp after
 * pdl_wait, in us. Usage in a kernel: PROBE_BEGIN(k) at its start (stamps slot 0), PROBE(s) where
 * wanted; in the TU's host code: PROBE_HOST(tu, names) once and PROBE_REGISTER(tu) before launches.
 * CPU twin: none (a timing probe).
 */
#ifndef PXQ_CUDA_PROBE_CUH
#define PXQ_CUDA_PROBE_CUH
#ifdef PXQ_PROBE
#include <stdio.h>
#include <stdlib.h>
#define PROBE_NK 4
#define PROBE_NS 10
#define PROBE_RING 128
static __device__ unsigned long long probe_buf[PROBE_NK][PROBE_RING][PROBE_NS];
static __device__ unsigned probe_calls[PROBE_NK];
static __device__ __forceinline__ unsigned long long probe_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define PROBE_BEGIN(k)                                                                                  \
    const int probe_k_ = (k);                                                                           \
    const bool probe_on_ = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0; \
    unsigned probe_i_ = 0;                                                                              \
    if (probe_on_) {                                                                                    \
        probe_i_ = atomicAdd(&probe_calls[probe_k_], 1u) % PROBE_RING;                                  \
        for (int s_ = 1; s_ < PROBE_NS; s_++) probe_buf[probe_k_][probe_i_][s_] = 0;                   \
        probe_buf[probe_k_][probe_i_][0] = probe_now();                                                 \
    }
#define PROBE(s)                                                                   \
    do {                                                                           \
        if (probe_on_) probe_buf[probe_k_][probe_i_][(s)] = probe_now();           \
    } while (0)
/* names[k][s]: NULL for unused */
#define PROBE_HOST(tu, names)                                                                              \
    static int probe_reg_##tu;                                                                             \
    static void probe_dump_##tu(void) {                                                                    \
        static unsigned long long h[PROBE_NK][PROBE_RING][PROBE_NS];                                       \
        unsigned calls[PROBE_NK];                                                                          \
        if (cudaMemcpyFromSymbol(h, probe_buf, sizeof h) != cudaSuccess ||                                 \
            cudaMemcpyFromSymbol(calls, probe_calls, sizeof calls) != cudaSuccess) {                       \
            fprintf(stderr, "probe " #tu ": copy failed\n");                                               \
            return;                                                                                        \
        }                                                                                                  \
        for (int k = 0; k < PROBE_NK; k++) {                                                               \
            if (!calls[k]) continue;                                                                       \
            const int n = calls[k] < PROBE_RING ? (int)calls[k] : PROBE_RING;                               \
            for (int s = 0; s < PROBE_NS; s++) {                                                           \
                if (!names[k][s]) continue;                                                                \
                double sum = 0;                                                                            \
                int m = 0;                                                                                 \
                for (int i = 0; i < n; i++)                                                                \
                    if (h[k][i][1] && h[k][i][s]) sum += (double)(long long)(h[k][i][s] - h[k][i][1]), m++; \
                printf("probe %-8s %-28s %8.2f us after the wait (%d of %u calls)\n", #tu, names[k][s],     \
                       m ? sum / m / 1000.0 : 0.0, m, calls[k]);                                           \
            }                                                                                              \
        }                                                                                                  \
    }
#define PROBE_REGISTER(tu)                                          \
    do {                                                            \
        if (!probe_reg_##tu) probe_reg_##tu = 1, atexit(probe_dump_##tu); \
    } while (0)
#else
#define PROBE_BEGIN(k)
#define PROBE(s) ((void)0)
#define PROBE_HOST(tu, names)
#define PROBE_REGISTER(tu) ((void)0)
#endif
#endif
