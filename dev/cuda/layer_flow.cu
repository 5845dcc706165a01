/* layer_flow.cu - Qwen3-32B's whole decode layer, batch 1, as one persistent kernel with no grid
 * barrier: the feed-forward flow's best form (pieces dealt from one counter, sums tagged with their
 * layer, epilogue warps) carried over the attention's projections (dev/cuda/README.md).
 *
 * A layer, at a context of one token: x += o(attn(q|k|v(rmsnorm(x)))), then x += FFN(x). With one
 * position the attention's softmax is 1, so head h's output is the v of its KV head h / 8 (GQA,
 * 64 q heads, 8 KV heads of 128): q and k are read and summed, as a decode step reads them, and
 * their sums are not used. The chain reads all four weights of the layer (274 MB, Q4_0), which is
 * what the bench's batch-1 roofline counts; the attention over a longer context, the q/k norms,
 * RoPE and the KV store are not here.
 *
 * Pieces (flow_common.cuh) of the four weights go through each consumer warp's ring in the run's
 * order: q|k|v (v's rows first, K-major), o (K-major in chunks of OCHUNK rows), gate|up (K-major,
 * gate and up interleaved in 32s), down (K-major in chunks of DCHUNK rows), layer after layer. A
 * piece waits for its input slice's ready counter, sums, and stores its sums with the layer's tag.
 * NE epilogue warps a block take the groups round-robin, in each layer v's 32 groups, then o's 160,
 * gate|up's 800, then down's 160, each once all its sums carry the tag:
 *   v group j: the sums times 1 / rms of x; the int8 group of each of the 8 q heads that read it
 *     (o's input), counted on o's slice j / 4;
 *   o group R: the residual xm = x + sum, its sum of squares, the int8 group of xm * the FFN's
 *     rmsnorm weight (gate|up's input);
 *   gate|up group G: times 1 / rms of xm, SwiGLU, the int8 group (down's input);
 *   down group R: x = xm + sum, its sum of squares, the int8 group of x * the next layer's attention
 *     rmsnorm weight (q|k|v's input).
 * A is the engine's launches for the same chain: rmsnorm_q8_cuda, matmul_q8_pf_cuda for q|k|v, a
 * kernel here that quantises v into o's input, matmul_q8_pf_cuda for o (accumulating into x), then
 * the FFN as ffn_common.cuh's launches, in one CUDA graph with PDL.
 *
 * Knobs (-D): NC consumer warps a block, NS ring stages a warp, RPP rows a piece, GRAB pieces
 * dealt at once, NE epilogue warps a block, POLL_E their sleep between polls (ns), POLL (how a
 * consumer waits), QCHUNK, OCHUNK, GCHUNK and DCHUNK (a weight's pieces K-major within chunks of
 * rows), QTAIL, OTAIL, GTAIL and DTAIL (only the weight's last n slices in chunks, the slices before
 * them K-major over all rows: its head takes its input slice by slice, its tail completes its output
 * chunk by chunk), KVG=1 (q|k|v's rows by KV group, as a real attention needs them, instead of v's
 * first), IW=1 (an input warp a block copies each slice, once ready, into shared memory, so a
 * consumer waits on an mbarrier and reads shared memory), INSLEEP, INRELAX and INLEAD (how and
 * from when the input warp polls: polls and fences slow the stream, dev/cuda/README.md), INCOPY=1 (the
 * input warp copies with loads and stores, not bulk copies), EFENCE=0 (no fence of every lane
 * before an epilogue's count; its red.release orders the lanes' stores), POLL_LAST (epilogue
 * warps poll the last slice's tags first), PIECE_TMA=1 with TMA_L2P (pieces straight from the
 * weights' row-major codes and scales, the engine's layout, by 2D tensor copies; no repacked copy),
 * ATT_NS (a sleep in each v group's epilogue, a stand-in for an attention's latency), NOWAIT=1, NOIW=1, NOEPI=1 (timing only: consumers do
 * not wait, and no input warp or no epilogue), TRACE=1 (time stamps of layers 8-11's pieces and groups into $TRACE_FILE,
 * read by flow_trace.py), and STREAM=1 (no waits and no epilogues: the stream of the four weights
 * alone; wrong results). The best form measured is `tools/gpu-check.sh
 * flow`'s.
 *
 * Build and run on the GPU from the repository root after `make CUDA_ARCH=90`:
 *   nvcc -arch=sm_90 -O3 -std=c++17 -Isrc [-DNC=6 -DNS=4 -DNE=4 ...] \
 *       -o /tmp/layer_flow dev/cuda/layer_flow.cu build/libpxq.a -lcublas
 *   /tmp/layer_flow [n_layer]          (default 32: 8.8 GB of weights, and as much again repacked)
 * It prints the output's distance from A's, then A's and the kernel's us a layer (best of 10, three
 * rounds alternated) and the average consumer warp's waits by weight. */
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "ffn_common.cuh"

#ifndef NC
#define NC 6 /* consumer warps a block; one block an SM */
#endif
#ifndef NS
#define NS 4 /* ring stages a consumer warp */
#endif
#ifndef RPP
#define RPP 16
#endif
#ifndef TRACE
#define TRACE 0 /* 1: time stamps of layers TR_L0 .. TR_L0 + TR_NL - 1's pieces and groups into $TRACE_FILE */
#endif
#if TRACE
static __device__ void tr_mark(uint32_t q, int what);
#define FLOW_TRACE_ISSUE(q) tr_mark(q, 0)
#endif
#include "flow_common.cuh"

#ifndef NE
#define NE 4 /* epilogue warps a block */
#endif
#ifndef QCHUNK
#define QCHUNK QKV_ROWS /* q|k|v's pieces K-major within chunks of QCHUNK rows (v's come first) */
#endif
#ifndef OCHUNK
#define OCHUNK 2560 /* o's pieces K-major within chunks of OCHUNK rows */
#endif
#ifndef DCHUNK
#define DCHUNK 2560
#endif
#ifndef STREAM
#define STREAM 0
#endif
#ifndef KVG
#define KVG 0 /* 1: q|k|v's rows by KV group (PERM_KVGROUP; QCHUNK 1280 gives a group a chunk) */
#endif
/* Each weight's last *TAIL slices in its chunks, the slices before them K-major over all its rows
 * (piece_at_tail; 0: chunks throughout) */
#ifndef QTAIL
#define QTAIL 0
#endif
#ifndef OTAIL
#define OTAIL 0
#endif
#ifndef GTAIL
#define GTAIL 0
#endif
#ifndef GCHUNK
#define GCHUNK GU_ROWS
#endif
#ifndef DTAIL
#define DTAIL 0
#endif
static_assert(D_EMBD % OCHUNK == 0 && OCHUNK % RPP == 0 && D_EMBD % DCHUNK == 0 && DCHUNK % RPP == 0,
              "OCHUNK, DCHUNK: divisors of D_EMBD, in whole pieces");
static_assert(NS <= 32, "NS: at most 32 stages a warp (one lane initialises each)");
static_assert(STREAM || NE >= 1, "NE: at least one epilogue warp a block (they make every input ready)");

#define N_HEAD 64
#define N_KV 8
#define HEAD_DIM 128
#define Q_DIM (N_HEAD * HEAD_DIM)         /* 8192: o's input */
#define KV_DIM (N_KV * HEAD_DIM)          /* 1024 */
#define QKV_ROWS (Q_DIM + 2 * KV_DIM)     /* 10240: q, k, v */
#define GU_ROWS (2 * D_FF)
#define N_W 4                             /* weights a layer: q|k|v, o, gate|up, down */
#define NP_QKV ((D_EMBD / 1024) * (QKV_ROWS / RPP))
#define NP_O ((Q_DIM / 1024) * (D_EMBD / RPP))
#define NP_GU ((D_EMBD / 1024) * (GU_ROWS / RPP))
#define NP_DN ((D_FF / 1024) * (D_EMBD / RPP))
#define NP_LAYER (NP_QKV + NP_O + NP_GU + NP_DN)
#ifndef IW
#define IW 0 /* 1: an input warp a block copies each input slice, once ready, into shared memory */
#endif
#ifndef NOWAIT
#define NOWAIT 0 /* IW: 1: consumers do not wait for their input slices (timing only: wrong results) */
#endif
#ifndef INCOPY
#define INCOPY 0 /* IW: 1: the input warp copies a slice with the lanes' loads and stores, not a bulk copy */
#endif
#ifndef NOPROXY
#define NOPROXY 0 /* IW: 1: no proxy fence before the bulk copy (timing only) */
#endif
#ifndef EFENCE
#define EFENCE 1 /* 0: no fence of every lane before an epilogue's count (its red.release orders them) */
#endif
#ifndef NOIW
#define NOIW 0 /* with NOWAIT: no input warp (timing only) */
#endif
#ifndef NOEPI
#define NOEPI 0 /* with NOWAIT: no epilogue warps, and the input warp copies without waiting (timing only) */
#endif
static_assert(!(NOIW || NOEPI) || NOWAIT, "NOIW, NOEPI: timing only, with NOWAIT (consumers would wait forever)");
#ifndef PIECE_TMA
#define PIECE_TMA 0 /* 1: pieces come straight from the weights' row-major codes and scales (the engine's
                     * layout) by two 2D tensor copies each, not from a repacked copy */
#endif
#ifndef TMA_L2P
#define TMA_L2P 0 /* PIECE_TMA: the maps' L2 promotion (CUtensorMapL2promotion: 0 none, 1 64 B, 2 128 B, 3 256 B) */
#endif
#ifndef ATT_NS
#define ATT_NS 0 /* ns each v group's epilogue sleeps before it makes o's input: a stand-in for the latency
                  * of an attention over a context (timing only; the results stay right) */
#endif
#ifndef INLEAD
#define INLEAD -1 /* IW: n >= 0: the input warp polls a weight's slices only once a consumer of its block is
                   * within n pieces (of the run's order) of the weight's first */
#endif
#ifndef INSLEEP
#define INSLEEP 0 /* IW: the input warp's sleep between polls of a slice's counter, ns */
#endif
#ifndef INRELAX
#define INRELAX 0 /* IW: 1: the input warp polls relaxed, then acquires once */
#endif
#define RING_SMEM ((NC * NS * PIECE_B + NC * NS * 8 + NC * NS * 4 + 127) / 128 * 128)
/* IW: after the rings, each weight's whole input (int8 codes, then its groups' float2 scales),
 * an mbarrier a slice, and each consumer warp's current piece */
#define IN_Q8_B (D_EMBD + Q_DIM + D_EMBD + D_FF)
#define IN_SL (D_EMBD / 1024 + Q_DIM / 1024 + D_EMBD / 1024 + D_FF / 1024)
#define IN_SMEM (IN_Q8_B + IN_Q8_B / 32 * 8 + IN_SL * 8 + NC * 4)
#define L_SMEM (RING_SMEM + (IW ? IN_SMEM : 0))
#define N_WARPS (NC + NE + (IW ? 1 : 0))
static_assert(L_SMEM <= 232448, "NC x NS stages (and IW's inputs) exceed sm_90's 227 KiB of shared memory a block");
static_assert(QKV_ROWS % QCHUNK == 0 && QCHUNK % RPP == 0, "QCHUNK: a divisor of q|k|v's rows, in whole pieces");
static_assert(GU_ROWS % GCHUNK == 0 && GCHUNK % 64 == 0, "GCHUNK: a divisor of gate|up's rows, in whole SwiGLU groups");
static_assert(QTAIL <= D_EMBD / 1024 && OTAIL <= Q_DIM / 1024 && GTAIL <= D_EMBD / 1024 && DTAIL <= D_FF / 1024,
              "*TAIL: at most the weight's slices");

#define NG_LAYER (KV_DIM / 32 + D_EMBD / 32 + D_FF / 32 + D_EMBD / 32) /* groups a layer: v, o, gate|up, down */
#if TRACE
#define TR_L0 8
#define TR_NL 4
__device__ unsigned long long *g_tr;  /* [TR_NL * NP_LAYER][4]: issued, input ready, landed, sums stored */
__device__ unsigned *g_trw;           /* [TR_NL * NP_LAYER]: the consumer warp (block * NC + warp) */
__device__ unsigned long long *g_trg; /* [TR_NL * NG_LAYER][2]: an epilogue warp starts polling, counts */
static __device__ void tr_mark(uint32_t q, int what) {
    const int l = q / NP_LAYER - TR_L0;
    if (l >= 0 && l < TR_NL) g_tr[((size_t)l * NP_LAYER + q % NP_LAYER) * 4 + what] = now_ns();
}
static __device__ __forceinline__ void tr_group(int l, int g, int what) {
    if (l >= TR_L0 && l < TR_L0 + TR_NL) g_trg[((size_t)(l - TR_L0) * NG_LAYER + g) * 2 + what] = now_ns();
}
#define TR_GROUP(l, g, what) \
    do { \
        if (lane == 0) tr_group(l, g, what); \
    } while (0)
#else
#define TR_GROUP(l, g, what) \
    do { \
    } while (0)
#endif
/* v group j's first row in q|k|v's piece order */
static __device__ __forceinline__ int v_row0(int j) {
    return KVG ? (j / 4) * (QKV_ROWS / N_KV) + (QKV_ROWS / N_KV - HEAD_DIM) + (j % 4) * 32 : 32 * j;
}

struct attn_w {
    mv qkv, o;         /* q|k|v: n_out QKV_ROWS (q rows, k rows, v rows); o: n_in Q_DIM */
    const float *norm; /* the attention's rmsnorm weight */
};
struct lflow_w {       /* one layer's weights in piece order, and its norms */
    const uint8_t *w[N_W];
    const float *attn_norm, *ffn_norm;
};
/* Weight m's geometry: input slices, output rows, chunk rows (piece_at), first piece in a layer. */
static __host__ __device__ __forceinline__ int w_sl(int m) { return m == 1 ? Q_DIM / 1024 : m == 3 ? D_FF / 1024 : D_EMBD / 1024; }
static __host__ __device__ __forceinline__ int w_nout(int m) { return m == 0 ? QKV_ROWS : m == 2 ? GU_ROWS : D_EMBD; }
static __host__ __device__ __forceinline__ int w_chunk(int m) {
    return m == 0 ? QCHUNK : m == 1 ? OCHUNK : m == 3 ? DCHUNK : GCHUNK;
}
static __host__ __device__ __forceinline__ int w_tail(int m) {
    return m == 0 ? QTAIL : m == 1 ? OTAIL : m == 2 ? GTAIL : DTAIL;
}
/* Weight m's row order in pieces (flow_common.cuh's perms) */
static __host__ __device__ __forceinline__ int w_perm(int m) {
    return m == 0 ? (KVG ? PERM_KVGROUP : PERM_LAST_FIRST) : m == 2 ? PERM_GU : PERM_NONE;
}
static __host__ __device__ __forceinline__ int w_first(int m) {
    return m == 0 ? 0 : m == 1 ? NP_QKV : m == 2 ? NP_QKV + NP_O : NP_QKV + NP_O + NP_GU;
}

/* IW: weight m's input offset in codes (its groups' at in_off / 32, its first slice's mbarrier at
 * in_off / 1024) */
static __host__ __device__ __forceinline__ int in_off(int m) {
    return m == 0 ? 0 : m == 1 ? D_EMBD : m == 2 ? D_EMBD + Q_DIM : 2 * D_EMBD + Q_DIM;
}
struct in_smem {
    int8_t *q8;
    float2 *d8;
    uint64_t *bar;
    volatile uint32_t *prog; /* a consumer warp's current piece in the run; ~0 once it has none */
};
static __device__ __forceinline__ in_smem in_smem_at(uint8_t *sm) {
    uint8_t *b = sm + RING_SMEM;
    return {(int8_t *)b, (float2 *)(b + IN_Q8_B), (uint64_t *)(b + IN_Q8_B + IN_Q8_B / 32 * 8),
            (volatile uint32_t *)(b + IN_Q8_B + IN_Q8_B / 32 * 8 + IN_SL * 8)};
}

struct lflow_bufs {
    float *x[2];            /* the residual at a layer's start, layer l reads x[l & 1] */
    float *xm;              /* after the attention */
    float *ssq_x[2], *ssq_m[2]; /* their sums of squares a group of 32 */
    int8_t *q8[N_W][2];     /* each weight's int8 input groups (x, o's input, xm, the SwiGLU's) */
    float2 *d8[N_W][2];
    unsigned *rdy[N_W];     /* each input's groups written, a counter a slice, cumulative over layers */
    unsigned long long *tp[N_W]; /* each weight's sums [slice][row], tagged with the layer + 1 */
    unsigned *next;         /* the next piece of the run to deal */
    unsigned long long *tw; /* [N_W + 1] ns over consumer warps: waiting for each weight's input, the run */
};

/* The int8 group R of v * nw (v: row 32R + lane of x), v's group sum of squares into ssq[R]; then
 * R counts on its slice of rdy. */
static __device__ __forceinline__ void residual_group(float v, const float *nw, int R, int8_t *q8, float2 *d8,
                                                      float *ssq, unsigned *rdy, int lane) {
    const int row = 32 * R + lane;
    const float ss = warp_sum(v * v);
    if (lane == 0) ssq[R] = ss;
    warp_q8(v * __ldg(nw + row), q8, d8, row);
    if (EFENCE) __threadfence(); /* red.release after the warp barrier orders the lanes' stores too */
    __syncwarp();
    if (lane == 0) red_release(rdy + R / 32, 1);
}
/* 1 / rms from a vector's 160 group sums of squares, once its ready counters show all of it
 * (acquire: the sums were written before the counts) */
static __device__ __forceinline__ float inv_rms(const float *ssq, const unsigned *rdy, unsigned target, int lane) {
    if (lane < D_EMBD / 1024)
        while (ld_acquire(rdy + lane) < target) __nanosleep(POLL_E); /* a spin here slows the stream */
    __syncwarp();
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < D_EMBD / 1024; i++) ss += __ldcg(ssq + lane + 32 * i);
    return 1.0f / sqrtf(warp_sum(ss) / (float)D_EMBD + EPS);
}
/* Epilogue warp e of n_e: the residual's groups before layer 0, then each layer's groups in the
 * order above (each group's inputs come from groups earlier in every epilogue warp's order). A
 * group R of o and of down is the same warp's each layer, so xm and x need no ordering. */
static __device__ void epilogue_warp(const lflow_w *L, int n_layer, const lflow_bufs &B, int e, int n_e, int lane) {
    for (int R = e; R < D_EMBD / 32; R += n_e)
        residual_group(__ldcg(B.x[0] + 32 * R + lane), L[0].attn_norm, R, B.q8[0][0], B.d8[0][0], B.ssq_x[0],
                       B.rdy[0], lane);
    for (int l = 0; l < n_layer; l++) {
        const unsigned tag = (unsigned)(l + 1), full = 32u * tag;
        const int c = l & 1, n = (l + 1) & 1;
        /* 1 / rms of x, then of xm: once a layer, before the polls of the groups that need them */
        const float inv_x = e < KV_DIM / 32 ? inv_rms(B.ssq_x[c], B.rdy[0], full, lane) : 0.0f;
        for (int j = e; j < KV_DIM / 32; j += n_e) { /* v */
            TR_GROUP(l, j, 0);
            const float inv = inv_x;
            const float v = tagged_row_sum<D_EMBD / 1024>(B.tp[0], QKV_ROWS, v_row0(j) + lane, tag) * inv;
            if (ATT_NS) { /* a stand-in for an attention stage's latency on this KV group (no work, a sleep) */
                const unsigned long long t0 = now_ns();
                while (now_ns() - t0 < (unsigned long long)ATT_NS) __nanosleep(256);
            }
            const int kv = j / 4, part = j % 4;
            /* warp_q8's bits, quantised once and stored for each of the 8 q heads that read it */
            const float amax = warp_max(fabsf(v)), d = amax / 127.0f;
            const float qv = d > 0.0f ? rintf(v / d) : 0.0f, sq = warp_sum(qv);
            for (int h = kv * (N_HEAD / N_KV); h < (kv + 1) * (N_HEAD / N_KV); h++) {
                B.q8[1][c][(h * 4 + part) * 32 + lane] = (int8_t)qv;
                if (lane == 0) B.d8[1][c][h * 4 + part] = make_float2(d, d * sq);
            }
            if (EFENCE) __threadfence();
            __syncwarp();
            if (lane == 0) red_release(B.rdy[1] + kv, N_HEAD / N_KV);
            TR_GROUP(l, j, 1);
        }
        for (int R = e; R < D_EMBD / 32; R += n_e) { /* o: the residual after the attention */
            const int row = 32 * R + lane;
            TR_GROUP(l, KV_DIM / 32 + R, 0);
            const float x0 = __ldcg(B.x[c] + row); /* loaded before the poll */
            const float xm = x0 + tagged_row_sum<Q_DIM / 1024>(B.tp[1], D_EMBD, row, tag);
            B.xm[row] = xm;
            residual_group(xm, L[l].ffn_norm, R, B.q8[2][c], B.d8[2][c], B.ssq_m[c], B.rdy[2], lane);
            TR_GROUP(l, KV_DIM / 32 + R, 1);
        }
        const float inv_m = e < D_FF / 32 ? inv_rms(B.ssq_m[c], B.rdy[2], full, lane) : 0.0f;
        for (int G = e; G < D_FF / 32; G += n_e) { /* gate|up: SwiGLU */
            TR_GROUP(l, KV_DIM / 32 + D_EMBD / 32 + G, 0);
            const float inv = inv_m;
            const float g = tagged_row_sum<D_EMBD / 1024>(B.tp[2], GU_ROWS, 64 * G + lane, tag) * inv;
            const float u = tagged_row_sum<D_EMBD / 1024>(B.tp[2], GU_ROWS, 64 * G + 32 + lane, tag) * inv;
            warp_q8(g / (1.0f + expf(-g)) * u, B.q8[3][c], B.d8[3][c], 32 * G + lane);
            if (EFENCE) __threadfence();
            __syncwarp();
            if (lane == 0) red_release(B.rdy[3] + G / 32, 1);
            TR_GROUP(l, KV_DIM / 32 + D_EMBD / 32 + G, 1);
        }
        const float *nw = L[l + 1 < n_layer ? l + 1 : l].attn_norm;
        for (int R = e; R < D_EMBD / 32; R += n_e) { /* down: the residual at the next layer's start */
            const int row = 32 * R + lane;
            TR_GROUP(l, NG_LAYER - D_EMBD / 32 + R, 0);
            const float xm = B.xm[row];
            const float x = xm + tagged_row_sum<D_FF / 1024>(B.tp[3], D_EMBD, row, tag);
            B.x[n][row] = x;
            residual_group(x, nw, R, B.q8[0][n], B.d8[0][n], B.ssq_x[n], B.rdy[0], lane);
            TR_GROUP(l, NG_LAYER - D_EMBD / 32 + R, 1);
        }
    }
}

/* IW: the block's input warp. For each layer and weight in run order, lane k < the weight's slices
 * waits (acquire) for slice k's ready counter and copies the slice's int8 codes and scales into
 * the block's shared memory, completing on the slice's mbarrier (a phase a layer). Before it
 * overwrites a weight's input with the next layer's, it waits until no consumer warp of the block
 * has a piece of the weight's last layer left (their current pieces are all past it). */
static __device__ void input_warp(int n_layer, const lflow_bufs &B, in_smem in, int lane) {
    for (int l = 0; l < n_layer; l++)
        for (int m = 0; m < N_W; m++) {
            if (l > 0) {
                const uint32_t past = (uint32_t)(l - 1) * NP_LAYER + w_first(m) + (m == N_W - 1 ? NP_DN : w_first(m + 1) - w_first(m));
                for (;;) {
                    const uint32_t p = lane < NC ? in.prog[lane] : ~0u;
                    if (__all_sync(FULL_MASK, p >= past)) break;
                    __nanosleep(64);
                }
            }
            if (INLEAD >= 0) { /* start polling only when a consumer of the block is INLEAD pieces from the weight */
                const uint32_t need = (uint32_t)l * NP_LAYER + w_first(m);
                const uint32_t start = need > (uint32_t)INLEAD ? need - (uint32_t)INLEAD : 0u;
                while (!__any_sync(FULL_MASK, lane < NC && in.prog[lane] >= start)) __nanosleep(200);
            }
            const int sl = w_sl(m), slot = in_off(m) / 1024;
            if (INCOPY) { /* slice by slice: lane 0 polls, every lane copies its group, lane 0 arrives */
                for (int k = 0; k < sl; k++) {
                    if (lane == 0 && !NOEPI)
                        while (ld_acquire(B.rdy[m] + k) < 32u * (l + 1)) __nanosleep(INSLEEP);
                    __syncwarp();
                    const int g = k * 32 + lane;
                    const int4 a = __ldcg((const int4 *)(B.q8[m][l & 1] + g * 32));
                    const int4 b = __ldcg((const int4 *)(B.q8[m][l & 1] + g * 32 + 16));
                    const float2 d = __ldcg(B.d8[m][l & 1] + g);
                    *(int4 *)(in.q8 + in_off(m) + g * 32) = a;
                    *(int4 *)(in.q8 + in_off(m) + g * 32 + 16) = b;
                    in.d8[in_off(m) / 32 + g] = d;
                    __syncwarp();
                    if (lane == 0) mbar_arrive(in.bar + slot + k);
                }
                continue;
            }
            const int k = lane;
            if (k < sl) {
                if (INRELAX && !NOEPI) /* poll relaxed with a sleep, then acquire once */
                    while (ld_relaxed(B.rdy[m] + k) < 32u * (l + 1)) __nanosleep(INSLEEP);
                while (!NOEPI && ld_acquire(B.rdy[m] + k) < 32u * (l + 1))
                    if (INSLEEP) __nanosleep(INSLEEP);
                if (!NOPROXY) asm volatile("fence.proxy.async.global;" ::: "memory");
                uint64_t *bar = in.bar + slot + k;
                if (l > 0) mbar_wait(bar, (l - 1) & 1); /* the slot's last copy has landed before it is re-armed */
                mbar_expect(bar, 1024 + 32 * 8);
                bulk_copy(in.q8 + in_off(m) + k * 1024, B.q8[m][l & 1] + k * 1024, 1024, smem_u32(bar));
                bulk_copy(in.d8 + in_off(m) / 32 + k * 32, B.d8[m][l & 1] + k * 32, 32 * 8, smem_u32(bar));
            }
            __syncwarp();
        }
    if (!INCOPY) /* no copy still writing the block's shared memory when it exits */
        for (int m = 0; m < N_W; m++)
            if (lane < w_sl(m)) mbar_wait(in.bar + in_off(m) / 1024 + lane, (n_layer - 1) & 1);
}

/* Piece q of the run: its layer l, weight m, index p within the weight, input slice k and first
 * row r0 in the weight's piece order */
struct lpiece {
    int l, m, p, k, r0;
};
static __device__ __forceinline__ lpiece lpiece_at(uint32_t q) {
    lpiece pc;
    pc.l = q / NP_LAYER;
    const int r = q % NP_LAYER;
    pc.m = r < NP_QKV ? 0 : r < NP_QKV + NP_O ? 1 : r < NP_LAYER - NP_DN ? 2 : 3;
    pc.p = r - w_first(pc.m);
    piece_at_tail(pc.p, w_sl(pc.m), w_nout(pc.m), w_chunk(pc.m), w_tail(pc.m), pc.k, pc.r0);
    return pc;
}
/* One 2D tensor copy of box (x, y) of map tm into shared memory dst, completing on mbarrier bar */
static __device__ __forceinline__ void tensor_copy_2d(void *dst, const CUtensorMap *tm, int x, int y, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            smem_u32(dst)),
        "l"(tm), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

static __device__ __forceinline__ const uint8_t *lpiece_src(const lflow_w *L, uint32_t q) {
    const lpiece pc = lpiece_at(q);
    return L[pc.l].w[pc.m] + (int64_t)pc.p * PIECE_B;
}

__global__ void __launch_bounds__(N_WARPS * 32, 1) layer_flow_kernel(const lflow_w *L, int n_layer, lflow_bufs B,
                                                                     const CUtensorMap *tmaps) {
    extern __shared__ __align__(128) uint8_t l_sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned long long t_start = now_ns();
#if IW
    const in_smem in = in_smem_at(l_sm);
    if (threadIdx.x < IN_SL) mbar_init(in.bar + threadIdx.x, 1);
    if (threadIdx.x < NC) in.prog[threadIdx.x] = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    __syncthreads();
    if (warp == NC + NE) {
        if (!STREAM && !NOIW) input_warp(n_layer, B, in, lane);
        return;
    }
#endif
    if (warp >= NC) {
        if (!STREAM && !NOEPI) epilogue_warp(L, n_layer, B, (warp - NC) * gridDim.x + blockIdx.x, gridDim.x * NE, lane);
        return;
    }
    dyn_ring rg;
    dyn_ring_init(rg, l_sm, warp, lane, B.next);
    const uint32_t total = (uint32_t)n_layer * NP_LAYER;
    auto src = [&](uint32_t q) { return lpiece_src(L, q); };
    unsigned long long t_wait[N_W] = {0, 0, 0, 0};
    int xkey = -1;
    int4 xa = {}, xb = {};
    float2 ds = {};
    for (;;) {
        uint32_t ni = 0;
#if PIECE_TMA /* tmaps[(l * N_W + m) * 2]: codes, + 1: scales */
        auto issue = [&](uint32_t q, uint8_t *dst, uint32_t bar) {
            const lpiece pc = lpiece_at(q);
            const int y = perm_src(w_perm(pc.m), pc.r0, w_nout(pc.m), KV_DIM);
            const CUtensorMap *tm = tmaps + (pc.l * N_W + pc.m) * 2;
            tensor_copy_2d(dst, tm, pc.k * 128, y, bar);
            tensor_copy_2d(dst + PIECE_CB, tm + 1, pc.k * 16, y, bar);
        };
        if (lane == 0) dyn_fill_with(rg, B.next, total, issue), ni = rg.n_issued;
#else
        if (lane == 0) dyn_fill(rg, B.next, total, src), ni = rg.n_issued;
#endif
        ni = __shfl_sync(FULL_MASK, ni, 0);
        if (rg.n_used == ni) break;
        __syncwarp();
        const int st = rg.n_used % NS;
        const uint32_t q = rg.tag[st];
#if IW
        if (lane == 0) in.prog[warp] = q;
#endif
        const lpiece pc = lpiece_at(q);
        const int l = pc.l, m = pc.m, k = pc.k, r0 = pc.r0;
        const int key = (l * N_W + m) * 32 + k;
#if IW
        if (key != xkey) { /* the lane's input group of slice k, from the block's copy */
            if (!STREAM && !NOWAIT) {
                const int slot = in_off(m) / 1024;
                const unsigned long long t0 = now_ns();
                mbar_wait(in.bar + slot + k, l & 1);
                const unsigned long long tw = now_ns() - t0;
#pragma unroll
                for (int i = 0; i < N_W; i++) t_wait[i] += i == m ? tw : 0;
            }
            const int8_t *g8 = in.q8 + in_off(m) + (k * 32 + lane) * 32;
            xa = *(const int4 *)g8, xb = *(const int4 *)(g8 + 16), ds = in.d8[in_off(m) / 32 + k * 32 + lane];
            xkey = key;
        }
#else
        if (key != xkey) { /* the lane's input group of slice k */
            if (!STREAM) {
                unsigned long long tw = 0;
                wait_slice(B.rdy[m] + k, 32u * (l + 1), lane, tw);
#pragma unroll
                for (int i = 0; i < N_W; i++) t_wait[i] += i == m ? tw : 0; /* no local array indexing */
            }
            load_group(B.q8[m][l & 1], B.d8[m][l & 1], k * 32 + lane, xa, xb, ds);
            xkey = key;
        }
#endif
#if TRACE
        if (lane == 0) {
            tr_mark(q, 1);
            const int tl = l - TR_L0;
            if (tl >= 0 && tl < TR_NL) g_trw[(size_t)tl * NP_LAYER + q % NP_LAYER] = blockIdx.x * NC + warp;
        }
#endif
        mbar_wait(rg.bar + st, (rg.n_used / NS) & 1);
#if TRACE
        if (lane == 0) tr_mark(q, 2);
#endif
        float acc[RPP];
        piece_dot(rg.buf + st * PIECE_B, rg.buf + st * PIECE_B + PIECE_CB, xa, xb, ds, lane, acc);
        __syncwarp(); /* every lane has read the stage before it is refilled */
        rg.n_used++;
        store_tagged(acc, B.tp[m] + (int64_t)k * w_nout(m) + r0, (unsigned)(l + 1), lane);
#if TRACE
        if (lane == 0) tr_mark(q, 3);
#endif
    }
#if IW
    if (lane == 0) in.prog[warp] = ~0u;
#endif
    if (lane == 0) {
        for (int i = 0; i < N_W; i++) atomicAdd(B.tw + i, t_wait[i]);
        atomicAdd(B.tw + N_W, now_ns() - t_start);
    }
}

/* A's v into o's input: o's input group g (head g / 4, part g % 4) is v's group (g / 4 / 8) * 4 +
 * g % 4, quantised as the engine quantises. A warp a group. */
__global__ void expand_v_q8(int8_t *xq, float2 *xds, const float *v) {
    const int g = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (g >= Q_DIM / 32) return;
    const int h = g / 4, part = g % 4;
    warp_q8(v[(h / (N_HEAD / N_KV)) * HEAD_DIM + part * 32 + lane], xq, xds, g * 32 + lane);
}

int main(int argc, char **argv) {
    const probe_setup ps0 = probe_start(argc, argv);
    const int n_layer = ps0.n_layer, n_sm = ps0.n_sm;
    std::vector<layer_w> h;
    size_t wbytes = make_layers(h, n_layer);
    std::vector<attn_w> ha(n_layer);
    for (int l = 0; l < n_layer; l++) { /* seeds apart from make_layers' (2 l + 1, 2 l + 2) */
        ha[l].qkv = make_mv(D_EMBD, QKV_ROWS, 0.002f, 0.004f, 1000003u + 2 * l, &wbytes);
        ha[l].o = make_mv(Q_DIM, D_EMBD, 0.001f, 0.002f, 1000004u + 2 * l, &wbytes);
        ha[l].norm = make_norm(2 * l + 1);
    }
    std::vector<lflow_w> hf(n_layer);
    for (int l = 0; l < n_layer; l++) {
        const mv *src[N_W] = {&ha[l].qkv, &ha[l].o, &h[l].gu, &h[l].down};
        for (int m = 0; m < N_W && !PIECE_TMA; m++) {
            uint8_t *d;
            CK(cudaMalloc(&d, (size_t)w_sl(m) * (w_nout(m) / RPP) * PIECE_B));
            repack_pieces<<<2048, 256>>>(d, *src[m], w_perm(m), KV_DIM, w_chunk(m), w_tail(m));
            CK(cudaGetLastError());
            hf[l].w[m] = d;
        }
        hf[l].attn_norm = ha[l].norm, hf[l].ffn_norm = h[l].norm;
    }
    /* PIECE_TMA: each weight's codes as uint32 [n_out][n_in / 8] in boxes of 128 x RPP, its scales
     * as uint32 [n_out][n_in / 64] in boxes of 16 x RPP */
    CUtensorMap *dtm = nullptr;
    if (PIECE_TMA) {
        PFN_cuTensorMapEncodeTiled_v12000 enc;
        cudaDriverEntryPointQueryResult qr;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&enc, 12000, cudaEnableDefault, &qr));
        std::vector<CUtensorMap> tm((size_t)n_layer * N_W * 2);
        for (int l = 0; l < n_layer; l++) {
            const mv *src[N_W] = {&ha[l].qkv, &ha[l].o, &h[l].gu, &h[l].down};
            for (int m = 0; m < N_W; m++)
                for (int part = 0; part < 2; part++) {
                    const mv &w = *src[m];
                    const cuuint64_t dims[2] = {(cuuint64_t)w.n_in / (part ? 64 : 8), (cuuint64_t)w.n_out};
                    const cuuint64_t strides[1] = {(cuuint64_t)w.n_in / (part ? 16 : 2)};
                    const cuuint32_t box[2] = {part ? 16u : 128u, (cuuint32_t)RPP}, es[2] = {1, 1};
                    const CUresult rc = enc(&tm[(l * N_W + m) * 2 + part], CU_TENSOR_MAP_DATA_TYPE_UINT32, 2,
                                            part ? (void *)w.s : (void *)w.q, dims, strides, box, es,
                                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                            (CUtensorMapL2promotion)TMA_L2P, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
                    if (rc != CUDA_SUCCESS) {
                        fprintf(stderr, "cuTensorMapEncodeTiled: error %d\n", (int)rc);
                        return 1;
                    }
                }
        }
        CK(cudaMalloc(&dtm, tm.size() * sizeof(CUtensorMap)));
        CK(cudaMemcpy(dtm, tm.data(), tm.size() * sizeof(CUtensorMap), cudaMemcpyHostToDevice));
    }
    lflow_w *dl;
    CK(cudaMalloc(&dl, sizeof(lflow_w) * n_layer));
    CK(cudaMemcpy(dl, hf.data(), sizeof(lflow_w) * n_layer, cudaMemcpyHostToDevice));

    const float *x0d = start_x_device();
    float *qkvb;
    CK(cudaMalloc(&qkvb, QKV_ROWS * 4));
    engine_ffn A;
    A.init(h, x0d, [&](int l, engine_ffn &e) {
        cuda_weight qkv = {WFMT_Q4_0, D_EMBD, QKV_ROWS, ha[l].qkv.q, ha[l].qkv.s};
        cuda_weight o = {WFMT_Q4_0, Q_DIM, D_EMBD, ha[l].o.q, ha[l].o.s};
        rmsnorm_q8_cuda(NULL, e.xq, e.xds, e.x, ha[l].norm, D_EMBD, 1, EPS, NULL, e.st);
        matmul_q8_pf_cuda(qkvb, &qkv, e.xq, e.xds, 1, QKV_ROWS, 0, NULL, 0, e.st);
        expand_v_q8<<<Q_DIM / 32 / 8, 256, 0, e.st>>>(e.xq, (float2 *)e.xds, qkvb + Q_DIM + KV_DIM);
        matmul_q8_pf_cuda(e.x, &o, e.xq, e.xds, 1, D_EMBD, 1, NULL, 0, e.st);
    });
    cudaStream_t st = A.st;

    lflow_bufs B;
    const int in_len[N_W] = {D_EMBD, Q_DIM, D_EMBD, D_FF};
    for (int i = 0; i < 2; i++) {
        CK(cudaMalloc(&B.x[i], D_EMBD * 4));
        CK(cudaMalloc(&B.ssq_x[i], D_EMBD / 32 * 4));
        CK(cudaMalloc(&B.ssq_m[i], D_EMBD / 32 * 4));
        for (int m = 0; m < N_W; m++) {
            CK(cudaMalloc(&B.q8[m][i], in_len[m]));
            CK(cudaMalloc(&B.d8[m][i], in_len[m] / 32 * 8));
        }
    }
    CK(cudaMalloc(&B.xm, D_EMBD * 4));
    size_t n_cnt = 1, tp_bytes = 0;
    for (int m = 0; m < N_W; m++) n_cnt += w_sl(m), tp_bytes += (size_t)w_sl(m) * w_nout(m) * 8;
    unsigned *cnt;
    unsigned long long *tp;
    CK(cudaMalloc(&cnt, n_cnt * 4));
    CK(cudaMalloc(&tp, tp_bytes));
    for (int m = 0, oc = 0; m < N_W; oc += w_sl(m), m++) B.rdy[m] = cnt + oc;
    B.next = cnt + n_cnt - 1;
    for (int m = 0; m < N_W; m++) B.tp[m] = m ? B.tp[m - 1] + (size_t)w_sl(m - 1) * w_nout(m - 1) : tp;
    CK(cudaMalloc(&B.tw, (N_W + 1) * 8));
    CK(cudaMemset(B.tw, 0, (N_W + 1) * 8));

    CK(cudaFuncSetAttribute(layer_flow_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L_SMEM));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, layer_flow_kernel, N_WARPS * 32, L_SMEM));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, layer_flow_kernel));
    printf("SMs %d; %d consumer warps of %d stages of %d B (%d rows a piece), %d epilogue warps, %d B dynamic shared, "
           "blocks an SM %d, %d registers, %zu B local%s\n",
           n_sm, NC, NS, PIECE_B, RPP, NE, (int)L_SMEM, per_sm, fa.numRegs, fa.localSizeBytes,
           STREAM ? "; STREAM: no waits, no epilogues (wrong results)" : "");
    if (!ps0.coop || per_sm < 1) return 1;
    int nl = n_layer;
    void *args[] = {&dl, &nl, &B, &dtm};
    auto run_flow = [&]() {
        CK(cudaMemcpyAsync(B.x[0], x0d, D_EMBD * 4, cudaMemcpyDeviceToDevice, st));
        CK(cudaMemsetAsync(cnt, 0, n_cnt * 4, st));
        CK(cudaMemsetAsync(tp, 0, tp_bytes, st));
        CK(cudaLaunchCooperativeKernel((void *)layer_flow_kernel, dim3(n_sm), dim3(N_WARPS * 32), args, L_SMEM, st));
    };
#if TRACE /* the buffers every run writes (the last run's stamps are kept) */
    const size_t np = (size_t)TR_NL * NP_LAYER, ng = (size_t)TR_NL * NG_LAYER;
    unsigned long long *dtr, *dtrg;
    unsigned *dtrw;
    CK(cudaMalloc(&dtr, np * 32));
    CK(cudaMalloc(&dtrg, ng * 16));
    CK(cudaMalloc(&dtrw, np * 4));
    CK(cudaMemset(dtr, 0, np * 32));
    CK(cudaMemset(dtrg, 0, ng * 16));
    CK(cudaMemcpyToSymbol(g_tr, &dtr, sizeof dtr));
    CK(cudaMemcpyToSymbol(g_trg, &dtrg, sizeof dtrg));
    CK(cudaMemcpyToSymbol(g_trw, &dtrw, sizeof dtrw));
#endif
    printf("%d layers, %.2f GB of weights\n", n_layer, wbytes / 1e9);
    A.run();
    run_flow();
    CK(cudaStreamSynchronize(st));
    std::vector<float> ra(D_EMBD), rf(D_EMBD);
    CK(cudaMemcpy(ra.data(), A.x, D_EMBD * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(rf.data(), B.x[n_layer & 1], D_EMBD * 4, cudaMemcpyDeviceToHost));
    report_diff("flow against A", ra, rf);
    for (int rep = 0; rep < 3; rep++) {
        time_best("A launches", [&]() { A.run(); }, st, n_layer, wbytes);
        time_best("layer flow", run_flow, st, n_layer, wbytes);
    }
    CK(cudaMemsetAsync(B.tw, 0, (N_W + 1) * 8, st));
    run_flow();
    CK(cudaStreamSynchronize(st));
    unsigned long long tw[N_W + 1];
    CK(cudaMemcpy(tw, B.tw, sizeof tw, cudaMemcpyDeviceToHost));
    const double per = 1e3 * n_sm * NC * n_layer; /* ns over consumer warps -> us a warp and layer */
    printf("an average consumer warp, us a layer: waiting for q|k|v's input %.2f, o's %.2f, gate|up's %.2f, "
           "down's %.2f; the whole run %.2f\n",
           tw[0] / per, tw[1] / per, tw[2] / per, tw[3] / per, tw[4] / per);
#if TRACE
    if (n_layer >= TR_L0 + TR_NL && getenv("TRACE_FILE")) {
        std::vector<unsigned long long> tr(np * 4), trg(ng * 2);
        std::vector<unsigned> trw(np);
        run_flow();
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(tr.data(), dtr, np * 32, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(trg.data(), dtrg, ng * 16, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(trw.data(), dtrw, np * 4, cudaMemcpyDeviceToHost));
        FILE *f = fopen(getenv("TRACE_FILE"), "wb");
        const int hdr[24] = {NP_LAYER, TR_NL, NG_LAYER, NP_QKV, NP_O, NP_GU, NP_DN, NC, n_sm, RPP, TR_L0, PIECE_B, KVG,
                             QCHUNK, QTAIL, OCHUNK, OTAIL, GCHUNK, GTAIL, DCHUNK, DTAIL, NS, NE, 0};
        if (!f || fwrite(hdr, sizeof hdr, 1, f) != 1 || fwrite(tr.data(), 32, np, f) != np ||
            fwrite(trw.data(), 4, np, f) != np || fwrite(trg.data(), 16, ng, f) != ng || fclose(f)) {
            fprintf(stderr, "cannot write %s\n", getenv("TRACE_FILE"));
            return 1;
        }
        printf("trace of layers %d..%d in %s\n", TR_L0, TR_L0 + TR_NL - 1, getenv("TRACE_FILE"));
    }
#endif
    return 0;
}
