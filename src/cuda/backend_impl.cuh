/* backend_impl.cuh - the CUDA backend's state, shared by its two halves: backend.cu (creation: the
 * arena, weight upload, KV, buffers; free) and forward.cu (the per-step forward, forward_cpu's twin).
 * Private to src/cuda/backend.cu and src/cuda/forward.cu; the engine sees cuda/backend.h.
 * CPU twin: struct pxq_engine in engine_impl.h (the CPU forward's buffers).
 */
#ifndef PXQ_CUDA_BACKEND_IMPL_CUH
#define PXQ_CUDA_BACKEND_IMPL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "engine_impl.h"
#include "util.h"
}
#include "cuda/backend.h"
#include "cuda/ops_cuda.h"
#include "cuda/tuning.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) die("CUDA: %s: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)

#define MAX_GRAPHS 64
/* Decode steps of at least this many tokens use the int8 tensor-core mat-vec, fewer the dp4a one
 * (tests/bench_cuda_matmul --sweep-all on the H200, Qwen3-32B / Qwen3.5-27B shapes, with the
 * tilings of mma_choose: the mma kernel's time over the dp4a one's, summed over a Qwen3-32B
 * layer, 0.95 at 2 tokens (by shape 0.75-1.73: 9 of the 15 shapes lose, q|k|v and o_proj by
 * 12-13%), 0.63 at 4 (0.44-1.36: only 5120 x 1024 loses), 0.25 at 8, 0.20 at 16; at one token dp4a
 * is 1.1-1.9x faster; Qwen3-32B b4 end to end 469.8 t/s against 343.0 on dp4a). */
#define CUDA_MMA_MIN_TOKENS 3

struct cuda_layer {
    cuda_weight w[CM_COUNT];   /* by role (cuda/backend.h); fmt -1 where the layer has none or it is stacked */
    float *v[CV_COUNT];        /* float32 vectors, NULL where absent */
    /* stacked weights (fmt -1 if not): q|k|v (plain attention), gate|up (FFN), beta|alpha (DeltaNet);
     * dn_in: a DeltaNet layer's four in-projections qkv|z|beta|alpha, whose rows w[CM_SSM_QKV],
     * w[CM_SSM_Z] and ba are then views (weight_rows); qgkv: a gated attention layer's q_proj|k|v,
     * whose rows w[CM_Q], w[CM_K], w[CM_V] are views. Both for a one-token step's single launch. */
    cuda_weight qkv, gu, ba, dn_in, qgkv;
    float *bqkv;               /* the q|k|v biases side by side (zeros where one is absent), or NULL */
    /* MoE (fmt -1 if not): the router, and each role's experts stacked (upload_moe): gate|up, or gate
     * and up apart (cuda_moe_gu_fused), and down */
    cuda_weight router, moe_gu, moe_gate, moe_up, moe_down;
};

struct graph_entry {
    int n, n_out, n_split, split_len, n_runs;
    cudaGraphExec_t exec;
};

/* Per-step inputs, one host-to-device copy: int32 arrays at these offsets of in_d / in_h. */
struct step_inputs {
    int32_t *tok, *pos, *seq, *rows, *run_seq, *run_off, *run_tok, *tiles, *run_snap, *tab;
    int32_t *stab, *dtab, *hlist; /* with a host tier: the staged blocks' numbers, the first pass's table and the
                                   * staged blocks' pool ids (pf_stage) */
};

/* One array of the KV pool with a host tier (kv_tier.cu): a device address range whose first dev_bytes
 * are device memory and the rest pinned host memory. */
struct cuda_tier {
    void *va;
    size_t va_bytes, dev_bytes, host_bytes;
    unsigned long long h_dev, h_host; /* CUmemGenericAllocationHandle */
    int mapped;
};
/* Reserve bytes of addresses, back the first dev_bytes (rounded up to the granularity) with device
 * memory and the rest with pinned host memory. 0, or -1 with a message (no driver support, host
 * memory that cannot be pinned). cuda_tier_free undoes it (a zeroed one is a no-op). */
extern "C" int cuda_tier_alloc(struct cuda_tier *t, size_t dev_bytes, size_t bytes, char *err, size_t errlen);
extern "C" void cuda_tier_free(struct cuda_tier *t);

struct cuda_backend {
    char name[256];
    char *arena;
    size_t arena_size, used, peak;
    cudaStream_t st;
    cublasHandle_t cublas;
    cuda_layer *L;
    cuda_weight embd, output;
    uint8_t *embd_host;     /* untied models: the embedding table in mapped pinned host memory */
    float *output_norm, *inv_freq;
    cuda_weight mtp_fc;     /* spec_mtp: the MTP head's eh_proj [2 n_embd -> n_embd] */
    float *mtp_norm[3];     /* spec_mtp: its enorm, hnorm, shared_head_norm (1 + w folded, as the CPU's) */
    cuda_kv kv;
    struct cuda_tier tier[2]; /* the host tier (--kv-offload): K and V (the key bounds stay in the arena) */
    size_t tier_dev_bytes;    /* their device parts, outside the arena */
    uint64_t tier_moved;      /* blocks moved to the host tier (cuda_kv_move) */
    /* prefill over the host tier, staged (attention_staged.cu; stage NULL: host blocks read in place):
     * two buffers of stage_cap blocks' layer slices, K's stride and V's; the passes' (m, l); the
     * step's slabs (host, stage_inputs) and the bytes they have moved so far */
    uint8_t *stage;
    int stage_cap, n_slab;
    size_t stage_stride[2];
    float *pf_ml;
    pf_slab *slabs;
    uint64_t stage_bytes;
    cudaStream_t st_stage;    /* the staging copies (pf_stage's cst), and its events: start, copied[2], freed[2] */
    cudaEvent_t stage_ev[5];
    int32_t *in_d, *in_h;
    step_inputs di, hi;     /* the arrays in in_d and in in_h */
    int nb, n_tab, max_blocks, max_splits;
    int *seq_map;           /* [n_seq_max] -> compact index, scratch */
    float *x, *xb, *xb2, *q, *k, *v, *att, *hb, *hb2, *logits, *part_o, *part_ml;
    float *qg;              /* gated attention: q_proj output [nb][n_head][query | gate] */
    float *ssm_qkv, *ssm_conv, *ssm_z, *ssm_ba, *ssm_o; /* DeltaNet activations (forward_qwen35.c's) */
    int *ssm_count; /* deltanet_decode_cuda's counts, [DeltaNet layer][CUDA_DECODE_MAX][nk] */
    float *rstate;          /* [n_seq_max][rstate_floats] DeltaNet conv + delta-rule state */
    float *rstate_ck;       /* the same, pxq_seq_checkpoint's copies: in the arena (params.spec_checkpoint), else
                             * cudaMalloc'd at the first checkpoint, or NULL */
    float *moe_logits, *moe_w, *moe_hb, *moe_y; /* MoE: router [nb][n_expert], weights [nb][k], per pair gate|up
                                                 * [nb*k][2 ff_exp] then silu(gate)*up [nb*k][ff_exp], down [nb*k][n_embd] */
    int32_t *moe_ids;       /* MoE: the chosen experts [nb][k] */
    int32_t *moe_order, *moe_tiles, *moe_ntiles; /* MoE prefill: pairs sorted by expert, their tiles, the count */
    size_t rstate_floats;
    size_t hb_floats, moe_hb_floats; /* their sizes: the chunked delta rule's scratch while the token mixer runs */
    void *x16, *w16, *cublas_ws;
    const float *x16_src;   /* prefill: x16 holds the half form of this buffer (NULL: of none); set by
                             * the kernel that wrote both (gemm_in_norm, swiglu) or by matmul_ld's
                             * conversion, cleared by every norm that rewrites an operand */
    /* prefill: weight tiles dequantized on st_deq into the two halves of w16 while the GEMM of the
     * previous tile runs on st (deq_done[i]: half i is ready; gemm_done[i]: its GEMM is over) */
    cudaStream_t st_deq;
    cudaEvent_t deq_done[2], gemm_done[2];
    int tile_next;          /* the half the next tile goes to */
    /* the GEMM after a short kernel (a norm, the SwiGLU) holds the next tile's dequantization back
     * until that kernel is over (gemm_ready, recorded on st before the GEMM): launched during it, the
     * dequantization's blocks took every SM and the GEMM waited 10-15 us for them to leave.
     * deq_defer: armed by the short kernel, taken by the next GEMM; deq_after: gemm_ready is pending
     * for the next tile's dequantization (docs/PERF.md: 6956 -> 6986 t/s, Qwen3-32B pp512). */
    cudaEvent_t gemm_ready;
    int deq_defer, deq_after;
    int8_t *xq;             /* q8 activations [nb][max_in] and their (d, s) [nb][max_in/32][2] */
    float *xds;
    size_t w16_elems, w16_half; /* the two tile buffers, and the elements of a tile */
    struct cuda_tuning tune; /* the knobs, as read at creation; the fields below are the paths they chose */
    int exact, graphs;
    int prefill_attn;       /* attention_prefill_cuda (tensor-core flash attention) for prefill steps */
    int decode_attn;        /* attention_decode_cuda (tensor-core flash-decoding) for decode steps */
    int n_sm;               /* the device's multiprocessors: decode attention splits are sized by them */
    int split_blocks;       /* decode attention: splits for one wave of this many blocks per SM
                             * (PXQ_CUDA_SPLIT_BLOCKS, default 2) */
    int mma;                /* decode mat-vecs on int8 tensor cores where supported (PXQ_CUDA_MMA=0: dp4a) */
    int pdl;                /* decode steps of up to pdl_tokens tokens launch with programmatic dependent
                             * launch (PXQ_CUDA_PDL=0: off; PXQ_CUDA_PDL_TOKENS, default dp4a_tokens) */
    int pdl_tokens;
    int moe_mma;            /* MoE prefill: the experts' tiles on int8 tensor cores where they can (ffn_moe) */
    int moe_tiles_mma;      /* ... and whether every MoE layer of the last prefill step did (the bench's path) */
    int stage_o;            /* the one-token o projection after the decode attention stages its weight in shared
                             * memory (MATMUL_Q8_STAGE; PXQ_CUDA_STAGE_O=0: off) */
    int fuse_dn;            /* decode DeltaNet: conv, prep, delta rule and gated norm in one launch where it
                             * runs (deltanet_decode_cuda; PXQ_CUDA_FUSE_DN=0: four launches) */
    int dp4a_tokens;        /* decode steps of up to this many tokens run the dp4a mat-vec (2; 4 without mma) */
    int early_trigger;      /* dp4a mat-vecs that let the next kernel launch at their start
                             * (MATMUL_Q8_LAUNCH_NEXT), a mask: 1 the attention's q|k|v projection, 2 the
                             * DeltaNet's in-projection, 8 the FFN's gate|up, 16 lm_head
                             * (PXQ_CUDA_EARLY_TRIGGER, default 11) */
    int ahead2;             /* dp4a mat-vecs that keep two steps of their weight in flight (MATMUL_Q8_AHEAD2),
                             * early_trigger's mask (PXQ_CUDA_MV_AHEAD, default 1: the attention's q|k|v
                             * projection; ops_cuda.h has the measurements) */
    size_t l2_pf_bytes;     /* the dp4a steps: each mat-vec pulls up to this many bytes of the next
                             * weight into L2 as it finishes (0: off; PXQ_CUDA_L2_PREFETCH "MiB[,blocks]") */
    int l2_pf_blocks;       /* ... asked for by this many of its last blocks */
    int l2_pf_step;         /* the step being recorded prefetches (set around decode steps) */
    size_t l2_size;         /* the device's L2 cache, bytes */
    graph_entry g[MAX_GRAPHS];
    int n_graphs, next_evict;
    char path[96];
};

static cuda_backend *B(const struct pxq_engine *e) { return (cuda_backend *)e->backend; }

/* Sequence seq's DeltaNet state into its checkpoint slot (restore 0) or back (restore 1), on the
 * stream; the slots (rstate_ck) must exist. */
static inline void rstate_ck_copy(cuda_backend *b, int seq, int restore) {
    const size_t off = (size_t)seq * b->rstate_floats;
    float *live = b->rstate + off, *ck = b->rstate_ck + off;
    CK(cudaMemcpyAsync(restore ? live : ck, restore ? ck : live, b->rstate_floats * sizeof(float),
                       cudaMemcpyDeviceToDevice, b->st));
}

#endif
