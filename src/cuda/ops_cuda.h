/* ops_cuda.h - the CUDA twins of ops_cpu.h, plus the device weight layout.
 *
 * Every op takes device pointers, outputs first, then inputs, then sizes, then the stream, as its
 * CPU twin (rmsnorm_cpu / rmsnorm_cuda / rmsnorm_kernel). Float32 activations throughout; weights
 * in a device format (enum cuda_wfmt) repacked at load from the GGUF/HF types (repack.cu).
 * Callable from C (tests) and C++ (forward.cu). Launch errors are programmer errors: the launchers
 * do not check, the caller checks cudaGetLastError / the stream once per step.
 */
#ifndef PXQ_OPS_CUDA_H
#define PXQ_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "tensor.h"
#include "cuda/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_weight {
    int fmt;            /* enum cuda_wfmt (cuda/backend.h) */
    int n_in, n_out;    /* ne[0], ne[1] */
    const void *q;      /* device */
    const void *s;      /* device, NULL for dense formats */
};

/* Repack rows [r0, r1) of host tensor t into host buffers hq, hs laid out as the device format for
 * those rows alone (row r0 at offset 0). Returns 0, or -1 for an unsupported type. */
int  cuda_weight_repack(const struct pxq_tensor *t, int64_t r0, int64_t r1, void *hq, void *hs);

/* Programmatic dependent launch (cuda/launch.cuh): when cuda_pdl is set, the ops' kernels launch so
 * that each may start while the one before it in the stream finishes (sm_90+). The backend sets it
 * around its decode steps when cuda_pdl_supported(); tests may set it. Per thread (an engine's
 * steps run on the thread that calls it). cuda_pdl_supported: 1 if the device is sm_90+ and this
 * build's kernels are an sm_90+ image (their PDL waits compiled in). */
#ifdef __cplusplus
extern thread_local int cuda_pdl;
#else
extern _Thread_local int cuda_pdl;
#endif
int  cuda_pdl_supported(void);

/* ---- ops (device pointers) ---- */

/* y[t][o] (+)= sum_i W[o][i] x[t][i], t < n_tokens, fp32 accumulation; y has row stride ldy and
 * is added to when accumulate != 0 (the residual add fused). Fused dequant mat-vec reading each
 * weight once for up to 16 tokens per pass (loops over chunks of 16 beyond that). Formula: matmul_cpu. */
void matmul_gemv_cuda(float *y, const struct cuda_weight *w, const float *x, int n_tokens, int ldy, int accumulate,
                      cudaStream_t st);
/* Benchmarks and tests: matmul_gemv_cuda's rows a block. 1 (the default): one where blocks of 4 (8
 * from 5 tokens) would leave SMs without a block, else 4 (8); 0: always 4 (8); 2: always one. The
 * same bits at every setting. Process-wide. */
void matmul_gemv_tune(int fill);

/* The same with int8 activations (llama.cpp q8_1): xq [n_tokens][n_in] int8 and xds
 * [n_tokens][n_in/32][2] (d, d * sum q) from quantize_q8_cuda / rmsnorm_q8_cuda / swiglu_q8_cuda;
 * integer dot products (__dp4a). Formats Q4_0, Q8_0, Q4M (matmul_q8_supported). */
int  matmul_q8_supported(int fmt);
void matmul_q8_cuda(float *y, const struct cuda_weight *w, const int8_t *xq, const float *xds, int n_tokens, int ldy,
                    int accumulate, cudaStream_t st);
/* A weight to pull into the L2 cache while a mat-vec finishes: up to two spans of device memory (a
 * weight's codes and scales), asked for by the last n_blocks blocks of the mat-vec's grid once their
 * own loads are issued (0: none). sm_90+ (bulk prefetch); ignored below. */
struct cuda_l2_prefetch {
    const void *p[2];
    uint64_t bytes[2];
    int n_blocks;
};
/* Share k of n (0 <= k < n) of the span [p, p + bytes) rounded inward to 16 bytes: *lo and *len
 * (16-byte aligned, len a multiple of 16; len 0: nothing for this k). The n shares tile the rounded
 * span in order, without overlap. The device side (l2_prefetch_share, common.cuh) issues each share
 * as bulk prefetches; the tests check the tiling on the host. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline void cuda_l2_share(uint64_t p, uint64_t bytes, int k, int n, uint64_t *lo, uint64_t *len) {
    const uint64_t a = (p + 15) & ~(uint64_t)15, b = (p + bytes) & ~(uint64_t)15;
    *lo = a, *len = 0;
    if (!p || n <= 0 || k < 0 || k >= n || b <= a) return;
    const uint64_t chunk = ((b - a + (uint64_t)n - 1) / (uint64_t)n + 15) & ~(uint64_t)15;
    const uint64_t s = a + (uint64_t)k * chunk;
    if (s >= b) return;
    *lo = s, *len = b - s < chunk ? b - s : chunk;
}
/* matmul_q8_pf_cuda's flags, for the one-to-four-token dp4a kernel (the kernel that serves batch-1
 * decode); results are the same bits with any of them.
 * MATMUL_Q8_LAUNCH_NEXT: the kernel lets the next one in the stream launch at its start
 *   (pdl_launch_dependents, common.cuh) instead of at its exit, so the next kernel's part before its
 *   pdl_wait may run during this kernel and the one before it; results are unchanged as long as that
 *   part keeps common.cuh's rule (matmul.cu).
 * MATMUL_Q8_STAGE: one token: each block copies its rows' whole codes and scales into shared memory
 *   before its pdl_wait, so the weight streams in while the kernels before it run
 *   (matmul_q8_staged_kernel; where matmul_q8_stage_supported, n_in is a multiple of 256 and the
 *   block's slice and its reduction fit the default 48 KiB; else the usual kernel). It pays only
 *   under programmatic dependent launch (without it the copies overlap nothing).
 * MATMUL_Q8_AHEAD2: one or two tokens: each lane keeps two steps of weights in flight, not one, and
 *   loads both before its pdl_wait (matmul_q8_kernel<.., PF = 2>; taken by one-warp blocks only. Q4_0,
 *   one token: 62 registers a thread at two rows against 48, where the 32-blocks-an-SM limit still
 *   binds first; 96 at four against 70, which allows 21 blocks an SM instead of 28: Qwen3-32B's
 *   2560 q|k|v blocks still fit one wave on 132 SMs; blocks of several warps would not).
 *   H200, b1, alternated in one call: Qwen3-32B with it on the q|k|v projection (2560 blocks of
 *   four rows, after the rmsnorm) 169.22 t/s (169.39 with gate|up and lm_head too) against 166.56,
 *   167.11; on gate|up, lm_head or the DeltaNet in-projection alone no gain (Qwen3.5-27B
 *   189.2-190.3 against 189.6-190.0); on every one-warp mat-vec 27B lost 1% (188.2 against 190.1);
 *   on the two-warp o / down kernels too both lost 4-6% (their 2560 blocks no longer fit one wave). */
#define MATMUL_Q8_LAUNCH_NEXT 1
#define MATMUL_Q8_STAGE 2
#define MATMUL_Q8_AHEAD2 4
/* matmul_q8_cuda that also prefetches pf (NULL: none) for the mat-vec after it, where the one-to-
 * four-token dp4a kernel runs; flags: MATMUL_Q8_* above, or 0. */
void matmul_q8_pf_cuda(float *y, const struct cuda_weight *w, const int8_t *xq, const float *xds, int n_tokens,
                       int ldy, int accumulate, const struct cuda_l2_prefetch *pf, int flags, cudaStream_t st);
/* Benchmarks and tests only: force the one-to-four-token dp4a mat-vec's rows per block (1, 2, 4, 8;
 * Q8_0 runs 4 for 8, registers) and warps per block (1..8) instead of the built-in choice; 0
 * restores it. Process-wide. */
void matmul_q8_tune(int rows, int warps);
/* 1 if MATMUL_Q8_STAGE can take effect on this device: an sm_80+ device and image (cp.async).
 * Cached; call it once outside graph capture first. */
int matmul_q8_stage_supported(void);
/* x[n] (n a multiple of 32) -> xq, xds: per group of 32, d = max|x|/127, q = round(x/d). */
void quantize_q8_cuda(int8_t *xq, float *xds, const float *x, int64_t n, cudaStream_t st);

/* matmul_q8_cuda on int8 tensor cores (matmul_mma.cu): the same arguments, formula and result up to
 * fp32 summation order; one mma.sync.m16n8k32 per group of 32 (16 rows x 8 tokens), weights read
 * once for up to 16 tokens per pass (chunks of 16 beyond). Shapes: y row stride ldy >= n_out, xq
 * [n_tokens][n_in], xds [n_tokens][n_in/32] float2. Takes the dp4a kernel where it cannot run:
 * matmul_q8_mma_supported(fmt) == 0 (not Q4_0/Q8_0/Q4M, device below sm_80, no sm_80+ image in
 * this build), n_in % 128 != 0, or a pointer not 16-byte aligned. No errors returned (launch
 * errors as for every op). matmul_q8_mma_supported reads the device properties once per device. */
int  matmul_q8_mma_supported(int fmt);
void matmul_q8_mma_cuda(float *y, const struct cuda_weight *w, const int8_t *xq, const float *xds, int n_tokens,
                        int ldy, int accumulate, cudaStream_t st);
/* Benchmarks and tests only: force m-tiles of 16 rows per warp (1, 2, 4) and warps per block
 * (1..8) instead of the shape heuristic; 0 restores it. Process-wide. */
void matmul_q8_mma_tune(int mr, int kp);

/* Dequantize rows (row index list `rows`, or rows r0.. if rows is NULL) into out[n_rows][n_in]
 * float32 or half (out_half != 0). Embedding lookup (tensor_row_f32) and prefill tiles. */
void dequant_rows_cuda(void *out, int out_half, const struct cuda_weight *w, const int32_t *rows, int64_t r0,
                       int n_rows, cudaStream_t st);

/* Tests only: generic != 0 sends the f16 tiles of Q4_0, Q8_0 and Q4M rows through the generic
 * dequantization kernel instead of their own (the same values); 0 restores their own. Process-wide. */
void dequant_tile_f16_tune(int generic);

/* x[n] float32 -> half (prefill GEMM operands). */
void f32_to_f16_cuda(void *out, const float *x, int64_t n, cudaStream_t st);

/* rmsnorm_cpu: out[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * w[i]. If rows != NULL, input row
 * rows[r] is read for output row r (gathering the rows that asked for logits). out may alias x. */
void rmsnorm_cuda(float *out, const float *x, const float *w, int n, int n_rows, float eps, const int32_t *rows,
                  cudaStream_t st);

/* rmsnorm_cuda writing out (if not NULL) and the q8 form of its output (xq, xds; n % 32 == 0). */
void rmsnorm_q8_cuda(float *out, int8_t *xq, float *xds, const float *x, const float *w, int n, int n_rows, float eps,
                     const int32_t *rows, cudaStream_t st);

/* rmsnorm_cuda writing out (if not NULL) and its half form x16 [n_rows][n] (round to nearest):
 * the prefill GEMM's operand without a separate f32 -> f16 pass. */
void rmsnorm_f16_cuda(float *out, void *x16, const float *x, const float *w, int n, int n_rows, float eps,
                      cudaStream_t st);

/* rope_cpu on x[n_tokens][n_heads][head_dim] (token row stride ld), position pos[t] (device). */
void rope_cuda(float *x, int n_heads, int head_dim, int n_rot, const int32_t *pos, const float *inv_freq, int neox,
               int n_tokens, int ld, cudaStream_t st);

/* swiglu_cpu: out[i] = silu(gate[i]) * up[i]. */
void swiglu_cuda(float *out, const float *gate, const float *up, int64_t n, cudaStream_t st);
/* swiglu_cuda writing out (if not NULL) and its q8 form (n % 32 == 0). */
/* Gate and up rows of n_tokens x ff with row stride ld (ff for separate buffers; 2 ff for the two
 * halves of a stacked gate|up matmul output, up = gate + ff); out [n_tokens][ff]. */
void swiglu_q8_cuda(float *out, int8_t *xq, float *xds, const float *gate, const float *up, int n_tokens, int ff, int ld,
                    cudaStream_t st);

/* swiglu_q8_cuda's values written only as half, x16 [n_tokens][ff] (the prefill down GEMM's operand). */
void swiglu_f16_cuda(void *x16, const float *gate, const float *up, int n_tokens, int ff, int ld, cudaStream_t st);

/* y[r][i] += b[i] for n_rows rows of n (biases), and x[i] += y[i] (residual). */
void add_bias_cuda(float *y, const float *b, int n_rows, int n, cudaStream_t st);
void add_residual_cuda(float *x, const float *y, int64_t n, cudaStream_t st);

/* Paged KV on the device: the view the kernels take of the engine's struct kv_layout (kvcache.h),
 * built from it by cuda_kv_from_layout: every head of every layer in one element type, half
 * (kv_f32 = 0) or float, which with that layout's offsets is
 *   k[((b * n_layer_kv + l) * block_size + slot) * kv_dim + h * head_dim + d].
 * attn_scale is the layout's softmax scale. block_tab[seq * max_blocks + j] is the j-th block of
 * sequence seq. */
struct cuda_kv {
    void *k, *v;
    int kv_f32;
    int n_layer_kv, block_size, n_head_kv, head_dim, kv_dim;
    float attn_scale;
    const int32_t *block_tab;   /* [n_seq_max][max_blocks] (device) */
    int max_blocks;
    /* quantized caches (--kv-cache-type q8_0 / pxq): the pools hold each head's rows in its type as
     * the layout's descriptors say; positions a query sees exactly (kv_exact) come from the float32
     * residual, per sequence [n_layer_kv][n_sink + n_ring][kv_dim] */
    int quantized;
    const struct kv_layer_desc *desc; /* device [2][n_layer_kv]: K's layers, then V's */
    size_t block_bytes_k, block_bytes_v;
    float *res_k, *res_v;             /* [n_seq_max][n_layer_kv][n_sink + n_ring][kv_dim] (device) */
    const int32_t *res_seq;           /* the residual's sequence slot of a step's compact sequence index (the
                                       * kernels' seq_id; the step inputs' run_seq), or NULL: the same */
    int n_sink, n_window, n_ring;
    int attn_window, attn_sinks;      /* window + sink attention (kv_visible; 0: every position) */
    /* block selection (Quest; kvcache.h topk_blocks, 0: off): per block, layer and key channel the min
     * and max of the keys written there [n_blocks][n_layer_kv][kv_dim], and per step token and KV
     * head the bitmap of the sequence's blocks it sees in the middle [n_batch][n_head_kv][sel_words]
     * (device; kv_bounds_cuda and kv_select_cuda write them) */
    int topk_blocks, sel_words;
    float *kmin, *kmax;
    uint32_t *sel;
    /* and for a decode step (at most mid_tokens tokens), per token and KV head the chosen middle
     * blocks wholly inside the middle, ascending: [mid_tokens][n_head_kv][1 + mid_cap], the count
     * first (kv_select_cuda writes it; the tensor-core decode kernels walk it: attention_sparse.cuh).
     * NULL: not kept (the generic kernel reads the bitmaps only) */
    int32_t *mid;
    int mid_cap, mid_tokens;
    /* a decode step's scores [mid_tokens][n_head_kv][max_blocks] (kv_select.cu's kv_score_kernel
     * spreads them over about score_blocks thread blocks: a step of one token has n_head_kv (token,
     * head) pairs), or NULL: each pair's block scores its own */
    float *score;
    int score_blocks;
    /* the selection cache (--kv-select-cache; sc_slots 0: none, kv_selcache.cu): the device-tier pool
     * blocks [0, sc_slots) hold, for each (layer, KV head), the slices of host-tier blocks (pool ids
     * >= n_dev) that decode steps chose, so a block chosen again is read from the device. sc_pool:
     * [mid_tokens][n_head_kv][1 + mid_cap], the pool id each listed block of kv.mid is read from
     * (its own, or its slot); sc_gen [n_blocks]: bumped when a host block's bytes change (kv_bounds_cuda,
     * cuda_kv_move), so a slot filled before is stale; the slots' holders, their gen and their last
     * step, and the step count, per (layer, KV head): sc_pid, sc_pgen, sc_stamp [n_layer_kv][n_head_kv][sc_slots],
     * sc_now [n_layer_kv][n_head_kv]; a layer's fills, per KV head (the count, then (source, slot)
     * pairs): sc_copy [n_head_kv][1 + 2 mid_tokens mid_cap]; sc_stats: hits, fills, read in place */
    int sc_slots, n_dev;
    int32_t *sc_pool, *sc_pid, *sc_pgen, *sc_stamp, *sc_now, *sc_copy;
    uint32_t *sc_gen;
    unsigned long long *sc_stats;
};

/* The view of lay (k, v, block_tab, max_blocks, desc and the residual left 0 for the caller).
 * Returns 0, or -1 if lay has a type the CUDA kernels do not read: f16 everywhere, f32 everywhere,
 * or quantized (K q8_0, V q8_0 or q2nu per head). */
struct kv_layout;
int cuda_kv_from_layout(struct cuda_kv *kv, const struct kv_layout *lay);

/* Quantized caches: store k[t], v[t] (row t at k + t * ld, v + t * ld; all heads, after norm and
 * RoPE) at (seq_id[t], pos[t]) of layer l: each head's row quantized per group of 32 into its type
 * (kv_quantize_row's arithmetic: the same codes and f16 scales), and the float row into the
 * residual when the position has a slot there (kv_store). */
void kv_store_q_cuda(const struct cuda_kv *kv, int l, const float *k, const float *v, int ld, const int32_t *pos,
                     const int32_t *seq_id, int n_tokens, cudaStream_t st);

/* Block selection (Quest, Tang et al. 2024; kv->topk_blocks, else no-ops; kv_select.cu).
 * kv_bounds_cuda: after the step's keys k[t] (row t at k + t * ld, all heads, after RoPE) are stored
 * in layer l, fold them into their blocks' per-channel min and max (a block's first slot starts
 * them afresh: kv_store's rule). kv_select_cuda: for each token t and KV head, the bitmap of the
 * blocks of the middle (between the sinks and the window) it also attends to: the topk_blocks
 * largest by the upper bound max over the group's query heads of sum_d max(q_d min_d, q_d max_d)
 * (q [n_tokens][n_head * head_dim], after RoPE), ties to the earlier block; the attention kernels
 * read it. With kv->mid and n_tokens <= kv->mid_tokens it also lists the chosen blocks wholly
 * inside the middle (kv->mid's layout) for the tensor-core decode kernels, and with kv->score it
 * scores such a step in a launch of its own over about kv->score_blocks blocks first. kv_select_prepare: the
 * shared memory opt-in for max_blocks scores (once, outside graph capture); 0, or -1 if the device
 * has too little. */
void kv_bounds_cuda(const struct cuda_kv *kv, int l, const float *k, int ld, const int32_t *pos,
                    const int32_t *seq_id, int n_tokens, cudaStream_t st);
void kv_select_cuda(const struct cuda_kv *kv, int l, const float *q, const int32_t *pos, const int32_t *seq_id,
                    int n_tokens, int n_head, cudaStream_t st);
int kv_select_prepare(int max_blocks);
/* The selection cache (kv->sc_slots, else a no-op; kv_selcache.cu), for a decode step of n_tokens
 * <= kv->mid_tokens after its kv_select_cuda of layer l: for each token and KV head, each listed
 * middle block in the host tier is looked up among the (layer, head)'s slots (4-way sets by pool
 * id, a slot valid while the block's sc_gen is the one it was filled at); a miss takes the least
 * recently used way of its set that no token of the step uses, and its layer-l head slice (K and V)
 * is copied there from the host in a second launch (none free: read in place). Writes kv->sc_pool,
 * which the tensor-core decode kernels read (attention_sparse.cuh). The bytes read are the same
 * bytes: the logits do not change. */
void kv_selcache_cuda(const struct cuda_kv *kv, int l, const int32_t *seq_id, int n_tokens, cudaStream_t st);
#define KV_SC_WAYS 4
#define KV_SC_MAX 1024 /* --kv-select-cache's most slots (the lookup's shared memory) */

/* Write k[t], v[t] ([n_tokens][kv_dim]) at (seq_id[t], pos[t]) of layer l. */
void kv_store_cuda(const struct cuda_kv *kv, int l, const float *k, const float *v, const int32_t *pos,
                   const int32_t *seq_id, int n_tokens, cudaStream_t st);

/* For each token t: q heads and k heads get their q/k norm (q_norm, k_norm [head_dim], NULL to skip),
 * then RoPE at pos[t]; k[t] and v[t] are then stored at (seq_id[t], pos[t]) of layer l. The fused
 * form of rmsnorm_cuda + rope_cuda (q and k) + kv_store_cuda, same order (forward_cpu's
 * attention_layer). Token t's q heads are read at q + t * ld_q, its k and v heads at k + t * ld_kv and
 * v + t * ld_kv (ld: n_head * head_dim and n_head_kv * head_dim for separate buffers, the stacked
 * row length for one q|k|v matmul output); q is written to q_out [n_tokens][n_head][head_dim] (may be
 * q itself when ld_q = n_head * head_dim), k back in place. */
void qk_norm_rope_store_cuda(float *q_out, const float *q, float *k, const float *v, int ld_q, int ld_kv,
                             const float *q_norm, const float *k_norm, float eps, int n_head, int n_rot,
                             const int32_t *pos, const float *inv_freq, int neox, const struct cuda_kv *kv, int l,
                             const int32_t *seq_id, int n_tokens, cudaStream_t st);

/* Causal attention of q[t] ([n_tokens][n_head*head_dim]) over positions 0..pos[t] of its sequence
 * in layer l: out[t][h] = softmax(q k^T / sqrt(head_dim)) v (the CPU forward's attn_range). Split-K
 * flash-decoding (Dao et al. 2023): n_split chunks of split_len positions are reduced online
 * (Milakov & Gimelshein 2018) into part_o [n_tokens][n_head][n_split][head_dim] and part_ml
 * [..][n_split][2], then combined (one split: the kernel writes out directly). n_split * split_len
 * must cover the longest pos[t] + 1.
 * head_dim a multiple of 32, at most 256; n_head / n_head_kv at most 32. */
void attention_cuda(float *out, const float *q, const struct cuda_kv *kv, int l, const int32_t *pos,
                    const int32_t *seq_id, int n_tokens, int n_head, int n_split, int split_len, float *part_o,
                    float *part_ml, cudaStream_t st);

/* Shared memory bytes attention_cuda needs per block, and the one-time opt-in above 48 KiB (call
 * before the first attention_cuda and outside graph capture; -1 if the device has too little). */
size_t attention_smem_bytes(int head_dim, int group);
int attention_cuda_prepare(int head_dim, int group);

/* out[t][h] = sum_s part_o[t][h][s] e^(m_s - M) / sum_s l_s e^(m_s - M) over the splits s with
 * l_s > 0 (part_ml[..][s] = (m_s, l_s), M their max): the last step of split-K flash-decoding.
 * xq != NULL: also out's q8 form (xq, xds as quantize_q8_cuda over the whole out), so the o
 * projection's int8 mat-vec needs no quantize launch. head_dim a multiple of 32 (a warp's lanes are
 * 32 dimensions of one row of threads). */
void attention_combine_cuda(float *out, int8_t *xq, float *xds, const float *part_o, const float *part_ml,
                            int n_tokens, int n_head, int head_dim, int n_split, cudaStream_t st);

/* ---- decode attention on the tensor cores (attention_decode.cu) ---- */

/* 1 if attention_decode_cuda runs these shapes on this device: f16 KV (attention_decode.cu) or a
 * quantized one (kv->quantized: attention_decode_q.cu, the codes dequantized in registers),
 * head_dim 64/128/256, n_head / n_head_kv <= 16, sm_80+ with enough opt-in shared memory for one of
 * its configurations (the opt-in is set here, once: call outside graph capture before the first
 * launch). Under window + sink attention or block selection (kv->attn_window) the block size must
 * be a multiple of the kernel's tile (16 positions, or the f16 configuration's); the splits then
 * cut the visible blocks (attention_sparse.cuh: attention_sparse_len bounds them). */
int attention_decode_supported(const struct cuda_kv *kv, int n_head);
/* The blocks per SM of attention_decode_cuda's kernel for this cache that run at once, for the
 * splits' wave (cuda_decode_splits): the quantized cache's kernel 2 or 3; 0 where not supported. */
int attention_decode_q_blocks(const struct cuda_kv *kv, int n_head);
/* The (virtual) positions attention_decode_cuda's splits must cover for queries up to n_kv
 * positions: n_kv without window attention; else the visible blocks' bound (attention_sparse.cuh)
 * in positions, min(ceil(n_kv / bs), ceil(sinks / bs) + topk_blocks + (window - 1) / bs + 2) x bs. */
static inline int attention_sparse_len(const struct cuda_kv *kv, int n_kv) {
    if (!kv->attn_window) return n_kv;
    const int bs = kv->block_size, all = (n_kv + bs - 1) / bs;
    const int most = (kv->attn_sinks + bs - 1) / bs + kv->topk_blocks + (kv->attn_window - 1) / bs + 2;
    return (all < most ? all : most) * bs;
}
/* Benchmarks only (PXQ_CUDA_DECODE_CFG, tuning.h): the k-th (tile, stages) configuration of
 * head_dim's list instead of the first that fits; set before the first decode attention. -1: the
 * first that fits. Process-wide. */
void attention_decode_force_cfg(int k);
/* attention_cuda's semantics and arguments (split-K over n_split chunks of split_len positions, the
 * same part_o / part_ml layout and combine), on the tensor cores: f16 q and P, fp32 accumulation
 * (error about 1e-3 of the output's norm). Only where attention_decode_supported. split_len: a
 * multiple of 64 (whole tiles of every configuration). xq != NULL: also out's q8 form, as
 * attention_combine_cuda. Under programmatic dependent launch the kernel copies the K/V of positions
 * below pos[t] - n_tokens + 1 before waiting for the kernel before it, so no kernel of the step may
 * write those: a step's tokens of one sequence must be consecutive positions (pxq_decode checks
 * this), and only this step's positions are stored. */
void attention_decode_cuda(float *out, int8_t *xq, float *xds, const float *q, const struct cuda_kv *kv, int l,
                           const int32_t *pos, const int32_t *seq_id, int n_tokens, int n_head, int n_split,
                           int split_len, float *part_o, float *part_ml, cudaStream_t st);

/* ---- prefill attention: tensor-core flash attention (attention_prefill.cu) ---- */

/* Tokens per tile of attention_prefill_cuda, and (token, query head) rows per thread block: a tile's
 * rows of one KV head take ceil(tokens x group / rows) blocks. */
#define ATTENTION_PREFILL_TILE 64
#define ATTENTION_PREFILL_ROWS 64

/* The ubatch's tiles for attention_prefill_cuda: runs of consecutive tokens of one sequence with
 * consecutive positions, at most ATTENTION_PREFILL_TILE long. tiles_host [cap][2] receives
 * (first token index, token count) per tile; pos_host, seq_host [n_tokens] are the ubatch's
 * positions and sequence ids (the values given to the device). Returns n_tiles (at most n_tokens),
 * or -1 if more than cap tiles are needed. */
int attention_prefill_tiles(int32_t *tiles_host, int cap, const int32_t *pos_host, const int32_t *seq_host,
                            int n_tokens);

/* 1 if attention_prefill_cuda runs these shapes on this device: f16 or quantized KV (kv_f32 == 0;
 * a quantized cache's tiles are made f16 in shared memory, from the pool's rows or the exact
 * residual as each (query, position) pair needs: kv_exact), head_dim 64, 128 or 256, n_head a multiple of n_head_kv, an sm_80+ device with sm_80+ code in this build and
 * enough opt-in shared memory (attention_prefill_smem_bytes); 0 otherwise (keep attention_cuda). */
int attention_prefill_supported(const struct cuda_kv *kv, int n_head);

/* Shared memory bytes per block (0 for an unsupported head_dim), and the one-time opt-in above
 * 48 KiB: call once (backend creation, outside graph capture) before the first
 * attention_prefill_cuda; 0, or -1 if unsupported here. */
size_t attention_prefill_smem_bytes(int head_dim);
int attention_prefill_prepare(int head_dim);
/* Window + sink attention or block selection (kv->attn_window; attention_sparse.cuh's rule): the
 * opt-in for kv's launches (the bitmaps' union beside the stages under selection). Once, outside
 * graph capture, after attention_prefill_prepare; 0, or -1 where this device or kv's block size
 * (a power of two) does not allow it (keep attention_cuda). */
int attention_prefill_sparse_prepare(const struct cuda_kv *kv);

/* attention_cuda's semantics for prefill: out [n_tokens][n_head * head_dim] (fp32, or with out_half
 * f16: the same values rounded to nearest, the o projection's GEMM operand), for each
 * token t and query head h, softmax(q[t][h] K^T / sqrt(head_dim)) V over positions 0..pos[t] of
 * sequence seq_id[t] in layer l, K/V head h / (n_head / n_head_kv); q [n_tokens][n_head *
 * head_dim] fp32. The ubatch's own K/V must already be in the cache. tiles (device) [n_tiles][2]
 * from attention_prefill_tiles on the same pos / seq_id. FlashAttention-2 (Dao 2023): per (tile,
 * KV head), 64 (token, query head) rows per block share each K/V tile staged in shared memory; QK^T
 * and PV on mma.sync m16n8k16 with Q and P rounded to f16, fp32 accumulation, online softmax in
 * fp32. Only where attention_prefill_supported. */
void attention_prefill_cuda(void *out, int out_half, const float *q, const struct cuda_kv *kv, int l,
                            const int32_t *pos, const int32_t *seq_id, const int32_t *tiles, int n_tiles, int n_head,
                            cudaStream_t st);

/* ---- prefill attention over a host KV tier, staged (attention_staged.cu) ----
 *
 * Read in place, a host-tier block crosses the bus once for every thread block of the prefill
 * kernel that sees it: with Qwen3.5-27B's GQA group of 6, a 512-token chunk has 48 such blocks a KV
 * head. Staged, it crosses once a layer: the step's host blocks are copied (per layer, their slice
 * of it) into a device buffer slab after slab, and the prefill kernel runs one pass over the device
 * tier and the exact residual, then one pass per slab, each pass merging its softmax state (m, l,
 * O unnormalized; Milakov & Gimelshein 2018) with the passes before it. */

/* One pass of attention_prefill_cuda's kernel: the pool blocks whose entry g of tab ([n_seq]
 * [max_blocks], as kv->block_tab) has g_lo <= g < g_hi (filt; else every block), at positions [p_lo, p_hi) of compact
 * sequence seq (-1: any); exact: also the residual's exact rows (quantized caches). mode: PF_MERGE
 * merges with the state in acc ([n_tokens][n_head][head_dim], unnormalized O) and ml
 * ([n_tokens][n_head][2]: m in score units, l), PF_FINAL writes O / l to out, else the state goes
 * back to acc and ml. */
enum { PF_MERGE = 1, PF_FINAL = 2 };
struct pf_pass {
    const int32_t *tab;
    int filt, g_lo, g_hi, seq, p_lo, p_hi, exact, mode;
    float *acc, *ml;
};
void attention_prefill_pass(void *out, int out_half, const float *q, const struct cuda_kv *kv, int l,
                            const int32_t *pos, const int32_t *seq_id, const int32_t *tiles, int n_tiles, int n_head,
                            const struct pf_pass *pp, cudaStream_t st);

/* A step's host-tier blocks in slabs: slab i holds the host blocks numbered [g_lo, g_hi) in the step
 * (stab's numbering), of compact sequence seq, at positions [p_lo, p_hi). */
struct pf_slab {
    int seq, g_lo, g_hi, p_lo, p_hi;
};
struct pf_stage {
    const int32_t *stab;  /* device [n_seq][max_blocks]: the step's number of each staged block, -1 elsewhere */
    const int32_t *dtab;  /* device [n_seq][max_blocks]: the block table less the staged blocks (-1): the first pass's */
    const int32_t *hlist; /* device [n_host]: staged block g's pool id */
    const struct pf_slab *slab; /* host [n_slab] */
    int n_slab;
    uint8_t *buf[2];      /* two staging buffers of cap blocks: K slices, then V slices */
    int cap;
    size_t stride[2];     /* bytes between staged blocks: K, V (16-byte multiples) */
    size_t off[2], len[2]; /* layer l's slice of a pool block: bytes from the block's start, and bytes */
    float *acc, *ml;
    /* the copies run on cst beside the passes: it waits for start (recorded here on the step's
     * stream, after everything before the call: slabs 0 and 1 need no more), slab i's copy records
     * copied[i & 1], its pass freed[i & 1] (the caller's events). hlist_host: hlist on the host; dma != 0 copies
     * each run of consecutive pool ids with one 2D copy on the copy engines, else (or where a slab
     * has more than STAGE_DMA_RUNS runs) a gather kernel copies */
    cudaStream_t cst;
    cudaEvent_t start, copied[2], freed[2];
    const int32_t *hlist_host;
    int dma;
};
/* A slab in more runs of consecutive pool ids than this is gathered by a kernel, not 2D copies. */
#define STAGE_DMA_RUNS 64
/* attention_prefill_cuda over a tiered cache: a pass over dtab's blocks (the device tier's, and the
 * host blocks of the sequences the step reads in place) and the exact rows, then
 * for each slab a copy of its blocks' layer-l slices into a staging buffer (the host-to-device
 * traffic: sum of len over the slabs' blocks) and a pass over it; slab i + 1's copy runs while
 * slab i's pass does. sg->acc may be out itself when out is float32. Returns cudaSuccess, or the
 * error of the first call that could not be queued. */
cudaError_t attention_prefill_staged_cuda(void *out, int out_half, const float *q, const struct cuda_kv *kv, int l,
                                   const int32_t *pos, const int32_t *seq_id, const int32_t *tiles, int n_tiles,
                                   int n_head, const struct pf_stage *sg, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
