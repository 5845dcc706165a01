/* ops.cu - CUDA kernels, the twins of ops_cpu.c's small ops and the CPU forward's attention (ops_cuda.h);
 * the matmuls are in matmul.cu.
 *
 * Every kernel here runs on sm_70 and up: plain loads, shuffles and fp32 FMAs, no cp.async, no
 * tensor cores (the prefill GEMM goes through cuBLAS, forward.cu).
 * CPU twin: ops_cpu.c (rmsnorm_cpu, rope_cpu, swiglu_cpu, ...) and forward_cpu.c's attention_layer and
 *   attention_core.
 */
#include <math.h>
#include <stdint.h>

#include <cuda_fp16.h>

#include "cuda/ops_cuda.h"

#include "cuda/common.cuh"
#include "cuda/kv_quant.cuh"
#include "cuda/probe.cuh"
#include "cuda/launch.cuh"

extern "C" thread_local int cuda_pdl = 0; /* cuda/launch.cuh */


/* ---- small ops ---- */

/* Block per row; the sum of squares in float32 as HF LlamaRMSNorm. Writes out (float) and/or the
 * int8 groups of the q8 mat-vec (xq, xds; n a multiple of 32). A row is latency-bound at decode
 * (one row, one block): each thread keeps its elements (i = tid + k * blockDim, k < V) in registers
 * from the one read of x, and the V independent steps of the second pass (scale, store, the int8
 * group's shuffles) are unrolled so their latencies overlap. V = 0: rows longer than 32 * blockDim,
 * read twice. */
template <int V>
__global__ void rmsnorm_kernel(float *out, int8_t *xq, float2 *xds, __half *x16, const float *x, const float *w, int n,
                               float eps, const int32_t *rows) {
    __shared__ float red[32];
    pdl_launch_dependents();
    pdl_wait();
    const float *xr = x + (size_t)(rows ? rows[blockIdx.x] : blockIdx.x) * n;
    float v[V > 0 ? V : 1], ss = 0.0f;
    if (V > 0) {
#pragma unroll
        for (int k = 0; k < V; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            v[k] = i < n ? xr[i] : 0.0f;
            ss = fmaf(v[k], v[k], ss);
        }
    } else {
#pragma unroll 4
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    }
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
        t = warp_sum(t);
        if (threadIdx.x == 0) red[0] = t;
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(red[0] / (float)n + eps);
    const size_t base = (size_t)blockIdx.x * n;
    if (V > 0) {
#pragma unroll
        for (int k = 0; k < V; k++) { /* n % 32 == 0 when xq: a warp's 32 lanes are all in or all out */
            const int i = threadIdx.x + k * blockDim.x;
            if (i < n) {
                const float y = v[k] * scale * w[i];
                if (out) out[base + i] = y;
                if (x16) x16[base + i] = __float2half_rn(y);
                if (xq) warp_q8(y, xq, xds, (int64_t)(base + i));
            }
        }
    } else {
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float y = xr[i] * scale * w[i];
            if (out) out[base + i] = y;
            if (x16) x16[base + i] = __float2half_rn(y);
            if (xq) warp_q8(y, xq, xds, (int64_t)(base + i));
        }
    }
}

/* Decode rows (at most 16 rows of n >= 1024, n % 256 == 0): grid (rows, n / 256), block 256. Every block sums the
 * squares of its whole row (float4 loads, from L2: the row was just written) and normalises its
 * own 256 elements, one per thread; a row's work spreads over n / 256 SMs instead of one block's
 * serial steps. The float32 sum of squares runs in another order than rmsnorm_kernel's: the two
 * differ by rounding only. out must not alias x (other blocks still read the row). */
#define RMS_SLICE 256
__global__ void __launch_bounds__(RMS_SLICE) rmsnorm_slice_kernel(float *out, int8_t *xq, float2 *xds, __half *x16,
                                                                 const float *x, const float *w, int n, float eps,
                                                                 const int32_t *rows) {
    __shared__ float red[RMS_SLICE / 32];
    PROBE_BEGIN(0);
    pdl_launch_dependents();
    const float wi = w[blockIdx.y * RMS_SLICE + threadIdx.x]; /* a weight: before the wait */
    pdl_wait();
    PROBE(1);
    const float4 *xr = (const float4 *)(x + (size_t)(rows ? rows[blockIdx.x] : blockIdx.x) * n);
    float ss = 0.0f;
#pragma unroll 8 /* the row's loads issued together (L2 latency), the sum in order */
    for (int i = threadIdx.x; i < n / 4; i += RMS_SLICE) {
        const float4 v = xr[i];
        ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
    }
    ss = warp_sum(ss);
    PROBE(2);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float t = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_SLICE / 32; k++) t += red[k];
    const float scale = 1.0f / sqrtf(t / (float)n + eps);
    PROBE(3);
    const int i = blockIdx.y * RMS_SLICE + threadIdx.x;
    const size_t o = (size_t)blockIdx.x * n + i;
    const float y = ((const float *)xr)[i] * scale * wi;
    if (out) out[o] = y;
    if (x16) x16[o] = __float2half_rn(y);
    if (xq) warp_q8(y, xq, xds, (int64_t)o);
    PROBE(4);
}

#ifdef PXQ_PROBE
static const char *probe_names_ops[PROBE_NK][PROBE_NS] = {
    {"rmsnorm entry", "rmsnorm wait", "rmsnorm loads summed", "rmsnorm scale", "rmsnorm end"},
    {"swiglu entry", "swiglu wait", "swiglu end"},
    {"qk_norm entry", "qk_norm wait", "qk_norm loads", "qk_norm end"},
};
#endif
PROBE_HOST(ops, probe_names_ops)

static void rmsnorm_launch(float *out, int8_t *xq, float2 *xds, __half *x16, const float *x, const float *w, int n,
                           int n_rows, float eps, const int32_t *rows, cudaStream_t st) {
    if (n_rows <= 0) return;
    if (n_rows <= 16 && n >= 1024 && n % RMS_SLICE == 0 && out != x) { /* decode: a row over n / 256 blocks
                                                                           * (each reads the whole row: not in place) */
        PROBE_REGISTER(ops);
        kernel_launch(rmsnorm_slice_kernel, dim3(n_rows, n / RMS_SLICE), dim3(RMS_SLICE), 0, st, out, xq, xds, x16, x, w,
                      n, eps, rows);
        return;
    }
    const int threads = n >= 4096 ? 1024 : n >= 1024 ? 256 : n >= 256 ? 128 : 32; /* latency-bound: wide blocks */
    const int per = (n + threads - 1) / threads;
    auto *kern = per <= 2   ? rmsnorm_kernel<2>
                 : per <= 4 ? rmsnorm_kernel<4>
                 : per <= 8 ? rmsnorm_kernel<8>
                            : rmsnorm_kernel<0>;
    kernel_launch(kern, dim3(n_rows), dim3(threads), 0, st, out, xq, xds, x16, x, w, n, eps, rows);
}

extern "C" int cuda_pdl_supported(void) {
#if PXQ_PDL_RUNTIME
    int dev = 0, major = 0;
    cudaFuncAttributes fa;
    const int ok = cudaGetDevice(&dev) == cudaSuccess &&
                   cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 &&
                   cudaFuncGetAttributes(&fa, rmsnorm_kernel<2>) == cudaSuccess && fa.binaryVersion >= 90 &&
                   fa.ptxVersion >= 90;
    (void)cudaGetLastError();
    return ok;
#else
    return 0;
#endif
}

extern "C" void rmsnorm_cuda(float *out, const float *x, const float *w, int n, int n_rows, float eps,
                             const int32_t *rows, cudaStream_t st) {
    rmsnorm_launch(out, NULL, NULL, NULL, x, w, n, n_rows, eps, rows, st);
}

extern "C" void rmsnorm_q8_cuda(float *out, int8_t *xq, float *xds, const float *x, const float *w, int n, int n_rows,
                                float eps, const int32_t *rows, cudaStream_t st) {
    rmsnorm_launch(out, xq, (float2 *)xds, NULL, x, w, n, n_rows, eps, rows, st);
}

extern "C" void rmsnorm_f16_cuda(float *out, void *x16, const float *x, const float *w, int n, int n_rows, float eps,
                                 cudaStream_t st) {
    rmsnorm_launch(out, NULL, NULL, (__half *)x16, x, w, n, n_rows, eps, NULL, st);
}

__global__ void rope_kernel(float *x, int n_heads, int head_dim, int n_rot, const int32_t *pos, const float *inv_freq,
                            int neox, int ld) {
    const int half = n_rot / 2;
    const float p = (float)pos[blockIdx.x], m = inv_freq[half]; /* rope.h's table: the attention factor last */
    float *xt = x + (size_t)blockIdx.x * ld;
    for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
        int h = idx / half, i = idx - h * half;
        float ang = p * inv_freq[i];
        float c = cosf(ang) * m, s = sinf(ang) * m;
        float *v = xt + (size_t)h * head_dim;
        int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = b * c + a * s;
    }
}

extern "C" void rope_cuda(float *x, int n_heads, int head_dim, int n_rot, const int32_t *pos, const float *inv_freq,
                          int neox, int n_tokens, int ld, cudaStream_t st) {
    if (n_tokens <= 0) return;
    rope_kernel<<<n_tokens, 256, 0, st>>>(x, n_heads, head_dim, n_rot, pos, inv_freq, neox, ld);
}

/* out[t][j] = silu(gate[t*ld + j]) * up[t*ld + j], j < ff: gate and up rows of stride ld (ff when
 * they are separate buffers, 2 ff when they are the halves of one stacked gate|up matmul). */
__global__ void swiglu_kernel(float *out, int8_t *xq, float2 *xds, __half *x16, const float *gate, const float *up,
                              int64_t n, int ff, int ld) {
    PROBE_BEGIN(1);
    pdl_launch_dependents();
    pdl_wait();
    PROBE(1);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / ff, k = t * ld + (i - t * ff);
        float g = gate[k];
        float v = silu_f(g) * up[k];
        if (out) out[i] = v;
        if (x16) x16[i] = __float2half_rn(v);
        if (xq) warp_q8(v, xq, xds, i); /* n % 32 == 0: whole warps take each step */
    }
    PROBE(2);
}

extern "C" void swiglu_cuda(float *out, const float *gate, const float *up, int64_t n, cudaStream_t st) {
    if (n <= 0) return;
    swiglu_kernel<<<grid_for(n, 256), 256, 0, st>>>(out, NULL, NULL, NULL, gate, up, n, n > INT32_MAX ? INT32_MAX : (int)n,
                                               n > INT32_MAX ? INT32_MAX : (int)n);
}

/* The form for more than CUDA_DECODE_MAX rows (a MoE step's (token, expert) pairs, a prefill with
 * gate and up apart): a grid row per token, so no 64-bit index division per element; the same
 * expression and the same int8 groups (whole warps: ff % 32 == 0), so the same bits as
 * swiglu_kernel, and its PDL calls (no probe marks). */
__global__ void swiglu_rows_kernel(float *out, int8_t *xq, float2 *xds, const float *gate, const float *up, int ff,
                                   int ld) {
    pdl_launch_dependents();
    pdl_wait();
    const int64_t t = blockIdx.y;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < ff; k += gridDim.x * blockDim.x) {
        const int64_t src = t * ld + k, i = t * ff + k;
        float g = gate[src];
        float v = silu_f(g) * up[src];
        if (out) out[i] = v;
        if (xq) warp_q8(v, xq, xds, i);
    }
}

extern "C" void swiglu_q8_cuda(float *out, int8_t *xq, float *xds, const float *gate, const float *up, int n_tokens,
                               int ff, int ld, cudaStream_t st) {
    const int64_t n = (int64_t)n_tokens * ff;
    if (n <= 0) return;
    if (n_tokens > CUDA_DECODE_MAX && ff % 32 == 0) {
        for (int t0 = 0; t0 < n_tokens; t0 += 65535) {
            const int nt = n_tokens - t0 < 65535 ? n_tokens - t0 : 65535;
            kernel_launch(swiglu_rows_kernel, dim3((ff + 255) / 256, nt), dim3(256), 0, st,
                          out ? out + (size_t)t0 * ff : out, xq ? xq + (size_t)t0 * ff : xq,
                          xq ? (float2 *)xds + (size_t)t0 * (ff / 32) : (float2 *)NULL, gate + (size_t)t0 * ld,
                          up + (size_t)t0 * ld, ff, ld);
        }
        return;
    }
    PROBE_REGISTER(ops);
    kernel_launch(swiglu_kernel, dim3(grid_for(n, 256)), dim3(256), 0, st, out, xq, (float2 *)xds, (__half *)NULL, gate, up,
                  n, ff, ld);
}

/* The prefill form: eight consecutive elements a thread (two 16-byte loads of gate and of up, one
 * 16-byte store), a token a grid row, no index division; the same expression, so the same bits as
 * swiglu_kernel. Needs ff % 8 == 0, ld % 4 == 0 and 16-byte aligned pointers (the launcher checks). */
__global__ void swiglu_f16_kernel(__half *__restrict__ x16, const float *__restrict__ gate,
                                  const float *__restrict__ up, int ff, int ld) {
    const int k = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (k >= ff) return;
    const int64_t t = blockIdx.y, src = t * ld + k;
    float g[8], u[8];
    *(float4 *)g = __ldg((const float4 *)(gate + src)), *(float4 *)(g + 4) = __ldg((const float4 *)(gate + src + 4));
    *(float4 *)u = __ldg((const float4 *)(up + src)), *(float4 *)(u + 4) = __ldg((const float4 *)(up + src + 4));
    __half2 h[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float a = silu_f(g[2 * j]) * u[2 * j];
        const float b = silu_f(g[2 * j + 1]) * u[2 * j + 1];
        h[j] = __halves2half2(__float2half_rn(a), __float2half_rn(b));
    }
    *(uint4 *)(x16 + t * ff + k) = *(const uint4 *)h;
}

extern "C" void swiglu_f16_cuda(void *x16, const float *gate, const float *up, int n_tokens, int ff, int ld,
                                cudaStream_t st) {
    const int64_t n = (int64_t)n_tokens * ff;
    if (n <= 0) return;
    const int aligned = ((uintptr_t)x16 | (uintptr_t)gate | (uintptr_t)up) % 16 == 0;
    if (aligned && ff % 8 == 0 && ld % 4 == 0 && n_tokens <= 65535) {
        const dim3 grid((unsigned)((ff / 8 + 255) / 256), (unsigned)n_tokens);
        swiglu_f16_kernel<<<grid, 256, 0, st>>>((__half *)x16, gate, up, ff, ld);
        return;
    }
    swiglu_kernel<<<grid_for(n, 256), 256, 0, st>>>(NULL, NULL, NULL, (__half *)x16, gate, up, n, ff, ld);
}

__global__ void add_bias_kernel(float *y, const float *b, int n, int64_t total) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += b[i % n];
}

extern "C" void add_bias_cuda(float *y, const float *b, int n_rows, int n, cudaStream_t st) {
    int64_t total = (int64_t)n_rows * n;
    add_bias_kernel<<<grid_for(total, 256), 256, 0, st>>>(y, b, n, total);
}

__global__ void add_residual_kernel(float *x, const float *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

extern "C" void add_residual_cuda(float *x, const float *y, int64_t n, cudaStream_t st) {
    add_residual_kernel<<<grid_for(n, 256), 256, 0, st>>>(x, y, n);
}

/* ---- paged KV ---- */

__global__ void kv_store_kernel(const cuda_kv kv, int l, const float *k, const float *v, const int32_t *pos,
                                const int32_t *seq_id) {
    const int t = blockIdx.x;
    const int32_t *tab = kv.block_tab + (size_t)seq_id[t] * kv.max_blocks;
    const size_t off = kv_off(kv, l, tab, pos[t]);
    for (int i = threadIdx.x; i < kv.kv_dim; i += blockDim.x) {
        float kk = k[(size_t)t * kv.kv_dim + i], vv = v[(size_t)t * kv.kv_dim + i];
        if (kv.kv_f32) {
            ((float *)kv.k)[off + i] = kk;
            ((float *)kv.v)[off + i] = vv;
        } else {
            ((__half *)kv.k)[off + i] = __float2half(kk);
            ((__half *)kv.v)[off + i] = __float2half(vv);
        }
    }
}

/* grid (n_tokens, n_head_kv, 2 pools), block head_dim: warp g quantizes group g of the head's row
 * (kv_quantize_row: q8_0 d = absmax / 127 and codes rint(x / d); q2nu the f16 absmax and the nearest
 * level, ties to the lower), then the float row goes to the residual where the position has a slot. */
__global__ void kv_store_q_kernel(const cuda_kv kv, int l, const float *k, const float *v, int ld, const int32_t *pos,
                                  const int32_t *seq_id) {
    const int t = blockIdx.x, h = blockIdx.y, pool = blockIdx.z, i = threadIdx.x, lane = i & 31, g = i >> 5;
    pdl_launch_dependents(); /* the attention after it waits for it to finish (pdl_wait) */
    const int p = pos[t], s = seq_id[t]; /* step inputs: copied before the step's first kernel */
    pdl_wait();                          /* k and v are the kernel before's output */
    const float x = (pool ? v : k)[(size_t)t * ld + (size_t)h * kv.head_dim + i];
    const int32_t *tab = kv.block_tab + (size_t)s * kv.max_blocks;
    const kv_layer_desc *d;
    uint8_t *row = (uint8_t *)kvq_row(kv, pool, l, tab, h, p, &d);
    const float amax = warp_max(fabsf(x));
    uint8_t *codes = row + kv.head_dim / 16; /* after the row's f16 scales (kvcache.h) */
    if (d->type[h] == KV_Q8_0) {
        const float dd = amax / 127.0f, id = dd > 0.0f ? 1.0f / dd : 0.0f;
        if (lane == 0) ((__half *)row)[g] = __float2half_rn(dd);
        codes[g * KV_GROUP + lane] = (uint8_t)(int8_t)__float2int_rn(x * id);
    } else {
        uint8_t *cg = codes + g * (KV_GROUP / 4);
        const __half dh = __float2half_rn(amax);
        const float dd = __half2float(dh), id = dd > 0.0f ? 1.0f / dd : 0.0f, u = x * id;
        const float *lv = d->levels[h];
        int best = 0;
#pragma unroll
        for (int c = 1; c < 4; c++)
            if (fabsf(u - lv[c]) < fabsf(u - lv[best])) best = c;
        unsigned b = (unsigned)best << (2 * (lane & 3));
        b |= __shfl_down_sync(FULL_MASK, b, 1);
        b |= __shfl_down_sync(FULL_MASK, b, 2);
        if ((lane & 3) == 0) cg[lane / 4] = (uint8_t)b;
        if (lane == 0) ((__half *)row)[g] = dh;
    }
    float *r = kvq_res(kv, pool, l, s, p);
    if (r) r[(size_t)h * kv.head_dim + i] = x;
}

extern "C" void kv_store_q_cuda(const struct cuda_kv *kv, int l, const float *k, const float *v, int ld,
                                const int32_t *pos, const int32_t *seq_id, int n_tokens, cudaStream_t st) {
    if (n_tokens <= 0) return;
    /* in the decode step's PDL chain (launch.cuh): launched plainly, it held the attention kernel's
     * launch until it ended */
    kernel_launch(kv_store_q_kernel, dim3(n_tokens, kv->n_head_kv, 2), dim3(kv->head_dim), 0, st, *kv, l, k, v, ld, pos,
                  seq_id);
}

extern "C" void kv_store_cuda(const struct cuda_kv *kv, int l, const float *k, const float *v, const int32_t *pos,
                              const int32_t *seq_id, int n_tokens, cudaStream_t st) {
    if (n_tokens <= 0) return;
    if (kv->quantized) return kv_store_q_cuda(kv, l, k, v, kv->kv_dim, pos, seq_id, n_tokens, st);
    kv_store_kernel<<<n_tokens, 128, 0, st>>>(*kv, l, k, v, pos, seq_id);
}

#define QKR_WARPS 4
#define QKR_PER 8 /* elements of a head per lane: head_dim <= 256 (cuda_mem_plan refuses more) */

/* This lane's norm weights of a head (qk_norm_rope_store's kernels): w[i] for its elements i < hd,
 * 1 past hd or without w. */
static __device__ __forceinline__ void qkr_weights(const float *w, int hd, int lane, float (&wv)[QKR_PER]) {
#pragma unroll
    for (int k2 = 0; k2 < QKR_PER; k2++) {
        const int i = lane + 32 * k2;
        wv[k2] = w && i < hd ? w[i] : 1.0f;
    }
}

/* The loads of one head of token t (qk_norm_rope_store's kernels): this lane's elements of the head
 * (xv) and, for a k head, of v (vv), all issued before any use. */
static __device__ __forceinline__ void qkr_load(const float *x, const float *vh, bool is_k, int hd, int lane,
                                                float (&xv)[QKR_PER], float (&vv)[QKR_PER]) {
#pragma unroll
    for (int k2 = 0; k2 < QKR_PER; k2++) {
        const int i = lane + 32 * k2;
        xv[k2] = i < hd ? x[i] : 0.0f;
        vv[k2] = is_k && i < hd ? vh[i] : 0.0f;
    }
}

/* The rest of that head: rmsnorm(head) * w (the q/k norm; has_w 0: none), RoPE with this lane's
 * pairs' cos/sin, the head to y, and for a k head k and v into the cache at element off. The head
 * goes through the warp's own shared-memory row hv (RoPE pairs elements of different lanes); no
 * block barrier. wv, cs, sn: this lane's norm weights and rotation. */
static __device__ __forceinline__ void qkr_finish(float *y, bool has_w, float eps, int n_rot, int neox,
                                                  const cuda_kv &kv, bool is_k, size_t off,
                                                  const float (&xv)[QKR_PER], const float (&vv)[QKR_PER],
                                                  const float (&wv)[QKR_PER], const float (&cs)[QKR_PER / 2],
                                                  const float (&sn)[QKR_PER / 2], float *hv, int lane) {
    const int hd = kv.head_dim, half = n_rot / 2;
    float ss = 0.0f;
#pragma unroll
    for (int k2 = 0; k2 < QKR_PER; k2++)
        if (lane + 32 * k2 < hd) ss = fmaf(xv[k2], xv[k2], ss);
    const float scale = has_w ? 1.0f / sqrtf(warp_sum(ss) / (float)hd + eps) : 1.0f;
#pragma unroll
    for (int k2 = 0; k2 < QKR_PER; k2++) {
        const int i = lane + 32 * k2;
        if (i < hd) hv[i] = has_w ? xv[k2] * scale * wv[k2] : xv[k2];
    }
    __syncwarp();
#pragma unroll
    for (int k2 = 0; k2 < QKR_PER / 2; k2++) {
        const int i = lane + 32 * k2;
        if (i < half) {
            const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
            const float a = hv[i0], b = hv[i1];
            hv[i0] = a * cs[k2] - b * sn[k2];
            hv[i1] = b * cs[k2] + a * sn[k2];
        }
    }
    __syncwarp();
#pragma unroll
    for (int k2 = 0; k2 < QKR_PER; k2++) {
        const int i = lane + 32 * k2;
        if (i >= hd) continue;
        const float o = hv[i];
        y[i] = o;
        if (is_k && !kv.quantized) { /* a quantized cache is written by kv_store_q_cuda from y */
            if (kv.kv_f32) {
                ((float *)kv.k)[off + i] = o;
                ((float *)kv.v)[off + i] = vv[k2];
            } else {
                ((__half *)kv.k)[off + i] = __float2half(o);
                ((__half *)kv.v)[off + i] = __float2half(vv[k2]);
            }
        }
    }
    __syncwarp(); /* hv is the warp's next head's row too (the prefill kernel) */
}

/* grid (n_tokens, ceil((n_head + n_head_kv) / QKR_WARPS)), block QKR_WARPS warps: a warp per head
 * (q heads, then k heads) of one token: rmsnorm(head) * w (the q/k norm), RoPE at pos[t], and for
 * k heads the store of k and v into the cache. One launch for rmsnorm_cuda(q), rmsnorm_cuda(k),
 * rope_cuda(q), rope_cuda(k) and kv_store_cuda, the same arithmetic in the same order (qkr_load,
 * qkr_finish).
 * head_dim <= 256. Under programmatic dependent launch the norm weights, the rotation (pos,
 * inv_freq, cosf/sinf) and the cache offset are computed before pdl_wait: after the wait the
 * kernel is one L2 round trip and the arithmetic. The decode steps' form (few tokens). */
__global__ void __launch_bounds__(QKR_WARPS * 32)
    qk_norm_rope_store_kernel(float *q_out, const float *q, float *k, const float *v, int ld_q, int ld_kv,
                              const float *q_norm, const float *k_norm, float eps, int n_head, int n_rot,
                              const int32_t *pos, const float *inv_freq, int neox, const cuda_kv kv, int l,
                              const int32_t *seq_id) {
    __shared__ float hvs[QKR_WARPS][256];
    PROBE_BEGIN(2);
    pdl_launch_dependents();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x, hh = blockIdx.y * QKR_WARPS + warp, hd = kv.head_dim, is_k = hh >= n_head;
    const bool live = hh < n_head + kv.n_head_kv;
    const int h = is_k ? hh - n_head : hh;
    const float *w = is_k ? k_norm : q_norm;
    /* Before pdl_wait: what no kernel of the step writes (common.cuh): the norm weights, the
     * rotation of this lane's pairs at pos[t] (a step input), and the cache offset of the token. */
    const int half = n_rot / 2;
    float wv[QKR_PER], cs[QKR_PER / 2], sn[QKR_PER / 2];
    size_t off = 0;
    if (live) {
        qkr_weights(w, hd, lane, wv);
        const float p = (float)pos[t], m = inv_freq[half]; /* rope.h's table: the attention factor last */
#pragma unroll
        for (int k2 = 0; k2 < QKR_PER / 2; k2++) {
            const int i = lane + 32 * k2;
            const float ang = i < half ? p * inv_freq[i] : 0.0f;
            cs[k2] = cosf(ang) * m, sn[k2] = sinf(ang) * m;
        }
        if (is_k) {
            const int32_t *tab = kv.block_tab + (size_t)seq_id[t] * kv.max_blocks;
            off = kv_off(kv, l, tab, pos[t]) + (size_t)h * hd;
        }
    }
    pdl_wait();
    PROBE(1);
    if (!live) return;
    const size_t xo = is_k ? (size_t)t * ld_kv + (size_t)h * hd : (size_t)t * ld_q + (size_t)h * hd;
    float xv[QKR_PER], vv[QKR_PER];
    qkr_load((is_k ? k : q) + xo, v + (size_t)t * ld_kv + (size_t)h * hd, is_k, hd, lane, xv, vv);
    PROBE(2);
    qkr_finish(is_k ? k + xo : q_out + ((size_t)t * n_head + h) * hd, w != NULL, eps, n_rot, neox, kv, is_k, off, xv,
               vv, wv, cs, sn, hvs[warp], lane);
    PROBE(3);
}

/* The prefill form: grid n_tokens, a block of QKP_WARPS warps per token; the token's rotation
 * (cosf/sinf of pos[t] * inv_freq[i], the same values as the decode form's) computed once into
 * shared memory instead of by every head's warp, then each warp takes heads warp, warp +
 * QKP_WARPS, ...: the same bits as qk_norm_rope_store_kernel. (A warp per head in blocks of up to
 * 24 warps, the decode form's split, ran Qwen3-32B pp512 0.7% slower on an H200.) */
#define QKP_WARPS 8
#define QKP_DECODE_MAX 16 /* the backend's CUDA_DECODE_MAX: decode steps keep the form above (PDL, a warp a
                          * head); either form gives the same bits, so only speed hangs on this */
__global__ void __launch_bounds__(QKP_WARPS * 32)
    qk_norm_rope_store_rows_kernel(float *q_out, const float *q, float *k, const float *v, int ld_q, int ld_kv,
                                   const float *q_norm, const float *k_norm, float eps, int n_head, int n_rot,
                                   const int32_t *pos, const float *inv_freq, int neox, const cuda_kv kv, int l,
                                   const int32_t *seq_id) {
    __shared__ float hvs[QKP_WARPS][256];
    __shared__ float cs_s[32 * QKR_PER / 2], sn_s[32 * QKR_PER / 2];
    pdl_launch_dependents();
    pdl_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = blockIdx.x, hd = kv.head_dim;
    const int half = n_rot / 2, p = pos[t];
    const float m = inv_freq[half]; /* rope.h's table: the attention factor last */
    for (int i = threadIdx.x; i < 32 * QKR_PER / 2; i += blockDim.x) {
        const float ang = i < half ? (float)p * inv_freq[i] : 0.0f;
        cs_s[i] = cosf(ang) * m, sn_s[i] = sinf(ang) * m;
    }
    const size_t off_t = kv_off(kv, l, kv.block_tab + (size_t)seq_id[t] * kv.max_blocks, p);
    __syncthreads();
    float cs[QKR_PER / 2], sn[QKR_PER / 2];
#pragma unroll
    for (int k2 = 0; k2 < QKR_PER / 2; k2++) cs[k2] = cs_s[lane + 32 * k2], sn[k2] = sn_s[lane + 32 * k2];
    for (int hh = warp; hh < n_head + kv.n_head_kv; hh += QKP_WARPS) {
        const bool is_k = hh >= n_head;
        const int h = is_k ? hh - n_head : hh;
        const float *w = is_k ? k_norm : q_norm;
        float wv[QKR_PER];
        qkr_weights(w, hd, lane, wv);
        const size_t xo = is_k ? (size_t)t * ld_kv + (size_t)h * hd : (size_t)t * ld_q + (size_t)h * hd;
        float xv[QKR_PER], vv[QKR_PER];
        qkr_load((is_k ? k : q) + xo, v + (size_t)t * ld_kv + (size_t)h * hd, is_k, hd, lane, xv, vv);
        qkr_finish(is_k ? k + xo : q_out + ((size_t)t * n_head + h) * hd, w != NULL, eps, n_rot, neox, kv, is_k,
                   is_k ? off_t + (size_t)h * hd : 0, xv, vv, wv, cs, sn, hvs[warp], lane);
    }
}

extern "C" void qk_norm_rope_store_cuda(float *q_out, const float *q, float *k, const float *v, int ld_q, int ld_kv,
                                        const float *q_norm, const float *k_norm, float eps, int n_head, int n_rot,
                                        const int32_t *pos, const float *inv_freq, int neox, const struct cuda_kv *kv,
                                        int l, const int32_t *seq_id, int n_tokens, cudaStream_t st) {
    if (n_tokens <= 0) return;
    if (n_tokens > QKP_DECODE_MAX) {
        kernel_launch(qk_norm_rope_store_rows_kernel, dim3(n_tokens), dim3(QKP_WARPS * 32), 0, st, q_out, q, k, v, ld_q,
                      ld_kv, q_norm, k_norm, eps, n_head, n_rot, pos, inv_freq, neox, *kv, l, seq_id);
        return;
    }
    dim3 grid(n_tokens, (n_head + kv->n_head_kv + QKR_WARPS - 1) / QKR_WARPS);
    PROBE_REGISTER(ops);
    kernel_launch(qk_norm_rope_store_kernel, grid, dim3(QKR_WARPS * 32), 0, st, q_out, q, k, v, ld_q, ld_kv, q_norm,
                  k_norm, eps, n_head, n_rot, pos, inv_freq, neox, *kv, l, seq_id);
}

/* ---- attention: split-K flash-decoding over the paged cache ---- */

#define ATT_TILE 32 /* positions per shared-memory tile: one per lane when scoring */

extern "C" size_t attention_smem_bytes(int head_dim, int group) {
    return (size_t)(ATT_TILE * (head_dim + 4) + ATT_TILE * head_dim + group * head_dim) * sizeof(float);
}

/* 8 consecutive K/V elements at off (off a multiple of 8; head_dim a multiple of 32) as float. */
template <typename KV>
static __device__ __forceinline__ void load8(const void *base, size_t off, float *o) {
    if (sizeof(KV) == 2) {
        uint4 a = *(const uint4 *)((const __half *)base + off);
        const __half2 *h = (const __half2 *)&a;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float2 f = __half22float2(h[j]);
            o[2 * j] = f.x, o[2 * j + 1] = f.y;
        }
    } else {
        const float4 *p = (const float4 *)((const float *)base + off);
        float4 a = p[0], b = p[1];
        o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    }
}

/* grid (n_tokens, n_head_kv, n_split), block group*32: warp w is query head kvh*group + w. Each
 * block reads its split's K/V tiles once for all heads of the group (GQA), keeps a running max m,
 * sum l and unnormalised output o per head, and writes them for attention_combine_kernel.
 * Shared memory: K tile [32][head_dim + 4] (rows 16-byte aligned, a lane per row reads float4s
 * without bank conflicts), V tile [32][head_dim], q of the group's heads. Scoring: lane j = position
 * j; accumulating: lane owns dims 4*lane + 128c .. +3. */
template <typename KV, bool Q = false>
__global__ void attention_kernel(float *__restrict__ out, float *__restrict__ part_o, float *__restrict__ part_ml,
                                 const float *__restrict__ q,
                                 const cuda_kv kv, int l, const int32_t *__restrict__ pos,
                                 const int32_t *__restrict__ seq_id, int n_head, int n_split, int split_len, float scale) {
    extern __shared__ float4 sm4[];
    float *sm = (float *)sm4;
    const int hd = kv.head_dim, group = n_head / kv.n_head_kv, ks = hd + 4;
    const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = kvh * group + warp;
    float *Ks = sm, *Vs = Ks + ATT_TILE * ks, *Qs = Vs + ATT_TILE * hd;
    const int n_kv = pos[t] + 1;
    const int p0 = split * split_len, p1 = min(n_kv, p0 + split_len);
    const int32_t *tab = kv.block_tab + (size_t)seq_id[t] * kv.max_blocks;
    const float *qt = q + (size_t)t * n_head * hd + (size_t)kvh * group * hd;
    for (int i = threadIdx.x; i < group * hd; i += blockDim.x) Qs[i] = qt[i];
    float m = -INFINITY, lsum = 0.0f;
    float4 o[2] = {make_float4(0, 0, 0, 0), make_float4(0, 0, 0, 0)};
    const int hd8 = hd / 8, hd4 = hd / 4;
    /* window + sink attention: the positions in [vis_a, vis_b) are not seen (kv_visible), but for the
     * blocks block selection chose there (kv_select.cu's bitmap of this token and KV head) */
    int vis_a = p1, vis_b = p1;
    if (kv.attn_window && n_kv > kv.attn_sinks + kv.attn_window) vis_a = kv.attn_sinks, vis_b = n_kv - kv.attn_window;
    const uint32_t *sel = kv.topk_blocks ? kv.sel + ((size_t)t * kv.n_head_kv + kvh) * kv.sel_words : NULL;
    auto seen = [&](int p) {
        const int jb = p / kv.block_size;
        return !(p >= vis_a && p < vis_b) || (sel && (sel[jb >> 5] >> (jb & 31) & 1u));
    };
    for (int t0 = p0; t0 < p1; t0 += ATT_TILE) {
        if (t0 >= vis_a && min(t0 + ATT_TILE, p1) <= vis_b) { /* a tile it does not see (uniform in the block)? */
            bool any = false;
            if (sel)
                for (int jb = t0 / kv.block_size; jb <= (min(t0 + ATT_TILE, p1) - 1) / kv.block_size; jb++)
                    any |= sel[jb >> 5] >> (jb & 31) & 1u;
            if (!any) continue;
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < ATT_TILE * hd8; idx += blockDim.x) {
            int j = idx / hd8, d = (idx - j * hd8) * 8, p = t0 + j;
            float kk[8], vv[8];
            if (p < p1 && !seen(p)) { /* not read */
#pragma unroll
                for (int e = 0; e < 8; e++) kk[e] = vv[e] = 0.0f;
            } else if (p < p1 && Q) { /* a quantized cache: the residual or the row dequantized (kv_quant.cuh) */
                kvq_load8(kv, KV_K, l, tab, seq_id[t], kvh, p, n_kv - 1, d, kk);
                kvq_load8(kv, KV_V, l, tab, seq_id[t], kvh, p, n_kv - 1, d, vv);
            } else if (p < p1) {
                size_t off = kv_off(kv, l, tab, p) + (size_t)kvh * hd + d;
                load8<KV>(kv.k, off, kk);
                load8<KV>(kv.v, off, vv);
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) kk[e] = vv[e] = 0.0f;
            }
            float4 *kd = (float4 *)(Ks + j * ks + d), *vd = (float4 *)(Vs + j * hd + d);
            kd[0] = make_float4(kk[0], kk[1], kk[2], kk[3]), kd[1] = make_float4(kk[4], kk[5], kk[6], kk[7]);
            vd[0] = make_float4(vv[0], vv[1], vv[2], vv[3]), vd[1] = make_float4(vv[4], vv[5], vv[6], vv[7]);
        }
        __syncthreads();
        const int p = t0 + lane;
        float s = -INFINITY;
        if (p < p1 && seen(p)) {
            const float4 *kr = (const float4 *)(Ks + lane * ks), *qr = (const float4 *)(Qs + warp * hd);
            float a = 0.0f;
            for (int d = 0; d < hd4; d++) {
                const float4 kv4 = kr[d], q4 = qr[d];
                a = fmaf(q4.x, kv4.x, fmaf(q4.y, kv4.y, fmaf(q4.z, kv4.z, fmaf(q4.w, kv4.w, a))));
            }
            s = a * scale;
        }
        const float m_new = fmaxf(m, warp_max(s)); /* finite: the tile has at least one position it sees */
        const float pj = s > -INFINITY ? expf(s - m_new) : 0.0f;
        const float corr = expf(m - m_new);
        lsum = lsum * corr + warp_sum(pj);
#pragma unroll
        for (int c = 0; c < 2; c++) o[c].x *= corr, o[c].y *= corr, o[c].z *= corr, o[c].w *= corr;
        const int n_j = min(ATT_TILE, p1 - t0);
        for (int j = 0; j < n_j; j++) {
            const float w = __shfl_sync(FULL_MASK, pj, j);
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int d = 4 * lane + 128 * c;
                if (d < hd) {
                    const float4 v4 = *(const float4 *)(Vs + j * hd + d);
                    o[c].x = fmaf(w, v4.x, o[c].x), o[c].y = fmaf(w, v4.y, o[c].y);
                    o[c].z = fmaf(w, v4.z, o[c].z), o[c].w = fmaf(w, v4.w, o[c].w);
                }
            }
        }
        m = m_new;
    }
    if (out) { /* one split: normalise and write the result (no combine step) */
        const float inv = 1.0f / lsum;
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int d = 4 * lane + 128 * c;
            if (d < hd)
                *(float4 *)(out + ((size_t)t * n_head + h) * hd + d) =
                    make_float4(o[c].x * inv, o[c].y * inv, o[c].z * inv, o[c].w * inv);
        }
        return;
    }
    const size_t pidx = ((size_t)t * n_head + h) * n_split + split;
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const int d = 4 * lane + 128 * c;
        if (d < hd) *(float4 *)(part_o + pidx * hd + d) = o[c];
    }
    if (lane == 0) part_ml[2 * pidx] = m, part_ml[2 * pidx + 1] = lsum;
}

/* grid (n_tokens, n_head), block (head_dim, ny): out = sum_s o_s e^(m_s - M) / sum_s l_s e^(m_s - M).
 * Thread (d, y) sums the splits y, y + ny, ... (its loads independent of each other), then the ny
 * partial sums meet in shared memory, added in y order. SH: the splits' (m, l) are first copied
 * into shared memory, one load per thread (dynamic: n_split float2, then the [ny][head_dim]
 * partials); without it (more than CB_SMEM_SPLITS splits) they are read from global memory where
 * used. A thread's first CB_PRE partials are loaded with the (m, l), and each warp finds the maximum
 * over the splits itself (lanes, then shuffles) where every thread walked all of them. A thread per
 * d looping over every split, with a dependent global load per split, took 11 us of each Qwen3-32B
 * layer at 32K positions (33 splits; H200 timeline); the splits spread over ny rows, 4.2 us (before
 * CB_PRE). */
#define CB_SMEM_SPLITS 4096
#define CB_PRE 8 /* partials a thread loads before the splits' maximum is known */
#define CB_THREADS 1024
static_assert((CB_SMEM_SPLITS + CB_THREADS) * sizeof(float2) <= 48 * 1024,
              "the combine's shared memory stays within the default 48 KiB (no opt-in)");
template <bool SH>
__global__ void attention_combine_kernel(float *out, int8_t *xq, float2 *xds, const float *part_o, const float *part_ml,
                                         int n_head, int hd, int n_split) {
    extern __shared__ float2 cb_sm[];
    pdl_launch_dependents();
    pdl_wait();
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x, y = threadIdx.y, ny = blockDim.y;
    const size_t base = ((size_t)t * n_head + h) * n_split;
    const float2 *ml = (const float2 *)part_ml + base; /* (m_s, l_s); l_s = 0: an empty split */
    float2 *red = cb_sm + (SH ? n_split : 0);
    const float *po = part_o + base * hd + d;
    float pre[CB_PRE]; /* the first CB_PRE partials of this thread, read with the (m, l): one round trip */
#pragma unroll
    for (int k = 0; k < CB_PRE; k++) {
        const int s = y + k * ny;
        pre[k] = s < n_split ? po[(size_t)s * hd] : 0.0f; /* read even for an empty split (written, unused) */
    }
    if (SH) {
        for (int s = y * hd + d; s < n_split; s += hd * ny) cb_sm[s] = ml[s];
        __syncthreads();
        ml = cb_sm;
    }
    float M = -INFINITY; /* a warp's lanes take every 32nd split, then meet (hd % 32 == 0: one y a warp) */
    for (int s = d & 31; s < n_split; s += 32)
        if (ml[s].y > 0.0f) M = fmaxf(M, ml[s].x);
    M = warp_max(M);
    float L = 0.0f, acc = 0.0f;
#pragma unroll
    for (int k = 0; k < CB_PRE; k++) {
        const int s = y + k * ny;
        const float2 v = s < n_split ? ml[s] : make_float2(0.0f, 0.0f);
        if (v.y > 0.0f) {
            const float w = expf(v.x - M);
            L = fmaf(v.y, w, L), acc = fmaf(pre[k], w, acc);
        }
    }
#pragma unroll 4
    for (int s = y + CB_PRE * ny; s < n_split; s += ny) {
        const float o = po[(size_t)s * hd]; /* read even for an empty split (written, unused) */
        const float2 v = ml[s];
        if (v.y > 0.0f) {
            const float w = expf(v.x - M);
            L = fmaf(v.y, w, L), acc = fmaf(o, w, acc);
        }
    }
    red[y * hd + d] = make_float2(L, acc);
    __syncthreads();
    if (y > 0) return;
    L = 0.0f, acc = 0.0f;
    for (int k = 0; k < ny; k++) L += red[k * hd + d].x, acc += red[k * hd + d].y;
    const size_t i = ((size_t)t * n_head + h) * hd + d;
    out[i] = acc / L;
    if (xq) warp_q8(acc / L, xq, xds, (int64_t)i); /* hd % 32 == 0: a warp is one aligned group */
}

extern "C" void attention_combine_cuda(float *out, int8_t *xq, float *xds, const float *part_o, const float *part_ml,
                                       int n_tokens, int n_head, int head_dim, int n_split, cudaStream_t st) {
    if (n_tokens <= 0) return;
    int ny = CB_THREADS / head_dim;
    if (ny > 8) ny = 8;
    if (ny > n_split) ny = n_split;
    const dim3 grid(n_tokens, n_head), block(head_dim, ny);
    const size_t red = (size_t)ny * head_dim * sizeof(float2);
    if (n_split <= CB_SMEM_SPLITS)
        kernel_launch(attention_combine_kernel<true>, grid, block, (size_t)n_split * sizeof(float2) + red, st, out, xq,
                      (float2 *)xds, part_o, part_ml, n_head, head_dim, n_split);
    else
        kernel_launch(attention_combine_kernel<false>, grid, block, red, st, out, xq, (float2 *)xds, part_o, part_ml,
                      n_head, head_dim, n_split);
}

extern "C" int attention_cuda_prepare(int head_dim, int group) {
    const int smem = (int)attention_smem_bytes(head_dim, group);
    if (cudaFuncSetAttribute(attention_kernel<float, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
        cudaFuncSetAttribute(attention_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess ||
        cudaFuncSetAttribute(attention_kernel<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
        return -1;
    return 0;
}

extern "C" void attention_cuda(float *out, const float *q, const struct cuda_kv *kv, int l, const int32_t *pos,
                               const int32_t *seq_id, int n_tokens, int n_head, int n_split, int split_len,
                               float *part_o, float *part_ml, cudaStream_t st) {
    if (n_tokens <= 0) return;
    const int group = n_head / kv->n_head_kv, hd = kv->head_dim;
    const size_t smem = attention_smem_bytes(hd, group);
    const float scale = kv->attn_scale;
    dim3 grid(n_tokens, kv->n_head_kv, n_split), block(group * 32);
    float *direct = n_split == 1 ? out : NULL; /* one split: the kernel writes out itself */
    if (kv->quantized) {
        attention_kernel<float, true><<<grid, block, smem, st>>>(direct, part_o, part_ml, q, *kv, l, pos, seq_id, n_head,
                                                                 n_split, split_len, scale);
    } else if (kv->kv_f32) {
        attention_kernel<float><<<grid, block, smem, st>>>(direct, part_o, part_ml, q, *kv, l, pos, seq_id, n_head,
                                                           n_split, split_len, scale);
    } else {
        attention_kernel<__half><<<grid, block, smem, st>>>(direct, part_o, part_ml, q, *kv, l, pos, seq_id, n_head,
                                                            n_split, split_len, scale);
    }
    if (n_split > 1) attention_combine_cuda(out, NULL, NULL, part_o, part_ml, n_tokens, n_head, hd, n_split, st);
}
