/* cuda_plan.c - the C side of the CUDA backend, built with or without CUDA: device weight formats
 * and their sizes, the arena plan the backend allocates by (cuda/backend.h), and the engine.h
 * device accessors. The device code is in src/cuda/. */
#include <stdio.h>
#include <string.h>

#include "cuda/backend.h"
#include "kvcache.h"
#include "engine_impl.h"
#include "quant.h"
#include "util.h"

int cuda_wfmt_of(enum pxq_type t) {
    switch (t) {
    case PXQ_TYPE_F32: return WFMT_F32;
    case PXQ_TYPE_F16: return WFMT_F16;
    case PXQ_TYPE_BF16: return WFMT_BF16;
    case PXQ_TYPE_Q4_0: return WFMT_Q4_0;
    case PXQ_TYPE_Q8_0: return WFMT_Q8_0;
    case PXQ_TYPE_Q4_1:
    case PXQ_TYPE_Q4_K: return WFMT_Q4M;
    case PXQ_TYPE_Q5_0:
    case PXQ_TYPE_Q5_1:
    case PXQ_TYPE_Q5_K:
    case PXQ_TYPE_Q6_K: return WFMT_Q8M;
    default: return -1;
    }
}

const char *cuda_wfmt_name(int fmt) {
    static const char *names[WFMT_COUNT] = {"f32", "f16", "bf16", "q4_0", "q8_0", "q4m", "q8m"};
    return fmt >= 0 && fmt < WFMT_COUNT ? names[fmt] : "?";
}

void cuda_weight_sizes(int fmt, int64_t n_in, int64_t n_out, size_t *q_bytes, size_t *s_bytes) {
    size_t n = (size_t)n_in * (size_t)n_out, q = 0, s = 0;
    switch (fmt) {
    case WFMT_F32: q = n * 4; break;
    case WFMT_F16:
    case WFMT_BF16: q = n * 2; break;
    case WFMT_Q4_0: q = n / 2, s = n / 32 * 2; break;
    case WFMT_Q8_0: q = n, s = n / 32 * 2; break;
    case WFMT_Q4M: q = n / 2, s = n / 32 * 8; break;
    case WFMT_Q8M: q = n, s = n / 16 * 8; break;
    }
    *q_bytes = q;
    *s_bytes = s;
}

static size_t al(size_t n) { return (n + CUDA_ALIGN - 1) / CUDA_ALIGN * CUDA_ALIGN; }

static int weight_plan(const struct pxq_tensor *t, size_t *bytes, char *err, size_t errlen) {
    int fmt = cuda_wfmt_of(t->type);
    if (fmt < 0) return set_err(err, errlen, "CUDA backend: %s has type %s, which it cannot run", t->name, type_name(t->type));
    if (fmt != WFMT_F32 && fmt != WFMT_F16 && fmt != WFMT_BF16 && t->ne[0] % 32 != 0)
        return set_err(err, errlen, "CUDA backend: %s has rows of %lld, not a multiple of 32", t->name, (long long)t->ne[0]);
    size_t q, s;
    cuda_weight_sizes(fmt, t->ne[0], t->ne[1], &q, &s);
    *bytes += al(q) + (s ? al(s) : 0);
    return 0;
}

void cuda_layer_mats(const struct pxq_layer *L, const struct pxq_tensor *mats[CM_COUNT]) {
    const struct pxq_tensor *m[CM_COUNT] = {L->attn_q,   L->attn_k,    L->attn_v,   L->attn_output, L->ffn_gate, L->ffn_up,
                                            L->ffn_down, L->attn_qkv,  L->attn_gate, L->ssm_beta,   L->ssm_alpha, L->ssm_out};
    memcpy(mats, m, sizeof m);
}

void cuda_layer_vec_sizes(const struct pxq_hparams *hp, const struct pxq_layer *L, int il, size_t n[CV_COUNT]) {
    const size_t d = (size_t)hp->n_embd, hd = (size_t)hp->head_dim;
    memset(n, 0, CV_COUNT * sizeof *n);
    n[CV_ATTN_NORM] = n[CV_FFN_NORM] = d;
    if (hp->layer_kind[il] == LAYER_DELTANET) {
        const size_t nv = (size_t)hp->ssm_n_v_head;
        const size_t conv_dim = 2 * (size_t)hp->ssm_n_k_head * hp->ssm_head_k_dim + nv * hp->ssm_head_v_dim;
        n[CV_SSM_A] = n[CV_SSM_DT] = nv;
        n[CV_SSM_NORM] = (size_t)hp->ssm_head_v_dim;
        n[CV_SSM_CONV] = conv_dim * (size_t)hp->ssm_conv_kernel;
        return;
    }
    if (L->attn_q_norm) n[CV_Q_NORM] = hd;
    if (L->attn_k_norm) n[CV_K_NORM] = hd;
    if (L->attn_q_b || L->attn_k_b || L->attn_v_b) { /* all three: the stacked q|k|v bias is whole */
        n[CV_BQ] = (size_t)hp->n_head * hd;
        n[CV_BK] = n[CV_BV] = (size_t)hp->n_head_kv * hd;
    }
}

int cuda_moe_gu_fused(const struct pxq_layer *L) {
    return L->experts && L->experts[0].gate->type == L->experts[0].up->type;
}

/* The bytes upload_stacked (backend.cu) takes for n_out rows of t's type and row length. */
static void stack_plan(size_t *bytes, const struct pxq_tensor *t, int64_t n_out) {
    size_t q, s;
    cuda_weight_sizes(cuda_wfmt_of(t->type), t->ne[0], n_out, &q, &s);
    *bytes += al(q) + (s ? al(s) : 0);
}

/* A MoE layer's weights as backend.cu uploads them: the router alone; the experts' gate|up (one
 * stack, [gate_e | up_e] per expert, if gate and up have one type; else a gate and an up stack) and
 * down each stacked into one weight, which needs every expert of a role in one type. */
static int moe_plan(const struct pxq_hparams *hp, const struct pxq_layer *L, int il, size_t *w, char *err,
                    size_t errlen) {
    const struct pxq_expert *x = L->experts;
    if (!L->ffn_gate_inp || !x) return set_err(err, errlen, "CUDA backend: MoE layer %d lacks its router or experts", il);
    if (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)
        return set_err(err, errlen, "CUDA backend: top-%d of %d experts", hp->n_expert_used, hp->n_expert);
    if (weight_plan(L->ffn_gate_inp, w, err, errlen)) return -1;
    const struct pxq_tensor *role[3] = {x[0].gate, x[0].up, x[0].down};
    for (int r = 0; r < 3; r++) {
        size_t unused = 0;
        if (weight_plan(role[r], &unused, err, errlen)) return -1; /* the type and row checks */
        for (int e = 1; e < hp->n_expert; e++) {
            const struct pxq_tensor *t = r == 0 ? x[e].gate : r == 1 ? x[e].up : x[e].down;
            if (t->type != role[r]->type)
                return set_err(err, errlen, "CUDA backend: %s is %s but %s is %s (the experts of a layer need one type per matrix)",
                               t->name, type_name(t->type), role[r]->name, type_name(role[r]->type));
        }
    }
    const int64_t E = hp->n_expert, ff = hp->n_ff_exp;
    if (cuda_moe_gu_fused(L)) {
        stack_plan(w, role[0], 2 * E * ff);
    } else {
        stack_plan(w, role[0], E * ff);
        stack_plan(w, role[1], E * ff);
    }
    stack_plan(w, role[2], E * hp->n_embd);
    return 0;
}

void cuda_bufs_of(const struct pxq_hparams *hp, const struct pxq_engine_params *p, size_t max_in, size_t max_mat,
                  size_t w16_max, struct cuda_bufs *bf) {
    memset(bf, 0, sizeof *bf);
    const size_t nb = (size_t)p->n_batch, d = (size_t)hp->n_embd, hd = (size_t)hp->head_dim;
    const size_t q_dim = (size_t)hp->n_head * hd, kv_dim = (size_t)hp->n_head_kv * hd, ff = (size_t)hp->n_ff;
    const size_t wide = d > q_dim ? d : q_dim;
    bf->x = nb * d;
    bf->xb = bf->xb2 = nb * wide;
    bf->qkv = nb * (q_dim + 2 * kv_dim);
    bf->att = nb * q_dim;
    bf->hb = hp->n_expert ? 0 : nb * 3 * ff; /* dense FFN */
    if (hp->n_expert) { /* MoE: per token the router logits, k (id, weight) slots; per (token, slot) pair
                         * gate|up [2 n_ff_exp] then silu(gate) * up [n_ff_exp], and the down output */
        const size_t pairs = nb * (size_t)hp->n_expert_used, ffe = (size_t)hp->n_ff_exp;
        bf->moe_logits = nb * (size_t)hp->n_expert;
        const size_t max_tiles = (pairs + CUDA_MOE_TILE - 1) / CUDA_MOE_TILE + (size_t)hp->n_expert;
        bf->moe_w = pairs;
        bf->moe_ids = 2 * pairs + 3 * max_tiles + 1; /* ids, then the prefill sort: order, tiles, n_tiles */
        bf->moe_hb = pairs * 3 * ffe;
        bf->moe_y = pairs * d;
    }
    bf->logits = (nb < CUDA_LOGITS_ROWS ? nb : CUDA_LOGITS_ROWS) * (size_t)hp->n_vocab;
    if (hp->attn_output_gate) { /* q_proj's [query | gate] rows; a decode token's stacked [q_proj | k | v] */
        bf->qg = nb * 2 * q_dim;
        if (bf->qg < 2 * q_dim + 2 * kv_dim) bf->qg = 2 * q_dim + 2 * kv_dim;
    }
    int n_dn = 0;
    for (int il = 0; il < hp->n_layer; il++) n_dn += hp->layer_kind[il] == LAYER_DELTANET;
    if (n_dn) {
        const size_t nv = (size_t)hp->ssm_n_v_head, value_dim = nv * hp->ssm_head_v_dim;
        const size_t conv_dim = 2 * (size_t)hp->ssm_n_k_head * hp->ssm_head_k_dim + value_dim;
        bf->ssm_qkv = bf->ssm_conv = nb * conv_dim;
        if (bf->ssm_qkv < conv_dim + value_dim + 2 * nv) /* a decode token's stacked [qkv | z | b | a] */
            bf->ssm_qkv = conv_dim + value_dim + 2 * nv;
        bf->ssm_z = bf->ssm_o = nb * value_dim;
        bf->ssm_ba = nb * 2 * nv;
        bf->ssm_count = (size_t)n_dn * CUDA_DECODE_MAX * hp->ssm_n_k_head;
        bf->rstate = (size_t)n_dn * ((size_t)(hp->ssm_conv_kernel - 1) * conv_dim + nv * hp->ssm_head_k_dim * hp->ssm_head_v_dim);
        bf->state = bf->rstate * (size_t)p->n_seq_max * (p->spec_checkpoint ? 2 : 1); /* + the checkpoint slots */
    }
    const size_t max_blocks = (size_t)kv_blocks_for(p->n_ctx, p->kv_block_size);
    const size_t n_tab = nb < (size_t)p->n_seq_max ? nb : (size_t)p->n_seq_max;
    /* token, pos, seq, rows, run_seq, run_off (nb + 1), run_tok, tiles (2 nb), run_snap, then the block
     * tables (step_inputs, backend_impl.cuh) */
    bf->in_ints = 10 * nb + 1 + n_tab * max_blocks;
    /* the decode attention's partials: its splits, and a quantized cache's exact chunks after them */
    const size_t max_splits = ((size_t)p->n_ctx + CUDA_SPLIT_LEN - 1) / CUDA_SPLIT_LEN +
                              (size_t)cuda_exact_chunks(p->kv_type != KV_CACHE_F16, kv_exact_clamp(p->kv_sink, p->n_ctx),
                                                        kv_exact_clamp(p->kv_window, p->n_ctx));
    size_t part_rows = (size_t)CUDA_DECODE_MAX * max_splits;
    if (nb > part_rows) part_rows = nb;
    part_rows *= (size_t)hp->n_head;
    bf->x16 = nb * max_in;
    bf->xq = nb * max_in;
    bf->xds = nb * max_in / 32 * 2 + 2;
    if (hp->n_expert && bf->moe_hb / 3 > bf->xq) { /* q8 form of the pairs' silu(gate) * up for down */
        bf->xq = bf->moe_hb / 3;
        bf->xds = bf->xq / 32 * 2 + 2;
    }
    bf->w16 = 2 * (max_mat < w16_max / 2 ? max_mat : w16_max / 2); /* two tile buffers */
    bf->part_o = part_rows * hd;
    bf->part_ml = part_rows * 2;
    if (p->kv_topk_blocks > 0 && p->attn_window > 0) { /* the blocks each token and KV head sees (kv_select.cu) */
        bf->sel = nb * (size_t)hp->n_head_kv * ((max_blocks + 31) / 32);
        bf->sel_list = (size_t)CUDA_DECODE_MAX * hp->n_head_kv * ((size_t)p->kv_topk_blocks + 1);
        bf->sel_score = (size_t)CUDA_DECODE_MAX * hp->n_head_kv * (size_t)max_blocks;
    }
    if (p->kv_select_cache > 0 && p->kv_offload && bf->sel) { /* the selection cache (kv_selcache.cu) */
        int n_lkv = p->spec_mtp ? hp->n_mtp_layer : 0;
        for (int il = 0; il < hp->n_layer; il++) n_lkv += hp->layer_kind[il] == LAYER_ATTN;
        cuda_selcache_sizes(bf->sel_cache, n_lkv, hp->n_head_kv, p->kv_select_cache, p->kv_topk_blocks, p->kv_blocks);
    }
    if (p->kv_offload) { /* prefill over the host tier (attention_staged.cu): the staging buffers, the passes'
                          * softmax state, and in the step inputs stab, dtab and hlist (pf_stage) */
        bf->kv_stage = CUDA_KV_STAGE_BYTES;
        bf->pf_ml = nb * (size_t)hp->n_head * 2;
        bf->in_ints += 3 * n_tab * max_blocks;
    }
}

void cuda_bufs_bytes(const struct cuda_bufs *bf, size_t *activations, size_t *logits, size_t *workspace,
                     size_t *state) {
    const size_t act[] = {bf->x,       bf->xb,       bf->xb2,   bf->qkv,     bf->att,      bf->hb,
                          bf->qg,      bf->ssm_qkv,  bf->ssm_conv, bf->ssm_z, bf->ssm_ba,   bf->ssm_o,
                          bf->in_ints, bf->ssm_count, bf->moe_logits, bf->moe_ids, bf->moe_w, bf->moe_hb,   bf->moe_y};
    *activations = 0;
    for (size_t i = 0; i < sizeof act / sizeof *act; i++)
        if (act[i]) *activations += al(act[i] * 4);
    *logits = bf->logits ? al(bf->logits * 4) : 0;
    *workspace = al(bf->x16 * 2) + al(bf->xq) + al(bf->xds * 4) + al(bf->w16 * 2) + al(bf->part_o * 4) +
                 al(bf->part_ml * 4) + (bf->sel ? al(bf->sel * 4) + al(bf->sel_list * 4) + al(bf->sel_score * 4) : 0) +
                 (bf->kv_stage ? al(bf->kv_stage) + al(bf->pf_ml * 4) : 0) +
                 al(CUDA_CUBLAS_WS);
    for (int i = 0; i < 8; i++)
        if (bf->sel_cache[i]) *workspace += al(bf->sel_cache[i]);
    *state = bf->state ? al(bf->state * 4) : 0;
}

void cuda_widths_of(const struct pxq_hparams *hp, size_t *max_in, size_t *max_mat) {
    const size_t d = (size_t)hp->n_embd, q_dim = (size_t)hp->n_head * hp->head_dim;
    const size_t q_rows = q_dim * (hp->attn_output_gate ? 2 : 1), kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t in = d > q_dim ? d : q_dim, mat = (size_t)hp->n_vocab * d;
    const size_t rows[] = {q_rows, kv_dim, hp->n_expert ? 0 : (size_t)hp->n_ff};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        if (rows[i] * d > mat) mat = rows[i] * d;
    if (!hp->n_expert && (size_t)hp->n_ff > in) in = (size_t)hp->n_ff;
    if (d * q_dim > mat) mat = d * q_dim;
    if (hp->arch == ARCH_QWEN35) {
        const size_t value_dim = (size_t)hp->ssm_n_v_head * hp->ssm_head_v_dim;
        const size_t conv_dim = 2 * (size_t)hp->ssm_n_k_head * hp->ssm_head_k_dim + value_dim;
        if (value_dim > in) in = value_dim;
        if (conv_dim * d > mat) mat = conv_dim * d;
    }
    *max_in = in;
    *max_mat = mat;
}

int cuda_mem_plan(const struct pxq_model *m, const struct pxq_engine_params *p, const struct kv_layout *lay,
                  struct cuda_plan *plan, char *err, size_t errlen) {
    const struct pxq_hparams *hp = model_hparams(m);
    memset(plan, 0, sizeof *plan);
    const int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    if (hd % 32 != 0 || hd > 256)
        return set_err(err, errlen, "CUDA backend: head_dim %d (attention needs a multiple of 32, at most 256)", hd);
    if (hp->n_head % hp->n_head_kv != 0 || group > 32)
        return set_err(err, errlen, "CUDA backend: n_head %d / n_head_kv %d (at most 32 query heads per KV head)",
                       hp->n_head, hp->n_head_kv);
    size_t w = 0, max_in = (size_t)hp->n_embd, max_mat = 0;
    const int n_mtp = p->spec_mtp ? hp->n_mtp_layer : 0; /* the MTP layers follow the model's (spec_mtp) */
    for (int il = 0; il < hp->n_layer + n_mtp; il++) {
        const struct pxq_layer *L = model_layer(m, il);
        const struct pxq_tensor *mats[CM_COUNT];
        cuda_layer_mats(L, mats);
        const int dn = hp->layer_kind[il] == LAYER_DELTANET;
        for (int i = 0; i < CM_COUNT; i++) {
            const int want = i >= CM_GATE && i <= CM_DOWN ? !hp->n_expert : (i >= CM_SSM_QKV) == dn;
            if (!want) continue;
            if (!mats[i]) return set_err(err, errlen, "CUDA backend: layer %d lacks a weight matrix", il);
            if (weight_plan(mats[i], &w, err, errlen)) return -1;
            if ((size_t)mats[i]->ne[0] > max_in) max_in = (size_t)mats[i]->ne[0];
            size_t ne = (size_t)mats[i]->ne[0] * (size_t)mats[i]->ne[1];
            if (ne > max_mat) max_mat = ne;
        }
        if (hp->n_expert && moe_plan(hp, L, il, &w, err, errlen)) return -1;
        size_t vn[CV_COUNT];
        cuda_layer_vec_sizes(hp, L, il, vn);
        for (int i = 0; i < CV_COUNT; i++)
            if (vn[i]) w += al(vn[i] * 4);
    }
    if (n_mtp) { /* the MTP head's fc and its three norms */
        const struct pxq_tensor *fc = model_layer(m, hp->n_layer)->nextn_eh_proj;
        if (weight_plan(fc, &w, err, errlen)) return -1;
        w += 3 * al((size_t)hp->n_embd * 4);
        if ((size_t)fc->ne[0] > max_in) max_in = (size_t)fc->ne[0];
        if ((size_t)fc->ne[0] * (size_t)fc->ne[1] > max_mat) max_mat = (size_t)fc->ne[0] * (size_t)fc->ne[1];
    }
    size_t embd = 0; /* untied: the embedding table lives in pinned host memory, not the arena */
    if (weight_plan(model_token_embd(m), model_output(m) != model_token_embd(m) ? &embd : &w, err, errlen)) return -1;
    if (model_output(m) != model_token_embd(m)) {
        if (weight_plan(model_output(m), &w, err, errlen)) return -1;
        size_t ne = (size_t)model_output(m)->ne[0] * (size_t)model_output(m)->ne[1];
        if (ne > max_mat) max_mat = ne;
    } else {
        size_t ne = (size_t)model_token_embd(m)->ne[0] * (size_t)model_token_embd(m)->ne[1];
        if (ne > max_mat) max_mat = ne;
    }
    w += al((size_t)hp->n_embd * 4) + al((size_t)(hp->n_rot / 2 + 1) * 4);
    plan->weights = w;
    /* the KV pools as the backend allocates them (kv_step), from the cache's layout */
    plan->kv_per_token = kv_layout_bytes_per_pos(lay);
    plan->kv_tokens = (int64_t)p->kv_blocks * p->kv_block_size;
    const size_t bnd = kv_layout_bounds_bytes(lay) / 2; /* block selection's key minima (or maxima) per block */
    const size_t per_block = kv_layout_tier_block_bytes(lay); /* a block's bytes in the tiers */
    const size_t bounds = bnd ? 2 * al((size_t)p->kv_blocks * bnd) : 0; /* on the device for every block */
    size_t kv_fixed = 0; /* what does not grow with the blocks */
    if (lay->quantized)
        kv_fixed = al(2 * (size_t)lay->n_layer_kv * sizeof(struct kv_layer_desc)) +
                   2 * al(kv_layout_residual_bytes(lay) / 2 * (size_t)p->n_seq_max);
    const size_t pools = al((size_t)p->kv_blocks * lay->block_bytes[KV_K]) + al((size_t)p->kv_blocks * lay->block_bytes[KV_V]) +
                         bounds;
    for (int small = 0; small < 2; small++) { /* whole-matrix tiles, or the small ones: over budget, or a host tier */
        struct cuda_bufs bf;
        plan->w16_max = small ? CUDA_W16_SMALL_ELEMS : CUDA_W16_MAX_ELEMS;
        cuda_bufs_of(hp, p, max_in, max_mat, plan->w16_max, &bf);
        size_t logits;
        cuda_bufs_bytes(&bf, &plan->activations, &logits, &plan->workspace, &plan->state);
        plan->activations += logits;
        const size_t other = plan->weights + kv_fixed + plan->state + plan->activations + plan->workspace;
        plan->kv = kv_fixed + pools, plan->kv_dev_blocks = p->kv_blocks, plan->kv_tier_dev = plan->kv_host = 0;
        if (p->kv_offload) { /* the device tier: the blocks given, else as many as the budget leaves room for */
            int64_t n_dev = cuda_tier_dev_blocks(p->kv_dev_blocks, p->gpu_mem, other + bounds, per_block);
            if (n_dev < 1) n_dev = 1;
            if (n_dev < p->kv_blocks) {
                plan->kv_dev_blocks = (int)n_dev;
                plan->kv_tier_dev = (size_t)n_dev * per_block + CUDA_TIER_SLACK;
                plan->kv_host = (size_t)(p->kv_blocks - n_dev) * per_block;
                plan->kv = kv_fixed + bounds + plan->kv_tier_dev;
            }
        }
        plan->total = other + plan->kv - kv_fixed;
        if (!small && plan->kv_dev_blocks < p->kv_blocks && !p->kv_dev_blocks)
            continue; /* a host tier: the small tiles' 640 MiB go to device blocks, read at device speed (memplan.c) */
        if (!p->gpu_mem || plan->total <= p->gpu_mem) break;
    }
    return 0;
}

void cuda_mem_plan_str(const struct cuda_plan *plan, char *out, size_t cap) {
    const double gib = 1024.0 * 1024.0 * 1024.0, mib = 1024.0 * 1024.0;
    int n = snprintf(out, cap,
                     "weights %.2f GiB + KV %.2f GiB (%.1f KiB/token x %lld tokens) + state %.1f MiB + activations %.1f MiB"
                     " + workspace %.1f MiB = %.2f GiB",
                     plan->weights / gib, plan->kv / gib, plan->kv_per_token / 1024.0, (long long)plan->kv_tokens,
                     plan->state / mib, plan->activations / mib, plan->workspace / mib, plan->total / gib);
    if (plan->kv_host && n > 0 && (size_t)n < cap)
        snprintf(out + n, cap - (size_t)n, "; KV host tier %.2f GiB (device tier %d blocks)", plan->kv_host / gib,
                 plan->kv_dev_blocks);
}

size_t pxq_engine_device_mem_peak(const struct pxq_engine *e) {
#ifdef PXQ_CUDA
    if (e && e->backend) return cuda_backend_peak(e);
#endif
    (void)e;
    return 0;
}

const char *pxq_engine_device_name(const struct pxq_engine *e) {
#ifdef PXQ_CUDA
    if (e && e->backend) return cuda_backend_device(e);
#endif
    (void)e;
    return "cpu";
}

const char *pxq_engine_kernel_path(const struct pxq_engine *e) {
#ifdef PXQ_CUDA
    if (e && e->backend) return cuda_backend_path(e);
#endif
    (void)e;
    return "cpu";
}
