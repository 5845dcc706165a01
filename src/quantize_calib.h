/* quantize_calib.h - calibration for pxq quantize: the calibration text, and the statistics of
 * each weight product's input, gathered from the model's own CPU forward.
 *
 * How the activations are observed: matmul_cpu_set_observer (ops_cpu.h) hooks every weight
 * product of the forward on this thread, for every architecture the forward runs (dense, MoE,
 * Qwen3.5's DeltaNet and gated attention) without a line in the forward itself. A "site" is the
 * input of one or more weights (q/k/v read one input; the site is keyed by one of them, its
 * leader). Activations are those of the unquantized model (no layer-by-layer re-run with the
 * quantized earlier layers, which GPTQ's reference code does: a simplification, see docs/QUANT.md).
 */
#ifndef PXQ_QUANTIZE_CALIB_H
#define PXQ_QUANTIZE_CALIB_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

struct pxq_tokenizer;

struct calib_site {
    const struct pxq_tensor *leader; /* the weight whose product's input this is */
    int64_t n_in;
    double *H;       /* [n_in][n_in] sum over tokens of x x^T (symmetric after calib_run) */
    double *abs_sum; /* [n_in] sum over tokens of |x| */
    long n_tok;
};

struct calib {
    struct calib_site *sites;
    int n_sites;
};

/* Read the calibration file: a JSON array of strings (when the file starts with '[' and parses as
 * JSON; a .json file must parse), else plain UTF-8 text. Texts are tokenized and concatenated
 * (AutoAWQ's recipe), then cut into up to n_seq sequences of seq_len tokens (one shorter sequence
 * if the text has fewer than seq_len tokens). *sha256_hex gets the file's SHA-256 (65 bytes).
 * Errors (message, -1): unreadable, empty, invalid JSON, a JSON array that is empty or holds a
 * non-string, fewer than 2 tokens. */
int calib_load(const char *path, const struct pxq_tokenizer *tok, int n_seq, int seq_len, int32_t **tokens, int *n_seq_out,
               int *seq_len_out, char *sha256_hex, char *err, size_t errlen);

/* Add a site keyed by `leader` (no-op if present). Returns its index. */
int calib_add_site(struct calib *c, const struct pxq_tensor *leader);
/* Index of the site of `leader`, or -1. */
int calib_find_site(const struct calib *c, const struct pxq_tensor *leader);

/* Run the model over tokens[n_seq][seq_len] on the CPU (n_threads; 0: all) and accumulate every
 * site's statistics. progress (may be NULL) is called after each sequence. 0 or -1 with a message. */
int calib_run(struct calib *c, struct pxq_model *m, const int32_t *tokens, int n_seq, int seq_len, int n_threads,
              void (*progress)(void *ctx, int done, int total), void *pctx, char *err, size_t errlen);

void calib_free(struct calib *c);

#endif
