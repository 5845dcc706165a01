/* ops_cpu.h - the CPU reference ops. Outputs first, then inputs, then sizes. Float32 throughout.
 * Each op has a CUDA twin of the same name with _cuda (src/cuda/), compared in tests. */
#ifndef PXQ_OPS_CPU_H
#define PXQ_OPS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

struct threadpool;

/* y[t][o] = sum_i W[o][i] * x[t][i] for t < n_tokens; W has ne = [n_in, n_out] in any supported type.
 * F32/F16/BF16 weights: float32 activations and accumulation (the exact path; the HF-reference
 * model tests rely on it). Quantized weights (type_has_q8_dot): each token's x row is quantized once
 * per call to int8 blocks of 32 (quant.h) and every weight row is dotted in integers against 4
 * tokens at a time, as llama.cpp's CPU backend does; error per output at most
 * sum over blocks of amax_block(x)/254 * sum |w| of the block, plus float rounding. PXQ_CPU_EXACT=1
 * in the environment (or matmul_cpu_set_exact(1)) keeps float32 activations for them too:
 * fused dequantize-dot up to 4 tokens, dequantized row tiles beyond. */
void matmul_cpu(struct threadpool *tp, float *y, const struct pxq_tensor *w, const float *x, int n_tokens);

/* matmul_cpu of n_w (1..4) weights on the same x: y[k] = W_k x, as n_w calls give it, bit for bit.
 * When every W_k takes the int8 path with the same n_in, x is quantized once and one parallel loop
 * covers all the products (q|k|v, gate|up: one pool wake-up and barrier instead of several);
 * otherwise it is the n_w calls. The observer sees each W_k. */
void matmul_cpu_n(struct threadpool *tp, float *const *y, const struct pxq_tensor *const *w, int n_w, const float *x,
                  int n_tokens);

/* 1: quantized weights use the float32-activation path; 0: int8 activations; -1: read
 * PXQ_CPU_EXACT again at the next matmul_cpu. Process-wide; for tests and A/B comparisons. */
void matmul_cpu_set_exact(int on);

/* Calibration hook (pxq quantize, src/quantize_calib.c): when set, matmul_cpu calls
 * fn(ctx, w, x, n_tokens) with its input x[n_tokens][w->ne[0]] before each product on this thread.
 * Thread-local, so other threads' engines are unaffected; NULL turns it off. Placed here rather
 * than in the forward so every weight product of every architecture is seen with no per-site edits. */
typedef void (*matmul_observer_fn)(void *ctx, const struct pxq_tensor *w, const float *x, int n_tokens);
void matmul_cpu_set_observer(matmul_observer_fn fn, void *ctx);

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], for each of n_rows rows of n (HF LlamaRMSNorm:
 * the mean is taken in float32). w is [n] float32; out may alias x. */
void rmsnorm_cpu(float *out, const float *x, const float *w, int n, int n_rows, float eps);

/* Rotary embedding in place on x[n_heads][head_dim] at position pos, rotating the first n_rot dims
 * of each head (Su et al. 2021, RoFormer; HF apply_rotary_pos_emb). neox=1: dim i pairs with
 * i + n_rot/2 (rotate_half); neox=0: dim 2i pairs with 2i+1. inv_freq: rope.h's table, n_rot/2
 * frequencies then the attention factor that scales cos and sin (rope_table, or rope_inv_freq). */
void rope_cpu(float *x, int n_heads, int head_dim, int n_rot, int pos, const float *inv_freq, int neox);
/* inv_freq[i] = 1 / theta^(2i / n_rot), computed as HF does in float32. */
void rope_inv_freq(float *inv_freq, int n_rot, float theta); /* plain RoPE's table: n_rot/2 + 1 floats */

/* out[i] = silu(gate[i]) * up[i] (SwiGLU, Shazeer 2020). */
void swiglu_cpu(float *out, const float *gate, const float *up, int64_t n);

/* Dequantize row `row` of a [n, rows] tensor into out[n] (embedding lookup, small vectors). */
void tensor_row_f32(float *out, const struct pxq_tensor *t, int64_t row);

/* Numerically stable in-place softmax over x[n]. */
void softmax_cpu(float *x, int n);

/* Per-thread scratch: grow *buf (a `static __thread float *` of the caller) to hold n floats and
 * return it. Buffers of worker threads are freed when the thread exits. */
float *tls_grow(float **buf, size_t *cap, size_t n);

/* y[i] += a * x[i] for i < n, 8 lanes at a time; y and x do not overlap. */
static inline void vec_axpy_f32(float *restrict y, float a, const float *restrict x, int n) {
    typedef float v8f_ __attribute__((vector_size(32)));
    const v8f_ va = {a, a, a, a, a, a, a, a};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f_ yv, xv;
        __builtin_memcpy(&yv, y + i, 32);
        __builtin_memcpy(&xv, x + i, 32);
        yv += va * xv;
        __builtin_memcpy(y + i, &yv, 32);
    }
    for (; i < n; i++) y[i] += a * x[i];
}

/* Causal attention of nq query rows (q[i], head_dim hd floats each) over float32 K and V rows k[p],
 * v[p] of one KV head: o[i] = softmax(q[i] . k[p] * scale over p < n_vis[i]) . v (HF
 * eager_attention_forward without dropout; n_vis[i] >= 1). hd a multiple of 16, at most 256.
 * scratch: attn_tile_scratch(nq, max n_vis, hd) floats. A row's result does not depend on the
 * other rows (attn_kernels.h has the arithmetic); the kernel set is q8_isa's (quant.h). */
void attn_tile_f32(float *const *o, const float *const *q, const int *n_vis, int nq, const float *const *k,
                   const float *const *v, int hd, float scale, float *scratch);
size_t attn_tile_scratch(int nq, int n_max, int hd);

/* Float32 dot product with several accumulators (vectorised by the compiler). */
float vec_dot_f32(const float *a, const float *b, int64_t n);

#endif
