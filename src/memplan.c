/* memplan.c - see memplan.h for the terms and their sources. */
#include "memplan.h"

#include <stdlib.h>

#include "cuda/backend.h"
#include "model_dummy.h"
#include "quant.h"
#include "util.h"

struct memplan_params memplan_default_params(void) {
    struct memplan_params p = {0};
    p.n_ctx = 0; /* the model's: pxq_default_n_ctx, once the hyperparameters are known */
    p.n_seq = 1;
    p.n_batch = 512;
    p.kv_block_size = KV_BLOCK_SIZE_DEFAULT;
    p.kv_type = KV_CACHE_F16;
    p.kv_sink = KV_SINK_DEFAULT;
    p.kv_window = KV_WINDOW_DEFAULT;
    p.workspace = MEMPLAN_WORKSPACE_DEFAULT;
    p.cuda_context = MEMPLAN_CONTEXT_DEFAULT;
    return p;
}

/* Arena bytes of one weight in the CUDA backend's device format (cuda/backend.h: quants and scales,
 * each rounded to CUDA_ALIGN); vectors (ne0 == n_elements) are uploaded as float32. */
static size_t device_bytes(enum pxq_type t, int64_t ne0, int64_t n_elements) {
    const size_t al = CUDA_ALIGN;
    const int fmt = cuda_wfmt_of(t);
    if (ne0 <= 0 || ne0 >= n_elements || fmt < 0) return ((size_t)n_elements * 4 + al - 1) / al * al;
    size_t q, sc;
    cuda_weight_sizes(fmt, ne0, n_elements / ne0, &q, &sc);
    return (q + al - 1) / al * al + (sc + al - 1) / al * al;
}

void memplan_weights_add(struct memplan *mp, enum pxq_type t, int64_t ne0, int64_t n_elements, int is_token_embd) {
    int64_t be = type_block_elems(t);
    size_t bytes = be > 0 ? (size_t)((n_elements + be - 1) / be) * type_block_bytes(t) : 0;
    mp->weight_bytes += bytes;
    const size_t dev = device_bytes(t, ne0, n_elements);
    mp->device_weight_bytes += dev;
    if ((unsigned)t < PXQ_TYPE_COUNT) {
        mp->weight_bytes_by_type[t] += bytes;
        mp->params_by_type[t] += n_elements;
    }
    mp->n_params += n_elements;
    if (is_token_embd) {
        mp->n_params_token_embd += n_elements;
        mp->token_embd_bytes += bytes;
        mp->token_embd_device_bytes += dev;
    }
}

static int is_embd_name(const char *n) {
    return strcmp(n, "token_embd.weight") == 0 || strcmp(n, "model.embed_tokens.weight") == 0;
}

void memplan_weights_from_model(struct memplan *mp, const struct pxq_model *m) {
    for (int i = 0; i < model_n_tensors(m); i++) {
        const struct pxq_tensor *t = model_tensor(m, i);
        memplan_weights_add(mp, t->type, t->ne[0], tensor_nelements(t), is_embd_name(t->name));
    }
}

int memplan_weights_from_hparams(struct memplan *mp, const struct pxq_hparams *hp, enum pxq_type dtype, char *err,
                                 size_t errlen) {
    struct dummy_tensor *d;
    int n = dummy_manifest(hp, dtype, &d, err, errlen);
    if (n < 0) return -1;
    for (int i = 0; i < n; i++)
        memplan_weights_add(mp, d[i].type, d[i].ne[0], d[i].ne[0] * d[i].ne[1] * d[i].ne[2], is_embd_name(d[i].name));
    free(d);
    return 0;
}

int memplan_kv_layout(struct kv_layout *lay, const struct pxq_hparams *hp, const struct memplan_params *p, char *err,
                      size_t errlen) {
    struct kv_spec spec = {0};
    spec.type = (enum kv_cache_type)p->kv_type;
    spec.exact_f32 = p->kv_f32;
    spec.n_ctx = p->n_ctx;
    spec.n_sink = p->kv_sink;
    spec.n_window = p->kv_window;
    spec.n_batch = p->n_batch;
    spec.attn_window = p->attn_window;
    spec.attn_sinks = p->attn_sinks;
    spec.topk_blocks = p->topk_blocks;
    return kv_layout_init(lay, hparams_n_attn_layers(hp), hp->n_head_kv, hp->head_dim, p->kv_block_size, &spec, err, errlen);
}

size_t memplan_state_bytes_per_seq(const struct pxq_hparams *hp) {
    if (hp->arch != ARCH_QWEN35) return 0;
    size_t conv_dim = 2 * (size_t)hp->ssm_n_k_head * hp->ssm_head_k_dim + (size_t)hp->ssm_n_v_head * hp->ssm_head_v_dim;
    size_t conv = (size_t)(hp->ssm_conv_kernel > 0 ? hp->ssm_conv_kernel - 1 : 0) * conv_dim;
    size_t rec = (size_t)hp->ssm_n_v_head * hp->ssm_head_k_dim * hp->ssm_head_v_dim;
    return (size_t)(hp->n_layer - hparams_n_attn_layers(hp)) * (conv + rec) * sizeof(float);
}

/* Float32 activations per token, as the engine's buffers (engine.c): x [n_embd]; xb, xb2
 * [max(n_embd, q_total)]; q, att [q_total] (q_total = n_head*head_dim, x2 with the qwen35 output
 * gate); k, v [n_head_kv*head_dim]; hb, hb2 [max(n_ff, n_ff_exp)]; router [n_expert + 1]; and for
 * DeltaNet layers qkv before and after the conv [2 x conv_dim], z and core output [2 x value_dim],
 * beta and alpha [2 x n_v_head]. All are counted as live at once. */
static size_t act_floats(const struct pxq_hparams *hp) {
    size_t q_total = (size_t)hp->n_head * hp->head_dim * (hp->attn_output_gate ? 2 : 1);
    size_t kv_dim = (size_t)hp->n_head_kv * hp->head_dim;
    size_t wide = (size_t)hp->n_embd > q_total ? (size_t)hp->n_embd : q_total;
    size_t ff = (size_t)(hp->n_ff > hp->n_ff_exp ? hp->n_ff : hp->n_ff_exp);
    size_t n = (size_t)hp->n_embd + 2 * wide + 2 * q_total + 2 * kv_dim + 2 * ff + (size_t)hp->n_expert + 1;
    if (hp->arch == ARCH_QWEN35 && hp->n_layer > hparams_n_attn_layers(hp)) {
        size_t val_dim = (size_t)hp->ssm_n_v_head * hp->ssm_head_v_dim;
        size_t conv_dim = 2 * (size_t)hp->ssm_n_k_head * hp->ssm_head_k_dim + val_dim;
        n += 2 * conv_dim + 2 * val_dim + 2 * (size_t)hp->ssm_n_v_head;
    }
    return n;
}

size_t memplan_arena_weight_bytes(const struct memplan *mp, const struct pxq_hparams *hp) {
    const size_t inv_freq = ((size_t)(hp->n_rot / 2 + 1) * 4 + CUDA_ALIGN - 1) / CUDA_ALIGN * CUDA_ALIGN;
    return (hp->tie_embd ? mp->device_weight_bytes : mp->device_weight_bytes - mp->token_embd_device_bytes) + inv_freq;
}

/* The device-tier blocks the selection cache takes (kv_selcache.cu: with block selection only) */
static int memplan_sel_cache(const struct memplan_params *p) {
    return p->kv_offload && p->topk_blocks && p->attn_window ? p->kv_select_cache : 0;
}

/* The KV blocks a sequence of n_ctx positions holds (kv_blocks_per_seq: fewer with window attention,
 * whose blocks past the window are given back). */
static int64_t memplan_seq_blocks(const struct memplan_params *p, int n_ctx) {
    return kv_blocks_per_seq(n_ctx, p->kv_block_size, p->attn_window, p->attn_sinks, p->topk_blocks, p->n_batch);
}

/* The arena at context n_ctx per sequence: weights + KV + the CUDA backend's own buffers
 * (cuda_bufs_of: activations, logits rows, workspace, recurrent state), each rounded as the backend
 * allocates it; the --workspace bytes stand for the cuBLAS workspace. Fills mp's terms. */
static size_t arena_at(struct memplan *mp, const struct pxq_hparams *hp, const struct memplan_params *p, int n_ctx,
                       int allow_small) {
    struct pxq_engine_params ep = pxq_engine_default_params();
    ep.n_ctx = n_ctx;
    ep.n_seq_max = p->n_seq;
    ep.n_batch = p->n_batch;
    ep.kv_block_size = p->kv_block_size;
    ep.spec_checkpoint = p->spec;
    ep.attn_window = p->attn_window, ep.attn_sinks = p->attn_sinks, ep.kv_topk_blocks = p->topk_blocks;
    ep.kv_type = p->kv_type, ep.kv_sink = p->kv_sink, ep.kv_window = p->kv_window; /* the exact chunks' partials */
    ep.kv_offload = p->kv_offload; /* the host tier's staging buffers (attention_staged.cu) */
    ep.kv_select_cache = p->kv_select_cache; /* and the selection cache's arrays, by the pool's blocks */
    size_t max_in, max_mat, state;
    cuda_widths_of(hp, &max_in, &max_mat);
    const int64_t blocks = memplan_seq_blocks(p, n_ctx) * p->n_seq + memplan_sel_cache(p); /* as the engine's pool */
    ep.kv_blocks = (int)blocks;
    const size_t pool = mp->kv_bytes_per_block * (size_t)blocks, fixed = mp->kv_residual_per_seq * (size_t)p->n_seq;
    size_t total = 0, kv = pool;
    for (int small = 0; small < 1 + allow_small; small++) { /* the backend's choice (cuda_mem_plan): small tiles if over budget or tiered */
        struct cuda_bufs bf;
        mp->w16_elems = small ? CUDA_W16_SMALL_ELEMS : CUDA_W16_MAX_ELEMS;
        cuda_bufs_of(hp, &ep, max_in, max_mat, mp->w16_elems, &bf);
        cuda_bufs_bytes(&bf, &mp->act_bytes, &mp->logits_bytes, &mp->workspace, &state);
        mp->w16_elems = bf.w16, mp->w16_small = small;
        mp->workspace = mp->workspace - CUDA_CUBLAS_WS + p->workspace;
        mp->state_bytes = state;
        const size_t other = memplan_arena_weight_bytes(mp, hp) + fixed + mp->state_bytes + mp->act_bytes + mp->logits_bytes +
                             mp->workspace;
        mp->kv_blocks = mp->kv_dev_blocks = blocks, mp->kv_host_bytes = 0;
        kv = pool;
        if (p->kv_offload && (p->budget || p->kv_dev_blocks)) { /* the device tier: what the budget leaves (cuda_plan.c) */
            /* block selection's key bounds stay on the device for every block */
            const size_t bounds = (mp->kv_bytes_per_block - mp->kv_tier_per_block) * (size_t)blocks;
            const int64_t n_dev = cuda_tier_dev_blocks(p->kv_dev_blocks, p->budget, other + bounds, mp->kv_tier_per_block);
            if (n_dev < blocks) {
                mp->kv_dev_blocks = n_dev;
                mp->kv_host_bytes = mp->kv_tier_per_block * (size_t)(blocks - n_dev);
                kv = mp->kv_tier_per_block * (size_t)n_dev + CUDA_TIER_SLACK + bounds;
            }
        }
        total = other + kv;
        /* A host tier sized by the budget takes the small tiles (as cuda_mem_plan): their 640 MiB hold
         * device blocks, which decode reads at device speed instead of over the bus (the 27B at 65,536
         * positions in 15.2 GiB with selection: 102 device blocks with the whole-matrix tiles, 567 with
         * the small ones), and which prefill need not stage; the whole-matrix tiles gain about 6% of
         * prefill's GEMM rate (docs/PERF.md). Whole-matrix tiles only (allow_small 0) fit no such tier. */
        if (!small && mp->kv_dev_blocks < blocks && !p->kv_dev_blocks) {
            if (allow_small) continue;
            total = SIZE_MAX;
            break;
        }
        /* decided as the backend does, with its own cuBLAS workspace (--workspace only changes the account) */
        if (!p->budget || total - p->workspace + CUDA_CUBLAS_WS <= p->budget) break;
    }
    mp->kv_bytes = kv + fixed;
    return total;
}

/* The host tier's own limits at a context (arena_at filled mp): a device tier of at least a step's
 * blocks per sequence beside the selection cache's, and a host tier within --swap-space. 1 if they
 * hold (or there is no tier). */
static int tier_ok(const struct memplan *mp, const struct memplan_params *p) {
    if (mp->kv_dev_blocks == mp->kv_blocks) return 1;
    const int64_t step = kv_step_blocks(p->n_seq, p->kv_block_size, p->n_batch) + memplan_sel_cache(p);
    return mp->kv_dev_blocks >= step && (!p->swap_space || mp->kv_host_bytes <= p->swap_space);
}

/* arena_at, with a context the host tier cannot hold counted as over any budget */
static size_t arena_fit(struct memplan *mp, const struct pxq_hparams *hp, const struct memplan_params *p, int n_ctx, int small) {
    const size_t a = arena_at(mp, hp, p, n_ctx, small);
    return tier_ok(mp, p) ? a : SIZE_MAX;
}

int memplan_compute(struct memplan *mp, const struct pxq_hparams *hp, const struct memplan_params *p, char *err,
                    size_t errlen) {
    if (p->n_ctx <= 0 || p->n_seq <= 0 || p->n_batch <= 0 || p->kv_block_size <= 0)
        return set_err(err, errlen, "memory plan: context, sequences, batch and KV block size must be positive");
    if (hp->n_layer > PXQ_MAX_LAYERS) return set_err(err, errlen, "memory plan: %d layers exceed %d", hp->n_layer, PXQ_MAX_LAYERS);
    struct kv_layout lay;
    char lerr[200];
    if (memplan_kv_layout(&lay, hp, p, lerr, sizeof lerr) != 0) return set_err(err, errlen, "memory plan: %s", lerr);
    mp->n_layer_kv = hparams_n_attn_layers(hp);
    mp->n_layer_ssm = hp->arch == ARCH_QWEN35 ? hp->n_layer - mp->n_layer_kv : 0;
    mp->kv_bytes_per_token = kv_layout_bytes_per_pos(&lay);
    mp->kv_bytes_per_block = kv_layout_block_bytes(&lay);
    mp->kv_tier_per_block = kv_layout_tier_block_bytes(&lay);
    mp->kv_residual_per_seq = kv_layout_residual_bytes(&lay);
    mp->kv_sink = lay.n_sink, mp->kv_window = lay.n_window, mp->kv_ring = lay.n_ring;
    kv_layout_free(&lay);
    mp->kv_positions = memplan_seq_blocks(p, p->n_ctx) * p->kv_block_size * p->n_seq;
    /* the same account in double first: -c 2^30 x 2^15 sequences of a 32B model is 2^64 bytes of KV,
     * which in size_t wraps to 0 and would "fit" */
    double approx = (double)mp->weight_bytes + (double)mp->kv_bytes_per_token * (double)mp->kv_positions +
                    (double)memplan_state_bytes_per_seq(hp) * p->n_seq + (double)act_floats(hp) * p->n_batch * sizeof(float) +
                    (double)p->n_seq * hp->n_vocab * sizeof(float) + (double)p->workspace + (double)p->cuda_context;
    if (approx > 0x1p62)
        return set_err(err, errlen, "memory plan: %.3g bytes (KV cache %.3g) is beyond any device: lower -c or --max-num-seqs",
                       approx, (double)mp->kv_bytes_per_token * (double)mp->kv_positions);
    mp->state_bytes_per_seq = memplan_state_bytes_per_seq(hp);
    mp->cuda_context = p->cuda_context;
    mp->total = arena_at(mp, hp, p, p->n_ctx, 1); /* and kv_bytes, the host tier */
    mp->act_floats_per_token = mp->act_bytes / ((size_t)p->n_batch * sizeof(float));
    mp->device_total = mp->total + mp->cuda_context;
    mp->budget = p->budget;
    mp->fits = (p->budget == 0 || mp->total <= p->budget) && tier_ok(mp, p);
    if (p->budget == 0) {
        mp->max_ctx = 0;
    } else { /* the arena grows with the context (KV, block tables, attention partials): bisect */
        struct memplan probe = *mp;
        mp->max_ctx_whole = -1;
        if (arena_fit(&probe, hp, p, 1, 1) > p->budget) mp->max_ctx = -1;
        else if (mp->kv_bytes_per_token == 0) mp->max_ctx = INT64_MAX;
        else {
            for (int small = 1; small >= 0; small--) { /* any tiles, then the whole-matrix ones only */
                if (arena_fit(&probe, hp, p, 1, small) > p->budget) continue;
                int64_t lo = 1, hi = (int64_t)1 << 30; /* positions: lo fits */
                while (lo < hi) {
                    const int64_t mid = lo + (hi - lo + 1) / 2;
                    if (arena_fit(&probe, hp, p, (int)mid, small) <= p->budget) lo = mid;
                    else hi = mid - 1;
                }
                if (small) mp->max_ctx = lo;
                else mp->max_ctx_whole = lo;
            }
        }
    }
    return 0;
}

/* "17.16 GiB", "256.00 KiB", "0 B" */
static const char *hsize(char *buf, size_t cap, double b) {
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    if (i == 0) snprintf(buf, cap, "%.0f B", b);
    else snprintf(buf, cap, "%.2f %s", b, u[i]);
    return buf;
}

void memplan_print(FILE *f, const struct memplan *mp, const struct pxq_hparams *hp, const struct memplan_params *p,
                   const char *title) {
    char a[32], b[32], c[32];
    const double GiB = 1073741824.0;
    fprintf(f, "memory plan: %s\n", title);
    fprintf(f, "  model: %s, %d layers (%d attention, %d DeltaNet), n_embd %d, vocab %d, %.3f B params\n", hp->arch_name,
            hp->n_layer, mp->n_layer_kv, mp->n_layer_ssm, hp->n_embd, hp->n_vocab, mp->n_params / 1e9);
    fprintf(f, "  %-18s %12s  %lld bytes in the file; %s in the arena (the CUDA formats, docs/CUDA.md);", "weights",
            hsize(a, sizeof a, (double)mp->weight_bytes), (long long)mp->weight_bytes,
            hsize(c, sizeof c, (double)memplan_arena_weight_bytes(mp, hp)));
    for (int t = 0; t < PXQ_TYPE_COUNT; t++)
        if (mp->params_by_type[t])
            fprintf(f, " %s %.3f B params = %s;", type_name((enum pxq_type)t), mp->params_by_type[t] / 1e9,
                    hsize(b, sizeof b, (double)mp->weight_bytes_by_type[t]));
    if (hp->tie_embd)
        fprintf(f, " token_embd %s of it (also lm_head)\n", hsize(c, sizeof c, (double)mp->token_embd_bytes));
    else
        fprintf(f, " token_embd %s of it, kept in pinned host memory (a row gather), not in the arena\n",
                hsize(c, sizeof c, (double)mp->token_embd_bytes));
    const char *kvt = p->kv_type == KV_CACHE_F16 && p->kv_f32 ? "f32" : kv_cache_type_name((enum kv_cache_type)p->kv_type);
    fprintf(f, "  %-18s %12s  %s%s/token (%d attention layers, K and V of %d kv heads x %d, --kv-cache-type %s%s) x %lld positions (%d ctx in blocks of %d, x %d seq)",
            "KV cache", hsize(a, sizeof a, (double)mp->kv_bytes),
            mp->kv_dev_blocks < mp->kv_blocks ? "on the device: the device tier's blocks, the key bounds and the residual "
                                                "(the rest is the host tier's line); the pool: " : "",
            hsize(b, sizeof b, (double)mp->kv_bytes_per_token), mp->n_layer_kv,
            hp->n_head_kv, hp->head_dim, kvt, p->kv_type == KV_CACHE_PXQ ? ": K q8_0, V 2-bit" : "",
            (long long)mp->kv_positions, p->n_ctx, p->kv_block_size, p->n_seq);
    if (p->attn_window && !p->topk_blocks && mp->kv_positions < kv_blocks_for(p->n_ctx, p->kv_block_size) * p->kv_block_size * p->n_seq)
        fprintf(f, " (--attention-window %d, %d sinks: the blocks past a sequence's window are given back, so it holds its "
                "sinks, the window, a step of %d and a rollback margin of %d)", p->attn_window, p->attn_sinks, p->n_batch,
                kv_window_margin(p->n_batch));
    else if (p->topk_blocks && mp->kv_dev_blocks < mp->kv_blocks)
        fprintf(f, " (block selection: every position kept, and per block the keys' min and max, %s, on the device for "
                "every block: each step scores them all)",
                hsize(c, sizeof c, (double)(mp->kv_bytes_per_block - mp->kv_tier_per_block) * (double)mp->kv_blocks));
    else if (p->topk_blocks)
        fprintf(f, " (block selection: every position kept, and per block the keys' min and max)");
    if (mp->kv_residual_per_seq)
        fprintf(f, " + %s/seq exact residual (%d sink + %d window + %d positions of a step or a rollback, float32)", hsize(c, sizeof c, (double)mp->kv_residual_per_seq),
                mp->kv_sink, mp->kv_window, mp->kv_ring - mp->kv_window);
    fprintf(f, "\n");
    if (p->kv_offload && mp->kv_dev_blocks == mp->kv_blocks)
        fprintf(f, "  %-18s %12s  --kv-offload: every one of the %lld blocks fits the device tier, no host tier\n",
                "KV host tier", "0 B", (long long)mp->kv_blocks);
    char sc_note[160] = ""; /* the selection cache's share of the device tier */
    if (memplan_sel_cache(p))
        snprintf(sc_note, sizeof sc_note, ", %d of them the cache of chosen host blocks (--kv-select-cache)",
                 memplan_sel_cache(p));
    if (mp->kv_dev_blocks < mp->kv_blocks)
        fprintf(f, "  %-18s %12s  --kv-offload: %lld of the %lld blocks (%s each) in pinned host memory, outside the arena "
                "(the device tier holds %lld blocks = %lld positions, %s%s; the KV line above is that tier, "
                "with the mapping's rounding)%s%s\n",
                "KV host tier", hsize(a, sizeof a, (double)mp->kv_host_bytes), (long long)(mp->kv_blocks - mp->kv_dev_blocks),
                (long long)mp->kv_blocks, hsize(b, sizeof b, (double)mp->kv_tier_per_block), (long long)mp->kv_dev_blocks,
                (long long)mp->kv_dev_blocks * p->kv_block_size, p->kv_dev_blocks ? "--kv-device-blocks" : "what the budget leaves",
                sc_note, p->swap_space ? "; --swap-space " : "",
                p->swap_space ? hsize(c, sizeof c, (double)p->swap_space) : "");
    if (mp->n_layer_ssm) {
        size_t conv_dim = 2 * (size_t)hp->ssm_n_k_head * hp->ssm_head_k_dim + (size_t)hp->ssm_n_v_head * hp->ssm_head_v_dim;
        fprintf(f, "  %-18s %12s  %s/seq x %d seq%s = %d DeltaNet layers x ((%d-1) x %zu conv + %d x %d x %d state) x 4 B\n",
                "recurrent state", hsize(a, sizeof a, (double)mp->state_bytes), hsize(b, sizeof b, (double)mp->state_bytes_per_seq),
                p->n_seq, p->spec ? " x 2 (speculation's checkpoint)" : "", mp->n_layer_ssm, hp->ssm_conv_kernel, conv_dim,
                hp->ssm_n_v_head, hp->ssm_head_k_dim, hp->ssm_head_v_dim);
    } else {
        fprintf(f, "  %-18s %12s  (no DeltaNet layers)\n", "recurrent state", "0 B");
    }
    fprintf(f, "  %-18s %12s  %d batch tokens x about %zu floats x 4 B: the CUDA backend's buffers (x, xb, xb2, q|k|v, att, gate|up, hb2, step inputs%s%s)\n",
            "activations", hsize(a, sizeof a, (double)mp->act_bytes), p->n_batch, mp->act_floats_per_token,
            mp->n_layer_ssm ? ", DeltaNet qkv/conv/z/ba/out and decode counts" : "", hp->n_expert ? ", router and expert pairs" : "");
    fprintf(f, "  %-18s %12s  %d rows x %d vocab x 4 B (lm_head runs over at most %d rows at a time)\n", "logits",
            hsize(a, sizeof a, (double)mp->logits_bytes), p->n_batch < CUDA_LOGITS_ROWS ? p->n_batch : CUDA_LOGITS_ROWS,
            hp->n_vocab, CUDA_LOGITS_ROWS);
    char stage[64]; /* the host tier's prefill staging (attention_staged.cu) */
    snprintf(stage, sizeof stage, "the host tier's prefill staging (%zu MiB), ", CUDA_KV_STAGE_BYTES >> 20);
    fprintf(f, "  %-18s %12s  f16 prefill weight tiles (2 x %s%s), int8 activations, attention partials, %scuBLAS workspace\n",
            "workspace", hsize(a, sizeof a, (double)mp->workspace), hsize(b, sizeof b, (double)mp->w16_elems),
            !mp->w16_small                                      ? "" /* halves of 2 B x w16/2 */
            : mp->kv_dev_blocks < mp->kv_blocks && !p->kv_dev_blocks ? ": the small tiles, which leave the room to device-tier blocks"
                                                                     : ": the small tiles, whole-matrix ones exceed the budget",
            p->kv_offload ? stage : "");
    fprintf(f, "  %-18s %12s  %lld bytes (the arena: the terms above, less a host-resident token_embd)\n", "total", hsize(a, sizeof a, (double)mp->total),
            (long long)mp->total);
    fprintf(f, "  %-18s %12s  estimate, not measured (driver context, kernels, library handles), outside the arena\n",
            "CUDA context", hsize(a, sizeof a, (double)mp->cuda_context));
    fprintf(f, "  %-18s %12s  total + CUDA context: what the card must have\n", "device total",
            hsize(a, sizeof a, (double)mp->device_total));
    if (!mp->budget) {
        fprintf(f, "  no budget given (--gpu-mem)\n");
        return;
    }
    fprintf(f, "  %-18s %12s  %lld bytes\n", "budget (--gpu-mem)", hsize(a, sizeof a, (double)mp->budget), (long long)mp->budget);
    const int64_t step = kv_step_blocks(p->n_seq, p->kv_block_size, p->n_batch) + memplan_sel_cache(p);
    if (mp->fits && mp->kv_dev_blocks < mp->kv_blocks)
        fprintf(f, "fits with the host tier: %.2f GiB to spare in the arena, %.2f GiB of KV in host memory (the card must "
                "have the device total, %.2f GiB)\n", (double)(mp->budget - mp->total) / GiB, (double)mp->kv_host_bytes / GiB,
                (double)mp->device_total / GiB);
    else if (mp->fits)
        fprintf(f, "fits: %.2f GiB to spare in the arena (the card must have the device total, %.2f GiB)\n",
                (double)(mp->budget - mp->total) / GiB, (double)mp->device_total / GiB);
    else if (mp->kv_dev_blocks < mp->kv_blocks && mp->kv_dev_blocks < step)
        fprintf(f, "does not fit: the device tier holds %lld blocks, less than a step's %lld%s%s\n", (long long)mp->kv_dev_blocks,
                (long long)step, memplan_sel_cache(p) ? " with --kv-select-cache's" : "", p->topk_blocks ? " (block selection's key bounds, one pair a block, stay on the device: a "
                                                  "larger --block-size shrinks them)" : "");
    else if (mp->kv_dev_blocks < mp->kv_blocks && p->swap_space && mp->kv_host_bytes > p->swap_space)
        fprintf(f, "does not fit: the host tier needs %.2f GiB, more than --swap-space %.2f GiB\n",
                (double)mp->kv_host_bytes / GiB, (double)p->swap_space / GiB);
    else
        fprintf(f, "does not fit: short by %.2f GiB\n", (double)(mp->total - mp->budget) / GiB);
    if (mp->max_ctx == INT64_MAX)
        fprintf(f, "largest context that fits: no limit from memory (no KV cache)\n");
    else if (p->kv_offload && !p->swap_space && mp->max_ctx >= (int64_t)1 << 30)
        fprintf(f, "largest context that fits: no limit from the device with --kv-offload (the host tier grows with it; "
                "--swap-space bounds it)\n");
    else if (mp->max_ctx < 0)
        fprintf(f, "largest context that fits: none (weights, state, activations and workspace alone exceed the budget)\n");
    else {
        /* memory alone bounds it: a context past the trained one is reported, and marked */
        const char *beyond = mp->max_ctx > hp->n_ctx_train ? ", which this exceeds" : "";
        const char *kvt = p->kv_type == KV_CACHE_F16 && p->kv_f32 ? "f32" : kv_cache_type_name((enum kv_cache_type)p->kv_type);
        if (mp->max_ctx_whole < mp->max_ctx)
            fprintf(f, "largest context that fits: %lld tokens per sequence x %d seq with the %s KV cache (model's n_ctx_train %d%s); up to %lld with the whole-matrix prefill tiles, beyond that the small ones\n",
                    (long long)mp->max_ctx, p->n_seq, kvt, hp->n_ctx_train, beyond, (long long)mp->max_ctx_whole);
        else
            fprintf(f, "largest context that fits: %lld tokens per sequence x %d seq with the %s KV cache (model's n_ctx_train %d%s)\n",
                    (long long)mp->max_ctx, p->n_seq, kvt, hp->n_ctx_train, beyond);
    }
}
