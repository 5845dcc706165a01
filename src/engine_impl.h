/* engine_impl.h - the engine's internals, shared by engine.c and the backends' forward passes
 * (forward_cpu.c, cuda/). Not part of the public API. */
#ifndef PXQ_ENGINE_IMPL_H
#define PXQ_ENGINE_IMPL_H

#include "engine.h"
#include "kvcache.h"
#include "threadpool.h"

struct pxq_seq {
    int in_use;
    int n_pos;              /* positions in the cache */
    struct kv_seq kv;       /* block table */
    float *rstate;          /* recurrent state of DeltaNet layers (qwen35, CPU), NULL otherwise */
    int rstate_live;        /* the backend holds a state for this sequence (it starts at zero when 0) */
};

/* Small per-layer vectors, converted to float32 once at engine creation. NULL where absent. */
struct layer_f32 {
    float *attn_norm, *ffn_norm, *q_norm, *k_norm, *bq, *bk, *bv;
    /* Gated DeltaNet (forward_qwen35.c): A = -exp(A_log) [n_v_head], dt_bias [n_v_head],
     * gated norm [head_v_dim], conv1d [conv_dim][conv_kernel] */
    float *ssm_a, *ssm_dt, *ssm_norm, *ssm_conv1d;
};

/* One forward step's tokens (a slice of a validated pxq_batch). */
struct ubatch {
    int n;
    const int32_t *token, *pos, *seq_id;
    const int *out_idx;     /* [n] row in e->logits, or -1 */
};

struct pxq_engine {
    struct pxq_model *m;
    const struct pxq_hparams *hp;
    struct pxq_engine_params p;
    struct threadpool *tp;
    struct kv_cache kv;
    int kv_layer[PXQ_MAX_LAYERS];   /* layer -> index among attention layers, or -1 */
    struct pxq_seq *seqs;           /* [n_seq_max] */
    struct layer_f32 *lw;           /* [n_layer] */
    float *output_norm;             /* [n_embd] */
    float *inv_freq;                /* [n_rot/2] */
    /* activations for up to n_batch tokens */
    float *x, *xb, *xb2, *q, *k, *v, *att, *hb, *hb2, *router;
    /* outputs */
    float *logits;                  /* [n_outputs][n_vocab] */
    int n_outputs, logits_cap;
    int logits_pinned;              /* logits from cuda_host_floats (the CUDA backend's steps) */
    void *backend;                  /* device backend state (CUDA) */
    /* Qwen3.5 hybrid (forward_qwen35.c) */
    int dn_layer[PXQ_MAX_LAYERS];   /* layer -> index among DeltaNet layers, or -1 */
    size_t rstate_floats;           /* per sequence: conv + delta-rule state of all DeltaNet layers */
    float *ssm_qkv, *ssm_conv, *ssm_z, *ssm_ba, *ssm_o; /* [n_batch][conv_dim], same, [..][value_dim], [..][2*n_v_head], [..][value_dim] */
};

/* Run the model over one ubatch on the CPU: positions were validated and KV blocks reserved. */
void forward_cpu(struct pxq_engine *e, const struct ubatch *ub);
/* Qwen3.5's DeltaNet layers and engine set-up: forward_qwen35.h. */
#endif
