/* engine.h - PXQ's public API: open a model, create sequences, evaluate a ragged batch, read logits.
 *
 * Every client (pxq run, perplexity, serve, bench) goes through this header. A batch is ragged as in
 * llama.cpp's llama_batch: token i carries its sequence id and position, and tokens of several
 * sequences may be mixed in one call. Errors: functions return 0 / -1 (or NULL) and write one line
 * into the caller's err buffer; a failed pxq_decode changes nothing.
 */
#ifndef PXQ_ENGINE_H
#define PXQ_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "model.h"

enum pxq_device { PXQ_DEVICE_CPU = 0, PXQ_DEVICE_CUDA = 1 };

struct pxq_engine_params {
    int n_ctx;        /* max positions per sequence (0: the model's n_ctx_train, capped at 4096) */
    int n_seq_max;    /* sequences that may exist at once (default 1) */
    int n_batch;      /* max tokens per internal forward step; larger batches are split (default 512) */
    int n_threads;    /* CPU threads (0: all cores) */
    int kv_block_size;/* positions per KV block (default KV_BLOCK_SIZE_DEFAULT, 16) */
    int kv_blocks;    /* KV pool size in blocks (0: enough for n_seq_max full sequences) */
    int kv_type;      /* enum kv_cache_type (kvcache.h): KV_CACHE_F16 (default), KV_CACHE_Q8_0, KV_CACHE_PXQ */
    int kv_sink, kv_window; /* quantized caches: first / most recent positions kept exact (default 4, 128) */
    int attn_window, attn_sinks; /* window + sink attention: a query sees the first attn_sinks and its last
                                    attn_window positions (0: full attention, the default) */
    int kv_topk_blocks;          /* with a window: also the top k blocks by Quest's bound (0: off) */
    int kv_keep_past_window;     /* window attention without block selection gives back each sequence's
                                    blocks past its window (kv_blocks_per_seq); 1 keeps them (a test's
                                    reference) */
    /* pxq cache: per (attention layer, KV head), layer-major, 1 = keep V at 8 bits ([n_layer_kv][n_head_kv]),
     * and the 2-bit levels ([n_layer_kv][n_head_kv][4]). NULL: the model's calibration (pxq.kv.* GGUF
     * keys, kv_calib.h), else none (no 8-bit heads, uniform levels). Calibration sets them. */
    const uint8_t *kv_v8;
    const float *kv_levels;
    int spec_mtp;       /* speculative decoding with Qwen3.5's MTP head (spec.h): the engine keeps the MTP layer's
                           KV as one more cache layer and the final hidden state of every token (pxq_hidden),
                           and pxq_mtp_decode runs the head. Refused for a model without MTP weights. */
    int spec_checkpoint;/* speculative decoding will checkpoint sequences (pxq_seq_checkpoint): the CUDA arena
                           holds a copy slot of the recurrent state per sequence (0: allocated outside it at the
                           first checkpoint) */
    int kv_offload;     /* the host KV tier (--kv-offload, kvcache.h kv_cache_tier): the pool holds every sequence's
                           whole context; blocks past the device tier live in pinned host memory, read in place,
                           and before each step the oldest cold blocks move there to make room for new ones */
    int kv_dev_blocks;  /* with kv_offload: blocks of the device tier (0: the CUDA backend fits as many as its
                           --gpu-mem arena leaves room for; the CPU backend keeps them all, no tier) */
    size_t swap_space;  /* with kv_offload: the host tier's budget in bytes (vLLM's --swap-space; 0: no bound) */
    int kv_select_cache;/* CUDA, with kv_offload and block selection: device-tier blocks kept as a cache of the
                           host blocks decode steps choose, per layer and KV head (--kv-select-cache; 0: none,
                           each chosen host block read in place; a multiple of 4, at most 1024) */
    int prefix_caching; /* automatic prefix caching (kvcache.h): reuse cached full blocks of earlier sequences
                           (default 0; only for f16 caches of models whose layers are all attention) */
    enum pxq_device device;
    size_t gpu_mem;   /* CUDA: arena bytes (0: backend default) */
};

struct pxq_engine;

/* One ragged batch. logits[i] != 0 asks for the logits of token i (NULL: only the last token). */
struct pxq_batch {
    int n_tokens;
    const int32_t *token;   /* [n_tokens] ids < n_vocab */
    const int32_t *pos;     /* [n_tokens] position of each token in its sequence */
    const int32_t *seq_id;  /* [n_tokens] */
    const int8_t  *logits;  /* [n_tokens] or NULL */
};

/* Defaults for every field (n_threads 0 = all cores). */
struct pxq_engine_params pxq_engine_default_params(void);
/* The context per sequence when none is given (pxq_engine_params.n_ctx 0; pxq plan's default too):
 * the model's n_ctx_train, at most 4096. */
int pxq_default_n_ctx(const struct pxq_hparams *hp);

/* The KV cache's choices (element type per layer and head, residual, attention scale) that an engine
 * with these parameters builds its layout from (kvcache.h kv_layout_init): for accounts (bench, plan)
 * that need the engine's own bytes per position without creating one. */
struct kv_spec pxq_kv_spec(const struct pxq_model *m, const struct pxq_engine_params *p);
/* The layout itself (kv_layout_init over pxq_kv_spec, the model's attention layers and KV heads):
 * 0, or -1 with a message. kv_layout_free it. */
int pxq_kv_layout(struct kv_layout *lay, const struct pxq_model *m, const struct pxq_engine_params *p, char *err,
                  size_t errlen);

/* Create an engine over an opened model (the model must outlive it). NULL + message on failure
 * (e.g. the KV pool cannot be allocated). */
struct pxq_engine *pxq_engine_new(struct pxq_model *m, const struct pxq_engine_params *p, char *err, size_t errlen);
void pxq_engine_free(struct pxq_engine *e);
struct pxq_model *pxq_engine_model(struct pxq_engine *e);
const struct pxq_engine_params *pxq_engine_params(const struct pxq_engine *e);

/* Sequences: pxq_seq_new returns a free id in [0, n_seq_max), or -1 if all are taken. */
int  pxq_seq_new(struct pxq_engine *e);
void pxq_seq_free(struct pxq_engine *e, int seq);
/* Positions already in the sequence's cache (the next token's position). */
int  pxq_seq_len(const struct pxq_engine *e, int seq);
/* Drop positions >= n_pos (rollback). Returns -1 if n_pos is beyond the sequence or the model's
 * recurrent layers cannot roll back. */
int  pxq_seq_truncate(struct pxq_engine *e, int seq, int n_pos);

/* Speculative decoding's rollback (spec.h). pxq_seq_checkpoint remembers the sequence's position and,
 * for models with recurrent layers (Qwen3.5's Gated DeltaNet), copies their conv and delta-rule state
 * (float32, rstate bytes per sequence). pxq_seq_rollback(seq, n_pos) drops positions >= n_pos and
 * returns the positions now in the cache: n_pos when every layer is attention, else the checkpoint's
 * position (<= n_pos), its state restored, and the caller evaluates the tokens of [returned, n_pos)
 * again (in its next batch). -1: n_pos beyond the sequence, or below the checkpoint of a recurrent
 * model, or no checkpoint. The checkpoint stays valid until the next pxq_seq_checkpoint. */
int  pxq_seq_checkpoint(struct pxq_engine *e, int seq);
/* The same, taken when the sequence reaches pos (>= its length) during the next pxq_decode. No
 * logits may be asked of the batch's tokens before pos. The CPU backend's DeltaNet layers copy the
 * state as they pass pos (one forward pass); the CUDA backend runs the tokens before each due
 * checkpoint first, then the checkpoints, then the rest (two passes). -1 if pos is below the
 * sequence's length. */
int  pxq_seq_checkpoint_at(struct pxq_engine *e, int seq, int pos);
int  pxq_seq_rollback(struct pxq_engine *e, int seq, int n_pos);

/* MTP drafting (params.spec_mtp; HF Qwen3.5 mtp.*, vLLM qwen3_5_mtp.py). After pxq_decode, pxq_hidden(i)
 * is the final hidden state (after the output norm) of the batch's token i, [n_embd] float32. The MTP
 * head's row for position p of a sequence takes h_p and the token at p + 1:
 *   x = fc([enorm(embd(token)) | hnorm(h_p)]);  x = decoder_layer(x) (gated attention over the MTP
 *   layer's own KV of rows 0..p, RoPE at p);  m = shared_head_norm(x);  logits = lm_head(m)
 * predicting the token at p + 2; chaining feeds a draft back with m as its h. pxq_mtp_decode runs b
 * (token[i]: the token after pos[i]; pos[i]: h's position) with hidden [n_tokens][n_embd]; a sequence's
 * rows are consecutive positions starting at most at its MTP length (rows may be written again) and
 * below n_ctx. Then pxq_logits are the requested rows' logits and pxq_hidden(i) is row i's m.
 * Returns 0, or -1 with a message (no MTP head, bad ids or positions, KV pool exhausted). */
const float *pxq_hidden(const struct pxq_engine *e, int i);
int pxq_mtp_decode(struct pxq_engine *e, const struct pxq_batch *b, const float *hidden, char *err, size_t errlen);

/* Sharing KV between sequences (kvcache.h: refcounted blocks). 1 if this engine can: every layer is
 * attention (a recurrent state, Qwen3.5's DeltaNet, can be neither shared nor rewound by block). */
int  pxq_engine_can_share_kv(const struct pxq_engine *e);
/* dst (new, empty) becomes a copy of src's cache: src's full blocks shared by reference, its partly
 * filled last block copied (copy on write). Returns -1 if the engine cannot share KV, the pool
 * has no block for the copy, or the backend keeps KV on a device (CUDA: not yet). */
int  pxq_seq_fork(struct pxq_engine *e, int dst, int src);
/* Prefix caching: 1 if on (params.prefix_caching, an f16 cache, every layer attention). */
int  pxq_prefix_caching(const struct pxq_engine *e);
/* Enter the full blocks of seq that hold tokens[0, n) (its first n positions) in the prefix cache. */
void pxq_prefix_commit(struct pxq_engine *e, int seq, const int32_t *tokens, int n);
/* seq new and empty, about to prefill tokens[0, n): take the cached blocks its tokens start with
 * (never the last token's: its logits must be computed). Returns the positions now in seq's cache
 * (a multiple of the block size; 0 when prefix caching is off or nothing matched). */
int  pxq_prefix_match(struct pxq_engine *e, int seq, const int32_t *tokens, int n);

/* Evaluate a batch. Each token's pos must equal its sequence's length plus the number of earlier
 * tokens of that sequence in this batch (tokens append in order). Returns 0, or -1 with a message
 * (bad id, bad position, context full, KV pool exhausted) leaving every sequence unchanged.
 * Shapes: logits of the requested tokens, [n_outputs][n_vocab] float32, in batch order. */
int pxq_decode(struct pxq_engine *e, const struct pxq_batch *b, char *err, size_t errlen);
int pxq_n_outputs(const struct pxq_engine *e);
/* Logits of output i (0 <= i < pxq_n_outputs), [n_vocab]; valid until the next pxq_decode. */
const float *pxq_logits(const struct pxq_engine *e, int i);

/* KV pool accounting (for admission control and /metrics): the blocks sequences can hold (the
 * selection cache's slots not among them), those free, positions a block. */
int pxq_kv_blocks_total(const struct pxq_engine *e);
int pxq_kv_blocks_free(const struct pxq_engine *e);
int pxq_kv_block_size(const struct pxq_engine *e);
/* The host KV tier (params kv_offload): the device tier's blocks for sequences (less the selection
 * cache's slots) and the host tier's (n_host 0: no tier), the host blocks in use, blocks moved there so far, and the most bytes one decode step of the
 * sequences as they stand reads from the host tier: at most kv_topk_blocks host blocks per sequence
 * with block selection (the key bounds stay on the device; an upper bound under the selection cache,
 * which serves the blocks chosen again from the device), else every host block (read in place each
 * step it is seen); staged: the bytes prefill
 * steps have copied from the host tier to the device so far (the CUDA backend stages each host block's
 * layer slices once a step: attention_staged.cu; 0 where it reads them in place). */
struct pxq_kv_tier_stats {
    int n_dev, n_host, host_used;
    uint64_t moved;
    double host_read_step;
    uint64_t staged;
    uint64_t sc_hits, sc_fills, sc_in_place; /* the selection cache (--kv-select-cache): chosen host blocks read
                                              * from their slot, copied into one, read in place (every way of
                                              * their set in use); zeros without it */
};
void pxq_kv_tier_stats(const struct pxq_engine *e, struct pxq_kv_tier_stats *st);
/* Blocks the sequence would need to grow to n_pos positions. */
int pxq_kv_blocks_needed(const struct pxq_engine *e, int seq, int n_pos);
/* Blocks a new sequence of n_pos positions holds at most (fewer than the positions' blocks where
 * window attention gives back the blocks past the window: kv_blocks_per_seq), and the most
 * positions one sequence can reach in the pool (then the context). */
int pxq_kv_blocks_for_seq(const struct pxq_engine *e, int n_pos);
int pxq_kv_seq_positions(const struct pxq_engine *e);

/* Device backend facts for `pxq bench` rows (the CPU backend answers 0 / "cpu"). The memory plan
 * itself is memplan.h's; the CUDA backend refuses a model that exceeds --gpu-mem before loading it.
 * Peak bytes in use in the CUDA backend's one device arena (weights + KV + activations + workspace;
 * at most the arena size, params.gpu_mem); the CUDA context and cuBLAS's own handle are outside it. */
size_t pxq_engine_device_mem_peak(const struct pxq_engine *e);
/* The device's name, e.g. "NVIDIA H200", or "cpu". */
const char *pxq_engine_device_name(const struct pxq_engine *e);
/* The kernel path the last pxq_decode took: "cpu", "cuda gemv q4_0 graph" (fused dequant mat-vec,
 * replayed CUDA graph), "cuda gemv q4_0" (eager), "cuda cublas-f16 q4_0" (prefill: f16 tiles + cuBLAS;
 * MoE models add how the experts ran: " experts q8-mma", int8 tensor cores, or " experts fp32"). */
const char *pxq_engine_kernel_path(const struct pxq_engine *e);

#endif
