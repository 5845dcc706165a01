/* model.h - hyperparameters, weights and loading for the Qwen family (and Llama).
 *
 * One table maps the field's names to GGUF keys and HF config.json keys (model.c, hparam_keys);
 * one table maps HF tensor names to GGUF tensor names (model.c, hf_tensor_map). After loading,
 * every weight is addressed by its GGUF name in struct pxq_layer, whatever the file format was.
 *
 * Formulas follow HF transformers 5.17: modeling_llama.py, modeling_qwen2.py, modeling_qwen3.py,
 * modeling_qwen3_moe.py, modeling_qwen3_5.py.
 */
#ifndef PXQ_MODEL_H
#define PXQ_MODEL_H

#include "rope.h"
#include <stddef.h>
#include <stdint.h>
#include "tensor.h"

#define PXQ_MAX_LAYERS  256
#define PXQ_MAX_EXPERTS 512
#define PXQ_MAX_EOS     8

enum pxq_arch { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_QWEN3MOE, ARCH_QWEN35 };

/* How RoPE pairs dimensions. NEOX: dim i pairs with i + n_rot/2 (HF rotate_half; qwen2/qwen3
 * GGUFs too). NORM: dim 2i pairs with 2i+1 (GGUF llama, whose converter permuted q/k rows for it). */
enum rope_style { ROPE_NEOX, ROPE_NORM };

enum layer_kind { LAYER_ATTN, LAYER_DELTANET };

struct pxq_hparams {
    enum pxq_arch arch;
    char  arch_name[32];   /* GGUF arch string: "qwen3", "qwen2", "llama", "qwen3moe", "qwen35" */
    int   n_vocab;
    int   n_embd;          /* hidden_size */
    int   n_layer;         /* num_hidden_layers */
    int   n_head;          /* num_attention_heads */
    int   n_head_kv;       /* num_key_value_heads */
    int   head_dim;        /* may differ from n_embd / n_head (qwen3) */
    int   n_ff;            /* intermediate_size */
    int   n_ctx_train;     /* max_position_embeddings */
    int   n_rot;           /* rotary dims per head (head_dim, or partial_rotary_factor * head_dim) */
    float rope_theta;
    struct rope_scaling rope_scaling; /* rope.h: none, linear, yarn or llama3, from the file or overridden */
    float rms_eps;
    enum rope_style rope_style;
    int   tie_embd;        /* lm_head shares token_embd */
    int   has_qkv_bias;    /* qwen2 */
    int   has_qk_norm;     /* qwen3, qwen3moe, qwen35 */
    /* MoE (qwen3moe) */
    int   n_expert;        /* 0 for dense */
    int   n_expert_used;   /* top-k */
    int   n_ff_exp;        /* moe_intermediate_size */
    int   norm_topk_prob;
    /* Qwen3.5 hybrid */
    enum layer_kind layer_kind[PXQ_MAX_LAYERS];
    int   attn_output_gate;      /* full-attention q_proj carries a per-head gate (qwen35) */
    int   ssm_conv_kernel;       /* linear_conv_kernel_dim */
    int   ssm_n_k_head;          /* linear_num_key_heads */
    int   ssm_n_v_head;          /* linear_num_value_heads */
    int   ssm_head_k_dim;        /* linear_key_head_dim */
    int   ssm_head_v_dim;        /* linear_value_head_dim */
    /* How the file stores Qwen3.5 weights (HF and llama.cpp's converter differ; see model_qwen35.c):
     * norm_w_offset is added to every RMSNorm weight but the DeltaNet's gated norm (HF Qwen3_5RMSNorm
     * computes x_hat * (1 + w); the GGUF converter folded the 1 in, so 0 there); ssm_a_is_log: ssm_a
     * holds HF's A_log (A = -exp(A_log)), else A itself (GGUF); ssm_v_tiled: value head h reads key head
     * h % n_k_head (GGUF, heads reordered by the converter), else h / (n_v_head / n_k_head) (HF). */
    float norm_w_offset;
    int   ssm_a_is_log;
    int   ssm_v_tiled;
    int   n_mtp_layer;           /* mtp_num_hidden_layers whose weights are present; layers n_layer.. */
    /* special tokens from config.json + generation_config.json (or GGUF) */
    int32_t eos_ids[PXQ_MAX_EOS];
    int   n_eos;
    int32_t bos_id;        /* -1 if none */
};

struct pxq_expert {
    const struct pxq_tensor *gate, *up, *down;  /* [n_embd, n_ff_exp], same, [n_ff_exp, n_embd] */
};

/* Per-layer weights, named as GGUF names them (blk.N.<name>). NULL where absent. */
struct pxq_layer {
    const struct pxq_tensor *attn_norm;              /* [n_embd] */
    const struct pxq_tensor *attn_q, *attn_k, *attn_v; /* [n_embd, n_head*head_dim(*2 with gate)], [n_embd, n_head_kv*head_dim] */
    const struct pxq_tensor *attn_q_b, *attn_k_b, *attn_v_b; /* biases (qwen2) */
    const struct pxq_tensor *attn_q_norm, *attn_k_norm;     /* [head_dim] (qwen3) */
    const struct pxq_tensor *attn_output;            /* [n_head*head_dim, n_embd] */
    const struct pxq_tensor *ffn_norm;               /* [n_embd] (post_attention_layernorm) */
    const struct pxq_tensor *ffn_gate, *ffn_up, *ffn_down; /* dense FFN */
    const struct pxq_tensor *ffn_gate_inp;           /* MoE router [n_embd, n_expert] */
    struct pxq_expert *experts;                      /* [n_expert] for MoE layers */
    /* Gated DeltaNet (qwen35 linear_attention layers; forward_qwen35.c has the formulas).
     * conv_dim = 2 * n_k_head * head_k_dim + n_v_head * head_v_dim, value_dim = n_v_head * head_v_dim. */
    const struct pxq_tensor *attn_qkv;               /* [n_embd, conv_dim]   in_proj_qkv */
    const struct pxq_tensor *attn_gate;              /* [n_embd, value_dim]  in_proj_z */
    const struct pxq_tensor *ssm_beta, *ssm_alpha;   /* [n_embd, n_v_head]   in_proj_b, in_proj_a */
    const struct pxq_tensor *ssm_conv1d;             /* [conv_kernel, conv_dim] */
    const struct pxq_tensor *ssm_dt, *ssm_a;         /* [n_v_head] dt_bias; A (or A_log, see hparams) */
    const struct pxq_tensor *ssm_norm;               /* [head_v_dim] gated RMSNorm weight */
    const struct pxq_tensor *ssm_out;                /* [value_dim, n_embd]  out_proj */
    /* MTP head (layers n_layer.. of a qwen35 model; HF mtp.*; names as llama.cpp's nextn tensors). */
    const struct pxq_tensor *nextn_eh_proj;          /* [2*n_embd, n_embd] fc over [norm(embd) | norm(hidden)] */
    const struct pxq_tensor *nextn_enorm, *nextn_hnorm, *nextn_shared_head_norm; /* [n_embd] */
};

struct pxq_model;

/* Open a model: an HF directory (config.json, generation_config.json, safetensors, tokenizer.json)
 * or a GGUF file. Checks the architecture and every tensor's presence and shape; on failure returns
 * NULL and writes one line naming the problem (e.g. the tensor, expected and actual shapes). */
struct pxq_model *model_open(const char *path, char *err, size_t errlen);
void model_free(struct pxq_model *m);

/* Hyperparameters from an HF config.json file alone (no generation_config.json, no weights); the
 * `text_config` of a multimodal qwen3_5 config is used. Returns 0, or -1 with a message. */
int model_hparams_from_config(struct pxq_hparams *hp, const char *config_path, char *err, size_t errlen);

/* A model over caller-made tensors named as in GGUF (takes ownership of tensors[n] and of data, which
 * model_free frees, also on failure). Checks every shape like model_open. `name` is the model_path. */
struct pxq_model *model_from_tensors(const char *name, const struct pxq_hparams *hp, struct pxq_tensor *tensors, int n,
                                     void *data, char *err, size_t errlen);

/* --load-format dummy: a model with random weights of type dtype (q4_0, q4_k, q8_0, f16; norms and
 * other vectors f32) for the hparams of an HF config.json, filled in parallel with a PRNG seeded by
 * `seed` (model_dummy.c). Weights live in one host allocation. NULL + message on failure. */
struct pxq_model *model_open_dummy(const char *config_json_path, enum pxq_type dtype, uint64_t seed, int n_threads,
                                   char *err, size_t errlen);

const struct pxq_hparams *model_hparams(const struct pxq_model *m);
/* Attention layers (those with KV; Qwen3.5's DeltaNet layers have none), at most PXQ_MAX_LAYERS. */
int hparams_n_attn_layers(const struct pxq_hparams *hp);
/* Replace the model's RoPE scaling (a command line's --rope-scaling over the file's), before any
 * engine is created on it. Returns 0, or -1 with rope_scaling_check's message. */
int model_set_rope_scaling(struct pxq_model *m, const struct rope_scaling *rs, char *err, size_t errlen);
const struct pxq_layer   *model_layer(const struct pxq_model *m, int il);
const struct pxq_tensor  *model_token_embd(const struct pxq_model *m);  /* [n_embd, n_vocab] */
const struct pxq_tensor  *model_output_norm(const struct pxq_model *m); /* [n_embd] */
const struct pxq_tensor  *model_output(const struct pxq_model *m);      /* [n_embd, n_vocab] (token_embd if tied) */
struct pxq_tokenizer     *model_tokenizer(const struct pxq_model *m);   /* NULL if the model has none */
const char *model_path(const struct pxq_model *m);
int model_is_gguf(const struct pxq_model *m);

/* All tensors of the file, for `pxq info` (GGUF names for GGUF, HF names for safetensors). */
int model_n_tensors(const struct pxq_model *m);
const struct pxq_tensor *model_tensor(const struct pxq_model *m, int i);
struct gguf_file *model_gguf(const struct pxq_model *m); /* NULL for HF dirs */
/* The pxq KV cache calibration the GGUF carried (pxq.kv.* keys, kv_calib.h), or NULL. */
const struct kv_calib *model_kv_calib(const struct pxq_model *m);

/* Total bytes of the weights the forward uses (for rooflines). */
size_t model_weight_bytes(const struct pxq_model *m);

const char *arch_name(enum pxq_arch a);

#endif
