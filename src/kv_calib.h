/* kv_calib.h - calibration of the pxq KV cache (--kv-cache-type pxq: K q8_0, V 2-bit non-uniform,
 * a calibrated share of sensitive KV heads keeping V at q8_0): the 4 levels of each (attention
 * layer, KV head), which heads keep 8 bits, and how both travel in a GGUF file. docs/KVCACHE.md.
 *
 * Method (kv_calibrate):
 *   1. levels: the calibration text, in chunks of ctx tokens, runs through the CPU engine with the
 *      exact (float32) cache; every V row of every position is cut into groups of KV_GROUP values,
 *      each divided by its absmax as stored (f16), as kv_quantize_row does for KV_Q2NU, so
 *      u in [-1, 1]. Per (layer, head) a histogram of u weighted by d^2 (d the group's scale: the
 *      value-domain squared error of a code is d^2 (u - level)^2) feeds Lloyd-Max (Lloyd 1982, Max
 *      1960; 1-D weighted k-means), started from the uniform levels {-1, -1/3, 1/3, 1}.
 *   2. sensitivity of head (l, h): the mean KL(P_exact || P_quant) of the next-token distribution
 *      over the first sens_chunks chunks, with every position quantized (no sinks, no window), head
 *      (l, h)'s V at 2 bits and every other V at 8 bits, K at 8 bits; minus the same with every V at
 *      8 bits (the share of K's and the other heads' 8-bit error), so it is what 2 bits on that head
 *      alone cost. Measured with the fitted levels and with the uniform ones: a head keeps the
 *      uniform levels where they cost less (the MSE-optimal levels shrink a group's largest values,
 *      and where one channel keeps being that largest value the error does not average out over
 *      positions; tiny-qwen35 has such heads). 1 + 2 * n_layer_kv * n_head_kv passes (1 + n with
 *      uniform_levels; none with uniform_levels at ratio 0).
 *   3. the round(ratio * n_layer_kv * n_head_kv) most sensitive heads keep V at 8 bits.
 *
 * GGUF keys (written by kv_calib_put_gguf, read at model_open by kv_calib_read_gguf):
 *   pxq.kv.v_bits           u8 array [n_layer_kv * n_head_kv], layer-major: 2 or 8
 *   pxq.kv.v_levels         f32 array [n_layer_kv * n_head_kv * 4]: ascending, in [-1, 1]
 *   pxq.kv.sensitive_ratio  f32 in [0, 1]
 *   pxq.kv.v_sensitivity    f32 array [n_layer_kv * n_head_kv]: the measured KL (nats/token), optional
 *   pxq.kv.calib_sha256     string: SHA-256 of the calibration file's bytes
 *   pxq.kv.calib_chunks, pxq.kv.calib_ctx  u32: chunks and tokens per chunk calibrated on
 * n_layer_kv counts attention layers only (Qwen3.5's DeltaNet layers have no KV).
 */
#ifndef PXQ_KV_CALIB_H
#define KV_CALIB_MIN_TOKENS 256 /* calibration text below this many tokens is refused */
#define PXQ_KV_CALIB_H

#include <stddef.h>
#include <stdint.h>

#define KV_CALIB_PREFIX "pxq.kv."
#define KV_CALIB_KEY_V_BITS "pxq.kv.v_bits"
#define KV_CALIB_KEY_V_LEVELS "pxq.kv.v_levels"
#define KV_CALIB_KEY_RATIO "pxq.kv.sensitive_ratio"
#define KV_CALIB_KEY_SENS "pxq.kv.v_sensitivity"
#define KV_CALIB_KEY_SHA "pxq.kv.calib_sha256"
#define KV_CALIB_KEY_CHUNKS "pxq.kv.calib_chunks"
#define KV_CALIB_KEY_CTX "pxq.kv.calib_ctx"

#define KV_CALIB_CHUNKS_DEFAULT 16
#define KV_CALIB_CTX_DEFAULT 256
#define KV_CALIB_SENS_CHUNKS_DEFAULT 4
#define KV_CALIB_RATIO_DEFAULT 0.15f

struct gguf_file;
struct gguf_writer;
struct pxq_model;

struct kv_calib {
    int n_layer_kv, n_head_kv;
    uint8_t *v_bits;       /* [n_layer_kv][n_head_kv] 2 or 8 */
    uint8_t *v8;           /* [n_layer_kv][n_head_kv] 1 where v_bits is 8 (struct kv_spec's v8) */
    float *levels;         /* [n_layer_kv][n_head_kv][4] ascending in [-1, 1] */
    float *sensitivity;    /* [n_layer_kv][n_head_kv] KL in nats per token, or NULL (not measured) */
    float ratio;           /* share of heads asked to keep 8 bits */
    char sha256[65];       /* calibration file's SHA-256 (hex), "" if unknown */
    int chunks, ctx;
};

struct kv_calib_params {
    const char *calib_file; /* plain text or a JSON list of strings (quantize_calib.h calib_load) */
    int chunks;             /* at most this many chunks (default KV_CALIB_CHUNKS_DEFAULT) */
    int ctx;                /* tokens per chunk (default KV_CALIB_CTX_DEFAULT) */
    int sens_chunks;        /* chunks for the sensitivity passes (default KV_CALIB_SENS_CHUNKS_DEFAULT) */
    float ratio;            /* share of heads that keep V at 8 bits, in [0, 1] */
    int uniform_levels;     /* keep the uniform levels (only pick the sensitive heads): the baseline */
    int n_threads;          /* 0: all cores */
    int quiet;              /* no progress lines on stderr */
};
struct kv_calib_params kv_calib_default_params(void);

/* Allocate c's arrays for n_layer_kv x n_head_kv heads: bits 2, uniform levels, no sensitivity. */
void kv_calib_alloc(struct kv_calib *c, int n_layer_kv, int n_head_kv);
void kv_calib_free(struct kv_calib *c);

/* Weighted Lloyd-Max over points x[n] with weights w[n] (w NULL: 1): levels[4] in/out, the start
 * and the result (ascending). Iterates nearest-level assignment and centroid updates until no level
 * moves more than 1e-7 or max_iter rounds; a cell left empty keeps its level. The mean squared
 * error never increases from the start's. Returns the final weighted MSE. */
double kv_lloyd_max(float levels[4], const float *x, const double *w, int64_t n, int max_iter);
/* Weighted MSE of quantizing x[n] to the nearest of levels[4] (w NULL: 1). */
double kv_levels_mse(const float levels[4], const float *x, const double *w, int64_t n);

/* Calibrate model m (any architecture the CPU forward runs) on p->calib_file into out (allocated
 * here; kv_calib_free). Progress on stderr unless p->quiet. 0, or -1 with a message. */
int kv_calibrate(struct kv_calib *out, struct pxq_model *m, const struct kv_calib_params *p, char *err, size_t errlen);

/* Read the pxq.kv.* keys of g for a model of n_layer_kv attention layers of n_head_kv KV heads.
 * Returns 1 with c filled, 0 if g has none of the keys (c zeroed), or -1 with a message naming the
 * key: a key of the wrong type, an array whose length is not n_layer_kv * n_head_kv (* 4 for the
 * levels), a bit width other than 2 or 8, levels not ascending in [-1, 1], a ratio outside [0, 1],
 * v_bits without v_levels or the other way round. */
int kv_calib_read_gguf(struct kv_calib *c, const struct gguf_file *g, int n_layer_kv, int n_head_kv, char *err, size_t errlen);
/* Set the pxq.kv.* keys of c in w. */
void kv_calib_put_gguf(struct gguf_writer *w, const struct kv_calib *c);

/* Copy the GGUF file in_path to out_path with every tensor and metadata key, the pxq.kv.* keys
 * replaced by c's (general.alignment is dropped: the writer aligns to GGUF's default 32). Written as
 * OUT.tmp.XXXXXX beside out_path and renamed at the end: out_path is never half-written, and on
 * failure no temp file remains. in_path may equal out_path (pxq quantize rewrites its own output).
 * 0, or -1 with a message. */
int kv_calib_write_gguf(const char *in_path, const char *out_path, const struct kv_calib *c, char *err, size_t errlen);

#endif
