/* read_stream.cu - how fast can the GPU read its memory, and how fast the decode mat-vec's access
 * pattern? The bench's roofline is the device-to-device copy (bytes read + written); a batch-1
 * decode step only reads. This measures read-only rates to put the mat-vecs' figures beside.
 * (docs/PERF.md, sixteenth session.)
 *   copy:    cudaMemcpy device to device of 1 GiB, bytes read + written (the bench's roofline).
 *   stream:  every thread reads 16-byte words grid-stride over the buffer, U loads in flight a
 *            thread, 1024-thread blocks, 4 a SM (the simplest read at full occupancy).
 *   matvec:  the dp4a mat-vec's pattern without its arithmetic: Qwen3-32B's gate|up shape in the
 *            backend's Q4_0 layout (codes [n_out][2560 bytes], half scales [n_out][320 bytes]),
 *            one-warp blocks of R rows, a lane loads one 16-byte code word and one 2-byte scale of
 *            each row a step (32 groups a step, 5 steps a row), one step ahead, as matmul_q8_kernel
 *            does; R 2 and 4, and the o/down shape's two-warp blocks (n_in 25600: 13 steps).
 * Each kernel xors what it reads into one word a thread so nothing is optimised away. The buffers
 * rotate through 4 GiB, so the L2 (50 MiB) holds nothing between calls. Ten calls back to back,
 * best of 20 such runs.
 * Build and run on the GPU: nvcc -arch=sm_90 -O3 -o /tmp/read_stream tools/cuda_probe/read_stream.cu
 * && /tmp/read_stream */
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "probe_check.h"

template <int U>
__global__ void stream_kernel(const uint4 *__restrict__ p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = i + u * stride < n ? __ldg(p + i + u * stride) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

/* rows of cb code bytes and sb scale bytes; block = NWARP warps over R rows, lane = a 32-weight
 * group (16 code bytes, one half scale), the warps split the groups (as matmul_q8_kernel) */
template <int R>
__global__ void matvec_kernel(const uint8_t *__restrict__ q, const uint16_t *__restrict__ s, int n_out, int ng,
                              unsigned *sink) {
    const int row0 = blockIdx.x * R;
    unsigned acc = 0;
    int g = threadIdx.x;
    uint4 cur[R];
    unsigned short sc[R];
    auto load = [&](int gg, uint4 (&o)[R], unsigned short (&os)[R]) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int row = min(row0 + r, n_out - 1);
            o[r] = __ldg((const uint4 *)(q + (size_t)row * ng * 16 + (size_t)gg * 16));
            os[r] = __ldg(s + (size_t)row * ng + gg);
        }
    };
    if (g < ng) load(g, cur, sc);
    while (g < ng) {
        const int gn = g + blockDim.x;
        uint4 nx[R];
        unsigned short ns[R];
        if (gn < ng) load(gn, nx, ns);
#pragma unroll
        for (int r = 0; r < R; r++) acc ^= cur[r].x ^ cur[r].y ^ cur[r].z ^ cur[r].w ^ sc[r];
#pragma unroll
        for (int r = 0; r < R; r++) cur[r] = nx[r], sc[r] = ns[r];
        g = gn;
    }
    if (acc == 0x12345678u) sink[0] = acc;
}

int main() {
    const size_t total = (size_t)4 << 30;
    uint8_t *buf;
    unsigned *sink;
    CK(cudaMalloc(&buf, total));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(buf, 0x5a, total));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    int n_sm = 0;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    auto timeit = [&](const char *name, double bytes, int slots, auto launch) {
        float best = 1e30f, ms;
        for (int rep = 0; rep < 21; rep++) {
            CK(cudaEventRecord(e0));
            for (int j = 0; j < 10; j++) launch((rep * 10 + j) % slots); /* back to back: launch gaps hidden */
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (rep > 0 && ms < best) best = ms;
        }
        best /= 10;
        printf("%-44s %9.1f us  %7.1f GB/s\n", name, best * 1e3, bytes / (best * 1e-3) / 1e9);
    };
    const size_t cp = (size_t)1 << 30;
    timeit("copy 1 GiB (read + write)", 2.0 * cp, 2, [&](int k) {
        CK(cudaMemcpyAsync(buf + (2 + k) * cp, buf + k * cp, cp, cudaMemcpyDeviceToDevice));
    });
    const size_t sb = (size_t)1 << 30; /* stream reads 1 GiB from one of 4 slices */
    timeit("stream 1 GiB, 4 loads a thread", (double)sb, 4, [&](int k) {
        stream_kernel<4><<<n_sm * 2, 1024>>>((const uint4 *)(buf + k * sb), sb / 16, sink);
    });
    timeit("stream 1 GiB, 8 loads a thread", (double)sb, 4, [&](int k) {
        stream_kernel<8><<<n_sm * 2, 1024>>>((const uint4 *)(buf + k * sb), sb / 16, sink);
    });
    struct shape { const char *name; int n_out, n_in, warps, R; };
    const shape sh[] = {{"matvec gate|up 51200x5120, 1 warp, R 2", 51200, 5120, 1, 2},
                        {"matvec gate|up 51200x5120, 1 warp, R 4", 51200, 5120, 1, 4},
                        {"matvec q|k|v 10240x5120, 1 warp, R 4", 10240, 5120, 1, 4},
                        {"matvec down 5120x25600, 2 warps, R 2", 5120, 25600, 2, 2},
                        {"matvec o 5120x8192, 2 warps, R 2", 5120, 8192, 2, 2}};
    for (const shape &h : sh) {
        const int ng = h.n_in / 32;
        const size_t bytes = (size_t)h.n_out * ng * 18, slot = (bytes + 4095) / 4096 * 4096;
        const int slots = (int)(total / slot) < 20 ? (int)(total / slot) : 20;
        timeit(h.name, (double)bytes, slots, [&](int k) {
            const uint8_t *q = buf + k * slot;
            const uint16_t *s = (const uint16_t *)(q + (size_t)h.n_out * ng * 16);
            const unsigned grid = (unsigned)((h.n_out + h.R - 1) / h.R);
            if (h.R == 2) matvec_kernel<2><<<grid, 32 * h.warps>>>(q, s, h.n_out, ng, sink);
            else matvec_kernel<4><<<grid, 32 * h.warps>>>(q, s, h.n_out, ng, sink);
        });
    }
    return 0;
}
