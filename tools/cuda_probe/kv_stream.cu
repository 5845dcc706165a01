/* kv_stream.cu - the DRAM rate of the decode attention's KV access pattern with no arithmetic: is
 * the paged cache's layout, or the block table, what holds attention_decode_kernel below the copy
 * bandwidth? (docs/PERF.md, tenth session: no; 3.7-3.9 TB/s for every layout.)
 *
 * Qwen3-32B's shape at 32K positions: 8 KV heads of head_dim 128, f16, 64 layers (a call reads
 * layer it % 64, so the L2 keeps nothing between calls). grid (splits, KV heads), 4 warps; warp w
 * copies tiles w, w + 4, ... of 16 positions (K and V rows of 256 bytes) through its own ring of NS
 * cp.async stages, as the kernel does, and touches one word of each. Layouts:
 *   0: [block][layer][slot][kv head][D]  (the cache's, kvcache.h)
 *   1: [block][layer][kv head][slot][D]  (a head's 16 rows contiguous)
 *   2: [kv head][position][D]            (one stream per head)
 *   3: layout 0 through a random block table read per tile
 * Build and run on the GPU: nvcc -arch=sm_90 -O3 -o kv_stream tools/cuda_probe/kv_stream.cu && ./kv_stream
 * (needs 8.6 GB of device memory). Prints us a call and GB/s for each. */
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cuda_fp16.h>
#define D 128
#define BN 16
#define NL 64
#define NKV 8
#define NPOS 32768
static __device__ __forceinline__ void cpa(void *s, const void *g) {
    unsigned a = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(g));
}
template <int NS, int LAY>
__global__ void __launch_bounds__(128) probe(const __half *K, const __half *V, int l, int split_len, float *sink, const int *tab) {
    extern __shared__ uint4 sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int split = blockIdx.x, h = blockIdx.y;
    constexpr int SD = D + 8;
    __half *ring = (__half *)sm + (size_t)warp * NS * 2 * BN * SD;
    const int p0 = split * split_len, n_tiles = split_len / BN;
    const int my_n = (n_tiles - warp + 3) / 4;
    const int lr = lane / 16, cc = (lane % 16) * 8;
    auto off = [&](int p) -> size_t {
        const size_t b = LAY == 3 ? (size_t)tab[p / BN] : p / BN, s = p % BN;
        if (LAY == 0 || LAY == 3) return (((b * NL + l) * BN + s) * NKV + h) * D;
        if (LAY == 1) return (((b * NL + l) * NKV + h) * BN + s) * D;
        return ((size_t)h * NPOS + p) * D + (size_t)l * 0;
    };
    auto load = [&](int i, int st) {
        __half *Kd = ring + st * 2 * BN * SD, *Vd = Kd + BN * SD;
        const int j0 = p0 + (warp + i * 4) * BN;
#pragma unroll
        for (int k = 0; k < BN / 2; k++) {
            const int r = lr + 2 * k;
            const size_t o = off(j0 + r) + cc;
            cpa(Kd + r * SD + cc, K + o);
            cpa(Vd + r * SD + cc, V + o);
        }
    };
    uint32_t acc = 0;
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
        if (i < my_n) load(i, i);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    for (int i = 0; i < my_n; i++) {
        if (i + NS - 1 < my_n) load(i + NS - 1, (i + NS - 1) % NS);
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(NS - 1) : "memory");
        __syncwarp();
        const uint32_t *s = (const uint32_t *)(ring + (i % NS) * 2 * BN * SD);
        acc ^= s[lane * 17] + s[BN * SD / 2 + lane * 17];
        __syncwarp();
    }
    if (acc == 0x12345678u) sink[0] = 1.0f;
}
template <int NS, int LAY>
static void run(const __half *K, const __half *V, float *sink, int bps, const char *name, const int *tab = 0) {
    const int n_split = 132 * bps / NKV + (132 * bps % NKV != 0);
    int split_len = (NPOS + n_split - 1) / n_split;
    split_len = (split_len + 63) / 64 * 64;
    const int ns = (NPOS + split_len - 1) / split_len;
    const size_t smem = (size_t)4 * NS * 2 * BN * (D + 8) * 2;
    cudaFuncSetAttribute(probe<NS, LAY>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    // last split may be partial: only full splits counted; use NPOS multiple
    dim3 grid(NPOS / split_len, NKV);
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    for (int it = 0; it < 20; it++) probe<NS, LAY><<<grid, 128, smem>>>(K, V, it % NL, split_len, sink, tab);
    const int N = 200;
    cudaEventRecord(a);
    for (int it = 0; it < N; it++) probe<NS, LAY><<<grid, 128, smem>>>(K, V, it % NL, split_len, sink, tab);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    const double us = ms * 1e3 / N;
    const double bytes = (double)(NPOS / split_len) * split_len * NKV * D * 2 * 2;
    printf("%-28s NS %d bps %d splits %d len %d: %.2f us  %.1f GB/s (err %s)\n", name, NS, bps, ns, split_len, us,
           bytes / us / 1e3, cudaGetErrorString(cudaGetLastError()));
}
int main() {
    const size_t n = (size_t)NPOS * NL * NKV * D;
    __half *K, *V;
    float *sink;
    if (cudaMalloc(&K, n * 2) || cudaMalloc(&V, n * 2) || cudaMalloc(&sink, 4)) return 1;
    cudaMemset(K, 0, n * 2), cudaMemset(V, 0, n * 2);
    int *tab, *ht = (int *)malloc(NPOS / BN * 4);
    for (int i = 0; i < NPOS / BN; i++) ht[i] = i;
    for (int i = NPOS / BN - 1; i > 0; i--) { int j = rand() % (i + 1), t = ht[i]; ht[i] = ht[j], ht[j] = t; }
    cudaMalloc(&tab, NPOS / BN * 4);
    cudaMemcpy(tab, ht, NPOS / BN * 4, cudaMemcpyHostToDevice);
    run<2, 3>(K, V, sink, 2, "current + random table", tab);
    run<2, 3>(K, V, sink, 2, "current + random table", tab);
    for (int rep = 0; rep < 2; rep++) {
        run<2, 0>(K, V, sink, 2, "current [slot][kvh][D]");
        run<2, 1>(K, V, sink, 2, "head-major [kvh][slot][D]");
        run<2, 2>(K, V, sink, 2, "per-head stream");
        run<3, 0>(K, V, sink, 2, "current [slot][kvh][D]");
        run<3, 1>(K, V, sink, 2, "head-major [kvh][slot][D]");
        run<4, 0>(K, V, sink, 1, "current [slot][kvh][D]");
        run<4, 1>(K, V, sink, 1, "head-major [kvh][slot][D]");
        run<2, 0>(K, V, sink, 3, "current [slot][kvh][D]");
        run<2, 1>(K, V, sink, 3, "head-major [kvh][slot][D]");
    }
    return 0;
}
