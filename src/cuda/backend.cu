/* backend.cu - the CUDA backend: one device arena, weights repacked and uploaded at load, the paged
 * KV cache on the device, and forward_cuda, the twin of forward_cpu (same steps, same order).
 *
 * Per ubatch: the token ids, positions, compacted sequence ids, output rows and the block tables of
 * the ubatch's sequences travel in one host-to-device copy into fixed device buffers; decode steps
 * (at most CUDA_DECODE_MAX tokens) are captured once per (n_tokens, n_outputs, n_split, split_len,
 * n_runs) as a CUDA graph and replayed; the requested logits rows come back in one copy.
 *
 * Precision: float32 activations, fp32-accumulating mat-vecs; by default KV in f16 and prefill
 * matmuls (ubatches over CUDA_DECODE_MAX tokens) in f16 through cuBLAS with fp32 accumulation.
 * PXQ_CUDA_FP32=1 keeps KV in f32 and runs every matmul through the fp32 mat-vec (the tests' exact
 * mode). PXQ_CUDA_GRAPHS=0 turns graphs off (eager launches, same kernels).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "engine_impl.h"
#include "quant.h"
#include "threadpool.h"
#include "util.h"
}
#include "cuda/backend.h"
#include "cuda/ops_cuda.h"
#include "cuda/ops_moe_cuda.h"
#include "cuda/ops_qwen35_cuda.h"

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
#define STAGE_BYTES ((size_t)64 << 20)

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
    int32_t *tok, *pos, *seq, *rows, *run_seq, *run_off, *run_tok, *tiles, *tab;
};

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
    cuda_kv kv;
    int32_t *in_d, *in_h;
    step_inputs di, hi;     /* the arrays in in_d and in in_h */
    int nb, n_tab, max_blocks, max_splits;
    int *seq_map;           /* [n_seq_max] -> compact index, scratch */
    float *x, *xb, *xb2, *q, *k, *v, *att, *hb, *hb2, *logits, *part_o, *part_ml;
    float *qg;              /* gated attention: q_proj output [nb][n_head][query | gate] */
    float *ssm_qkv, *ssm_conv, *ssm_z, *ssm_ba, *ssm_o; /* DeltaNet activations (forward_qwen35.c's) */
    int *ssm_count; /* deltanet_decode_cuda's counts, [DeltaNet layer][CUDA_DECODE_MAX][nk] */
    float *rstate;          /* [n_seq_max][rstate_floats] DeltaNet conv + delta-rule state */
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
     * for the next tile's dequantization. PXQ_CUDA_DEQ_DEFER=0 turns it off. */
    cudaEvent_t gemm_ready;
    int deq_defer, deq_after, deq_defer_on;
    int8_t *xq;             /* q8 activations [nb][max_in] and their (d, s) [nb][max_in/32][2] */
    float *xds;
    size_t w16_elems, w16_half; /* the two tile buffers, and the elements of a tile */
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
    int moe_mma;            /* MoE prefill: the experts' tiles on int8 tensor cores where they can (moe_ffn) */
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

static void *arena_get(cuda_backend *b, size_t bytes) {
    size_t n = (bytes + CUDA_ALIGN - 1) / CUDA_ALIGN * CUDA_ALIGN;
    if (b->used + n > b->arena_size) die("CUDA arena: %zu + %zu bytes exceed the plan's %zu", b->used, n, b->arena_size);
    void *p = b->arena + b->used;
    b->used += n;
    if (b->used > b->peak) b->peak = b->used;
    return p;
}

static float *arena_f32(cuda_backend *b, size_t n) { return (float *)arena_get(b, n * sizeof(float)); }

/* ---- weight upload: repack on the host in parallel, copy through two pinned stages ---- */

struct repack_args {
    const struct pxq_tensor *t;
    int64_t r0;
    size_t row_q, row_s;
    uint8_t *hq, *hs;
};

static void repack_range(void *arg, int64_t i0, int64_t i1, int ith) {
    const repack_args *a = (const repack_args *)arg;
    (void)ith;
    if (cuda_weight_repack(a->t, a->r0 + i0, a->r0 + i1, a->hq + (size_t)i0 * a->row_q, a->hs + (size_t)i0 * a->row_s))
        die("repack %s", a->t->name);
}

struct uploader {
    uint8_t *stage[2];
    cudaEvent_t done[2];
    int cur;
};

/* Repack t's rows into the device arrays dq, ds (the format's layout, rows from 0). */
static void upload_rows(struct pxq_engine *e, cuda_backend *b, uploader *u, const struct pxq_tensor *t, uint8_t *dq,
                        uint8_t *ds) {
    const int fmt = cuda_wfmt_of(t->type);
    const int64_t n_out = t->ne[1];
    size_t qb, sb;
    cuda_weight_sizes(fmt, t->ne[0], n_out, &qb, &sb);
    const size_t row_q = qb / (size_t)n_out, row_s = sb / (size_t)n_out;
    int64_t rows = (int64_t)(STAGE_BYTES / (row_q + row_s));
    if (rows < 1) die("weight %s: a row exceeds the staging buffer", t->name);
    for (int64_t r0 = 0; r0 < n_out; r0 += rows) {
        int64_t rc = n_out - r0 < rows ? n_out - r0 : rows;
        uint8_t *hq = u->stage[u->cur], *hs = hq + (size_t)rc * row_q;
        CK(cudaEventSynchronize(u->done[u->cur])); /* the copy that last used this stage is over */
        repack_args a = {t, r0, row_q, row_s, hq, hs};
        parallel_for(e->tp, rc, 64, repack_range, &a);
        /* cudaMemcpyDefault: dq, ds are arena memory, or pinned host memory (the embedding table) */
        CK(cudaMemcpyAsync(dq + (size_t)r0 * row_q, hq, (size_t)rc * row_q, cudaMemcpyDefault, b->st));
        if (sb) CK(cudaMemcpyAsync(ds + (size_t)r0 * row_s, hs, (size_t)rc * row_s, cudaMemcpyDefault, b->st));
        CK(cudaEventRecord(u->done[u->cur], b->st));
        u->cur ^= 1;
    }
}

/* The n tensors ts (same type and row length) as one weight with their rows stacked in order: one
 * mat-vec launch computes all their outputs, token row = [out of ts[0] | out of ts[1] | ...]. */
static void upload_stacked(struct pxq_engine *e, cuda_backend *b, uploader *u, const struct pxq_tensor *const *ts, int n,
                           cuda_weight *w) {
    w->fmt = cuda_wfmt_of(ts[0]->type);
    w->n_in = (int)ts[0]->ne[0];
    w->n_out = 0;
    for (int i = 0; i < n; i++) w->n_out += (int)ts[i]->ne[1];
    size_t qb, sb;
    cuda_weight_sizes(w->fmt, w->n_in, w->n_out, &qb, &sb);
    uint8_t *dq = (uint8_t *)arena_get(b, qb), *ds = sb ? (uint8_t *)arena_get(b, sb) : NULL;
    w->q = dq;
    w->s = ds;
    const size_t row_q = qb / (size_t)w->n_out, row_s = sb / (size_t)w->n_out;
    for (int i = 0, r = 0; i < n; r += (int)ts[i]->ne[1], i++)
        upload_rows(e, b, u, ts[i], dq + (size_t)r * row_q, ds ? ds + (size_t)r * row_s : NULL);
}

/* Rows [r0, r0 + n) of w as a weight of their own, on w's storage. */
static cuda_weight weight_rows(const cuda_weight &w, int r0, int n) {
    size_t qb, sb;
    cuda_weight_sizes(w.fmt, w.n_in, r0, &qb, &sb);
    cuda_weight v = w;
    v.n_out = n;
    v.q = (const uint8_t *)w.q + qb;
    v.s = w.s ? (const uint8_t *)w.s + sb : NULL;
    return v;
}

static void upload_weight(struct pxq_engine *e, cuda_backend *b, uploader *u, const struct pxq_tensor *t, cuda_weight *w) {
    upload_stacked(e, b, u, &t, 1, w);
}

/* 1 if the n tensors can be stacked into one weight (present, same type and row length). */
static int stackable(const struct pxq_tensor *const *ts, int n) {
    for (int i = 0; i < n; i++)
        if (!ts[i] || ts[i]->type != ts[0]->type || ts[i]->ne[0] != ts[0]->ne[0]) return 0;
    return 1;
}

static float *upload_f32(cuda_backend *b, const float *h, size_t n) {
    if (!h) return NULL;
    float *d = arena_f32(b, n);
    CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

/* A MoE layer (cuda_plan.c's moe_plan counts the same): the router, and each role's experts
 * stacked into one weight, expert x's rows at x * rows per expert: [gate_x | up_x] (2 n_ff_exp rows)
 * when gate and up have one type, else gate and up apart (n_ff_exp rows); down (n_embd rows). */
static void upload_moe(struct pxq_engine *e, cuda_backend *b, uploader *u, const struct pxq_layer *L, cuda_layer *cl) {
    const int E = e->hp->n_expert;
    const struct pxq_expert *x = L->experts;
    const struct pxq_tensor **ts = (const struct pxq_tensor **)xmalloc(2 * (size_t)E * sizeof *ts);
    upload_weight(e, b, u, L->ffn_gate_inp, &cl->router);
    if (cuda_moe_gu_fused(L)) {
        for (int i = 0; i < E; i++) ts[2 * i] = x[i].gate, ts[2 * i + 1] = x[i].up;
        upload_stacked(e, b, u, ts, 2 * E, &cl->moe_gu);
    } else {
        for (int i = 0; i < E; i++) ts[i] = x[i].gate;
        upload_stacked(e, b, u, ts, E, &cl->moe_gate);
        for (int i = 0; i < E; i++) ts[i] = x[i].up;
        upload_stacked(e, b, u, ts, E, &cl->moe_up);
    }
    for (int i = 0; i < E; i++) ts[i] = x[i].down;
    upload_stacked(e, b, u, ts, E, &cl->moe_down);
    free(ts);
}

/* ---- creation ---- */

static int env_is(const char *name, const char *val) {
    const char *v = getenv(name);
    return v && strcmp(v, val) == 0;
}

/* A tuning knob "a,b" of two integers: 1 with *a, *b set, 0 if name is unset or not that form. */
static int env_pair(const char *name, int *a, int *b) {
    const char *v = getenv(name);
    return v && sscanf(v, "%d,%d", a, b) == 2;
}

extern "C" void cuda_no_device_msg(int cuda_error, int n_dev, char *out, size_t cap) {
    const cudaError_t ce = (cudaError_t)cuda_error;
    const char *why = ce == cudaErrorInsufficientDriver ? "no NVIDIA driver is loaded, or it is older than this build's "
                                                          "CUDA runtime"
                      : ce == cudaErrorNoDevice || (ce == cudaSuccess && n_dev == 0) ? "no NVIDIA GPU found"
                                                                                      : "the CUDA runtime failed";
    snprintf(out, cap, "no CUDA device: %s (CUDA: %s)", why, ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
}

extern "C" int cuda_backend_new(struct pxq_engine *e, char *err, size_t errlen) {
    const struct pxq_hparams *hp = e->hp;
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev == 0) {
        char why[256];
        cuda_no_device_msg(ce, n_dev, why, sizeof why);
        return set_err(err, errlen, "%s; use --device cpu", why);
    }
    const int exact = env_is("PXQ_CUDA_FP32", "1");
    if (cudaSetDevice(0) != cudaSuccess) return set_err(err, errlen, "cudaSetDevice(0) failed");
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return set_err(err, errlen, "cudaMemGetInfo failed");
    struct cuda_plan plan;
    { /* without --gpu-mem the arena is the plan itself, and the GPU's free memory is the budget that
       * chooses the prefill tiles (whole matrices, or the small ones where those would not fit) */
        struct pxq_engine_params pp = e->p;
        if (!pp.gpu_mem) pp.gpu_mem = free_b;
        if (cuda_mem_plan(e->m, &pp, exact ? 4 : 2, &plan, err, errlen)) return -1;
    }
    char ps[320];
    cuda_mem_plan_str(&plan, ps, sizeof ps);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const size_t arena_size = e->p.gpu_mem ? e->p.gpu_mem : plan.total;
    if (plan.total > arena_size)
        return set_err(err, errlen, "the model does not fit in --gpu-mem %.2f GiB: %s; short by %.2f GiB",
                       arena_size / gib, ps, (plan.total - arena_size) / gib);
    if (arena_size > free_b)
        return set_err(err, errlen, "device arena of %.2f GiB exceeds the %.2f GiB free on the GPU (plan: %s)",
                       arena_size / gib, free_b / gib, ps);
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    if (hp->arch == ARCH_QWEN35 && !deltanet_cuda_supported(hp->ssm_head_k_dim, hp->ssm_head_v_dim))
        return set_err(err, errlen, "CUDA backend: DeltaNet heads of %d x %d have no kernel", hp->ssm_head_k_dim,
                       hp->ssm_head_v_dim);
    if (attention_cuda_prepare(hd, group) != 0)
        return set_err(err, errlen, "attention needs %zu bytes of shared memory per block, more than this GPU allows",
                       attention_smem_bytes(hd, group));

    cuda_backend *b = (cuda_backend *)xcalloc(1, sizeof *b);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    snprintf(b->name, sizeof b->name, "%s", prop.name);
    b->exact = exact;
    b->graphs = !env_is("PXQ_CUDA_GRAPHS", "0");
    b->mma = !env_is("PXQ_CUDA_MMA", "0");
    b->pdl = !env_is("PXQ_CUDA_PDL", "0") && cuda_pdl_supported();
    /* the dp4a steps: 1-2 tokens, or 1-4 (the kernel's measured range, before the tensor cores took
     * 5-16) with PXQ_CUDA_MMA=0 */
    b->dp4a_tokens = b->mma ? CUDA_MMA_MIN_TOKENS - 1 : 4;
    b->pdl_tokens = getenv("PXQ_CUDA_PDL_TOKENS") ? atoi(getenv("PXQ_CUDA_PDL_TOKENS")) : b->dp4a_tokens;
    int tune_a, tune_b;
    if (env_pair("PXQ_CUDA_MV", &tune_a, &tune_b)) /* "rows,warps" of the 1..2-token dp4a mat-vec */
        matmul_q8_tune(tune_a, tune_b);
    qk_norm_rope_store_rows_off(env_is("PXQ_CUDA_QK_ROWS", "0")); /* A/B knob: the decode form for prefill */
    /* A/B knobs: the generic tile kernel, the tile kernel's units a thread */
    dequant_tile_f16_tune(env_is("PXQ_CUDA_DEQ_TILE", "generic"),
                          getenv("PXQ_CUDA_DEQ_U") ? atoi(getenv("PXQ_CUDA_DEQ_U")) : 0);
    b->stage_o = b->pdl && !env_is("PXQ_CUDA_STAGE_O", "0") && matmul_q8_stage_supported(); /* overlap needs PDL */
    b->fuse_dn = !env_is("PXQ_CUDA_FUSE_DN", "0");
    b->early_trigger = getenv("PXQ_CUDA_EARLY_TRIGGER") ? atoi(getenv("PXQ_CUDA_EARLY_TRIGGER")) : 11;
    b->ahead2 = getenv("PXQ_CUDA_MV_AHEAD") ? atoi(getenv("PXQ_CUDA_MV_AHEAD")) : 1;
    if (env_pair("PXQ_CUDA_MMA_TUNE", &tune_a, &tune_b)) /* "m-tiles,warps" of the 3..16-token int8 mma mat-vec */
        matmul_q8_mma_tune(tune_a, tune_b);
    b->moe_mma = !exact && !env_is("PXQ_CUDA_MOE_MMA", "0"); /* MoE prefill on int8 tensor cores (moe_ffn) */
    if (env_pair("PXQ_CUDA_MOE_MMA_TUNE", &tune_a, &tune_b)) /* its "m-tiles,warps" */
        moe_q8_mma_tune(tune_a, tune_b);
    if (getenv("PXQ_CUDA_MOE_Q8_R")) moe_q8_tune(atoi(getenv("PXQ_CUDA_MOE_Q8_R"))); /* decode experts' rows a block */
    if (getenv("PXQ_CUDA_GEMV_FILL")) matmul_gemv_tune(atoi(getenv("PXQ_CUDA_GEMV_FILL"))); /* A/B: 0 = 4 rows */
    {
        cuda_kv probe = {};
        probe.kv_f32 = exact, probe.n_head_kv = hp->n_head_kv, probe.head_dim = hd, probe.kv_dim = hp->n_head_kv * hd;
        b->prefill_attn = !env_is("PXQ_CUDA_FLASH", "0") && attention_prefill_supported(&probe, hp->n_head) &&
                          attention_prefill_prepare(hd) == 0;
        b->decode_attn = !env_is("PXQ_CUDA_DECODE_MMA", "0") && attention_decode_supported(&probe, hp->n_head);
    }
    b->n_sm = prop.multiProcessorCount;
    b->l2_size = (size_t)prop.l2CacheSize;
    if (cuda_pdl_supported()) { /* the bulk prefetch is sm_90+, as PDL: the same gate. 4 MiB from a sweep
                                 * (H200, decode b1, t/s at 0/4/8/12 MiB): Qwen3-32B 154.5/155.8/155.7/152.2,
                                 * Qwen3.5-27B 177.0/179.9/179.0/172.7; 16 MiB and more is slower (the
                                 * prefetch then competes with the mat-vec it rides on) */
        double mib = 4;
        int blocks = 4 * b->n_sm;
        if (getenv("PXQ_CUDA_L2_PREFETCH")) sscanf(getenv("PXQ_CUDA_L2_PREFETCH"), "%lf,%d", &mib, &blocks);
        b->l2_pf_bytes = mib > 0 ? (size_t)(mib * 1048576.0) : 0;
        b->l2_pf_blocks = blocks > 0 ? blocks : 1;
    }
    /* decode attention splits: at most one wave of two blocks per SM (Qwen3-32B at 32K on an H200, t/s
     * with 1/2/3/6 blocks per SM: 99.3/104.9-105.2/103.4-104.2/85.6; three is the (16, 2)
     * configuration's occupancy; Qwen3.5-27B at 16K keeps its 64 splits of 256) */
    b->split_blocks = getenv("PXQ_CUDA_SPLIT_BLOCKS") ? atoi(getenv("PXQ_CUDA_SPLIT_BLOCKS")) : 2;
    if (b->split_blocks < 1) b->split_blocks = 1;
    b->arena_size = arena_size;
    if (cudaMalloc((void **)&b->arena, arena_size) != cudaSuccess) {
        free(b);
        return set_err(err, errlen, "cudaMalloc of the %.2f GiB arena failed", arena_size / gib);
    }
    e->backend = b;
    { /* the GEMM stream before the tile stream: the GEMM's blocks go out first, the next tile's
       * dequantization fills the SMs the GEMM leaves (cublasSetSmCountTarget below); tuning knob
       * PXQ_CUDA_DEQ_PRIO=deq reverses it, =same gives both the default priority */
        int lo = 0, hi = 0;
        CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
        const char *pr = getenv("PXQ_CUDA_DEQ_PRIO");
        const int p_st = !pr || !strcmp(pr, "gemm") ? hi : lo, p_deq = pr && !strcmp(pr, "deq") ? hi : lo;
        CK(cudaStreamCreateWithPriority(&b->st, cudaStreamNonBlocking, p_st));
        CK(cudaStreamCreateWithPriority(&b->st_deq, cudaStreamNonBlocking, p_deq));
    }
    for (int i = 0; i < 2; i++) {
        CK(cudaEventCreateWithFlags(&b->deq_done[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&b->gemm_done[i], cudaEventDisableTiming));
        CK(cudaEventRecord(b->gemm_done[i], b->st));
    }
    CK(cudaEventCreateWithFlags(&b->gemm_ready, cudaEventDisableTiming));
    b->deq_defer_on = !env_is("PXQ_CUDA_DEQ_DEFER", "0");
    if (cublasCreate(&b->cublas) != CUBLAS_STATUS_SUCCESS) die("cublasCreate failed");
    cublasSetStream(b->cublas, b->st);
    { /* prefill GEMMs sized for 7/8 of the SMs, so the next tile's dequantization runs beside them
       * (Qwen3-32B pp512 on an H200: 6445 t/s at 116 of 132 SMs, 6155 with all); tuning knob
       * PXQ_CUDA_SM_TARGET (0: all) */
        const char *t = getenv("PXQ_CUDA_SM_TARGET");
        const int target = t ? atoi(t) : b->n_sm - b->n_sm / 8;
        if (target > 0 && target < b->n_sm) cublasSetSmCountTarget(b->cublas, target);
    }
    b->cublas_ws = arena_get(b, CUDA_CUBLAS_WS);
    cublasSetWorkspace(b->cublas, b->cublas_ws, CUDA_CUBLAS_WS);

    /* weights */
    uploader u = {};
    for (int i = 0; i < 2; i++) {
        CK(cudaMallocHost((void **)&u.stage[i], STAGE_BYTES));
        CK(cudaEventCreate(&u.done[i]));
        CK(cudaEventRecord(u.done[i], b->st));
    }
    const size_t d = (size_t)hp->n_embd, kv_dim = (size_t)hp->n_head_kv * hd;
    b->L = (cuda_layer *)xcalloc((size_t)hp->n_layer, sizeof *b->L);
    size_t max_in = d, max_mat = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const struct pxq_layer *L = model_layer(e->m, il);
        cuda_layer *cl = &b->L[il];
        const struct pxq_tensor *mats[CM_COUNT];
        cuda_layer_mats(L, mats);
        const int dn = hp->layer_kind[il] == LAYER_DELTANET;
        /* stacks: one launch where the layer has several matmuls of the same input and type */
        struct { const struct pxq_tensor *t[3]; int n, first; cuda_weight *w; } st[3] = {
            {{mats[CM_Q], mats[CM_K], mats[CM_V]}, 3, CM_Q, &cl->qkv},
            {{mats[CM_GATE], mats[CM_UP]}, 2, CM_GATE, &cl->gu},
            {{mats[CM_SSM_BETA], mats[CM_SSM_ALPHA]}, 2, CM_SSM_BETA, &cl->ba}};
        int stacked[CM_COUNT] = {0};
        cl->router.fmt = cl->moe_gu.fmt = cl->moe_gate.fmt = cl->moe_up.fmt = cl->moe_down.fmt = -1;
        if (hp->n_expert) upload_moe(e, b, &u, L, cl);
        cl->dn_in.fmt = cl->qgkv.fmt = -1;
        const struct pxq_tensor *qgkv[3] = {mats[CM_Q], mats[CM_K], mats[CM_V]};
        if (!dn && hp->attn_output_gate && stackable(qgkv, 3) && !env_is("PXQ_CUDA_STACK", "0")) {
            upload_stacked(e, b, &u, qgkv, 3, &cl->qgkv);
            const int r_q = (int)qgkv[0]->ne[1], r_k = (int)qgkv[1]->ne[1];
            cl->w[CM_Q] = weight_rows(cl->qgkv, 0, r_q);
            cl->w[CM_K] = weight_rows(cl->qgkv, r_q, r_k);
            cl->w[CM_V] = weight_rows(cl->qgkv, r_q + r_k, cl->qgkv.n_out - r_q - r_k);
            for (int i = CM_Q; i <= CM_V; i++) stacked[i] = 1;
        }
        const struct pxq_tensor *dn_in[4] = {mats[CM_SSM_QKV], mats[CM_SSM_Z], mats[CM_SSM_BETA], mats[CM_SSM_ALPHA]};
        if (dn && stackable(dn_in, 4) && !env_is("PXQ_CUDA_STACK", "0")) { /* a decode token's one launch */
            upload_stacked(e, b, &u, dn_in, 4, &cl->dn_in);
            const int r_qkv = (int)dn_in[0]->ne[1], r_z = (int)dn_in[1]->ne[1];
            cl->w[CM_SSM_QKV] = weight_rows(cl->dn_in, 0, r_qkv);
            cl->w[CM_SSM_Z] = weight_rows(cl->dn_in, r_qkv, r_z);
            cl->ba = weight_rows(cl->dn_in, r_qkv + r_z, cl->dn_in.n_out - r_qkv - r_z);
            for (int i = CM_SSM_QKV; i <= CM_SSM_ALPHA; i++) stacked[i] = 1;
        }
        for (int k = 0; k < 3; k++) {
            if (k == 2 && cl->dn_in.fmt >= 0) continue; /* beta|alpha: rows of dn_in */
            st[k].w->fmt = -1;
            const int ok = stackable(st[k].t, st[k].n) && (k != 0 || (!dn && !hp->attn_output_gate)) && (k != 2 || dn);
            if (!ok || env_is("PXQ_CUDA_STACK", "0")) continue;
            upload_stacked(e, b, &u, st[k].t, st[k].n, st[k].w);
            for (int i = 0; i < st[k].n; i++) stacked[st[k].first + i] = 1;
        }
        for (int i = 0; i < CM_COUNT; i++) {
            const int view = (cl->dn_in.fmt >= 0 && (i == CM_SSM_QKV || i == CM_SSM_Z)) ||
                             (cl->qgkv.fmt >= 0 && i >= CM_Q && i <= CM_V); /* set above */
            if (!view) cl->w[i].fmt = -1;
            if (!mats[i] || (i < CM_GATE || i > CM_DOWN ? (i >= CM_SSM_QKV) != dn : 0)) continue;
            if ((size_t)mats[i]->ne[0] > max_in) max_in = (size_t)mats[i]->ne[0];
            size_t ne = (size_t)mats[i]->ne[0] * (size_t)mats[i]->ne[1];
            if (ne > max_mat) max_mat = ne;
            if (!stacked[i]) upload_weight(e, b, &u, mats[i], &cl->w[i]);
        }
        const struct layer_f32 *w = &e->lw[il];
        const float *src[CV_COUNT] = {w->attn_norm, w->ffn_norm, w->q_norm, w->k_norm, w->bq, w->bk, w->bv,
                                      w->ssm_a, w->ssm_dt, w->ssm_norm, w->ssm_conv1d};
        size_t vn[CV_COUNT];
        cuda_layer_vec_sizes(hp, L, il, vn);
        for (int i = 0; i < CV_COUNT; i++) {
            const int stacked_bias = cl->qkv.fmt >= 0 && i >= CV_BQ && i <= CV_BV; /* in bqkv instead */
            cl->v[i] = vn[i] && !stacked_bias ? upload_f32(b, src[i], vn[i]) : NULL;
        }
        if (cl->qkv.fmt >= 0 && (w->bq || w->bk || w->bv)) { /* biases side by side, as the stacked rows */
            const size_t qd = (size_t)hp->n_head * hd;
            float *h = (float *)xcalloc(qd + 2 * kv_dim, sizeof(float));
            if (w->bq) memcpy(h, w->bq, qd * sizeof(float));
            if (w->bk) memcpy(h + qd, w->bk, kv_dim * sizeof(float));
            if (w->bv) memcpy(h + qd + kv_dim, w->bv, kv_dim * sizeof(float));
            cl->bqkv = upload_f32(b, h, qd + 2 * kv_dim);
            free(h);
        }
    }
    if (model_output(e->m) != model_token_embd(e->m)) {
        /* untied: the embedding table is only gathered (a few rows per step), so it stays in mapped
         * pinned host memory and the kernels read its rows over PCIe (Qwen3.5-27B: 682 MiB of Q4_0
         * out of the arena); lm_head has its own weight on the device */
        const struct pxq_tensor *t = model_token_embd(e->m);
        cuda_weight *w = &b->embd;
        w->fmt = cuda_wfmt_of(t->type);
        w->n_in = (int)t->ne[0];
        w->n_out = (int)t->ne[1];
        size_t qb, sb;
        cuda_weight_sizes(w->fmt, t->ne[0], t->ne[1], &qb, &sb);
        const size_t qa = (qb + CUDA_ALIGN - 1) / CUDA_ALIGN * CUDA_ALIGN;
        if (cudaHostAlloc((void **)&b->embd_host, qa + sb, cudaHostAllocMapped) != cudaSuccess)
            die("cudaHostAlloc of %.1f MiB for the embedding table failed", (qa + sb) / 1048576.0);
        uint8_t *dp;
        CK(cudaHostGetDevicePointer((void **)&dp, b->embd_host, 0));
        upload_rows(e, b, &u, t, b->embd_host, sb ? b->embd_host + qa : NULL);
        w->q = dp;
        w->s = sb ? dp + qa : NULL;
        upload_weight(e, b, &u, model_output(e->m), &b->output);
    } else {
        upload_weight(e, b, &u, model_token_embd(e->m), &b->embd);
        b->output = b->embd;
    }
    {
        size_t ne = (size_t)b->output.n_in * (size_t)b->output.n_out;
        if (ne > max_mat) max_mat = ne;
    }
    b->output_norm = upload_f32(b, e->output_norm, d);
    b->inv_freq = upload_f32(b, e->inv_freq, (size_t)(hp->n_rot / 2 + 1));
    CK(cudaStreamSynchronize(b->st));
    for (int i = 0; i < 2; i++) {
        CK(cudaFreeHost(u.stage[i]));
        CK(cudaEventDestroy(u.done[i]));
    }

    /* KV: the layout of kvcache.h, f16 (f32 in exact mode) */
    cuda_kv *kv = &b->kv;
    kv->kv_f32 = exact;
    kv->n_layer_kv = e->kv.n_layer_kv;
    kv->block_size = e->kv.block_size;
    kv->n_head_kv = hp->n_head_kv;
    kv->head_dim = hd;
    kv->kv_dim = (int)kv_dim;
    size_t kv_bytes = (size_t)e->kv.n_blocks * kv->n_layer_kv * kv->block_size * kv_dim * (exact ? 4 : 2);
    kv->k = arena_get(b, kv_bytes);
    kv->v = arena_get(b, kv_bytes);

    /* activations, inputs, workspace, state: sizes from cuda_bufs_of, as the plan counted them */
    struct cuda_bufs bf;
    cuda_bufs_of(hp, &e->p, max_in, max_mat, plan.w16_max, &bf);
    const size_t nb = (size_t)e->p.n_batch;
    b->nb = (int)nb;
    b->max_blocks = (e->p.n_ctx + e->p.kv_block_size - 1) / e->p.kv_block_size;
    b->n_tab = (int)(nb < (size_t)e->p.n_seq_max ? nb : (size_t)e->p.n_seq_max);
    b->max_splits = (e->p.n_ctx + CUDA_SPLIT_LEN - 1) / CUDA_SPLIT_LEN;
    if (bf.state) {
        b->rstate = arena_f32(b, bf.state);
        b->rstate_floats = bf.rstate;
    }
    b->x = arena_f32(b, bf.x);
    b->xb = arena_f32(b, bf.xb);
    b->xb2 = arena_f32(b, bf.xb2);
    b->q = arena_f32(b, bf.qkv); /* q, k, v side by side: also the stacked q|k|v matmul's output */
    b->k = b->q + nb * (size_t)hp->n_head * hd;
    b->v = b->k + nb * kv_dim;
    b->att = arena_f32(b, bf.att);
    b->hb = arena_f32(b, bf.hb);  /* [nb][2 ff] (gate, up, or the stacked gate|up output), then hb2 [nb][ff] */
    b->hb2 = b->hb + 2 * nb * (size_t)hp->n_ff;
    b->hb_floats = bf.hb;
    b->logits = arena_f32(b, bf.logits);
    if (bf.moe_hb) {
        b->moe_logits = arena_f32(b, bf.moe_logits);
        b->moe_ids = (int32_t *)arena_get(b, bf.moe_ids * 4);
        b->moe_order = b->moe_ids + nb * hp->n_expert_used;
        b->moe_tiles = b->moe_order + nb * hp->n_expert_used;
        b->moe_ntiles = b->moe_tiles + 3 * (size_t)moe_max_tiles((int)nb * hp->n_expert_used, hp->n_expert);
        b->moe_w = arena_f32(b, bf.moe_w);
        b->moe_hb = arena_f32(b, bf.moe_hb);
        b->moe_hb_floats = bf.moe_hb;
        b->moe_y = arena_f32(b, bf.moe_y);
    }
    if (bf.qg) b->qg = arena_f32(b, bf.qg);
    if (bf.ssm_qkv) {
        b->ssm_qkv = arena_f32(b, bf.ssm_qkv);
        b->ssm_conv = arena_f32(b, bf.ssm_conv);
        b->ssm_z = arena_f32(b, bf.ssm_z);
        b->ssm_ba = arena_f32(b, bf.ssm_ba);
        b->ssm_o = arena_f32(b, bf.ssm_o);
        b->ssm_count = (int *)arena_get(b, bf.ssm_count * 4);
        CK(cudaMemsetAsync(b->ssm_count, 0, bf.ssm_count * 4, b->st)); /* deltanet_decode_cuda leaves it 0 */
    }
    b->in_d = (int32_t *)arena_get(b, bf.in_ints * 4);
    CK(cudaMallocHost((void **)&b->in_h, bf.in_ints * 4));
    int32_t *base[2] = {b->in_d, b->in_h};
    step_inputs *si[2] = {&b->di, &b->hi};
    for (int i = 0; i < 2; i++) {
        int32_t *p = base[i];
        *si[i] = step_inputs{p, p + nb, p + 2 * nb, p + 3 * nb, p + 4 * nb, p + 5 * nb, p + 6 * nb + 1, p + 7 * nb + 1,
                             p + 9 * nb + 1};
    }
    kv->block_tab = b->di.tab;
    kv->max_blocks = b->max_blocks;
    b->seq_map = (int *)xmalloc((size_t)e->p.n_seq_max * sizeof(int));
    b->x16 = arena_get(b, bf.x16 * 2);
    b->xq = (int8_t *)arena_get(b, bf.xq);
    b->xds = arena_f32(b, bf.xds);
    b->w16_elems = bf.w16;
    b->w16_half = b->w16_elems / 2;
    if (getenv("PXQ_CUDA_TILE")) { /* tuning knob: elements per prefill weight tile (at most the plan's) */
        const size_t t = (size_t)strtoull(getenv("PXQ_CUDA_TILE"), NULL, 10);
        if (t > 0 && t < b->w16_half) b->w16_half = t;
    }
    b->w16 = arena_get(b, b->w16_elems * 2);
    b->part_o = arena_f32(b, bf.part_o);
    b->part_ml = arena_f32(b, bf.part_ml);
    if (b->peak > plan.total) die("CUDA arena: used %zu bytes, plan %zu", b->peak, plan.total);
    snprintf(b->path, sizeof b->path, "cuda");
    return 0;
}

extern "C" void cuda_backend_free(struct pxq_engine *e) {
    cuda_backend *b = B(e);
    if (!b) return;
    cudaStreamSynchronize(b->st);
    for (int i = 0; i < b->n_graphs; i++) cudaGraphExecDestroy(b->g[i].exec);
    cublasDestroy(b->cublas);
    cudaStreamSynchronize(b->st_deq);
    for (int i = 0; i < 2; i++) cudaEventDestroy(b->deq_done[i]), cudaEventDestroy(b->gemm_done[i]);
    cudaEventDestroy(b->gemm_ready);
    cudaStreamDestroy(b->st_deq);
    cudaStreamDestroy(b->st);
    cudaFree(b->arena);
    if (b->embd_host) cudaFreeHost(b->embd_host);
    cudaFreeHost(b->in_h);
    free(b->seq_map);
    free(b->L);
    free(b);
    e->backend = NULL;
}

extern "C" float *cuda_host_floats(size_t n) {
    void *p = NULL;
    if (cudaMallocHost(&p, n * sizeof(float)) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (float *)p;
}

extern "C" void cuda_host_free(void *p) {
    if (p) (void)cudaFreeHost(p);
}

extern "C" size_t cuda_backend_peak(const struct pxq_engine *e) { return B(e)->peak; }
extern "C" const char *cuda_backend_device(const struct pxq_engine *e) { return B(e)->name; }
extern "C" const char *cuda_backend_path(const struct pxq_engine *e) { return B(e)->path; }

/* ---- the forward ---- */

/* The first rows of w, up to b->l2_pf_bytes of codes and scales, as spans to prefetch into L2 (none
 * if w is NULL or absent, or the prefetch is off). */
static cuda_l2_prefetch l2_span(const cuda_backend *b, const cuda_weight *w) {
    cuda_l2_prefetch pf = {{NULL, NULL}, {0, 0}, 0};
    if (!w || w->fmt < 0 || !b->l2_pf_bytes || !b->l2_pf_step) return pf;
    size_t qb, sb;
    cuda_weight_sizes(w->fmt, w->n_in, w->n_out, &qb, &sb);
    if (qb + sb > b->l2_pf_bytes) {
        const int64_t rows = (int64_t)((double)w->n_out * (double)b->l2_pf_bytes / (double)(qb + sb));
        cuda_weight_sizes(w->fmt, w->n_in, rows, &qb, &sb);
    }
    pf.p[0] = w->q, pf.bytes[0] = qb;
    pf.p[1] = w->s, pf.bytes[1] = w->s ? sb : 0;
    pf.n_blocks = b->l2_pf_blocks;
    return pf;
}

/* The dp4a flags of the mat-vec at site (a bit of early_trigger / ahead2's masks). */
static int mv_flags(const cuda_backend *b, int site) {
    return (b->early_trigger & site ? MATMUL_Q8_LAUNCH_NEXT : 0) | (b->ahead2 & site ? MATMUL_Q8_AHEAD2 : 0);
}

/* Whether an n-token decode step's q8 mat-vec of format fmt runs on the int8 tensor cores (else dp4a):
 * steps past dp4a_tokens, where the device and format allow it. */
static int mma_step(const cuda_backend *b, int n, int fmt) {
    return b->mma && n > b->dp4a_tokens && matmul_q8_mma_supported(fmt);
}

/* matmul_cpu's twin, y (+)= W x, output rows of stride ldy: for decode the q8 mat-vec (b->xq holds
 * x quantized, q8 != 0) or the fp32 mat-vec (exact mode, formats without a q8 kernel); for prefill,
 * weight rows dequantized to f16 in tiles and cublasGemmEx (f16 in, fp32 accumulate and out).
 * accumulate fuses the residual. */
static void matmul_ld(cuda_backend *b, float *y, const cuda_weight *w, const float *x, int n, int q8, int accumulate,
                      int ldy, const cuda_weight *next = NULL, int flags = 0) {
    if (n <= CUDA_DECODE_MAX || b->exact) {
        if (q8 && mma_step(b, n, w->fmt)) {
            matmul_q8_mma_cuda(y, w, b->xq, b->xds, n, ldy, accumulate, b->st);
        } else if (q8 && matmul_q8_supported(w->fmt)) {
            const cuda_l2_prefetch pf = l2_span(b, next);
            matmul_q8_pf_cuda(y, w, b->xq, b->xds, n, ldy, accumulate, pf.n_blocks ? &pf : NULL, flags, b->st);
        } else {
            matmul_gemv_cuda(y, w, x, n, ldy, accumulate, b->st);
        }
        return;
    }
    const int n_in = w->n_in, n_out = w->n_out;
    if (x != b->x16_src) { /* q, k, v (or DeltaNet's qkv, z, b|a) of one x: converted once */
        f32_to_f16_cuda(b->x16, x, (int64_t)n * n_in, b->st);
        b->x16_src = x;
    }
    const size_t half = b->w16_half;
    /* tiles of equal size, rows a multiple of 128 where they can be: y + r0 and the f16 tile stay
     * 16-byte aligned, so cuBLAS picks its aligned tensor-core kernels (an odd r0 costs ~6x) */
    int64_t rows = n_out;
    if (w->fmt != WFMT_F16) {
        const int64_t cap = (int64_t)(half / (size_t)n_in);
        if (cap < 1) die("prefill tile smaller than one row");
        const int64_t n_tiles = (n_out + cap - 1) / cap;
        rows = (n_out + n_tiles - 1) / n_tiles;
        rows = (rows + 127) / 128 * 128;
        if (rows > cap) rows = cap >= 128 ? cap / 128 * 128 : cap;
    }
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    for (int64_t r0 = 0; r0 < n_out; r0 += rows) {
        const int i = b->tile_next; /* alternate across calls too: K's tile overlaps Q's GEMM */
        b->tile_next ^= 1;
        int rc = (int)(n_out - r0 < rows ? n_out - r0 : rows);
        const void *A;
        if (w->fmt == WFMT_F16) {
            A = (const uint16_t *)w->q + (size_t)r0 * n_in;
        } else { /* dequantize tile into half i once its last GEMM is over, overlapping the running GEMM */
            uint16_t *wt = (uint16_t *)b->w16 + (size_t)i * half;
            CK(cudaStreamWaitEvent(b->st_deq, b->gemm_done[i], 0));
            if (b->deq_after) CK(cudaStreamWaitEvent(b->st_deq, b->gemm_ready, 0));
            b->deq_after = 0;
            dequant_rows_cuda(wt, 1, w, NULL, r0, rc, b->st_deq);
            CK(cudaEventRecord(b->deq_done[i], b->st_deq));
            CK(cudaStreamWaitEvent(b->st, b->deq_done[i], 0));
            A = wt;
            if (b->deq_defer) { /* the next tile's dequantization starts with this GEMM */
                CK(cudaEventRecord(b->gemm_ready, b->st));
                b->deq_after = 1;
            }
        }
        b->deq_defer = 0;
        /* column-major view: y^T[n_out x n] = W[n_in x n_out]^T x^T[n_in x n] */
        cublasStatus_t s = cublasGemmEx(b->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rc, n, n_in, &one, A, CUDA_R_16F, n_in,
                                        b->x16, CUDA_R_16F, n_in, &beta, y + r0, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) die("cublasGemmEx failed (%d)", (int)s);
        if (w->fmt != WFMT_F16) CK(cudaEventRecord(b->gemm_done[i], b->st));
    }
}

/* matmul_ld with rows of n_out; next: the weight the step's next mat-vec reads (L2 prefetch), or NULL;
 * flags: the dp4a kernel's MATMUL_Q8_* (ops_cuda.h): MATMUL_Q8_LAUNCH_NEXT lets the next kernel launch
 * at its start (b->early_trigger), MATMUL_Q8_STAGE stages the weight (b->stage_o) */
static void matmul_cuda(cuda_backend *b, float *y, const cuda_weight *w, const float *x, int n, int q8, int accumulate,
                        const cuda_weight *next = NULL, int flags = 0) {
    matmul_ld(b, y, w, x, n, q8, accumulate, w->n_out, next, flags);
}

/* q8 form of x for the next mat-vec when it has a q8 kernel (xq NULL otherwise) */
static int8_t *q8_for(cuda_backend *b, int q8, const cuda_weight *w) {
    return q8 && matmul_q8_supported(w->fmt) ? b->xq : NULL;
}

struct step {
    int n, n_out, n_split, split_len, n_runs, n_tiles, q8;
};

/* Causal attention of q over KV layer l into b->att: the tensor-core flash attention for prefill
 * steps where the device and shapes allow it, else split-K flash-decoding. to_gemm: the output feeds
 * the o projection's prefill GEMM as it is (no gate, not exact mode), so the prefill kernel writes
 * its half operand (b->x16) instead of b->att. Returns 1 if it also wrote xq (b->xds), the q8 form
 * of b->att (xq != NULL and the tensor-core decode kernel ran). */
static int attention(cuda_backend *b, const float *q, int l, int n_head, const step &s, int8_t *xq, int to_gemm) {
    if (s.n_tiles > 0 && to_gemm && !b->exact && s.n > CUDA_DECODE_MAX) {
        attention_prefill_cuda(b->x16, 1, q, &b->kv, l, b->di.pos, b->di.seq, b->di.tiles, s.n_tiles, n_head, b->st);
        b->x16_src = b->att; /* matmul_ld: x16 holds att's half form */
    } else if (s.n_tiles > 0) {
        attention_prefill_cuda(b->att, 0, q, &b->kv, l, b->di.pos, b->di.seq, b->di.tiles, s.n_tiles, n_head, b->st);
    } else if (b->decode_attn && s.n <= CUDA_DECODE_MAX) { /* the q8 form too: no quantize launch */
        attention_decode_cuda(b->att, xq, b->xds, q, &b->kv, l, b->di.pos, b->di.seq, s.n, n_head, s.n_split,
                              s.split_len, b->part_o, b->part_ml, b->st);
        return xq != NULL;
    } else {
        attention_cuda(b->att, q, &b->kv, l, b->di.pos, b->di.seq, s.n, n_head, s.n_split, s.split_len, b->part_o,
                       b->part_ml, b->st);
    }
    return 0;
}

/* The weight of layer il's first mat-vec in an n-token step (the output head past the last layer),
 * and of its feed-forward's first (NULL for MoE): what the mat-vec before each prefetches. The
 * layers pick their stacked one-launch path by it, so the choice is made here alone. */
static const cuda_weight *first_weight(const struct pxq_engine *e, const cuda_backend *b, int il, int n) {
    if (il >= e->hp->n_layer) return &b->output;
    const cuda_layer *L = &b->L[il];
    if (e->hp->layer_kind[il] == LAYER_DELTANET)
        return n == 1 && L->dn_in.fmt >= 0 ? &L->dn_in : &L->w[CM_SSM_QKV];
    if (L->qkv.fmt >= 0) return &L->qkv;
    return e->hp->attn_output_gate && n == 1 && L->qgkv.fmt >= 0 ? &L->qgkv : &L->w[CM_Q];
}
static const cuda_weight *ffn_weight(const struct pxq_engine *e, const cuda_layer *L) {
    if (e->hp->n_expert) return NULL;
    return L->gu.fmt >= 0 ? &L->gu : &L->w[CM_GATE];
}

/* Llama / Qwen2 / Qwen3 attention, and Qwen3.5's gated attention (q_proj gives [query | gate] per
 * head; partial NeoX RoPE; output times sigmoid(gate); forward_qwen35.c), x += o_proj(...). */
static void attention_layer(struct pxq_engine *e, cuda_backend *b, const cuda_layer *L, int il, const step &s) {
    const struct pxq_hparams *hp = e->hp;
    const int n = s.n, hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    const int l = e->kv_layer[il], gated = hp->attn_output_gate;
    const int neox = gated || hp->rope_style == ROPE_NEOX;
    cudaStream_t st = b->st;
    int8_t *xq = q8_for(b, s.q8, &L->w[CM_O]);
    int8_t *xq_att = gated ? NULL : xq; /* gated: the q8 form is of att times the gate */
    int att_q8;
    /* o_proj's weights into L2 during the attention, unless its KV stream would evict them */
    const size_t kv_bytes = (size_t)s.n_split * s.split_len * kv_dim * 2 * (b->kv.kv_f32 ? 4 : 2);
    const cuda_weight *o_next = kv_bytes <= b->l2_size / 4 ? &L->w[CM_O] : NULL;
    /* the q/k norm and the attention launch under the projection */
    const int early = mv_flags(b, 1);
    if (L->qkv.fmt >= 0) { /* one launch: token row = [q | k | v]; normed, roped q goes to xb2 */
        const int ld = q_dim + 2 * kv_dim;
        float *qkv = b->q, *q_out = b->xb2;
        matmul_cuda(b, qkv, &L->qkv, b->xb, n, s.q8, 0, o_next, early);
        if (L->bqkv) add_bias_cuda(qkv, L->bqkv, n, ld, st);
        qk_norm_rope_store_cuda(q_out, qkv, qkv + q_dim, qkv + q_dim + kv_dim, ld, ld, L->v[CV_Q_NORM],
                                L->v[CV_K_NORM], hp->rms_eps, hp->n_head, hp->n_rot, b->di.pos, b->inv_freq, neox,
                                &b->kv, l, b->di.seq, n, st);
        att_q8 = attention(b, q_out, l, hp->n_head, s, xq_att, !gated);
    } else {
        float *k = b->k, *v = b->v;
        if (first_weight(e, b, il, n) == &L->qgkv) { /* one launch: the token's [q_proj | k | v] (qg has room) */
            matmul_cuda(b, b->qg, &L->qgkv, b->xb, 1, s.q8, 0, o_next, early);
            k = b->qg + 2 * (size_t)q_dim, v = k + kv_dim;
        } else {
            matmul_cuda(b, gated ? b->qg : b->q, &L->w[CM_Q], b->xb, n, s.q8, 0);
            matmul_cuda(b, k, &L->w[CM_K], b->xb, n, s.q8, 0);
            matmul_cuda(b, v, &L->w[CM_V], b->xb, n, s.q8, 0, o_next, early);
        }
        if (gated) split_q_gate_cuda(b->q, b->xb2, b->qg, n, hp->n_head, hd, st);
        if (L->v[CV_BQ]) add_bias_cuda(b->q, L->v[CV_BQ], n, q_dim, st);
        if (L->v[CV_BK]) add_bias_cuda(k, L->v[CV_BK], n, kv_dim, st);
        if (L->v[CV_BV]) add_bias_cuda(v, L->v[CV_BV], n, kv_dim, st);
        /* q/k norm (before RoPE), RoPE, and the KV store: one kernel */
        qk_norm_rope_store_cuda(b->q, b->q, k, v, q_dim, kv_dim, L->v[CV_Q_NORM], L->v[CV_K_NORM], hp->rms_eps,
                                hp->n_head, hp->n_rot, b->di.pos, b->inv_freq, neox, &b->kv, l, b->di.seq, n, st);
        att_q8 = attention(b, b->q, l, hp->n_head, s, xq_att, !gated);
    }
    if (gated) sigmoid_gate_cuda(b->att, xq, b->xds, b->xb2, (int64_t)n * q_dim, st);
    else if (xq && !att_q8) quantize_q8_cuda(b->xq, b->xds, b->att, (int64_t)n * q_dim, st);
    /* x += o_proj(att); its weight staged in shared memory while the attention runs (the decode
     * attention lets it launch after its own wait, attention_decode.cu) */
    matmul_cuda(b, b->x, &L->w[CM_O], b->att, n, s.q8, 1, ffn_weight(e, L), b->stage_o ? MATMUL_Q8_STAGE : 0);
}

/* Qwen3.5 Gated DeltaNet (forward_qwen35.c's deltanet_layer_cpu, step for step), x += out_proj(...).
 * The runs (tokens grouped by sequence) and the state slots are in b->di. */
static void deltanet_layer(struct pxq_engine *e, cuda_backend *b, const cuda_layer *L, int il, const step &s) {
    const struct pxq_hparams *hp = e->hp;
    const int n = s.n, nk = hp->ssm_n_k_head, nv = hp->ssm_n_v_head, dk = hp->ssm_head_k_dim, dv = hp->ssm_head_v_dim;
    const int K = hp->ssm_conv_kernel, conv_dim = 2 * nk * dk + nv * dv;
    cudaStream_t st = b->st;
    float *state = b->rstate + (size_t)e->dn_layer[il] * ((size_t)(K - 1) * conv_dim + (size_t)nv * dk * dv);
    const step_inputs &di = b->di;
    float *z = b->ssm_z, *ba = b->ssm_ba;
    int8_t *xq = q8_for(b, s.q8, &L->w[CM_SSM_OUT]);
    /* decode, a token per sequence: the conv, prep, the delta rule and the gated norm in one launch */
    const int fused = b->fuse_dn && n <= CUDA_DECODE_MAX && s.n_runs == n && (!xq || dv % 32 == 0) &&
                      deltanet_decode_cuda_supported(dk, dv, K);
    /* the conv (or the fused step) launches under the in-projection */
    const int early = mv_flags(b, 2);
    if (first_weight(e, b, il, n) == &L->dn_in) { /* one launch: the token's [qkv | z | b | a] (ssm_qkv has room) */
        matmul_cuda(b, b->ssm_qkv, &L->dn_in, b->xb, 1, s.q8, 0, &L->w[CM_SSM_OUT], early);
        z = b->ssm_qkv + conv_dim, ba = z + (size_t)nv * dv;
    } else {
        matmul_cuda(b, b->ssm_qkv, &L->w[CM_SSM_QKV], b->xb, n, s.q8, 0);
        matmul_cuda(b, b->ssm_z, &L->w[CM_SSM_Z], b->xb, n, s.q8, 0);
        if (L->ba.fmt >= 0) { /* one launch: token row = [b | a] */
            matmul_cuda(b, b->ssm_ba, &L->ba, b->xb, n, s.q8, 0, &L->w[CM_SSM_OUT], early);
        } else {
            matmul_ld(b, b->ssm_ba, &L->w[CM_SSM_BETA], b->xb, n, s.q8, 0, 2 * nv);
            matmul_ld(b, b->ssm_ba + nv, &L->w[CM_SSM_ALPHA], b->xb, n, s.q8, 0, 2 * nv, &L->w[CM_SSM_OUT], early);
        }
    }
    /* the conv inside the fused launch where the dp4a in-projection launches it early (under PDL, with
     * int8 activations: its taps, weights and counting before the wait, under the in-projection);
     * else the conv kernel before it: at 16 sequences the fused conv's loads (each tap read by 12
     * blocks on Qwen3.5-27B) and its atomics, in the open after the tensor-core in-projection, cost
     * 2.3% (1139.69 against 1166.09 t/s, H200) */
    const int conv_in = fused && n <= b->dp4a_tokens && (b->early_trigger & 2) && cuda_pdl && s.q8;
    auto conv = [&] {
        ssm_conv_cuda(b->ssm_conv, state, b->rstate_floats, b->ssm_qkv, L->v[CV_SSM_CONV], conv_dim, K, di.run_seq,
                      di.run_off, di.run_tok, s.n_runs, n, st);
    };
    if (!conv_in) conv();
    int *count = b->ssm_count + (size_t)e->dn_layer[il] * CUDA_DECODE_MAX * nk; /* this layer's */
    if (fused && deltanet_decode_cuda(b->ssm_o, xq, b->xds, state, b->rstate_floats, conv_in ? b->ssm_qkv : b->ssm_conv,
                                      conv_in ? L->v[CV_SSM_CONV] : NULL, count, ba, z, L->v[CV_SSM_A], L->v[CV_SSM_DT],
                                      L->v[CV_SSM_NORM], nk, nv, dk, dv, K, conv_dim, hp->ssm_v_tiled, hp->rms_eps,
                                      di.run_seq, di.run_off, di.run_tok, s.n_runs, st) == 0) {
        matmul_cuda(b, b->x, &L->w[CM_SSM_OUT], b->ssm_o, n, s.q8, 1, ffn_weight(e, L)); /* x += out_proj(o) */
        return;
    }
    if (conv_in) conv(); /* the fused launch was refused */
    deltanet_prep_cuda(b->ssm_conv, ba, L->v[CV_SSM_A], L->v[CV_SSM_DT], nk, nv, dk, conv_dim, n, st);
    if (n > CUDA_DECODE_MAX) { /* prefill: the chunked (UT transform) form; its scratch is the FFN's buffer,
                                * free while the token mixer runs (recurrent if too small) */
        const int dense = b->hb_floats > 0;
        gated_delta_rule_chunked_cuda(b->ssm_o, state, b->rstate_floats, b->ssm_conv, ba, nk, nv, dk, dv, K,
                                      conv_dim, hp->ssm_v_tiled, di.run_seq, di.run_off, di.run_tok, s.n_runs, n,
                                      dense ? b->hb : b->moe_hb, dense ? b->hb_floats : b->moe_hb_floats, st);
    } else
        gated_delta_rule_cuda(b->ssm_o, state, b->rstate_floats, b->ssm_conv, ba, nk, nv, dk, dv, K, conv_dim,
                              hp->ssm_v_tiled, di.run_seq, di.run_off, di.run_tok, s.n_runs, st);
    if (xq && dv % 32 == 0) {
        gated_rmsnorm_silu_cuda(b->ssm_o, xq, b->xds, z, L->v[CV_SSM_NORM], n * nv, dv, hp->rms_eps, st);
    } else {
        gated_rmsnorm_silu_cuda(b->ssm_o, NULL, NULL, z, L->v[CV_SSM_NORM], n * nv, dv, hp->rms_eps, st);
        if (xq) quantize_q8_cuda(b->xq, b->xds, b->ssm_o, (int64_t)n * nv * dv, st);
    }
    matmul_cuda(b, b->x, &L->w[CM_SSM_OUT], b->ssm_o, n, s.q8, 1, ffn_weight(e, L)); /* x += out_proj(o) */
}

/* An expert mat-vec over the step's n_pairs (token, slot) pairs (cuda/ops_moe_cuda.h): for prefill
 * steps the expert-sorted tiles (b->moe_order.., from moe_sort_cuda), on the int8 tensor cores when
 * q8 (the activations in b->xq), else in fp32 from x; decode steps one block per pair with int8
 * activations (b->xq) where the step has them and the format a q8 kernel, else fp32 x. */
static void expert_mv(cuda_backend *b, float *y, int ldy, const cuda_weight *w, int rows_per_expert, const float *x,
                      int x_per_pair, int n_pairs, int k, int q8, int max_tiles) {
    if (max_tiles && q8)
        moe_q8_mma_cuda(y, ldy, w, rows_per_expert, b->moe_order, b->moe_tiles, b->moe_ntiles, max_tiles, b->xq, b->xds,
                        x_per_pair, k, b->st);
    else if (max_tiles)
        moe_gemv_tiles_cuda(y, ldy, w, rows_per_expert, b->moe_order, b->moe_tiles, b->moe_ntiles, max_tiles, x,
                            x_per_pair, k, b->st);
    else if (q8 && matmul_q8_supported(w->fmt))
        moe_q8_cuda(y, ldy, w, rows_per_expert, b->moe_ids, b->xq, b->xds, x_per_pair, n_pairs, k, b->st);
    else
        moe_gemv_cuda(y, ldy, w, rows_per_expert, b->moe_ids, x, x_per_pair, n_pairs, k, b->st);
}

/* 1 if every expert weight of L takes moe_q8_mma_cuda (rows per expert: 2 ff for a stacked gate|up,
 * ff for gate and up apart, d for down) */
static int moe_mma_ok(const cuda_layer *L, int ff, int d) {
    const int gu = L->moe_gu.fmt >= 0 ? moe_q8_mma_supported(&L->moe_gu, 2 * ff)
                                      : moe_q8_mma_supported(&L->moe_gate, ff) && moe_q8_mma_supported(&L->moe_up, ff);
    return gu && moe_q8_mma_supported(&L->moe_down, d);
}

/* Qwen3-MoE's sparse FFN (forward_cpu.c's ffn_moe, HF Qwen3MoeSparseMoeBlock), x += sum_j w_j
 * down_j(silu(gate_j(xb)) * up_j(xb)) over the top-k experts j. Routing stays on the device. The
 * router runs on fp32 xb in every mode (a discrete choice: int8 activations could flip near ties).
 * Prefill steps sort the pairs by expert (on the device) and read each expert's rows once per
 * CUDA_MOE_TILE of its pairs. */
static void moe_ffn(struct pxq_engine *e, cuda_backend *b, const cuda_layer *L, const step &s) {
    const struct pxq_hparams *hp = e->hp;
    const int n = s.n, k = hp->n_expert_used, ff = hp->n_ff_exp, d = hp->n_embd, np = n * k;
    cudaStream_t st = b->st;
    matmul_gemv_cuda(b->moe_logits, &L->router, b->xb, n, hp->n_expert, 0, st);
    moe_route_cuda(b->moe_ids, b->moe_w, b->moe_logits, n, hp->n_expert, k, hp->norm_topk_prob, st);
    const int tiles = n > CUDA_DECODE_MAX ? moe_max_tiles(np, hp->n_expert) : 0; /* prefill: sorted by expert */
    if (tiles) moe_sort_cuda(b->moe_order, b->moe_tiles, b->moe_ntiles, b->moe_ids, np, hp->n_expert, st);
    /* prefill on the tensor cores: xb and silu(gate) * up quantized to int8 like a decode step's */
    const int q8 = tiles ? b->moe_mma && moe_mma_ok(L, ff, d) : s.q8;
    if (tiles && q8) quantize_q8_cuda(b->xq, b->xds, b->xb, (int64_t)n * d, st);
    if (tiles) b->moe_tiles_mma &= q8;
    float *gu = b->moe_hb, *h = b->moe_hb + (size_t)np * 2 * ff; /* [np][gate | up], [np][ff] */
    if (L->moe_gu.fmt >= 0) {
        expert_mv(b, gu, 2 * ff, &L->moe_gu, 2 * ff, b->xb, 0, np, k, q8, tiles);
    } else {
        expert_mv(b, gu, 2 * ff, &L->moe_gate, ff, b->xb, 0, np, k, q8, tiles);
        expert_mv(b, gu + ff, 2 * ff, &L->moe_up, ff, b->xb, 0, np, k, q8, tiles);
    }
    swiglu_q8_cuda(tiles && q8 ? NULL : h, q8_for(b, q8, &L->moe_down), b->xds, gu, gu + ff, np, ff, 2 * ff, st);
    expert_mv(b, b->moe_y, d, &L->moe_down, d, h, 1, np, k, q8, tiles);
    moe_combine_cuda(b->x, b->moe_y, b->moe_w, n, k, d, st); /* x += sum_j w_j y_j */
}

/* The pre-norm of a block: xb = rmsnorm(x) * w, with its q8 form for decode mat-vecs (q8) or its
 * half form in x16 for prefill GEMMs (gemm), which makes x16 the form of xb. */
static void gemm_in_norm(cuda_backend *b, const float *w, int d, int n, float eps, int q8, int gemm) {
    if (gemm) {
        rmsnorm_f16_cuda(b->xb, b->x16, b->x, w, d, n, eps, b->st);
        b->x16_src = b->xb;
        b->deq_defer = b->deq_defer_on;
    } else {
        rmsnorm_q8_cuda(b->xb, q8 ? b->xq : NULL, b->xds, b->x, w, d, n, eps, NULL, b->st);
        b->x16_src = NULL;
    }
}

/* Split-K of a decode step's attention (cuda_decode_splits, backend.h). The tensor-core decode
 * attention's splits fill one wave of b->split_blocks blocks per SM, so every block runs at once and
 * they end together: Qwen3-32B at 32K on an H200 (33 splits of 1024 positions, 264 blocks)
 * 104.9-105.2 t/s, against 101.9 for the earlier rule (split_len 256 x 2^k, at most 4 blocks per
 * SM: 64 of 512, 512 blocks, a second wave of the 396 slots). (n_split, split_len) keys the step's
 * graph: a growing context changes it at each power of two, then eight times an octave. */
static void decode_splits(const cuda_backend *b, const struct pxq_hparams *hp, int n_tok, int n_kv, step *s) {
    cuda_decode_splits(n_kv, n_tok, hp->n_head_kv, b->decode_attn, b->split_blocks, b->n_sm, b->max_splits, &s->n_split,
                       &s->split_len);
}

/* forward_cpu, step for step; inputs already in b->in_d. */
static void run_layers(struct pxq_engine *e, cuda_backend *b, const step &s) {
    const struct pxq_hparams *hp = e->hp;
    const int n = s.n, d = hp->n_embd, q8 = s.q8;
    cudaStream_t st = b->st;
    const int gemm = n > CUDA_DECODE_MAX && !b->exact; /* prefill through the f16 GEMM */
    b->x16_src = NULL;
    dequant_rows_cuda(b->x, 0, &b->embd, b->di.tok, 0, n, st);
    for (int il = 0; il < hp->n_layer; il++) {
        const cuda_layer *L = &b->L[il];
        gemm_in_norm(b, L->v[CV_ATTN_NORM], d, n, hp->rms_eps, q8, gemm);
        if (hp->layer_kind[il] == LAYER_DELTANET) deltanet_layer(e, b, L, il, s);
        else attention_layer(e, b, L, il, s);
        /* feed-forward */
        gemm_in_norm(b, L->v[CV_FFN_NORM], d, n, hp->rms_eps, q8, gemm);
        if (hp->n_expert) {
            moe_ffn(e, b, L, s);
            continue;
        }
        const int ff = hp->n_ff;
        int8_t *xq_down = q8_for(b, q8, &L->w[CM_DOWN]);
        /* the SwiGLU launches under the gate|up mat-vec */
        const int early = mv_flags(b, 8);
        if (L->gu.fmt >= 0) { /* one launch: token row = [gate | up], into hb; silu(gate) * up into hb2 */
            matmul_cuda(b, b->hb, &L->gu, b->xb, n, q8, 0, &L->w[CM_DOWN], early);
            if (gemm) { /* straight to the down GEMM's half operand */
                swiglu_f16_cuda(b->x16, b->hb, b->hb + ff, n, ff, 2 * ff, st);
                b->x16_src = b->hb2; /* hb2 itself is not written */
                b->deq_defer = b->deq_defer_on;
            } else {
                swiglu_q8_cuda(b->hb2, xq_down, b->xds, b->hb, b->hb + ff, n, ff, 2 * ff, st);
            }
            matmul_cuda(b, b->x, &L->w[CM_DOWN], b->hb2, n, q8, 1, first_weight(e, b, il + 1, n)); /* x += down(...) */
            continue;
        }
        matmul_cuda(b, b->hb, &L->w[CM_GATE], b->xb, n, q8, 0);
        matmul_cuda(b, b->hb2, &L->w[CM_UP], b->xb, n, q8, 0, &L->w[CM_DOWN], early);
        swiglu_q8_cuda(b->hb, xq_down, b->xds, b->hb, b->hb2, n, ff, ff, st);
        matmul_cuda(b, b->x, &L->w[CM_DOWN], b->hb, n, q8, 1, first_weight(e, b, il + 1, n)); /* x += down(...) */
    }
}

/* Final norm of output rows r0.. (gathered through b->di.rows), then lm_head into b->logits. */
static void lm_head(struct pxq_engine *e, cuda_backend *b, const step &s, int r0, int rc) {
    const struct pxq_hparams *hp = e->hp;
    /* a prefill step's few output rows take the decode mat-vec too (int8 where it has a kernel) */
    const int q8 = s.q8 || (!b->exact && rc <= CUDA_DECODE_MAX && hp->n_embd % 32 == 0);
    rmsnorm_q8_cuda(b->xb, q8 ? b->xq : NULL, b->xds, b->x, b->output_norm, hp->n_embd, rc, hp->rms_eps,
                    b->di.rows + r0, b->st);
    b->x16_src = NULL;
    matmul_cuda(b, b->logits, &b->output, b->xb, rc, q8, 0, first_weight(e, b, 0, s.n), /* layer 0: the next step's */
                mv_flags(b, 16));
}

static cudaGraphExec_t graph_get(struct pxq_engine *e, cuda_backend *b, const step &s) {
    for (int i = 0; i < b->n_graphs; i++)
        if (b->g[i].n == s.n && b->g[i].n_out == s.n_out && b->g[i].n_split == s.n_split &&
            b->g[i].split_len == s.split_len && b->g[i].n_runs == s.n_runs)
            return b->g[i].exec;
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal));
    run_layers(e, b, s);
    if (s.n_out) lm_head(e, b, s, 0, s.n_out);
    CK(cudaStreamEndCapture(b->st, &graph));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiateWithFlags(&exec, graph, 0)); /* CUDA 11.4+ and 12+: one signature */
    CK(cudaGraphDestroy(graph));
    int slot;
    if (b->n_graphs < MAX_GRAPHS) {
        slot = b->n_graphs++;
    } else { /* full: replace in turn */
        slot = b->next_evict;
        b->next_evict = (b->next_evict + 1) % MAX_GRAPHS;
        CK(cudaGraphExecDestroy(b->g[slot].exec));
    }
    b->g[slot] = graph_entry{s.n, s.n_out, s.n_split, s.split_len, s.n_runs, exec};
    return exec;
}

/* Host side of the per-step inputs: tokens, positions, compacted sequence ids with their block
 * tables, the output rows, and the runs (tokens grouped by sequence, in batch order). Returns the
 * bytes to copy; fills s's counts. A sequence's DeltaNet state is cleared on its first step. */
static size_t stage_inputs(struct pxq_engine *e, cuda_backend *b, const struct ubatch *ub, step *s, int *first_out,
                           int *max_pos) {
    const step_inputs &h = b->hi;
    const int n = ub->n;
    for (int i = 0; i < e->p.n_seq_max; i++) b->seq_map[i] = -1;
    int n_tab = 0, n_out = 0, first = -1, mp = 0;
    for (int t = 0; t < n; t++) {
        const int sq = ub->seq_id[t];
        if (b->seq_map[sq] < 0) {
            const struct kv_seq *ks = &e->seqs[sq].kv;
            b->seq_map[sq] = n_tab;
            memcpy(h.tab + (size_t)n_tab * b->max_blocks, ks->blocks, (size_t)ks->n_blocks * sizeof(int32_t));
            h.run_seq[n_tab] = sq; /* run i is compact sequence i; the state slot is the sequence id */
            n_tab++;
        }
        h.tok[t] = ub->token[t];
        h.pos[t] = ub->pos[t];
        h.seq[t] = b->seq_map[sq];
        if (ub->pos[t] > mp) mp = ub->pos[t];
        if (ub->out_idx[t] >= 0) {
            if (first < 0) first = ub->out_idx[t];
            h.rows[n_out++] = t;
        }
    }
    if (b->rstate) { /* runs: counting sort of the tokens by compact sequence, batch order kept */
        for (int r = 0; r <= n_tab; r++) h.run_off[r] = 0;
        for (int t = 0; t < n; t++) h.run_off[h.seq[t] + 1]++;
        for (int r = 0; r < n_tab; r++) h.run_off[r + 1] += h.run_off[r];
        for (int r = 0; r < n_tab; r++) h.tiles[r] = h.run_off[r]; /* scratch cursor */
        for (int t = 0; t < n; t++) h.run_tok[h.tiles[h.seq[t]]++] = t;
        for (int r = 0; r < n_tab; r++) {
            struct pxq_seq *sq = &e->seqs[h.run_seq[r]];
            if (!sq->rstate_live) {
                CK(cudaMemsetAsync(b->rstate + (size_t)h.run_seq[r] * b->rstate_floats, 0,
                                   b->rstate_floats * sizeof(float), b->st));
                sq->rstate_live = 1;
            }
        }
    }
    s->n_tiles = n > CUDA_DECODE_MAX && b->prefill_attn ? attention_prefill_tiles(h.tiles, b->nb, h.pos, h.seq, n) : 0;
    s->n = n;
    s->n_out = n_out;
    s->n_runs = b->rstate ? n_tab : 0;
    *first_out = first;
    *max_pos = mp;
    return (size_t)(h.tab - b->in_h) * sizeof(int32_t) + (size_t)n_tab * b->max_blocks * sizeof(int32_t);
}

extern "C" void forward_cuda(struct pxq_engine *e, const struct ubatch *ub) {
    cuda_backend *b = B(e);
    step s = {};
    int first = -1, max_pos = 0;
    const size_t in_bytes = stage_inputs(e, b, ub, &s, &first, &max_pos);
    CK(cudaMemcpyAsync(b->in_d, b->in_h, in_bytes, cudaMemcpyHostToDevice, b->st));
    const cuda_layer &L0 = b->L[0];
    const int f0 = L0.gu.fmt >= 0         ? L0.gu.fmt
                   : L0.w[CM_GATE].fmt >= 0 ? L0.w[CM_GATE].fmt
                   : L0.moe_gu.fmt >= 0     ? L0.moe_gu.fmt
                                            : L0.moe_gate.fmt;
    const char *fmt = cuda_wfmt_name(f0);
    const char *mv = b->exact || !matmul_q8_supported(f0)                                       ? "gemv"
                     : mma_step(b, s.n, f0)                                             ? "q8-mma"
                                                                                            : "q8-dp4a";
    const struct pxq_hparams *hp = e->hp;
    /* int8 activations for the q8 mat-vec: decode, default mode, rows in whole groups of 32 */
    s.q8 = !b->exact && s.n <= CUDA_DECODE_MAX && hp->n_embd % 32 == 0 && hp->n_head * hp->head_dim % 32 == 0 &&
           (hp->n_expert ? hp->n_ff_exp : hp->n_ff) % 32 == 0 && (hp->arch != ARCH_QWEN35 || hp->ssm_n_v_head * hp->ssm_head_v_dim % 32 == 0);
    const size_t row_bytes = (size_t)hp->n_vocab * sizeof(float);
    if (s.n <= CUDA_DECODE_MAX) { /* decode: layers and lm_head in one graph (n_out <= CUDA_LOGITS_ROWS) */
        decode_splits(b, hp, s.n, max_pos + 1, &s);
        cuda_pdl = b->pdl && s.n <= b->pdl_tokens; /* each kernel's launch and first loads overlap the one before */
        b->l2_pf_step = s.n <= b->dp4a_tokens; /* the steps of the dp4a mat-vec */
        if (b->graphs) {
            CK(cudaGraphLaunch(graph_get(e, b, s), b->st));
            snprintf(b->path, sizeof b->path, "cuda %s %s graph%s", mv, fmt, cuda_pdl ? " pdl" : "");
        } else {
            run_layers(e, b, s);
            if (s.n_out) lm_head(e, b, s, 0, s.n_out);
            snprintf(b->path, sizeof b->path, "cuda %s %s%s", mv, fmt, cuda_pdl ? " pdl" : "");
        }
        cuda_pdl = 0;
        b->l2_pf_step = 0;
        if (s.n_out)
            CK(cudaMemcpyAsync(e->logits + (size_t)first * hp->n_vocab, b->logits, (size_t)s.n_out * row_bytes,
                               cudaMemcpyDeviceToHost, b->st));
    } else {
        s.n_split = 1;
        s.split_len = e->p.n_ctx;
        b->moe_tiles_mma = 1; /* moe_ffn clears it for a layer whose experts ran in fp32 */
        run_layers(e, b, s);
        for (int r0 = 0; r0 < s.n_out; r0 += CUDA_LOGITS_ROWS) { /* lm_head in chunks of the logits buffer */
            const int rc = s.n_out - r0 < CUDA_LOGITS_ROWS ? s.n_out - r0 : CUDA_LOGITS_ROWS;
            lm_head(e, b, s, r0, rc);
            CK(cudaMemcpyAsync(e->logits + ((size_t)first + r0) * hp->n_vocab, b->logits, (size_t)rc * row_bytes,
                               cudaMemcpyDeviceToHost, b->st));
        }
        snprintf(b->path, sizeof b->path, b->exact ? "cuda gemv-fp32 %s%s" : "cuda cublas-f16 %s%s", fmt,
                 !hp->n_expert || s.n <= CUDA_DECODE_MAX ? "" /* no expert tiles */
                 : b->moe_tiles_mma                      ? " experts q8-mma"
                                                         : " experts fp32");
    }
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(b->st));
}
