/* emu.cpp - the fiber scheduler, barriers, shuffles and the few CUDA runtime calls the test uses
 * (host memory stands in for device memory). See run.sh. */
#include <ucontext.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "emu.h"
emu_idx threadIdx, blockIdx, blockDim, gridDim;
float sm[1 << 16];
float4 sm4[1 << 16];
struct fiber { ucontext_t ctx; int done; int tid; };
static std::vector<fiber> F;
static std::vector<char> stacks;
static ucontext_t sched;
static int cur, n_thr, alive, blk_arr, blk_gen;
static int w_arr[32], w_gen[32], w_alive[32];
static float slot[1024];
static void (*g_body)(void *);
static void *g_arg;
#define STK (256 * 1024)
static void yield_() { swapcontext(&F[cur].ctx, &sched); }
void __syncthreads() {
    int g = blk_gen;
    if (++blk_arr == alive) blk_arr = 0, blk_gen++;
    while (blk_gen == g) yield_();
}
static void warp_bar() {
    int w = F[cur].tid >> 5, g = w_gen[w];
    if (++w_arr[w] == w_alive[w]) w_arr[w] = 0, w_gen[w]++;
    while (w_gen[w] == g) yield_();
}
float emu_shfl(float v, int s, int mode) {
    int tid = F[cur].tid, lane = tid & 31, base = tid - lane;
    if (w_alive[tid >> 5] != 32) { fprintf(stderr, "emu: shuffle in a partial warp\n"); abort(); }
    slot[tid] = v;
    warp_bar();
    int src = mode == 0 ? (s & 31) : mode == 1 ? (lane ^ s) : (lane - s);
    float r = mode == 2 && lane < s ? v : slot[base + src];
    warp_bar();
    return r;
}
static void entry() {
    g_body(g_arg);
    F[cur].done = 1;
    alive--;
    int w = F[cur].tid >> 5;
    w_alive[w]--;
    if (blk_arr > 0 && blk_arr == alive) blk_arr = 0, blk_gen++;
    if (w_arr[w] > 0 && w_arr[w] == w_alive[w]) w_arr[w] = 0, w_gen[w]++;
    swapcontext(&F[cur].ctx, &sched);
}
void emu_run(dim3 grid, dim3 block, void (*body)(void *), void *arg) {
    n_thr = block.x * block.y * block.z;
    if (block.y != 1 || block.z != 1 || n_thr > 1024) { fprintf(stderr, "emu: block\n"); abort(); }
    g_body = body, g_arg = arg;
    F.resize(n_thr);
    if (stacks.size() < (size_t)n_thr * STK) stacks.resize((size_t)n_thr * STK);
    gridDim = {grid.x, grid.y, grid.z};
    blockDim = {block.x, 1, 1};
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                blockIdx = {bx, by, bz};
                alive = n_thr, blk_arr = 0, blk_gen = 0;
                memset(w_arr, 0, sizeof w_arr);
                for (int w = 0; w < 32; w++) w_alive[w] = std::max(0, std::min(32, n_thr - 32 * w));
                for (int t = 0; t < n_thr; t++) {
                    F[t].done = 0, F[t].tid = t;
                    getcontext(&F[t].ctx);
                    F[t].ctx.uc_stack.ss_sp = &stacks[(size_t)t * STK];
                    F[t].ctx.uc_stack.ss_size = STK;
                    F[t].ctx.uc_link = NULL;
                    makecontext(&F[t].ctx, entry, 0);
                }
                /* poison shared memory per block */
                memset(sm, 0xff, sizeof sm), memset(sm4, 0xff, sizeof sm4);
                int left = n_thr;
                static std::vector<int> ord;
                static unsigned seed = getenv("EMU_SHUFFLE") ? atoi(getenv("EMU_SHUFFLE")) : 0;
                ord.resize(n_thr);
                for (int t = 0; t < n_thr; t++) ord[t] = t;
                while (left > 0) {
                    if (seed) for (int i = n_thr - 1; i > 0; i--) { seed = seed * 1103515245u + 12345u; int j = (seed >> 8) % (i + 1); std::swap(ord[i], ord[j]); }
                    for (int tt = 0; tt < n_thr; tt++) {
                        int t = ord[tt];
                        if (F[t].done) continue;
                        cur = t;
                        threadIdx = {(unsigned)t, 0, 0};
                        swapcontext(&sched, &F[t].ctx);
                        if (F[t].done) left--;
                    }
                }
            }
}
/* runtime */
extern "C" {
cudaError_t cudaMalloc(void **p, size_t n) { *p = malloc(n ? n : 1); return cudaSuccess; }
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind) { memcpy(d, s, n); return cudaSuccess; }
cudaError_t cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t) { return "emu"; }
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
/* an H200's: 227 KiB of shared memory per block (EMU_SMEM), 132 SMs of 228 KiB and 2048 threads */
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int) {
    *v = a == cudaDevAttrMaxSharedMemoryPerBlockOptin ? (getenv("EMU_SMEM") ? atoi(getenv("EMU_SMEM")) : 232448)
         : a == cudaDevAttrMultiProcessorCount        ? 132
                                                      : 0;
    return cudaSuccess;
}
/* resident blocks per SM by threads and shared memory only (1 KiB reserved per block; registers not modelled) */
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *, int threads, size_t smem) {
    const int by_thr = 2048 / threads, by_smem = (int)(233472 / (smem + 1024));
    *n = std::min(32, std::min(by_thr, by_smem));
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *, enum cudaFuncAttribute, int v) {
    if (v > (int)sizeof sm4) { fprintf(stderr, "emu: smem %d\n", v); abort(); }
    return cudaSuccess;
}
}
extern "C" {
thread_local int cuda_pdl = 0;
int cuda_pdl_supported(void) { return 0; }
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = (cudaEvent_t)malloc(8); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) { *ms = 1; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
}
