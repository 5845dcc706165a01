/* backend.cu - the CUDA backend: one device arena, weights repacked and uploaded at load, the paged
 * KV cache on the device, and forward_cuda, the twin of forward_cpu (same steps, same order).
 *
 * Per ubatch: the token ids, positions, compacted sequence ids, output rows and the block tables of
 * the ubatch's sequences travel in one host-to-device copy into fixed device buffers; decode steps
 * (at most CUDA_DECODE_MAX tokens) are captured once per (n_tokens, n_outputs, n_split) as a CUDA
 * graph and replayed; the requested logits rows come back in one copy.
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

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) die("CUDA: %s: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)

#define MAX_GRAPHS 64
#define STAGE_BYTES ((size_t)64 << 20)

struct cuda_layer {
    cuda_weight wq, wk, wv, wo, wgate, wup, wdown;
    float *attn_norm, *ffn_norm, *q_norm, *k_norm, *bq, *bk, *bv;
};

struct graph_entry {
    int n, n_out, n_split;
    cudaGraphExec_t exec;
};

struct cuda_backend {
    char name[256];
    char *arena;
    size_t arena_size, used, peak;
    cudaStream_t st;
    cublasHandle_t cublas;
    cuda_layer *L;
    cuda_weight embd, output;
    float *output_norm, *inv_freq;
    cuda_kv kv;
    int32_t *in_d, *in_h;   /* token[nb] pos[nb] seq[nb] rows[nb] tables[n_tab][max_blocks] */
    int nb, n_tab, max_blocks, max_splits;
    int *seq_map;           /* [n_seq_max] -> compact index, scratch */
    float *x, *xb, *xb2, *q, *k, *v, *att, *hb, *hb2, *logits, *part_o, *part_ml;
    void *x16, *w16, *cublas_ws;
    int8_t *xq;             /* q8 activations [nb][max_in] and their (d, s) [nb][max_in/32][2] */
    float *xds;
    size_t w16_elems;
    int exact, graphs;
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

static void upload_weight(struct pxq_engine *e, cuda_backend *b, uploader *u, const struct pxq_tensor *t, cuda_weight *w) {
    w->fmt = cuda_wfmt_of(t->type);
    w->n_in = (int)t->ne[0];
    w->n_out = (int)t->ne[1];
    size_t qb, sb;
    cuda_weight_sizes(w->fmt, t->ne[0], t->ne[1], &qb, &sb);
    uint8_t *dq = (uint8_t *)arena_get(b, qb), *ds = sb ? (uint8_t *)arena_get(b, sb) : NULL;
    w->q = dq;
    w->s = ds;
    const size_t row_q = qb / (size_t)w->n_out, row_s = sb / (size_t)w->n_out;
    int64_t rows = (int64_t)(STAGE_BYTES / (row_q + row_s));
    if (rows < 1) die("weight %s: a row exceeds the staging buffer", t->name);
    for (int64_t r0 = 0; r0 < w->n_out; r0 += rows) {
        int64_t rc = w->n_out - r0 < rows ? w->n_out - r0 : rows;
        uint8_t *hq = u->stage[u->cur], *hs = hq + (size_t)rc * row_q;
        CK(cudaEventSynchronize(u->done[u->cur])); /* the copy that last used this stage is over */
        repack_args a = {t, r0, row_q, row_s, hq, hs};
        parallel_for(e->tp, rc, 64, repack_range, &a);
        CK(cudaMemcpyAsync(dq + (size_t)r0 * row_q, hq, (size_t)rc * row_q, cudaMemcpyHostToDevice, b->st));
        if (sb) CK(cudaMemcpyAsync(ds + (size_t)r0 * row_s, hs, (size_t)rc * row_s, cudaMemcpyHostToDevice, b->st));
        CK(cudaEventRecord(u->done[u->cur], b->st));
        u->cur ^= 1;
    }
}

static float *upload_f32(cuda_backend *b, const float *h, size_t n) {
    if (!h) return NULL;
    float *d = arena_f32(b, n);
    CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

/* ---- creation ---- */

static int env_is(const char *name, const char *val) {
    const char *v = getenv(name);
    return v && strcmp(v, val) == 0;
}

extern "C" int cuda_backend_new(struct pxq_engine *e, char *err, size_t errlen) {
    const struct pxq_hparams *hp = e->hp;
    int n_dev = 0;
    cudaError_t ce = cudaGetDeviceCount(&n_dev);
    if (ce != cudaSuccess || n_dev == 0)
        return set_err(err, errlen, "no CUDA device (%s); use --device cpu",
                       ce != cudaSuccess ? cudaGetErrorString(ce) : "count 0");
    const int exact = env_is("PXQ_CUDA_FP32", "1");
    struct cuda_plan plan;
    if (cuda_mem_plan(e->m, &e->p, exact ? 4 : 2, &plan, err, errlen)) return -1;
    char ps[320];
    cuda_mem_plan_str(&plan, ps, sizeof ps);
    const double gib = 1024.0 * 1024.0 * 1024.0;
    const size_t arena_size = e->p.gpu_mem ? e->p.gpu_mem : plan.total;
    if (plan.total > arena_size)
        return set_err(err, errlen, "the model does not fit in --gpu-mem %.2f GiB: %s; short by %.2f GiB",
                       arena_size / gib, ps, (plan.total - arena_size) / gib);
    if (cudaSetDevice(0) != cudaSuccess) return set_err(err, errlen, "cudaSetDevice(0) failed");
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return set_err(err, errlen, "cudaMemGetInfo failed");
    if (arena_size > free_b)
        return set_err(err, errlen, "device arena of %.2f GiB exceeds the %.2f GiB free on the GPU (plan: %s)",
                       arena_size / gib, free_b / gib, ps);
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    if (attention_cuda_prepare(hd, group) != 0)
        return set_err(err, errlen, "attention needs %zu bytes of shared memory per block, more than this GPU allows",
                       attention_smem_bytes(hd, group));

    cuda_backend *b = (cuda_backend *)xcalloc(1, sizeof *b);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    snprintf(b->name, sizeof b->name, "%s", prop.name);
    b->exact = exact;
    b->graphs = !env_is("PXQ_CUDA_GRAPHS", "0");
    b->arena_size = arena_size;
    if (cudaMalloc((void **)&b->arena, arena_size) != cudaSuccess) {
        free(b);
        return set_err(err, errlen, "cudaMalloc of the %.2f GiB arena failed", arena_size / gib);
    }
    e->backend = b;
    CK(cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking));
    if (cublasCreate(&b->cublas) != CUBLAS_STATUS_SUCCESS) die("cublasCreate failed");
    cublasSetStream(b->cublas, b->st);
    b->cublas_ws = arena_get(b, CUDA_CUBLAS_WS);
    cublasSetWorkspace(b->cublas, b->cublas_ws, CUDA_CUBLAS_WS);

    /* weights */
    uploader u = {};
    for (int i = 0; i < 2; i++) {
        CK(cudaMallocHost((void **)&u.stage[i], STAGE_BYTES));
        CK(cudaEventCreate(&u.done[i]));
        CK(cudaEventRecord(u.done[i], b->st));
    }
    const size_t d = (size_t)hp->n_embd, q_dim = (size_t)hp->n_head * hd, kv_dim = (size_t)hp->n_head_kv * hd;
    b->L = (cuda_layer *)xcalloc((size_t)hp->n_layer, sizeof *b->L);
    size_t max_in = d, max_mat = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const struct pxq_layer *L = model_layer(e->m, il);
        cuda_layer *cl = &b->L[il];
        const struct pxq_tensor *src[7] = {L->attn_q, L->attn_k, L->attn_v, L->attn_output, L->ffn_gate, L->ffn_up, L->ffn_down};
        cuda_weight *dst[7] = {&cl->wq, &cl->wk, &cl->wv, &cl->wo, &cl->wgate, &cl->wup, &cl->wdown};
        for (int i = 0; i < 7; i++) {
            upload_weight(e, b, &u, src[i], dst[i]);
            if ((size_t)src[i]->ne[0] > max_in) max_in = (size_t)src[i]->ne[0];
            size_t ne = (size_t)src[i]->ne[0] * (size_t)src[i]->ne[1];
            if (ne > max_mat) max_mat = ne;
        }
        const struct layer_f32 *w = &e->lw[il];
        cl->attn_norm = upload_f32(b, w->attn_norm, d);
        cl->ffn_norm = upload_f32(b, w->ffn_norm, d);
        cl->q_norm = upload_f32(b, w->q_norm, (size_t)hd);
        cl->k_norm = upload_f32(b, w->k_norm, (size_t)hd);
        cl->bq = upload_f32(b, w->bq, q_dim);
        cl->bk = upload_f32(b, w->bk, kv_dim);
        cl->bv = upload_f32(b, w->bv, kv_dim);
    }
    upload_weight(e, b, &u, model_token_embd(e->m), &b->embd);
    if (model_output(e->m) != model_token_embd(e->m)) upload_weight(e, b, &u, model_output(e->m), &b->output);
    else b->output = b->embd;
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

    /* activations and inputs */
    const size_t nb = (size_t)e->p.n_batch, ff = (size_t)hp->n_ff, wide = d > q_dim ? d : q_dim;
    b->nb = (int)nb;
    b->max_blocks = (e->p.n_ctx + e->p.kv_block_size - 1) / e->p.kv_block_size;
    b->n_tab = (int)(nb < (size_t)e->p.n_seq_max ? nb : (size_t)e->p.n_seq_max);
    b->max_splits = (e->p.n_ctx + CUDA_SPLIT_LEN - 1) / CUDA_SPLIT_LEN;
    b->x = arena_f32(b, nb * d);
    b->xb = arena_f32(b, nb * wide);
    b->xb2 = arena_f32(b, nb * wide);
    b->q = arena_f32(b, nb * q_dim);
    b->att = arena_f32(b, nb * q_dim);
    b->k = arena_f32(b, nb * kv_dim);
    b->v = arena_f32(b, nb * kv_dim);
    b->hb = arena_f32(b, nb * ff);
    b->hb2 = arena_f32(b, nb * ff);
    b->logits = arena_f32(b, nb * (size_t)hp->n_vocab);
    const size_t in_ints = 4 * nb + (size_t)b->n_tab * b->max_blocks;
    b->in_d = (int32_t *)arena_get(b, in_ints * 4);
    CK(cudaMallocHost((void **)&b->in_h, in_ints * 4));
    kv->block_tab = b->in_d + 4 * nb;
    kv->max_blocks = b->max_blocks;
    b->seq_map = (int *)xmalloc((size_t)e->p.n_seq_max * sizeof(int));
    size_t part_rows = (size_t)CUDA_DECODE_MAX * b->max_splits;
    if (nb > part_rows) part_rows = nb;
    part_rows *= (size_t)hp->n_head;
    b->x16 = arena_get(b, nb * max_in * 2);
    b->xq = (int8_t *)arena_get(b, nb * max_in);
    b->xds = arena_f32(b, nb * max_in / 32 * 2 + 2);
    b->w16_elems = max_mat < CUDA_W16_MAX_ELEMS ? max_mat : CUDA_W16_MAX_ELEMS;
    b->w16 = arena_get(b, b->w16_elems * 2);
    b->part_o = arena_f32(b, part_rows * (size_t)hd);
    b->part_ml = arena_f32(b, part_rows * 2);
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
    cudaStreamDestroy(b->st);
    cudaFree(b->arena);
    cudaFreeHost(b->in_h);
    free(b->seq_map);
    free(b->L);
    free(b);
    e->backend = NULL;
}

extern "C" size_t cuda_backend_peak(const struct pxq_engine *e) { return B(e)->peak; }
extern "C" const char *cuda_backend_device(const struct pxq_engine *e) { return B(e)->name; }
extern "C" const char *cuda_backend_path(const struct pxq_engine *e) { return B(e)->path; }

/* ---- the forward ---- */

/* matmul_cpu's twin, y (+)= W x: for decode the q8 mat-vec (b->xq holds x quantized, q8 != 0) or
 * the fp32 mat-vec (exact mode, formats without a q8 kernel); for prefill, weight rows dequantized
 * to f16 in tiles and cublasGemmEx (f16 in, fp32 accumulate and out). accumulate fuses the residual. */
static void matmul_cuda(cuda_backend *b, float *y, const cuda_weight *w, const float *x, int n, int q8, int accumulate) {
    if (n <= CUDA_DECODE_MAX || b->exact) {
        if (q8 && matmul_q8_supported(w->fmt)) matmul_q8_cuda(y, w, b->xq, b->xds, n, w->n_out, accumulate, b->st);
        else matmul_gemv_cuda(y, w, x, n, w->n_out, accumulate, b->st);
        return;
    }
    const int n_in = w->n_in, n_out = w->n_out;
    f32_to_f16_cuda(b->x16, x, (int64_t)n * n_in, b->st);
    int64_t rows = w->fmt == WFMT_F16 ? n_out : (int64_t)(b->w16_elems / (size_t)n_in);
    if (rows < 1) die("prefill tile smaller than one row");
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    for (int64_t r0 = 0; r0 < n_out; r0 += rows) {
        int rc = (int)(n_out - r0 < rows ? n_out - r0 : rows);
        const void *A;
        if (w->fmt == WFMT_F16) {
            A = (const uint16_t *)w->q + (size_t)r0 * n_in;
        } else {
            dequant_rows_cuda(b->w16, 1, w, NULL, r0, rc, b->st);
            A = b->w16;
        }
        /* column-major view: y^T[n_out x n] = W[n_in x n_out]^T x^T[n_in x n] */
        cublasStatus_t s = cublasGemmEx(b->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rc, n, n_in, &one, A, CUDA_R_16F, n_in,
                                        b->x16, CUDA_R_16F, n_in, &beta, y + r0, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) die("cublasGemmEx failed (%d)", (int)s);
    }
}

/* forward_cpu, step for step; inputs already in b->in_d. */
static void run_layers(struct pxq_engine *e, cuda_backend *b, int n, int n_out, int n_split, int split_len) {
    const struct pxq_hparams *hp = e->hp;
    const int d = hp->n_embd, hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    const int32_t *tok = b->in_d, *pos = b->in_d + b->nb, *seq = b->in_d + 2 * b->nb, *rows = b->in_d + 3 * b->nb;
    cudaStream_t st = b->st;
    const int neox = hp->rope_style == ROPE_NEOX;
    /* int8 activations for the q8 mat-vec: decode, default mode, rows in whole groups of 32 */
    const int q8 = !b->exact && n <= CUDA_DECODE_MAX && d % 32 == 0 && q_dim % 32 == 0 && hp->n_ff % 32 == 0;
    int8_t *xq = q8 ? b->xq : NULL;
    dequant_rows_cuda(b->x, 0, &b->embd, tok, 0, n, st);
    for (int il = 0; il < hp->n_layer; il++) {
        const cuda_layer *L = &b->L[il];
        const int l = e->kv_layer[il];
        /* attention */
        rmsnorm_q8_cuda(b->xb, xq, b->xds, b->x, L->attn_norm, d, n, hp->rms_eps, NULL, st);
        matmul_cuda(b, b->q, &L->wq, b->xb, n, q8, 0);
        matmul_cuda(b, b->k, &L->wk, b->xb, n, q8, 0);
        matmul_cuda(b, b->v, &L->wv, b->xb, n, q8, 0);
        if (L->bq) add_bias_cuda(b->q, L->bq, n, q_dim, st);
        if (L->bk) add_bias_cuda(b->k, L->bk, n, kv_dim, st);
        if (L->bv) add_bias_cuda(b->v, L->bv, n, kv_dim, st);
        /* q/k norm (before RoPE, Qwen3), RoPE, and the KV store: one kernel */
        qk_norm_rope_store_cuda(b->q, b->k, b->v, L->q_norm, L->k_norm, hp->rms_eps, hp->n_head, hp->n_rot, pos,
                                b->inv_freq, neox, &b->kv, l, seq, n, st);
        attention_cuda(b->att, b->q, &b->kv, l, pos, seq, n, hp->n_head, n_split, split_len, b->part_o, b->part_ml, st);
        if (q8 && matmul_q8_supported(L->wo.fmt)) quantize_q8_cuda(b->xq, b->xds, b->att, (int64_t)n * q_dim, st);
        matmul_cuda(b, b->x, &L->wo, b->att, n, q8, 1); /* x += o_proj(att) */
        /* feed-forward */
        rmsnorm_q8_cuda(b->xb, xq, b->xds, b->x, L->ffn_norm, d, n, hp->rms_eps, NULL, st);
        matmul_cuda(b, b->hb, &L->wgate, b->xb, n, q8, 0);
        matmul_cuda(b, b->hb2, &L->wup, b->xb, n, q8, 0);
        swiglu_q8_cuda(b->hb, q8 && matmul_q8_supported(L->wdown.fmt) ? b->xq : NULL, b->xds, b->hb, b->hb2,
                       (int64_t)hp->n_ff * n, st);
        matmul_cuda(b, b->x, &L->wdown, b->hb, n, q8, 1); /* x += down(...) */
    }
    /* final norm of the rows that asked for logits (gathered), then lm_head */
    if (n_out) {
        rmsnorm_q8_cuda(b->xb, xq, b->xds, b->x, b->output_norm, d, n_out, hp->rms_eps, rows, st);
        matmul_cuda(b, b->logits, &b->output, b->xb, n_out, q8, 0);
    }
}

static cudaGraphExec_t graph_get(struct pxq_engine *e, cuda_backend *b, int n, int n_out, int n_split) {
    for (int i = 0; i < b->n_graphs; i++)
        if (b->g[i].n == n && b->g[i].n_out == n_out && b->g[i].n_split == n_split) return b->g[i].exec;
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal));
    run_layers(e, b, n, n_out, n_split, CUDA_SPLIT_LEN);
    CK(cudaStreamEndCapture(b->st, &graph));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphDestroy(graph));
    int slot;
    if (b->n_graphs < MAX_GRAPHS) {
        slot = b->n_graphs++;
    } else { /* full: replace in turn */
        slot = b->next_evict;
        b->next_evict = (b->next_evict + 1) % MAX_GRAPHS;
        CK(cudaGraphExecDestroy(b->g[slot].exec));
    }
    b->g[slot] = graph_entry{n, n_out, n_split, exec};
    return exec;
}

extern "C" void forward_cuda(struct pxq_engine *e, const struct ubatch *ub) {
    cuda_backend *b = B(e);
    const int n = ub->n, nb = b->nb;
    int32_t *h = b->in_h;
    for (int s = 0; s < e->p.n_seq_max; s++) b->seq_map[s] = -1;
    int n_tab = 0, n_out = 0, first = -1, max_pos = 0;
    for (int t = 0; t < n; t++) {
        const int s = ub->seq_id[t];
        if (b->seq_map[s] < 0) {
            const struct kv_seq *ks = &e->seqs[s].kv;
            b->seq_map[s] = n_tab;
            memcpy(h + 4 * nb + (size_t)n_tab * b->max_blocks, ks->blocks, (size_t)ks->n_blocks * sizeof(int32_t));
            n_tab++;
        }
        h[t] = ub->token[t];
        h[nb + t] = ub->pos[t];
        h[2 * nb + t] = b->seq_map[s];
        if (ub->pos[t] > max_pos) max_pos = ub->pos[t];
        if (ub->out_idx[t] >= 0) {
            if (first < 0) first = ub->out_idx[t];
            h[3 * nb + n_out++] = t;
        }
    }
    const size_t in_bytes = (4 * (size_t)nb + (size_t)n_tab * b->max_blocks) * sizeof(int32_t);
    CK(cudaMemcpyAsync(b->in_d, h, in_bytes, cudaMemcpyHostToDevice, b->st));
    const char *fmt = cuda_wfmt_name(b->L[0].wgate.fmt);
    const char *mv = !b->exact && matmul_q8_supported(b->L[0].wgate.fmt) ? "q8-dp4a" : "gemv";
    if (n <= CUDA_DECODE_MAX) {
        int need = (max_pos + 1 + CUDA_SPLIT_LEN - 1) / CUDA_SPLIT_LEN, n_split = 1;
        while (n_split < need) n_split *= 2;
        if (n_split > b->max_splits) n_split = b->max_splits;
        if (b->graphs) {
            CK(cudaGraphLaunch(graph_get(e, b, n, n_out, n_split), b->st));
            snprintf(b->path, sizeof b->path, "cuda %s %s graph", mv, fmt);
        } else {
            run_layers(e, b, n, n_out, n_split, CUDA_SPLIT_LEN);
            snprintf(b->path, sizeof b->path, "cuda %s %s", mv, fmt);
        }
    } else {
        run_layers(e, b, n, n_out, 1, e->p.n_ctx);
        snprintf(b->path, sizeof b->path, b->exact ? "cuda gemv-fp32 %s" : "cuda cublas-f16 %s", fmt);
    }
    CK(cudaGetLastError());
    if (n_out)
        CK(cudaMemcpyAsync(e->logits + (size_t)first * e->hp->n_vocab, b->logits,
                           (size_t)n_out * e->hp->n_vocab * sizeof(float), cudaMemcpyDeviceToHost, b->st));
    CK(cudaStreamSynchronize(b->st));
}
