/* kv_select.cu - query-aware block selection on the device (Quest, Tang et al. 2024, arXiv
 * 2406.10774; kvcache.h topk_blocks): the per-block key bounds, kept as keys are stored, and per
 * decode or prefill token and KV head the blocks of the middle (between the sinks and the window of
 * window + sink attention) it also attends to: the topk_blocks blocks with the largest upper bound
 * of q.k over the GQA group's query heads, sum over channels of max(q_d min_d, q_d max_d), ties to
 * the earlier block. The attention kernels read the bitmaps, and for a decode step the tensor-core
 * ones the list of the chosen blocks (attention_sparse.cuh). A prefill ubatch scores and chooses in
 * one launch, a block per (token, KV head); a decode step (kv.score) scores in a launch of its own
 * that spreads each pair's middle over many blocks, then chooses.
 * CPU twin: kv_store's bounds (kvcache.c) and visible_ranges (forward_cpu.c).
 */
#include <math.h>
#include <stdint.h>

#include "cuda/ops_cuda.h"

#include "cuda/common.cuh"

#define KS_THREADS 256
#define KS_WARPS (KS_THREADS / 32)
#define KS_VD 8       /* the scoring's channels a lane at most: head_dim up to 256 */
#define KS_G 8        /* the group's heads scored together */
#define KS_QMAX 4096  /* floats of the group's query rows in shared memory after the scores */

/* grid (n_tokens), block KS_THREADS. A token leads its block of the cache (the first of the step's
 * tokens of its sequence in that block) and folds every such token's key into the block's bounds,
 * starting them afresh when it is the block's first slot (kv_store's rule); the others return. */
__global__ void kv_bounds_kernel(const cuda_kv kv, int l, const float *__restrict__ k, int ld,
                                 const int32_t *__restrict__ pos, const int32_t *__restrict__ seq_id, int n_tokens) {
    __shared__ int lead;
    const int t = blockIdx.x, p = pos[t], s = seq_id[t], bs = kv.block_size, jb = p / bs;
    if (threadIdx.x == 0) {
        int ld1 = 1;
        for (int u = 0; u < n_tokens && ld1; u++)
            if (seq_id[u] == s && pos[u] / bs == jb && pos[u] < p) ld1 = 0;
        lead = ld1;
    }
    __syncthreads();
    if (!lead) return;
    const int32_t b = kv.block_tab[(size_t)s * kv.max_blocks + jb];
    const size_t o = ((size_t)b * kv.n_layer_kv + l) * kv.kv_dim;
    if (kv.sc_slots && b >= kv.n_dev && threadIdx.x == 0) atomicAdd(&kv.sc_gen[b], 1u); /* its cached slices are stale */
    for (int i = threadIdx.x; i < kv.kv_dim; i += blockDim.x) {
        float mn = INFINITY, mx = -INFINITY;
        if (p % bs) mn = kv.kmin[o + i], mx = kv.kmax[o + i];
        for (int u = 0; u < n_tokens; u++)
            if (seq_id[u] == s && pos[u] / bs == jb) {
                const float x = k[(size_t)u * ld + i];
                mn = fminf(mn, x), mx = fmaxf(mx, x);
            }
        kv.kmin[o + i] = mn, kv.kmax[o + i] = mx;
    }
}

/* Order-preserving key of a float: a larger float, a larger unsigned key. */
static __device__ __forceinline__ uint32_t ks_key(float x) {
    const uint32_t u = __float_as_uint(x);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* The blocks lo .. hi - 1 whose bit is set in sel, ascending, into out[1 ..], their count into
 * out[0]; by the whole block (KS_THREADS threads, a contiguous run of words each, their counts
 * scanned in scan[]). sel was written by this block: call after a barrier. */
static __device__ void ks_list(const uint32_t *sel, int lo, int hi, int32_t *out, uint32_t *scan) {
    const int tid = threadIdx.x;
    const int w0 = lo >> 5, nw = hi > lo ? ((hi - 1) >> 5) - w0 + 1 : 0, per = (nw + KS_THREADS - 1) / KS_THREADS;
    const int wa = w0 + min(tid * per, nw), wb = w0 + min(tid * per + per, nw);
    auto word = [&](int w) { /* word w's bits of blocks lo .. hi - 1 */
        uint32_t x = sel[w];
        const int base = w << 5;
        if (base < lo) x &= ~0u << (lo - base);
        if (hi - base < 32) x &= (1u << (hi - base)) - 1u;
        return x;
    };
    uint32_t cnt = 0;
    for (int w = wa; w < wb; w++) cnt += __popc(word(w));
    scan[tid] = cnt;
    __syncthreads();
    for (int d = 1; d < KS_THREADS; d *= 2) { /* inclusive scan (Hillis-Steele) */
        const uint32_t x = tid >= d ? scan[tid - d] : 0u;
        __syncthreads();
        scan[tid] += x;
        __syncthreads();
    }
    int at = 1 + (int)(scan[tid] - cnt);
    for (int w = wa; w < wb; w++)
        for (uint32_t x = word(w); x; x &= x - 1) out[at++] = (w << 5) + __ffs(x) - 1;
    if (tid == KS_THREADS - 1) out[0] = (int32_t)scan[tid];
}

/* The scoring's fast path: a lane takes head_dim / 32 contiguous channels, the group's query rows in
 * shared memory. */
static __device__ __forceinline__ bool ks_fast(int hd, int group) { return hd % 32 == 0 && hd <= 32 * KS_VD && group * hd <= KS_QMAX; }

/* Block blk's (a pool block id) upper bound of q.k for KV head kvh of layer l: the max over the
 * group's query heads of sum_d max(q_d min_d, q_d max_d); q: the group's rows [group][head_dim]
 * (shared memory when fast). By a whole warp; every lane returns the bound. fast: a lane reads its
 * channels of the bounds once for every head of the group, and the group's sums are reduced across
 * the warp together (independent shuffles); else a loop over the heads, a warp sum each. */
static __device__ float ks_bound(const cuda_kv &kv, int l, int blk, int kvh, const float *q, bool fast, int group, int lane) {
    const int hd = kv.head_dim;
    const size_t o = ((size_t)blk * kv.n_layer_kv + l) * kv.kv_dim + (size_t)kvh * hd;
    float best = -INFINITY;
    if (fast) {
        const int vd = hd / 32;
        float mn[KS_VD], mx[KS_VD];
#pragma unroll
        for (int j = 0; j < KS_VD; j++)
            mn[j] = j < vd ? kv.kmin[o + lane * vd + j] : 0.0f, mx[j] = j < vd ? kv.kmax[o + lane * vd + j] : 0.0f;
        for (int g0 = 0; g0 < group; g0 += KS_G) {
            float u[KS_G];
#pragma unroll
            for (int g = 0; g < KS_G; g++) {
                u[g] = 0.0f;
                const float *qg = q + (size_t)min(g0 + g, group - 1) * hd + lane * vd;
#pragma unroll
                for (int j = 0; j < KS_VD; j++)
                    if (j < vd) u[g] += fmaxf(qg[j] * mn[j], qg[j] * mx[j]);
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
#pragma unroll
                for (int g = 0; g < KS_G; g++) u[g] += __shfl_xor_sync(FULL_MASK, u[g], off);
#pragma unroll
            for (int g = 0; g < KS_G; g++) best = fmaxf(best, u[g]); /* past the group: a repeat of its last head */
        }
        return best;
    }
    for (int g = 0; g < group; g++) {
        float u = 0.0f;
        for (int d = lane; d < hd; d += 32) {
            const float qd = q[(size_t)g * hd + d];
            u += fmaxf(qd * kv.kmin[o + d], qd * kv.kmax[o + d]);
        }
        best = fmaxf(best, warp_sum(u));
    }
    return best;
}

/* The middle of a query that sees n_kv positions (between its sinks and its window): its first block
 * *b0 and the count of blocks touching it (0: none, every position is a sink or in the window). */
static __device__ __forceinline__ int ks_middle(const cuda_kv &kv, int n_kv, int *b0) {
    if (!kv.attn_window || n_kv <= kv.attn_sinks + kv.attn_window) return *b0 = 0, 0;
    const int bs = kv.block_size, a = kv.attn_sinks, b = n_kv - kv.attn_window;
    *b0 = a / bs;
    return (b - 1) / bs - *b0 + 1;
}

/* grid (G, n_head_kv, n_tokens), block KS_THREADS, dynamic shared memory the group's query rows
 * (group x head_dim floats, the fast path's): a decode step's scores into kv.score, the middle's
 * blocks strided over the G blocks' warps, a warp a block. A step of one token has only n_head_kv
 * (token, head) pairs: one block each would leave the SMs idle (Qwen3.5-27B at 16384 positions on
 * an H100: 312 us a layer, 39% of a step, with 4 blocks). Nothing to score (no middle, or at most
 * topk_blocks blocks in it): returns. */
__global__ void kv_score_kernel(const cuda_kv kv, int l, const float *__restrict__ q, const int32_t *__restrict__ pos,
                                const int32_t *__restrict__ seq_id, int n_head) {
    extern __shared__ float ks_q[];
    const int t = blockIdx.z, kvh = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int hd = kv.head_dim, group = n_head / kv.n_head_kv;
    int b0;
    const int nb = ks_middle(kv, pos[t] + 1, &b0);
    if (nb <= kv.topk_blocks || (int)blockIdx.x * KS_WARPS >= nb) return;
    const int32_t *tab = kv.block_tab + (size_t)seq_id[t] * kv.max_blocks;
    const float *qt = q + (size_t)t * n_head * hd + (size_t)kvh * group * hd;
    const bool fast = ks_fast(hd, group);
    if (fast) {
        for (int i = tid; i < group * hd; i += blockDim.x) ks_q[i] = qt[i];
        __syncthreads();
    }
    float *sc = kv.score + ((size_t)t * kv.n_head_kv + kvh) * kv.max_blocks;
    for (int i = blockIdx.x * KS_WARPS + warp; i < nb; i += gridDim.x * KS_WARPS) {
        const float u = ks_bound(kv, l, tab[b0 + i], kvh, fast ? ks_q : qt, fast, group, lane);
        if (lane == 0) sc[i] = u;
    }
}

/* grid (n_tokens, n_head_kv), block KS_THREADS, dynamic shared memory: the scores (max_blocks
 * floats), then the group's query rows (KS_QMAX floats). The bitmap of (t, kvh) is cleared, then the
 * chosen blocks' bits set (bit j: the sequence's block j, positions j bs .. j bs + bs - 1). scored:
 * the scores come from kv.score (kv_score_kernel, a decode step), else the block's warps score the
 * middle themselves (a prefill ubatch has blocks enough). The k-th largest key is found by a radix
 * select, 8 bits a round; keys above it are taken, and of those equal to it the earliest. list:
 * also kv.mid's list of (t, kvh) (attention_sparse.cuh: the chosen blocks wholly inside the middle). */
__global__ void kv_select_kernel(const cuda_kv kv, int l, const float *__restrict__ q, const int32_t *__restrict__ pos,
                                 const int32_t *__restrict__ seq_id, int n_head, int list, int scored) {
    extern __shared__ float ks_score[];
    __shared__ uint32_t hist[256];
    __shared__ uint32_t s_prefix; /* one declaration a line: tools/cuda_emu/xform.py's form */
    __shared__ uint32_t s_need;
    __shared__ uint32_t s_taken;
    __shared__ uint32_t s_wcnt[KS_WARPS];
    const int t = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int bs = kv.block_size, hd = kv.head_dim, group = n_head / kv.n_head_kv, n_kv = pos[t] + 1;
    uint32_t *sel = kv.sel + ((size_t)t * kv.n_head_kv + kvh) * kv.sel_words;
    int32_t *mid = list ? kv.mid + ((size_t)t * kv.n_head_kv + kvh) * (size_t)(kv.mid_cap + 1) : NULL;
    for (int w = tid; w < kv.sel_words; w += blockDim.x) sel[w] = 0;
    int b0;
    const int nb = ks_middle(kv, n_kv, &b0);
    if (!nb) { /* no middle: nothing to choose */
        if (mid && tid == 0) mid[0] = 0;
        return;
    }
    __syncthreads(); /* the clearing before the bits */
    const int a = kv.attn_sinks, b = n_kv - kv.attn_window;
    const int nsb = (a + bs - 1) / bs, wb0 = max(b / bs, nsb); /* the listed blocks: nsb .. wb0 - 1 */
    const int32_t *tab = kv.block_tab + (size_t)seq_id[t] * kv.max_blocks;
    if (nb <= kv.topk_blocks) {
        for (int i = tid; i < nb; i += blockDim.x) atomicOr(sel + ((b0 + i) >> 5), 1u << ((b0 + i) & 31));
        if (mid) {
            __syncthreads();
            ks_list(sel, nsb, wb0, mid, hist);
        }
        return;
    }
    if (scored) { /* a decode step: kv_score_kernel wrote the scores */
        const float *sc = kv.score + ((size_t)t * kv.n_head_kv + kvh) * kv.max_blocks;
        for (int i = tid; i < nb; i += blockDim.x) ks_score[i] = sc[i];
    } else {
        const float *qt = q + (size_t)t * n_head * hd + (size_t)kvh * group * hd;
        float *qs = ks_score + kv.max_blocks;
        const bool fast = ks_fast(hd, group);
        if (fast) {
            for (int i = tid; i < group * hd; i += blockDim.x) qs[i] = qt[i];
            __syncthreads();
        }
        for (int i = warp; i < nb; i += KS_WARPS) {
            const float u = ks_bound(kv, l, tab[b0 + i], kvh, fast ? qs : qt, fast, group, lane);
            if (lane == 0) ks_score[i] = u;
        }
    }
    if (tid == 0) s_prefix = 0, s_need = (uint32_t)kv.topk_blocks;
    __syncthreads();
    /* radix select: after the round at `shift`, s_prefix holds the top bits of the k-th largest key
     * and s_need how many keys with those bits are still to take */
    for (int shift = 24; shift >= 0; shift -= 8) {
        hist[tid] = 0; /* KS_THREADS == 256 bins */
        __syncthreads();
        const uint32_t prefix = s_prefix, hmask = shift == 24 ? 0u : ~0u << (shift + 8);
        for (int i = tid; i < nb; i += blockDim.x) {
            const uint32_t key = ks_key(ks_score[i]);
            if ((key & hmask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
        }
        __syncthreads();
        if (warp == 0) { /* the bin of the need-th key from the top: lane i sums bins 255 - 8i .. 248 - 8i */
            const uint32_t need = s_need; /* read by every lane before the shuffles, written after */
            uint32_t h[8], tot = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) h[j] = hist[255 - 8 * lane - j], tot += h[j];
            uint32_t inc = tot; /* the keys in bins above and in this lane's */
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const uint32_t y = __shfl_up_sync(FULL_MASK, inc, off);
                if (lane >= off) inc += y;
            }
            const uint32_t excl = inc - tot;
            if ((excl < need && need <= inc) || (lane == 31 && inc < need)) { /* one lane; the last: bin 0 */
                uint32_t cum = excl;
                int bin = 0;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    bin = 255 - 8 * lane - j;
                    if (cum + h[j] >= need || bin == 0) break;
                    cum += h[j];
                }
                s_prefix = prefix | (uint32_t)bin << shift;
                s_need = need - cum;
            }
        }
        __syncthreads();
    }
    /* take the keys above the threshold, and the first s_need equal to it in block order */
    const uint32_t thr = s_prefix, need = s_need;
    if (tid == 0) s_taken = 0;
    __syncthreads();
    for (int base = 0; base < nb; base += blockDim.x) {
        const int i = base + tid;
        const uint32_t key = i < nb ? ks_key(ks_score[i]) : 0u;
        const bool eq = i < nb && key == thr;
        const uint32_t ball = __ballot_sync(FULL_MASK, eq);
        if (lane == 0) s_wcnt[warp] = __popc(ball);
        __syncthreads();
        uint32_t before = s_taken + __popc(ball & ((1u << lane) - 1u));
        for (int w = 0; w < warp; w++) before += s_wcnt[w];
        if (i < nb && (key > thr || (eq && before < need))) atomicOr(sel + ((b0 + i) >> 5), 1u << ((b0 + i) & 31));
        __syncthreads();
        if (tid == 0)
            for (int w = 0; w < KS_WARPS; w++) s_taken += s_wcnt[w];
        __syncthreads();
    }
    if (mid) ks_list(sel, nsb, wb0, mid, hist); /* after the loop's last barrier */
}

static size_t ks_smem(int max_blocks) { return ((size_t)max_blocks + KS_QMAX) * sizeof(float); }

extern "C" int kv_select_prepare(int max_blocks) {
    const size_t need = ks_smem(max_blocks);
    if (need <= 48 * 1024) return 0;
    int dev = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        (size_t)optin < need + 2048 ||
        cudaFuncSetAttribute(kv_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
}

extern "C" void kv_bounds_cuda(const struct cuda_kv *kv, int l, const float *k, int ld, const int32_t *pos,
                               const int32_t *seq_id, int n_tokens, cudaStream_t st) {
    if (n_tokens <= 0 || !kv->topk_blocks) return;
    kv_bounds_kernel<<<n_tokens, KS_THREADS, 0, st>>>(*kv, l, k, ld, pos, seq_id, n_tokens);
}

extern "C" void kv_select_cuda(const struct cuda_kv *kv, int l, const float *q, const int32_t *pos,
                               const int32_t *seq_id, int n_tokens, int n_head, cudaStream_t st) {
    if (n_tokens <= 0 || !kv->topk_blocks) return;
    const int list = kv->mid && n_tokens <= kv->mid_tokens;
    const int scored = kv->score && n_tokens <= kv->mid_tokens; /* a decode step: the scoring spread over the SMs */
    if (scored) {
        const int pairs = n_tokens * kv->n_head_kv, most = (kv->max_blocks + KS_WARPS - 1) / KS_WARPS;
        int g = (kv->score_blocks + pairs - 1) / pairs;
        g = g < 1 ? 1 : g > most ? most : g;
        size_t qrows = (size_t)(n_head / kv->n_head_kv) * kv->head_dim * sizeof(float); /* the fast path's query rows */
        if (qrows > KS_QMAX * sizeof(float)) qrows = 0;
        kv_score_kernel<<<dim3(g, kv->n_head_kv, n_tokens), KS_THREADS, qrows, st>>>(*kv, l, q, pos, seq_id, n_head);
    }
    const size_t smem = scored ? (size_t)kv->max_blocks * sizeof(float) : ks_smem(kv->max_blocks); /* no query rows */
    kv_select_kernel<<<dim3(n_tokens, kv->n_head_kv), KS_THREADS, smem, st>>>(*kv, l, q, pos, seq_id, n_head, list, scored);
}
