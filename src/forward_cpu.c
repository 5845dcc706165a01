/* forward_cpu.c - the reference forward pass of the Qwen family / Llama over one ubatch.
 *
 * Per layer (HF modeling_qwen3.py Qwen3DecoderLayer; qwen2 and llama are the same minus q/k norm):
 *   h   = x + o_proj(attn(rope(q_norm(q_proj(rms(x)))), rope(k_norm(k_proj(rms(x)))), v_proj(rms(x))))
 *   x'  = h + down(silu(gate(rms(h))) * up(rms(h)))          (MoE: router top-k over experts)
 * then logits = lm_head(rms(x)) for the tokens that asked for them. Qwen3.5 (hybrid): its gated
 * attention is here (gated_attention_layer), its Gated DeltaNet layers in forward_qwen35.c.
 * Buffers (n = ubatch tokens): x, xb, xb2 [n][n_embd]; q, att [n][n_head*head_dim];
 * k, v [n][n_head_kv*head_dim]; hb, hb2 [n][n_ff]; router [n][n_expert].
 */
#include <math.h>
#include <stdlib.h>

#include "engine_impl.h"
#include "forward_qwen35.h"
#include "ops_cpu.h"
#include "topk.h"
#include "util.h"

/* ---- attention over the paged cache ---- */

struct attn_args {
    struct pxq_engine *e;
    const struct ubatch *ub;
    int l;           /* attention-layer index in the cache */
};

static float *scores_get(size_t n) {
    static __thread float *buf;
    static __thread size_t cap;
    return tls_grow(&buf, &cap, n);
}


/* One (token, KV head) pair per item: for each of the `group` query heads sharing that KV head,
 * causal softmax(q k^T * attn_scale) v over positions 0..pos that it sees (kv_visible: all of them,
 * or the sinks and the window; attn_scale from the cache's layout, 1 / sqrt(head_dim)). Each K and
 * V row is read once for the
 * whole group (GQA), dequantized from the cache's type (kv_load). The arithmetic per query head is
 * the same as head by head. */
/* The positions a query at q_pos of sequence s sees, as ranges [r[2i], r[2i + 1]) in ascending
 * order (at most topk_blocks + 2; returns their count): every position; or the sinks and the window
 * (kv_visible); or with block selection also the topk_blocks blocks of the middle whose key bounds
 * give the largest upper bound of q.k over the group's query heads (Quest: sum over channels of
 * max(q_d min_d, q_d max_d); a block's part inside the sinks or the window is not counted twice). */
static int visible_ranges(const struct pxq_engine *e, const struct kv_seq *s, int l, int kvh, const float *q, int group,
                          int q_pos, int *r) {
    const struct kv_layout *lay = &e->kv.lay;
    const int n_kv = q_pos + 1, bs = lay->block_size, hd = lay->head_dim;
    if (!lay->attn_window || n_kv <= lay->attn_sinks + lay->attn_window) {
        r[0] = 0, r[1] = n_kv;
        return 1;
    }
    const int a = lay->attn_sinks, b = n_kv - lay->attn_window; /* the middle: [a, b) */
    int n = 0;
    if (a > 0) r[n++] = 0, r[n++] = a;
    if (lay->topk_blocks && e->kv.kmin) {
        const int b0 = a / bs, b1 = (b - 1) / bs, nb = b1 - b0 + 1; /* blocks touching the middle */
        float *score = scores_get((size_t)nb * 2) + nb;              /* after the ids: see below */
        int *id = (int *)(void *)(score - nb);
        for (int i = 0; i < nb; i++) {
            const size_t o = ((size_t)s->blocks[b0 + i] * (size_t)lay->n_layer_kv + (size_t)l) * (size_t)lay->kv_dim +
                             (size_t)kvh * hd;
            const float *mn = e->kv.kmin + o, *mx = e->kv.kmax + o;
            float best = -INFINITY;
            for (int g = 0; g < group; g++) {
                const float *qg = q + (size_t)g * hd;
                float u = 0;
                for (int d = 0; d < hd; d++) u += fmaxf(qg[d] * mn[d], qg[d] * mx[d]);
                best = fmaxf(best, u);
            }
            score[i] = best;
        }
        /* the k best, ties to the earlier block, in ascending block order (a selection in O(nb): a
         * partial sort was O(k nb), quadratic in the context at a fixed share of the blocks) */
        const int k = topk_indices(score, nb, lay->topk_blocks, id);
        for (int i = 0; i < k; i++) {
            const int lo = (b0 + id[i]) * bs > a ? (b0 + id[i]) * bs : a, hi = (b0 + id[i] + 1) * bs < b ? (b0 + id[i] + 1) * bs : b;
            if (n > 0 && r[n - 1] == lo) r[n - 1] = hi; /* adjacent: one range */
            else r[n++] = lo, r[n++] = hi;
        }
    }
    if (n > 0 && r[n - 1] == b) r[n - 1] = n_kv;
    else r[n++] = b, r[n++] = n_kv;
    return n / 2;
}

static void attn_range(void *arg, int64_t j0, int64_t j1, int ith) {
    const struct attn_args *a = arg;
    const struct pxq_engine *e = a->e;
    const struct pxq_hparams *hp = e->hp;
    const struct kv_layout *lay = &e->kv.lay;
    const int hd = hp->head_dim, q_dim = hp->n_head * hd, group = hp->n_head / hp->n_head_kv;
    const float scale = lay->attn_scale;
    float tmp[KV_MAX_HEAD_DIM];
    static __thread float *rg; /* the ranges: ints in a thread's float buffer (same size) */
    static __thread size_t rg_cap;
    int *r = (int *)(void *)tls_grow(&rg, &rg_cap, 2 * (size_t)lay->topk_blocks + 4);
    for (int64_t j = j0; j < j1; j++) {
        const int t = (int)(j / hp->n_head_kv), kvh = (int)(j % hp->n_head_kv);
        const struct kv_seq *s = &e->seqs[a->ub->seq_id[t]].kv;
        const int q_pos = a->ub->pos[t];
        const float *q = e->q + (size_t)t * q_dim + (size_t)kvh * group * hd; /* the group's heads, contiguous */
        const int n_r = visible_ranges(e, s, a->l, kvh, q, group, q_pos, r);
        int n_vis = 0;
        for (int i = 0; i < n_r; i++) n_vis += r[2 * i + 1] - r[2 * i];
        float *sc = scores_get((size_t)n_vis * group);                      /* [group][n_vis] */
        for (int i = 0, x = 0; i < n_r; i++)
            for (int p = r[2 * i]; p < r[2 * i + 1]; p++, x++) {
                const float *k = kv_load(&e->kv, s, KV_K, a->l, kvh, p, q_pos, tmp);
                for (int g = 0; g < group; g++) sc[(size_t)g * n_vis + x] = vec_dot_f32(q + (size_t)g * hd, k, hd) * scale;
            }
        for (int g = 0; g < group; g++) softmax_cpu(sc + (size_t)g * n_vis, n_vis);
        float *o = e->att + (size_t)t * q_dim + (size_t)kvh * group * hd;
        memset(o, 0, (size_t)group * hd * sizeof(float));
        for (int i = 0, x = 0; i < n_r; i++)
            for (int p = r[2 * i]; p < r[2 * i + 1]; p++, x++) {
                const float *v = kv_load(&e->kv, s, KV_V, a->l, kvh, p, q_pos, tmp);
                for (int g = 0; g < group; g++) vec_axpy_f32(o + (size_t)g * hd, sc[(size_t)g * n_vis + x], v, hd);
            }
    }
}

/* The tiled path: a tile is up to ATT_TILE consecutive tokens of one sequence in the ubatch, and an
 * item one tile and one KV head: its group x tokens query rows go through attn_tile_f32 (ops_cpu.h)
 * together, which transposes each block of 16 K rows once for all of them. For float32 K and V
 * (the CPU's f16 cache type) and full causal attention; a row's arithmetic does not depend on the
 * tile, so a token attends the same alone, batched or chunked. */
#define ATT_TILE 64
#define ATT_SCRATCH_MAX (1 << 20) /* floats of scores a tile may hold: fewer tokens at long contexts */

struct tile_args {
    struct pxq_engine *e;
    const struct ubatch *ub;
    int l;
    const int *t0; /* tile i = tokens t0[i] .. t0[i + 1] - 1 */
};

static int attn_tiled_ok(const struct pxq_engine *e, int l) {
    const struct kv_layout *lay = &e->kv.lay;
    const int hd = e->hp->head_dim;
    if (lay->quantized || lay->attn_window || lay->topk_blocks || hd % 16 || hd > 256) return 0;
    for (int h = 0; h < e->hp->n_head_kv; h++)
        if (lay->layer[KV_K][l].type[h] != KV_F32 || lay->layer[KV_V][l].type[h] != KV_F32) return 0;
    return 1;
}

static void attn_tiles(void *arg, int64_t j0, int64_t j1, int ith) {
    const struct tile_args *a = arg;
    const struct pxq_engine *e = a->e;
    const struct pxq_hparams *hp = e->hp;
    const int hd = hp->head_dim, q_dim = hp->n_head * hd, group = hp->n_head / hp->n_head_kv;
    static __thread float *pb, *sb; /* K/V row pointers (in a float buffer), scratch */
    static __thread size_t pb_cap, sb_cap;
    float tmp[KV_MAX_HEAD_DIM];
    for (int64_t j = j0; j < j1; j++) {
        const int tile = (int)(j / hp->n_head_kv), kvh = (int)(j % hp->n_head_kv);
        const int tb = a->t0[tile], te = a->t0[tile + 1], nq = (te - tb) * group;
        const struct kv_seq *s = &e->seqs[a->ub->seq_id[tb]].kv;
        int n_max = 0, n_vis[ATT_TILE * 64]; /* tokens x group (at most 64) */
        const float *qr[ATT_TILE * 64];
        float *orow[ATT_TILE * 64];
        for (int t = tb; t < te; t++) {
            n_max = a->ub->pos[t] + 1 > n_max ? a->ub->pos[t] + 1 : n_max;
            for (int g = 0; g < group; g++) {
                const int i = (t - tb) * group + g;
                const size_t off = (size_t)t * q_dim + (size_t)(kvh * group + g) * hd;
                qr[i] = e->q + off, orow[i] = e->att + off, n_vis[i] = a->ub->pos[t] + 1;
            }
        }
        const float **kp = (const float **)(void *)tls_grow(&pb, &pb_cap, 2 * (size_t)n_max * (sizeof(void *) / sizeof(float)));
        const float **vp = kp + n_max;
        for (int p = 0; p < n_max; p++) {
            kp[p] = kv_load(&e->kv, s, KV_K, a->l, kvh, p, n_max - 1, tmp);
            vp[p] = kv_load(&e->kv, s, KV_V, a->l, kvh, p, n_max - 1, tmp);
        }
        float *scratch = tls_grow(&sb, &sb_cap, attn_tile_scratch(nq, n_max, hd));
        attn_tile_f32(orow, qr, n_vis, nq, kp, vp, hd, e->kv.lay.attn_scale, scratch);
    }
}

/* Causal attention of the ubatch's q (e->q, [n][n_head*head_dim], after norm and RoPE) over the cache
 * of attention layer l (this ubatch's K/V already written) into e->att. */
static void attention_core(struct pxq_engine *e, const struct ubatch *ub, int l) {
    const int group = e->hp->n_head / e->hp->n_head_kv;
    if (attn_tiled_ok(e, l) && group <= 64) {
        int *t0 = xmalloc(((size_t)ub->n + 1) * sizeof *t0), n_tiles = 0, n_max = 0;
        for (int t = 0; t < ub->n; t++) {
            const int pad = ((ub->pos[t] + 1 > n_max ? ub->pos[t] + 1 : n_max) + 15) & ~15;
            const int size = n_tiles ? t - t0[n_tiles - 1] : 0;
            if (!n_tiles || ub->seq_id[t] != ub->seq_id[t - 1] || size == ATT_TILE ||
                (size_t)(size + 1) * group * pad > ATT_SCRATCH_MAX)
                t0[n_tiles++] = t, n_max = 0;
            n_max = ub->pos[t] + 1 > n_max ? ub->pos[t] + 1 : n_max;
        }
        t0[n_tiles] = ub->n;
        struct tile_args a = {e, ub, l, t0};
        parallel_for(e->tp, (int64_t)n_tiles * e->hp->n_head_kv, 1, attn_tiles, &a);
        free(t0);
        return;
    }
    struct attn_args a = {e, ub, l};
    parallel_for(e->tp, (int64_t)ub->n * e->hp->n_head_kv, 1, attn_range, &a);
}

/* Store the ubatch's k, v (e->k, e->v: [n][kv_dim], after norm and RoPE) at their positions of cache
 * layer l, in the cache's types (kv_store). */
static void kv_store_ubatch(struct pxq_engine *e, const struct ubatch *ub, int l) {
    const int kv_dim = e->kv.lay.kv_dim;
    for (int t = 0; t < ub->n; t++)
        kv_store(&e->kv, &e->seqs[ub->seq_id[t]].kv, l, ub->pos[t], e->k + (size_t)t * kv_dim, e->v + (size_t)t * kv_dim);
}

static void add_bias(float *y, const float *b, int n_rows, int n) {
    if (!b) return;
    for (int r = 0; r < n_rows; r++)
        for (int i = 0; i < n; i++) y[(size_t)r * n + i] += b[i];
}

/* ---- the per-token steps, spread over the pool by tokens (the same arithmetic per token) ---- */

struct tok_args {
    struct pxq_engine *e;
    const struct ubatch *ub;
    const struct layer_f32 *w;
    float *out;
    const float *in, *in2, *norm;
    int64_t width; /* floats a token */
};

/* q_norm/k_norm (Qwen3) then RoPE on tokens t0..t1-1 of e->q, e->k. */
static void qk_norm_rope_range(void *arg, int64_t t0, int64_t t1, int ith) {
    const struct tok_args *a = arg;
    const struct pxq_hparams *hp = a->e->hp;
    const int hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    for (int64_t t = t0; t < t1; t++) {
        float *q = a->e->q + (size_t)t * q_dim, *k = a->e->k + (size_t)t * kv_dim;
        if (a->w->q_norm) rmsnorm_cpu(q, q, a->w->q_norm, hd, hp->n_head, hp->rms_eps); /* before RoPE (Qwen3) */
        if (a->w->k_norm) rmsnorm_cpu(k, k, a->w->k_norm, hd, hp->n_head_kv, hp->rms_eps);
        rope_cpu(q, hp->n_head, hd, hp->n_rot, a->ub->pos[t], a->e->inv_freq, hp->rope_style == ROPE_NEOX);
        rope_cpu(k, hp->n_head_kv, hd, hp->n_rot, a->ub->pos[t], a->e->inv_freq, hp->rope_style == ROPE_NEOX);
    }
}

/* out = swiglu(in, in2) on tokens t0..t1-1 (width floats each). */
static void swiglu_range(void *arg, int64_t t0, int64_t t1, int ith) {
    const struct tok_args *a = arg;
    swiglu_cpu(a->out + t0 * a->width, a->in + t0 * a->width, a->in2 + t0 * a->width, (t1 - t0) * a->width);
}

/* out = rmsnorm(in) * norm on tokens t0..t1-1 (width floats each). */
static void rmsnorm_range(void *arg, int64_t t0, int64_t t1, int ith) {
    const struct tok_args *a = arg;
    rmsnorm_cpu(a->out + t0 * a->width, a->in + t0 * a->width, a->norm, (int)a->width, (int)(t1 - t0), a->e->hp->rms_eps);
}

static void attention_layer(struct pxq_engine *e, const struct ubatch *ub, int il) {
    const struct pxq_hparams *hp = e->hp;
    const struct pxq_layer *L = model_layer(e->m, il);
    const struct layer_f32 *w = &e->lw[il];
    const int n = ub->n, hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    const int l = e->kv_layer[il];
    matmul_cpu_n(e->tp, (float *const[]){e->q, e->k, e->v}, (const struct pxq_tensor *const[]){L->attn_q, L->attn_k, L->attn_v},
                 3, e->xb, n);
    add_bias(e->q, w->bq, n, q_dim);
    add_bias(e->k, w->bk, n, kv_dim);
    add_bias(e->v, w->bv, n, kv_dim);
    parallel_for(e->tp, n, 16, qk_norm_rope_range, &(struct tok_args){.e = e, .ub = ub, .w = w});
    kv_store_ubatch(e, ub, l);
    attention_core(e, ub, l);
    matmul_cpu(e->tp, e->xb2, L->attn_output, e->att, n);
}

/* Qwen3.5's gated attention (HF modeling_qwen3_5.py Qwen3_5Attention): q_proj gives per head
 * [query (head_dim) | gate (head_dim)] (view(..., n_head, 2 * head_dim) then chunk); query and key
 * get q_norm/k_norm then partial RoPE (rotate_half over the first n_rot dims, n_rot =
 * partial_rotary_factor * head_dim; Qwen3.5's interleaved mrope sections all carry the same position
 * for text, so it is plain RoPE); softmax attention as Qwen3; the output is multiplied by
 * sigmoid(gate) before o_proj. */
static void gated_attention_layer(struct pxq_engine *e, const struct ubatch *ub, int il) {
    const struct pxq_hparams *hp = e->hp;
    const struct pxq_layer *L = model_layer(e->m, il);
    const struct layer_f32 *w = &e->lw[il];
    const int n = ub->n, hd = hp->head_dim, nh = hp->n_head, q_dim = nh * hd, kv_dim = hp->n_head_kv * hd;
    const int l = e->kv_layer[il];
    float *gate = e->xb2; /* [n][q_dim], free until o_proj writes it */
    matmul_cpu(e->tp, e->att, L->attn_q, e->xb, n); /* [n][n_head][query | gate] */
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nh; h++) {
            const float *src = e->att + (size_t)t * 2 * q_dim + (size_t)h * 2 * hd;
            memcpy(e->q + (size_t)t * q_dim + (size_t)h * hd, src, (size_t)hd * sizeof(float));
            memcpy(gate + (size_t)t * q_dim + (size_t)h * hd, src + hd, (size_t)hd * sizeof(float));
        }
    matmul_cpu(e->tp, e->k, L->attn_k, e->xb, n);
    matmul_cpu(e->tp, e->v, L->attn_v, e->xb, n);
    for (int t = 0; t < n; t++) {
        float *q = e->q + (size_t)t * q_dim, *k = e->k + (size_t)t * kv_dim;
        rmsnorm_cpu(q, q, w->q_norm, hd, nh, hp->rms_eps); /* before RoPE */
        rmsnorm_cpu(k, k, w->k_norm, hd, hp->n_head_kv, hp->rms_eps);
        rope_cpu(q, nh, hd, hp->n_rot, ub->pos[t], e->inv_freq, 1);
        rope_cpu(k, hp->n_head_kv, hd, hp->n_rot, ub->pos[t], e->inv_freq, 1);
    }
    kv_store_ubatch(e, ub, l);
    attention_core(e, ub, l);
    for (size_t i = 0; i < (size_t)n * q_dim; i++) e->att[i] *= 1.0f / (1.0f + expf(-gate[i]));
    matmul_cpu(e->tp, e->xb2, L->attn_output, e->att, n);
}

/* ---- feed-forward ---- */

static void ffn_dense(struct pxq_engine *e, const struct pxq_layer *L, int n) {
    const int64_t ff = e->hp->n_ff;
    matmul_cpu_n(e->tp, (float *const[]){e->hb, e->hb2}, (const struct pxq_tensor *const[]){L->ffn_gate, L->ffn_up}, 2, e->xb, n);
    parallel_for(e->tp, n, 16, swiglu_range, &(struct tok_args){.e = e, .out = e->hb, .in = e->hb, .in2 = e->hb2, .width = ff});
    matmul_cpu(e->tp, e->xb2, L->ffn_down, e->hb, n);
}

/* Qwen3MoeSparseMoeBlock: softmax over router logits, top-k, renormalise if norm_topk_prob, and sum
 * the chosen experts' SwiGLU outputs weighted. Tokens routed to one expert are gathered so each
 * expert runs one matrix-matrix product. */
static void ffn_moe(struct pxq_engine *e, const struct pxq_layer *L, int n) {
    const struct pxq_hparams *hp = e->hp;
    const int ne = hp->n_expert, k = hp->n_expert_used, d = hp->n_embd, ff = hp->n_ff_exp;
    matmul_cpu(e->tp, e->router, L->ffn_gate_inp, e->xb, n);
    int *sel = xmalloc((size_t)n * k * sizeof *sel);
    float *wsel = xmalloc((size_t)n * k * sizeof *wsel);
    for (int t = 0; t < n; t++) {
        float *r = e->router + (size_t)t * ne;
        softmax_cpu(r, ne);
        float sum = 0;
        for (int j = 0; j < k; j++) { /* top-k by repeated argmax; ties go to the lower index as torch.topk */
            int best = -1;
            for (int x = 0; x < ne; x++) {
                int taken = 0;
                for (int y = 0; y < j; y++) taken |= sel[t * k + y] == x;
                if (!taken && (best < 0 || r[x] > r[best])) best = x;
            }
            sel[t * k + j] = best;
            wsel[t * k + j] = r[best];
            sum += r[best];
        }
        if (hp->norm_topk_prob)
            for (int j = 0; j < k; j++) wsel[t * k + j] /= sum;
    }
    float *acc = xcalloc((size_t)n * d, sizeof(float));
    float *xin = xmalloc((size_t)n * d * sizeof(float)), *g = xmalloc((size_t)n * ff * sizeof(float));
    float *u = xmalloc((size_t)n * ff * sizeof(float)), *y = xmalloc((size_t)n * d * sizeof(float));
    int *rows = xmalloc((size_t)n * sizeof *rows);
    float *rw = xmalloc((size_t)n * sizeof *rw);
    for (int x = 0; x < ne; x++) {
        int m = 0;
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++)
                if (sel[t * k + j] == x) {
                    rows[m] = t;
                    rw[m] = wsel[t * k + j];
                    memcpy(xin + (size_t)m * d, e->xb + (size_t)t * d, (size_t)d * sizeof(float));
                    m++;
                }
        if (!m) continue;
        matmul_cpu(e->tp, g, L->experts[x].gate, xin, m);
        matmul_cpu(e->tp, u, L->experts[x].up, xin, m);
        swiglu_cpu(g, g, u, (int64_t)m * ff);
        matmul_cpu(e->tp, y, L->experts[x].down, g, m);
        for (int i = 0; i < m; i++)
            for (int c = 0; c < d; c++) acc[(size_t)rows[i] * d + c] += rw[i] * y[(size_t)i * d + c];
    }
    memcpy(e->xb2, acc, (size_t)n * d * sizeof(float));
    free(acc), free(xin), free(g), free(u), free(y), free(rows), free(rw), free(sel), free(wsel);
}

static void add_residual(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void decoder_layer_cpu(struct pxq_engine *e, const struct ubatch *ub, int il) {
    const struct pxq_hparams *hp = e->hp;
    const struct pxq_layer *L = model_layer(e->m, il);
    const int n = ub->n, d = hp->n_embd;
    parallel_for(e->tp, n, 16, rmsnorm_range, &(struct tok_args){.e = e, .out = e->xb, .in = e->x, .norm = e->lw[il].attn_norm, .width = d});
    if (il < hp->n_layer && hp->layer_kind[il] == LAYER_DELTANET)
        deltanet_layer_cpu(e, ub, il); /* forward_qwen35.c */
    else if (hp->attn_output_gate)
        gated_attention_layer(e, ub, il);
    else
        attention_layer(e, ub, il);
    add_residual(e->x, e->xb2, (size_t)n * d);
    parallel_for(e->tp, n, 16, rmsnorm_range, &(struct tok_args){.e = e, .out = e->xb, .in = e->x, .norm = e->lw[il].ffn_norm, .width = d});
    if (hp->n_expert)
        ffn_moe(e, L, n);
    else
        ffn_dense(e, L, n);
    add_residual(e->x, e->xb2, (size_t)n * d);
}

void output_cpu(struct pxq_engine *e, const struct ubatch *ub, const float *norm) {
    const struct pxq_hparams *hp = e->hp;
    const int n = ub->n, d = hp->n_embd;
    if (ub->hidden) rmsnorm_cpu(ub->hidden, e->x, norm, d, n, hp->rms_eps);
    /* final norm and lm_head, only for the rows that asked for logits (compacted into xb) */
    int n_out = 0, first = -1;
    for (int t = 0; t < n; t++)
        if (ub->out_idx[t] >= 0) {
            if (first < 0) first = ub->out_idx[t];
            rmsnorm_cpu(e->xb + (size_t)n_out * d, e->x + (size_t)t * d, norm, d, 1, hp->rms_eps);
            n_out++;
        }
    if (n_out) matmul_cpu(e->tp, e->logits + (size_t)first * hp->n_vocab, model_output(e->m), e->xb, n_out);
}

void forward_cpu(struct pxq_engine *e, const struct ubatch *ub) {
    const struct pxq_hparams *hp = e->hp;
    const int n = ub->n, d = hp->n_embd;
    for (int t = 0; t < n; t++) tensor_row_f32(e->x + (size_t)t * d, model_token_embd(e->m), ub->token[t]);
    for (int il = 0; il < hp->n_layer; il++) decoder_layer_cpu(e, ub, il);
    output_cpu(e, ub, e->output_norm);
}
