/* cmd_bench.c - `pxq bench`: prefill and decode throughput, llama-bench style, with the protocol and
 * the roofline on every row (docs/DESIGN.md "Benchmark protocol"). Drives the engine through engine.h only.
 *
 * Tests, for each batch b (concurrent sequences) and depth d:
 *   ppP: b sequences, each first filled with d random tokens (not timed), then one ragged batch of
 *        b x P tokens (logits for each sequence's last token) is timed. tok/s = b*P / t.
 *   tgN: b sequences filled with d tokens (not timed), then N steps of b tokens (one per sequence,
 *        logits for all) are timed. tok/s = b*N / t. Tokens are random ids, not sampled (as llama-bench).
 *   verifyK (--spec-verify K,...): speculative decoding's verification pass: b sequences filled with d
 *        tokens, then VERIFY_PASSES passes of K tokens per sequence (logits for all), all kept, each
 *        with its checkpoint due after its first token (pxq_seq_checkpoint_at; K = 1: before it): the
 *        shape of a pass after a rejection, which evaluates the token the rollback returned to again,
 *        then the correction and K - 2 drafts, and checkpoints at the correction.
 *        tok/s = b*K*passes / t; a table below gives each pass's time, its ratio to verify1's, and with
 *        --spec-acceptance A the projected decode tok/s = b * (1 - A^K) / (1 - A) / pass time (the
 *        expected tokens per pass for drafts accepted independently with probability A).
 *   tgN with --spec D: speculative decoding: each of the b sequences is prefilled with max(d, 1) random
 *        tokens (not timed), then generates N tokens greedily (argmax, on the host) with the drafter,
 *        all b verified in one batch per step. tok/s = b*N / t; the row's acceptance follows it.
 * Each test runs once untimed (warm-up, unless --no-warmup), then -r times; mean and sample sd.
 *
 * Figures (formulas also printed in the header):
 *   decode GB/s = bytes per step x steps / t, bytes per step = weights read (all but token_embd, which
 *     is a row gather; MoE: shared weights + expected distinct experts b' = E(1-(1-k/E)^b) per layer,
 *     uniform routing) + KV read (b x the K and V bytes of the positions each step's query reads,
 *     averaged over the N steps: every position before it; with window attention at most the sinks
 *     and the window; with block selection those and the top k blocks, plus every block's key
 *     bounds) + recurrent state read + written (2 x b x state bytes/seq). % of roofline = GB/s / copy
 *     bandwidth.
 *   prefill TFLOP/s = FLOPs / t, FLOPs = 2 x (matmul params per token: layers, MoE active experts
 *     only) x b*P + 2 x n_vocab x n_embd x b (lm_head on the outputs) + attention 4 x n_head x
 *     head_dim x sum of context lengths x attention layers. % of roofline = TFLOP/s / GEMM rate.
 * KV element size: 4 B on the CPU backend (float32 cache), 2 B (f16) on CUDA.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>
#include <time.h>

#include "cli/bench_seed.h"

#include "args.h"
#include "engine.h"
#include "load_opts.h"
#include "memplan.h"
#include "quant.h"
#include "roofline.h"
#include "spec.h"
#include "spec_opts.h"
#include "util.h"

#define MAX_LIST 16

static const char *usage =
    "usage: pxq bench [-m PATH | --load-format dummy --config FILE.json [--dtype T]] [options]\n"
    "  -m, --model PATH       GGUF file or HF model directory (default: the bundled tiny model)\n"
    "  -p, --n-prompt LIST    prompt tokens per sequence, timed as one batch (default 512; 0: none)\n"
    "  -n, --n-gen LIST       generated tokens per sequence (default 128; 0: none)\n"
    "  -b, --batch LIST       concurrent sequences (default 1), e.g. 1,4,16\n"
    "  -d, --depth LIST       tokens already in context before timing, filled by prefill (default 0)\n"
    "  -r, --repetitions N    timed repetitions (default 5)\n"
    "  -t, --threads N        CPU threads (default: the cores it may use)\n"
    "  -ub, --ubatch-size N   max tokens per forward step (default 512)\n"
    "  --device cpu|cuda      backend (default cpu)\n"
    "  -ngl, --n-gpu-layers N llama.cpp's: N > 0 (or all) is --device cuda, 0 is cpu (all layers or none)\n"
    "  --gpu-mem SIZE         CUDA arena, e.g. 16GiB\n"
    "  --spec-verify LIST     speculative verification passes of K tokens per sequence, e.g. 1,2,3,4\n"
    "  --spec-acceptance A    project decode tok/s from the verify passes at draft acceptance A (0..1)\n"
    "  --spec D, --spec-k K   tg rows decode greedily with speculation (ngram, draft --model-draft M, mtp)\n"
    "  --no-warmup            skip the untimed run before each test\n"
    "  --json                 JSON array of rows instead of markdown\n"
    "  --preset seed          the widely shared 27B-on-a-V100 claim's four rows (512 x 16, 2048 x 8, 16384 x 1,\n"
    "                         131072 + 1024 x 1) on presets/qwen3.5-27b.json, dummy q4_0, --gpu-mem 15.2GiB,\n"
    "                         pxq KV, each its own bench process, beside the claim (give --device cuda;\n"
    "                         --dry-run prints the commands)\n"
    "  --kv-cache-type T, --block-size N, --attention-window W, --attention-sinks N, --kv-topk-blocks K,\n"
    "  --kv-offload, --swap-space GIB, --kv-device-blocks N, --rope-scaling T ...: the KV cache, attention\n"
    "                         and RoPE flags of pxq run (pxq run --help lists them)\n";

struct opts {
    const char *model;
    struct load_opts lo;
    int p[MAX_LIST], np, n[MAX_LIST], nn, b[MAX_LIST], nb, d[MAX_LIST], nd;
    int reps, warmup, json;
    int v[MAX_LIST], nv;   /* --spec-verify: tokens per pass */
    struct spec_opts so;   /* --spec: tg rows with speculative decoding */
    struct spec_params sp;
    double accept;         /* --spec-acceptance, or -1 */
    struct pxq_engine_params ep;
};

#define VERIFY_PASSES 32

static int parse_list(struct args *a, int *out, int lo, int hi) {
    const char *flag = a->argv[a->i], *s = arg_str(a);
    int k = 0;
    const char *q = s;
    while (*q) {
        char *end;
        long v = strtol(q, &end, 10);
        if (end == q || v < lo || v > hi || (*end && *end != ',') || k == MAX_LIST)
            fail(a, 2, "%s expects up to %d comma-separated integers in [%d, %d], got '%s'", flag, MAX_LIST, lo, hi, s);
        out[k++] = (int)v;
        if (*end == ',' && !end[1]) /* "1,4," */
            fail(a, 2, "%s expects up to %d comma-separated integers in [%d, %d], got '%s'", flag, MAX_LIST, lo, hi, s);
        q = *end ? end + 1 : end;
    }
    if (k == 0) fail(a, 2, "%s expects a list of integers, got '%s'", flag, s);
    return k;
}

/* ---- what a step reads, from the model's tensors ---- */

struct model_account {
    double dense_bytes;      /* every weight except token_embd (unless tied: lm_head reads it) and experts */
    double expert_bytes;     /* all experts of all layers */
    double dense_params;     /* matmul params per token, without lm_head and experts */
    double expert_params;
    double head_params;      /* n_vocab x n_embd */
    double kv_row;           /* K and V bytes of one position, all layers */
    double kv_bounds_block;  /* block selection: the key bounds of one block, all layers */
    int block_size, attn_window, attn_sinks, topk_blocks;
    double state_per_seq;    /* bytes */
    int n_attn;
};

static int is_expert(const char *name) {
    int il, e, n = 0;
    char proj[16];
    return strstr(name, "_exps") != NULL ||
           (sscanf(name, "blk.%d.%15[a-z_].%d.weight%n", &il, proj, &e, &n) == 3 && n > 0) ||
           strstr(name, ".mlp.experts.") != NULL;
}

static void account(struct model_account *ma, const struct pxq_model *m, const struct pxq_engine_params *ep) {
    const struct pxq_hparams *hp = model_hparams(m);
    memset(ma, 0, sizeof *ma);
    for (int i = 0; i < model_n_tensors(m); i++) {
        const struct pxq_tensor *t = model_tensor(m, i);
        int embd = !strcmp(t->name, "token_embd.weight") || !strcmp(t->name, "model.embed_tokens.weight");
        int head = !strcmp(t->name, "output.weight") || !strcmp(t->name, "lm_head.weight");
        double ne = (double)tensor_nelements(t);
        if (is_expert(t->name)) {
            ma->expert_bytes += (double)t->nbytes;
            ma->expert_params += ne;
        } else if (embd) {
            if (hp->tie_embd) ma->dense_bytes += (double)t->nbytes; /* read whole as the lm_head */
        } else {
            ma->dense_bytes += (double)t->nbytes;
            if (!head && t->n_dims >= 2) ma->dense_params += ne;
        }
    }
    ma->head_params = (double)hp->n_vocab * hp->n_embd;
    struct kv_layout lay; /* the engine's own layout: the bytes a position's K and V take in the cache */
    if (pxq_kv_layout(&lay, m, ep, NULL, 0) == 0) {
        ma->kv_row = (double)(lay.block_bytes[0] + lay.block_bytes[1]) / lay.block_size;
        ma->kv_bounds_block = (double)kv_layout_bounds_bytes(&lay);
        ma->block_size = lay.block_size;
    }
    kv_layout_free(&lay);
    ma->attn_window = ep->attn_window, ma->attn_sinks = ep->attn_sinks, ma->topk_blocks = ep->kv_topk_blocks;
    ma->state_per_seq = (double)memplan_state_bytes_per_seq(hp);
    ma->n_attn = hparams_n_attn_layers(hp);
}

/* KV bytes one query at position n - 1 reads (n positions before and at it; header's rule). */
static double kv_read_bytes(const struct model_account *ma, double n) {
    if (!ma->attn_window || n <= ma->attn_sinks + ma->attn_window) return ma->kv_row * n;
    double seen = ma->attn_sinks + ma->attn_window, bounds = 0;
    if (ma->topk_blocks) {
        seen += (double)ma->topk_blocks * ma->block_size;
        bounds = ceil(n / ma->block_size) * ma->kv_bounds_block;
    }
    return ma->kv_row * (seen < n ? seen : n) + bounds;
}

/* The mean over steps i = 0 .. len - 1 of kv_read_bytes at depth + i + 1 positions. */
static double kv_read_mean(const struct model_account *ma, int depth, int len) {
    double sum = 0;
    for (int i = 0; i < len; i++) sum += kv_read_bytes(ma, (double)depth + i + 1);
    return len > 0 ? sum / len : 0;
}

/* Expected weight bytes read by one decode step of b tokens. */
static double step_weight_bytes(const struct model_account *ma, const struct pxq_hparams *hp, int b) {
    double w = ma->dense_bytes;
    if (hp->n_expert > 0) {
        double E = hp->n_expert, k = hp->n_expert_used;
        double distinct = E * (1.0 - pow(1.0 - k / E, b));
        w += ma->expert_bytes * distinct / E;
    }
    return w;
}

/* ---- running tests ---- */

struct result {
    const char *kind;  /* "pp" or "tg" */
    int b, len, depth;
    double ts[64];     /* tok/s per repetition */
    int n_ts;
    double mean, sd, value, pct;  /* value: GB/s (tg) or TFLOP/s (pp) */
    size_t peak;
};

static uint64_t rng_state = 0x853c49e6748fea9bull;
static int32_t rand_tok(int n_vocab) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((rng_state >> 33) % (uint64_t)n_vocab);
}

struct batchbuf {
    int32_t *tok, *pos, *seq;
    int8_t *lg;
    int cap;
};

static void bb_reserve(struct batchbuf *bb, int n) {
    if (n <= bb->cap) return;
    bb->tok = xrealloc(bb->tok, (size_t)n * sizeof *bb->tok);
    bb->pos = xrealloc(bb->pos, (size_t)n * sizeof *bb->pos);
    bb->seq = xrealloc(bb->seq, (size_t)n * sizeof *bb->seq);
    bb->lg = xrealloc(bb->lg, (size_t)n);
    bb->cap = n;
}

/* Append `len` tokens to each of the b sequences in one ragged batch (sequence-major); logits for each
 * sequence's tokens from index first_logit on, and always its last. */
static int feed(struct pxq_engine *e, struct batchbuf *bb, const int *seqs, int b, int len, int first_logit, char *err,
                size_t errlen) {
    int nv = model_hparams(pxq_engine_model(e))->n_vocab, k = 0;
    bb_reserve(bb, b * len);
    for (int s = 0; s < b; s++) {
        int p0 = pxq_seq_len(e, seqs[s]);
        for (int i = 0; i < len; i++, k++) {
            bb->tok[k] = rand_tok(nv);
            bb->pos[k] = p0 + i;
            bb->seq[k] = seqs[s];
            bb->lg[k] = (int8_t)(i >= first_logit || i == len - 1);
        }
    }
    struct pxq_batch batch = {k, bb->tok, bb->pos, bb->seq, bb->lg};
    return pxq_decode(e, &batch, err, errlen);
}

/* A tg row with speculative decoding (the header's protocol): b sequences prefilled with max(depth, 1)
 * random tokens, then len greedy tokens each, verified together one batch per step. Seconds of the
 * decoding, or -1; the counters add into st. */
static double spec_tg(struct pxq_engine *e, const struct spec_params *sp, int b, int len, int depth, struct spec_stats *st,
                      char *err, size_t errlen) {
    const int nv = model_hparams(pxq_engine_model(e))->n_vocab, n0 = depth > 0 ? depth : 1, cap = n0 + len + 1;
    struct spec_seq **ss = xcalloc((size_t)b, sizeof *ss);
    int32_t *hist = xmalloc((size_t)b * cap * sizeof *hist), *nh = xcalloc((size_t)b, sizeof *nh);
    int32_t *drafts = xmalloc((size_t)b * SPEC_K_MAX * sizeof *drafts), *nd = xmalloc((size_t)b * sizeof *nd);
    int *row0 = xmalloc((size_t)b * sizeof *row0), *rstart = xmalloc((size_t)b * sizeof *rstart);
    int *seqid = xmalloc((size_t)b * sizeof *seqid), rows_cap = b * (SPEC_K_MAX + 2) + 16;
    for (int s = 0; s < b; s++) seqid[s] = -1;
    int32_t *tok = xmalloc((size_t)rows_cap * 3 * sizeof *tok), *pos = tok + rows_cap, *sid = pos + rows_cap;
    int8_t *lg = xmalloc((size_t)rows_cap);
    struct sampler_params spp = sampler_default_params();
    struct sampler *smp = sampler_new(&spp, nv, err, errlen);
    double t = -1;
    for (int s = 0; s < b; s++) {
        if ((seqid[s] = pxq_seq_new(e)) < 0) {
            set_err(err, errlen, "no free sequence");
            goto out;
        }
        if (!(ss[s] = spec_seq_new(sp, e, seqid[s], err, errlen))) goto out;
        int32_t *h = hist + (size_t)s * cap;
        for (int i = 0; i < n0; i++) h[i] = rand_tok(nv);
        if (spec_prefill(ss[s], h, n0, err, errlen)) goto out;
        h[n0] = argmax_f32(pxq_logits(e, 0), nv);
        nh[s] = n0 + 1;
    }
    double t0 = now_sec();
    for (;;) {
        int n = 0, n_out = 0, live = 0;
        for (int s = 0; s < b; s++) {
            const int left = n0 + len - nh[s];
            nd[s] = -1;
            if (left <= 0) continue;
            live = 1;
            int32_t *h = hist + (size_t)s * cap, *d = drafts + (size_t)s * SPEC_K_MAX;
            if ((nd[s] = spec_propose(ss[s], h, nh[s], left - 1, d, err, errlen)) < 0) goto out;
            const int r = spec_rows(ss[s], h, nh[s], d, nd[s], tok + n, pos + n, sid + n, lg + n);
            if (r < 0) {
                set_err(err, errlen, "no checkpoint");
                goto out;
            }
            row0[s] = n_out, rstart[s] = n;
            for (int i = 0; i < r; i++) n_out += lg[n + i];
            n += r;
        }
        if (!live) break;
        struct pxq_batch bt = {n, tok, pos, sid, lg};
        if (pxq_decode(e, &bt, err, errlen) != 0) goto out;
        for (int s = 0; s < b; s++) {
            if (nd[s] < 0) continue;
            const float *rows[SPEC_K_MAX + 1];
            for (int i = 0; i <= nd[s]; i++) rows[i] = pxq_logits(e, row0[s] + i);
            int32_t *h = hist + (size_t)s * cap;
            int k = spec_verify(ss[s], smp, h, nh[s], drafts + (size_t)s * SPEC_K_MAX, nd[s], rows,
                                sp->kind == SPEC_MTP ? pxq_hidden(e, rstart[s]) : NULL, n0 + len - nh[s], h + nh[s], err, errlen);
            if (k < 0) goto out;
            nh[s] += k;
        }
    }
    t = now_sec() - t0;
out:
    for (int s = 0; s < b; s++)
        if (ss[s]) {
            const struct spec_stats *x = spec_seq_stats(ss[s]);
            st->passes += x->passes, st->drafted += x->drafted, st->accepted += x->accepted;
            spec_seq_free(ss[s]);
        }
    for (int s = 0; s < b; s++)
        if (seqid[s] >= 0) pxq_seq_free(e, seqid[s]);
    sampler_free(smp);
    free(ss), free(hist), free(nh), free(drafts), free(nd), free(row0), free(rstart), free(seqid), free(tok), free(lg);
    return t;
}

static struct pxq_kv_tier_stats last_tier; /* the host tier as the last run_once left it, before its sequences go */

/* One repetition; returns seconds of the timed part, or -1. */
static double run_once(struct pxq_engine *e, struct batchbuf *bb, const char *kind, int b, int len, int depth, char *err, size_t errlen) {
    int seqs[1024];
    double t = -1;
    int made = 0;
    for (; made < b; made++)
        if ((seqs[made] = pxq_seq_new(e)) < 0) {
            set_err(err, errlen, "no free sequence (n_seq_max too small)");
            goto out;
        }
    if (depth > 0 && feed(e, bb, seqs, b, depth, depth, err, errlen) != 0) goto out;
    struct pxq_kv_tier_stats before; /* the selection cache's counts of the timed part alone */
    pxq_kv_tier_stats(e, &before);
    double t0 = now_sec();
    if (!strcmp(kind, "pp")) {
        if (feed(e, bb, seqs, b, len, len, err, errlen) != 0) goto out;
    } else if (!strcmp(kind, "tg")) {
        for (int i = 0; i < len; i++)
            if (feed(e, bb, seqs, b, 1, 0, err, errlen) != 0) goto out;
    }
    else if (!strcmp(kind, "verify")) {
        for (int i = 0; i < VERIFY_PASSES; i++) {
            for (int s = 0; s < b; s++) /* K >= 2: due after the pass's first token, inside the pass */
                if ((len > 1 ? pxq_seq_checkpoint_at(e, seqs[s], pxq_seq_len(e, seqs[s]) + 1) : pxq_seq_checkpoint(e, seqs[s])) != 0) {
                    set_err(err, errlen, "no checkpoint of sequence %d", s);
                    goto out;
                }
            if (feed(e, bb, seqs, b, len, len > 1, err, errlen) != 0) goto out; /* no logits before the checkpoint */
        }
    }
    (void)pxq_logits(e, 0); /* the step is complete when pxq_decode returns (logits are on the host) */
    t = now_sec() - t0;
    pxq_kv_tier_stats(e, &last_tier);
    last_tier.sc_hits -= before.sc_hits, last_tier.sc_fills -= before.sc_fills;
    last_tier.sc_in_place -= before.sc_in_place;
out:
    for (int s = 0; s < made; s++) pxq_seq_free(e, seqs[s]);
    return t;
}

static size_t peak_mem(const struct pxq_engine *e, enum pxq_device dev) {
    if (dev == PXQ_DEVICE_CUDA) return pxq_engine_device_mem_peak ? pxq_engine_device_mem_peak(e) : 0;
    /* VmHWM (peak RSS), reset after the roofline's buffers were freed (reset_peak_rss) */
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %zu kB", &kib) == 1) break;
    if (f) fclose(f);
    if (kib) return kib * 1024;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss * 1024; /* Linux: KiB */
}

/* Linux: writing 5 to clear_refs resets the peak RSS (proc(5)), so the figure is the model's and the
 * engine's, not the roofline probe's. */
static void reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) fputs("5", f), fclose(f);
}

/* "q4_0" or, for a mix, the types by bytes: "q5_0+q6_K+q4_K" (f32 left out; "+..." where more than 3). */
static void quant_name(char *out, size_t cap, const struct memplan *mp) {
    int used[PXQ_TYPE_COUNT] = {0};
    out[0] = 0;
    for (int k = 0; k < 4; k++) {
        int best = -1;
        for (int t = 0; t < PXQ_TYPE_COUNT; t++)
            if (!used[t] && mp->weight_bytes_by_type[t] && t != PXQ_TYPE_F32 &&
                (best < 0 || mp->weight_bytes_by_type[t] > mp->weight_bytes_by_type[best]))
                best = t;
        if (best < 0) break;
        used[best] = 1;
        size_t n = strlen(out);
        snprintf(out + n, cap - n, "%s%s", n ? "+" : "", k < 3 ? type_name((enum pxq_type)best) : "...");
    }
    if (!out[0]) snprintf(out, cap, "f32");
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

int cmd_bench(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--preset")) return bench_preset(argc, argv); /* rows of their own processes */
    struct args a = {argc, argv, 0, "bench", cmd_bench};
    struct opts o;
    memset(&o, 0, sizeof o);
    load_opts_init(&o.lo);
    o.ep = pxq_engine_default_params();
    o.p[0] = 512, o.np = 1, o.n[0] = 128, o.nn = 1, o.b[0] = 1, o.nb = 1, o.d[0] = 0, o.nd = 1;
    o.reps = 5, o.warmup = 1, o.accept = -1;
    spec_opts_init(&o.so);
    for (a.i = 1; a.i < argc; a.i++) {
        const char *f = argv[a.i];
        if (load_opts_parse(&a, &o.lo)) continue;
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) o.model = arg_str(&a);
        else if (!strcmp(f, "-p") || !strcmp(f, "--n-prompt")) o.np = parse_list(&a, o.p, 0, 1 << 20);
        else if (!strcmp(f, "-n") || !strcmp(f, "--n-gen")) o.nn = parse_list(&a, o.n, 0, 1 << 20);
        else if (!strcmp(f, "-b") || !strcmp(f, "--batch")) o.nb = parse_list(&a, o.b, 1, 1024);
        else if (!strcmp(f, "-d") || !strcmp(f, "--depth")) o.nd = parse_list(&a, o.d, 0, 1 << 22);
        else if (!strcmp(f, "-r") || !strcmp(f, "--repetitions")) o.reps = (int)arg_int(&a, 1, 64);
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) o.ep.n_threads = (int)arg_int(&a, 1, 1024);
        else if (!strcmp(f, "-ub") || !strcmp(f, "--ubatch-size")) o.ep.n_batch = (int)arg_int(&a, 1, 1 << 16);
        else if (device_parse(&a, &o.ep)) continue;
        else if (spec_opts_parse(&a, &o.so)) continue;
        else if (!strcmp(f, "--spec-verify")) o.nv = parse_list(&a, o.v, 1, SPEC_K_MAX + 1);
        else if (!strcmp(f, "--spec-acceptance")) o.accept = arg_num(&a, 0, 0.999);
        else if (!strcmp(f, "--no-warmup")) o.warmup = 0;
        else if (!strcmp(f, "--json")) o.json = 1;
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            printf("%s", usage);
            load_opts_help(23);
            return 0;
        } else
            fail_unknown(&a);
    }
    load_opts_check(&a, &o.lo, o.model);
    int any = 0;
    for (int i = 0; i < o.np; i++) any |= o.p[i] > 0;
    for (int i = 0; i < o.nn; i++) any |= o.n[i] > 0;
    if (!any && !o.nv) fail(&a, 2, "nothing to measure: -p and -n are all 0");
    if (o.accept >= 0 && !o.nv) fail(&a, 2, "--spec-acceptance projects the --spec-verify passes: give --spec-verify 1,2,...");
    common_warn_unused(&a, &o.ep);
    if (o.ep.n_threads <= 0) o.ep.n_threads = n_cpus();
    const enum pxq_device dev = o.ep.device;
    char err[512] = "";

    /* a model path that does not exist fails here, before the device probe */
    if (o.model && access(o.model, F_OK) != 0) fail(&a, 1, "%s: %s", o.model, strerror(errno));
    /* roofline first, before the model takes the memory */
    struct roofline rl;
    if (dev == PXQ_DEVICE_CUDA) {
        if (roofline_measure_cuda(&rl, err, sizeof err) != 0) fail(&a, 1, "%s; use --device cpu", err);
    } else {
        roofline_measure_cpu(&rl, o.ep.n_threads);
    }

    if (dev == PXQ_DEVICE_CPU) reset_peak_rss();
    double t_load = now_sec();
    struct pxq_model *m = load_opts_open(&a, &o.lo, o.model, o.ep.n_threads);
    struct pxq_model *dm = NULL;
    struct pxq_engine *de = NULL;
    t_load = now_sec() - t_load;
    const struct pxq_hparams *hp = model_hparams(m);
    int max_b = 0, max_len = 0, kv_blocks = 0, max_ctx = 0;
    const int bs = o.ep.kv_block_size > 0 ? o.ep.kv_block_size : KV_BLOCK_SIZE_DEFAULT;
    for (int i = 0; i < o.np; i++) max_len = o.p[i] > max_len ? o.p[i] : max_len;
    for (int i = 0; i < o.nn; i++) max_len = o.n[i] > max_len ? o.n[i] : max_len;
    for (int i = 0; i < o.nv; i++) max_len = o.v[i] * VERIFY_PASSES > max_len ? o.v[i] * VERIFY_PASSES : max_len;
    for (int i = 0; i < o.nb; i++) {
        max_b = o.b[i] > max_b ? o.b[i] : max_b;
        for (int j = 0; j < o.nd; j++) {
            int ctx = (o.d[j] > 0 ? o.d[j] : 1) + max_len + 1 + (o.so.kind ? SPEC_K_MAX + 1 : 0); /* spec: drafts past N */
            int need = o.b[i] * (int)kv_blocks_per_seq(ctx, bs, o.ep.attn_window, o.ep.attn_sinks, o.ep.kv_topk_blocks,
                                                       o.ep.n_batch); /* a window's worth where blocks past it go back */
            kv_blocks = need > kv_blocks ? need : kv_blocks;
            max_ctx = ctx > max_ctx ? ctx : max_ctx;
        }
    }
    struct pxq_engine_params ep = o.ep;
    ep.n_seq_max = max_b;
    ep.n_ctx = max_ctx;
    ep.kv_blocks = kv_blocks; /* the pool of the largest (batch, depth) combination */
    ep.spec_checkpoint = o.nv > 0; /* the verify passes checkpoint: their slots in the arena */
    spec_opts_setup(&a, &o.so, m, &ep, &o.sp, &dm, &de); /* --spec: the flags checked, the draft model opened */
    struct pxq_engine *e = pxq_engine_new(m, &ep, err, sizeof err);
    if (!e) fail(&a, 1, "%s", err);

    struct memplan mp;
    memset(&mp, 0, sizeof mp);
    memplan_weights_from_model(&mp, m);
    char quant[64];
    quant_name(quant, sizeof quant, &mp);
    struct model_account ma;
    account(&ma, m, &o.ep);
    char model_name[256];
    const char *path = model_path(m), *slash = strrchr(path, '/');
    snprintf(model_name, sizeof model_name, "%s", slash && !o.lo.dummy ? slash + 1 : path);
    char backend[256];
    const char *dev_name = dev == PXQ_DEVICE_CUDA && pxq_engine_device_name ? pxq_engine_device_name(e) : rl.device;

    if (!o.json) {
        time_t now = time(NULL);
        char date[64];
        strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
        printf("pxq bench, %s, device: %s\n", date, dev_name);
        printf("roofline: copy %.1f GB/s (%s); GEMM %.3f TFLOP/s (%s)\n", rl.copy_gbs, rl.copy_method, rl.gemm_tflops, rl.gemm_method);
        printf("model: %s, %s, %.3f B params, %.3f GiB weights (%s), loaded in %.1f s\n", model_name, hp->arch_name,
               mp.n_params / 1e9, mp.weight_bytes / 1073741824.0, o.lo.dummy ? "dummy" : "file", t_load);
        printf("decode GB/s = (weights read + KV read + state read/written) per step / step time; "
               "prefill TFLOP/s = (2 x matmul params x tokens + lm_head + attention) / time; "
               "t/s counts the tokens of all b sequences\n\n");
        printf("| model | quant | resident | backend | kv cache | b | test | depth | t/s | GB/s or TFLOP/s | %% roofline | peak mem |\n");
        printf("| ----- | ----- | -------- | ------- | -------- | -: | ---- | ----: | --: | --------------: | ---------: | -------: |\n");
    } else {
        printf("[\n");
    }
    fflush(stdout);

    struct batchbuf bb = {0};
    int n_rows = 0, rc = 0, n_pass = 0;
    struct { int b, k, d; double ms; } pass[MAX_LIST * MAX_LIST]; /* the verify rows, for the table below */
    for (int ib = 0; ib < o.nb; ib++)
        for (int id = 0; id < o.nd; id++)
            for (int kind = 0; kind < 3; kind++) { /* pp, tg, verify */
                static const char *kinds[] = {"pp", "tg", "verify"};
                int *lens = kind == 0 ? o.p : kind == 1 ? o.n : o.v, nl = kind == 0 ? o.np : kind == 1 ? o.nn : o.nv;
                for (int il = 0; il < nl; il++) {
                    struct result r = {kinds[kind], o.b[ib], lens[il], o.d[id], {0}, 0, 0, 0, 0, 0, 0};
                    const int steps = kind == 2 ? VERIFY_PASSES : 1; /* verify: the passes per repetition */
                    if (r.len == 0) continue;
                    const int spec_row = kind == 1 && o.sp.kind != SPEC_NONE; /* tg with --spec */
                    struct spec_stats sst = {0, 0, 0}, warm_st = {0, 0, 0};
                    if (o.warmup && (spec_row ? spec_tg(e, &o.sp, r.b, r.len, r.depth, &warm_st, err, sizeof err)
                                              : run_once(e, &bb, r.kind, r.b, r.len, r.depth, err, sizeof err)) < 0) {
                        fprintf(stderr, "pxq bench: %s%d b=%d d=%d: %s\n", r.kind, r.len, r.b, r.depth, err);
                        rc = 1;
                        continue;
                    }
                    int ok = 1;
                    for (int rep = 0; rep < o.reps && ok; rep++) {
                        double t = spec_row ? spec_tg(e, &o.sp, r.b, r.len, r.depth, &sst, err, sizeof err)
                                            : run_once(e, &bb, r.kind, r.b, r.len, r.depth, err, sizeof err);
                        if (t < 0) ok = 0;
                        else r.ts[r.n_ts++] = (double)r.b * r.len * steps / (t > 0 ? t : 1e-9);
                    }
                    if (!ok) {
                        fprintf(stderr, "pxq bench: %s%d b=%d d=%d: %s\n", r.kind, r.len, r.b, r.depth, err);
                        rc = 1;
                        continue;
                    }
                    for (int i = 0; i < r.n_ts; i++) r.mean += r.ts[i] / r.n_ts;
                    for (int i = 0; i < r.n_ts; i++) r.sd += (r.ts[i] - r.mean) * (r.ts[i] - r.mean);
                    r.sd = r.n_ts > 1 ? sqrt(r.sd / (r.n_ts - 1)) : 0;
                    if (kind == 1) { /* decode: bytes per step x steps per second */
                        double bytes = step_weight_bytes(&ma, hp, r.b) + r.b * kv_read_mean(&ma, r.depth, r.len) +
                                       2.0 * r.b * ma.state_per_seq;
                        r.value = bytes * (r.mean / r.b) / 1e9;
                        r.pct = 100.0 * r.value / rl.copy_gbs;
                    } else if (kind == 2) { /* a pass: a decode step of K tokens per sequence, plus the checkpoint's copy */
                        double bytes = step_weight_bytes(&ma, hp, r.b) +
                                       r.b * r.len * kv_read_bytes(&ma, r.depth + r.len * (VERIFY_PASSES + 1) / 2.0) +
                                       4.0 * r.b * ma.state_per_seq;
                        r.value = bytes * (r.mean / (r.b * r.len)) / 1e9;
                        r.pct = 100.0 * r.value / rl.copy_gbs;
                        if (n_pass < MAX_LIST * MAX_LIST) pass[n_pass].b = r.b, pass[n_pass].k = r.len, pass[n_pass].d = r.depth,
                                                          pass[n_pass++].ms = 1e3 * r.b * r.len / r.mean;
                    } else { /* prefill FLOPs per second */
                        double tokens = (double)r.b * r.len;
                        double active = ma.dense_params + (hp->n_expert ? ma.expert_params * hp->n_expert_used / hp->n_expert : 0);
                        double ctx_sum = (double)r.len * (2.0 * r.depth + r.len + 1) / 2.0; /* sum of (pos+1) */
                        double flops = 2.0 * active * tokens + 2.0 * ma.head_params * r.b +
                                       4.0 * hp->n_head * hp->head_dim * ctx_sum * ma.n_attn * r.b;
                        r.value = flops * (r.mean / tokens) / 1e12;
                        r.pct = 100.0 * r.value / rl.gemm_tflops;
                    }
                    r.peak = peak_mem(e, dev);
                    if (dev == PXQ_DEVICE_CUDA) /* the path the last pxq_decode took */
                        snprintf(backend, sizeof backend, "%s", pxq_engine_kernel_path ? pxq_engine_kernel_path(e) : "cuda");
                    else
                        snprintf(backend, sizeof backend, "cpu: matmul_cpu (%s), %d threads",
                                 (getenv("PXQ_CPU_EXACT") && atoi(getenv("PXQ_CPU_EXACT"))) || !strchr(quant, 'q')
                                     ? "f32 dots"
                                     : "int8 activations x quantized weights, f32 dots for float weights",
                                 pxq_engine_params(e)->n_threads);
                    char test[128], kvdesc[512]; /* the KV cache type and the attention mode of the row */
                    snprintf(test, sizeof test, "%s%d", r.kind, r.len);
                    if (spec_row) /* the acceptance of the timed repetitions */
                        snprintf(test, sizeof test, "%s%d spec %s k%d: acceptance %.3f, %.2f tokens/pass", r.kind, r.len,
                                 spec_kind_name(o.sp.kind), o.sp.k, sst.drafted ? (double)sst.accepted / sst.drafted : 0.0,
                                 sst.passes ? (double)(sst.accepted + sst.passes) / sst.passes : 0.0);
                    const struct pxq_engine_params *pp = pxq_engine_params(e);
                    int kl = snprintf(kvdesc, sizeof kvdesc, "%s", kv_cache_type_name((enum kv_cache_type)pp->kv_type));
                    if (pp->attn_window)
                        kl += snprintf(kvdesc + kl, sizeof kvdesc - (size_t)kl, ", window %d + %d sinks", pp->attn_window, pp->attn_sinks);
                    if (pp->kv_topk_blocks)
                        kl += snprintf(kvdesc + kl, sizeof kvdesc - (size_t)kl, " + top %d blocks of %d", pp->kv_topk_blocks,
                                       pxq_kv_block_size(e));
                    const struct pxq_kv_tier_stats ts = last_tier; /* after the row's last step: its sequences at their deepest */
                    if (ts.n_host && !spec_row)
                        kl += snprintf(kvdesc + kl, sizeof kvdesc - (size_t)kl, ", host tier: %d blocks in use (device %d), <= %.1f MiB "
                                       "read from host a step, %.2f GiB staged by prefill", ts.host_used, ts.n_dev,
                                       ts.host_read_step / 1048576.0, (double)ts.staged / 1073741824.0);
                    const uint64_t sc_all = ts.sc_hits + ts.sc_fills + ts.sc_in_place;
                    if (ts.n_host && !spec_row && sc_all && kl < (int)sizeof kvdesc)
                        snprintf(kvdesc + kl, sizeof kvdesc - (size_t)kl, ", selection cache: %.1f%% of chosen host slices "
                                 "hit (%llu hits, %llu copied, %llu in place)", 100.0 * (double)ts.sc_hits / (double)sc_all,
                                 (unsigned long long)ts.sc_hits, (unsigned long long)ts.sc_fills,
                                 (unsigned long long)ts.sc_in_place);
                    if (o.json) {
                        printf("%s  {\"model\": ", n_rows ? ",\n" : "");
                        json_str(stdout, model_name);
                        printf(", \"arch\": \"%s\", \"quant\": \"%s\", \"dummy\": %s, \"weights_resident\": \"yes\", \"backend\": \"%s\", \"kernel_path\": ",
                               hp->arch_name, quant, o.lo.dummy ? "true" : "false", dev == PXQ_DEVICE_CUDA ? "cuda" : "cpu");
                        json_str(stdout, backend);
                        printf(", \"device\": ");
                        json_str(stdout, dev_name);
                        printf(", \"kv_cache\": ");
                        json_str(stdout, kvdesc);
                        printf(", \"n_threads\": %d, \"batch\": %d, \"test\": \"%s\", \"n_prompt\": %d, \"n_gen\": %d, \"depth\": %d, \"reps\": %d",
                               pxq_engine_params(e)->n_threads, r.b, test, kind == 0 ? r.len : 0, kind == 1 ? r.len : 0, r.depth, r.n_ts);
                        printf(", \"samples_ts\": [");
                        for (int i = 0; i < r.n_ts; i++) printf("%s%.4f", i ? ", " : "", r.ts[i]);
                        printf("], \"avg_ts\": %.4f, \"stddev_ts\": %.4f, \"metric\": \"%s\", \"value\": %.6f", r.mean, r.sd,
                               kind ? "GB/s" : "TFLOP/s", r.value);
                        printf(", \"roofline\": %.6f, \"roofline_metric\": \"%s\", \"roofline_pct\": %.3f, \"roofline_method\": ",
                               kind ? rl.copy_gbs : rl.gemm_tflops, kind ? "copy GB/s" : "GEMM TFLOP/s", r.pct);
                        json_str(stdout, kind ? rl.copy_method : rl.gemm_method);
                        printf(", \"weight_bytes\": %zu, \"peak_mem_bytes\": %zu, \"peak_mem_kind\": \"%s\"", mp.weight_bytes, r.peak,
                               dev == PXQ_DEVICE_CUDA ? "device arena" : "host RSS");
                        printf(", \"kv_host_blocks\": %d, \"kv_host_read_step_bytes\": %.0f", ts.host_used, ts.host_read_step);
                        if (spec_row)
                            printf(", \"spec\": {\"drafter\": \"%s\", \"k\": %d, \"passes\": %ld, \"drafted\": %ld, \"accepted\": %ld}",
                                   spec_kind_name(o.sp.kind), o.sp.k, sst.passes, sst.drafted, sst.accepted);
                        printf("}");
                    } else {
                        char peak[32];
                        if (r.peak) snprintf(peak, sizeof peak, "%.2f GiB%s", r.peak / 1073741824.0, dev == PXQ_DEVICE_CUDA ? "" : " RSS");
                        else snprintf(peak, sizeof peak, "n/a");
                        printf("| %s | %s | yes | %s | %s | %d | %s | %d | %.2f ± %.2f | %.3f %s | %.1f%% | %s |\n", model_name, quant,
                               backend, kvdesc, r.b, test, r.depth, r.mean, r.sd, r.value, kind ? "GB/s" : "TFLOP/s", r.pct, peak);
                    }
                    fflush(stdout);
                    n_rows++;
                }
            }
    if (o.json) printf("\n]\n");
    if (n_pass && !o.json) { /* each pass against the one-token pass of the same batch and depth */
        printf("\nverification pass of K tokens per sequence (%d passes, a checkpoint due after the first token of each):\n\n", VERIFY_PASSES);
        printf("| b | depth | K | pass ms | x verify1 |%s\n", o.accept >= 0 ? " tokens/pass at A | projected t/s |" : "");
        printf("| -: | ----: | -: | ------: | --------: |%s\n", o.accept >= 0 ? " ---------------: | ------------: |" : "");
        for (int i = 0; i < n_pass; i++) {
            double base = 0;
            for (int j = 0; j < n_pass; j++)
                if (pass[j].k == 1 && pass[j].b == pass[i].b && pass[j].d == pass[i].d) base = pass[j].ms;
            char ratio[32] = "n/a";
            if (base > 0) snprintf(ratio, sizeof ratio, "%.3f", pass[i].ms / base);
            printf("| %d | %d | %d | %.3f | %s |", pass[i].b, pass[i].d, pass[i].k, pass[i].ms, ratio);
            if (o.accept >= 0) {
                const double tpp = (1.0 - pow(o.accept, pass[i].k)) / (1.0 - o.accept);
                printf(" %.3f | %.2f |", tpp, pass[i].b * tpp / (pass[i].ms / 1e3));
            }
            printf("\n");
        }
    }
    free(bb.tok), free(bb.pos), free(bb.seq), free(bb.lg);
    pxq_engine_free(e);
    pxq_engine_free(de);
    if (dm) model_free(dm);
    model_free(m);
    return rc;
}
