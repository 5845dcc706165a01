/* engine.c - the public API (engine.h): sequences, batch validation, splitting into ubatches,
 * KV block reservation, and the output buffer. The math is in forward_cpu.c. */
#include "engine_impl.h"

#include <stdio.h>
#include <stdlib.h>

#include "cuda/backend.h"
#include "forward_qwen35.h"
#include "kv_calib.h"
#include "ops_cpu.h"
#include "spec.h"
#include "util.h"

int pxq_default_n_ctx(const struct pxq_hparams *hp) {
    return hp->n_ctx_train > 0 && hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
}

struct pxq_engine_params pxq_engine_default_params(void) {
    struct pxq_engine_params p = {0};
    p.n_seq_max = 1;
    p.n_batch = 512;
    p.kv_block_size = KV_BLOCK_SIZE_DEFAULT;
    p.kv_type = KV_CACHE_F16;
    p.kv_sink = KV_SINK_DEFAULT;
    p.kv_window = KV_WINDOW_DEFAULT;
    p.device = PXQ_DEVICE_CPU;
    return p;
}

static float *vec_f32(const struct pxq_tensor *t) {
    if (!t) return NULL;
    float *v = xmalloc((size_t)tensor_nelements(t) * sizeof(float));
    tensor_row_f32(v, t, 0);
    return v;
}

struct kv_spec pxq_kv_spec(const struct pxq_model *m, const struct pxq_engine_params *p) {
    const struct kv_calib *c = m ? model_kv_calib(m) : NULL;
    struct kv_spec spec = {0};
    spec.v8 = p->kv_v8 ? p->kv_v8 : c ? c->v8 : NULL;
    spec.levels = p->kv_levels ? p->kv_levels : c ? c->levels : NULL;
    spec.type = (enum kv_cache_type)p->kv_type;
    spec.exact_f32 = p->device == PXQ_DEVICE_CPU; /* the CPU reference keeps its f16-type cache in float32 */
    spec.n_ctx = p->n_ctx > 0 ? p->n_ctx : (m ? pxq_default_n_ctx(model_hparams(m)) : 0);
    spec.n_sink = p->kv_sink;
    spec.n_window = p->kv_window;
    spec.n_batch = p->n_batch > 0 ? p->n_batch : 512;
    spec.attn_window = p->attn_window;
    spec.attn_sinks = p->attn_sinks;
    spec.topk_blocks = p->kv_topk_blocks;
    return spec;
}

int pxq_kv_layout(struct kv_layout *lay, const struct pxq_model *m, const struct pxq_engine_params *p, char *err,
                  size_t errlen) {
    const struct pxq_hparams *hp = model_hparams(m);
    struct kv_spec spec = pxq_kv_spec(m, p);
    const int n_attn = hparams_n_attn_layers(hp), n_mtp = p->spec_mtp ? hp->n_mtp_layer : 0, nh = hp->n_head_kv;
    uint8_t *v8 = NULL;
    float *lv = NULL;
    if (n_mtp && (spec.v8 || spec.levels)) { /* the calibration covers the model's layers: the MTP layers keep V at 8 bits */
        v8 = xcalloc((size_t)(n_attn + n_mtp) * nh, 1);
        lv = xmalloc((size_t)(n_attn + n_mtp) * nh * 4 * sizeof *lv);
        if (spec.v8) memcpy(v8, spec.v8, (size_t)n_attn * nh);
        memset(v8 + (size_t)n_attn * nh, 1, (size_t)n_mtp * nh);
        for (int i = 0; i < (n_attn + n_mtp) * nh; i++)
            for (int j = 0; j < 4; j++) lv[i * 4 + j] = spec.levels && i < n_attn * nh ? spec.levels[i * 4 + j] : -1.0f + 2.0f * j / 3.0f;
        spec.v8 = v8, spec.levels = lv;
    }
    int rc = kv_layout_init(lay, n_attn + n_mtp, nh, hp->head_dim, p->kv_block_size > 0 ? p->kv_block_size : KV_BLOCK_SIZE_DEFAULT,
                            &spec, err, errlen);
    free(v8), free(lv);
    return rc;
}

struct pxq_engine *pxq_engine_new(struct pxq_model *m, const struct pxq_engine_params *p, char *err, size_t errlen) {
    struct pxq_engine *e = xcalloc(1, sizeof *e);
    e->m = m;
    e->hp = model_hparams(m);
    e->p = p ? *p : pxq_engine_default_params();
    const struct pxq_hparams *hp = e->hp;
    if (e->p.n_ctx <= 0) e->p.n_ctx = pxq_default_n_ctx(hp);
    if (e->p.n_seq_max <= 0) e->p.n_seq_max = 1;
    if (e->p.n_batch <= 0) e->p.n_batch = 512;
    if (e->p.kv_block_size <= 0) e->p.kv_block_size = KV_BLOCK_SIZE_DEFAULT;
    if (e->p.n_threads <= 0) e->p.n_threads = n_cpus();
#ifndef PXQ_CUDA
    if (e->p.device != PXQ_DEVICE_CPU) {
        set_err(err, errlen, "this build has no CUDA backend (use --device cpu)");
        free(e);
        return NULL;
    }
#endif
    if (kv_attention_check(e->p.n_ctx, e->p.attn_window, e->p.attn_sinks, e->p.kv_topk_blocks, err, errlen) != 0) {
        free(e);
        return NULL;
    }
    if (kv_select_cache_check(e->p.kv_select_cache, e->p.kv_offload, e->p.kv_topk_blocks, e->p.device == PXQ_DEVICE_CPU,
                              err, errlen) != 0) {
        free(e);
        return NULL;
    }
    if (e->p.spec_mtp && !hp->n_mtp_layer) {
        set_err(err, errlen, "--spec mtp: %s has no MTP layer (Qwen3.5's mtp.* / GGUF nextn tensors)", model_path(m));
        free(e);
        return NULL;
    }
    /* window attention without block selection: each sequence's blocks past its window are given back
     * as it advances (window_step), so the pool holds a window's worth a sequence */
    e->window_free = e->p.attn_window > 0 && !e->p.kv_topk_blocks && !e->p.kv_keep_past_window;
    const int64_t per_seq = e->window_free ? kv_blocks_per_seq(e->p.n_ctx, e->p.kv_block_size, e->p.attn_window,
                                                               e->p.attn_sinks, 0, e->p.n_batch)
                                           : kv_blocks_for(e->p.n_ctx, e->p.kv_block_size);
    if (e->p.kv_blocks <= 0) e->p.kv_blocks = (int)per_seq * e->p.n_seq_max;
    /* the selection cache's slots come on top of the sequences' pool (a host tier takes them from its device tier) */
    if (e->p.kv_offload && e->p.kv_topk_blocks) e->p.kv_blocks += e->p.kv_select_cache;
    int n_kv = 0;
    for (int il = 0; il < hp->n_layer; il++) e->kv_layer[il] = hp->layer_kind[il] == LAYER_ATTN ? n_kv++ : -1;
    e->n_lw = hp->n_layer + (e->p.spec_mtp ? hp->n_mtp_layer : 0);
    for (int il = hp->n_layer; il < e->n_lw; il++) e->kv_layer[il] = n_kv++; /* the MTP layers' KV follows */
    struct kv_layout lay;
    const struct kv_spec spec = pxq_kv_spec(e->m, &e->p);
    static int warned_uncalibrated;
    if (spec.type == KV_CACHE_PXQ && !spec.v8 && !spec.levels && !warned_uncalibrated) {
        warned_uncalibrated = 1; /* once per process: perplexity's second engine, serve's restarts */
        fprintf(stderr, "pxq: warning: %s has no KV calibration (pxq.kv.* keys; pxq kv-calibrate writes them): "
                "--kv-cache-type pxq uses the uniform 2-bit levels and keeps no V head at 8 bits\n", model_path(m));
    }
    if (pxq_kv_layout(&lay, m, &e->p, err, errlen) != 0) {
        free(e);
        return NULL;
    }
    /* the CUDA backend holds K/V on the device: the host pool keeps only the block accounting */
    if (kv_cache_init(&e->kv, &lay, e->p.kv_blocks, e->p.device == PXQ_DEVICE_CPU, err, errlen) != 0) {
        free(e);
        return NULL;
    }
    /* a host tier: the CUDA backend's (if the budget leaves too little room), or the CPU's with
     * --kv-device-blocks below the pool (its tiers share host memory: the reference of the policy) */
    const int cpu_tier = e->p.kv_offload && e->p.device == PXQ_DEVICE_CPU && e->p.kv_dev_blocks > 0 &&
                         e->p.kv_dev_blocks < e->kv.n_blocks;
    const int tier = cpu_tier || (e->p.kv_offload && e->p.device != PXQ_DEVICE_CPU);
    /* prefix caching: not with a quantized cache (its residual is per sequence), nor where blocks past
     * the window are given back (a matched prefix would hold more blocks than the window's cap), nor
     * with a host tier (a block moved to it leaves the hash table) */
    e->kv.prefix = e->p.prefix_caching && !e->kv.lay.quantized && pxq_engine_can_share_kv(e) && !e->window_free && !tier;
    if (e->window_free) e->kv.seq_blocks_max = (int)per_seq;
    e->ubatch_blocks = e->window_free || tier;
    if (cpu_tier) {
        if (kv_tier_check(&e->kv.lay, e->kv.n_blocks, e->p.kv_dev_blocks, e->p.swap_space, err, errlen) != 0 ||
            kv_cache_tier(&e->kv, e->p.kv_dev_blocks) != 0) {
            kv_cache_free(&e->kv);
            free(e);
            return NULL;
        }
    }
    e->tp = threadpool_new(e->p.n_threads);
    e->seqs = xcalloc((size_t)e->p.n_seq_max, sizeof *e->seqs);
    e->lw = xcalloc((size_t)e->n_lw, sizeof *e->lw);
    for (int il = 0; il < e->n_lw; il++) {
        const struct pxq_layer *L = model_layer(m, il);
        struct layer_f32 *w = &e->lw[il];
        w->attn_norm = vec_f32(L->attn_norm);
        w->ffn_norm = vec_f32(L->ffn_norm);
        w->q_norm = vec_f32(L->attn_q_norm);
        w->k_norm = vec_f32(L->attn_k_norm);
        w->bq = vec_f32(L->attn_q_b);
        w->bk = vec_f32(L->attn_k_b);
        w->bv = vec_f32(L->attn_v_b);
    }
    e->output_norm = vec_f32(model_output_norm(m));
    if (e->p.spec_mtp) {
        const struct pxq_layer *M = model_layer(m, hp->n_layer);
        e->mtp_enorm = vec_f32(M->nextn_enorm);
        e->mtp_hnorm = vec_f32(M->nextn_hnorm);
        e->mtp_head_norm = vec_f32(M->nextn_shared_head_norm);
    }
    e->inv_freq = xmalloc((size_t)(hp->n_rot / 2 + 1) * sizeof(float));
    rope_table(e->inv_freq, hp->n_rot, hp->rope_theta, &hp->rope_scaling, hp->n_ctx_train, NULL);
    size_t nb = (size_t)e->p.n_batch;
    size_t q_dim = (size_t)hp->n_head * hp->head_dim * (hp->attn_output_gate ? 2 : 1);
    size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t ff = (size_t)(hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp);
    size_t wide = (size_t)hp->n_embd > q_dim ? (size_t)hp->n_embd : q_dim;
    e->x = xmalloc(nb * hp->n_embd * sizeof(float));
    e->xb = xmalloc(nb * wide * sizeof(float));
    e->xb2 = xmalloc(nb * wide * sizeof(float));
    e->q = xmalloc(nb * q_dim * sizeof(float));
    e->k = xmalloc(nb * kv_dim * sizeof(float));
    e->v = xmalloc(nb * kv_dim * sizeof(float));
    e->att = xmalloc(nb * q_dim * sizeof(float));
    e->hb = xmalloc(nb * ff * sizeof(float));
    e->hb2 = xmalloc(nb * ff * sizeof(float));
    e->router = xmalloc(nb * (size_t)(hp->n_expert + 1) * sizeof(float));
    if (hp->arch == ARCH_QWEN35 && qwen35_engine_init(e, err, errlen) != 0) {
        pxq_engine_free(e);
        return NULL;
    }
#ifdef PXQ_CUDA
    if (e->p.device == PXQ_DEVICE_CUDA) { /* KV lives on the device (the host pool has no storage) */
        if (cuda_backend_new(e, err, errlen) != 0) {
            pxq_engine_free(e);
            return NULL;
        }
    }
#endif
    return e;
}

static void logits_free(struct pxq_engine *e) {
#ifdef PXQ_CUDA
    if (e->logits_pinned) cuda_host_free(e->logits);
    else
#endif
        free(e->logits);
    e->logits = NULL, e->logits_pinned = 0;
}

/* n floats of logits: pinned host memory when the CUDA backend runs (its step's device-to-host copy
 * then goes straight over the bus) and they are at most 256 MiB (decode steps' few rows; not the
 * every-row logits of a long perplexity chunk, which would lock gigabytes of host memory), else
 * the heap */
static void logits_alloc(struct pxq_engine *e, size_t n) {
#ifdef PXQ_CUDA
    if (e->backend && n <= ((size_t)256 << 20) / sizeof(float) && (e->logits = cuda_host_floats(n)) != NULL) {
        e->logits_pinned = 1;
        return;
    }
#endif
    e->logits = xmalloc(n * sizeof(float));
}

void pxq_engine_free(struct pxq_engine *e) {
    if (!e) return;
#ifdef PXQ_CUDA
    cuda_backend_free(e);
#endif
    for (int s = 0; s < e->p.n_seq_max; s++) {
        free(e->seqs[s].kv.blocks);
        free(e->seqs[s].kv.bh);
        free(e->seqs[s].kv.res[0]), free(e->seqs[s].kv.res[1]); /* a quantized cache's residual */
        free(e->seqs[s].rstate), free(e->seqs[s].ck_state);
    }
    qwen35_engine_free(e);
    for (int il = 0; il < e->n_lw; il++) {
        struct layer_f32 *w = &e->lw[il];
        free(w->attn_norm), free(w->ffn_norm), free(w->q_norm), free(w->k_norm), free(w->bq), free(w->bk), free(w->bv);
    }
    free(e->lw);
    free(e->seqs);
    free(e->output_norm);
    free(e->mtp_enorm), free(e->mtp_hnorm), free(e->mtp_head_norm), free(e->hidden);
    free(e->inv_freq);
    free(e->x), free(e->xb), free(e->xb2), free(e->q), free(e->k), free(e->v), free(e->att);
    free(e->hb), free(e->hb2), free(e->router);
    logits_free(e);
    kv_cache_free(&e->kv);
    threadpool_free(e->tp);
    free(e);
}

struct pxq_model *pxq_engine_model(struct pxq_engine *e) { return e->m; }
const struct pxq_engine_params *pxq_engine_params(const struct pxq_engine *e) { return &e->p; }

int pxq_seq_new(struct pxq_engine *e) {
    for (int s = 0; s < e->p.n_seq_max; s++)
        if (!e->seqs[s].in_use) {
            e->seqs[s].in_use = 1;
            e->seqs[s].n_pos = 0;
            e->seqs[s].n_mtp = 0;
            e->seqs[s].ck_valid = 0;
            e->seqs[s].ck_at = -1;
            return s;
        }
    return -1;
}

void pxq_seq_free(struct pxq_engine *e, int seq) {
    if (seq < 0 || seq >= e->p.n_seq_max || !e->seqs[seq].in_use) return;
    kv_seq_shrink(&e->kv, &e->seqs[seq].kv, 0);
    free(e->seqs[seq].rstate);
    e->seqs[seq].rstate = NULL;
    e->seqs[seq].rstate_live = 0;
    e->seqs[seq].in_use = 0;
    e->seqs[seq].n_pos = 0;
}

int pxq_seq_len(const struct pxq_engine *e, int seq) {
    if (seq < 0 || seq >= e->p.n_seq_max || !e->seqs[seq].in_use) return -1;
    return e->seqs[seq].n_pos;
}

int pxq_seq_truncate(struct pxq_engine *e, int seq, int n_pos) {
    if (seq < 0 || seq >= e->p.n_seq_max || !e->seqs[seq].in_use) return -1;
    struct pxq_seq *s = &e->seqs[seq];
    if (n_pos < 0 || n_pos > s->n_pos) return -1;
    /* a quantized cache's residual ring holds max(n_batch, 64) positions beyond the window: a longer
     * rollback would read exact rows that later positions overwrote */
    if (e->kv.lay.quantized && e->kv.lay.n_ring && n_pos && s->n_pos - n_pos > e->kv.lay.n_ring - e->kv.lay.n_window) return -1;
    if (s->rstate_live && n_pos != s->n_pos && n_pos != 0) return -1; /* recurrent state cannot rewind */
    if (n_pos == 0 && s->rstate_live) { /* recreated, zeroed, by the next forward */
        free(s->rstate);
        s->rstate = NULL;
        s->rstate_live = 0;
    }
    if (kv_seq_shrink(&e->kv, &s->kv, n_pos) != 0) return -1; /* a shared block without host storage to copy it */
    s->n_pos = n_pos;
    if (s->n_mtp > n_pos) s->n_mtp = n_pos;
    return 0;
}

int pxq_seq_checkpoint_at(struct pxq_engine *e, int seq, int pos) {
    if (seq < 0 || seq >= e->p.n_seq_max || !e->seqs[seq].in_use || pos < e->seqs[seq].n_pos) return -1;
    if (pos == e->seqs[seq].n_pos) return pxq_seq_checkpoint(e, seq);
    e->seqs[seq].ck_at = pos; /* pxq_decode takes it when the sequence reaches pos */
    e->seqs[seq].ck_valid = 0;
    return 0;
}

int pxq_seq_checkpoint(struct pxq_engine *e, int seq) {
    if (seq < 0 || seq >= e->p.n_seq_max || !e->seqs[seq].in_use) return -1;
    struct pxq_seq *s = &e->seqs[seq];
    s->ck_at = -1;
    s->ck_pos = s->n_pos;
    s->ck_live = s->rstate_live;
    s->ck_valid = 1;
    if (!s->rstate_live) return 0; /* the state at the checkpoint is zero */
#ifdef PXQ_CUDA
    if (e->backend) return cuda_seq_checkpoint(e, seq, 0);
#endif
    if (!s->ck_state) s->ck_state = xmalloc(e->rstate_floats * sizeof(float));
    memcpy(s->ck_state, s->rstate, e->rstate_floats * sizeof(float));
    return 0;
}

int pxq_seq_rollback(struct pxq_engine *e, int seq, int n_pos) {
    if (seq < 0 || seq >= e->p.n_seq_max || !e->seqs[seq].in_use) return -1;
    struct pxq_seq *s = &e->seqs[seq];
    if (n_pos < 0 || n_pos > s->n_pos) return -1;
    if (n_pos == s->n_pos) return n_pos;
    if (!s->rstate_live) return pxq_seq_truncate(e, seq, n_pos) == 0 ? n_pos : -1; /* attention only */
    if (!s->ck_valid || s->ck_pos > n_pos) return -1;
    const int to = s->ck_pos;
    s->rstate_live = 0; /* pxq_seq_truncate's check of a state it cannot rewind */
    if (pxq_seq_truncate(e, seq, to) != 0) {
        s->rstate_live = 1;
        return -1;
    }
    if (s->ck_live) {
#ifdef PXQ_CUDA
        if (e->backend) {
            if (cuda_seq_checkpoint(e, seq, 1) != 0) return -1;
        } else
#endif
            memcpy(s->rstate, s->ck_state, e->rstate_floats * sizeof(float));
        s->rstate_live = 1;
    } else if (!e->backend) { /* zero at the checkpoint: the next forward starts a fresh state */
        free(s->rstate);
        s->rstate = NULL;
    }
    return to;
}

int pxq_engine_can_share_kv(const struct pxq_engine *e) {
    for (int il = 0; il < e->hp->n_layer; il++)
        if (e->hp->layer_kind[il] != LAYER_ATTN) return 0;
    return 1;
}

int pxq_seq_fork(struct pxq_engine *e, int dst, int src) {
    if (src < 0 || src >= e->p.n_seq_max || dst < 0 || dst >= e->p.n_seq_max || src == dst) return -1;
    if (!e->seqs[src].in_use || !e->seqs[dst].in_use || e->seqs[dst].n_pos || !pxq_engine_can_share_kv(e)) return -1;
    if (e->backend) return -1; /* the partial block and the residual live on the device: no copy there yet */
    if (kv_seq_fork(&e->kv, &e->seqs[dst].kv, &e->seqs[src].kv, e->seqs[src].n_pos) != 0) return -1;
    e->seqs[dst].n_pos = e->seqs[src].n_pos;
    return 0;
}

int pxq_prefix_caching(const struct pxq_engine *e) { return e->kv.prefix; }

void pxq_prefix_commit(struct pxq_engine *e, int seq, const int32_t *tokens, int n) {
    if (seq < 0 || seq >= e->p.n_seq_max || !e->seqs[seq].in_use) return;
    struct pxq_seq *s = &e->seqs[seq];
    kv_prefix_commit(&e->kv, &s->kv, tokens, n < s->n_pos ? n : s->n_pos);
}

int pxq_prefix_match(struct pxq_engine *e, int seq, const int32_t *tokens, int n) {
    if (seq < 0 || seq >= e->p.n_seq_max || !e->seqs[seq].in_use || e->seqs[seq].n_pos || n < 2) return 0;
    struct pxq_seq *s = &e->seqs[seq];
    s->n_pos = kv_prefix_match(&e->kv, &s->kv, tokens, n, (n - 1) / e->kv.lay.block_size) * e->kv.lay.block_size;
    return s->n_pos;
}

int pxq_kv_blocks_total(const struct pxq_engine *e) { return e->kv.n_blocks - e->kv.n_reserved; }
int pxq_kv_blocks_free(const struct pxq_engine *e) { return e->kv.n_free; }
int pxq_kv_block_size(const struct pxq_engine *e) { return e->kv.lay.block_size; }
int pxq_kv_blocks_for_seq(const struct pxq_engine *e, int n_pos) {
    int64_t n = kv_blocks_for(n_pos, e->kv.lay.block_size);
    if (e->kv.seq_blocks_max > 0 && n > e->kv.seq_blocks_max) n = e->kv.seq_blocks_max;
    return (int)n;
}

int pxq_kv_seq_positions(const struct pxq_engine *e) {
    const int n = pxq_kv_blocks_total(e); /* the selection cache's slots hold no sequence */
    if (e->kv.seq_blocks_max > 0 && n >= e->kv.seq_blocks_max) return e->p.n_ctx;
    return n * e->kv.lay.block_size;
}

void pxq_kv_tier_stats(const struct pxq_engine *e, struct pxq_kv_tier_stats *st) {
    const struct kv_cache *c = &e->kv;
    const size_t kv = kv_layout_tier_block_bytes(&c->lay);
    memset(st, 0, sizeof *st);
    st->n_dev = c->n_dev - c->n_reserved, st->n_host = c->n_blocks - c->n_dev, st->host_used = st->n_host - c->n_empty_host;
    st->moved = c->n_offloaded;
#ifdef PXQ_CUDA
    if (e->backend) {
        uint64_t sc[3];
        st->staged = cuda_backend_staged(e);
        cuda_backend_selcache(e, sc);
        st->sc_hits = sc[0], st->sc_fills = sc[1], st->sc_in_place = sc[2];
    }
#endif
    for (int s = 0; s < e->p.n_seq_max; s++) {
        if (!e->seqs[s].in_use) continue;
        const int h = kv_seq_host_blocks(c, &e->seqs[s].kv), k = e->p.kv_topk_blocks;
        st->host_read_step += k ? (double)(h < k ? h : k) * kv : (double)h * kv; /* the bounds stay on the device */
    }
}

int pxq_kv_blocks_needed(const struct pxq_engine *e, int seq, int n_pos) {
    if (seq < 0 || seq >= e->p.n_seq_max) return -1;
    return kv_seq_blocks_needed(&e->kv, &e->seqs[seq].kv, n_pos);
}

int pxq_n_outputs(const struct pxq_engine *e) { return e->n_outputs; }
const float *pxq_hidden(const struct pxq_engine *e, int i) {
    if (!e->hidden || i < 0 || i >= e->n_hidden) return NULL;
    return e->hidden + (size_t)i * (size_t)e->hp->n_embd;
}
const float *pxq_logits(const struct pxq_engine *e, int i) {
    if (i < 0 || i >= e->n_outputs) return NULL;
    return e->logits + (size_t)i * (size_t)e->hp->n_vocab;
}

int *engine_outputs(struct pxq_engine *e, const struct pxq_batch *b) {
    const int n = b->n_tokens;
    int *out_idx = xmalloc((size_t)n * sizeof *out_idx);
    int n_out = 0;
    for (int i = 0; i < n; i++) out_idx[i] = (b->logits ? b->logits[i] != 0 : i == n - 1) ? n_out++ : -1;
    if (n_out > e->logits_cap) {
        logits_free(e);
        logits_alloc(e, (size_t)n_out * (size_t)e->hp->n_vocab);
        e->logits_cap = n_out;
    }
    e->n_outputs = n_out;
    if (e->p.spec_mtp) { /* every token's final hidden state, for the MTP head */
        if (n > e->hidden_cap) {
            free(e->hidden);
            e->hidden = xmalloc((size_t)n * e->hp->n_embd * sizeof(float));
            e->hidden_cap = n;
        }
        e->n_hidden = n;
    }
    return out_idx;
}

_Static_assert(SPEC_K_MAX + 1 <= KV_ROLLBACK_MIN, "a speculative rollback stays within the window's margin");

/* The host tier (kv_offload): before a ubatch, room in the device tier for its new blocks, made by
 * moving the oldest cold blocks of the sequences (those before their window, or before the rollback
 * margin under full attention) to the host tier; the CUDA backend copies them (cuda_kv_move). */
static void offload_for(struct pxq_engine *e, int want) {
    int short_ = want - e->kv.n_empty;
    if (short_ <= 0 || e->kv.n_dev == e->kv.n_blocks) return;
    struct kv_move *mv = xmalloc((size_t)short_ * sizeof *mv);
    for (int s = 0; s < e->p.n_seq_max && short_ > 0; s++) {
        if (!e->seqs[s].in_use) continue;
        const int keep = e->seqs[s].n_pos - e->p.attn_window - kv_window_margin(e->p.n_batch);
        const int n = kv_seq_offload(&e->kv, &e->seqs[s].kv, keep, short_, mv);
#ifdef PXQ_CUDA
        if (n && e->backend) cuda_kv_move(e, mv, n);
#endif
        short_ -= n;
    }
    free(mv);
}

/* Blocks reserved per ubatch (e->ubatch_blocks): before it, the blocks of its positions (with the host
 * tier, after making room on the device: offload_for); after it, with window attention without block
 * selection (e->window_free), the blocks wholly before the first position any later query sees, less
 * the rollback margin (kv_window_margin), given back. The reservations cannot fail: pxq_decode checked
 * each sequence's growth against the pool (with the cap of kv_blocks_per_seq, which no sequence
 * exceeds, where blocks are given back). */
static int last_of_seq(const struct ubatch *ub, int i) { /* token i is its sequence's last in ub */
    return !(i + 1 < ub->n && ub->seq_id[i + 1] == ub->seq_id[i] && ub->pos[i + 1] > ub->pos[i]);
}

static void ubatch_kv(struct pxq_engine *e, const struct ubatch *ub, int before) {
    if (before && e->kv.n_dev < e->kv.n_blocks) { /* a host tier */
        int want = 0;
        for (int i = 0; i < ub->n; i++)
            if (last_of_seq(ub, i)) want += kv_seq_blocks_needed(&e->kv, &e->seqs[ub->seq_id[i]].kv, ub->pos[i] + 1);
        offload_for(e, want);
    }
    for (int i = 0; i < ub->n; i++) {
        const int s = ub->seq_id[i];
        if (!last_of_seq(ub, i)) continue;
        struct kv_seq *kv = &e->seqs[s].kv;
        if (before) {
            if (kv_seq_reserve(&e->kv, kv, ub->pos[i] + 1) != 0) die("KV reserve in a ubatch");
        } else if (e->window_free) {
            kv_seq_release_before(&e->kv, kv, e->seqs[s].n_pos - e->p.attn_window - kv_window_margin(e->p.n_batch));
        }
    }
}

/* Forward over the batch's tokens idx[0..m) (batch order, each sequence's in position order), in
 * ubatches of n_batch; hidden states (spec_mtp) go to their batch rows of e->hidden. */
static void run_tokens(struct pxq_engine *e, const struct pxq_batch *b, const int *out_idx, const int *idx, int m) {
    const size_t d = (size_t)e->hp->n_embd;
    int contiguous = 1;
    for (int i = 0; i < m; i++) contiguous &= idx[i] == idx[0] + i;
    int32_t *tok = NULL, *pos = NULL, *sid = NULL;
    int *oi = NULL;
    float *hid = NULL;
    if (!contiguous) { /* gathered, and the hidden rows scattered back after */
        tok = xmalloc((size_t)m * 3 * sizeof *tok), pos = tok + m, sid = pos + m;
        oi = xmalloc((size_t)m * sizeof *oi);
        for (int i = 0; i < m; i++) tok[i] = b->token[idx[i]], pos[i] = b->pos[idx[i]], sid[i] = b->seq_id[idx[i]], oi[i] = out_idx[idx[i]];
        if (e->p.spec_mtp) hid = xmalloc((size_t)m * d * sizeof *hid);
    }
    for (int i0 = 0; i0 < m; i0 += e->p.n_batch) {
        const int k = idx[0];
        struct ubatch ub = {m - i0 < e->p.n_batch ? m - i0 : e->p.n_batch,
                            contiguous ? b->token + k + i0 : tok + i0, contiguous ? b->pos + k + i0 : pos + i0,
                            contiguous ? b->seq_id + k + i0 : sid + i0, contiguous ? out_idx + k + i0 : oi + i0,
                            !e->p.spec_mtp ? NULL : contiguous ? e->hidden + (size_t)(k + i0) * d : hid + (size_t)i0 * d, NULL};
        if (e->ubatch_blocks) ubatch_kv(e, &ub, 1);
#ifdef PXQ_CUDA
        if (e->backend) forward_cuda(e, &ub);
        else
#endif
            forward_cpu(e, &ub);
        for (int i = 0; i < ub.n; i++) e->seqs[ub.seq_id[i]].n_pos++;
        if (e->window_free) ubatch_kv(e, &ub, 0);
    }
    if (hid)
        for (int i = 0; i < m; i++) memcpy(e->hidden + (size_t)idx[i] * d, hid + (size_t)i * d, d * sizeof *hid);
    free(tok), free(oi), free(hid);
}

/* A batch with checkpoints due inside it on the CUDA backend: first the tokens before each due
 * checkpoint, then the checkpoints, then the rest (two forward passes; the logits rows are all in
 * the second). */
static void decode_split(struct pxq_engine *e, const struct pxq_batch *b, const int *out_idx) {
    const int n = b->n_tokens;
    int *idx = xmalloc((size_t)n * sizeof *idx), m1 = 0, m2 = 0;
    char *first = xcalloc((size_t)n, 1);
    for (int i = 0; i < n; i++) {
        const struct pxq_seq *sq = &e->seqs[b->seq_id[i]];
        if (sq->ck_at > sq->n_pos && b->pos[i] < sq->ck_at) idx[m1++] = i, first[i] = 1;
    }
    run_tokens(e, b, out_idx, idx, m1);
    for (int s = 0; s < e->p.n_seq_max; s++)
        if (e->seqs[s].in_use && e->seqs[s].ck_at >= 0 && e->seqs[s].ck_at == e->seqs[s].n_pos) pxq_seq_checkpoint(e, s);
    for (int i = 0; i < n; i++)
        if (!first[i]) idx[m1 + m2++] = i;
    run_tokens(e, b, out_idx, idx + m1, m2);
    free(idx), free(first);
}

int engine_check_row(const struct pxq_engine *e, const struct pxq_batch *b, int i, const char *what, char *err,
                     size_t errlen) {
    const int s = b->seq_id[i];
    if (s < 0 || s >= e->p.n_seq_max || !e->seqs[s].in_use)
        return set_err(err, errlen, "%s %d: sequence %d does not exist", what, i, s);
    if (b->token[i] < 0 || b->token[i] >= e->hp->n_vocab)
        return set_err(err, errlen, "%s %d: id %d out of range [0, %d)", what, i, b->token[i], e->hp->n_vocab);
    return 0;
}

int pxq_decode(struct pxq_engine *e, const struct pxq_batch *b, char *err, size_t errlen) {
    const int n = b->n_tokens;
    if (n <= 0 || !b->token || !b->pos || !b->seq_id) return set_err(err, errlen, "empty batch");
    /* validate; count tokens per sequence to check positions and KV blocks */
    int *added = xcalloc((size_t)e->p.n_seq_max, sizeof *added);
    int rc = -1;
    for (int i = 0; i < n; i++) {
        int s = b->seq_id[i];
        if (engine_check_row(e, b, i, "token", err, errlen) != 0) goto out;
        int want = e->seqs[s].n_pos + added[s];
        if (b->pos[i] != want) {
            set_err(err, errlen, "token %d: position %d, expected %d for sequence %d", i, b->pos[i], want, s);
            goto out;
        }
        if (want >= e->p.n_ctx) {
            set_err(err, errlen, "sequence %d: context full (n_ctx %d)", s, e->p.n_ctx);
            goto out;
        }
        added[s]++;
    }
    int split = 0; /* a checkpoint due inside the batch (pxq_seq_checkpoint_at) */
    for (int i = 0; i < n; i++) {
        const struct pxq_seq *sq = &e->seqs[b->seq_id[i]];
        if (sq->ck_at > sq->n_pos && b->pos[i] < sq->ck_at) {
            split = 1;
            if (b->logits && b->logits[i]) {
                set_err(err, errlen, "token %d: logits asked before sequence %d's checkpoint at %d", i, b->seq_id[i], sq->ck_at);
                goto out;
            }
        }
    }
    for (int s = 0; s < e->p.n_seq_max; s++)
        if (e->seqs[s].in_use && e->seqs[s].ck_at > e->seqs[s].n_pos + added[s]) {
            set_err(err, errlen, "sequence %d: its checkpoint at %d is past the batch's last position", s, e->seqs[s].ck_at);
            goto out;
        }
    int need = 0;
    for (int s = 0; s < e->p.n_seq_max; s++)
        if (added[s]) need += kv_seq_blocks_needed(&e->kv, &e->seqs[s].kv, e->seqs[s].n_pos + added[s]);
    if (need > e->kv.n_free) {
        set_err(err, errlen, "KV cache full: the batch needs %d blocks, %d free", need, e->kv.n_free);
        goto out;
    }
    for (int s = 0; s < e->p.n_seq_max && !e->ubatch_blocks; s++) /* else per ubatch (ubatch_kv) */
        if (added[s] && kv_seq_reserve(&e->kv, &e->seqs[s].kv, e->seqs[s].n_pos + added[s]) != 0) die("KV reserve after check");
    int *out_idx = engine_outputs(e, b);
    int two_passes = 0;
#ifdef PXQ_CUDA
    two_passes = split && e->backend && !cuda_inner_checkpoints(e); /* no slots in the arena */
#else
    (void)split;
#endif
    if (two_passes) {
        decode_split(e, b, out_idx);
    } else { /* the DeltaNet layers copy the state at the checkpoint as they pass it (forward_qwen35.c; on
              * CUDA the kernels write it into the checkpoint slot, forward_cuda) */
        int *all = xmalloc((size_t)n * sizeof *all);
        for (int i = 0; i < n; i++) all[i] = i;
        run_tokens(e, b, out_idx, all, n);
        free(all);
        for (int s = 0; s < e->p.n_seq_max; s++) {
            struct pxq_seq *sq = &e->seqs[s];
            if (!sq->in_use || sq->ck_at < 0 || sq->n_pos < sq->ck_at) continue;
            sq->ck_pos = sq->ck_at, sq->ck_live = sq->rstate_live, sq->ck_valid = 1, sq->ck_at = -1;
        }
    }
    free(out_idx);
    rc = 0;
out:
    free(added);
    return rc;
}
