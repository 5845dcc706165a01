/* ops_qwen35_cuda.h - the CUDA twins of forward_qwen35.c's token mixers (Qwen3.5 / 3.6, HF
 * transformers 5.17 modeling_qwen3_5.py): Gated DeltaNet (conv, q/k/beta/g prep, the gated delta
 * rule, the gated RMSNorm) and the gated full attention's q/gate split and output gate.
 *
 * Conventions as ops_cuda.h: device pointers, outputs first, then inputs, sizes, stream; float32
 * activations; callable from C and C++; the launchers do not check errors (the caller checks the
 * stream once per step). Every op is a no-op for an empty batch.
 *
 * Recurrent state (float32, the layout of pxq_seq.rstate, forward_qwen35.c): sequence slot s owns
 * state + s * seq_stride (floats); for one DeltaNet layer the caller passes state = state_base +
 * dl * layer_floats, layer_floats = (K-1) * conv_dim + n_v * dk * dv, inside which
 *   conv [K-1][conv_dim]   the last K-1 conv inputs, oldest first      (offset 0)
 *   S    [n_v][dk][dv]     the delta-rule state of each value head       (offset (K-1) * conv_dim)
 * A fresh sequence's state is zero (the caller clears it).
 *
 * Runs: the ubatch's tokens grouped by sequence, each run's tokens in position order:
 *   run_seq [n_runs]      state slot of run r
 *   run_off [n_runs + 1]  run r's tokens are run_tok[run_off[r] .. run_off[r+1])
 *   run_tok [n]           token row indices (rows of x / qkv / ba / o)
 * all int32 on the device; n_runs on the host. A slot appears in at most one run per call.
 * CPU twin: forward_qwen35.h / forward_qwen35.c.
 */
#ifndef PXQ_OPS_QWEN35_CUDA_H
#define PXQ_OPS_QWEN35_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if gated_delta_rule_cuda (and the chunked form) run value heads of dk x dv: 1 <= dk <= 256,
 * 1 <= dv <= 4096 (the real model: 128 x 128; the test models 128 x 128 and 48 x 48). */
int deltanet_cuda_supported(int dk, int dv);

/* Causal depthwise conv1d + SiLU over each run (HF causal_conv1d_fn / causal_conv1d_update; CPU
 * ssm_conv_cpu): for channel c and a run's token t (in order),
 *   y[t][c] = silu(sum_{j<K-1} w[c][j] * win_j + w[c][K-1] * x[t][c])
 * where win is the K-1 previous inputs of the sequence (the conv state, then this run's tokens);
 * the conv state ends as the run's last K-1 inputs. x, y [n][conv_dim] (x = the in_proj_qkv
 * output); w [conv_dim][K], taps oldest first; 1 <= K <= 16. y must not alias x. n_tokens: the
 * runs' tokens in all (the grid covers the longest run in tiles of 32 tokens).
 * Snapshots (speculative decoding's checkpoint inside a step, engine.h pxq_seq_checkpoint_at): with
 * snap != NULL, a run whose run_snap[run] = j is in 1 .. its length - 1 also writes the conv state
 * after its first j tokens to snap + run_seq[run] * seq_stride, the layout of state (snap: the same
 * layer's slot in a second state buffer); other values of run_snap write none. */
void ssm_conv_cuda(float *y, float *state, size_t seq_stride, const float *x, const float *w, int conv_dim, int K,
                   const int32_t *run_seq, const int32_t *run_off, const int32_t *run_tok, int n_runs, int n_tokens,
                   float *snap, const int32_t *run_snap, cudaStream_t st);

/* In place on the conv output (CPU deltanet_prep_cpu): qkv [n][conv_dim] rows = [q (nk heads of dk) |
 * k (nk heads of dk) | v]; each q and k head x becomes x * 1/sqrt(sum x^2 + 1e-6) (HF l2norm), q
 * also times 1/sqrt(dk); v is left as is. ba [n][2 * nv] = [b | a] becomes [beta | g] with
 *   beta = sigmoid(b),  g = A[h] * softplus(a + dt_bias[h])   (torch softplus, threshold 20)
 * A [nv] is already -exp(A_log) (qwen35_engine_init); dt_bias [nv]. */
void deltanet_prep_cuda(float *qkv, float *ba, const float *A, const float *dt_bias, int nk, int nv, int dk,
                        int conv_dim, int n, cudaStream_t st);

/* The gated delta rule, recurrent form (forward_qwen35.h; Yang et al. 2025; HF
 * torch_recurrent_gated_delta_rule), for every run and value head h < nv, per token in order:
 *   S = S * exp(g);  S += k^T (beta * (v - k S));  o = q S
 * with q, k the key head kh = v_tiled ? h % nk : h / (nv / nk) of the prepped qkv row
 * (deltanet_prep_cuda), v = qkv[row][2 * nk * dk + h * dv ..], beta = ba[row][h], g = ba[row][nv + h];
 * S [dk][dv] at state + run_seq[r] * seq_stride + (K-1) * conv_dim + h * dk * dv, read once and
 * written once per call. o [n][nv * dv]. Needs deltanet_cuda_supported(dk, dv); nv % nk == 0.
 * Cost: the state is read and written once (8 * dk * dv bytes per run and head), so decode runs at
 * memory bandwidth; a run of m tokens adds m sequential steps of two block reductions.
 * snap, run_snap: as ssm_conv_cuda's: S after a run's first run_snap[run] tokens (1 .. m - 1) into
 * snap's slot of that run (NULL: none). */
void gated_delta_rule_cuda(float *o, float *state, size_t seq_stride, const float *qkv, const float *ba, int nk, int nv,
                           int dk, int dv, int K, int conv_dim, int v_tiled, const int32_t *run_seq,
                           const int32_t *run_off, const int32_t *run_tok, int n_runs, float *snap,
                           const int32_t *run_snap, cudaStream_t st);

/* The same result by the chunked (UT transform) form (forward_qwen35.c gated_delta_rule_chunked;
 * HF torch_chunk_gated_delta_rule), for prefill runs: chunks of 32 tokens (64 when forced) are
 * solved with matrix products instead of token-by-token steps, in two kernels
 * (deltanet_chunked.cu): one, parallel over every (chunk, key head), builds each value head's
 * T = (I + A)^-1, M and decays into scratch; the other walks each run's chunks with the S tile
 * resident. Same arguments, layout and requirements as gated_delta_rule_cuda, plus
 *   n_tokens        at least run_off[n_runs], the runs' tokens in all (the step's tokens); a run
 *                   past the slots it implies is left alone (o unwritten, S unchanged)
 *   scratch         device floats, 16-byte aligned, at least
 *                   gated_delta_rule_chunked_scratch_floats(n_tokens, n_runs, nv, dk, dv) of them;
 *                   overwritten (the caller's contents are lost), free again when the stream is
 *                   past the call
 * Where the chunked kernels do not fit the device (dk % 4 != 0, dk > 256, or their shared memory),
 * qkv rows are not 16-byte aligned (qkv % 16, conv_dim % 4), or scratch is NULL, misaligned or
 * under the need at the chunk size in use (nv x (n_tokens / C + n_runs) x (2 C^2 + 4 C) floats), it
 * runs gated_delta_rule_cuda instead (scratch untouched). The first call per chunk size and tile width sets
 * the kernels' shared memory opt-in (cudaFuncSetAttribute, the current device's limit): make it
 * once outside graph capture. Shared memory per block at dk 128, chunks of 32: 61 KiB (columns of
 * S in tiles of 16) or 77 KiB (32); the parallel kernel 46 KiB. */
void gated_delta_rule_chunked_cuda(float *o, float *state, size_t seq_stride, const float *qkv, const float *ba, int nk,
                                   int nv, int dk, int dv, int K, int conv_dim, int v_tiled, const int32_t *run_seq,
                                   const int32_t *run_off, const int32_t *run_tok, int n_runs, int n_tokens,
                                   float *scratch, size_t scratch_floats, cudaStream_t st);
/* Floats of scratch gated_delta_rule_chunked_cuda needs for any runs of n_tokens tokens in all in
 * n_runs runs, at either chunk size: nv x (n_tokens / C + n_runs) x (2 C^2 + 4 C), the larger of C
 * = 32 and 64 (about 132 nv floats per token). 0 for no tokens. */
size_t gated_delta_rule_chunked_scratch_floats(int n_tokens, int n_runs, int nv, int dk, int dv);
/* Tests and benchmarks: make the chunked form use chunks of 32 or 64, and tiles of 16 or 32
 * columns of S, where they fit (0: automatic). */
void deltanet_chunked_cuda_force_chunk(int chunk);
void deltanet_chunked_cuda_force_tile(int tile);

/* Decode (every run one token): ssm_conv_cuda, deltanet_prep_cuda, gated_delta_rule_cuda and
 * gated_rmsnorm_silu_cuda (with its int8 form when xq != NULL) of that token in one launch, the same
 * arithmetic in the same order: o, xq, xds and the whole state (conv taps and S) bit-equal to the
 * four calls'. x [n][conv_dim] is the in-projection's output (the conv's input), conv_w [conv_dim][K]
 * the conv weights; the conv output and prep's in-place results are not written. count: n_runs x nk
 * ints, all 0, left 0 (the blocks that read a key head's q and k channels count themselves in, and
 * the last writes those channels' conv state), a set of its own for each layer. conv_w == NULL: x is
 * the conv's output (ssm_conv_cuda made it), the conv taps are not touched and count is not used:
 * then bit-equal to the last three calls. ba is read as the mat-vec left it, z [n][nv * dv],
 * norm_w [dv], eps the norm's; the rest as gated_delta_rule_cuda. Returns 0, or -1 with nothing
 * launched where it cannot run (deltanet_decode_cuda_supported: an sm_90 device and image, for thread
 * block clusters; dv % 32 == 0, dv <= 256; 1 <= K <= 8; n_runs >= 1): the caller then makes the four
 * calls. */
int deltanet_decode_cuda_supported(int dk, int dv, int K);
int deltanet_decode_cuda(float *o, int8_t *xq, float *xds, float *state, size_t seq_stride, const float *x,
                         const float *conv_w, int *count, const float *ba, const float *z, const float *A,
                         const float *dt_bias, const float *norm_w, int nk, int nv, int dk, int dv, int K, int conv_dim,
                         int v_tiled, float eps, const int32_t *run_seq, const int32_t *run_off,
                         const int32_t *run_tok, int n_runs, cudaStream_t st);

/* Qwen3_5RMSNormGated per row of dv (rows = tokens x value heads; CPU gated_rmsnorm_silu_cpu), in place:
 *   o = o * 1/sqrt(mean(o^2) + eps) * w * silu(z)
 * o, z [n_rows][dv]; w [dv] (no 1 + w). If xq != NULL, also the int8 form of the result for
 * matmul_q8_cuda (quantize_q8_cuda's groups of 32 over the flat [n_rows * dv] buffer: d = max|x|/127,
 * q = rint(x / d), xds[g] = (d, d * sum q)); then dv % 32 == 0. */
void gated_rmsnorm_silu_cuda(float *o, int8_t *xq, float *xds, const float *z, const float *w, int n_rows, int dv,
                             float eps, cudaStream_t st);

/* Gated attention's q_proj output split (HF Qwen3_5Attention: view(..., n_head, 2 * head_dim) then
 * chunk): qg [n][n_head][2 * head_dim] = per head [query | gate] -> q, gate [n][n_head * head_dim]. */
void split_q_gate_cuda(float *q, float *gate, const float *qg, int n, int n_head, int head_dim, cudaStream_t st);

/* The attention output gate: att[i] *= sigmoid(gate[i]), i < n_elems; if xq != NULL also its int8
 * form as quantize_q8_cuda (n_elems % 32 == 0). */
void sigmoid_gate_cuda(float *att, int8_t *xq, float *xds, const float *gate, int64_t n_elems, cudaStream_t st);

#ifdef __cplusplus
}
#endif

#endif
