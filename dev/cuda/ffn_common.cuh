/* ffn_common.cuh - what the flow probe (layer_flow.cu) takes for its feed-forward half: Qwen3-32B's
 * FFN weights as dummy Q4_0 in the CUDA backend's layout, the engine's launches of one FFN (the
 * probes' variant A), and the shared-memory bulk-copy primitives their rings use.
 *
 * Layout of a weight (backend.h): codes [n_out][n_in / 2] (byte j of a group: element j low,
 * j + 16 high), half scales [n_out][n_in / 32]; w = d (q - 8). */
#ifndef PXQ_DEV_FFN_COMMON_CUH
#define PXQ_DEV_FFN_COMMON_CUH

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "cuda/backend.h"
#include "cuda/common.cuh"
#include "cuda/ops_cuda.h"
#include "probe_check.h"

#define D_EMBD 5120
#define D_FF 25600
#define EPS 1e-6f

struct mv {               /* one Q4_0 weight */
    const uint8_t *q;     /* [n_out][n_in / 2] */
    const uint16_t *s;    /* [n_out][n_in / 32] half */
    int n_in, n_out;
};
struct layer_w {
    mv gu, down;          /* gate|up: n_out 2 D_FF (gate rows, then up rows); down: n_in D_FF */
    const float *norm;    /* the FFN's rmsnorm weight, D_EMBD */
};

__global__ void fill_kernel(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = (uint8_t)h;
    }
}
__global__ void fill_scales(uint16_t *s, size_t n, float lo, float hi, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        s[i] = __half_as_ushort(__float2half(lo + (hi - lo) * (float)(h & 0xffff) / 65535.0f));
    }
}

/* One dummy Q4_0 weight of n_out x n_in, its scales uniform in [lo, hi] (seeded), added to *wbytes. */
static mv make_mv(int n_in, int n_out, float lo, float hi, uint32_t seed, size_t *wbytes) {
    const size_t nq = (size_t)n_out * n_in / 2, ns = (size_t)n_out * n_in / 32;
    uint8_t *q;
    uint16_t *s;
    CK(cudaMalloc(&q, nq));
    CK(cudaMalloc(&s, ns * 2));
    fill_kernel<<<1024, 256>>>(q, nq, 0x9e3779b9u * seed);
    fill_scales<<<1024, 256>>>(s, ns, lo, hi, 0x85ebca6bu * seed);
    *wbytes += nq + ns * 2;
    return mv{q, s, n_in, n_out};
}
/* An rmsnorm weight of D_EMBD values in [0.5, 1.5), different for each seed (so that a norm used in
 * the wrong place shows in a probe's output). */
static float *make_norm(int seed) {
    float *nw;
    CK(cudaMalloc(&nw, D_EMBD * 4));
    std::vector<float> hn(D_EMBD);
    for (int i = 0; i < D_EMBD; i++) hn[i] = 0.5f + (float)((i * 7919 + seed * 389) % 1000) / 1000.0f;
    CK(cudaMemcpy(nw, hn.data(), D_EMBD * 4, cudaMemcpyHostToDevice));
    return nw;
}
/* n_layer distinct weight sets (the L2 keeps nothing between layers); returns their bytes. The
 * scales keep the residual's growth moderate: gate|up sums 5120 terms, down 25600. */
static size_t make_layers(std::vector<layer_w> &h, int n_layer) {
    h.resize(n_layer);
    size_t wbytes = 0;
    for (int l = 0; l < n_layer; l++) {
        h[l].gu = make_mv(D_EMBD, 2 * D_FF, 0.002f, 0.004f, 2 * l + 1, &wbytes);
        h[l].down = make_mv(D_FF, D_EMBD, 0.0005f, 0.001f, 2 * l + 2, &wbytes);
        h[l].norm = make_norm(2 * l);
    }
    return wbytes;
}

/* The probes' command line ([n_layer], 1..1024, default 32; exit 2 on anything else) and the
 * device's SM count and cooperative launch. */
struct probe_setup {
    int n_layer, n_sm, coop;
};
static probe_setup probe_start(int argc, char **argv) {
    probe_setup p = {argc > 1 ? atoi(argv[1]) : 32, 0, 0};
    if (p.n_layer < 1 || p.n_layer > 1024) {
        fprintf(stderr, "usage: %s [n_layer 1..1024]\n", argv[0]);
        exit(2);
    }
    int dev = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&p.n_sm, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaDeviceGetAttribute(&p.coop, cudaDevAttrCooperativeLaunch, dev));
    return p;
}

/* The best of 10 runs of run() on st, in us a layer of n_layer; prints it with the weights' rate
 * (wbytes over all layers) under name. */
template <class F>
static double time_best(const char *name, F run, cudaStream_t st, int n_layer, size_t wbytes) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int it = 0; it < 10; it++) {
        CK(cudaEventRecord(e0, st));
        run();
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < best) best = ms;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    const double us = best * 1000.0 / n_layer;
    printf("%s: %.2f us a layer, %.1f GB/s of weights (best of 10)\n", name, us, wbytes / n_layer / (us * 1e3));
    return us;
}

/* The probes' starting residual, D_EMBD values in [-1, 1]. */
static std::vector<float> start_x() {
    std::vector<float> x0(D_EMBD);
    for (int i = 0; i < D_EMBD; i++) x0[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    return x0;
}

/* The probes' starting residual, on the device (D_EMBD floats). */
static float *start_x_device() {
    const std::vector<float> x0 = start_x();
    float *d;
    CK(cudaMalloc(&d, D_EMBD * 4));
    CK(cudaMemcpy(d, x0.data(), D_EMBD * 4, cudaMemcpyHostToDevice));
    return d;
}

/* A: the engine's kernels as a decode step launches them (rmsnorm_q8_cuda, matmul_q8_pf_cuda with
 * gate|up's early trigger, swiglu_q8_cuda, matmul_q8_pf_cuda accumulating), x += FFN(x) a layer,
 * captured once in a CUDA graph with programmatic dependent launch where the device has it, on a
 * stream of its own that the probes use for every run (init waits for the device first: the
 * weights' fills); run() copies x0 into x and launches the graph on st. */
struct engine_ffn {
    float *x, *xds, *hb, *hb2; /* the residual; scratch: int8 scales, gate|up's rows, the SwiGLU's */
    int8_t *xq;
    const float *x0;
    cudaStream_t st;
    cudaGraphExec_t ge;
    void init(const std::vector<layer_w> &h, const float *x0d) {
        init(h, x0d, [](int, engine_ffn &) {});
    }
    /* before(l, *this): launches of its own on st before layer l's FFN (layer_flow.cu: the
     * attention's projections), with this one's buffers at hand */
    template <class Before>
    void init(const std::vector<layer_w> &h, const float *x0d, Before before) {
        x0 = x0d;
        CK(cudaDeviceSynchronize());
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        CK(cudaMalloc(&x, D_EMBD * 4));
        CK(cudaMalloc(&xq, D_FF));
        CK(cudaMalloc(&xds, D_FF / 32 * 8));
        CK(cudaMalloc(&hb, 2 * D_FF * 4));
        CK(cudaMalloc(&hb2, D_FF * 4));
        cuda_pdl = cuda_pdl_supported();
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (size_t i = 0; i < h.size(); i++) {
            const layer_w &l = h[i];
            before((int)i, *this);
            cuda_weight gu = {WFMT_Q4_0, D_EMBD, 2 * D_FF, l.gu.q, l.gu.s};
            cuda_weight dn = {WFMT_Q4_0, D_FF, D_EMBD, l.down.q, l.down.s};
            rmsnorm_q8_cuda(NULL, xq, xds, x, l.norm, D_EMBD, 1, EPS, NULL, st);
            matmul_q8_pf_cuda(hb, &gu, xq, xds, 1, 2 * D_FF, 0, NULL, MATMUL_Q8_LAUNCH_NEXT, st);
            swiglu_q8_cuda(hb2, xq, xds, hb, hb + D_FF, 1, D_FF, 2 * D_FF, st);
            matmul_q8_pf_cuda(x, &dn, xq, xds, 1, D_EMBD, 1, NULL, 0, st);
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
    }
    void run() {
        CK(cudaMemcpyAsync(x, x0, D_EMBD * 4, cudaMemcpyDeviceToDevice, st));
        CK(cudaGraphLaunch(ge, st));
    }
};

/* ---- bulk copies into shared memory on mbarriers (sm_90) ---- */

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
/* n bytes (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst,
 * completing on the mbarrier at shared address bar */
static __device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t n, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(n), "r"(bar)
                 : "memory");
}
static __device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
/* arrive on bar, expecting tx more bytes of copies to complete on it */
static __device__ __forceinline__ void mbar_expect(uint64_t *bar, uint32_t tx) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(tx) : "memory");
}
/* spin until the phase of parity `parity` of bar has completed */
static __device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    const uint32_t b = smem_u32(bar);
    uint32_t done = 0;
    while (!done) {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(b), "r"(parity)
                     : "memory");
    }
}

/* Normalised and largest difference of b against a (n values): prints "what: ..." */
static void report_diff(const char *what, const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 0, mx = 0;
    for (size_t i = 0; i < a.size(); i++) {
        const double d = (double)a[i] - b[i];
        num += d * d, den += (double)a[i] * a[i];
        if (fabs(d) > mx) mx = fabs(d);
    }
    printf("%s: normalised %.3g, max |diff| %.3g (|x| rms %.3g)\n", what, sqrt(num / (den > 0 ? den : 1)), mx,
           sqrt(den / (a.size() ? a.size() : 1)));
}

#endif
