/* matmul.cu - matmul_cpu's CUDA twins: fused dequant mat-vecs for decode, dequantized rows for the
 * embedding and the prefill tiles (cuBLAS, forward.cu).
 *
 * Two mat-vecs, both reading each weight once for up to 16 token columns:
 *   matmul_gemv_cuda: float32 activations, fp32 FMAs; every weight format (exact mode, Q8M).
 *   matmul_q8_cuda:   activations quantized to int8 per 32 (llama.cpp's q8_1: d = max|x|/127,
 *                     s = d * sum q), integer dot products with __dp4a (sm_61+), fp32 scale per
 *                     group; Q4_0, Q8_0, Q4M. w.x = d_w (d_x sum (nib q) - 8 s_x) for Q4_0.
 *                     Lane = one whole group (16-byte loads).
 * Both use blocks of warps over R rows (the fp32 one 4, 8 from 5 tokens, 1 where those would leave
 * SMs without a block; the q8 one 1..8, by shape); the warps split
 * n_in (coalesced loads: consecutive lanes read consecutive bytes) and meet in shared memory.
 * Everything here compiles for sm_70 (V100) and up.
 * CPU twin: matmul_cpu (ops_cpu.c), and tensor_row_f32 for the dequantized rows.
 */
#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>

#include "cuda/common.cuh"
#include "cuda/probe.cuh"
#include "cuda/launch.cuh"
#include "cuda/mma.cuh"
#include "cuda/ops_cuda.h"
#include "cuda/wload.cuh"

#define MM_WARPS 4       /* warps per block of the fp32 mat-vec */
#define MM_WARPS_MAX 8   /* the q8 mat-vec's most warps per block */

/* Sum acc[R][NT] over the block (lanes by shuffles, warps through shared memory) and store rows
 * row0.. of y (adding to y if accumulate). */
template <int NT, int R>
static __device__ __forceinline__ void block_store(float (&acc)[R][NT], float *y, int row0, int n_out, int n_tok,
                                                   int ldy, int accumulate) {
    __shared__ float red[MM_WARPS_MAX][R * NT];
    const int n_warps = blockDim.x >> 5;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = warp_sum(acc[r][t]);
            if (lane == 0) red[warp][r * NT + t] = s;
        }
    __syncthreads();
    for (int i = threadIdx.x; i < R * NT; i += blockDim.x) {
        const int r = i / NT, t = i - r * NT;
        if (row0 + r < n_out && t < n_tok) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < n_warps; k++) s += red[k][i];
            float *o = y + (size_t)t * ldy + row0 + r;
            *o = accumulate ? *o + s : s;
        }
    }
}

/* ---- fp32 mat-vec ---- */

/* Grid: (row blocks of R, token chunks): chunk blockIdx.y takes tokens blockIdx.y * NT .. of which
 * n_tok (<= NT) are present. */
template <int F, int NT, int R>
__global__ void __launch_bounds__(MM_WARPS * 32) matmul_gemv_kernel(float *__restrict__ y, const cuda_weight w,
                                                                  const float *__restrict__ x, int n_tok, int ldy,
                                                                  int accumulate) {
    x += (size_t)blockIdx.y * NT * w.n_in;
    y += (size_t)blockIdx.y * NT * ldy;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * R;
    const int n_in = w.n_in;
    const int n_vec = n_in % 8 == 0 ? n_in : 0;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    for (int e = (warp * 32 + lane) * 8; e < n_vec; e += MM_WARPS * 256) {
        float wv[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) load8<F>(w, min(row0 + r, w.n_out - 1), e, wv[r]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < n_tok) {
                const float4 *xp = (const float4 *)(x + (size_t)t * n_in + e);
                float4 a = __ldg(xp), b = __ldg(xp + 1);
                const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float s = acc[r][t];
#pragma unroll
                    for (int j = 0; j < 8; j++) s = fmaf(wv[r][j], xv[j], s);
                    acc[r][t] = s;
                }
            }
        }
    }
    if (F == WFMT_F32 || F == WFMT_F16 || F == WFMT_BF16) {
        for (int i = n_vec + threadIdx.x; i < n_in; i += blockDim.x) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                float wr = load1<F>(w, min(row0 + r, w.n_out - 1), i);
#pragma unroll
                for (int t = 0; t < NT; t++)
                    if (t < n_tok) acc[r][t] = fmaf(wr, x[(size_t)t * n_in + i], acc[r][t]);
            }
        }
    }
    block_store<NT, R>(acc, y, row0, w.n_out, n_tok, ldy, accumulate);
}

/* The fp32 mat-vec takes a row a block where blocks of 4 (8 from 5 tokens) would leave SMs without
 * one (a MoE router of 128 experts: 32 blocks, 16 at 16 tokens) when gemv_fill is 1 (the default);
 * 0 keeps 4 or 8, 2 takes one everywhere (tests: the path runs whatever the GPU). Each row's sum is
 * formed the same way at any count: the same bits. */
static int gemv_fill = 1;
extern "C" void matmul_gemv_tune(int fill) { gemv_fill = fill == 0 || fill == 2 ? fill : 1; }

/* The current device's SM count, cached per device (0 where it cannot be read: 4 rows then). */
static int device_sms(void) {
    static int n[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return (void)cudaGetLastError(), 0;
    if (!n[dev] && cudaDeviceGetAttribute(&n[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        n[dev] = 0, (void)cudaGetLastError(); /* not left for the next launch's check to find */
    return n[dev];
}

template <int F, int NT>
static void gemv_launch_nt(float *y, const cuda_weight &w, const float *x, int n_tok, int chunks, int ldy, int acc,
                           cudaStream_t st) {
    constexpr int R = NT >= 8 ? 8 : 4;
    if (gemv_fill == 2 || (gemv_fill && (int64_t)(w.n_out + R - 1) / R * chunks < device_sms())) {
        matmul_gemv_kernel<F, NT, 1><<<dim3(w.n_out, chunks), MM_WARPS * 32, 0, st>>>(y, w, x, n_tok, ldy, acc);
        return;
    }
    matmul_gemv_kernel<F, NT, R><<<dim3((w.n_out + R - 1) / R, chunks), MM_WARPS * 32, 0, st>>>(y, w, x, n_tok, ldy, acc);
}

/* chunks grid rows of n_tok tokens each (chunks > 1 only with n_tok 16) */
template <int F>
static void gemv_launch(float *y, const cuda_weight &w, const float *x, int n_tok, int chunks, int ldy, int acc,
                        cudaStream_t st) {
    if (n_tok <= 1) gemv_launch_nt<F, 1>(y, w, x, n_tok, chunks, ldy, acc, st);
    else if (n_tok <= 2) gemv_launch_nt<F, 2>(y, w, x, n_tok, chunks, ldy, acc, st);
    else if (n_tok <= 4) gemv_launch_nt<F, 4>(y, w, x, n_tok, chunks, ldy, acc, st);
    else if (n_tok <= 8) gemv_launch_nt<F, 8>(y, w, x, n_tok, chunks, ldy, acc, st);
    else gemv_launch_nt<F, 16>(y, w, x, n_tok, chunks, ldy, acc, st);
}

/* The tokens in chunks of 16, every full chunk in one launch (a grid row each: a prefill's router
 * is one launch, not n/16 launches of a few blocks), then the rest; each token's arithmetic is the
 * same whichever chunk holds it. */
extern "C" void matmul_gemv_cuda(float *y, const struct cuda_weight *w, const float *x, int n_tokens, int ldy,
                                 int accumulate, cudaStream_t st) {
    for (int t0 = 0; t0 < n_tokens;) {
        const int left = n_tokens - t0, nt = left < 16 ? left : 16;
        const int chunks = left < 16 ? 1 : (left / 16 < 65535 ? left / 16 : 65535);
        float *yt = y + (size_t)t0 * ldy;
        const float *xt = x + (size_t)t0 * w->n_in;
        switch (w->fmt) {
        case WFMT_F32: gemv_launch<WFMT_F32>(yt, *w, xt, nt, chunks, ldy, accumulate, st); break;
        case WFMT_F16: gemv_launch<WFMT_F16>(yt, *w, xt, nt, chunks, ldy, accumulate, st); break;
        case WFMT_BF16: gemv_launch<WFMT_BF16>(yt, *w, xt, nt, chunks, ldy, accumulate, st); break;
        case WFMT_Q4_0: gemv_launch<WFMT_Q4_0>(yt, *w, xt, nt, chunks, ldy, accumulate, st); break;
        case WFMT_Q8_0: gemv_launch<WFMT_Q8_0>(yt, *w, xt, nt, chunks, ldy, accumulate, st); break;
        case WFMT_Q4M: gemv_launch<WFMT_Q4M>(yt, *w, xt, nt, chunks, ldy, accumulate, st); break;
        case WFMT_Q8M: gemv_launch<WFMT_Q8M>(yt, *w, xt, nt, chunks, ldy, accumulate, st); break;
        }
        t0 += nt * chunks;
    }
}

/* ---- int8-activation mat-vec (dp4a) ---- */

/* x[n_groups][32] -> xq int8, xds (d, d * sum q) per group; warp per group. */
__global__ void quantize_q8_kernel(int8_t *xq, float2 *xds, const float *x, int64_t n_groups) {
    pdl_launch_dependents();
    pdl_wait();
    const int64_t g = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (g >= n_groups) return;
    const int64_t i = g * 32 + (threadIdx.x & 31);
    warp_q8(x[i], xq, xds, i);
}

extern "C" void quantize_q8_cuda(int8_t *xq, float *xds, const float *x, int64_t n, cudaStream_t st) {
    const int64_t n_groups = n / 32;
    if (n_groups <= 0) return;
    kernel_launch(quantize_q8_kernel, dim3((unsigned)((n_groups + 7) / 8)), dim3(256), 0, st, xq, (float2 *)xds, x,
                  n_groups);
}

extern "C" int matmul_q8_supported(int fmt) { return fmt == WFMT_Q4_0 || fmt == WFMT_Q8_0 || fmt == WFMT_Q4M; }

/* The weights of R rows at group g (the same group of each row): the codes (Q4: 16 bytes of
 * nibbles, one 16-byte load; Q8_0: two) and (d, m) with w = d q + m. */
template <int F, int R>
struct wgroup {
    uint4 q[R][F == WFMT_Q8_0 ? 2 : 1];
    float d[R], m[R];
};

template <int F, int R>
static __device__ __forceinline__ void wgroup_load(wgroup<F, R> &o, const cuda_weight &w, int row0, int g, int n_in) {
    const int ng = n_in / 32;
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int64_t row = min(row0 + r, w.n_out - 1);
        if (F == WFMT_Q8_0) {
            const uint4 *wp = (const uint4 *)((const int8_t *)w.q + row * n_in + g * 32);
            o.q[r][0] = __ldg(wp);
            o.q[r][F == WFMT_Q8_0 ? 1 : 0] = __ldg(wp + 1);
            o.d[r] = half_bits_to_f32(__ldg((const unsigned short *)w.s + row * ng + g)), o.m[r] = 0.0f;
        } else {
            o.q[r][0] = __ldg((const uint4 *)((const uint8_t *)w.q + row * (n_in / 2) + g * 16));
            if (F == WFMT_Q4_0) {
                o.d[r] = half_bits_to_f32(__ldg((const unsigned short *)w.s + row * ng + g));
                o.m[r] = -8.0f * o.d[r];
            } else {
                const float2 dm = __ldg((const float2 *)w.s + row * ng + g);
                o.d[r] = dm.x, o.m[r] = dm.y;
            }
        }
    }
}

/* acc[r][t] += w_r . x_t over group g, for the n_tok token rows of xq / xds. */
template <int F, int NT, int R>
static __device__ __forceinline__ void wgroup_dot(float (&acc)[R][NT], const wgroup<F, R> &a,
                                                  const int8_t *xq, const float2 *xds, int g, int n_in, int n_tok) {
    const int ng = n_in / 32;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < n_tok) {
            const int4 *xp = (const int4 *)(xq + (size_t)t * n_in + g * 32);
            const int4 xa = xp[0], xb = xp[1]; /* elements 0..15, 16..31 (coherent loads: common.cuh) */
            const float2 ds = xds[(size_t)t * ng + g];
#pragma unroll
            for (int r = 0; r < R; r++) {
                int sumi;
                if (F == WFMT_Q8_0) {
                    const uint4 lo = a.q[r][0], hi = a.q[r][F == WFMT_Q8_0 ? 1 : 0];
                    sumi = __dp4a((int)lo.x, xa.x, __dp4a((int)lo.y, xa.y, 0));
                    sumi = __dp4a((int)lo.z, xa.z, __dp4a((int)lo.w, xa.w, sumi));
                    sumi = __dp4a((int)hi.x, xb.x, __dp4a((int)hi.y, xb.y, sumi));
                    sumi = __dp4a((int)hi.z, xb.z, __dp4a((int)hi.w, xb.w, sumi));
                } else { /* byte j: element j low, j+16 high */
                    const uint32_t u[4] = {a.q[r][0].x, a.q[r][0].y, a.q[r][0].z, a.q[r][0].w};
                    const int xl[4] = {xa.x, xa.y, xa.z, xa.w}, xh[4] = {xb.x, xb.y, xb.z, xb.w};
                    sumi = 0;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        sumi = __dp4a((int)(u[k] & 0x0f0f0f0fu), xl[k], sumi);
                        sumi = __dp4a((int)((u[k] >> 4) & 0x0f0f0f0fu), xh[k], sumi);
                    }
                }
                acc[r][t] = fmaf(a.d[r] * ds.x, (float)sumi, fmaf(a.m[r], ds.y, acc[r][t]));
            }
        }
    }
}

/* Lane = one group of 32 weights of R rows against the group's 32 int8 activations per token; the
 * block's lanes take consecutive groups (coalesced), a step of the block covers 32 x warps groups,
 * the warps meet in shared memory. The next step's weights are loaded before this step's dot
 * products, the first step's before pdl_wait(): under programmatic dependent launch they stream in
 * while the kernel before finishes (weights are constant; activations are read after the wait).
 * Without launch_next this kernel never calls pdl_launch_dependents(): the kernel after it launches
 * when it exits. Every small kernel triggers its dependents at its start, so an early trigger in every
 * mat-vec let the launches run ahead through the small kernels into the next mat-vec, whose blocks
 * then held SM slots and DRAM while the attention or the norms between ran (H200, Qwen3-32B decode
 * 145.1 t/s with the trigger at the start, 150.5-151.4 after the main loop, 154.5 without;
 * Qwen3.5-27B 167.1 / 170.3 / 177.0). launch_next asks for the trigger at the start where the caller
 * measured a gain: the q|k|v projection, whose next kernels (q/k norm, RoPE and KV store, then the
 * decode attention) are few blocks, and whose attention then copies its first K/V tiles while the
 * projection streams; the FFN's gate|up, before the SwiGLU; optionally the DeltaNet in-projection
 * (forward.cu, PXQ_CUDA_EARLY_TRIGGER).
 * After the main loop, the last pf.n_blocks blocks ask for the next weight's first bytes in L2 (l2_prefetch_share).
 * PF: steps of weights a lane keeps in flight (1, or 2 under MATMUL_Q8_AHEAD2: both loaded before
 * the wait; the same sums in the same order, so the same bits).
 * (Tried and dropped, on an H200: a persistent grid of a few blocks per SM, each warp streaming
 * whole rows: slower on long rows, where one warp's steps wait on each other (Qwen3-32B down 27 us
 * against 21), and it lost its one wave under PDL, whose next kernels take SM slots early: 32B
 * decode 107 t/s against 143; blocks of several warps each on its own rows, for fewer blocks to
 * dispatch: no end-to-end gain, 32B decode 136-138 t/s against 146; the SwiGLU fused into the
 * gate|up launch, done by the block that completes each group of 32 columns (a fence and an atomic
 * count per block): bit-equal, but 32B decode 137.5 t/s against 145.8, 27B 159.4 against 167.1.) */
template <int F, int NT, int R, int PF = 1>
__global__ void __launch_bounds__(MM_WARPS_MAX * 32) matmul_q8_kernel(float *__restrict__ y, const cuda_weight w,
                                                                const int8_t *xq, const float2 *xds, int n_tok, int ldy,
                                                                int accumulate, const cuda_l2_prefetch pf,
                                                                int launch_next) {
    static_assert(PF == 1 || PF == 2, "steps loaded ahead: 1 or 2");
    /* probe kernel ids: 0 many blocks (gate|up, in-proj, lm_head), 1 several warps a block (o, down),
     * 2 the rest (q|k|v) */
    PROBE_BEGIN(gridDim.x >= 8192 ? 0 : blockDim.x > 32 ? 1 : 2);
    const int row0 = blockIdx.x * R;
    const int n_in = w.n_in, ng = n_in / 32;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    int g = threadIdx.x;
    const int step = (int)blockDim.x;
    wgroup<F, R> cur, ahead; /* ahead: step g + blockDim.x when PF == 2 */
    if (launch_next) pdl_launch_dependents();
    if (g < ng) wgroup_load<F, R>(cur, w, row0, g, n_in);
    if (PF == 2 && g + step < ng) wgroup_load<F, R>(ahead, w, row0, g + step, n_in);
    pdl_wait();
    PROBE(1);
    while (g < ng) {
        const int gn = g + PF * step;
        wgroup<F, R> nxt;
        if (gn < ng) wgroup_load<F, R>(nxt, w, row0, gn, n_in);
        wgroup_dot<F, NT, R>(acc, cur, xq, xds, g, n_in, n_tok);
        if (PF == 2) cur = ahead, ahead = nxt;
        else cur = nxt;
        g += step;
    }
    PROBE(2);
    l2_prefetch_share(pf);
    block_store<NT, R>(acc, y, row0, w.n_out, n_tok, ldy, accumulate);
    PROBE(3);
}

/* Bytes a row of F's codes and of its scales takes (backend.cu's repacked layout: codes [n_out][..],
 * scales [n_out][ng]). */
template <int F> static __host__ __device__ constexpr size_t q8_code_bytes(int n_in) {
    return F == WFMT_Q8_0 ? (size_t)n_in : (size_t)n_in / 2;
}
template <int F> static __host__ __device__ constexpr size_t q8_scale_bytes(int ng) {
    return (size_t)ng * (F == WFMT_Q4M ? 8 : 2);
}

/* matmul_q8_kernel for one token with the block's whole slice of the weight staged in shared memory:
 * its R rows' codes and scales (contiguous in the layout) are copied with cp.async, 16 bytes a copy,
 * before pdl_wait, so they stream in while the kernels before it run (the small kernels between two
 * mat-vecs leave the DRAM idle); after the wait the lanes sum from shared memory. The same sums in
 * the same order as matmul_q8_kernel<F, 1, R>: the same bits. Needs sm_80 (cp.async), n_in a
 * multiple of 256 (16-byte aligned rows of scales) and dynamic shared memory R x (code + scale
 * bytes of a row); rows past n_out are not copied, and read as the last row, as wgroup_load does.
 * The backend stages the o projection after the decode attention (MATMUL_Q8_STAGE), whose 2560
 * blocks of 9 KiB (Qwen3-32B) all fit the SMs at once and copy its 24 MB while the attention, which
 * leaves the DRAM idle at a short context, runs. H200, Qwen3-32B b1, alternated: 167.22, 167.00,
 * 167.13, 167.21 t/s against 165.37, 165.24, 165.19, 165.38; depth 32768 120.05 against 118.87.
 * Staging more lost: the q|k|v projection too 163.40, every mat-vec up to 160 MiB (gate|up, down:
 * several waves of blocks whose copies all come first) 135.21; on Qwen3.5-27B the o and DeltaNet
 * out projections 184.50 against 186.06. */
template <int F, int R>
__global__ void __launch_bounds__(MM_WARPS_MAX * 32)
    matmul_q8_staged_kernel(float *__restrict__ y, const cuda_weight w, const int8_t *xq, const float2 *xds, int ldy,
                            int accumulate, const cuda_l2_prefetch pf, int launch_next) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ uint4 mv_sm[];
    const int row0 = blockIdx.x * R, n_in = w.n_in, ng = n_in / 32, rows = min(R, w.n_out - row0);
    const size_t cb = q8_code_bytes<F>(n_in), sb = q8_scale_bytes<F>(ng);
    uint8_t *codes = (uint8_t *)mv_sm, *scales = codes + R * cb;
    PROBE_BEGIN(3);
    if (launch_next) pdl_launch_dependents();
    const uint8_t *gc = (const uint8_t *)w.q + (size_t)row0 * cb, *gs = (const uint8_t *)w.s + (size_t)row0 * sb;
    const int nc = (int)(rows * cb / 16), ns = (int)(rows * sb / 16);
    for (int i = threadIdx.x; i < nc; i += blockDim.x) cp_async16(codes + (size_t)i * 16, gc + (size_t)i * 16, 1);
    for (int i = threadIdx.x; i < ns; i += blockDim.x) cp_async16(scales + (size_t)i * 16, gs + (size_t)i * 16, 1);
    cp_async_commit();
    pdl_wait();
    PROBE(1);
    cp_async_wait<0>();
    __syncthreads();
    PROBE(2);
    float acc[R][1];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r][0] = 0.0f;
    for (int g = threadIdx.x; g < ng; g += blockDim.x) {
        wgroup<F, R> a;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int rr = min(r, rows - 1);
            const uint8_t *c = codes + rr * cb, *s = scales + rr * sb;
            if (F == WFMT_Q8_0) {
                a.q[r][0] = *(const uint4 *)(c + (size_t)g * 32);
                a.q[r][F == WFMT_Q8_0 ? 1 : 0] = *(const uint4 *)(c + (size_t)g * 32 + 16);
                a.d[r] = half_bits_to_f32(*(const unsigned short *)(s + (size_t)g * 2)), a.m[r] = 0.0f;
            } else {
                a.q[r][0] = *(const uint4 *)(c + (size_t)g * 16);
                if (F == WFMT_Q4_0) {
                    a.d[r] = half_bits_to_f32(*(const unsigned short *)(s + (size_t)g * 2));
                    a.m[r] = -8.0f * a.d[r];
                } else {
                    const float2 dm = *(const float2 *)(s + (size_t)g * 8);
                    a.d[r] = dm.x, a.m[r] = dm.y;
                }
            }
        }
        wgroup_dot<F, 1, R>(acc, a, xq, xds, g, n_in, 1);
    }
    PROBE(3);
    l2_prefetch_share(pf);
    block_store<1, R>(acc, y, row0, w.n_out, 1, ldy, accumulate);
    PROBE(4);
#endif
}

static int q8_tune_r, q8_tune_warps; /* matmul_q8_tune: 0 = the built-in choice */

#ifdef PXQ_PROBE
static const char *probe_names_mv[PROBE_NK][PROBE_NS] = {
    {"mv big entry", "mv big wait", "mv big loop", "mv big end"},
    {"mv warps entry", "mv warps wait", "mv warps loop", "mv warps end"},
    {"mv small entry", "mv small wait", "mv small loop", "mv small end"},
    {"mv staged entry", "mv staged wait", "mv staged copied", "mv staged summed", "mv staged end"},
};
#endif
PROBE_HOST(mv, probe_names_mv)

/* The staged kernel's shared memory at most, its slice and block_store's static red[MM_WARPS_MAX][R]
 * together: the default limit, no opt-in (Qwen3-32B's o_proj, R 2 x 8192 inputs of Q4_0: 9 KiB) */
#define MV_STAGE_SMEM (48 * 1024)

extern "C" int matmul_q8_stage_supported(void) {
    static int ok = -1;
    if (ok < 0) {
        cudaFuncAttributes fa;
        int dev = 0, major = 0;
        ok = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 8 &&
             cudaFuncGetAttributes(&fa, (const void *)matmul_q8_staged_kernel<WFMT_Q4_0, 2>) == cudaSuccess &&
             fa.binaryVersion >= 80 && fa.ptxVersion >= 80; /* a compute_75 PTX image JIT-compiled here is empty */
        (void)cudaGetLastError(); /* a build without an sm_80+ image reports an error here: not sticky */
    }
    return ok;
}

extern "C" void matmul_q8_tune(int rows, int warps) {
    q8_tune_r = rows == 1 || rows == 2 || rows == 4 || rows == 8 ? rows : 0;
    q8_tune_warps = warps >= 1 && warps <= MM_WARPS_MAX ? warps : 0;
}

/* warps per block: the count in lo..MM_WARPS_MAX that leaves the fewest idle lanes over ng groups */
static int q8_warps(int ng, int lo) {
    int nw = lo, best = 1 << 30;
    for (int k = MM_WARPS_MAX; k >= lo; k--) {
        const int waste = (ng + 32 * k - 1) / (32 * k) * 32 * k - ng;
        if (waste < best) best = waste, nw = k;
    }
    return nw;
}

template <int F, int NT, int R>
static void q8_launch_r(float *y, const cuda_weight &w, const int8_t *xq, const float2 *xds, int n_tok, int ldy,
                        int acc, int nw, const cuda_l2_prefetch &pf, int flags, cudaStream_t st) {
    const unsigned grid = (unsigned)((w.n_out + R - 1) / R);
    cuda_l2_prefetch p = pf;
    if (p.n_blocks > (int)grid) p.n_blocks = (int)grid;
    const int launch_next = (flags & MATMUL_Q8_LAUNCH_NEXT) != 0;
    PROBE_REGISTER(mv);
    if constexpr (NT == 1) {
        const size_t smem = R * (q8_code_bytes<F>(w.n_in) + q8_scale_bytes<F>(w.n_in / 32));
        const size_t red = (size_t)MM_WARPS_MAX * R * sizeof(float);
        if ((flags & MATMUL_Q8_STAGE) && w.n_in % 256 == 0 && smem + red <= MV_STAGE_SMEM &&
            matmul_q8_stage_supported()) {
            kernel_launch(matmul_q8_staged_kernel<F, R>, dim3(grid), dim3(nw * 32), smem, st, y, w, xq, xds, ldy, acc,
                          p, launch_next);
            return;
        }
    }
    if constexpr (NT <= 2) {
        if ((flags & MATMUL_Q8_AHEAD2) && nw == 1) { /* registers: ops_cuda.h */
            kernel_launch(matmul_q8_kernel<F, NT, R, 2>, dim3(grid), dim3(nw * 32), 0, st, y, w, xq, xds, n_tok, ldy, acc,
                          p, launch_next);
            return;
        }
    }
    kernel_launch(matmul_q8_kernel<F, NT, R>, dim3(grid), dim3(nw * 32), 0, st, y, w, xq, xds, n_tok, ldy, acc, p,
                  launch_next);
}

/* 1..4 tokens: small blocks, many steps per lane. From bench_cuda_matmul --dp4a-sweep on an H200
 * (one token, Q4_0, us per launch): rows of 5120 (160 groups) run best with one warp a block
 * (5 steps a lane) and R 2..4 (Qwen3-32B q|k|v 10.3 against 10.6 for 4 rows x 5 warps); longer
 * rows with two warps and R 2 (o 8192 x 5120: 8.5 against 9.5; down 25600 x 5120: 21.5 against
 * 22.0; 27B down 17408 x 5120: 16.0 against 18.2); the many-row matrices (gate|up, lm_head) are
 * at 86-100% of the copy bandwidth with any of these. One row a block halves the lm_head's speed
 * (block dispatch: 152K blocks). Few rows (5120 x 1024): 4..8 warps a row, 2.6 us against 6.0 with
 * one warp of 4 rows (256 warps in all). 8..16 tokens (the int8 tensor-core kernel's fallback below sm_80):
 * 8 rows a block (Q8_0: 4, registers), 4..8 warps over n_in. */
template <int F, int NT>
static void q8_launch_nt(float *y, const cuda_weight &w, const int8_t *xq, const float2 *xds, int n_tok, int ldy,
                         int acc, const cuda_l2_prefetch &pf, int flags, cudaStream_t st) {
    const int ng = w.n_in / 32;
    constexpr int R8 = F == WFMT_Q8_0 ? 4 : 8; /* 8 rows; Q8_0 4: two 16-byte codes a row and step (registers) */
    if constexpr (NT >= 8) {
        q8_launch_r<F, NT, R8>(y, w, xq, xds, n_tok, ldy, acc, q8_warps(ng, 4), pf, flags, st);
    } else {
        int R = w.n_out <= 12288 && w.n_in <= 5120 ? 4 : 2, nw = ng <= 160 ? 1 : 2;
        if (w.n_out <= 2048) R = 2, nw = q8_warps(ng, 4); /* few rows: more warps a row, or too few in all */
        if (q8_tune_r) R = q8_tune_r;
        if (q8_tune_warps) nw = q8_tune_warps;
        switch (R) {
        case 1: q8_launch_r<F, NT, 1>(y, w, xq, xds, n_tok, ldy, acc, nw, pf, flags, st); break;
        case 2: q8_launch_r<F, NT, 2>(y, w, xq, xds, n_tok, ldy, acc, nw, pf, flags, st); break;
        case 8: q8_launch_r<F, NT, R8>(y, w, xq, xds, n_tok, ldy, acc, nw, pf, flags, st); break;
        default: q8_launch_r<F, NT, 4>(y, w, xq, xds, n_tok, ldy, acc, nw, pf, flags, st); break;
        }
    }
}

template <int F>
static void q8_launch(float *y, const cuda_weight &w, const int8_t *xq, const float2 *xds, int n_tok, int ldy, int acc,
                      const cuda_l2_prefetch &pf, int flags, cudaStream_t st) {
    if (n_tok <= 1) q8_launch_nt<F, 1>(y, w, xq, xds, n_tok, ldy, acc, pf, flags, st);
    else if (n_tok <= 2) q8_launch_nt<F, 2>(y, w, xq, xds, n_tok, ldy, acc, pf, flags, st);
    else if (n_tok <= 4) q8_launch_nt<F, 4>(y, w, xq, xds, n_tok, ldy, acc, pf, flags, st);
    else if (n_tok <= 8) q8_launch_nt<F, 8>(y, w, xq, xds, n_tok, ldy, acc, pf, flags, st);
    else q8_launch_nt<F, 16>(y, w, xq, xds, n_tok, ldy, acc, pf, flags, st);
}

extern "C" void matmul_q8_pf_cuda(float *y, const struct cuda_weight *w, const int8_t *xq, const float *xds,
                                  int n_tokens, int ldy, int accumulate, const struct cuda_l2_prefetch *pf,
                                  int flags, cudaStream_t st) {
    const int ng = w->n_in / 32;
    const cuda_l2_prefetch none = {{NULL, NULL}, {0, 0}, 0};
    for (int t0 = 0; t0 < n_tokens; t0 += 16) {
        int nt = n_tokens - t0 < 16 ? n_tokens - t0 : 16;
        float *yt = y + (size_t)t0 * ldy;
        const int8_t *xt = xq + (size_t)t0 * w->n_in;
        const float2 *dt = (const float2 *)xds + (size_t)t0 * ng;
        /* the prefetch rides on the last launch, and only the one-to-four-token kernel's; the flags
         * (the trigger, staging) are the last launch's too */
        const int last = t0 + 16 >= n_tokens, fl = last ? flags : 0;
        const cuda_l2_prefetch &p = pf && last && nt <= 4 ? *pf : none;
        switch (w->fmt) {
        case WFMT_Q4_0: q8_launch<WFMT_Q4_0>(yt, *w, xt, dt, nt, ldy, accumulate, p, fl, st); break;
        case WFMT_Q8_0: q8_launch<WFMT_Q8_0>(yt, *w, xt, dt, nt, ldy, accumulate, p, fl, st); break;
        case WFMT_Q4M: q8_launch<WFMT_Q4M>(yt, *w, xt, dt, nt, ldy, accumulate, p, fl, st); break;
        }
    }
}

extern "C" void matmul_q8_cuda(float *y, const struct cuda_weight *w, const int8_t *xq, const float *xds, int n_tokens,
                               int ldy, int accumulate, cudaStream_t st) {
    matmul_q8_pf_cuda(y, w, xq, xds, n_tokens, ldy, accumulate, NULL, 0, st);
}

/* ---- dequantized rows (embedding, prefill tiles) ---- */

template <int F, typename T>
__global__ void dequant_rows_kernel(T *__restrict__ out, const cuda_weight w, const int32_t *__restrict__ rows,
                                    int64_t r0) {
    pdl_launch_dependents();
    pdl_wait();
    const int64_t row = rows ? (int64_t)rows[blockIdx.x] : r0 + blockIdx.x;
    const int n_in = w.n_in;
    const int n_vec = n_in % 8 == 0 ? n_in : 0;
    T *o = out + (size_t)blockIdx.x * n_in;
    constexpr int U = 4; /* chunks of 8 per thread and round: their loads issued together, then the
                          * stores (the prefill tiles dequantize on the SMs a GEMM leaves: each
                          * SM needs several loads in flight per thread) */
    const int step = blockDim.x * 8;
    for (int e0 = threadIdx.x * 8; e0 < n_vec; e0 += U * step) {
        float v[U][8];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (e0 + u * step < n_vec) load8<F>(w, row, e0 + u * step, v[u]);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int e = e0 + u * step;
            if (e >= n_vec) break;
            if (sizeof(T) == 2) {
                __half2 h[4];
#pragma unroll
                for (int j = 0; j < 4; j++) h[j] = __floats2half2_rn(v[u][2 * j], v[u][2 * j + 1]);
                *(uint4 *)(o + e) = *(const uint4 *)h;
            } else {
                float4 *p = (float4 *)(o + e);
                p[0] = make_float4(v[u][0], v[u][1], v[u][2], v[u][3]);
                p[1] = make_float4(v[u][4], v[u][5], v[u][6], v[u][7]);
            }
        }
    }
    if (F == WFMT_F32 || F == WFMT_F16 || F == WFMT_BF16)
        for (int i = n_vec + threadIdx.x; i < n_in; i += blockDim.x) o[i] = (T)load1<F>(w, row, i);
}

/* A tile unit's scale: f16 d (Q4_0, Q8_0) or float2 (d, m) (Q4M); units per quantization group. */
template <int F> struct tile_fmt {
    using scale = unsigned short;
    static constexpr int per_group = F == WFMT_Q8_0 ? 4 : 2;
};
template <> struct tile_fmt<WFMT_Q4M> {
    using scale = float2;
    static constexpr int per_group = 2;
};

/* One unit u of the tile (code bytes a, its group's scale d) to f16 at out (the kernel below). */
template <int F>
static __device__ __forceinline__ void tile_unit(__half *out, int64_t u, uint2 a, typename tile_fmt<F>::scale d) {
    if constexpr (F == WFMT_Q4_0) {
        const __half2 d2 = __half2half2(__ushort_as_half(d));
        const __half2 off = __half2half2(__ushort_as_half(0x6408)); /* 1024 + 8 */
        const uint32_t word[2] = {a.x, a.y};
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int j = 0; j < 4; j++) { /* bytes 2j, 2j+1 of the 8 -> 16-bit lanes */
            const uint32_t t = __byte_perm(word[j / 2], 0, (j & 1) ? 0x4342 : 0x4140);
            lo[j] = (t & 0x000F000Fu) | 0x64006400u;
            hi[j] = ((t >> 4) & 0x000F000Fu) | 0x64006400u;
        }
        uint4 vl, vh;
        uint32_t *pl = (uint32_t *)&vl, *ph = (uint32_t *)&vh;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const __half2 l = __hmul2(__hsub2(*(const __half2 *)&lo[j], off), d2);
            const __half2 h = __hmul2(__hsub2(*(const __half2 *)&hi[j], off), d2);
            pl[j] = *(const uint32_t *)&l, ph[j] = *(const uint32_t *)&h;
        }
        __half *o = out + (u / 2) * 32 + (u & 1) * 8;
        *(uint4 *)o = vl;
        *(uint4 *)(o + 16) = vh;
    } else if constexpr (F == WFMT_Q4M) {
        const uint32_t word[2] = {a.x, a.y};
        float lo[8], hi[8];
#pragma unroll
        for (int j = 0; j < 8; j++) { /* 2^23 + nib, less 2^23 */
            const uint32_t b = word[j / 4] >> (8 * (j & 3));
            lo[j] = fmaf(d.x, __uint_as_float(0x4B000000u | (b & 15)) - 8388608.0f, d.y);
            hi[j] = fmaf(d.x, __uint_as_float(0x4B000000u | ((b >> 4) & 15)) - 8388608.0f, d.y);
        }
        __half2 hl[4], hh[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            hl[j] = __floats2half2_rn(lo[2 * j], lo[2 * j + 1]), hh[j] = __floats2half2_rn(hi[2 * j], hi[2 * j + 1]);
        __half *o = out + (u / 2) * 32 + (u & 1) * 8;
        *(uint4 *)o = *(const uint4 *)hl;
        *(uint4 *)(o + 16) = *(const uint4 *)hh;
    } else { /* Q8_0: 8 code bytes, one 16-byte store */
        const __half2 d2 = __half2half2(__ushort_as_half(d));
        const __half2 off = __half2half2(__ushort_as_half(0x6480)); /* 1024 + 128 */
        const uint32_t word[2] = {a.x ^ 0x80808080u, a.y ^ 0x80808080u}; /* q + 128: 0..255 */
        uint32_t v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t t = __byte_perm(word[j / 2], 0x64646464u, (j & 1) ? 0x4342 : 0x4140);
            const __half2 h = __hmul2(__hsub2(*(const __half2 *)&t, off), d2);
            v[j] = *(const uint32_t *)&h;
        }
        *(uint4 *)(out + u * 8) = make_uint4(v[0], v[1], v[2], v[3]);
    }
}

/* The prefill tiles of Q4_0, Q8_0 and Q4M (a range of whole rows to f16): dequant_rows_kernel's
 * values without its int-to-float conversions (a reduced-throughput instruction, and these tiles
 * dequantize on the few SMs the GEMM leaves). Q4M (f32 d, m): each nibble becomes a float as
 * 2^23 + nib less 2^23 (exact), then the generic kernel's fmaf(d, nib, m) and its rounding, so the
 * same bits. Q4_0 and Q8_0 in half arithmetic: a code byte u goes into the
 * mantissa of the half 1024 + u (bits 0x6400 | u: a byte permute, a mask), one subtraction makes the
 * weight's integer exact, and one multiplication by the group's f16 scale d rounds once:
 * round_f16(d * (nib - 8)), as the f32 path's exact fmaf(d, nib, -8 d) followed by the rounding to f16
 * (bit for bit the CPU's rows rounded to f16, the sign of zero included: a zero weight is
 * (code) x d here and on the CPU, -0 when the two signs differ, where the generic kernel's sum gives
 * +0; the GEMM sums the same either way).
 * The rows r0..r0+n_rows are one flat range of codes and scales (layouts: backend.h). A unit is 8
 * code bytes: Q4_0 and Q4M half a group, bytes j..j+7 holding elements j..j+7 (low nibbles) and
 * j+16..j+23 (high), stored as 16 bytes at 32-byte distance, so that two lanes fill each 32-byte
 * sector; Q8_0 a quarter group, one 16-byte store (a store of 16 bytes at a 32-byte stride per
 * lane, which leaves each sector half written, cost a Q8_0 pp512 11%). U units a thread
 * (DEQ_TILE_U), their loads issued first; the launch covers the tile (the loop runs
 * once: taking it out left ptxas spilling at 16 units a thread). */
template <int F, int U>
__global__ void __launch_bounds__(256)
    dequant_tile_f16_kernel(__half *__restrict__ out, const cuda_weight w, int64_t r0, int64_t n_units) {
    using S = typename tile_fmt<F>::scale;
    pdl_launch_dependents();
    pdl_wait();
    const int64_t n_in = w.n_in, stride = (int64_t)gridDim.x * blockDim.x * U;
    const uint2 *q = (const uint2 *)((const uint8_t *)w.q + r0 * (F == WFMT_Q8_0 ? n_in : n_in / 2));
    const S *sc = (const S *)w.s + r0 * (n_in / 32);
    for (int64_t u0 = (int64_t)blockIdx.x * blockDim.x * U + threadIdx.x; u0 < n_units; u0 += stride) {
        uint2 a[U];
        S d[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int64_t u = u0 + (int64_t)k * blockDim.x;
            if (u < n_units) a[k] = __ldg(q + u), d[k] = __ldg(sc + u / tile_fmt<F>::per_group);
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int64_t u = u0 + (int64_t)k * blockDim.x;
            if (u >= n_units) break;
            tile_unit<F>(out, u, a[k], d[k]);
        }
    }
}

/* dequant_tile_f16_tune (tests: the generic kernel as the reference) */
static int dequant_tile_generic;

extern "C" void dequant_tile_f16_tune(int generic) { dequant_tile_generic = generic != 0; }

/* 8 units a thread: Qwen3-32B Q4_0 pp512 on an H200 7025-7083 t/s, against 6959-6990 with 4 and 7032
 * with 16 (docs/perf-history.md, seventeenth session; the other counts were removed) */
#define DEQ_TILE_U 8

template <int F>
static void dequant_tile(__half *out, const cuda_weight &w, int64_t r0, int64_t n_units, cudaStream_t st) {
    const int threads = 256;
    const dim3 grid((unsigned)((n_units + threads * DEQ_TILE_U - 1) / (threads * DEQ_TILE_U)));
    kernel_launch(dequant_tile_f16_kernel<F, DEQ_TILE_U>, grid, dim3(threads), 0, st, out, w, r0, n_units);
}

template <typename T>
static void dequant_launch(T *out, const cuda_weight &w, const int32_t *rows, int64_t r0, int n_rows, cudaStream_t st) {
    if (sizeof(T) == 2 && !rows && (w.fmt == WFMT_Q4_0 || w.fmt == WFMT_Q4M || w.fmt == WFMT_Q8_0) &&
        !dequant_tile_generic) {
        /* units: 8 code bytes, 16 elements (Q4_0, Q4M) or 8 (Q8_0) */
        const int64_t n_units = (int64_t)n_rows * w.n_in / (w.fmt == WFMT_Q8_0 ? 8 : 16);
        if (w.fmt == WFMT_Q4_0) dequant_tile<WFMT_Q4_0>((__half *)out, w, r0, n_units, st);
        else if (w.fmt == WFMT_Q4M) dequant_tile<WFMT_Q4M>((__half *)out, w, r0, n_units, st);
        else dequant_tile<WFMT_Q8_0>((__half *)out, w, r0, n_units, st);
        return;
    }
    dim3 grid(n_rows), block(128);
    switch (w.fmt) {
    case WFMT_F32: kernel_launch(dequant_rows_kernel<WFMT_F32, T>, grid, block, 0, st, out, w, rows, r0); break;
    case WFMT_F16: kernel_launch(dequant_rows_kernel<WFMT_F16, T>, grid, block, 0, st, out, w, rows, r0); break;
    case WFMT_BF16: kernel_launch(dequant_rows_kernel<WFMT_BF16, T>, grid, block, 0, st, out, w, rows, r0); break;
    case WFMT_Q4_0: kernel_launch(dequant_rows_kernel<WFMT_Q4_0, T>, grid, block, 0, st, out, w, rows, r0); break;
    case WFMT_Q8_0: kernel_launch(dequant_rows_kernel<WFMT_Q8_0, T>, grid, block, 0, st, out, w, rows, r0); break;
    case WFMT_Q4M: kernel_launch(dequant_rows_kernel<WFMT_Q4M, T>, grid, block, 0, st, out, w, rows, r0); break;
    case WFMT_Q8M: kernel_launch(dequant_rows_kernel<WFMT_Q8M, T>, grid, block, 0, st, out, w, rows, r0); break;
    }
}

extern "C" void dequant_rows_cuda(void *out, int out_half, const struct cuda_weight *w, const int32_t *rows, int64_t r0,
                                  int n_rows, cudaStream_t st) {
    if (n_rows <= 0) return;
    if (out_half) dequant_launch<__half>((__half *)out, *w, rows, r0, n_rows, st);
    else dequant_launch<float>((float *)out, *w, rows, r0, n_rows, st);
}

__global__ void f32_to_f16_kernel(__half *out, const float *x, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2half(x[i]);
}

/* eight elements a thread: two 16-byte loads, one 16-byte store (n % 8 == 0, 16-byte aligned) */
__global__ void f32_to_f16_x8_kernel(uint4 *out, const float4 *x, int64_t n8) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 a = __ldg(x + 2 * i), b = __ldg(x + 2 * i + 1);
        __half2 h[4] = {__floats2half2_rn(a.x, a.y), __floats2half2_rn(a.z, a.w), __floats2half2_rn(b.x, b.y),
                        __floats2half2_rn(b.z, b.w)};
        out[i] = *(const uint4 *)h;
    }
}

extern "C" void f32_to_f16_cuda(void *out, const float *x, int64_t n, cudaStream_t st) {
    if (n % 8 == 0 && ((uintptr_t)out | (uintptr_t)x) % 16 == 0) {
        f32_to_f16_x8_kernel<<<grid_for(n / 8, 256), 256, 0, st>>>((uint4 *)out, (const float4 *)x, n / 8);
        return;
    }
    int64_t blocks = (n + 255) / 256;
    f32_to_f16_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, st>>>((__half *)out, x, n);
}
