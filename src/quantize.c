/* quantize.c - pxq quantize's driver: the tensor list and type policy, calibration and the AWQ
 * scale folding, and the atomic write of the GGUF file (see quantize.h).
 *
 * Every output tensor is an entry: GGUF name, shape, one source tensor per slice (MoE experts are
 * stacked into ffn_*_exps along ne[2], as llama.cpp stores them), and per-slice scale vectors:
 * the float weight written is diag(row) W diag(col) (1-D vectors: elementwise col). AWQ's scales
 * live only there: s on a weight's input columns and 1/s folded into whatever produced that input
 * (RMSNorm weight, v_proj rows, up_proj rows), so the float model's function is unchanged and no
 * tensor is added to the file. */
#include "quantize.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_write.h"
#include "model.h"
#include "quant.h"
#include "quantize_calib.h"
#include "quantize_meta.h"
#include "threadpool.h"
#include "util.h"

enum role { R_WEIGHT, R_EMBD, R_OUTPUT, R_VEC, R_ROUTER, R_CONV };

struct qentry {
    char name[PXQ_NAME_MAX];
    const struct pxq_tensor **src; /* [n_src] */
    int n_src;
    int n_dims;
    int64_t ne[PXQ_MAX_DIMS];      /* ne[0] = n_in, ne[1] = n_out, ne[2] = n_src when stacked */
    enum role role;
    enum pxq_type type;
    int *row_perm;                 /* output row r is source row row_perm[r] (1-D: elements), or NULL */
    int *col_perm;                 /* output column i is source column col_perm[i], or NULL */
    float add;                     /* added to every source value first (Qwen3.5 norms: 1 + w) */
    int neg_exp;                   /* value -> -exp(value) (Qwen3.5 A_log -> A) */
    float *col, *row;              /* [n_src][ne0], [n_src][ne1] in source order, or NULL */
    int *site;                     /* [n_src] calibration site of the input, or -1 */
};

struct qjob {
    const struct quantize_params *p;
    struct pxq_model *m;
    const struct pxq_hparams *hp;
    struct qentry *e;
    int n_e, cap_e;
    struct calib cal;
    struct threadpool *tp;
    char calib_sha[65];
    int calib_n_seq, calib_seq_len;
};

struct quantize_params quantize_default_params(void) {
    struct quantize_params p = {0};
    p.wtype = PXQ_TYPE_Q4_0;
    p.embd_type = p.output_type = PXQ_TYPE_COUNT;
    p.group_size = 32;
    p.method = QUANT_RTN;
    p.calib_size = 128;
    p.calib_seq_len = 512;
    return p;
}

int quantize_pick_type(const char *dtype, int group_size, int sym, enum pxq_type *out, char *err, size_t errlen) {
    int bits = !strcmp(dtype, "int4") ? 4 : !strcmp(dtype, "int8") ? 8 : 0;
    if (!bits) return set_err(err, errlen, "unsupported dtype '%s' (supported: int4, int8, or q4_0, q4_1, q8_0)", dtype);
    if (group_size != 32)
        return set_err(err, errlen, "%s with group size %d: no GGUF type (Q4_0/Q4_1/Q8_0 use groups of 32; other sizes would need a type of PXQ's own)",
                       dtype, group_size);
    if (bits == 8 && !sym) return set_err(err, errlen, "int8 --asym: no GGUF weight type (ggml's Q8_1 is an activation type); use --sym (Q8_0)");
    *out = bits == 8 ? PXQ_TYPE_Q8_0 : sym ? PXQ_TYPE_Q4_0 : PXQ_TYPE_Q4_1;
    return 0;
}

/* ---- the tensor list ---- */

static struct qentry *add_entry(struct qjob *j, const char *name, enum role role, int n_src) {
    if (j->n_e == j->cap_e) {
        j->cap_e = j->cap_e ? 2 * j->cap_e : 128;
        j->e = xrealloc(j->e, (size_t)j->cap_e * sizeof *j->e);
    }
    struct qentry *q = &j->e[j->n_e++];
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", name);
    q->role = role;
    q->n_src = n_src;
    q->src = xcalloc((size_t)n_src, sizeof *q->src);
    q->site = xmalloc((size_t)n_src * sizeof *q->site);
    for (int k = 0; k < n_src; k++) q->site[k] = -1;
    return q;
}

/* One tensor (2-D weight, or a vector; a conv [kernel, 1, channels] is squeezed to 2-D). */
static struct qentry *add_one(struct qjob *j, const char *name, enum role role, const struct pxq_tensor *t) {
    if (!t) return NULL;
    struct qentry *q = add_entry(j, name, role, 1);
    q->src[0] = t;
    int64_t n = tensor_nelements(t);
    q->n_dims = (t->ne[1] == 1 && t->ne[2] == 1) || role == R_VEC ? 1 : 2;
    q->ne[0] = q->n_dims == 1 ? n : t->ne[0];
    q->ne[1] = q->n_dims == 1 ? 1 : n / t->ne[0];
    q->ne[2] = q->ne[3] = 1;
    return q;
}

static struct qentry *find_entry(struct qjob *j, const char *name) {
    for (int i = 0; i < j->n_e; i++)
        if (!strcmp(j->e[i].name, name)) return &j->e[i];
    return NULL;
}

static struct qentry *lentry(struct qjob *j, int il, const char *suffix) {
    char n[PXQ_NAME_MAX];
    snprintf(n, sizeof n, "blk.%d.%s", il, suffix);
    return find_entry(j, n);
}

/* Per-layer tensors by their GGUF names (llama.cpp's gguf-py tensor names). */
static const struct {
    size_t off;
    const char *name;
    enum role role;
} layer_fields[] = {
    {offsetof(struct pxq_layer, attn_norm), "attn_norm.weight", R_VEC},
    {offsetof(struct pxq_layer, attn_q), "attn_q.weight", R_WEIGHT},
    {offsetof(struct pxq_layer, attn_k), "attn_k.weight", R_WEIGHT},
    {offsetof(struct pxq_layer, attn_v), "attn_v.weight", R_WEIGHT},
    {offsetof(struct pxq_layer, attn_q_b), "attn_q.bias", R_VEC},
    {offsetof(struct pxq_layer, attn_k_b), "attn_k.bias", R_VEC},
    {offsetof(struct pxq_layer, attn_v_b), "attn_v.bias", R_VEC},
    {offsetof(struct pxq_layer, attn_q_norm), "attn_q_norm.weight", R_VEC},
    {offsetof(struct pxq_layer, attn_k_norm), "attn_k_norm.weight", R_VEC},
    {offsetof(struct pxq_layer, attn_output), "attn_output.weight", R_WEIGHT},
    {offsetof(struct pxq_layer, ffn_norm), "ffn_norm.weight", R_VEC},
    {offsetof(struct pxq_layer, ffn_gate_inp), "ffn_gate_inp.weight", R_ROUTER},
    {offsetof(struct pxq_layer, ffn_gate), "ffn_gate.weight", R_WEIGHT},
    {offsetof(struct pxq_layer, ffn_up), "ffn_up.weight", R_WEIGHT},
    {offsetof(struct pxq_layer, ffn_down), "ffn_down.weight", R_WEIGHT},
    /* Qwen3.5 Gated DeltaNet */
    {offsetof(struct pxq_layer, attn_qkv), "attn_qkv.weight", R_WEIGHT},
    {offsetof(struct pxq_layer, attn_gate), "attn_gate.weight", R_WEIGHT},
    {offsetof(struct pxq_layer, ssm_beta), "ssm_beta.weight", R_WEIGHT},
    {offsetof(struct pxq_layer, ssm_alpha), "ssm_alpha.weight", R_WEIGHT},
    {offsetof(struct pxq_layer, ssm_conv1d), "ssm_conv1d.weight", R_CONV},
    {offsetof(struct pxq_layer, ssm_dt), "ssm_dt.bias", R_VEC},
    {offsetof(struct pxq_layer, ssm_a), "ssm_a", R_VEC},
    {offsetof(struct pxq_layer, ssm_norm), "ssm_norm.weight", R_VEC},
    {offsetof(struct pxq_layer, ssm_out), "ssm_out.weight", R_WEIGHT},
};

static void add_experts(struct qjob *j, int il, const struct pxq_layer *L) {
    static const struct { const char *name; size_t off; } ex[] = {
        {"ffn_gate_exps.weight", offsetof(struct pxq_expert, gate)},
        {"ffn_up_exps.weight", offsetof(struct pxq_expert, up)},
        {"ffn_down_exps.weight", offsetof(struct pxq_expert, down)},
    };
    const int ne = j->hp->n_expert;
    for (size_t f = 0; f < 3; f++) {
        char n[PXQ_NAME_MAX];
        snprintf(n, sizeof n, "blk.%d.%s", il, ex[f].name);
        struct qentry *q = add_entry(j, n, R_WEIGHT, ne);
        for (int x = 0; x < ne; x++) q->src[x] = *(const struct pxq_tensor *const *)((const char *)&L->experts[x] + ex[f].off);
        q->n_dims = 3;
        q->ne[0] = q->src[0]->ne[0];
        q->ne[1] = q->src[0]->ne[1];
        q->ne[2] = ne;
        q->ne[3] = 1;
    }
}

static int *llama_qk_perm(int64_t rows, int n_head);
static int *qwen35_v_perm(const struct pxq_hparams *hp, int64_t n, int64_t first, int64_t block);

/* Qwen3.5 from HF to llama.cpp's layout (model_qwen35.c lists the differences): RMSNorm weights
 * 1 + w (not the DeltaNet's gated norm), A = -exp(A_log), value heads reordered in every tensor
 * indexed by them. */
static void qwen35_fixup(struct qjob *j, const struct pxq_layer *L, const struct pxq_tensor *t, struct qentry *q) {
    const struct pxq_hparams *hp = j->hp;
    const int64_t key_dim = (int64_t)hp->ssm_n_k_head * hp->ssm_head_k_dim, vd = hp->ssm_head_v_dim;
    if (t == L->attn_norm || t == L->ffn_norm || t == L->attn_q_norm || t == L->attn_k_norm) q->add = hp->norm_w_offset;
    if (t == L->ssm_a) q->neg_exp = hp->ssm_a_is_log;
    if (hp->ssm_v_tiled) return; /* already in GGUF order */
    if (t == L->attn_qkv || t == L->ssm_conv1d) q->row_perm = qwen35_v_perm(hp, q->ne[1], 2 * key_dim, vd);
    if (t == L->attn_gate) q->row_perm = qwen35_v_perm(hp, q->ne[1], 0, vd);
    if (t == L->ssm_beta || t == L->ssm_alpha) q->row_perm = qwen35_v_perm(hp, q->ne[1], 0, 1);
    if (t == L->ssm_dt || t == L->ssm_a) q->row_perm = qwen35_v_perm(hp, q->ne[0], 0, 1);
    if (t == L->ssm_out) q->col_perm = qwen35_v_perm(hp, q->ne[0], 0, vd);
    if (t == L->ssm_conv1d) q->role = R_CONV;
}

/* The MTP head's own tensors on its first layer (llama.cpp's nextn names; model_qwen35.c binds them). */
static void add_nextn(struct qjob *j, int il, const struct pxq_layer *L) {
    const struct { const char *name; const struct pxq_tensor *t; int role; } nx[] = {
        {"nextn.eh_proj.weight", L->nextn_eh_proj, R_WEIGHT},
        {"nextn.enorm.weight", L->nextn_enorm, R_VEC},
        {"nextn.hnorm.weight", L->nextn_hnorm, R_VEC},
        {"nextn.shared_head_norm.weight", L->nextn_shared_head_norm, R_VEC},
    };
    for (size_t i = 0; i < sizeof nx / sizeof nx[0]; i++) {
        char n[PXQ_NAME_MAX];
        snprintf(n, sizeof n, "blk.%d.%s", il, nx[i].name);
        struct qentry *q = add_one(j, n, nx[i].role, nx[i].t);
        if (q && nx[i].role == R_VEC) q->add = j->hp->norm_w_offset; /* RMSNorm weights: 1 + w, as the layers' */
    }
}

static int build_entries(struct qjob *j, char *err, size_t errlen) {
    const struct pxq_hparams *hp = j->hp;
    add_one(j, "token_embd.weight", hp->tie_embd ? R_OUTPUT : R_EMBD, model_token_embd(j->m));
    for (int il = 0; il < hp->n_layer + hp->n_mtp_layer; il++) { /* the MTP layers (Qwen3.5) follow the model's */
        const struct pxq_layer *L = model_layer(j->m, il);
        for (size_t f = 0; f < sizeof layer_fields / sizeof layer_fields[0]; f++) {
            const struct pxq_tensor *t = *(const struct pxq_tensor *const *)((const char *)L + layer_fields[f].off);
            char n[PXQ_NAME_MAX];
            snprintf(n, sizeof n, "blk.%d.%s", il, layer_fields[f].name);
            if (hp->arch == ARCH_QWEN35 && t == L->ffn_norm) snprintf(n, sizeof n, "blk.%d.post_attention_norm.weight", il);
            struct qentry *q = add_one(j, n, layer_fields[f].role, t);
            if (!q) continue;
            const int64_t rows = q->n_dims == 1 ? q->ne[0] : q->ne[1];
            if (hp->arch == ARCH_LLAMA && (t == L->attn_q || t == L->attn_q_b)) q->row_perm = llama_qk_perm(rows, hp->n_head);
            if (hp->arch == ARCH_LLAMA && (t == L->attn_k || t == L->attn_k_b)) q->row_perm = llama_qk_perm(rows, hp->n_head_kv);
            if (hp->arch == ARCH_QWEN35) qwen35_fixup(j, L, t, q);
        }
        if (L->experts) add_experts(j, il, L);
        if (il == hp->n_layer) add_nextn(j, il, L);
    }
    struct qentry *on = add_one(j, "output_norm.weight", R_VEC, model_output_norm(j->m));
    if (hp->arch == ARCH_QWEN35) on->add = hp->norm_w_offset;
    if (!hp->tie_embd) add_one(j, "output.weight", R_OUTPUT, model_output(j->m));
    for (int i = 0; i < j->n_e; i++) {
        struct qentry *q = &j->e[i];
        q->col = xmalloc((size_t)(q->n_src * q->ne[0]) * sizeof *q->col);
        for (int64_t k = 0; k < q->n_src * q->ne[0]; k++) q->col[k] = 1;
        if (q->n_dims >= 2) {
            q->row = xmalloc((size_t)(q->n_src * q->ne[1]) * sizeof *q->row);
            for (int64_t k = 0; k < q->n_src * q->ne[1]; k++) q->row[k] = 1;
        }
    }
    return 0;
}

/* Type policy: vectors (norms, biases), the MoE router and convolutions stay F32; --keep-f16
 * matches and tensors too small or with rows not a multiple of 32 are F16; the embedding and the
 * lm_head get their own types (the lm_head dominates small models); the rest get the weight type. */
static enum pxq_type tensor_policy(const struct qjob *j, const struct qentry *q) {
    const struct quantize_params *p = j->p;
    if (q->role == R_VEC || q->role == R_ROUTER || q->role == R_CONV || q->n_dims == 1) return PXQ_TYPE_F32;
    for (int k = 0; k < p->n_keep_f16; k++)
        if (fnmatch(p->keep_f16[k], q->name, 0) == 0) return PXQ_TYPE_F16;
    enum pxq_type t = p->wtype;
    if (q->role == R_OUTPUT) t = p->output_type != PXQ_TYPE_COUNT ? p->output_type : PXQ_TYPE_Q8_0;
    if (q->role == R_EMBD) t = p->embd_type != PXQ_TYPE_COUNT ? p->embd_type : p->wtype;
    if (type_block_elems(t) > 1 && (q->ne[0] % type_block_elems(t) != 0 || q->ne[0] * q->ne[1] < 4096)) return PXQ_TYPE_F16;
    return t;
}

/* Slice k of entry q as float32 [ne1][ne0]: source values, + add, -exp if neg_exp, times the row
 * and column scales (source order), then the row and column permutations of the GGUF layout. */
static void load_slice(const struct qentry *q, int k, float *out) {
    const struct pxq_tensor *t = q->src[k];
    const int64_t n0 = q->ne[0], n1 = q->n_dims == 1 ? 1 : q->ne[1];
    const size_t rb = type_row_bytes(t->type, t->ne[0]);
    const int64_t nrows = tensor_nelements(t) / t->ne[0];
    for (int64_t r = 0; r < nrows; r++) dequantize_row(t->type, (const char *)t->data + (size_t)r * rb, out + r * t->ne[0], t->ne[0]);
    const float *col = q->col + (size_t)k * (size_t)n0, *row = q->row ? q->row + (size_t)k * (size_t)n1 : NULL;
    for (int64_t r = 0; r < n1; r++)
        for (int64_t i = 0; i < n0; i++) {
            float v = out[r * n0 + i] + q->add;
            if (q->neg_exp) v = -expf(v);
            out[r * n0 + i] = v * col[i] * (row ? row[r] : 1.0f);
        }
    if (q->row_perm || q->col_perm) {
        const int64_t rows = q->n_dims == 1 ? n0 : n1, width = q->n_dims == 1 ? 1 : n0;
        float *tmp = xmalloc((size_t)(rows * width) * sizeof *tmp);
        memcpy(tmp, out, (size_t)(rows * width) * sizeof *tmp);
        for (int64_t r = 0; r < rows; r++) {
            const float *src = tmp + (q->row_perm ? q->row_perm[r] : r) * width;
            for (int64_t i = 0; i < width; i++) out[r * width + i] = src[q->col_perm ? q->col_perm[i] : i];
        }
        free(tmp);
    }
}

/* llama: convert_hf_to_gguf.py LlamaModel.permute, row h*hd + j*hd/2 + i goes to h*hd + 2i + j. */
static int *llama_qk_perm(int64_t rows, int n_head) {
    int *p = xmalloc((size_t)rows * sizeof *p);
    const int64_t hd = rows / n_head;
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t j = 0; j < 2; j++)
            for (int64_t i = 0; i < hd / 2; i++) p[h * hd + 2 * i + j] = (int)(h * hd + j * (hd / 2) + i);
    return p;
}

/* Qwen3.5 value heads (see model_qwen35.c): GGUF head h' = j * n_k + kh holds HF head kh * r + j
 * (r = n_v / n_k), so that GGUF value head h' reads key head h' % n_k. Over `n` indices made of
 * `first` leading ones left alone, then n_v blocks of `block`. */
static int *qwen35_v_perm(const struct pxq_hparams *hp, int64_t n, int64_t first, int64_t block) {
    int *p = xmalloc((size_t)n * sizeof *p);
    const int nk = hp->ssm_n_k_head, nv = hp->ssm_n_v_head, r = nv / nk;
    for (int64_t i = 0; i < n; i++) p[i] = (int)i;
    for (int hn = 0; hn < nv; hn++) {
        int j = hn / nk, kh = hn % nk, ho = kh * r + j;
        for (int64_t b = 0; b < block; b++) p[first + hn * block + b] = (int)(first + ho * block + b);
    }
    return p;
}

/* ---- calibration and AWQ ---- */

static int is_calibrated(enum quant_method m) { return m != QUANT_RTN; }
static int uses_awq(enum quant_method m) { return m == QUANT_AWQ || m == QUANT_AWQ_GPTQ; }
static int uses_gptq(enum quant_method m) { return m == QUANT_GPTQ || m == QUANT_AWQ_GPTQ; }

/* Register the input sites: q/k/v share one (leader q), gate/up share one (leader gate), each
 * MoE expert's gate/up and down have their own, the router sees the whole MoE input. */
static void plan_sites(struct qjob *j) {
    for (int il = 0; il < j->hp->n_layer; il++) {
        const struct pxq_layer *L = model_layer(j->m, il);
        struct qentry *q;
#define SITE(suffix, leader, k)                                                       \
    if ((q = lentry(j, il, suffix)) != NULL && (leader)) q->site[k] = calib_add_site(&j->cal, (leader));
        SITE("attn_q.weight", L->attn_q, 0);
        SITE("attn_k.weight", L->attn_q, 0);
        SITE("attn_v.weight", L->attn_q, 0);
        SITE("attn_output.weight", L->attn_output, 0);
        SITE("ffn_gate.weight", L->ffn_gate, 0);
        SITE("ffn_up.weight", L->ffn_gate, 0);
        SITE("ffn_down.weight", L->ffn_down, 0);
        SITE("ffn_gate_inp.weight", L->ffn_gate_inp, 0);
        SITE("attn_qkv.weight", L->attn_qkv, 0); /* Qwen3.5 DeltaNet: qkv, z, b, a read one input */
        SITE("attn_gate.weight", L->attn_qkv, 0);
        SITE("ssm_beta.weight", L->attn_qkv, 0);
        SITE("ssm_alpha.weight", L->attn_qkv, 0);
        SITE("ssm_out.weight", L->ssm_out, 0);
        for (int x = 0; L->experts && x < j->hp->n_expert; x++) {
            SITE("ffn_gate_exps.weight", L->experts[x].gate, x);
            SITE("ffn_up_exps.weight", L->experts[x].gate, x);
            SITE("ffn_down_exps.weight", L->experts[x].down, x);
        }
#undef SITE
    }
}

static float *site_H_f32(const struct calib_site *s) {
    float *H = xmalloc((size_t)(s->n_in * s->n_in) * sizeof *H);
    for (int64_t i = 0; i < s->n_in * s->n_in; i++) H[i] = (float)s->H[i];
    return H;
}

struct fold {
    struct qentry *e;
    int k;      /* slice */
    int kind;   /* 0: col *= 1/s (norm vector); 1: rows *= 1/s (through the tie map); 2: vector elems *= 1/s (tie map);
                   3: col *= s (an unquantized reader of the same input: the MoE router) */
};

/* One AWQ group: members (entry slices that read the input), the site of mean |x|, and the folds
 * that undo s where the input is produced. tie_hd > 0: the input is attention output, channel
 * c = h*hd + d comes from v row (h / tie_group)*hd + d, so s is tied over the q heads sharing a kv
 * head (mean |x| averaged over them) and folds of kind 1/2 index v rows. */
static void awq_group(struct qjob *j, struct qentry **mem, const int *mem_k, int n_mem, int stat_site, struct fold *folds,
                      int n_folds, int tie_hd, int tie_group, double *sum0, double *sum1) {
    const struct calib_site *S = &j->cal.sites[stat_site];
    if (S->n_tok == 0) return;
    const int64_t n = S->n_in;
    float *am = xmalloc((size_t)n * sizeof *am), *s = xmalloc((size_t)n * sizeof *s);
    for (int64_t i = 0; i < n; i++) am[i] = (float)(S->abs_sum[i] / (double)S->n_tok);
    if (tie_hd) {
        const int64_t n_kv_rows = n / tie_group;
        for (int64_t r = 0; r < n_kv_rows; r++) {
            int64_t kvh = r / tie_hd, d = r % tie_hd;
            double acc = 0;
            for (int g = 0; g < tie_group; g++) acc += am[(kvh * tie_group + g) * tie_hd + d];
            for (int g = 0; g < tie_group; g++) am[(kvh * tie_group + g) * tie_hd + d] = (float)(acc / tie_group);
        }
    }
    struct awq_member *m = xcalloc((size_t)n_mem, sizeof *m);
    for (int i = 0; i < n_mem; i++) {
        struct qentry *q = mem[i];
        const struct calib_site *ms = &j->cal.sites[q->site[mem_k[i]]];
        float *W = xmalloc((size_t)(q->ne[0] * q->ne[1]) * sizeof *W);
        load_slice(q, mem_k[i], W);
        m[i].W = W;
        m[i].n_out = q->ne[1];
        m[i].H = ms->n_tok ? site_H_f32(ms) : NULL;
        if (!m[i].H) m[i].n_out = 0; /* never reached by a token (an idle expert): no say in s */
    }
    double e0 = 0, e1 = 0;
    awq_search(j->p->wtype, m, n_mem, n, am, 20, s, &e0, &e1, j->tp);
    *sum0 += e0;
    *sum1 += e1;
    for (int i = 0; i < n_mem; i++) {
        float *col = mem[i]->col + (size_t)mem_k[i] * (size_t)n;
        for (int64_t c = 0; c < n; c++) col[c] *= s[c];
        free((void *)m[i].W);
        free((void *)m[i].H);
    }
    for (int f = 0; f < n_folds; f++) {
        struct qentry *q = folds[f].e;
        if (!q) continue;
        if (folds[f].kind == 0 || folds[f].kind == 3) {
            float *col = q->col + (size_t)folds[f].k * (size_t)q->ne[0];
            for (int64_t c = 0; c < n; c++) col[c] *= folds[f].kind == 0 ? 1.0f / s[c] : s[c];
        } else { /* rows (or vector elements) of the producer; with a tie, v row r <- channel (r/hd * group) * hd + r % hd */
            float *v = folds[f].kind == 1 ? q->row + (size_t)folds[f].k * (size_t)q->ne[1] : q->col + (size_t)folds[f].k * (size_t)q->ne[0];
            int64_t rows = folds[f].kind == 1 ? q->ne[1] : q->ne[0];
            for (int64_t r = 0; r < rows; r++) {
                int64_t c = tie_hd ? (r / tie_hd) * tie_group * tie_hd + r % tie_hd : r;
                v[r] /= s[c];
            }
        }
    }
    free(m);
    free(am);
    free(s);
}

/* AWQ over every layer: q/k/v (fold: attn_norm), o_proj (fold: v rows and bias, tied over GQA
 * groups), gate/up (fold: ffn_norm; MoE: all experts share s, the router's columns take s), and
 * down_proj (fold: up_proj rows), as AutoAWQ's Qwen recipe. */
static void run_awq(struct qjob *j) {
    const struct pxq_hparams *hp = j->hp;
    double e0 = 0, e1 = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        struct qentry *q = lentry(j, il, "attn_q.weight"), *k = lentry(j, il, "attn_k.weight"), *v = lentry(j, il, "attn_v.weight");
        struct qentry *o = lentry(j, il, "attn_output.weight"), *vb = lentry(j, il, "attn_v.bias");
        if (q && k && v && q->site[0] >= 0) {
            struct qentry *mem[3] = {q, k, v};
            int mk[3] = {0, 0, 0};
            struct fold f[1] = {{lentry(j, il, "attn_norm.weight"), 0, 0}};
            awq_group(j, mem, mk, 3, q->site[0], f, 1, 0, 1, &e0, &e1);
        }
        if (o && v && o->site[0] >= 0) {
            struct qentry *mem[1] = {o};
            int mk[1] = {0};
            struct fold f[2] = {{v, 0, 1}, {vb, 0, 2}};
            awq_group(j, mem, mk, 1, o->site[0], f, 2, hp->head_dim, hp->n_head / hp->n_head_kv, &e0, &e1);
        }
        struct qentry *qkv = lentry(j, il, "attn_qkv.weight"), *z = lentry(j, il, "attn_gate.weight");
        if (qkv && z && qkv->site[0] >= 0) { /* DeltaNet input; b and a (kept F16) only take s exactly */
            struct qentry *mem[2] = {qkv, z};
            int mk[2] = {0, 0};
            struct fold f[3] = {{lentry(j, il, "attn_norm.weight"), 0, 0}, {lentry(j, il, "ssm_beta.weight"), 0, 3},
                                {lentry(j, il, "ssm_alpha.weight"), 0, 3}};
            awq_group(j, mem, mk, 2, qkv->site[0], f, 3, 0, 1, &e0, &e1);
        }
        struct qentry *g = lentry(j, il, "ffn_gate.weight"), *u = lentry(j, il, "ffn_up.weight"), *d = lentry(j, il, "ffn_down.weight");
        if (g && u && g->site[0] >= 0) {
            struct qentry *mem[2] = {g, u};
            int mk[2] = {0, 0};
            struct fold f[1] = {{lentry(j, il, hp->arch == ARCH_QWEN35 ? "post_attention_norm.weight" : "ffn_norm.weight"), 0, 0}};
            awq_group(j, mem, mk, 2, g->site[0], f, 1, 0, 1, &e0, &e1);
        }
        if (d && u && d->site[0] >= 0) {
            struct qentry *mem[1] = {d};
            int mk[1] = {0};
            struct fold f[1] = {{u, 0, 1}};
            awq_group(j, mem, mk, 1, d->site[0], f, 1, 0, 1, &e0, &e1);
        }
        struct qentry *ge = lentry(j, il, "ffn_gate_exps.weight"), *ue = lentry(j, il, "ffn_up_exps.weight");
        struct qentry *de = lentry(j, il, "ffn_down_exps.weight"), *router = lentry(j, il, "ffn_gate_inp.weight");
        if (ge && ue && de && router && router->site[0] >= 0) {
            const int ne = hp->n_expert;
            struct qentry **mem = xmalloc((size_t)2 * ne * sizeof *mem);
            int *mk = xmalloc((size_t)2 * ne * sizeof *mk);
            for (int x = 0; x < ne; x++) mem[2 * x] = ge, mem[2 * x + 1] = ue, mk[2 * x] = mk[2 * x + 1] = x;
            struct fold f[2] = {{lentry(j, il, "ffn_norm.weight"), 0, 0}, {router, 0, 3}};
            awq_group(j, mem, mk, 2 * ne, router->site[0], f, 2, 0, 1, &e0, &e1);
            for (int x = 0; x < ne; x++) {
                struct qentry *dm[1] = {de};
                int dk[1] = {x};
                struct fold fu[1] = {{ue, x, 1}};
                awq_group(j, dm, dk, 1, de->site[x], fu, 1, 0, 1, &e0, &e1);
            }
            free(mem), free(mk);
        }
    }
    if (!j->p->quiet)
        fprintf(stderr, "pxq quantize: AWQ scales: layer output error %.4g -> %.4g (%.1f%% of RTN's)\n", e0, e1,
                e0 > 0 ? 100.0 * e1 / e0 : 100.0);
}

/* ---- writing ---- */

static volatile sig_atomic_t g_have_tmp;
static char g_tmp[4096];

static void on_signal(int sig) {
    if (g_have_tmp) unlink(g_tmp);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void progress_bar(const struct quantize_params *p, int i, int n, const char *name, enum pxq_type t) {
    if (!p->progress) return;
    int w = 30, fill = n ? (int)((long)w * i / n) : w;
    fprintf(stderr, "\r[%3d/%3d] [", i, n);
    for (int k = 0; k < w; k++) fputc(k < fill ? '#' : ' ', stderr);
    fprintf(stderr, "] %-5s %-40.40s", type_name(t), name);
    if (i == n) fputc('\n', stderr);
    fflush(stderr);
}

static void calib_progress(void *ctx, int done, int total) {
    const struct quantize_params *p = ctx;
    if (p->progress) fprintf(stderr, "\rcalibrating: %d/%d sequences%s", done, total, done == total ? "\n" : "");
}

/* The data of entry q in its type: converted, RTN, or GPTQ with the site's H under the entry's
 * column scales (H' = diag(1/c) H diag(1/c): the input of W diag(c) is x / c). */
static void *entry_data(struct qjob *j, struct qentry *q, size_t *nbytes) {
    const int64_t n0 = q->ne[0], n1 = q->n_dims == 1 ? 1 : q->ne[1];
    const size_t rb = type_row_bytes(q->type, n0), slice = rb * (size_t)n1;
    uint8_t *out = xmalloc(slice * (size_t)q->n_src);
    float *W = xmalloc((size_t)(n0 * n1) * sizeof *W);
    for (int k = 0; k < q->n_src; k++) {
        load_slice(q, k, W);
        uint8_t *o = out + slice * (size_t)k;
        int s = q->site[k];
        int quantized = type_block_elems(q->type) > 1;
        if (quantized && uses_gptq(j->p->method) && s >= 0 && j->cal.sites[s].n_tok > 0) {
            const struct calib_site *S = &j->cal.sites[s];
            double *H = xmalloc((size_t)(n0 * n0) * sizeof *H);
            const float *c = q->col + (size_t)k * (size_t)n0;
            const int *cp = q->col_perm; /* H in the written column order */
            for (int64_t a = 0; a < n0; a++)
                for (int64_t b = 0; b < n0; b++) {
                    int64_t pa = cp ? cp[a] : a, pb = cp ? cp[b] : b;
                    H[a * n0 + b] = S->H[pa * n0 + pb] / ((double)c[pa] * c[pb]);
                }
            int rc = gptq_quantize(q->type, W, n1, n0, H, 0.01, j->p->act_order, o, j->tp);
            free(H);
            if (rc == 0) continue;
            load_slice(q, k, W); /* not positive definite even damped: RTN */
        }
        if (quantized)
            rtn_quantize(q->type, W, n1, n0, o, NULL);
        else
            for (int64_t r = 0; r < n1; r++) quantize_row(q->type, W + r * n0, o + (size_t)r * rb, n0);
    }
    free(W);
    *nbytes = slice * (size_t)q->n_src;
    return out;
}

static const char *method_name(enum quant_method m) {
    return m == QUANT_RTN ? "rtn" : m == QUANT_AWQ ? "awq" : m == QUANT_GPTQ ? "gptq" : "awq+gptq";
}

static int write_file(struct qjob *j, int fd, const char *tmp, char *err, size_t errlen) {
    const struct quantize_params *p = j->p;
    struct gguf_writer *w = gguf_w_new();
    int rc = -1;
    uint32_t ftype = p->wtype == PXQ_TYPE_Q4_0 ? 2 : p->wtype == PXQ_TYPE_Q4_1 ? 3 : 7; /* LLAMA_FTYPE_MOSTLY_* */
    if (quantize_put_meta(w, j->hp, p->model_dir, ftype, err, errlen) != 0) goto out;
    gguf_w_str(w, "pxq.quantize.method", method_name(p->method));
    gguf_w_str(w, "pxq.quantize.dtype", p->wtype == PXQ_TYPE_Q8_0 ? "int8" : "int4");
    gguf_w_bool(w, "pxq.quantize.sym", p->wtype != PXQ_TYPE_Q4_1);
    gguf_w_u32(w, "pxq.quantize.group_size", (uint32_t)p->group_size);
    if (is_calibrated(p->method)) {
        const char *base = strrchr(p->calib_file, '/');
        gguf_w_str(w, "pxq.quantize.calib_file", base ? base + 1 : p->calib_file);
        gguf_w_str(w, "pxq.quantize.calib_sha256", j->calib_sha);
        gguf_w_u32(w, "pxq.quantize.calib_size", (uint32_t)j->calib_n_seq);
        gguf_w_u32(w, "pxq.quantize.calib_seq_len", (uint32_t)j->calib_seq_len);
        if (uses_gptq(p->method)) {
            gguf_w_f32(w, "pxq.quantize.gptq_damp", 0.01f);
            gguf_w_bool(w, "pxq.quantize.gptq_act_order", p->act_order);
        }
    }
    for (int i = 0; i < j->n_e; i++)
        if (gguf_w_add_tensor(w, j->e[i].name, j->e[i].type, j->e[i].n_dims, j->e[i].ne, err, errlen) < 0) goto out;
    if (gguf_w_write_header(w, fd, tmp, err, errlen) != 0) goto out;
    for (int i = 0; i < j->n_e; i++) {
        progress_bar(p, i, j->n_e, j->e[i].name, j->e[i].type);
        size_t nb;
        void *d = entry_data(j, &j->e[i], &nb);
        int wr = gguf_w_write_tensor(w, i, d, nb, err, errlen);
        free(d);
        if (wr != 0) goto out;
    }
    progress_bar(p, j->n_e, j->n_e, "done", p->wtype);
    rc = gguf_w_finish(w, err, errlen);
out:
    gguf_w_free(w);
    return rc;
}

/* The output path must not name a file the run reads: the rename at the end would replace it (a
 * shard, config.json, the calibration text) and the input model would be gone. Compared by device and
 * inode, so another name for the same file (a hard link, "dir/./x", a link in an HF cache snapshot)
 * is caught too. The files: the ones model_open and quantize_meta.c read from an HF directory, the
 * index and every shard its weight_map names (the loader's own rule: st_open_dir), and --calib-file.
 * Returns -1 with a message naming the file when the output is one of them; a new file in the
 * model directory, or one the loader does not read, is fine. */
static int output_is_input(const struct quantize_params *p, char *err, size_t errlen) {
    static const char *const names[] = {"config.json",    "generation_config.json", "model.safetensors.index.json",
                                        "model.safetensors", "tokenizer.json",      "tokenizer_config.json",
                                        "chat_template.jinja"};
    if (!path_exists(p->output)) return 0;
    char path[4096];
    const char *why = "the input model's";
    int hit = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !hit; i++)
        hit = path_join(path, sizeof path, p->model_dir, names[i]) == 0 && same_file(p->output, path);
    if (!hit && path_join(path, sizeof path, p->model_dir, "model.safetensors.index.json") == 0 && file_exists(path)) {
        size_t len;
        char *text = read_regular_file(path, 64u << 20, &len, NULL, 0);
        cJSON *root = text ? cJSON_ParseWithLength(text, len) : NULL;
        free(text);
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
        for (const cJSON *e = cJSON_IsObject(wm) ? wm->child : NULL; e && !hit; e = e->next)
            hit = cJSON_IsString(e) && !strchr(e->valuestring, '/') &&
                  path_join(path, sizeof path, p->model_dir, e->valuestring) == 0 && same_file(p->output, path);
        cJSON_Delete(root);
    }
    if (!hit && p->calib_file && same_file(p->output, p->calib_file)) {
        snprintf(path, sizeof path, "%s", p->calib_file);
        why = "the calibration file";
        hit = 1;
    }
    if (!hit) return 0;
    return set_err(err, errlen, "%s is the same file as %s %s: the output would replace it; give another --output path",
                   p->output, why, path);
}

static void job_free(struct qjob *j) {
    for (int i = 0; i < j->n_e; i++)
        free(j->e[i].src), free(j->e[i].site), free(j->e[i].col), free(j->e[i].row), free(j->e[i].row_perm), free(j->e[i].col_perm);
    free(j->e);
    calib_free(&j->cal);
    if (j->tp) threadpool_free(j->tp);
    if (j->m) model_free(j->m);
}

int quantize_model(const struct quantize_params *p, char *err, size_t errlen) {
    struct qjob j = {0};
    j.p = p;
    int rc = -1, fd = -1;
    if (p->wtype != PXQ_TYPE_Q4_0 && p->wtype != PXQ_TYPE_Q4_1 && p->wtype != PXQ_TYPE_Q8_0)
        return set_err(err, errlen, "weight type %s not supported (Q4_0, Q4_1, Q8_0)", type_name(p->wtype));
    if (p->group_size != 32) return set_err(err, errlen, "group size %d: no GGUF type (32 only)", p->group_size);
    if (is_calibrated(p->method) && !p->calib_file)
        return set_err(err, errlen, "method %s needs calibration text: give --calib-file FILE", method_name(p->method));
    if (!p->model_dir || !is_dir(p->model_dir)) /* a GGUF or any other file included */
        return set_err(err, errlen,
                       p->model_dir && access(p->model_dir, F_OK) == 0
                           ? "%s: a file; pxq quantize reads an HF model directory (config.json and *.safetensors)"
                           : "%s: no such model directory",
                       p->model_dir ? p->model_dir : "(none)");
    if (!p->output || !*p->output) return set_err(err, errlen, "no output path");
    char dirbuf[4096];
    snprintf(dirbuf, sizeof dirbuf, "%s", p->output);
    const char *odir = dirname(dirbuf);
    if (!is_dir(odir)) return set_err(err, errlen, "%s: output directory %s does not exist", p->output, odir);
    if (access(odir, W_OK) != 0) return set_err(err, errlen, "%s: output directory %s is not writable", p->output, odir);
    if (is_dir(p->output)) return set_err(err, errlen, "%s is a directory", p->output);
    struct stat ost; /* the rename at the end replaces what is there: only ever a regular file */
    if (lstat(p->output, &ost) == 0 && !S_ISREG(ost.st_mode))
        return set_err(err, errlen, "%s exists and is not a regular file (a link, device, pipe or socket); give a new path",
                       p->output);
    if (output_is_input(p, err, errlen) != 0) return -1;
    j.m = model_open(p->model_dir, err, errlen); /* a directory: an HF checkpoint */
    if (!j.m) return -1;
    j.hp = model_hparams(j.m);
    j.tp = threadpool_new(p->n_threads > 0 ? p->n_threads : n_cpus());
    if (build_entries(&j, err, errlen) != 0) goto out;
    for (int i = 0; i < j.n_e; i++) j.e[i].type = tensor_policy(&j, &j.e[i]);
    if (is_calibrated(p->method)) {
        int32_t *tok = NULL;
        if (calib_load(p->calib_file, model_tokenizer(j.m), p->calib_size, p->calib_seq_len, &tok, &j.calib_n_seq, &j.calib_seq_len,
                       j.calib_sha, err, errlen) != 0)
            goto out;
        /* The minimum: one full sequence of --calib-seq-len tokens. A text shorter than that is
         * calibrated on as one short sequence (calib_load), and statistics from so few tokens
         * (H = X^T X of rank at most the token count) make the AWQ scales and GPTQ updates unreliable.
         * A warning, not an error: a short text still runs (and tests use one). */
        if (j.calib_seq_len < p->calib_seq_len)
            fprintf(stderr,
                    "pxq quantize: warning: calibration file %s gives only %d tokens, fewer than one sequence of "
                    "--calib-seq-len %d; %s statistics from so few tokens are unreliable (give a longer text)\n",
                    p->calib_file, j.calib_seq_len, p->calib_seq_len, method_name(p->method));
        plan_sites(&j);
        double t0 = now_sec();
        int crc = calib_run(&j.cal, j.m, tok, j.calib_n_seq, j.calib_seq_len, p->n_threads, calib_progress, (void *)p, err, errlen);
        free(tok);
        if (crc != 0) goto out;
        if (!p->quiet)
            fprintf(stderr, "pxq quantize: calibrated on %d x %d tokens of %s in %.1f s\n", j.calib_n_seq, j.calib_seq_len, p->calib_file,
                    now_sec() - t0);
        if (uses_awq(p->method)) run_awq(&j);
    }
    /* write OUT.tmp.XXXXXX beside OUT, rename at the end; signals remove the temp file */
    if (snprintf(g_tmp, sizeof g_tmp, "%s.tmp.XXXXXX", p->output) >= (int)sizeof g_tmp) {
        set_err(err, errlen, "%s: path too long", p->output);
        goto out;
    }
    struct sigaction sa = {0}, old_int, old_term, old_hup, old_xfsz;
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);
    struct sigaction ign = {0};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &ign, &old_xfsz); /* a file-size limit: write() fails with EFBIG instead of killing us */
    fd = mkstemp(g_tmp);
    if (fd < 0) {
        set_err(err, errlen, "%s: cannot create a temporary file: %s", g_tmp, strerror(errno));
    } else {
        g_have_tmp = 1;
        fchmod(fd, 0644);
        double t0 = now_sec();
        rc = write_file(&j, fd, g_tmp, err, errlen);
        if (close(fd) != 0 && rc == 0) rc = set_err(err, errlen, "%s: close failed: %s", g_tmp, strerror(errno));
        if (rc == 0 && rename(g_tmp, p->output) != 0) rc = set_err(err, errlen, "rename %s -> %s: %s", g_tmp, p->output, strerror(errno));
        if (rc != 0) unlink(g_tmp);
        g_have_tmp = 0;
        if (rc == 0 && !p->quiet) fprintf(stderr, "pxq quantize: wrote %s in %.1f s\n", p->output, now_sec() - t0);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    sigaction(SIGXFSZ, &old_xfsz, NULL);
out:
    job_free(&j);
    return rc;
}
