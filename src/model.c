/* model.c - load hyperparameters and weights from GGUF or an HF directory; check every shape.
 *
 * Both formats end as one table of tensors keyed by GGUF names (sorted, binary-searched), which the
 * binder walks to fill struct pxq_layer. HF names are renamed through hf_tensor_map; the HF shapes
 * were already reversed into ggml order by safetensors.c.
 */
#include "model.h"

#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gguf.h"
#include "kv_calib.h"
#include "quant.h"
#include "safetensors.h"
#include "tokenizer.h"
#include "util.h"

struct named_tensor {
    char name[PXQ_NAME_MAX];
    const struct pxq_tensor *t;
};

struct pxq_model {
    char path[1024];
    struct pxq_hparams hp;
    struct gguf_file *gguf;
    struct st_model *st;
    struct named_tensor *tab;   /* sorted by name */
    int n_tab;
    struct pxq_tensor *owned;   /* views made at load (MoE expert slices) */
    int n_owned;
    struct pxq_tensor *own_tensors; /* model_from_tensors: caller-made tensors and their data, owned */
    int n_own_tensors;
    void *own_data;
    struct pxq_layer layers[PXQ_MAX_LAYERS];
    const struct pxq_tensor *token_embd, *output_norm, *output;
    struct pxq_tokenizer *tok;
    struct kv_calib kvc;        /* pxq.kv.* keys of a GGUF (kv_calib.h) */
    int has_kvc;
};

const char *arch_name(enum pxq_arch a) {
    switch (a) {
    case ARCH_LLAMA: return "llama";
    case ARCH_QWEN2: return "qwen2";
    case ARCH_QWEN3: return "qwen3";
    case ARCH_QWEN3MOE: return "qwen3moe";
    case ARCH_QWEN35: return "qwen35";
    }
    return "?";
}

/* HF model_type / GGUF general.architecture -> arch. */
static int arch_from_name(const char *s, enum pxq_arch *a) {
    static const struct { const char *name; enum pxq_arch arch; } map[] = {
        {"llama", ARCH_LLAMA},     {"qwen2", ARCH_QWEN2},          {"qwen3", ARCH_QWEN3},
        {"qwen3moe", ARCH_QWEN3MOE}, {"qwen3_moe", ARCH_QWEN3MOE}, {"qwen35", ARCH_QWEN35},
        {"qwen3_5", ARCH_QWEN35},  {"qwen3_5_text", ARCH_QWEN35},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(s, map[i].name) == 0) {
            *a = map[i].arch;
            return 0;
        }
    return -1;
}

/* ---- tensor table ---- */

static int cmp_named(const void *a, const void *b) {
    return strcmp(((const struct named_tensor *)a)->name, ((const struct named_tensor *)b)->name);
}

static const struct pxq_tensor *find(const struct pxq_model *m, const char *name) {
    struct named_tensor key;
    snprintf(key.name, sizeof key.name, "%s", name);
    if (m->n_tab == 0) return NULL; /* no table (a file without tensors): bsearch wants a base */
    struct named_tensor *r = bsearch(&key, m->tab, (size_t)m->n_tab, sizeof *m->tab, cmp_named);
    return r ? r->t : NULL;
}

static void tab_add(struct pxq_model *m, int *cap, const char *name, const struct pxq_tensor *t) {
    if (m->n_tab == *cap) {
        *cap = *cap ? *cap * 2 : 256;
        m->tab = xrealloc(m->tab, (size_t)*cap * sizeof *m->tab);
    }
    snprintf(m->tab[m->n_tab].name, PXQ_NAME_MAX, "%s", name);
    m->tab[m->n_tab].t = t;
    m->n_tab++;
}

/* The table in name order, for find's bsearch (an empty table has no base to sort). */
static void tab_sort(struct pxq_model *m) {
    if (m->n_tab > 0) qsort(m->tab, (size_t)m->n_tab, sizeof *m->tab, cmp_named);
}

/* HF tensor name -> GGUF tensor name (llama.cpp convert_hf_to_gguf.py / gguf-py tensor_mapping). */
static const struct { const char *hf, *gguf; } hf_tensor_map[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    /* Qwen3.5 Gated DeltaNet (llama.cpp gguf-py tensor_mapping for qwen35) */
    {"linear_attn.in_proj_qkv.weight", "attn_qkv.weight"},
    {"linear_attn.in_proj_z.weight", "attn_gate.weight"},
    {"linear_attn.in_proj_b.weight", "ssm_beta.weight"},
    {"linear_attn.in_proj_a.weight", "ssm_alpha.weight"},
    {"linear_attn.conv1d.weight", "ssm_conv1d.weight"},
    {"linear_attn.dt_bias", "ssm_dt.bias"},
    {"linear_attn.A_log", "ssm_a"},
    {"linear_attn.norm.weight", "ssm_norm.weight"},
    {"linear_attn.out_proj.weight", "ssm_out.weight"},
};

/* Qwen3.5 MTP head (HF mtp.*) -> llama.cpp's nextn names on layers n_layer.. (as for GLM-4.5). */
static const struct { const char *hf, *gguf; } hf_mtp_map[] = {
    {"mtp.fc.weight", "nextn.eh_proj.weight"},
    {"mtp.pre_fc_norm_embedding.weight", "nextn.enorm.weight"},
    {"mtp.pre_fc_norm_hidden.weight", "nextn.hnorm.weight"},
    {"mtp.norm.weight", "nextn.shared_head_norm.weight"},
};

/* n_layer places the MTP layers after the main ones. The multimodal qwen3_5 checkpoints keep the
 * text model under model.language_model. (vision weights, model.visual.*, are skipped). */
static int hf_to_gguf_name(const char *hf, int n_layer, char *out, size_t cap) {
    if (strncmp(hf, "model.language_model.", 21) == 0) {
        char tmp[PXQ_NAME_MAX + 16];
        snprintf(tmp, sizeof tmp, "model.%s", hf + 21);
        return hf_to_gguf_name(tmp, n_layer, out, cap);
    }
    if (strcmp(hf, "model.embed_tokens.weight") == 0) return snprintf(out, cap, "token_embd.weight"), 0;
    if (strcmp(hf, "model.norm.weight") == 0) return snprintf(out, cap, "output_norm.weight"), 0;
    if (strcmp(hf, "lm_head.weight") == 0) return snprintf(out, cap, "output.weight"), 0;
    for (size_t i = 0; i < sizeof hf_mtp_map / sizeof hf_mtp_map[0]; i++)
        if (strcmp(hf, hf_mtp_map[i].hf) == 0) return snprintf(out, cap, "blk.%d.%s", n_layer, hf_mtp_map[i].gguf), 0;
    int il, n = 0;
    if (sscanf(hf, "mtp.layers.%d.%n", &il, &n) == 1 && n > 0 && il >= 0 && il < PXQ_MAX_LAYERS) {
        char tmp[PXQ_NAME_MAX + 32];
        snprintf(tmp, sizeof tmp, "model.layers.%d.%s", n_layer + il, hf + n);
        return hf_to_gguf_name(tmp, n_layer, out, cap);
    }
    if (sscanf(hf, "model.layers.%d.%n", &il, &n) != 1 || n == 0) return -1;
    const char *rest = hf + n;
    for (size_t i = 0; i < sizeof hf_tensor_map / sizeof hf_tensor_map[0]; i++)
        if (strcmp(rest, hf_tensor_map[i].hf) == 0) return snprintf(out, cap, "blk.%d.%s", il, hf_tensor_map[i].gguf), 0;
    int e, n2 = 0;
    char proj[32];
    if (sscanf(rest, "mlp.experts.%d.%31[a-z_]%n", &e, proj, &n2) == 2 && strcmp(rest + n2, ".weight") == 0) {
        const char *g = strcmp(proj, "gate_proj") == 0 ? "ffn_gate" : strcmp(proj, "up_proj") == 0 ? "ffn_up"
                      : strcmp(proj, "down_proj") == 0 ? "ffn_down" : NULL;
        if (g) return snprintf(out, cap, "blk.%d.%s.%d.weight", il, g, e), 0; /* per-expert: PXQ-internal name */
    }
    return -1;
}

/* ---- hyperparameters ---- */

/* HF config.json: read an int field; `required` fields missing give an error naming them. */
static int cfg_int(const cJSON *c, const char *key, int required, int def, int *out, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return set_err(err, errlen, "config.json: missing field '%s'", key);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 || v->valuedouble != (int)v->valuedouble)
        return set_err(err, errlen, "config.json: field '%s' must be a non-negative integer", key);
    *out = (int)v->valuedouble;
    return 0;
}

/* A number field: absent or null gives def; any other non-number is an error naming the field. */
static int cfg_num(const cJSON *c, const char *key, double def, double *out, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v)) return set_err(err, errlen, "config.json: field '%s' must be a number", key);
    *out = v->valuedouble;
    return 0;
}

/* A double as a float without undefined behaviour: beyond float's range it becomes +-INFINITY
 * (C11 6.3.1.5 leaves the plain conversion undefined), which check_norm_rope then refuses. */
static float to_f32(double d) {
    return d > FLT_MAX ? INFINITY : d < -FLT_MAX ? -INFINITY : (float)d;
}

/* A token id from JSON: an integer in [0, 2^31), else -1 (a value that can name no token is ignored). */
static int32_t json_token_id(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    return d >= 0 && d <= 2147483647.0 && d == floor(d) ? (int32_t)d : -1;
}

/* rms_eps and rope_theta from either format: NaN, infinite, negative eps or theta <= 0 would turn every
 * logit into NaN (the model then "generates" token 0 forever), so they fail at load. */
static int check_norm_rope(const struct pxq_hparams *hp, int gguf, char *err, size_t errlen) {
    const char *src = gguf ? "GGUF" : "config.json";
    if (!(hp->rms_eps >= 0) || !isfinite(hp->rms_eps))
        return set_err(err, errlen, "%s: %s %g must be finite and >= 0", src,
                       gguf ? "attention.layer_norm_rms_epsilon" : "rms_norm_eps", hp->rms_eps);
    if (!(hp->rope_theta > 0) || !isfinite(hp->rope_theta))
        return set_err(err, errlen, "%s: %s %g must be finite and > 0", src, gguf ? "rope.freq_base" : "rope_theta", hp->rope_theta);
    if (hp->n_ctx_train <= 0)
        return set_err(err, errlen, "%s: %s must be positive", src, gguf ? "context_length" : "max_position_embeddings");
    return 0;
}

/* model_qwen35.c: the Gated DeltaNet sizes, checked when the hyperparameters are read. */
int model_qwen35_check_hparams(const struct pxq_hparams *hp, int gguf, char *err, size_t errlen);

/* The MoE router's counts (HF Qwen3MoeSparseMoeBlock: softmax over n_expert logits, top n_expert_used):
 * 1 <= n_expert_used <= n_expert <= PXQ_MAX_EXPERTS. Checked when the hyperparameters are read, so
 * plan, dummy weights and both file formats refuse the same configs. */
static int check_moe(const struct pxq_hparams *hp, int gguf, char *err, size_t errlen) {
    if (hp->arch != ARCH_QWEN3MOE) return 0;
    const char *src = gguf ? "GGUF" : "config.json";
    if (hp->n_expert < 1 || hp->n_expert > PXQ_MAX_EXPERTS)
        return set_err(err, errlen, "%s: %s %d must be in [1, %d]", src,
                       gguf ? "expert_count" : "num_experts (or num_local_experts)", hp->n_expert, PXQ_MAX_EXPERTS);
    if (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert)
        return set_err(err, errlen, "%s: %s %d must be in [1, %d] (the number of experts)", src,
                       gguf ? "expert_used_count" : "num_experts_per_tok", hp->n_expert_used, hp->n_expert);
    return 0;
}

/* RoPE scaling from config.json: rope_scaling (HF 4.x) or rope_parameters (HF 5.x), the keys of HF's
 * ROPE_INIT_FUNCTIONS (rope_type or the older type; factor, original_max_position_embeddings,
 * attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim, truncate, low_freq_factor,
 * high_freq_factor). Types PXQ does not compute (dynamic, longrope, ...) are refused by name. */
static int rope_scaling_from_config(struct rope_scaling *rs, const cJSON *c, const cJSON *rp, char *err, size_t errlen) {
    memset(rs, 0, sizeof *rs);
    const cJSON *objs[2] = {cJSON_GetObjectItemCaseSensitive(c, "rope_scaling"), cJSON_GetObjectItemCaseSensitive(c, "rope_parameters")};
    (void)rp;
    for (int i = 0; i < 2; i++) {
        const cJSON *o = objs[i];
        const char *what = i ? "config.json rope_parameters" : "config.json rope_scaling";
        if (o && !cJSON_IsNull(o) && !cJSON_IsObject(o)) return set_err(err, errlen, "%s must be an object", what);
        if (!cJSON_IsObject(o)) continue;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "rope_type");
        if (!t || cJSON_IsNull(t)) t = cJSON_GetObjectItemCaseSensitive(o, "type"); /* the older key */
        if (!t || cJSON_IsNull(t)) continue;
        const int ty = cJSON_IsString(t) ? rope_scaling_parse(t->valuestring) : -1;
        if (ty < 0)
            return set_err(err, errlen, "%s: rope type '%s' is not supported (PXQ computes none/default, linear, yarn and llama3)",
                           what, cJSON_IsString(t) ? t->valuestring : "(not a string)");
        if (ty == ROPE_SCALING_NONE) continue;
        double f, orig, af, bf, bs, ms, msa, lo, hi;
        if (cfg_num(o, "factor", 0, &f, err, errlen) || cfg_num(o, "original_max_position_embeddings", 0, &orig, err, errlen) ||
            cfg_num(o, "attention_factor", 0, &af, err, errlen) || cfg_num(o, "beta_fast", 0, &bf, err, errlen) ||
            cfg_num(o, "beta_slow", 0, &bs, err, errlen) || cfg_num(o, "mscale", 0, &ms, err, errlen) ||
            cfg_num(o, "mscale_all_dim", 0, &msa, err, errlen) || cfg_num(o, "low_freq_factor", 0, &lo, err, errlen) ||
            cfg_num(o, "high_freq_factor", 0, &hi, err, errlen))
            return -1;
        if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "factor")))
            return set_err(err, errlen, "%s: rope type %s needs a numeric 'factor'", what, t->valuestring);
        if (!(orig >= 0 && orig <= 1e9 && orig == (int)orig))
            return set_err(err, errlen, "%s: original_max_position_embeddings %g must be a non-negative integer", what, orig);
        rs->type = (enum rope_scaling_type)ty;
        rs->factor = to_f32(f), rs->orig_ctx = (int)orig, rs->attn_factor = to_f32(af);
        rs->beta_fast = to_f32(bf), rs->beta_slow = to_f32(bs), rs->mscale = to_f32(ms), rs->mscale_all_dim = to_f32(msa);
        rs->low_freq_factor = to_f32(lo), rs->high_freq_factor = to_f32(hi);
        rs->no_truncate = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "truncate"));
        if (rope_scaling_check(rs, what, err, errlen)) return -1;
    }
    return 0;
}

/* What config.json may ask for that PXQ does not compute: sliding-window attention, an activation
 * other than SiLU. Each would load and run with full attention and SiLU, and give other logits than
 * the checkpoint's, so they are refused. c: the text config. */
static int check_unsupported_config(const cJSON *c, char *err, size_t errlen) {
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(c, "use_sliding_window");
    if (cJSON_IsTrue(sw))
        return set_err(err, errlen, "config.json: use_sliding_window true is not supported (PXQ computes full causal attention)");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(c, "hidden_act");
    if (act && !cJSON_IsNull(act) &&
        !(cJSON_IsString(act) && (!strcmp(act->valuestring, "silu") || !strcmp(act->valuestring, "swish"))))
        return set_err(err, errlen, "config.json: hidden_act '%s' is not supported (PXQ computes SwiGLU with SiLU)",
                       cJSON_IsString(act) ? act->valuestring : "(not a string)");
    return 0;
}

/* A boolean field: absent or null gives def; any other non-boolean is an error naming the field. */
static int cfg_bool(const cJSON *c, const char *key, int def, int *out, char *err, size_t errlen) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v)) return set_err(err, errlen, "config.json: field '%s' must be true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

static void add_eos(struct pxq_hparams *hp, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < hp->n_eos; i++)
        if (hp->eos_ids[i] == id) return;
    if (hp->n_eos < PXQ_MAX_EOS) hp->eos_ids[hp->n_eos++] = id;
}

/* eos_token_id: int or list of ints (config.json and generation_config.json). */
static void cfg_eos(struct pxq_hparams *hp, const cJSON *c) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, "eos_token_id");
    if (cJSON_IsNumber(v)) add_eos(hp, json_token_id(v));
    const cJSON *e;
    if (cJSON_IsArray(v)) cJSON_ArrayForEach(e, v) add_eos(hp, json_token_id(e));
}

static cJSON *load_json_path(const char *path, char *err, size_t errlen, int *failed);

static cJSON *load_json(const char *dir, const char *name, int required, char *err, size_t errlen, int *failed) {
    char path[1200];
    *failed = 0;
    if (path_join(path, sizeof path, dir, name) != 0 || !path_exists(path)) {
        if (required) *failed = set_err(err, errlen, "%s/%s: not found", dir, name);
        return NULL;
    }
    return load_json_path(path, err, errlen, failed);
}

static cJSON *load_json_path(const char *path, char *err, size_t errlen, int *failed) {
    *failed = 0;
    if (!path_exists(path) || is_dir(path)) {
        *failed = is_dir(path) ? set_err(err, errlen, "%s: is a directory, not a JSON file (e.g. config.json)", path)
                               : set_err(err, errlen, "%s: not found", path);
        return NULL;
    }
    size_t len;
    char *s = read_regular_file(path, 64u << 20, &len, err, errlen); /* a pipe or device: "not a regular file" */
    if (!s) {
        *failed = -1;
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(s, len);
    free(s);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        *failed = set_err(err, errlen, "%s: not a valid JSON object", path);
        return NULL;
    }
    return j;
}

/* config_path: an HF config.json; gen_dir: where generation_config.json may be (NULL: nowhere). */
static int hparams_from_config(struct pxq_hparams *hp, const char *config_path, const char *gen_dir, char *err, size_t errlen) {
    int failed;
    cJSON *root = load_json_path(config_path, err, errlen, &failed);
    if (!root) return -1;
    const cJSON *c = root;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(c, "model_type");
    if (cJSON_IsString(mt) && strcmp(mt->valuestring, "qwen3_5") == 0) { /* multimodal wrapper */
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(c, "text_config");
        if (cJSON_IsObject(tc)) {
            c = tc;
        }
    }
    int rc = -1;
    if (!cJSON_IsString(mt)) {
        set_err(err, errlen, "config.json: missing field 'model_type'");
        goto out;
    }
    if (arch_from_name(mt->valuestring, &hp->arch) != 0) {
        set_err(err, errlen, "config.json: unsupported model_type '%s' (supported: llama, qwen2, qwen3, qwen3_moe, qwen3_5_text)",
                mt->valuestring);
        goto out;
    }
    snprintf(hp->arch_name, sizeof hp->arch_name, "%s", arch_name(hp->arch));
    if (cfg_int(c, "hidden_size", 1, 0, &hp->n_embd, err, errlen) || cfg_int(c, "num_hidden_layers", 1, 0, &hp->n_layer, err, errlen) ||
        cfg_int(c, "num_attention_heads", 1, 0, &hp->n_head, err, errlen) || cfg_int(c, "vocab_size", 1, 0, &hp->n_vocab, err, errlen) ||
        cfg_int(c, "intermediate_size", hp->arch != ARCH_QWEN3MOE, 0, &hp->n_ff, err, errlen) ||
        cfg_int(c, "num_key_value_heads", 0, hp->n_head, &hp->n_head_kv, err, errlen) ||
        cfg_int(c, "max_position_embeddings", 0, 4096, &hp->n_ctx_train, err, errlen))
        goto out;
    if (hp->n_head == 0 || hp->n_embd == 0 || hp->n_layer == 0) {
        set_err(err, errlen, "config.json: hidden_size, num_hidden_layers and num_attention_heads must be positive");
        goto out;
    }
    if (cfg_int(c, "head_dim", 0, hp->n_embd / hp->n_head, &hp->head_dim, err, errlen)) goto out;
    /* rope_theta and partial_rotary_factor: top level, else in rope_parameters (Qwen3.5) */
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c, "rope_parameters");
    const cJSON *rpo = cJSON_IsObject(rp) ? rp : NULL;
    double eps, theta = 10000.0, prf = 1.0;
    if (cfg_num(c, "rms_norm_eps", 1e-6, &eps, err, errlen) || cfg_num(rpo, "rope_theta", theta, &theta, err, errlen) ||
        cfg_num(c, "rope_theta", theta, &theta, err, errlen) ||
        cfg_num(rpo, "partial_rotary_factor", prf, &prf, err, errlen) ||
        cfg_num(c, "partial_rotary_factor", prf, &prf, err, errlen))
        goto out;
    hp->rms_eps = to_f32(eps);
    hp->rope_theta = to_f32(theta);
    if (!(prf > 0 && prf <= 1)) {
        set_err(err, errlen, "config.json: partial_rotary_factor %g must be in (0, 1]", prf);
        goto out;
    }
    hp->n_rot = (int)(hp->head_dim * prf);
    if (check_norm_rope(hp, 0, err, errlen) || rope_scaling_from_config(&hp->rope_scaling, c, rpo, err, errlen) ||
        check_unsupported_config(c, err, errlen))
        goto out;
    hp->rope_style = ROPE_NEOX;
    int bias = 0;
    if (cfg_bool(root, "tie_word_embeddings", 0, &hp->tie_embd, err, errlen) || /* the top level's, if the text_config has none */
        cfg_bool(c, "tie_word_embeddings", hp->tie_embd, &hp->tie_embd, err, errlen) ||
        cfg_bool(c, "attention_bias", 0, &bias, err, errlen))
        goto out;
    hp->has_qkv_bias = hp->arch == ARCH_QWEN2 || bias;
    hp->has_qk_norm = hp->arch == ARCH_QWEN3 || hp->arch == ARCH_QWEN3MOE || hp->arch == ARCH_QWEN35;
    if (hp->arch == ARCH_QWEN3MOE) {
        if (cfg_int(c, "num_experts", 0, 0, &hp->n_expert, err, errlen)) goto out;
        if (hp->n_expert == 0 && cfg_int(c, "num_local_experts", 1, 0, &hp->n_expert, err, errlen)) goto out;
        if (cfg_int(c, "num_experts_per_tok", 1, 0, &hp->n_expert_used, err, errlen) ||
            cfg_int(c, "moe_intermediate_size", 1, 0, &hp->n_ff_exp, err, errlen))
            goto out;
        if (cfg_bool(c, "norm_topk_prob", 0, &hp->norm_topk_prob, err, errlen)) goto out;
        int step = 1;
        if (cfg_int(c, "decoder_sparse_step", 0, 1, &step, err, errlen)) goto out;
        const cJSON *mlp_only = cJSON_GetObjectItemCaseSensitive(c, "mlp_only_layers");
        if (step != 1 || (cJSON_IsArray(mlp_only) && cJSON_GetArraySize(mlp_only) > 0)) {
            set_err(err, errlen, "config.json: qwen3_moe with dense layers (decoder_sparse_step/mlp_only_layers) is not supported");
            goto out;
        }
        if (check_moe(hp, 0, err, errlen)) goto out;
    }
    if (hp->arch == ARCH_QWEN35) {
        hp->norm_w_offset = 1.0f; /* Qwen3_5RMSNorm: x_hat * (1 + w) */
        hp->ssm_a_is_log = 1;
        hp->ssm_v_tiled = 0;      /* repeat_interleave: value head h reads key head h / (n_v / n_k) */
        if (cfg_int(c, "mtp_num_hidden_layers", 0, 0, &hp->n_mtp_layer, err, errlen)) goto out;
        if (cfg_bool(c, "attn_output_gate", 1, &hp->attn_output_gate, err, errlen)) goto out;
        if (cfg_int(c, "linear_conv_kernel_dim", 1, 0, &hp->ssm_conv_kernel, err, errlen) ||
            cfg_int(c, "linear_num_key_heads", 1, 0, &hp->ssm_n_k_head, err, errlen) ||
            cfg_int(c, "linear_num_value_heads", 1, 0, &hp->ssm_n_v_head, err, errlen) ||
            cfg_int(c, "linear_key_head_dim", 1, 0, &hp->ssm_head_k_dim, err, errlen) ||
            cfg_int(c, "linear_value_head_dim", 1, 0, &hp->ssm_head_v_dim, err, errlen))
            goto out;
        const cJSON *lt = cJSON_GetObjectItemCaseSensitive(c, "layer_types");
        int interval = 4;
        if (cfg_int(c, "full_attention_interval", 0, 4, &interval, err, errlen)) goto out;
        for (int il = 0; il < hp->n_layer && il < PXQ_MAX_LAYERS; il++) {
            const cJSON *e = cJSON_IsArray(lt) ? cJSON_GetArrayItem(lt, il) : NULL;
            if (e && cJSON_IsString(e))
                hp->layer_kind[il] = strcmp(e->valuestring, "linear_attention") == 0 ? LAYER_DELTANET : LAYER_ATTN;
            else
                hp->layer_kind[il] = (il + 1) % (interval ? interval : 4) == 0 ? LAYER_ATTN : LAYER_DELTANET;
        }
        if (model_qwen35_check_hparams(hp, 0, err, errlen)) goto out;
    }
    hp->bos_id = -1;
    const cJSON *bos = cJSON_GetObjectItemCaseSensitive(c, "bos_token_id");
    if (cJSON_IsNumber(bos)) hp->bos_id = json_token_id(bos);
    cfg_eos(hp, c);
    cJSON *gen = gen_dir ? load_json(gen_dir, "generation_config.json", 0, err, errlen, &failed) : NULL;
    if (gen_dir && failed) goto out;
    if (gen) cfg_eos(hp, gen);
    cJSON_Delete(gen);
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

/* dir is a directory; one without config.json is not a model (a GGUF model is the .gguf file itself). */
static int hparams_from_hf(struct pxq_hparams *hp, const char *dir, char *err, size_t errlen) {
    char path[1200];
    if (path_join(path, sizeof path, dir, "config.json") != 0) return set_err(err, errlen, "%s: path too long", dir);
    if (!path_exists(path))
        return set_err(err, errlen,
                       "%s: not a model directory: it has no config.json (a model is an HF directory with config.json "
                       "and *.safetensors, or a .gguf file)", dir);
    return hparams_from_config(hp, path, dir, err, errlen);
}

int model_hparams_from_config(struct pxq_hparams *hp, const char *config_path, char *err, size_t errlen) {
    memset(hp, 0, sizeof *hp);
    return hparams_from_config(hp, config_path, NULL, err, errlen);
}

/* GGUF keys: "{arch}.<suffix>" (GGUF spec, "LLM" section). */
static int gguf_u32_arch(const struct gguf_file *g, const char *arch, const char *suffix, int required, int def, int *out,
                         char *err, size_t errlen) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    if (gguf_get_u32(g, key, &v) != 0) {
        if (required) return set_err(err, errlen, "GGUF: missing or invalid key '%s'", key);
        *out = def;
        return 0;
    }
    if (v > 1000000000u) return set_err(err, errlen, "GGUF: key '%s' out of range (%u)", key, v);
    *out = (int)v;
    return 0;
}

static float gguf_f32_arch(const struct gguf_file *g, const char *arch, const char *suffix, float def) {
    char key[128];
    float v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_f32(g, key, &v) == 0 ? v : def;
}

static int hparams_from_gguf(struct pxq_hparams *hp, const struct gguf_file *g, char *err, size_t errlen) {
    const char *a = gguf_arch(g);
    if (!a) return set_err(err, errlen, "GGUF: missing general.architecture");
    if (arch_from_name(a, &hp->arch) != 0)
        return set_err(err, errlen, "GGUF: unsupported architecture '%s' (supported: llama, qwen2, qwen3, qwen3moe, qwen35)", a);
    snprintf(hp->arch_name, sizeof hp->arch_name, "%s", a);
    if (gguf_u32_arch(g, a, "embedding_length", 1, 0, &hp->n_embd, err, errlen) ||
        gguf_u32_arch(g, a, "block_count", 1, 0, &hp->n_layer, err, errlen) ||
        gguf_u32_arch(g, a, "attention.head_count", 1, 0, &hp->n_head, err, errlen) ||
        gguf_u32_arch(g, a, "attention.head_count_kv", 0, hp->n_head, &hp->n_head_kv, err, errlen) ||
        gguf_u32_arch(g, a, "feed_forward_length", hp->arch != ARCH_QWEN3MOE, 0, &hp->n_ff, err, errlen) ||
        gguf_u32_arch(g, a, "context_length", 0, 4096, &hp->n_ctx_train, err, errlen))
        return -1;
    if (hp->n_head == 0 || hp->n_embd == 0 || hp->n_layer == 0)
        return set_err(err, errlen, "GGUF: embedding_length, block_count and head_count must be positive");
    if (gguf_u32_arch(g, a, "attention.key_length", 0, hp->n_embd / hp->n_head, &hp->head_dim, err, errlen) ||
        gguf_u32_arch(g, a, "rope.dimension_count", 0, hp->head_dim, &hp->n_rot, err, errlen))
        return -1;
    hp->rope_theta = gguf_f32_arch(g, a, "rope.freq_base", 10000.0f);
    hp->rms_eps = gguf_f32_arch(g, a, "attention.layer_norm_rms_epsilon", 1e-6f);
    if (check_norm_rope(hp, 1, err, errlen)) return -1;
    /* RoPE scaling (GGUF spec: {arch}.rope.scaling.type none|linear|yarn, .factor,
     * .original_context_length, .attn_factor, .yarn_beta_fast, .yarn_beta_slow). llama.cpp applies a
     * linear factor when one is given and no type is (older converters wrote {arch}.rope.scaling.factor
     * or {arch}.rope.scale_linear alone). Its rope_freqs.weight tensor (Llama 3.1's per-dim factors)
     * is not read yet, so it is refused. */
    char key[128];
    /* a key of the wrong type is named, not read as absent */
    static const struct { const char *suffix; int str; } rkeys[] = {
        {"rope.scaling.type", 1}, {"rope.scaling.factor", 0}, {"rope.scale_linear", 0}, {"rope.scaling.original_context_length", 0},
        {"rope.scaling.attn_factor", 0}, {"rope.scaling.yarn_beta_fast", 0}, {"rope.scaling.yarn_beta_slow", 0}};
    for (size_t i = 0; i < sizeof rkeys / sizeof *rkeys; i++) {
        snprintf(key, sizeof key, "%s.%s", a, rkeys[i].suffix);
        const int ki = gguf_find_key(g, key);
        float fv;
        if (ki >= 0 && (rkeys[i].str ? !gguf_get_str(g, key) : gguf_get_f32(g, key, &fv) != 0))
            return set_err(err, errlen, "GGUF: %s is a %s, not a %s", key, gguf_vtype_name(gguf_kv_type(g, ki)),
                           rkeys[i].str ? "string" : "number");
    }
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    const char *rst = gguf_get_str(g, key);
    struct rope_scaling *rs = &hp->rope_scaling;
    memset(rs, 0, sizeof *rs);
    float f = gguf_f32_arch(g, a, "rope.scaling.factor", 0.0f);
    if (f == 0.0f) f = gguf_f32_arch(g, a, "rope.scale_linear", 0.0f);
    if (rst && strcmp(rst, "none") && strcmp(rst, "linear") && strcmp(rst, "yarn"))
        return set_err(err, errlen, "GGUF: %s '%s' is not supported (none, linear, yarn)", key, rst);
    if (rst ? strcmp(rst, "none") != 0 : (f != 0.0f && f != 1.0f)) {
        rs->type = rst && !strcmp(rst, "yarn") ? ROPE_SCALING_YARN : ROPE_SCALING_LINEAR;
        rs->factor = f;
        int orig = 0;
        if (gguf_u32_arch(g, a, "rope.scaling.original_context_length", 0, 0, &orig, err, errlen)) return -1;
        rs->orig_ctx = orig;
        rs->attn_factor = gguf_f32_arch(g, a, "rope.scaling.attn_factor", 0.0f);
        rs->beta_fast = gguf_f32_arch(g, a, "rope.scaling.yarn_beta_fast", 0.0f);
        rs->beta_slow = gguf_f32_arch(g, a, "rope.scaling.yarn_beta_slow", 0.0f);
        if (rope_scaling_check(rs, "GGUF rope.scaling", err, errlen)) return -1;
    }
    if (gguf_find_tensor(g, "rope_freqs.weight"))
        return set_err(err, errlen, "GGUF: tensor rope_freqs.weight (per-dim RoPE frequency factors) is not supported yet");
    hp->rope_style = hp->arch == ARCH_LLAMA ? ROPE_NORM : ROPE_NEOX;
    hp->has_qkv_bias = gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    hp->has_qk_norm = hp->arch == ARCH_QWEN3 || hp->arch == ARCH_QWEN3MOE || hp->arch == ARCH_QWEN35;
    const struct pxq_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    hp->n_vocab = emb ? (int)emb->ne[1] : 0;
    hp->tie_embd = gguf_find_tensor(g, "output.weight") == NULL;
    if (hp->arch == ARCH_QWEN3MOE) {
        if (gguf_u32_arch(g, a, "expert_count", 1, 0, &hp->n_expert, err, errlen) ||
            gguf_u32_arch(g, a, "expert_used_count", 1, 0, &hp->n_expert_used, err, errlen) ||
            gguf_u32_arch(g, a, "expert_feed_forward_length", 1, 0, &hp->n_ff_exp, err, errlen))
            return -1;
        hp->norm_topk_prob = 1; /* llama.cpp: qwen3moe always renormalises the top-k weights */
        if (check_moe(hp, 1, err, errlen)) return -1;
    }
    if (hp->arch == ARCH_QWEN35) {
        int interval = 4;
        if (gguf_u32_arch(g, a, "ssm.conv_kernel", 1, 0, &hp->ssm_conv_kernel, err, errlen) ||
            gguf_u32_arch(g, a, "ssm.group_count", 1, 0, &hp->ssm_n_k_head, err, errlen) ||
            gguf_u32_arch(g, a, "ssm.time_step_rank", 1, 0, &hp->ssm_n_v_head, err, errlen) ||
            gguf_u32_arch(g, a, "ssm.state_size", 1, 0, &hp->ssm_head_k_dim, err, errlen) ||
            gguf_u32_arch(g, a, "full_attention_interval", 0, 4, &interval, err, errlen))
            return -1;
        int inner = 0;
        if (gguf_u32_arch(g, a, "ssm.inner_size", 1, 0, &inner, err, errlen)) return -1;
        hp->ssm_head_v_dim = hp->ssm_n_v_head ? inner / hp->ssm_n_v_head : 0;
        hp->attn_output_gate = 1;
        hp->ssm_v_tiled = 1; /* llama.cpp's converter reorders value heads so head h reads key head h % n_k */
        /* llama.cpp counts MTP (nextn) layers in block_count (as for GLM-4.5) */
        if (gguf_u32_arch(g, a, "nextn_predict_layers", 0, 0, &hp->n_mtp_layer, err, errlen)) return -1;
        if (hp->n_mtp_layer >= hp->n_layer) return set_err(err, errlen, "GGUF: nextn_predict_layers %d >= block_count %d", hp->n_mtp_layer, hp->n_layer);
        hp->n_layer -= hp->n_mtp_layer;
        for (int il = 0; il < hp->n_layer && il < PXQ_MAX_LAYERS; il++)
            hp->layer_kind[il] = (il + 1) % (interval ? interval : 4) == 0 ? LAYER_ATTN : LAYER_DELTANET;
        if (model_qwen35_check_hparams(hp, 1, err, errlen)) return -1;
        if (inner != hp->ssm_n_v_head * hp->ssm_head_v_dim)
            return set_err(err, errlen, "GGUF: %s.ssm.inner_size %d must be a multiple of %s.ssm.time_step_rank %d", a, inner, a,
                           hp->ssm_n_v_head);
    }
    hp->bos_id = -1;
    uint32_t v;
    if (gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &v) == 0) hp->bos_id = (int32_t)v;
    if (gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &v) == 0) add_eos(hp, (int32_t)v);
    if (gguf_get_u32(g, "tokenizer.ggml.eot_token_id", &v) == 0) add_eos(hp, (int32_t)v);
    return 0;
}

/* ---- binding weights with shape checks ---- */

struct binder {
    struct pxq_model *m;
    char *err;
    size_t errlen;
    int failed;
};

/* Look up `name` and check its shape (ne order; trailing dims 1). required=0 allows absence. */
static const struct pxq_tensor *bind(struct binder *b, const char *name, int required, int64_t ne0, int64_t ne1, int64_t ne2) {
    if (b->failed) return NULL;
    const struct pxq_tensor *t = find(b->m, name);
    if (!t) {
        const char *sn, *sd;
        const int n_skip = b->m->st ? st_n_skipped(b->m->st, &sn, &sd) : 0;
        if (required && n_skip)
            b->failed = set_err(b->err, b->errlen, "%s: missing tensor '%s' (left out for a dtype PXQ does not read: "
                                "'%s' %s and %d more; PXQ reads F32, F16 and BF16)", b->m->path, name, sn, sd, n_skip - 1);
        else if (required)
            b->failed = set_err(b->err, b->errlen, "%s: missing tensor '%s'", b->m->path, name);
        return NULL;
    }
    int64_t want[4] = {ne0, ne1, ne2, 1};
    int ok = 1;
    for (int d = 0; d < 4; d++) ok &= t->ne[d] == want[d];
    if (!ok) {
        b->failed = set_err(b->err, b->errlen,
                            "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld, 1] (ne order)",
                            b->m->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                            (long long)t->ne[3], (long long)ne0, (long long)ne1, (long long)ne2);
        return NULL;
    }
    if (!type_supported(t->type) || type_row_bytes(t->type, t->ne[0]) == 0) {
        b->failed = set_err(b->err, b->errlen, "%s: tensor '%s' has unsupported type %s for its row length %lld",
                            b->m->path, name, type_name(t->type), (long long)t->ne[0]);
        return NULL;
    }
    return t;
}

static const struct pxq_tensor *bindl(struct binder *b, int il, const char *suffix, int required, int64_t ne0, int64_t ne1,
                                      int64_t ne2) {
    char name[PXQ_NAME_MAX + 16];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    return bind(b, name, required, ne0, ne1, ne2);
}

/* Make per-expert views of a GGUF 3D expert tensor [ne0, ne1, n_expert]. */
static const struct pxq_tensor *expert_view(struct pxq_model *m, const struct pxq_tensor *t3, int e) {
    struct pxq_tensor *v = &m->owned[m->n_owned++];
    *v = *t3;
    v->cpu_pack = NULL;
    snprintf(v->name, sizeof v->name, "%.100s[%d]", t3->name, e);
    v->n_dims = 2;
    v->ne[2] = 1;
    size_t slice = type_row_bytes(t3->type, t3->ne[0]) * (size_t)t3->ne[1];
    v->data = (const char *)t3->data + slice * (size_t)e;
    v->nbytes = slice;
    return v;
}

static int bind_moe(struct binder *b, int il) {
    struct pxq_model *m = b->m;
    const struct pxq_hparams *hp = &m->hp;
    struct pxq_layer *L = &m->layers[il];
    L->ffn_gate_inp = bindl(b, il, "ffn_gate_inp.weight", 1, hp->n_embd, hp->n_expert, 1);
    L->experts = xcalloc((size_t)hp->n_expert, sizeof *L->experts);
    const struct pxq_tensor *g3 = bindl(b, il, "ffn_gate_exps.weight", 0, hp->n_embd, hp->n_ff_exp, hp->n_expert);
    if (g3) { /* GGUF: stacked experts */
        const struct pxq_tensor *u3 = bindl(b, il, "ffn_up_exps.weight", 1, hp->n_embd, hp->n_ff_exp, hp->n_expert);
        const struct pxq_tensor *d3 = bindl(b, il, "ffn_down_exps.weight", 1, hp->n_ff_exp, hp->n_embd, hp->n_expert);
        if (b->failed) return -1;
        for (int e = 0; e < hp->n_expert; e++) {
            L->experts[e].gate = expert_view(m, g3, e);
            L->experts[e].up = expert_view(m, u3, e);
            L->experts[e].down = expert_view(m, d3, e);
        }
        return 0;
    }
    for (int e = 0; e < hp->n_expert && !b->failed; e++) { /* HF: one tensor per expert */
        char n[96];
        snprintf(n, sizeof n, "ffn_gate.%d.weight", e);
        L->experts[e].gate = bindl(b, il, n, 1, hp->n_embd, hp->n_ff_exp, 1);
        snprintf(n, sizeof n, "ffn_up.%d.weight", e);
        L->experts[e].up = bindl(b, il, n, 1, hp->n_embd, hp->n_ff_exp, 1);
        snprintf(n, sizeof n, "ffn_down.%d.weight", e);
        L->experts[e].down = bindl(b, il, n, 1, hp->n_ff_exp, hp->n_embd, 1);
    }
    return b->failed;
}

/* Defined in model_qwen35.c when the hybrid is built; binds the DeltaNet and gated-attention layers. */
void model_bind_qwen35_layer(struct pxq_layer *L, const struct pxq_hparams *hp, int il,
                             const struct pxq_tensor *(*lookup)(void *ctx, int il, const char *suffix, int required,
                                                                int64_t ne0, int64_t ne1, int64_t ne2),
                             void *ctx);
/* The same for MTP layer il (>= n_layer): a whole gated-attention decoder layer plus the nextn tensors. */
int model_bind_qwen35_mtp_layer(struct pxq_layer *L, const struct pxq_hparams *hp, int il,
                                const struct pxq_tensor *(*lookup)(void *ctx, int il, const char *suffix, int required,
                                                                   int64_t ne0, int64_t ne1, int64_t ne2),
                                void *ctx);

static const struct pxq_tensor *bind_cb(void *ctx, int il, const char *suffix, int required, int64_t ne0, int64_t ne1,
                                        int64_t ne2) {
    return bindl(ctx, il, suffix, required, ne0, ne1, ne2);
}

static int bind_weights(struct pxq_model *m, char *err, size_t errlen) {
    struct pxq_hparams *hp = &m->hp;
    struct binder b = {m, err, errlen, 0};
    if (hp->n_layer > PXQ_MAX_LAYERS) return set_err(err, errlen, "%s: %d layers exceed the limit of %d", m->path, hp->n_layer, PXQ_MAX_LAYERS);
    if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0)
        return set_err(err, errlen, "%s: n_head (%d) must be a positive multiple of n_head_kv (%d)", m->path, hp->n_head, hp->n_head_kv);
    if (hp->head_dim <= 0 || hp->head_dim % 2 || hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return set_err(err, errlen, "%s: bad head_dim %d / rotary dims %d", m->path, hp->head_dim, hp->n_rot);
    const struct pxq_tensor *emb = find(m, "token_embd.weight");
    if (emb && hp->n_vocab == 0) hp->n_vocab = (int)emb->ne[1];
    m->token_embd = bind(&b, "token_embd.weight", 1, hp->n_embd, hp->n_vocab, 1);
    m->output_norm = bind(&b, "output_norm.weight", 1, hp->n_embd, 1, 1);
    m->output = hp->tie_embd ? m->token_embd : bind(&b, "output.weight", 1, hp->n_embd, hp->n_vocab, 1);
    if (b.failed) return -1;
    if (hp->n_expert) m->owned = xcalloc((size_t)hp->n_layer * (size_t)hp->n_expert * 3, sizeof *m->owned);
    const int64_t q_dim = (int64_t)hp->n_head * hp->head_dim, kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    for (int il = 0; il < hp->n_layer && !b.failed; il++) {
        struct pxq_layer *L = &m->layers[il];
        L->attn_norm = bindl(&b, il, "attn_norm.weight", 1, hp->n_embd, 1, 1);
        if (hp->arch == ARCH_QWEN35) {
            model_bind_qwen35_layer(L, hp, il, bind_cb, &b);
        } else {
            L->attn_q = bindl(&b, il, "attn_q.weight", 1, hp->n_embd, q_dim, 1);
            L->attn_k = bindl(&b, il, "attn_k.weight", 1, hp->n_embd, kv_dim, 1);
            L->attn_v = bindl(&b, il, "attn_v.weight", 1, hp->n_embd, kv_dim, 1);
            L->attn_output = bindl(&b, il, "attn_output.weight", 1, q_dim, hp->n_embd, 1);
            L->attn_q_b = bindl(&b, il, "attn_q.bias", hp->has_qkv_bias, q_dim, 1, 1);
            L->attn_k_b = bindl(&b, il, "attn_k.bias", hp->has_qkv_bias, kv_dim, 1, 1);
            L->attn_v_b = bindl(&b, il, "attn_v.bias", hp->has_qkv_bias, kv_dim, 1, 1);
            L->attn_q_norm = bindl(&b, il, "attn_q_norm.weight", hp->has_qk_norm, hp->head_dim, 1, 1);
            L->attn_k_norm = bindl(&b, il, "attn_k_norm.weight", hp->has_qk_norm, hp->head_dim, 1, 1);
        }
        L->ffn_norm = bindl(&b, il, "ffn_norm.weight", 0, hp->n_embd, 1, 1);
        if (!L->ffn_norm) L->ffn_norm = bindl(&b, il, "post_attention_norm.weight", 1, hp->n_embd, 1, 1);
        if (hp->n_expert) {
            bind_moe(&b, il);
        } else {
            L->ffn_gate = bindl(&b, il, "ffn_gate.weight", 1, hp->n_embd, hp->n_ff, 1);
            L->ffn_up = bindl(&b, il, "ffn_up.weight", 1, hp->n_embd, hp->n_ff, 1);
            L->ffn_down = bindl(&b, il, "ffn_down.weight", 1, hp->n_ff, hp->n_embd, 1);
        }
    }
    if (hp->n_mtp_layer) { /* MTP weights: bound when present (HF drops them when it saves a model) */
        char name[64];
        snprintf(name, sizeof name, "blk.%d.nextn.eh_proj.weight", hp->n_layer);
        if (hp->arch != ARCH_QWEN35 || hp->n_layer + hp->n_mtp_layer > PXQ_MAX_LAYERS || !find(m, name)) hp->n_mtp_layer = 0;
    }
    for (int il = hp->n_layer; il < hp->n_layer + hp->n_mtp_layer && !b.failed; il++)
        if ((hp->layer_kind[il] = LAYER_ATTN, model_bind_qwen35_mtp_layer(&m->layers[il], hp, il, bind_cb, &b)) != 0 && !b.failed)
            b.failed = set_err(err, errlen, "%s: MTP layer %d: weights could not be bound", m->path, il);
    /* a layer count below the file's layers would run a truncated model: every blk.N past the
     * layers (the optional MTP tensors, nextn, aside) is an error */
    for (int i = 0; i < m->n_tab && !b.failed; i++) {
        int il = -1, n = 0;
        const char *name = m->tab[i].name;
        if (sscanf(name, "blk.%d.%n", &il, &n) == 1 && n > 0 && il >= hp->n_layer + hp->n_mtp_layer &&
            strncmp(name + n, "nextn.", 6) != 0)
            b.failed = set_err(err, errlen, "%s: tensor '%s' is in layer %d, but the model has %d layers (%s)", m->path, name, il,
                               hp->n_layer, m->gguf ? "GGUF block_count" : "config.json num_hidden_layers");
    }
    return b.failed ? -1 : 0;
}

/* ---- open ---- */

static int build_table_gguf(struct pxq_model *m) {
    int cap = 0;
    for (int i = 0; i < gguf_n_tensors(m->gguf); i++) {
        const struct pxq_tensor *t = gguf_tensor(m->gguf, i);
        tab_add(m, &cap, t->name, t);
    }
    tab_sort(m);
    return 0;
}

static int build_table_hf(struct pxq_model *m) {
    int cap = 0;
    char g[PXQ_NAME_MAX];
    for (int i = 0; i < st_n_tensors(m->st); i++) {
        const struct pxq_tensor *t = st_tensor(m->st, i);
        if (hf_to_gguf_name(t->name, m->hp.n_layer, g, sizeof g) == 0) tab_add(m, &cap, g, t);
    }
    tab_sort(m);
    return 0;
}

static int is_gguf_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    if (!f) return 0;
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

struct pxq_model *model_open(const char *path, char *err, size_t errlen) {
    if (!path || !*path) {
        set_err(err, errlen, "no model path given");
        return NULL;
    }
    if (!is_dir(path) && regular_file(path, err, errlen) != 0) return NULL; /* missing, or a pipe/device: never opened */
    if (strlen(path) >= sizeof ((struct pxq_model *)0)->path) { /* the joins below ("dir/tokenizer.json") fit after it */
        set_err(err, errlen, "model path of %zu bytes: at most %zu are supported", strlen(path),
                sizeof ((struct pxq_model *)0)->path - 1);
        return NULL;
    }
    struct pxq_model *m = xcalloc(1, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", path);
    if (is_dir(path)) {
        if (hparams_from_hf(&m->hp, path, err, errlen) != 0) goto fail;
        m->st = st_open_dir(path, err, errlen);
        if (!m->st) goto fail;
        build_table_hf(m);
        char tj[1200];
        if (path_join(tj, sizeof tj, path, "tokenizer.json") == 0 && path_exists(tj)) {
            m->tok = tokenizer_load_hf(path, err, errlen);
            if (!m->tok) goto fail;
        }
    } else {
        if (!is_gguf_file(path)) {
            set_err(err, errlen, "%s: not a GGUF file (bad magic) nor an HF model directory", path);
            goto fail;
        }
        m->gguf = gguf_open(path, err, errlen);
        if (!m->gguf) goto fail;
        if (hparams_from_gguf(&m->hp, m->gguf, err, errlen) != 0) goto fail;
        build_table_gguf(m);
        if (gguf_arr_len(m->gguf, "tokenizer.ggml.tokens") > 0) {
            m->tok = tokenizer_load_gguf(m->gguf, err, errlen);
            if (!m->tok) goto fail;
        }
    }
    if (bind_weights(m, err, errlen) != 0) goto fail;
    if (m->gguf) { /* the pxq KV cache's calibration, checked against the attention layers and KV heads */
        int r = kv_calib_read_gguf(&m->kvc, m->gguf, hparams_n_attn_layers(&m->hp), m->hp.n_head_kv, err, errlen);
        if (r < 0) {
            char why[512];
            snprintf(why, sizeof why, "%s", err);
            set_err(err, errlen, "%s: %s", path, why);
            goto fail;
        }
        m->has_kvc = r == 1;
    }
    if (m->tok) {
        int32_t ids[PXQ_MAX_EOS];
        int n = tokenizer_eos_ids(m->tok, ids, PXQ_MAX_EOS);
        for (int i = 0; i < n; i++) add_eos(&m->hp, ids[i]);
    }
    /* ids the model cannot produce (a config or GGUF key naming a token past n_vocab) are dropped */
    int k = 0;
    for (int i = 0; i < m->hp.n_eos; i++)
        if (m->hp.eos_ids[i] < m->hp.n_vocab) m->hp.eos_ids[k++] = m->hp.eos_ids[i];
    m->hp.n_eos = k;
    if (m->hp.bos_id >= m->hp.n_vocab) m->hp.bos_id = -1;
    return m;
fail:
    model_free(m);
    return NULL;
}

struct pxq_model *model_from_tensors(const char *name, const struct pxq_hparams *hp, struct pxq_tensor *tensors, int n,
                                     void *data, char *err, size_t errlen) {
    struct pxq_model *m = xcalloc(1, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", name);
    m->hp = *hp;
    m->own_tensors = tensors;
    m->n_own_tensors = n;
    m->own_data = data;
    int cap = 0;
    for (int i = 0; i < n; i++) tab_add(m, &cap, tensors[i].name, &tensors[i]);
    tab_sort(m);
    if (bind_weights(m, err, errlen) != 0) {
        model_free(m);
        return NULL;
    }
    return m;
}

void model_free(struct pxq_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_tab; i++) q8x8_tensor_release((struct pxq_tensor *)m->tab[i].t); /* the CPU's packed copies */
    for (int i = 0; i < m->n_owned; i++) q8x8_tensor_release(&m->owned[i]);
    free(m->own_tensors);
    free(m->own_data);
    for (int il = 0; il < PXQ_MAX_LAYERS; il++) free(m->layers[il].experts);
    free(m->owned);
    free(m->tab);
    if (m->tok) tokenizer_free(m->tok);
    if (m->gguf) gguf_close(m->gguf);
    if (m->st) st_close(m->st);
    kv_calib_free(&m->kvc);
    free(m);
}

const struct pxq_hparams *model_hparams(const struct pxq_model *m) { return &m->hp; }

int hparams_n_attn_layers(const struct pxq_hparams *hp) {
    int n = 0;
    for (int il = 0; il < hp->n_layer && il < PXQ_MAX_LAYERS; il++) n += hp->layer_kind[il] == LAYER_ATTN;
    return n;
}

int model_set_rope_scaling(struct pxq_model *m, const struct rope_scaling *rs, char *err, size_t errlen) {
    if (rope_scaling_check(rs, "RoPE scaling", err, errlen)) return -1;
    m->hp.rope_scaling = *rs;
    return 0;
}
const struct pxq_layer *model_layer(const struct pxq_model *m, int il) { return &m->layers[il]; }
const struct pxq_tensor *model_token_embd(const struct pxq_model *m) { return m->token_embd; }
const struct pxq_tensor *model_output_norm(const struct pxq_model *m) { return m->output_norm; }
const struct pxq_tensor *model_output(const struct pxq_model *m) { return m->output; }
struct pxq_tokenizer *model_tokenizer(const struct pxq_model *m) { return m->tok; }
const char *model_path(const struct pxq_model *m) { return m->path; }
int model_is_gguf(const struct pxq_model *m) { return m->gguf != NULL; }
struct gguf_file *model_gguf(const struct pxq_model *m) { return m->gguf; }
const struct kv_calib *model_kv_calib(const struct pxq_model *m) { return m->has_kvc ? &m->kvc : NULL; }

int model_n_tensors(const struct pxq_model *m) {
    return m->gguf ? gguf_n_tensors(m->gguf) : m->st ? st_n_tensors(m->st) : m->n_own_tensors;
}
const struct pxq_tensor *model_tensor(const struct pxq_model *m, int i) {
    return m->gguf ? gguf_tensor(m->gguf, i) : m->st ? st_tensor(m->st, i) : &m->own_tensors[i];
}

size_t model_weight_bytes(const struct pxq_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_tab; i++) n += m->tab[i].t->nbytes;
    return n;
}
