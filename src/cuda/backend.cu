/* backend.cu - creating the CUDA backend: the device arena by the plan (cuda_plan.c), weights
 * repacked on the host and uploaded (stacked where one launch can serve several matmuls), the paged
 * KV cache and the DeltaNet state on the device, the activation and step-input buffers; and free.
 * The per-step forward is forward.cu; the state both share is backend_impl.cuh.
 * CPU twin: engine.c's pxq_engine_new and forward_qwen35.c's qwen35_engine_init (the CPU engine's
 *   buffers and float32 vectors; the CPU reads the weights where they lie).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/backend_impl.cuh"
#include "cuda/ops_moe_cuda.h"
#include "cuda/ops_qwen35_cuda.h"
extern "C" {
#include "quant.h"
#include "threadpool.h"
}

/* Weight upload: rows repacked into one of two pinned host stages while the other's copy runs. */
#define STAGE_BYTES ((size_t)64 << 20)

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

/* ---- tuning: the PXQ_CUDA_* knobs (tuning.h), read here and nowhere else ---- */

static int env_is(const char *name, const char *val) {
    const char *v = getenv(name);
    return v && strcmp(v, val) == 0;
}

/* name's integer value (atoi), or def if name is unset */
static int env_int(const char *name, int def) {
    const char *v = getenv(name);
    return v ? atoi(v) : def;
}

/* A knob "a,b" of two integers: *a, *b set if name has that form, else left as they are. */
static void env_pair(const char *name, int *a, int *b) {
    const char *v = getenv(name);
    int x, y;
    if (v && sscanf(v, "%d,%d", &x, &y) == 2) *a = x, *b = y;
}

extern "C" void cuda_tuning_from_env(struct cuda_tuning *t) {
    *t = cuda_tuning{};
    t->exact = env_is("PXQ_CUDA_FP32", "1");
    t->graphs = !env_is("PXQ_CUDA_GRAPHS", "0");
    t->pdl = !env_is("PXQ_CUDA_PDL", "0");
    t->mma = !env_is("PXQ_CUDA_MMA", "0");
    t->moe_mma = !env_is("PXQ_CUDA_MOE_MMA", "0");
    t->stack = !env_is("PXQ_CUDA_STACK", "0");
    t->flash = !env_is("PXQ_CUDA_FLASH", "0");
    t->decode_mma = !env_is("PXQ_CUDA_DECODE_MMA", "0");
    t->stage_o = !env_is("PXQ_CUDA_STAGE_O", "0");
    t->fuse_dn = !env_is("PXQ_CUDA_FUSE_DN", "0");
    t->pdl_tokens = env_int("PXQ_CUDA_PDL_TOKENS", -1);
    if (getenv("PXQ_CUDA_PDL_TOKENS") && t->pdl_tokens < 0) t->pdl_tokens = 0; /* no step, as any value < 1 */
    env_pair("PXQ_CUDA_MV", &t->mv_rows, &t->mv_warps);
    env_pair("PXQ_CUDA_MMA_TUNE", &t->mma_mr, &t->mma_kp);
    env_pair("PXQ_CUDA_MOE_MMA_TUNE", &t->moe_mma_mr, &t->moe_mma_kp);
    t->moe_q8_rows = env_int("PXQ_CUDA_MOE_Q8_R", 0);
    t->moe_group = env_is("PXQ_CUDA_MOE_GROUP", "1");
    t->early_trigger = env_int("PXQ_CUDA_EARLY_TRIGGER", 11);
    t->mv_ahead = env_int("PXQ_CUDA_MV_AHEAD", 1);
    t->l2_pf_mib = 4; /* a sweep (H200, decode b1, t/s at 0/4/8/12 MiB): Qwen3-32B 154.5/155.8/155.7/152.2,
                       * Qwen3.5-27B 177.0/179.9/179.0/172.7; 16 MiB and more is slower (the prefetch then
                       * competes with the mat-vec it rides on) */
    const char *pf = getenv("PXQ_CUDA_L2_PREFETCH");
    int blocks = 0;
    if (pf && sscanf(pf, "%lf,%d", &t->l2_pf_mib, &blocks) == 2) t->l2_pf_blocks = blocks > 0 ? blocks : 1;
    const char *cfg = getenv("PXQ_CUDA_DECODE_CFG");
    t->decode_cfg = cfg && *cfg ? atoi(cfg) : -1;
    t->split_blocks = env_int("PXQ_CUDA_SPLIT_BLOCKS", 0); /* 0: the decode kernel's own (kv_step) */
    t->stage_blocks = env_int("PXQ_CUDA_KV_STAGE_BLOCKS", 0);
    t->stage_dma = env_int("PXQ_CUDA_KV_STAGE_DMA", 0); /* the gather kernel: the tier's proven read path */
    const char *tile = getenv("PXQ_CUDA_TILE");
    t->tile = tile ? (size_t)strtoull(tile, NULL, 10) : 0;
    t->sm_target = env_int("PXQ_CUDA_SM_TARGET", -1);
    if (getenv("PXQ_CUDA_SM_TARGET") && t->sm_target < 0) t->sm_target = 0; /* all SMs, as any value <= 0 */
    const char *pr = getenv("PXQ_CUDA_DEQ_PRIO");
    t->deq_prio = !pr || !strcmp(pr, "gemm") ? CUDA_PRIO_GEMM : !strcmp(pr, "deq") ? CUDA_PRIO_DEQ : CUDA_PRIO_SAME;
}

extern "C" void cuda_no_device_msg(int cuda_error, int n_dev, char *out, size_t cap) {
    const cudaError_t ce = (cudaError_t)cuda_error;
    const char *why = ce == cudaErrorInsufficientDriver ? "no NVIDIA driver is loaded, or it is older than this build's "
                                                          "CUDA runtime"
                      : ce == cudaErrorNoDevice || (ce == cudaSuccess && n_dev == 0) ? "no NVIDIA GPU found"
                                                                                      : "the CUDA runtime failed";
    snprintf(out, cap, "no CUDA device: %s (CUDA: %s)", why, ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
}

/* The steps of cuda_backend_new, in order: plan, arena (with the paths taken, streams, cuBLAS),
 * upload, KV, buffers. CUDA graphs are not made here: forward.cu captures each decode step's shape
 * at its first use (graph_get). */

/* Plan: a device, the arena plan (cuda_plan.c) of this model at these engine parameters, and the
 * arena's size (--gpu-mem, else the plan's total); 0, or -1 with a message where there is no device,
 * the model does not fit, or its shapes have no kernel. */
static int plan_step(struct pxq_engine *e, int exact, struct cuda_plan *plan, size_t *arena, char *err, size_t errlen) {
    const struct pxq_hparams *hp = e->hp;
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev == 0) {
        char why[256];
        cuda_no_device_msg(ce, n_dev, why, sizeof why);
        return set_err(err, errlen, "%s; use --device cpu", why);
    }
    if (cudaSetDevice(0) != cudaSuccess) return set_err(err, errlen, "cudaSetDevice(0) failed");
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return set_err(err, errlen, "cudaMemGetInfo failed");
    { /* without --gpu-mem the arena is the plan itself, and the GPU's free memory is the budget that
       * chooses the prefill tiles (whole matrices, or the small ones where those would not fit) */
        struct pxq_engine_params pp = e->p;
        if (!pp.gpu_mem) pp.gpu_mem = free_b;
        if (cuda_mem_plan(e->m, &pp, &e->kv.lay, plan, err, errlen)) return -1;
    }
    char ps[320];
    cuda_mem_plan_str(plan, ps, sizeof ps);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const size_t arena_size = *arena = e->p.gpu_mem ? e->p.gpu_mem : plan->total;
    if (plan->total > arena_size)
        return set_err(err, errlen, "the model does not fit in --gpu-mem %.2f GiB: %s; short by %.2f GiB",
                       arena_size / gib, ps, (plan->total - arena_size) / gib);
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
    return 0;
}

/* The paths a step takes (tensor cores, PDL, prefetch, attention kernels) on this device, with the
 * environment's tuning knobs (docs/CUDA.md). */
static void choose_paths(cuda_backend *b, const struct pxq_hparams *hp, const cudaDeviceProp &prop) {
    const struct cuda_tuning *t = &b->tune;
    const int exact = b->exact, hd = hp->head_dim;
    b->graphs = t->graphs;
    b->mma = t->mma;
    b->pdl = t->pdl && cuda_pdl_supported();
    /* the dp4a steps: 1-2 tokens, or 1-4 (the kernel's measured range, before the tensor cores took
     * 5-16) with PXQ_CUDA_MMA=0 */
    b->dp4a_tokens = b->mma ? CUDA_MMA_MIN_TOKENS - 1 : 4;
    /* PDL on every decode step: the tensor-core steps too (Qwen3.5-27B Q4_0, H100, alternated twice:
     * b4 413.2-414.0 -> 427.2-428.3 t/s, b8 763.1-763.7 -> 779.3-781.3, b16 1111.6-1114.1 ->
     * 1132.1-1133.0, b1 unchanged; a verification pass of 4 tokens 9.53 -> 9.08 ms) */
    b->pdl_tokens = t->pdl_tokens >= 0 ? t->pdl_tokens : CUDA_DECODE_MAX;
    if (t->mv_rows || t->mv_warps) matmul_q8_tune(t->mv_rows, t->mv_warps); /* the 1..2-token dp4a mat-vec */
    b->stage_o = b->pdl && t->stage_o && matmul_q8_stage_supported(); /* overlap needs PDL */
    b->fuse_dn = t->fuse_dn;
    b->early_trigger = t->early_trigger;
    b->ahead2 = t->mv_ahead;
    if (t->mma_mr || t->mma_kp) matmul_q8_mma_tune(t->mma_mr, t->mma_kp); /* the 3..16-token int8 mma mat-vec */
    b->moe_mma = !exact && t->moe_mma; /* MoE prefill on int8 tensor cores (ffn_moe) */
    if (t->moe_mma_mr || t->moe_mma_kp) moe_q8_mma_tune(t->moe_mma_mr, t->moe_mma_kp);
    if (t->moe_q8_rows) moe_q8_tune(t->moe_q8_rows); /* decode experts' rows a block */
    moe_q8_group_tune(t->moe_group);                 /* ... and several tokens' pairs by expert */
    if (t->decode_cfg >= 0) attention_decode_force_cfg(t->decode_cfg);
    {
        cuda_kv probe = {}; /* the kernels' gates look at the types and shapes only */
        probe.kv_f32 = exact, probe.n_head_kv = hp->n_head_kv, probe.head_dim = hd, probe.kv_dim = hp->n_head_kv * hd;
        b->prefill_attn = t->flash && attention_prefill_supported(&probe, hp->n_head) &&
                          attention_prefill_prepare(hd) == 0;
        b->decode_attn = t->decode_mma && attention_decode_supported(&probe, hp->n_head);
    }
    b->n_sm = prop.multiProcessorCount;
    b->l2_size = (size_t)prop.l2CacheSize;
    if (cuda_pdl_supported()) { /* the bulk prefetch is sm_90+, as PDL: the same gate */
        b->l2_pf_bytes = t->l2_pf_mib > 0 ? (size_t)(t->l2_pf_mib * 1048576.0) : 0;
        b->l2_pf_blocks = t->l2_pf_blocks ? t->l2_pf_blocks : 4 * b->n_sm;
    }
    /* decode attention splits: at most one wave of two blocks per SM (Qwen3-32B at 32K on an H200, t/s
     * with 1/2/3/6 blocks per SM: 99.3/104.9-105.2/103.4-104.2/85.6; three is the (16, 2)
     * configuration's occupancy; Qwen3.5-27B at 16K keeps its 64 splits of 256) */
    b->split_blocks = t->split_blocks > 0 ? t->split_blocks : 2;
}

/* Arena: the backend with its paths, the device arena of arena_size bytes (the plan's), the two
 * streams of prefill's tile pipeline, and cuBLAS with its workspace (the arena's first bytes). NULL
 * with a message if the arena cannot be allocated; on success e->backend is set. */
static cuda_backend *arena_step(struct pxq_engine *e, const struct cuda_tuning *tune, size_t arena_size, char *err,
                               size_t errlen) {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    cuda_backend *b = (cuda_backend *)xcalloc(1, sizeof *b);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    snprintf(b->name, sizeof b->name, "%s", prop.name);
    b->tune = *tune;
    b->exact = tune->exact;
    choose_paths(b, e->hp, prop);
    b->arena_size = arena_size;
    if (cudaMalloc((void **)&b->arena, arena_size) != cudaSuccess) {
        free(b);
        set_err(err, errlen, "cudaMalloc of the %.2f GiB arena failed", arena_size / gib);
        return NULL;
    }
    e->backend = b;
    { /* the GEMM stream before the tile stream: the GEMM's blocks go out first, the next tile's
       * dequantization fills the SMs the GEMM leaves (cublasSetSmCountTarget below); tuning knob
       * PXQ_CUDA_DEQ_PRIO=deq reverses it, =same gives both the default priority */
        int lo = 0, hi = 0;
        CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
        const int p_st = tune->deq_prio == CUDA_PRIO_GEMM ? hi : lo, p_deq = tune->deq_prio == CUDA_PRIO_DEQ ? hi : lo;
        CK(cudaStreamCreateWithPriority(&b->st, cudaStreamNonBlocking, p_st));
        CK(cudaStreamCreateWithPriority(&b->st_deq, cudaStreamNonBlocking, p_deq));
    }
    for (int i = 0; i < 2; i++) {
        CK(cudaEventCreateWithFlags(&b->deq_done[i], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&b->gemm_done[i], cudaEventDisableTiming));
        CK(cudaEventRecord(b->gemm_done[i], b->st));
    }
    CK(cudaEventCreateWithFlags(&b->gemm_ready, cudaEventDisableTiming));
    if (cublasCreate(&b->cublas) != CUBLAS_STATUS_SUCCESS) die("cublasCreate failed");
    cublasSetStream(b->cublas, b->st);
    { /* prefill GEMMs sized for 7/8 of the SMs, so the next tile's dequantization runs beside them
       * (Qwen3-32B pp512 on an H200: 6445 t/s at 116 of 132 SMs, 6155 with all); tuning knob
       * PXQ_CUDA_SM_TARGET (0: all) */
        const int target = tune->sm_target >= 0 ? tune->sm_target : b->n_sm - b->n_sm / 8;
        if (target > 0 && target < b->n_sm) cublasSetSmCountTarget(b->cublas, target);
    }
    b->cublas_ws = arena_get(b, CUDA_CUBLAS_WS);
    cublasSetWorkspace(b->cublas, b->cublas_ws, CUDA_CUBLAS_WS);
    return b;
}

/* Upload, one layer: its matrices (stacked where one launch serves several), its float32 vectors,
 * the stacked q|k|v biases; *max_in and *max_mat grow to its widest input and largest matrix. */
static void upload_layer(struct pxq_engine *e, cuda_backend *b, uploader *u, int il, size_t *max_in, size_t *max_mat) {
    const struct pxq_hparams *hp = e->hp;
    const int hd = hp->head_dim;
    const size_t kv_dim = (size_t)hp->n_head_kv * hd;
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
    if (hp->n_expert) upload_moe(e, b, u, L, cl);
    cl->dn_in.fmt = cl->qgkv.fmt = -1;
    const struct pxq_tensor *qgkv[3] = {mats[CM_Q], mats[CM_K], mats[CM_V]};
    if (!dn && hp->attn_output_gate && stackable(qgkv, 3) && b->tune.stack) {
        upload_stacked(e, b, u, qgkv, 3, &cl->qgkv);
        const int r_q = (int)qgkv[0]->ne[1], r_k = (int)qgkv[1]->ne[1];
        cl->w[CM_Q] = weight_rows(cl->qgkv, 0, r_q);
        cl->w[CM_K] = weight_rows(cl->qgkv, r_q, r_k);
        cl->w[CM_V] = weight_rows(cl->qgkv, r_q + r_k, cl->qgkv.n_out - r_q - r_k);
        for (int i = CM_Q; i <= CM_V; i++) stacked[i] = 1;
    }
    const struct pxq_tensor *dn_in[4] = {mats[CM_SSM_QKV], mats[CM_SSM_Z], mats[CM_SSM_BETA], mats[CM_SSM_ALPHA]};
    if (dn && stackable(dn_in, 4) && b->tune.stack) { /* a decode token's one launch */
        upload_stacked(e, b, u, dn_in, 4, &cl->dn_in);
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
        if (!ok || !b->tune.stack) continue;
        upload_stacked(e, b, u, st[k].t, st[k].n, st[k].w);
        for (int i = 0; i < st[k].n; i++) stacked[st[k].first + i] = 1;
    }
    for (int i = 0; i < CM_COUNT; i++) {
        const int view = (cl->dn_in.fmt >= 0 && (i == CM_SSM_QKV || i == CM_SSM_Z)) ||
                         (cl->qgkv.fmt >= 0 && i >= CM_Q && i <= CM_V); /* set above */
        if (!view) cl->w[i].fmt = -1;
        if (!mats[i] || (i < CM_GATE || i > CM_DOWN ? (i >= CM_SSM_QKV) != dn : 0)) continue;
        if ((size_t)mats[i]->ne[0] > *max_in) *max_in = (size_t)mats[i]->ne[0];
        size_t ne = (size_t)mats[i]->ne[0] * (size_t)mats[i]->ne[1];
        if (ne > *max_mat) *max_mat = ne;
        if (!stacked[i]) upload_weight(e, b, u, mats[i], &cl->w[i]);
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

/* Upload: every layer, the embedding table and lm_head, the output norm and RoPE's inverse
 * frequencies, through two pinned stages; *max_in, *max_mat: the widest input and the largest
 * matrix (the prefill buffers are sized by them). */
static void upload_step(struct pxq_engine *e, cuda_backend *b, size_t *max_in, size_t *max_mat) {
    const struct pxq_hparams *hp = e->hp;
    const size_t d = (size_t)hp->n_embd;
    uploader storage = {}, *u = &storage;
    for (int i = 0; i < 2; i++) {
        CK(cudaMallocHost((void **)&u->stage[i], STAGE_BYTES));
        CK(cudaEventCreate(&u->done[i]));
        CK(cudaEventRecord(u->done[i], b->st));
    }
    b->L = (cuda_layer *)xcalloc((size_t)e->n_lw, sizeof *b->L);
    *max_in = d, *max_mat = 0;
    for (int il = 0; il < e->n_lw; il++) upload_layer(e, b, u, il, max_in, max_mat); /* the MTP layers too (spec_mtp) */
    if (e->p.spec_mtp) {
        upload_weight(e, b, u, model_layer(e->m, hp->n_layer)->nextn_eh_proj, &b->mtp_fc);
        b->mtp_norm[0] = upload_f32(b, e->mtp_enorm, d);
        b->mtp_norm[1] = upload_f32(b, e->mtp_hnorm, d);
        b->mtp_norm[2] = upload_f32(b, e->mtp_head_norm, d);
        if ((size_t)b->mtp_fc.n_in > *max_in) *max_in = (size_t)b->mtp_fc.n_in;
        const size_t ne = (size_t)b->mtp_fc.n_in * (size_t)b->mtp_fc.n_out;
        if (ne > *max_mat) *max_mat = ne;
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
        upload_rows(e, b, u, t, b->embd_host, sb ? b->embd_host + qa : NULL);
        w->q = dp;
        w->s = sb ? dp + qa : NULL;
        upload_weight(e, b, u, model_output(e->m), &b->output);
    } else {
        upload_weight(e, b, u, model_token_embd(e->m), &b->embd);
        b->output = b->embd;
    }
    {
        size_t ne = (size_t)b->output.n_in * (size_t)b->output.n_out;
        if (ne > *max_mat) *max_mat = ne;
    }
    b->output_norm = upload_f32(b, e->output_norm, d);
    b->inv_freq = upload_f32(b, e->inv_freq, (size_t)(hp->n_rot / 2 + 1));
    CK(cudaStreamSynchronize(b->st));
    for (int i = 0; i < 2; i++) {
        CK(cudaFreeHost(u->stage[i]));
        CK(cudaEventDestroy(u->done[i]));
    }
}

/* The selection cache (kv_selcache.cu): its slots, the device-tier blocks [0, kv_select_cache) kept
 * from the sequences, and its arrays (cuda_selcache_sizes, as the plan counts them), reset. */
static int sel_cache(struct pxq_engine *e, cuda_backend *b, int n_dev, char *err, size_t errlen) {
    cuda_kv *kv = &b->kv;
    const int C = e->p.kv_select_cache, step = (int)kv_step_blocks(e->p.n_seq_max, e->p.kv_block_size, e->p.n_batch);
    if (n_dev - C < step || kv_cache_reserve(&e->kv, C) != 0) {
        snprintf(err, errlen, "--kv-select-cache %d: the device tier's %d blocks leave fewer than a step's %d beside it "
                 "(lower it, or give the device tier more: --gpu-mem, --kv-device-blocks)", C, n_dev, step);
        return -1;
    }
    size_t sz[8];
    cuda_selcache_sizes(sz, kv->n_layer_kv, kv->n_head_kv, C, kv->topk_blocks, e->kv.n_blocks);
    void *a[8];
    for (int i = 0; i < 8; i++) a[i] = arena_get(b, sz[i]);
    kv->sc_pool = (int32_t *)a[0], kv->sc_pid = (int32_t *)a[1], kv->sc_pgen = (int32_t *)a[2];
    kv->sc_stamp = (int32_t *)a[3], kv->sc_now = (int32_t *)a[4], kv->sc_copy = (int32_t *)a[5];
    kv->sc_gen = (uint32_t *)a[6], kv->sc_stats = (unsigned long long *)a[7];
    CK(cudaMemset(kv->sc_pid, 0xff, sz[1])); /* holder -1: empty */
    for (int i = 2; i < 8; i++) CK(cudaMemset(a[i], 0, sz[i]));
    kv->sc_slots = C, kv->n_dev = n_dev;
    return 0;
}

/* KV: the paged cache in the engine's layout (kvcache.h), f16 (f32 in exact mode, which the layout
 * then says too). Its block tables are the step inputs' (buffers_step). */
static int kv_step(struct pxq_engine *e, cuda_backend *b, const struct cuda_plan *plan, char *err, size_t errlen) {
    cuda_kv *kv = &b->kv;
    if (cuda_kv_from_layout(kv, &e->kv.lay) != 0) {
        snprintf(err, errlen, "CUDA: the KV cache's element types are not ones the CUDA kernels read (f16 or f32)");
        return -1;
    }
    const int n_dev = plan->kv_dev_blocks, tiered = n_dev < e->kv.n_blocks;
    const size_t bnd = kv_layout_bounds_bytes(&e->kv.lay) / 2;
    if (tiered) { /* the host tier: K and V, each device memory then host memory (kv_tier.cu); the key bounds
                   * stay in device memory for every block (each step scores them all) */
        if (kv_tier_check(&e->kv.lay, e->kv.n_blocks, n_dev, e->p.swap_space, err, errlen) != 0 ||
            kv_cache_tier(&e->kv, n_dev) != 0)
            return -1;
        const size_t per[2] = {e->kv.lay.block_bytes[KV_K], e->kv.lay.block_bytes[KV_V]};
        for (int i = 0; i < 2; i++) {
            if (cuda_tier_alloc(&b->tier[i], (size_t)n_dev * per[i], (size_t)e->kv.n_blocks * per[i], err, errlen) != 0)
                return -1;
            b->tier_dev_bytes += b->tier[i].dev_bytes;
        }
        if (b->tier_dev_bytes > plan->kv_tier_dev) {
            snprintf(err, errlen, "--kv-offload: the device tier takes %zu bytes, more than the plan's %zu (the driver's "
                     "granularity is over %zu)", b->tier_dev_bytes, plan->kv_tier_dev, CUDA_TIER_GRAN);
            return -1;
        }
        kv->k = b->tier[0].va, kv->v = b->tier[1].va;
    } else {
        kv->k = arena_get(b, (size_t)e->kv.n_blocks * e->kv.lay.block_bytes[KV_K]);
        kv->v = arena_get(b, (size_t)e->kv.n_blocks * e->kv.lay.block_bytes[KV_V]);
    }
    if (kv->quantized) { /* the per-layer descriptors, and the residual of every sequence slot */
        const size_t nd = (size_t)e->kv.lay.n_layer_kv, rb = kv_layout_residual_bytes(&e->kv.lay) / 2;
        kv_layer_desc *dd = (kv_layer_desc *)arena_get(b, 2 * nd * sizeof(kv_layer_desc));
        CK(cudaMemcpy(dd, e->kv.lay.layer[KV_K], nd * sizeof(kv_layer_desc), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dd + nd, e->kv.lay.layer[KV_V], nd * sizeof(kv_layer_desc), cudaMemcpyHostToDevice));
        kv->desc = dd;
        kv->res_k = (float *)arena_get(b, rb * (size_t)e->p.n_seq_max);
        kv->res_v = (float *)arena_get(b, rb * (size_t)e->p.n_seq_max);
    }
    if (kv->topk_blocks) { /* block selection: the key bounds, the bitmaps (cuda_bufs_of's sel) */
        kv->kmin = (float *)arena_get(b, (size_t)e->kv.n_blocks * bnd), kv->kmax = (float *)arena_get(b, (size_t)e->kv.n_blocks * bnd);
        const int max_blocks = (int)kv_blocks_for(e->p.n_ctx, e->p.kv_block_size);
        kv->sel_words = (max_blocks + 31) / 32;
        kv->sel = (uint32_t *)arena_get(b, (size_t)e->p.n_batch * kv->n_head_kv * kv->sel_words * 4);
        kv->mid_tokens = CUDA_DECODE_MAX, kv->mid_cap = kv->topk_blocks; /* a decode step's lists */
        kv->mid = (int32_t *)arena_get(b, (size_t)CUDA_DECODE_MAX * kv->n_head_kv * (kv->mid_cap + 1) * 4);
        kv->score = (float *)arena_get(b, (size_t)CUDA_DECODE_MAX * kv->n_head_kv * max_blocks * 4);
        kv->score_blocks = 2 * b->n_sm; /* two 8-warp blocks an SM */
        if (kv_select_prepare(max_blocks) != 0) {
            snprintf(err, errlen, "CUDA: block selection over %d blocks needs more shared memory than this device has",
                     max_blocks);
            return -1;
        }
    }
    /* the tensor-core decode kernel for this view: a quantized cache's form (attention_decode_q.cu),
     * and under window or selection whether it walks the visible blocks (attention_sparse.cuh) */
    b->decode_attn = b->decode_attn && attention_decode_supported(kv, e->hp->n_head);
    if (kv->topk_blocks && tiered && e->p.kv_select_cache > 0) { /* read by the tensor-core decode kernels only */
        if (!b->decode_attn) {
            snprintf(err, errlen, "--kv-select-cache: the decode kernels that read it do not run with this cache on this "
                     "device (they need sm_80+, an f16 or quantized cache, and blocks of a multiple of 16 positions)");
            return -1;
        }
        if (sel_cache(e, b, n_dev, err, errlen) != 0) return -1;
    }
    /* the quantized cache's kernel: a wave of as many blocks an SM as run at once (three where the
     * registers and shared memory allow: twelve warps hide its latency better than eight) */
    if (b->decode_attn && kv->quantized && b->tune.split_blocks <= 0)
        b->split_blocks = attention_decode_q_blocks(kv, e->hp->n_head);
    if (kv->attn_window) b->prefill_attn = b->prefill_attn && attention_prefill_sparse_prepare(kv) == 0;
    return 0;
}

extern "C" int cuda_kv_from_layout(cuda_kv *kv, const struct kv_layout *lay) {
    memset(kv, 0, sizeof *kv);
    const int t0 = lay->n_layer_kv ? lay->layer[KV_K][0].type[0] : KV_F16;
    for (int pool = 0; pool < 2; pool++)
        for (int l = 0; l < lay->n_layer_kv; l++)
            for (int h = 0; h < lay->n_head_kv; h++) {
                const int t = lay->layer[pool][l].type[h];
                if (lay->quantized ? !(t == KV_Q8_0 || (pool == KV_V && t == KV_Q2NU)) : t != t0) return -1;
            }
    if (!lay->quantized && t0 != KV_F16 && t0 != KV_F32) return -1;
    kv->quantized = lay->quantized;
    kv->block_bytes_k = lay->block_bytes[KV_K], kv->block_bytes_v = lay->block_bytes[KV_V];
    kv->n_sink = lay->n_sink, kv->n_window = lay->n_window, kv->n_ring = lay->n_ring;
    kv->attn_window = lay->attn_window, kv->attn_sinks = lay->attn_sinks;
    kv->topk_blocks = lay->topk_blocks;
    kv->kv_f32 = t0 == KV_F32;
    kv->n_layer_kv = lay->n_layer_kv;
    kv->block_size = lay->block_size;
    kv->n_head_kv = lay->n_head_kv;
    kv->head_dim = lay->head_dim;
    kv->kv_dim = lay->kv_dim;
    kv->attn_scale = lay->attn_scale;
    return 0;
}

/* Prefill over the host tier (attention_staged.cu): the staged strides, a layer's largest slice of a
 * block in each pool (16-byte multiples), and how many blocks' slices each of the two halves of the
 * staging buffer (bytes) holds, at most PXQ_CUDA_KV_STAGE_BLOCKS. No tier, the prefill kernel off
 * or the knob below 0: no staging (stage NULL; host blocks are read in place). */
static void stage_step(struct pxq_engine *e, cuda_backend *b, size_t bytes) {
    const struct kv_layout *lay = &e->kv.lay;
    for (int pool = 0; pool < 2; pool++)
        for (int l = 0; l < lay->n_layer_kv; l++) {
            const size_t len = ((size_t)lay->block_size * lay->layer[pool][l].slot_bytes + 15) / 16 * 16;
            if (len > b->stage_stride[pool]) b->stage_stride[pool] = len;
        }
    const size_t per = b->stage_stride[0] + b->stage_stride[1];
    b->stage_cap = per ? (int)(bytes / 2 / per) : 0;
    if (b->tune.stage_blocks > 0 && b->tune.stage_blocks < b->stage_cap) b->stage_cap = b->tune.stage_blocks;
    if (!b->tier[0].va || !b->prefill_attn || b->tune.stage_blocks < 0 || b->stage_cap < 1) {
        b->stage = NULL, b->stage_cap = 0;
        return;
    }
    b->slabs = (pf_slab *)xmalloc((size_t)b->n_tab * b->max_blocks * sizeof(pf_slab));
    CK(cudaStreamCreateWithFlags(&b->st_stage, cudaStreamNonBlocking));
    for (int i = 0; i < 5; i++) CK(cudaEventCreateWithFlags(&b->stage_ev[i], cudaEventDisableTiming));
}

/* Buffers: activations, step inputs (device and pinned host), workspace, DeltaNet state: sizes from
 * cuda_bufs_of, as the plan counted them. */
static void buffers_step(struct pxq_engine *e, cuda_backend *b, size_t max_in, size_t max_mat, size_t w16_max) {
    const struct pxq_hparams *hp = e->hp;
    const int hd = hp->head_dim;
    const size_t kv_dim = (size_t)hp->n_head_kv * hd;
    struct cuda_bufs bf;
    cuda_bufs_of(hp, &e->p, max_in, max_mat, w16_max, &bf);
    const size_t nb = (size_t)e->p.n_batch;
    b->nb = (int)nb;
    b->max_blocks = (int)kv_blocks_for(e->p.n_ctx, e->p.kv_block_size);
    b->n_tab = (int)(nb < (size_t)e->p.n_seq_max ? nb : (size_t)e->p.n_seq_max);
    b->max_splits = (e->p.n_ctx + CUDA_SPLIT_LEN - 1) / CUDA_SPLIT_LEN;
    if (bf.state) {
        b->rstate = arena_f32(b, bf.state);
        b->rstate_floats = bf.rstate;
        if (e->p.spec_checkpoint) b->rstate_ck = b->rstate + bf.rstate * (size_t)e->p.n_seq_max; /* in the arena */
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
        const size_t tn = (size_t)b->n_tab * b->max_blocks;
        int32_t *tab = p + 10 * nb + 1;
        *si[i] = step_inputs{p, p + nb, p + 2 * nb, p + 3 * nb, p + 4 * nb, p + 5 * nb, p + 6 * nb + 1, p + 7 * nb + 1,
                             p + 9 * nb + 1, tab, bf.kv_stage ? tab + tn : NULL, bf.kv_stage ? tab + 2 * tn : NULL,
                             bf.kv_stage ? tab + 3 * tn : NULL};
    }
    b->kv.block_tab = b->di.tab; /* the KV cache reads the block tables of the step inputs */
    b->kv.res_seq = b->di.run_seq; /* and the residual's slot of each compact sequence */
    b->kv.max_blocks = b->max_blocks;
    b->seq_map = (int *)xmalloc((size_t)e->p.n_seq_max * sizeof(int));
    b->x16 = arena_get(b, bf.x16 * 2);
    b->xq = (int8_t *)arena_get(b, bf.xq);
    b->xds = arena_f32(b, bf.xds);
    b->w16_elems = bf.w16;
    b->w16_half = b->w16_elems / 2;
    if (b->tune.tile > 0 && b->tune.tile < b->w16_half) b->w16_half = b->tune.tile; /* PXQ_CUDA_TILE */
    b->w16 = arena_get(b, b->w16_elems * 2);
    b->part_o = arena_f32(b, bf.part_o);
    b->part_ml = arena_f32(b, bf.part_ml);
    if (bf.kv_stage) {
        b->stage = (uint8_t *)arena_get(b, bf.kv_stage);
        b->pf_ml = arena_f32(b, bf.pf_ml);
        stage_step(e, b, bf.kv_stage);
    }
}

extern "C" void cuda_backend_free(struct pxq_engine *e);

/* Exact mode keeps an f16-type cache in float32 on the device: describe it so, before the plan. */
static int exact_layout(struct pxq_engine *e, char *err, size_t errlen) {
    struct kv_layout lay;
    struct kv_spec spec = pxq_kv_spec(e->m, &e->p);
    if (spec.type != KV_CACHE_F16) return 0;
    spec.exact_f32 = 1;
    if (kv_layout_init(&lay, e->kv.lay.n_layer_kv, e->kv.lay.n_head_kv, e->kv.lay.head_dim, e->kv.lay.block_size, &spec,
                       err, errlen) != 0)
        return -1;
    kv_layout_free(&e->kv.lay);
    e->kv.lay = lay;
    return 0;
}

extern "C" int cuda_backend_new(struct pxq_engine *e, char *err, size_t errlen) {
    struct cuda_tuning tune;
    cuda_tuning_from_env(&tune);
    if (tune.exact && exact_layout(e, err, errlen)) return -1;
    struct cuda_plan plan;
    size_t arena_size = 0, max_in = 0, max_mat = 0;
    if (plan_step(e, tune.exact, &plan, &arena_size, err, errlen)) return -1;
    arena_size -= plan.kv_tier_dev; /* the host tier's device part is its own allocation (kv_tier.cu) */
    cuda_backend *b = arena_step(e, &tune, arena_size, err, errlen);
    if (!b) return -1;
    upload_step(e, b, &max_in, &max_mat);
    if (kv_step(e, b, &plan, err, errlen)) {
        cuda_backend_free(e);
        return -1;
    }
    buffers_step(e, b, max_in, max_mat, plan.w16_max);
    if (b->peak + plan.kv_tier_dev > plan.total) die("CUDA arena: used %zu bytes, plan %zu", b->peak, plan.total);
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
    if (b->st_stage) {
        cudaStreamSynchronize(b->st_stage);
        for (int i = 0; i < 5; i++) cudaEventDestroy(b->stage_ev[i]);
        cudaStreamDestroy(b->st_stage);
    }
    cudaStreamDestroy(b->st);
    cudaFree(b->arena);
    for (int i = 0; i < 2; i++) cuda_tier_free(&b->tier[i]);
    if (b->rstate_ck && !e->p.spec_checkpoint) cudaFree(b->rstate_ck); /* allocated at the first checkpoint */
    if (b->embd_host) cudaFreeHost(b->embd_host);
    cudaFreeHost(b->in_h);
    free(b->seq_map);
    free(b->slabs);
    free(b->L);
    free(b);
    e->backend = NULL;
}

extern "C" int cuda_seq_checkpoint(struct pxq_engine *e, int seq, int restore) {
    cuda_backend *b = B(e);
    if (!b->rstate) return 0;
    const size_t n = b->rstate_floats * sizeof(float);
    if (!b->rstate_ck) {
        if (restore) return -1;
        if (cudaMalloc((void **)&b->rstate_ck, n * (size_t)e->p.n_seq_max) != cudaSuccess) {
            (void)cudaGetLastError();
            b->rstate_ck = NULL;
            return -1;
        }
    }
    rstate_ck_copy(b, seq, restore);
    return 0;
}

extern "C" int cuda_inner_checkpoints(const struct pxq_engine *e) {
    const cuda_backend *b = B(e);
    return !b->rstate || (e->p.spec_checkpoint && b->rstate_ck);
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

extern "C" size_t cuda_backend_peak(const struct pxq_engine *e) { return B(e)->peak + B(e)->tier_dev_bytes; }
extern "C" uint64_t cuda_backend_staged(const struct pxq_engine *e) { return B(e)->stage_bytes; }

extern "C" void cuda_backend_selcache(const struct pxq_engine *e, uint64_t out[3]) {
    const cuda_backend *b = B(e);
    unsigned long long h[3] = {0, 0, 0};
    if (b->kv.sc_slots && cudaMemcpy(h, b->kv.sc_stats, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess)
        (void)cudaGetLastError(), memset(h, 0, sizeof h);
    for (int i = 0; i < 3; i++) out[i] = h[i];
}
extern "C" const char *cuda_backend_device(const struct pxq_engine *e) { return B(e)->name; }
extern "C" const char *cuda_backend_path(const struct pxq_engine *e) { return B(e)->path; }
