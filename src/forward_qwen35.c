/* forward_qwen35.c - the CPU reference of Qwen3.5 / 3.6's token mixers (HF transformers 5.17
 * modeling_qwen3_5.py): Qwen3_5GatedDeltaNet (linear_attention layers), and the engine set-up of the
 * family. forward_cpu.c runs the rest of each decoder layer (norms, residuals, MLP), the
 * same as Qwen3's; every RMSNorm there is Qwen3_5RMSNorm, x_hat * (1 + w), whose 1 qwen35_engine_init
 * folds into the float32 weights when the file is HF's (llama.cpp's GGUFs have it folded already).
 *
 * Gated DeltaNet, per token x (normed hidden state, [n_embd]), with key_dim = n_k * dk,
 * value_dim = n_v * dv, conv_dim = 2 * key_dim + value_dim:
 *   qkv = in_proj_qkv x                    [conv_dim]  = [q (n_k heads) | k (n_k heads) | v (n_v heads)]
 *   qkv = silu(causal depthwise conv1d(qkv)) over this and the K-1 previous tokens (conv state)
 *   q, k = l2norm(q), l2norm(k) per head (eps 1e-6);  q *= 1 / sqrt(dk)
 *   beta = sigmoid(in_proj_b x);  g = -exp(A_log) * softplus(in_proj_a x + dt_bias)     [n_v]
 *   o = gated_delta_rule(q, k, v, g, beta) per value head, key head kh(h) (GQA-like sharing)
 *   o = rmsnorm(o) * norm_w * silu(in_proj_z x) per value head (Qwen3_5RMSNormGated, no 1 + w)
 *   y = out_proj o
 * State per sequence and DeltaNet layer (float32, in struct pxq_seq.rstate):
 *   conv [K-1][conv_dim] (the last K-1 inputs, oldest first), then S [n_v][dk][dv].
 *
 * Gated full attention (Qwen3_5Attention) is in forward_cpu.c, beside the plain attention it
 * extends (gated_attention_layer).
 */
#include <math.h>
#include <stdlib.h>

#include "engine_impl.h"
#include "forward_qwen35.h"
#include "ops_cpu.h"
#include "util.h"

/* ---- the gated delta rule ---- */

typedef float v8f __attribute__((vector_size(32)));


static inline void scale(float *y, float a, int n) {
    for (int i = 0; i < n; i++) y[i] *= a;
}

void gated_delta_rule_recurrent(float *out, float *S, const float *q, const float *k, const float *v, const float *g,
                                const float *beta, int n, int dk, int dv) {
    float kv_mem[1024], delta[1024]; /* dv <= 1024 (checked at load) */
    for (int t = 0; t < n; t++) {
        const float *qt = q + (size_t)t * dk, *kt = k + (size_t)t * dk, *vt = v + (size_t)t * dv;
        float *ot = out + (size_t)t * dv;
        const float decay = expf(g[t]);
        memset(kv_mem, 0, (size_t)dv * sizeof(float));
        for (int i = 0; i < dk; i++) { /* S *= exp(g); kv_mem = k S */
            float *Si = S + (size_t)i * dv;
            scale(Si, decay, dv);
            vec_axpy_f32(kv_mem, kt[i], Si, dv);
        }
        for (int j = 0; j < dv; j++) delta[j] = (vt[j] - kv_mem[j]) * beta[t];
        memset(ot, 0, (size_t)dv * sizeof(float));
        for (int i = 0; i < dk; i++) { /* S += k^T delta; out = q S */
            float *Si = S + (size_t)i * dv;
            vec_axpy_f32(Si, kt[i], delta, dv);
            vec_axpy_f32(ot, qt[i], Si, dv);
        }
    }
}

/* torch_chunk_gated_delta_rule, chunk by chunk (no padding: a short last chunk is the same math).
 * Within a chunk of m tokens, gam_i = sum_{j<=i} g_j and, for j < i,
 *   A[i][j] = beta_i (k_i . k_j) exp(gam_i - gam_j)                       (ut_system, strictly lower)
 *   U = (I + A)^-1 (beta v),  W = (I + A)^-1 (beta exp(gam) k)            (forward substitution)
 *   vnew = U - W S
 *   out_i = exp(gam_i) q_i S + sum_{j<=i} (q_i . k_j) exp(gam_i - gam_j) vnew_j
 *   S = exp(gam_last) S + sum_j exp(gam_last - gam_j) k_j^T vnew_j
 * Every exp has a non-positive argument, so nothing overflows. */
void gated_delta_rule_chunked(float *out, float *S, const float *q, const float *k, const float *v, const float *g,
                              const float *beta, int n, int dk, int dv, int chunk) {
    static __thread float *buf;
    static __thread size_t cap;
    const int C = chunk;
    float *A = tls_grow(&buf, &cap, 2 * (size_t)C * C + (size_t)C * (dv + dk + 2));
    float *M = A + (size_t)C * C, *U = M + (size_t)C * C, *W = U + (size_t)C * dv;
    float *gam = W + (size_t)C * dk, *elast = gam + C;
    for (int c0 = 0; c0 < n; c0 += C) {
        const int m = n - c0 < C ? n - c0 : C;
        const float *qc = q + (size_t)c0 * dk, *kc = k + (size_t)c0 * dk, *vc = v + (size_t)c0 * dv;
        const float *bc = beta + c0;
        float *oc = out + (size_t)c0 * dv;
        float acc = 0;
        for (int i = 0; i < m; i++) gam[i] = acc += g[c0 + i];
        for (int i = 0; i < m; i++) {
            const float *ki = kc + (size_t)i * dk, *qi = qc + (size_t)i * dk;
            for (int j = 0; j <= i; j++) {
                const float dec = expf(gam[i] - gam[j]), *kj = kc + (size_t)j * dk;
                A[i * C + j] = bc[i] * vec_dot_f32(ki, kj, dk) * dec;
                M[i * C + j] = vec_dot_f32(qi, kj, dk) * dec;
            }
        }
        for (int i = 0; i < m; i++) { /* forward substitution, row by row */
            float *Ui = U + (size_t)i * dv, *Wi = W + (size_t)i * dk;
            const float *vi = vc + (size_t)i * dv, *ki = kc + (size_t)i * dk;
            const float wk = bc[i] * expf(gam[i]);
            for (int x = 0; x < dv; x++) Ui[x] = bc[i] * vi[x];
            for (int x = 0; x < dk; x++) Wi[x] = wk * ki[x];
            for (int j = 0; j < i; j++) {
                vec_axpy_f32(Ui, -A[i * C + j], U + (size_t)j * dv, dv);
                vec_axpy_f32(Wi, -A[i * C + j], W + (size_t)j * dk, dk);
            }
        }
        for (int i = 0; i < m; i++) { /* U becomes vnew = U - W S; out = exp(gam) q S (inter-chunk part) */
            float *vn = U + (size_t)i * dv, *oi = oc + (size_t)i * dv;
            const float *Wi = W + (size_t)i * dk, *qi = qc + (size_t)i * dk;
            const float eg = expf(gam[i]);
            memset(oi, 0, (size_t)dv * sizeof(float));
            for (int r = 0; r < dk; r++) {
                const float *Sr = S + (size_t)r * dv;
                vec_axpy_f32(vn, -Wi[r], Sr, dv);
                vec_axpy_f32(oi, qi[r] * eg, Sr, dv);
            }
        }
        for (int i = 0; i < m; i++) /* intra-chunk part */
            for (int j = 0; j <= i; j++) vec_axpy_f32(oc + (size_t)i * dv, M[i * C + j], U + (size_t)j * dv, dv);
        const float glast = gam[m - 1], dlast = expf(glast);
        for (int j = 0; j < m; j++) elast[j] = expf(glast - gam[j]);
        for (int r = 0; r < dk; r++) { /* state update */
            float *Sr = S + (size_t)r * dv;
            scale(Sr, dlast, dv);
            for (int j = 0; j < m; j++) vec_axpy_f32(Sr, kc[(size_t)j * dk + r] * elast[j], U + (size_t)j * dv, dv);
        }
    }
}

/* ---- engine set-up ---- */

struct dn_dims {
    int nk, nv, dk, dv, K, key_dim, value_dim, conv_dim;
    size_t conv_floats, state_floats, layer_floats; /* per sequence and DeltaNet layer */
};

static struct dn_dims dn_dims(const struct pxq_hparams *hp) {
    struct dn_dims d;
    d.nk = hp->ssm_n_k_head, d.nv = hp->ssm_n_v_head, d.dk = hp->ssm_head_k_dim, d.dv = hp->ssm_head_v_dim;
    d.K = hp->ssm_conv_kernel;
    d.key_dim = d.nk * d.dk, d.value_dim = d.nv * d.dv, d.conv_dim = 2 * d.key_dim + d.value_dim;
    d.conv_floats = (size_t)(d.K - 1) * d.conv_dim;
    d.state_floats = (size_t)d.nv * d.dk * d.dv;
    d.layer_floats = d.conv_floats + d.state_floats;
    return d;
}

/* All of t's elements as float32, rows in order (conv1d: [conv_dim][K]). */
static float *all_f32(const struct pxq_tensor *t) {
    if (!t) return NULL;
    const int64_t n0 = t->ne[0], rows = tensor_nelements(t) / n0;
    float *v = xmalloc((size_t)tensor_nelements(t) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) tensor_row_f32(v + r * n0, t, r);
    return v;
}

static void add_offset(float *w, int n, float off) {
    if (w && off != 0)
        for (int i = 0; i < n; i++) w[i] += off;
}

int qwen35_engine_init(struct pxq_engine *e, char *err, size_t errlen) {
    const struct pxq_hparams *hp = e->hp;
    const struct dn_dims d = dn_dims(hp);
    const float off = hp->norm_w_offset;
    int n_dn = 0;
    for (int il = 0; il < e->n_lw; il++) { /* the model's layers, then the MTP layers (spec_mtp) */
        const struct pxq_layer *L = model_layer(e->m, il);
        struct layer_f32 *w = &e->lw[il];
        add_offset(w->attn_norm, hp->n_embd, off);
        add_offset(w->ffn_norm, hp->n_embd, off);
        add_offset(w->q_norm, hp->head_dim, off);
        add_offset(w->k_norm, hp->head_dim, off);
        e->dn_layer[il] = -1;
        if (il >= hp->n_layer || hp->layer_kind[il] != LAYER_DELTANET) continue;
        e->dn_layer[il] = n_dn++;
        w->ssm_a = all_f32(L->ssm_a);
        if (hp->ssm_a_is_log)
            for (int h = 0; h < d.nv; h++) w->ssm_a[h] = -expf(w->ssm_a[h]); /* -A_log.float().exp() */
        w->ssm_dt = all_f32(L->ssm_dt);
        w->ssm_norm = all_f32(L->ssm_norm);
        w->ssm_conv1d = all_f32(L->ssm_conv1d);
    }
    add_offset(e->output_norm, hp->n_embd, off);
    add_offset(e->mtp_enorm, hp->n_embd, off);
    add_offset(e->mtp_hnorm, hp->n_embd, off);
    add_offset(e->mtp_head_norm, hp->n_embd, off);
    if (n_dn && (d.dv > 1024 || d.dk > 1024 || d.nk <= 0 || d.nv % d.nk))
        return set_err(err, errlen, "qwen35: unsupported DeltaNet heads (k %d x %d, v %d x %d)", d.nk, d.dk, d.nv, d.dv);
    e->rstate_floats = (size_t)n_dn * d.layer_floats;
    if (n_dn) {
        size_t nb = (size_t)e->p.n_batch;
        e->ssm_qkv = xmalloc(nb * d.conv_dim * sizeof(float));
        e->ssm_conv = xmalloc(nb * d.conv_dim * sizeof(float));
        e->ssm_z = xmalloc(nb * d.value_dim * sizeof(float));
        e->ssm_ba = xmalloc(nb * 2 * d.nv * sizeof(float));
        e->ssm_o = xmalloc(nb * d.value_dim * sizeof(float));
    }
    return 0;
}

void qwen35_engine_free(struct pxq_engine *e) {
    if (e->lw)
        for (int il = 0; il < e->n_lw; il++) {
            struct layer_f32 *w = &e->lw[il];
            free(w->ssm_a), free(w->ssm_dt), free(w->ssm_norm), free(w->ssm_conv1d);
            w->ssm_a = w->ssm_dt = w->ssm_norm = w->ssm_conv1d = NULL;
        }
    free(e->ssm_qkv), free(e->ssm_conv), free(e->ssm_z), free(e->ssm_ba), free(e->ssm_o);
    e->ssm_qkv = e->ssm_conv = e->ssm_z = e->ssm_ba = e->ssm_o = NULL;
}

/* ---- Gated DeltaNet layer ---- */

/* The ubatch's tokens grouped by sequence ("runs"), each run in batch order (= position order). */
struct runs {
    int n_runs;
    int *seq;   /* [n_runs] */
    int *off;   /* [n_runs + 1] into tok */
    int *tok;   /* [n] token indices */
};

static void runs_build(struct runs *r, const struct ubatch *ub, int n_seq_max) {
    int *first = xmalloc((size_t)n_seq_max * sizeof *first);
    for (int s = 0; s < n_seq_max; s++) first[s] = -1;
    r->seq = xmalloc((size_t)ub->n * sizeof *r->seq);
    r->off = xcalloc((size_t)ub->n + 1, sizeof *r->off);
    r->tok = xmalloc((size_t)ub->n * sizeof *r->tok);
    int *count = xcalloc((size_t)ub->n, sizeof *count);
    r->n_runs = 0;
    for (int t = 0; t < ub->n; t++) {
        int s = ub->seq_id[t];
        if (first[s] < 0) first[s] = r->n_runs, r->seq[r->n_runs++] = s;
        count[first[s]]++;
    }
    for (int i = 0; i < r->n_runs; i++) r->off[i + 1] = r->off[i] + count[i], count[i] = 0;
    for (int t = 0; t < ub->n; t++) {
        int i = first[ub->seq_id[t]];
        r->tok[r->off[i] + count[i]++] = t;
    }
    free(first), free(count);
}

static void runs_free(struct runs *r) { free(r->seq), free(r->off), free(r->tok); }

struct dn_args {
    struct pxq_engine *e;
    const struct ubatch *ub;
    const struct runs *r;
    struct dn_dims d;
    int il, dl;
};

static float *layer_state(const struct dn_args *a, int run) {
    return a->e->seqs[a->r->seq[run]].rstate + (size_t)a->dl * a->d.layer_floats;
}

/* pxq_seq_checkpoint_at inside this ubatch: the run's tokens before the snapshot (0..m; -1: none),
 * and the layer's part of the checkpoint copy. */
static int snap_at(const struct dn_args *a, int run) {
    const struct pxq_seq *s = &a->e->seqs[a->r->seq[run]];
    const int j = s->ck_at - a->ub->pos[a->r->tok[a->r->off[run]]], m = a->r->off[run + 1] - a->r->off[run];
    return s->ck_at >= 0 && j >= 0 && j <= m ? j : -1;
}
static float *snap_state(const struct dn_args *a, int run) {
    return a->e->seqs[a->r->seq[run]].ck_state + (size_t)a->dl * a->d.layer_floats;
}

#define CONV_BLOCK 64

/* Causal depthwise conv1d + SiLU (HF causal_conv1d_fn / causal_conv1d_update) over one run of n_tok
 * tokens (token rows tok[0..n_tok), in order) and channels c0..c1: for channel c,
 * y_t = silu(sum_j w[c][j] x_{t-(K-1)+j}), the inputs before the run coming from conv_state
 * [K-1][conv_dim] (oldest first), which ends as the run's last K-1 inputs. x, y: [..][conv_dim]. */
void ssm_conv_cpu(float *y, float *conv_state, const float *x, const float *w, int conv_dim, int K, const int *tok,
                  int n_tok, int c0, int c1) {
    for (int c = c0; c < c1; c++) {
        const float *wc = w + (size_t)c * K;
        float win[16]; /* K <= 16 (checked at load) */
        for (int j = 0; j < K - 1; j++) win[j] = conv_state[(size_t)j * conv_dim + c];
        for (int p = 0; p < n_tok; p++) {
            const int t = tok[p];
            const float xv = x[(size_t)t * conv_dim + c];
            float acc = wc[K - 1] * xv;
            for (int j = 0; j < K - 1; j++) acc += wc[j] * win[j];
            for (int j = 0; j + 1 < K - 1; j++) win[j] = win[j + 1];
            if (K > 1) win[K - 2] = xv;
            y[(size_t)t * conv_dim + c] = acc / (1.0f + expf(-acc));
        }
        for (int j = 0; j < K - 1; j++) conv_state[(size_t)j * conv_dim + c] = win[j];
    }
}

/* Items: (run, block of CONV_BLOCK channels). */
static void conv_range(void *arg, int64_t i0, int64_t i1, int ith) {
    const struct dn_args *a = arg;
    const struct dn_dims *d = &a->d;
    const int nblk = (d->conv_dim + CONV_BLOCK - 1) / CONV_BLOCK;
    for (int64_t it = i0; it < i1; it++) {
        const int run = (int)(it / nblk), c0 = (int)(it % nblk) * CONV_BLOCK;
        const int c1 = c0 + CONV_BLOCK < d->conv_dim ? c0 + CONV_BLOCK : d->conv_dim;
        const int p0 = a->r->off[run], m = a->r->off[run + 1] - p0, j = snap_at(a, run);
        float *st = layer_state(a, run);
        const float *w = a->e->lw[a->il].ssm_conv1d;
        if (j < 0) {
            ssm_conv_cpu(a->e->ssm_conv, st, a->e->ssm_qkv, w, d->conv_dim, d->K, a->r->tok + p0, m, c0, c1);
            continue;
        }
        /* the conv state after the first j tokens, for the checkpoint, then the rest */
        ssm_conv_cpu(a->e->ssm_conv, st, a->e->ssm_qkv, w, d->conv_dim, d->K, a->r->tok + p0, j, c0, c1);
        float *ck = snap_state(a, run);
        for (int r = 0; r < d->K - 1; r++)
            memcpy(ck + (size_t)r * d->conv_dim + c0, st + (size_t)r * d->conv_dim + c0, (size_t)(c1 - c0) * sizeof(float));
        ssm_conv_cpu(a->e->ssm_conv, st, a->e->ssm_qkv, w, d->conv_dim, d->K, a->r->tok + p0 + j, m - j, c0, c1);
    }
}

static void l2norm_scale(float *x, int n, float scale) {
    const float inv = 1.0f / sqrtf(vec_dot_f32(x, x, n) + 1e-6f); /* HF l2norm: x * rsqrt(sum(x^2) + 1e-6) */
    for (int i = 0; i < n; i++) x[i] = x[i] * inv * scale;
}

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch F.softplus, threshold 20 */

/* Per token of n_tokens: l2norm the q and k heads of qkv ([n_tokens][conv_dim], q and k first),
 * q /= sqrt(dk); beta = sigmoid(b) and g = A softplus(a + dt_bias) in place of b and a (ba rows:
 * [b (nv) | a (nv)]); ssm_a = A [nv], ssm_dt = dt_bias [nv]. */
void deltanet_prep_cpu(float *qkv, float *ba, const float *ssm_a, const float *ssm_dt, int nk, int nv, int dk,
                       int conv_dim, int n_tokens) {
    const float qscale = 1.0f / sqrtf((float)dk);
    const int key_dim = nk * dk;
    for (int t = 0; t < n_tokens; t++) {
        float *x = qkv + (size_t)t * conv_dim;
        for (int h = 0; h < nk; h++) {
            l2norm_scale(x + (size_t)h * dk, dk, qscale);
            l2norm_scale(x + key_dim + (size_t)h * dk, dk, 1.0f);
        }
        float *bt = ba + (size_t)t * 2 * nv;
        for (int h = 0; h < nv; h++) {
            bt[h] = 1.0f / (1.0f + expf(-bt[h]));
            bt[nv + h] = ssm_a[h] * softplus(bt[nv + h] + ssm_dt[h]);
        }
    }
}

static void prep_range(void *arg, int64_t t0, int64_t t1, int ith) {
    const struct dn_args *a = arg;
    const struct dn_dims *d = &a->d;
    const struct layer_f32 *w = &a->e->lw[a->il];
    deltanet_prep_cpu(a->e->ssm_conv + (size_t)t0 * d->conv_dim, a->e->ssm_ba + (size_t)t0 * 2 * d->nv, w->ssm_a,
                      w->ssm_dt, d->nk, d->nv, d->dk, d->conv_dim, (int)(t1 - t0));
}

/* Items: (run, value head). Gathers the run's q, k (key head of h), v, g, beta, runs the recurrent
 * form for a single token and the chunked form for more, scatters the output into ssm_o. */
static void rule_range(void *arg, int64_t i0, int64_t i1, int ith) {
    static __thread float *buf;
    static __thread size_t cap;
    const struct dn_args *a = arg;
    const struct dn_dims *d = &a->d;
    const struct pxq_hparams *hp = a->e->hp;
    for (int64_t it = i0; it < i1; it++) {
        const int run = (int)(it / d->nv), h = (int)(it % d->nv);
        const int kh = hp->ssm_v_tiled ? h % d->nk : h / (d->nv / d->nk);
        const int p0 = a->r->off[run], m = a->r->off[run + 1] - p0;
        float *q = tls_grow(&buf, &cap, (size_t)m * (2 * d->dk + 2 * d->dv + 2));
        float *k = q + (size_t)m * d->dk, *v = k + (size_t)m * d->dk, *o = v + (size_t)m * d->dv;
        float *g = o + (size_t)m * d->dv, *beta = g + m;
        for (int i = 0; i < m; i++) {
            const int t = a->r->tok[p0 + i];
            const float *x = a->e->ssm_conv + (size_t)t * d->conv_dim;
            memcpy(q + (size_t)i * d->dk, x + (size_t)kh * d->dk, (size_t)d->dk * sizeof(float));
            memcpy(k + (size_t)i * d->dk, x + d->key_dim + (size_t)kh * d->dk, (size_t)d->dk * sizeof(float));
            memcpy(v + (size_t)i * d->dv, x + 2 * d->key_dim + (size_t)h * d->dv, (size_t)d->dv * sizeof(float));
            beta[i] = a->e->ssm_ba[(size_t)t * 2 * d->nv + h];
            g[i] = a->e->ssm_ba[(size_t)t * 2 * d->nv + d->nv + h];
        }
        float *S = layer_state(a, run) + d->conv_floats + (size_t)h * d->dk * d->dv;
        const int j = snap_at(a, run);
        for (int part = 0, t0 = 0; part < 2; part++) { /* with a snapshot: tokens [0, j), the copy, [j, m) */
            const int t1 = j < 0 || part ? m : j, mm = t1 - t0;
            if (mm >= DELTANET_CHUNK_MIN)
                gated_delta_rule_chunked(o + (size_t)t0 * d->dv, S, q + (size_t)t0 * d->dk, k + (size_t)t0 * d->dk,
                                         v + (size_t)t0 * d->dv, g + t0, beta + t0, mm, d->dk, d->dv, DELTANET_CHUNK);
            else if (mm > 0)
                gated_delta_rule_recurrent(o + (size_t)t0 * d->dv, S, q + (size_t)t0 * d->dk, k + (size_t)t0 * d->dk,
                                           v + (size_t)t0 * d->dv, g + t0, beta + t0, mm, d->dk, d->dv);
            if (j < 0) break;
            if (!part) memcpy(snap_state(a, run) + d->conv_floats + (size_t)h * d->dk * d->dv, S, (size_t)d->dk * d->dv * sizeof(float));
            t0 = t1;
        }
        for (int i = 0; i < m; i++)
            memcpy(a->e->ssm_o + (size_t)a->r->tok[p0 + i] * d->value_dim + (size_t)h * d->dv, o + (size_t)i * d->dv,
                   (size_t)d->dv * sizeof(float));
    }
}

/* Qwen3_5RMSNormGated per row of dv (a token's value head): o = o * rsqrt(mean(o^2) + eps) * w * silu(z);
 * o, z: [n_rows][dv], w: [dv]. */
void gated_rmsnorm_silu_cpu(float *o, const float *z, const float *w, int n_rows, int dv, float eps) {
    for (int r = 0; r < n_rows; r++) {
        float *x = o + (size_t)r * dv;
        const float *zr = z + (size_t)r * dv;
        const float scale = 1.0f / sqrtf(vec_dot_f32(x, x, dv) / (float)dv + eps);
        for (int i = 0; i < dv; i++) x[i] = w[i] * (x[i] * scale) * (zr[i] / (1.0f + expf(-zr[i])));
    }
}

void deltanet_layer_cpu(struct pxq_engine *e, const struct ubatch *ub, int il) {
    const struct pxq_layer *L = model_layer(e->m, il);
    struct dn_args a = {e, ub, NULL, dn_dims(e->hp), il, e->dn_layer[il]};
    const int n = ub->n;
    struct runs r;
    runs_build(&r, ub, e->p.n_seq_max);
    a.r = &r;
    for (int i = 0; i < r.n_runs; i++) { /* zeroed state for a fresh (or truncated-to-0) sequence */
        struct pxq_seq *s = &e->seqs[r.seq[i]];
        if (!s->rstate) s->rstate = xcalloc(e->rstate_floats, sizeof(float));
        s->rstate_live = 1;
        if (s->ck_at >= 0 && !s->ck_state) s->ck_state = xmalloc(e->rstate_floats * sizeof(float)); /* snap_at's */
    }
    matmul_cpu(e->tp, e->ssm_qkv, L->attn_qkv, e->xb, n);
    matmul_cpu(e->tp, e->ssm_z, L->attn_gate, e->xb, n);
    float *b = e->ssm_o, *al = e->ssm_o + (size_t)n * a.d.nv; /* ssm_o is free until the rule runs */
    matmul_cpu(e->tp, b, L->ssm_beta, e->xb, n);
    matmul_cpu(e->tp, al, L->ssm_alpha, e->xb, n);
    for (int t = 0; t < n; t++) {
        memcpy(e->ssm_ba + (size_t)t * 2 * a.d.nv, b + (size_t)t * a.d.nv, (size_t)a.d.nv * sizeof(float));
        memcpy(e->ssm_ba + (size_t)t * 2 * a.d.nv + a.d.nv, al + (size_t)t * a.d.nv, (size_t)a.d.nv * sizeof(float));
    }
    const int nblk = (a.d.conv_dim + CONV_BLOCK - 1) / CONV_BLOCK;
    parallel_for(e->tp, (int64_t)r.n_runs * nblk, 1, conv_range, &a);
    parallel_for(e->tp, n, 1, prep_range, &a);
    parallel_for(e->tp, (int64_t)r.n_runs * a.d.nv, 1, rule_range, &a);
    gated_rmsnorm_silu_cpu(e->ssm_o, e->ssm_z, e->lw[il].ssm_norm, n * a.d.nv, a.d.dv, e->hp->rms_eps);
    matmul_cpu(e->tp, e->xb2, L->ssm_out, e->ssm_o, n);
    runs_free(&r);
}
