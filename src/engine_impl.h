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
    float *rstate;          /* recurrent state of DeltaNet layers (qwen35), NULL otherwise */
};

/* Small per-layer vectors, converted to float32 once at engine creation. NULL where absent. */
struct layer_f32 {
    float *attn_norm, *ffn_norm, *q_norm, *k_norm, *bq, *bk, *bv;
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
    void *backend;                  /* device backend state (CUDA) */
};

/* Run the model over one ubatch on the CPU: positions were validated and KV blocks reserved. */
void forward_cpu(struct pxq_engine *e, const struct ubatch *ub);

#endif
