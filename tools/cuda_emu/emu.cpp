/* emu.cpp - the fiber scheduler, barriers, shuffles, thread block clusters and the few CUDA runtime
 * calls the test uses (host memory stands in for device memory). See run.sh.
 * A launch runs its clusters one after another (a cluster of one block without the cluster
 * attribute); the threads of a cluster's blocks are fibers run together, so __syncthreads is a
 * barrier of one block's fibers and the cluster barrier one of all of them. Each block has its own
 * shared memory (emu_dshared, emu_sshared), poisoned with NaN at its start. */
#include <ucontext.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include "emu.h"
emu_idx threadIdx, blockIdx, blockDim, gridDim;
float sm[1 << 16];   /* the shared memory of code that xform.py's --shared does not rewrite */
float4 sm4[1 << 16];
#define MAX_CL 16                 /* blocks a cluster */
#define ARENA (512 * 1024)        /* a block's shared memory: dynamic from 0, static from ARENA / 2 */
struct fiber { ucontext_t ctx; int done; int tid, blk, cl_gen; };
static std::vector<fiber> F;
static std::vector<char> stacks;
static std::vector<char> arena; /* MAX_CL x ARENA */
static ucontext_t sched;
static int cur, n_thr, n_blk, wpb;
static int b_alive[MAX_CL], b_arr[MAX_CL], b_gen[MAX_CL], b_or[MAX_CL], b_res[MAX_CL];
static int cl_alive, cl_arr, cl_gen;
static int w_arr[MAX_CL * 32], w_gen[MAX_CL * 32], w_alive[MAX_CL * 32];
static float slot[MAX_CL * 1024];
static emu_idx blk_idx[MAX_CL];
static void (*g_body)(void *);
static void *g_arg;
#define STK (256 * 1024)
static void yield_() { swapcontext(&F[cur].ctx, &sched); }
static int block_bar(int pred) { /* every live fiber of this block; returns the OR of pred */
    const int b = F[cur].blk, g = b_gen[b];
    b_or[b] |= pred;
    if (++b_arr[b] == b_alive[b]) b_res[b] = b_or[b], b_or[b] = 0, b_arr[b] = 0, b_gen[b]++;
    while (b_gen[b] == g) yield_();
    return b_res[b];
}
void __syncthreads() { (void)block_bar(0); }
int __syncthreads_or(int pred) { return block_bar(pred != 0); }
static int warp_of(int f) { return F[f].blk * 32 + (F[f].tid >> 5); }
static void warp_bar() {
    int w = warp_of(cur), g = w_gen[w];
    if (++w_arr[w] == w_alive[w]) w_arr[w] = 0, w_gen[w]++;
    while (w_gen[w] == g) yield_();
}
float emu_shfl(float v, int s, int mode) {
    int tid = F[cur].tid, lane = tid & 31, base = F[cur].blk * 1024 + tid - lane;
    if (w_alive[warp_of(cur)] != 32) { fprintf(stderr, "emu: shuffle in a partial warp\n"); abort(); }
    slot[base + lane] = v;
    warp_bar();
    int src = mode == 0 ? (s & 31) : mode == 1 ? (lane ^ s) : (lane - s);
    float r = mode == 2 && lane < s ? v : slot[base + src];
    warp_bar();
    return r;
}
unsigned emu_ballot(int pred) {
    int tid = F[cur].tid, lane = tid & 31, base = F[cur].blk * 1024 + tid - lane;
    if (w_alive[warp_of(cur)] != 32) { fprintf(stderr, "emu: ballot in a partial warp\n"); abort(); }
    slot[base + lane] = pred ? 1.0f : 0.0f;
    warp_bar();
    unsigned r = 0;
    for (int k = 0; k < 32; k++) r |= (slot[base + k] != 0.0f ? 1u : 0u) << k;
    warp_bar();
    return r;
}
/* cluster barrier: arrive, then wait for the generation after this fiber's arrival */
void emu_cluster_arrive() {
    F[cur].cl_gen = cl_gen;
    if (++cl_arr == cl_alive) cl_arr = 0, cl_gen++;
}
void emu_cluster_wait() {
    while (cl_gen == F[cur].cl_gen) yield_();
}
unsigned emu_cluster_blocks() { return (unsigned)n_blk; }
void *emu_map_rank(void *p, unsigned rank) {
    char *mine = &arena[(size_t)F[cur].blk * ARENA];
    const ptrdiff_t off = (char *)p - mine;
    if (off < 0 || off >= ARENA || rank >= (unsigned)n_blk) { fprintf(stderr, "emu: map_shared_rank\n"); abort(); }
    return &arena[(size_t)rank * ARENA + off];
}
void *emu_dshared() { return &arena[(size_t)F[cur].blk * ARENA]; }
void *emu_sshared(int key, size_t bytes) { /* the same offset in every block, per call site */
    static int keys[256];
    static size_t offs[256];
    static int n_keys;
    static size_t top = ARENA / 2;
    for (int i = 0; i < n_keys; i++)
        if (keys[i] == key) return &arena[(size_t)F[cur].blk * ARENA + offs[i]];
    if (n_keys == 256 || top + bytes > ARENA) { fprintf(stderr, "emu: static shared memory\n"); abort(); }
    keys[n_keys] = key, offs[n_keys] = top, n_keys++;
    top += (bytes + 15) / 16 * 16;
    return &arena[(size_t)F[cur].blk * ARENA + offs[n_keys - 1]];
}
static void entry() {
    g_body(g_arg);
    const int b = F[cur].blk, w = warp_of(cur);
    F[cur].done = 1;
    b_alive[b]--, w_alive[w]--, cl_alive--;
    if (b_arr[b] > 0 && b_arr[b] == b_alive[b]) b_res[b] = b_or[b], b_or[b] = 0, b_arr[b] = 0, b_gen[b]++;
    if (w_arr[w] > 0 && w_arr[w] == w_alive[w]) w_arr[w] = 0, w_gen[w]++;
    if (cl_arr > 0 && cl_arr == cl_alive) cl_arr = 0, cl_gen++;
    swapcontext(&F[cur].ctx, &sched);
}
void emu_run(dim3 grid, dim3 block, unsigned cluster_x, void (*body)(void *), void *arg) {
    n_thr = block.x * block.y * block.z;
    if (block.y != 1 || block.z != 1 || n_thr > 1024) { fprintf(stderr, "emu: block\n"); abort(); }
    if (cluster_x < 1 || cluster_x > MAX_CL || grid.x % cluster_x) { fprintf(stderr, "emu: cluster\n"); abort(); }
    n_blk = (int)cluster_x, wpb = (n_thr + 31) / 32;
    g_body = body, g_arg = arg;
    const int n_fib = n_blk * n_thr;
    F.resize(n_fib);
    if (stacks.size() < (size_t)n_fib * STK) stacks.resize((size_t)n_fib * STK);
    if (arena.size() < (size_t)MAX_CL * ARENA) arena.resize((size_t)MAX_CL * ARENA);
    gridDim = {grid.x, grid.y, grid.z};
    blockDim = {block.x, 1, 1};
    static std::vector<int> ord;
    static unsigned seed = getenv("EMU_SHUFFLE") ? atoi(getenv("EMU_SHUFFLE")) : 0;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx0 = 0; bx0 < grid.x; bx0 += cluster_x) {
                cl_alive = n_fib, cl_arr = 0, cl_gen = 0;
                memset(w_arr, 0, sizeof w_arr), memset(w_alive, 0, sizeof w_alive);
                for (int b = 0; b < n_blk; b++) {
                    blk_idx[b] = {bx0 + b, by, bz};
                    b_alive[b] = n_thr, b_arr[b] = 0, b_gen[b] = 0, b_or[b] = 0;
                    for (int w = 0; w < wpb; w++) w_alive[b * 32 + w] = std::max(0, std::min(32, n_thr - 32 * w));
                }
                for (int f = 0; f < n_fib; f++) {
                    F[f].done = 0, F[f].tid = f % n_thr, F[f].blk = f / n_thr, F[f].cl_gen = 0;
                    getcontext(&F[f].ctx);
                    F[f].ctx.uc_stack.ss_sp = &stacks[(size_t)f * STK];
                    F[f].ctx.uc_stack.ss_size = STK;
                    F[f].ctx.uc_link = NULL;
                    makecontext(&F[f].ctx, entry, 0);
                }
                /* poison shared memory per cluster (every block's) */
                memset(sm, 0xff, sizeof sm), memset(sm4, 0xff, sizeof sm4);
                memset(arena.data(), 0xff, (size_t)n_blk * ARENA);
                int left = n_fib;
                ord.resize(n_fib);
                for (int f = 0; f < n_fib; f++) ord[f] = f;
                while (left > 0) {
                    if (seed) for (int i = n_fib - 1; i > 0; i--) { seed = seed * 1103515245u + 12345u; int j = (seed >> 8) % (i + 1); std::swap(ord[i], ord[j]); }
                    for (int ff = 0; ff < n_fib; ff++) {
                        int f = ord[ff];
                        if (F[f].done) continue;
                        cur = f;
                        threadIdx = {(unsigned)F[f].tid, 0, 0};
                        blockIdx = blk_idx[F[f].blk];
                        swapcontext(&sched, &F[f].ctx);
                        if (F[f].done) left--;
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
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *, const void *) { return cudaErrorInvalidDeviceFunction; }
cudaError_t cudaFuncSetAttribute(const void *, enum cudaFuncAttribute, int v) {
    if (v > (int)sizeof sm4) { fprintf(stderr, "emu: smem %d\n", v); abort(); }
    return cudaSuccess;
}
}
extern "C" {
thread_local int cuda_pdl = 0;
/* EMU_CLUSTERS=1: report an sm_90 device, so the thread-block-cluster launches run (emulated) */
int cuda_pdl_supported(void) { return getenv("EMU_CLUSTERS") && atoi(getenv("EMU_CLUSTERS")); }
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = (cudaEvent_t)malloc(8); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) { *ms = 1; return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
}
