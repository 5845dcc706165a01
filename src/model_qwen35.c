/* model_qwen35.c - binding of Qwen3.5 / 3.6 hybrid layers (HF modeling_qwen3_5.py, transformers 5.17;
 * llama.cpp arch `qwen35`): Gated DeltaNet layers (linear_attention) and gated full-attention layers,
 * plus the MTP head. model.c binds attn_norm, ffn_norm and the FFN of the main layers; this file the
 * token mixer of each layer, and whole MTP layers.
 *
 * The two file formats store the same model differently (checked tensor by tensor on the tiny-qwen35
 * HF checkpoint against llama.cpp's GGUFs of it; flags in struct pxq_hparams):
 *   - RMSNorm weights: HF Qwen3_5RMSNorm computes x_hat * (1 + w) and stores w; llama.cpp's converter
 *     stores 1 + w (norm_w_offset). The DeltaNet output norm (Qwen3_5RMSNormGated) is plain w in both.
 *   - ssm_a: HF A_log, GGUF A = -exp(A_log) (ssm_a_is_log).
 *   - value heads: HF groups them by key head (value head h reads key head h / (n_v / n_k),
 *     repeat_interleave); the converter permutes the value-head rows of in_proj_qkv's v part,
 *     in_proj_z, in_proj_a/b, dt_bias, A, conv1d and the columns of out_proj so that value head h reads
 *     key head h % n_k (ssm_v_tiled).
 *   - conv1d: HF nn.Conv1d weight [conv_dim, 1, K] (ne [K, 1, conv_dim]), GGUF ne [K, conv_dim]; the
 *     bytes are the same (K taps per channel, oldest first).
 */
#include "model.h"
#include "util.h"

typedef const struct pxq_tensor *(*lookup_fn)(void *ctx, int il, const char *suffix, int required, int64_t ne0,
                                                int64_t ne1, int64_t ne2);

/* Qwen3_5Attention: q_proj is [n_embd, n_head * head_dim * 2] (per head: query then gate),
 * k_proj/v_proj [n_embd, n_head_kv * head_dim], o_proj [n_head * head_dim, n_embd], q/k norm [head_dim]. */
static void bind_gated_attention(struct pxq_layer *L, const struct pxq_hparams *hp, int il, lookup_fn lookup, void *ctx) {
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    L->attn_q = lookup(ctx, il, "attn_q.weight", 1, hp->n_embd, q_dim * (hp->attn_output_gate ? 2 : 1), 1);
    L->attn_k = lookup(ctx, il, "attn_k.weight", 1, hp->n_embd, kv_dim, 1);
    L->attn_v = lookup(ctx, il, "attn_v.weight", 1, hp->n_embd, kv_dim, 1);
    L->attn_output = lookup(ctx, il, "attn_output.weight", 1, q_dim, hp->n_embd, 1);
    L->attn_q_norm = lookup(ctx, il, "attn_q_norm.weight", 1, hp->head_dim, 1, 1);
    L->attn_k_norm = lookup(ctx, il, "attn_k_norm.weight", 1, hp->head_dim, 1, 1);
}

/* Qwen3_5GatedDeltaNet: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d (no bias), dt_bias, A_log,
 * norm (gated, [head_v_dim]), out_proj. */
static void bind_deltanet(struct pxq_layer *L, const struct pxq_hparams *hp, int il, lookup_fn lookup, void *ctx) {
    const int64_t key_dim = (int64_t)hp->ssm_n_k_head * hp->ssm_head_k_dim;
    const int64_t value_dim = (int64_t)hp->ssm_n_v_head * hp->ssm_head_v_dim;
    const int64_t conv_dim = 2 * key_dim + value_dim, nv = hp->ssm_n_v_head;
    L->attn_qkv = lookup(ctx, il, "attn_qkv.weight", 1, hp->n_embd, conv_dim, 1);
    L->attn_gate = lookup(ctx, il, "attn_gate.weight", 1, hp->n_embd, value_dim, 1);
    L->ssm_beta = lookup(ctx, il, "ssm_beta.weight", 1, hp->n_embd, nv, 1);
    L->ssm_alpha = lookup(ctx, il, "ssm_alpha.weight", 1, hp->n_embd, nv, 1);
    if (hp->ssm_a_is_log) /* HF file */
        L->ssm_conv1d = lookup(ctx, il, "ssm_conv1d.weight", 1, hp->ssm_conv_kernel, 1, conv_dim);
    else
        L->ssm_conv1d = lookup(ctx, il, "ssm_conv1d.weight", 1, hp->ssm_conv_kernel, conv_dim, 1);
    L->ssm_dt = lookup(ctx, il, "ssm_dt.bias", 1, nv, 1, 1);
    L->ssm_a = lookup(ctx, il, "ssm_a", 1, nv, 1, 1);
    L->ssm_norm = lookup(ctx, il, "ssm_norm.weight", 1, hp->ssm_head_v_dim, 1, 1);
    L->ssm_out = lookup(ctx, il, "ssm_out.weight", 1, value_dim, hp->n_embd, 1);
}

/* The Gated DeltaNet sizes PXQ's kernels take (HF Qwen3_5GatedDeltaNet: value heads are grouped by
 * key head, so n_v_head must be a multiple of n_k_head; conv width and head dims bounded by the CPU
 * and CUDA kernels' buffers). gguf selects the GGUF key names for the message (llama.cpp's
 * ssm.conv_kernel, ssm.group_count, ssm.time_step_rank, ssm.state_size, ssm.inner_size). Returns 0,
 * or -1 with a message naming the field. */
int model_qwen35_check_hparams(const struct pxq_hparams *hp, int gguf, char *err, size_t errlen) {
    const char *src = gguf ? "GGUF" : "config.json";
    if (hp->ssm_conv_kernel < 1 || hp->ssm_conv_kernel > 16)
        return set_err(err, errlen, "%s: %s %d must be in [1, 16]", src, gguf ? "ssm.conv_kernel" : "linear_conv_kernel_dim",
                       hp->ssm_conv_kernel);
    if (hp->ssm_n_k_head <= 0 || hp->ssm_n_v_head <= 0 || hp->ssm_n_v_head % hp->ssm_n_k_head)
        return set_err(err, errlen, "%s: %s %d must be a positive multiple of %s %d", src,
                       gguf ? "ssm.time_step_rank" : "linear_num_value_heads", hp->ssm_n_v_head,
                       gguf ? "ssm.group_count" : "linear_num_key_heads", hp->ssm_n_k_head);
    if (hp->ssm_head_k_dim <= 0 || hp->ssm_head_k_dim > 1024)
        return set_err(err, errlen, "%s: %s %d must be in [1, 1024]", src, gguf ? "ssm.state_size" : "linear_key_head_dim",
                       hp->ssm_head_k_dim);
    if (hp->ssm_head_v_dim <= 0 || hp->ssm_head_v_dim > 1024)
        return set_err(err, errlen, "%s: the value head dim %d must be in [1, 1024] (%s)", src, hp->ssm_head_v_dim,
                       gguf ? "ssm.inner_size / ssm.time_step_rank" : "linear_value_head_dim");
    return 0;
}

/* Bind layer il's token mixer by hp->layer_kind[il]. The DeltaNet sizes were checked when the
 * hyperparameters were read (model_qwen35_check_hparams); the lookup writes its own message for a
 * missing or misshapen tensor. */
void model_bind_qwen35_layer(struct pxq_layer *L, const struct pxq_hparams *hp, int il, lookup_fn lookup, void *ctx) {
    if (hp->layer_kind[il] == LAYER_ATTN)
        bind_gated_attention(L, hp, il, lookup, ctx);
    else
        bind_deltanet(L, hp, il, lookup, ctx);
}

/* MTP layer il (n_layer <= il < n_layer + n_mtp_layer): Qwen3_5DecoderLayer of type full_attention
 * (vLLM qwen3_5_mtp.py, Qwen3_5MultiTokenPredictor), and on the first one the shared fc
 * (nextn.eh_proj, [2 * n_embd, n_embd]) and norms pre_fc_norm_embedding, pre_fc_norm_hidden, norm. */
int model_bind_qwen35_mtp_layer(struct pxq_layer *L, const struct pxq_hparams *hp, int il, lookup_fn lookup, void *ctx) {
    const int first = il == hp->n_layer;
    L->nextn_eh_proj = lookup(ctx, il, "nextn.eh_proj.weight", first, 2 * (int64_t)hp->n_embd, hp->n_embd, 1);
    L->nextn_enorm = lookup(ctx, il, "nextn.enorm.weight", first, hp->n_embd, 1, 1);
    L->nextn_hnorm = lookup(ctx, il, "nextn.hnorm.weight", first, hp->n_embd, 1, 1);
    L->nextn_shared_head_norm = lookup(ctx, il, "nextn.shared_head_norm.weight", first, hp->n_embd, 1, 1);
    L->attn_norm = lookup(ctx, il, "attn_norm.weight", 1, hp->n_embd, 1, 1);
    bind_gated_attention(L, hp, il, lookup, ctx);
    L->ffn_norm = lookup(ctx, il, "ffn_norm.weight", 0, hp->n_embd, 1, 1);
    if (!L->ffn_norm) L->ffn_norm = lookup(ctx, il, "post_attention_norm.weight", 1, hp->n_embd, 1, 1);
    L->ffn_gate = lookup(ctx, il, "ffn_gate.weight", 1, hp->n_embd, hp->n_ff, 1);
    L->ffn_up = lookup(ctx, il, "ffn_up.weight", 1, hp->n_embd, hp->n_ff, 1);
    L->ffn_down = lookup(ctx, il, "ffn_down.weight", 1, hp->n_ff, hp->n_embd, 1);
    return 0;
}
