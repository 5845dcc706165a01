/* model_dummy.c - random weights of a chosen type for the hparams of an HF config.json.
 *
 * Speed matters (a 32B model at Q4_0 is 18 GB): quantized blocks are written directly in their GGUF
 * layout from a PRNG (random codes and a realistic scale), never by quantizing floats, over many
 * threads. Each chunk of DUMMY_CHUNK blocks has its own PRNG stream, seeded from (seed, tensor index,
 * chunk index), so the weights depend on the seed only, not on the thread count.
 *
 * Scales: Q4_0 codes q-8 uniform in -7..7 with 0 twice as likely (mean 0) give std 4.18*d; Q8_0 codes
 * uniform in -127..127 with 0 twice as likely give std 73.5*d; Q4_K w = d*sc*q - dmin*m with
 * m*dmin = 7.5*d*sc gives std 4.61*d*sc. Each d is chosen so the std is 0.02 (FILL_LINEAR), with a
 * +-25% spread between blocks. Codes never produce
 * NaN or Inf: every scale is a finite positive f16, and no value is drawn from raw random bits.
 */
#include "model_dummy.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "quant.h"
#include "threadpool.h"
#include "util.h"

#define DUMMY_CHUNK 16384  /* blocks per PRNG stream */
#define DUMMY_STD   0.02f  /* HF initializer_range */

enum pxq_type dummy_matrix_type(enum pxq_type dtype, int64_t ne0) {
    if (ne0 % type_block_elems(dtype) == 0) return dtype;
    if (dtype == PXQ_TYPE_Q4_K && ne0 % 32 == 0) return PXQ_TYPE_Q4_0;
    return PXQ_TYPE_F16;
}

int dummy_parse_dtype(const char *s, enum pxq_type *out) {
    static const struct { const char *name; enum pxq_type t; } map[] = {
        {"q4_0", PXQ_TYPE_Q4_0}, {"q4_k", PXQ_TYPE_Q4_K}, {"q8_0", PXQ_TYPE_Q8_0}, {"f16", PXQ_TYPE_F16}};
    char low[16];
    size_t n = 0;
    for (; s[n] && n < sizeof low - 1; n++) low[n] = (char)tolower((unsigned char)s[n]);
    low[n] = 0;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (s[n] == 0 && strcmp(low, map[i].name) == 0) return *out = map[i].t, 0;
    return -1;
}

/* ---- manifest ---- */

struct mlist {
    struct dummy_tensor *t;
    int n, cap;
    enum pxq_type dtype;
};

static void add(struct mlist *l, enum dummy_fill fill, int matrix, int64_t ne0, int64_t ne1, int64_t ne2, const char *fmt, ...)
    PXQ_PRINTF(7, 8);

static void add(struct mlist *l, enum dummy_fill fill, int matrix, int64_t ne0, int64_t ne1, int64_t ne2, const char *fmt, ...) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->t = xrealloc(l->t, (size_t)l->cap * sizeof *l->t);
    }
    struct dummy_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = ne2, t->ne[3] = 1;
    t->n_dims = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
    t->type = matrix ? dummy_matrix_type(l->dtype, ne0) : PXQ_TYPE_F32;
    t->fill = fill;
}

int dummy_manifest(const struct pxq_hparams *hp, enum pxq_type dtype, struct dummy_tensor **out, char *err, size_t errlen) {
    *out = NULL;
    if (dtype != PXQ_TYPE_Q4_0 && dtype != PXQ_TYPE_Q4_K && dtype != PXQ_TYPE_Q8_0 && dtype != PXQ_TYPE_F16)
        return set_err(err, errlen, "dummy weights: unsupported type %s (use q4_0, q4_k, q8_0 or f16)", type_name(dtype));
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_layer > PXQ_MAX_LAYERS || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->head_dim <= 0 || hp->n_vocab <= 0)
        return set_err(err, errlen, "dummy weights: hidden_size, num_hidden_layers (<= %d), heads, head_dim and vocab_size must be positive",
                       PXQ_MAX_LAYERS);
    if (hp->arch == ARCH_QWEN35 && (hp->ssm_n_k_head <= 0 || hp->ssm_n_v_head <= 0 || hp->ssm_head_k_dim <= 0 ||
                                    hp->ssm_head_v_dim <= 0 || hp->ssm_conv_kernel <= 0))
        return set_err(err, errlen, "dummy weights: qwen3_5 needs positive linear_* head counts, dims and conv kernel");
    if (hp->n_expert > 0 && (hp->n_ff_exp <= 0 || hp->n_expert_used <= 0))
        return set_err(err, errlen, "dummy weights: MoE needs positive moe_intermediate_size and num_experts_per_tok");
    struct mlist l = {0};
    l.dtype = dtype;
    const int64_t E = hp->n_embd, q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    add(&l, FILL_LINEAR, 1, E, hp->n_vocab, 1, "token_embd.weight");
    add(&l, FILL_NORM, 0, E, 1, 1, "output_norm.weight");
    if (!hp->tie_embd) add(&l, FILL_LINEAR, 1, E, hp->n_vocab, 1, "output.weight");
    for (int il = 0; il < hp->n_layer; il++) {
        add(&l, FILL_NORM, 0, E, 1, 1, "blk.%d.attn_norm.weight", il);
        if (hp->arch == ARCH_QWEN35 && hp->layer_kind[il] == LAYER_DELTANET) {
            /* HF Qwen3_5GatedDeltaNet: in_proj_qkv [conv_dim], in_proj_z [value_dim], in_proj_b/a [n_v_head] */
            const int64_t key_dim = (int64_t)hp->ssm_n_k_head * hp->ssm_head_k_dim;
            const int64_t val_dim = (int64_t)hp->ssm_n_v_head * hp->ssm_head_v_dim;
            const int64_t conv_dim = 2 * key_dim + val_dim;
            add(&l, FILL_LINEAR, 1, E, conv_dim, 1, "blk.%d.attn_qkv.weight", il);
            add(&l, FILL_LINEAR, 1, E, val_dim, 1, "blk.%d.attn_gate.weight", il);
            add(&l, FILL_LINEAR, 1, E, hp->ssm_n_v_head, 1, "blk.%d.ssm_beta.weight", il);
            add(&l, FILL_LINEAR, 1, E, hp->ssm_n_v_head, 1, "blk.%d.ssm_alpha.weight", il);
            add(&l, FILL_CONV, 0, hp->ssm_conv_kernel, conv_dim, 1, "blk.%d.ssm_conv1d.weight", il);
            add(&l, FILL_DT_BIAS, 0, hp->ssm_n_v_head, 1, 1, "blk.%d.ssm_dt.bias", il);
            add(&l, FILL_SSM_A, 0, hp->ssm_n_v_head, 1, 1, "blk.%d.ssm_a", il);
            add(&l, FILL_NORM, 0, hp->ssm_head_v_dim, 1, 1, "blk.%d.ssm_norm.weight", il);
            add(&l, FILL_LINEAR, 1, val_dim, E, 1, "blk.%d.ssm_out.weight", il);
        } else {
            const int64_t q_out = q_dim * (hp->attn_output_gate ? 2 : 1); /* qwen35: query and gate per head */
            add(&l, FILL_LINEAR, 1, E, q_out, 1, "blk.%d.attn_q.weight", il);
            add(&l, FILL_LINEAR, 1, E, kv_dim, 1, "blk.%d.attn_k.weight", il);
            add(&l, FILL_LINEAR, 1, E, kv_dim, 1, "blk.%d.attn_v.weight", il);
            add(&l, FILL_LINEAR, 1, q_dim, E, 1, "blk.%d.attn_output.weight", il);
            if (hp->has_qkv_bias) {
                add(&l, FILL_LINEAR, 0, q_dim, 1, 1, "blk.%d.attn_q.bias", il);
                add(&l, FILL_LINEAR, 0, kv_dim, 1, 1, "blk.%d.attn_k.bias", il);
                add(&l, FILL_LINEAR, 0, kv_dim, 1, 1, "blk.%d.attn_v.bias", il);
            }
            if (hp->has_qk_norm) {
                add(&l, FILL_NORM, 0, hp->head_dim, 1, 1, "blk.%d.attn_q_norm.weight", il);
                add(&l, FILL_NORM, 0, hp->head_dim, 1, 1, "blk.%d.attn_k_norm.weight", il);
            }
        }
        add(&l, FILL_NORM, 0, E, 1, 1, hp->arch == ARCH_QWEN35 ? "blk.%d.post_attention_norm.weight" : "blk.%d.ffn_norm.weight", il);
        if (hp->n_expert > 0) {
            add(&l, FILL_LINEAR, 0, E, hp->n_expert, 1, "blk.%d.ffn_gate_inp.weight", il);
            add(&l, FILL_LINEAR, 1, E, hp->n_ff_exp, hp->n_expert, "blk.%d.ffn_gate_exps.weight", il);
            add(&l, FILL_LINEAR, 1, E, hp->n_ff_exp, hp->n_expert, "blk.%d.ffn_up_exps.weight", il);
            add(&l, FILL_LINEAR, 1, hp->n_ff_exp, E, hp->n_expert, "blk.%d.ffn_down_exps.weight", il);
        } else {
            add(&l, FILL_LINEAR, 1, E, hp->n_ff, 1, "blk.%d.ffn_gate.weight", il);
            add(&l, FILL_LINEAR, 1, E, hp->n_ff, 1, "blk.%d.ffn_up.weight", il);
            add(&l, FILL_LINEAR, 1, hp->n_ff, E, 1, "blk.%d.ffn_down.weight", il);
        }
    }
    /* a config can name any size up to 1e9 per field: refuse tensors no machine holds before anyone
     * multiplies their dims in int64 (2^48 elements: far beyond every model, far from overflow) */
    for (int i = 0; i < l.n; i++)
        if ((double)l.t[i].ne[0] * (double)l.t[i].ne[1] * (double)l.t[i].ne[2] > 0x1p48) {
            set_err(err, errlen, "dummy weights: tensor %s [%lld, %lld, %lld] has more than 2^48 elements", l.t[i].name,
                    (long long)l.t[i].ne[0], (long long)l.t[i].ne[1], (long long)l.t[i].ne[2]);
            free(l.t);
            return -1;
        }
    *out = l.t;
    return l.n;
}

/* ---- random fill ---- */

/* splitmix64 (Steele, Lea, Flood 2014): one 64-bit state, passes BigCrush, fast enough to fill
 * memory at bandwidth. */
static inline uint64_t next64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform [0, 1) */
static inline float unif(uint64_t *s) { return (float)(next64(s) >> 40) * (1.0f / 16777216.0f); }
/* approximately standard normal: Irwin-Hall sum of 4 uniforms, rescaled to variance 1 */
static inline float gauss(uint64_t *s) {
    uint64_t r = next64(s);
    float a = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) + (float)(r >> 48);
    return (a * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}
static inline void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }

static float fill_value(enum dummy_fill f, uint64_t *s) {
    switch (f) {
    case FILL_LINEAR: return DUMMY_STD * gauss(s);
    case FILL_NORM: return 1.0f + DUMMY_STD * gauss(s);
    case FILL_CONV: return 0.2f * gauss(s);
    case FILL_SSM_A: return -(1.0f + 15.0f * unif(s));
    case FILL_DT_BIAS: return 1.0f + DUMMY_STD * gauss(s);
    }
    return 0;
}

/* Nibble 0 (w = -8d) becomes 8 (w = 0): codes -7..7 uniform plus 0 twice as often, mean 0 and std
 * 4.18 d (sqrt(2 x 140 / 16)). Q4_0's codes -8..7 would have a mean of -0.5 d. */
static inline uint64_t nonzero_nibbles(uint64_t x) {
    uint64_t z = ~(x | (x >> 1) | (x >> 2) | (x >> 3)) & 0x1111111111111111ull;
    return x | (z << 3);
}

/* Pack 8 six-bit scales and mins as ggml's get_scale_min_k4 reads them (ggml-quants.c). */
static void pack_k4_scales(uint8_t q[12], const uint8_t sc[8], const uint8_t mn[8]) {
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
    }
}

/* 256 f16 scales d * U(0.75, 1.25), indexed by 8 random bits (no float work per block). */
static void scale_table(uint16_t tab[256], float d) {
    for (int i = 0; i < 256; i++) tab[i] = f32_to_fp16(d * (0.75f + 0.5f * (float)i / 255.0f));
}

/* Fill blocks [b0, b1) of a tensor of type t at data (b counts blocks; elements for float types). */
static void fill_blocks(enum pxq_type t, enum dummy_fill fill, uint8_t *data, int64_t b0, int64_t b1, uint64_t *s) {
    uint16_t tab[256];
    uint64_t sc_bits = 0;
    switch (t) {
    case PXQ_TYPE_Q4_0:
        scale_table(tab, DUMMY_STD / 4.18f);
        for (int64_t b = b0; b < b1; b++, sc_bits >>= 8) {
            uint8_t *p = data + (size_t)b * 18;
            if (((b - b0) & 7) == 0) sc_bits = next64(s);
            put16(p, tab[sc_bits & 255]);
            uint64_t r0 = nonzero_nibbles(next64(s)), r1 = nonzero_nibbles(next64(s));
            memcpy(p + 2, &r0, 8), memcpy(p + 10, &r1, 8);
        }
        break;
    case PXQ_TYPE_Q8_0:
        scale_table(tab, DUMMY_STD / 73.5f);
        for (int64_t b = b0; b < b1; b++, sc_bits >>= 8) {
            uint8_t *p = data + (size_t)b * 34;
            if (((b - b0) & 7) == 0) sc_bits = next64(s);
            put16(p, tab[sc_bits & 255]);
            for (int i = 0; i < 32; i += 8) {
                uint64_t r = next64(s);
                /* byte 0x80 (-128) becomes 0: codes in [-127, 127] as ggml's quantizer makes, mean 0 */
                uint64_t x = r ^ 0x8080808080808080ull; /* 0x80 bytes become 0x00 */
                uint64_t z = ~(((x & 0x7f7f7f7f7f7f7f7full) + 0x7f7f7f7f7f7f7f7full) | x) & 0x8080808080808080ull;
                r &= ~(z | (z >> 7) * 0x7f); /* clear the bytes that were 0x80 */
                memcpy(p + 2 + i, &r, 8);
            }
        }
        break;
    case PXQ_TYPE_Q4_K: {
        /* w = d*sc*q - dmin*m; with m = sc and dmin = 7.5 d the mean is zero, std 4.61*d*sc */
        scale_table(tab, DUMMY_STD / (4.61f * 47.5f));
        for (int64_t b = b0; b < b1; b++) {
            uint8_t *p = data + (size_t)b * 144;
            uint8_t sc[8];
            uint64_t r = next64(s);
            for (int j = 0; j < 8; j++) sc[j] = (uint8_t)(32 + ((r >> (8 * j)) & 31)); /* 32..63 */
            uint16_t d = tab[(r >> 5) & 255];
            put16(p, d);
            put16(p + 2, f32_to_fp16(7.5f * fp16_to_f32(d)));
            pack_k4_scales(p + 4, sc, sc);
            for (int i = 0; i < 128; i += 8) {
                uint64_t q = next64(s);
                memcpy(p + 16 + i, &q, 8);
            }
        }
        break;
    }
    case PXQ_TYPE_F16:
        for (int64_t b = b0; b < b1; b++) put16(data + (size_t)b * 2, f32_to_fp16(fill_value(fill, s)));
        break;
    case PXQ_TYPE_F32:
        for (int64_t b = b0; b < b1; b++) {
            float v = fill_value(fill, s);
            memcpy(data + (size_t)b * 4, &v, 4);
        }
        break;
    default: die("dummy: no filler for type %s", type_name(t));
    }
}

struct fill_job {
    struct pxq_tensor *t;
    const struct dummy_tensor *d;
    int n;
    int64_t *chunk0;   /* [n+1] first global chunk of tensor i */
    uint64_t seed;
};

static void fill_range(void *arg, int64_t c0, int64_t c1, int ith) {
    const struct fill_job *j = arg;
    for (int64_t c = c0; c < c1; c++) {
        int lo = 0, hi = j->n - 1; /* tensor i with chunk0[i] <= c < chunk0[i+1] */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (j->chunk0[mid] <= c) lo = mid;
            else hi = mid - 1;
        }
        const struct pxq_tensor *t = &j->t[lo];
        int64_t nblk = tensor_nelements(t) / type_block_elems(t->type);
        int64_t k = c - j->chunk0[lo], b0 = k * DUMMY_CHUNK, b1 = b0 + DUMMY_CHUNK < nblk ? b0 + DUMMY_CHUNK : nblk;
        uint64_t s = j->seed ^ ((uint64_t)lo << 40) ^ (uint64_t)k;
        next64(&s);
        fill_blocks(t->type, j->d[lo].fill, (uint8_t *)t->data, b0, b1, &s);
    }
}

struct pxq_model *model_open_dummy(const char *config_json_path, enum pxq_type dtype, uint64_t seed, int n_threads,
                                   char *err, size_t errlen) {
    struct pxq_hparams hp;
    if (!config_json_path || !*config_json_path) {
        set_err(err, errlen, "--load-format dummy needs --config FILE.json");
        return NULL;
    }
    if (model_hparams_from_config(&hp, config_json_path, err, errlen) != 0) return NULL;
    if (hp.arch == ARCH_QWEN35) { /* dummy weights follow the GGUF conventions (model_dummy.h) */
        hp.norm_w_offset = 0.0f;  /* norm weights are the multiplier itself */
        hp.ssm_a_is_log = 0;      /* ssm_a is A = -exp(A_log); conv1d is [kernel, conv_dim] */
        hp.ssm_v_tiled = 1;       /* value heads in llama.cpp's tiled order */
    }
    struct dummy_tensor *d;
    int n = dummy_manifest(&hp, dtype, &d, err, errlen);
    if (n < 0) return NULL;
    /* one allocation, each tensor 64-byte aligned */
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        int64_t ne = d[i].ne[0] * d[i].ne[1] * d[i].ne[2];
        total += (type_row_bytes(d[i].type, ne) + 63) & ~(size_t)63;
    }
    const size_t ram = host_memory_bytes();
    if (ram && total > ram) { /* fail here, not in the OOM killer */
        free(d);
        set_err(err, errlen, "dummy weights need %.2f GiB of host memory, this machine has %.2f GiB (pxq plan gives the account "
                "without allocating weights)", total / 1073741824.0, ram / 1073741824.0);
        return NULL;
    }
    uint8_t *data = NULL;
    if (posix_memalign((void **)&data, 2u << 20, total ? total : 64) != 0) {
        free(d);
        set_err(err, errlen, "dummy weights: cannot allocate %.2f GiB of host memory", total / 1073741824.0);
        return NULL;
    }
    madvise(data, total, MADV_HUGEPAGE); /* 512x fewer page faults while filling; advisory only */
    struct pxq_tensor *t = xcalloc((size_t)n, sizeof *t);
    int64_t *chunk0 = xmalloc((size_t)(n + 1) * sizeof *chunk0);
    size_t off = 0;
    chunk0[0] = 0;
    for (int i = 0; i < n; i++) {
        snprintf(t[i].name, sizeof t[i].name, "%s", d[i].name);
        t[i].type = d[i].type;
        t[i].n_dims = d[i].n_dims;
        memcpy(t[i].ne, d[i].ne, sizeof t[i].ne);
        t[i].nbytes = type_row_bytes(d[i].type, tensor_nelements(&t[i]));
        t[i].data = data + off;
        off += (t[i].nbytes + 63) & ~(size_t)63;
        int64_t nblk = tensor_nelements(&t[i]) / type_block_elems(t[i].type);
        chunk0[i + 1] = chunk0[i] + (nblk + DUMMY_CHUNK - 1) / DUMMY_CHUNK;
    }
    struct fill_job job = {t, d, n, chunk0, seed * 0x9e3779b97f4a7c15ull + 1};
    struct threadpool *tp = threadpool_new(n_threads > 0 ? n_threads : n_cpus());
    parallel_for(tp, chunk0[n], 1, fill_range, &job);
    threadpool_free(tp);
    free(chunk0);
    free(d);
    char name[1200];
    snprintf(name, sizeof name, "dummy:%s", config_json_path);
    return model_from_tensors(name, &hp, t, n, data, err, errlen);
}
