/* model_dummy.h - `--load-format dummy`: the tensor list of a model from its hyperparameters alone,
 * and random weights for it.
 *
 * dummy_manifest() lists every tensor the forward binds (GGUF names, ggml shapes, types) for a chosen
 * weight type, without allocating any weight: `pxq plan` sums its bytes for a 32B model on a machine
 * that could not hold it, and model_open_dummy() (model.h) allocates and fills exactly that list, so
 * the plan and the dummy model agree byte for byte.
 *
 * Types: 2D weight matrices (and stacked MoE experts) get dtype when their row length (ne[0]) is a
 * multiple of dtype's block, else the fallback of dummy_matrix_type(); vectors (norms, biases, the
 * DeltaNet conv/dt/A) and the MoE router are f32, as llama.cpp's quantized files keep them.
 * Names and shapes are those of llama.cpp's converter (qwen3: attn_q/k/v/output, ffn_*; qwen3moe:
 * ffn_*_exps stacked [ne0, ne1, n_expert]; qwen35: attn_qkv, attn_gate, ssm_*, post_attention_norm),
 * and so are the value conventions of a qwen35 dummy (norm_w_offset 0, ssm_a_is_log 0, ssm_v_tiled 1:
 * what a llama.cpp GGUF holds). The MTP layer of a qwen35 config is not made (the forward skips it).
 */
#ifndef PXQ_MODEL_DUMMY_H
#define PXQ_MODEL_DUMMY_H

#include <stdint.h>

#include "model.h"

/* How a tensor's values are drawn (GGUF conventions: norm weights are the multiplier itself, ssm_a is
 * -exp(A_log)). Scales follow HF initialisation (initializer_range 0.02). */
enum dummy_fill {
    FILL_LINEAR, /* normal, std 0.02 (nn.Linear / embedding, HF init_weights) */
    FILL_NORM,   /* 1 + normal(0, 0.02): RMSNorm weights */
    FILL_CONV,   /* normal, std 0.2: depthwise conv taps (kernel 4, kaiming bound 1/sqrt(4) = 0.5) */
    FILL_SSM_A,  /* -(1 + 15 u), u uniform: -exp(A_log) with A_log = log U(1, 16) (HF Qwen3.5 init) */
    FILL_DT_BIAS /* 1 + normal(0, 0.02) (HF init: ones) */
};

struct dummy_tensor {
    char name[PXQ_NAME_MAX];
    enum pxq_type type;
    int n_dims;
    int64_t ne[PXQ_MAX_DIMS];
    enum dummy_fill fill;
};

/* The weight type a matrix with rows of ne0 elements gets for the requested dtype: dtype if ne0 is a
 * multiple of its block; for q4_K otherwise q4_0 (same 4.5 bits), then f16. */
enum pxq_type dummy_matrix_type(enum pxq_type dtype, int64_t ne0);

/* Parse "q4_0", "q4_k", "q8_0", "f16" (case-insensitive), the types dummy weights support. -1 if not. */
int dummy_parse_dtype(const char *s, enum pxq_type *out);

/* List the tensors of a model with hparams hp and weight type dtype. *out is malloc'd (caller frees).
 * Returns the count, or -1 with a message (unsupported dtype, bad hparams). */
int dummy_manifest(const struct pxq_hparams *hp, enum pxq_type dtype, struct dummy_tensor **out, char *err, size_t errlen);

#endif
