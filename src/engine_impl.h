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
    /* pxq_seq_checkpoint: position, whether a state existed then, and its copy (CPU; CUDA keeps it on the device) */
    int ck_pos, ck_valid, ck_live;
    int ck_at;              /* pxq_seq_checkpoint_at: a checkpoint due when the sequence reaches ck_at (-1: none) */
    float *ck_state;
    int n_mtp;              /* MTP rows in the cache (positions 0..n_mtp-1 of the MTP layer) */
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
    float *hidden;          /* [n][n_embd] the final hidden states out (params.spec_mtp), or NULL */
    const float *hidden_in; /* MTP steps: [n][n_embd] the h of each row (mtp.c), else NULL */
};

struct pxq_engine {
    struct pxq_model *m;
    const struct pxq_hparams *hp;
    struct pxq_engine_params p;
    int window_free; /* window attention gives back the blocks past each sequence's window (engine.c) */
    int ubatch_blocks; /* blocks are reserved per ubatch (window_free or the host tier: ubatch_kv) */
    struct threadpool *tp;
    struct kv_cache kv;
    int kv_layer[PXQ_MAX_LAYERS];   /* layer -> index among attention layers, or -1 */
    struct pxq_seq *seqs;           /* [n_seq_max] */
    struct layer_f32 *lw;           /* [n_lw]: n_layer, plus the MTP layers when params.spec_mtp */
    int n_lw;
    float *mtp_enorm, *mtp_hnorm, *mtp_head_norm; /* [n_embd] the MTP head's norms (spec_mtp) */
    float *hidden;                  /* [hidden_cap][n_embd] pxq_hidden's rows */
    int n_hidden, hidden_cap;
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

/* A validated batch's output rows: out_idx[i] (row of token i in e->logits, or -1; the caller frees it),
 * with e->logits and e->hidden (spec_mtp) grown to fit and n_outputs / n_hidden set. */
int *engine_outputs(struct pxq_engine *e, const struct pxq_batch *b);
/* Row i of b names a live sequence and a token id in [0, n_vocab): 0, else -1 with a message that
 * starts with `what` and i ("token 3: ...", "MTP row 3: ..."). pxq_decode's and pxq_mtp_decode's
 * check. */
int engine_check_row(const struct pxq_engine *e, const struct pxq_batch *b, int i, const char *what, char *err,
                     size_t errlen);

/* Run the model over one ubatch on the CPU: positions were validated and KV blocks reserved. */
void forward_cpu(struct pxq_engine *e, const struct ubatch *ub);
/* forward_cpu's parts, for the MTP head (mtp.c): decoder layer il over e->x ([n][n_embd], in place);
 * the output: rows of e->x normed by norm into ub->hidden (if set), lm_head into e->logits for the
 * rows that asked. */
void decoder_layer_cpu(struct pxq_engine *e, const struct ubatch *ub, int il);
void output_cpu(struct pxq_engine *e, const struct ubatch *ub, const float *norm);
/* Qwen3.5's DeltaNet layers and engine set-up: forward_qwen35.h. */
#endif
