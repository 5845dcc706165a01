/* quantize.h - `pxq quantize`: an HF checkpoint (BF16/F16/F32 safetensors) to a GGUF file with
 * group-wise integer weights, round-to-nearest or calibrated (AWQ-style scaling, GPTQ-style error
 * compensation, or both).
 *
 * Types written are all standard ggml/GGUF types, so the output loads in llama.cpp too; PXQ has
 * no type of its own:
 *   int4, group 32, symmetric  -> Q4_0  { f16 d; u8 qs[16] }        w = d * (q - 8)
 *   int4, group 32, asymmetric -> Q4_1  { f16 d; f16 m; u8 qs[16] } w = d * q + m
 *   int8, group 32, symmetric  -> Q8_0  { f16 d; i8 qs[32] }        w = d * q
 * Other group sizes (and int8 asymmetric: ggml's Q8_1 is an activation type, not a weight type)
 * have no GGUF type and are rejected. Norms, biases and small tensors stay F32/F16 (see
 * quantize.c, tensor_policy).
 *
 * Calibration (quantize_calib.c) runs the model's own CPU forward on the calibration text and
 * observes every weight product's input through matmul_cpu_set_observer; it keeps, per input site
 * (tensors that read the same input: q/k/v, gate/up, ...), H = X^T X and mean |x| per channel.
 */
#ifndef PXQ_QUANTIZE_H
#define PXQ_QUANTIZE_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

struct threadpool;

enum quant_method { QUANT_RTN, QUANT_AWQ, QUANT_GPTQ, QUANT_AWQ_GPTQ };

#define QUANTIZE_MAX_KEEP 16

struct quantize_params {
    const char *model_dir;        /* HF directory */
    const char *output;           /* OUT.gguf; written as a temp file in its directory, renamed at the end */
    enum pxq_type wtype;          /* Q4_0, Q4_1 or Q8_0 for the linear weights */
    enum pxq_type embd_type;      /* token_embd (PXQ_TYPE_COUNT: default, see quantize.c) */
    enum pxq_type output_type;    /* lm_head, also token_embd when tied (PXQ_TYPE_COUNT: default Q8_0) */
    int group_size;               /* 32 */
    enum quant_method method;
    const char *calib_file;       /* JSON list of strings, or plain text; required for calibrated methods */
    int calib_size;               /* sequences of calib_seq_len tokens (default 128) */
    int calib_seq_len;            /* default 512 */
    const char *keep_f16[QUANTIZE_MAX_KEEP]; /* fnmatch(3) globs on GGUF tensor names: stored F16 */
    int n_keep_f16;
    int act_order;                /* GPTQ: process columns by descending diag(H) */
    int n_threads;                /* 0: all cores */
    int progress;                 /* draw a per-tensor progress bar on stderr */
    int quiet;                    /* no summary lines on stderr */
};

/* Defaults: Q4_0, group 32, RTN, calib 128 x 512, default embd/output types. */
struct quantize_params quantize_default_params(void);

/* dtype ("int4"/"int8") + group size + symmetric -> GGUF type; -1 with a message naming what has
 * no type (e.g. "int4 with group size 64: no GGUF type; ..."). */
int quantize_pick_type(const char *dtype, int group_size, int sym, enum pxq_type *out, char *err, size_t errlen);

/* Run the whole job. Returns 0, or -1 with a one-line message; on failure (and on SIGINT, SIGTERM,
 * SIGHUP, which it handles while writing) no OUT and no temp file remain. SIGXFSZ is ignored while
 * writing, so a file-size limit surfaces as write() failing with EFBIG. Not reentrant: the signal
 * handlers clean up one process-wide temp path, so one quantize_model at a time per process. */
int quantize_model(const struct quantize_params *p, char *err, size_t errlen);

/* ---- the group quantizers, shared by RTN, AWQ and GPTQ (quantize_algo.c) ---- */

/* Parameters of one group of 32 weights for type t (Q4_0, Q4_1, Q8_0), computed from x[32] as
 * ggml's reference quantizers do (quantize_row_q4_0_ref etc.: Q4_0 d = max/-8 with max the value of
 * largest magnitude; Q4_1 d = (max-min)/15, m = min; Q8_0 d = amax/127), then rounded to f16 as
 * stored. *d and *m are the f16-rounded values; m is 0 for the symmetric types. */
void qgroup_params(enum pxq_type t, const float *x, float *d, float *m);
/* The same with a search over the range: the group's extremes shrunk by 0..19 % (GPTQ's reference
 * quantizer with mse=True), keeping the (d, m) of least sum imp[j] (x[j] - decoded)^2; imp NULL:
 * uniform. Starts from qgroup_params, so never worse than it on that measure. Q8_0: qgroup_params. */
void qgroup_params_mse(enum pxq_type t, const float *x, const float *imp, float *d, float *m);
/* The integer code of x under (d, m) for type t (Q4_0: 0..15 with w = d*(q-8); Q4_1: 0..15;
 * Q8_0: -127..127), rounding to nearest; and the value it decodes to. */
int   qgroup_code(enum pxq_type t, float x, float d, float m);
float qgroup_value(enum pxq_type t, int q, float d, float m);
/* Pack 32 codes and (d, m) into one block of type t (layouts in quant.h). */
void  qgroup_pack(enum pxq_type t, const int *q, float d, float m, uint8_t *block);

/* GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
 * Transformers", arXiv:2210.17323, Algorithm 1): quantize W[n_out][n_in] (row-major, ne[0] = n_in,
 * modified in place) column by column, spreading each column's error over the not yet quantized
 * columns through the upper Cholesky factor of H^-1, with H[n_in][n_in] = X^T X (double, not
 * modified) damped by `damp` times its mean diagonal. Group parameters are computed when the
 * group's first column is reached (groups are the GGUF blocks, 32 consecutive columns). act_order:
 * columns are processed by descending diag(H) (the paper's act-order heuristic); a group's
 * parameters are then set when the first of its columns comes up. Group parameters come from
 * qgroup_params_mse weighted by diag(H). Writes n_out rows of type t into out. Returns 0, or -1 if H is not positive definite even after damping (caller falls back to RTN). */
int gptq_quantize(enum pxq_type t, float *W, int64_t n_out, int64_t n_in, const double *H, double damp, int act_order,
                  void *out, struct threadpool *tp);

/* tr(dW H dW^T) = sum over rows of dW_r^T H dW_r: the output error ||dW X^T||^2 of the weight
 * change dW[n_out][n_in] over the calibration inputs, from H = X^T X (float, n_in x n_in). */
double quant_output_error(const float *dW, int64_t n_out, int64_t n_in, const float *H, struct threadpool *tp);

/* AWQ (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization for LLM Compression and
 * Acceleration", arXiv:2306.00978, section 3.2): for tensors that read one input (members), search
 * s = absmean^alpha / sqrt(max * min) over alpha in {0, 1/n_grid, ..., (n_grid-1)/n_grid} for the
 * least total output error sum_m tr(dW_m H_m dW_m^T), dW_m = W_m - Q(W_m diag(s)) diag(s)^-1.
 * alpha 0 is s = 1, plain RTN, so the result is never worse than RTN on this measure.
 * absmean[n_in]: mean |x| per input channel. Writes s[n_in]; returns alpha; *err0, *err_best: the
 * error at alpha 0 and at the chosen alpha. */
struct awq_member {
    const float *W;   /* [n_out][n_in] */
    int64_t n_out;
    const float *H;   /* [n_in][n_in], X^T X of this member's inputs */
};
double awq_search(enum pxq_type t, const struct awq_member *mem, int n_mem, int64_t n_in, const float *absmean, int n_grid,
                  float *s, double *err0, double *err_best, struct threadpool *tp);

/* Round-to-nearest of W[n_out][n_in] into rows of type t, and, when deq is not NULL, the decoded
 * values into deq[n_out][n_in]. */
void rtn_quantize(enum pxq_type t, const float *W, int64_t n_out, int64_t n_in, void *out, float *deq);

#endif
