/* mtp.c - Qwen3.5's MTP head on the CPU (engine.h pxq_mtp_decode; HF mtp.* weights, vLLM
 * qwen3_5_mtp.py Qwen3_5MultiTokenPredictor): one row per (position p, the token at p + 1, h_p):
 *   x = eh_proj([enorm(embd(token)) | hnorm(h_p)])      eh_proj: [2 n_embd] -> [n_embd], embedding half first
 *   x = the MTP decoder layer (gated attention over the layer's own KV, then the MLP), RoPE at p
 *   m = shared_head_norm(x);  logits = lm_head(m)         (the model's lm_head, predicting the token at p + 2)
 * The MTP layer's KV is the engine's last cache layer (kv_layer[n_layer]); its rows share the
 * sequence's block table, so rollback and freeing treat it with the rest.
 */
#include <stdlib.h>

#include "cuda/backend.h"
#include "engine_impl.h"
#include "ops_cpu.h"
#include "util.h"

/* x = eh_proj([enorm(embd(token)) | hnorm(h)]) for the ubatch's rows, into e->x. */
static void mtp_input(struct pxq_engine *e, const struct ubatch *ub) {
    const struct pxq_hparams *hp = e->hp;
    const int n = ub->n, d = hp->n_embd;
    float *cat = xmalloc((size_t)n * 2 * d * sizeof(float));
    for (int t = 0; t < n; t++) {
        float *row = cat + (size_t)t * 2 * d;
        tensor_row_f32(row, model_token_embd(e->m), ub->token[t]);
        rmsnorm_cpu(row, row, e->mtp_enorm, d, 1, hp->rms_eps);
        rmsnorm_cpu(row + d, ub->hidden_in + (size_t)t * d, e->mtp_hnorm, d, 1, hp->rms_eps);
    }
    matmul_cpu(e->tp, e->x, model_layer(e->m, hp->n_layer)->nextn_eh_proj, cat, n);
    free(cat);
}

int pxq_mtp_decode(struct pxq_engine *e, const struct pxq_batch *b, const float *hidden, char *err, size_t errlen) {
    const int n = b->n_tokens;
    if (!e->p.spec_mtp) return set_err(err, errlen, "the engine was created without the MTP head (spec_mtp)");
    if (n <= 0 || !b->token || !b->pos || !b->seq_id || !hidden) return set_err(err, errlen, "empty MTP batch");
    int *next = xmalloc((size_t)e->p.n_seq_max * sizeof *next), *end = xcalloc((size_t)e->p.n_seq_max, sizeof *end);
    int rc = -1;
    for (int s = 0; s < e->p.n_seq_max; s++) next[s] = -1;
    for (int i = 0; i < n; i++) {
        const int s = b->seq_id[i], p = b->pos[i];
        if (engine_check_row(e, b, i, "MTP row", err, errlen) != 0) goto out;
        if (next[s] < 0 ? p < 0 || p > e->seqs[s].n_mtp : p != next[s]) {
            set_err(err, errlen, "MTP row %d: position %d; sequence %d's rows must continue from at most %d", i, p, s,
                    next[s] < 0 ? e->seqs[s].n_mtp : next[s]);
            goto out;
        }
        if (p >= e->p.n_ctx) {
            set_err(err, errlen, "MTP row %d: position %d past the context (n_ctx %d)", i, p, e->p.n_ctx);
            goto out;
        }
        next[s] = p + 1;
        end[s] = p + 1;
    }
    int need = 0;
    for (int s = 0; s < e->p.n_seq_max; s++)
        if (end[s]) need += kv_seq_blocks_needed(&e->kv, &e->seqs[s].kv, end[s]);
    if (need > e->kv.n_free) {
        set_err(err, errlen, "KV cache full: the MTP rows need %d blocks, %d free", need, e->kv.n_free);
        goto out;
    }
    for (int s = 0; s < e->p.n_seq_max; s++)
        if (end[s] && kv_seq_reserve(&e->kv, &e->seqs[s].kv, end[s]) != 0) die("KV reserve after check");
    const int d = e->hp->n_embd;
    float *h_in = xmalloc((size_t)n * d * sizeof(float)); /* hidden may be pxq_hidden's rows, which the outputs replace */
    memcpy(h_in, hidden, (size_t)n * d * sizeof(float));
    int *out_idx = engine_outputs(e, b);
    for (int i0 = 0; i0 < n; i0 += e->p.n_batch) {
        struct ubatch ub = {n - i0 < e->p.n_batch ? n - i0 : e->p.n_batch, b->token + i0, b->pos + i0, b->seq_id + i0,
                            out_idx + i0, e->hidden + (size_t)i0 * d, h_in + (size_t)i0 * d};
#ifdef PXQ_CUDA
        if (e->backend) {
            forward_mtp_cuda(e, &ub);
            continue;
        }
#endif
        mtp_input(e, &ub);
        decoder_layer_cpu(e, &ub, e->hp->n_layer);
        output_cpu(e, &ub, e->mtp_head_norm);
    }
    for (int s = 0; s < e->p.n_seq_max; s++)
        if (end[s]) e->seqs[s].n_mtp = end[s];
    free(out_idx), free(h_in);
    rc = 0;
out:
    free(next), free(end);
    return rc;
}
