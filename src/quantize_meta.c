/* quantize_meta.c - the GGUF metadata of a converted model: general.*, the architecture's
 * hyperparameters and the tokenizer, with the key names and conventions of llama.cpp's
 * convert_hf_to_gguf.py (checked against the llama.cpp files in tests/data/gguf/), so that the
 * output is self-contained and loads in llama.cpp as well as PXQ. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_write.h"
#include "model.h"
#include "quantize_meta.h"
#include "util.h"

/* dir/name parsed, or NULL: *failed 0 when the file is absent (or not JSON), -1 with a message when
 * something there cannot be read (a pipe or device: "not a regular file", never read). */
static cJSON *read_json(const char *dir, const char *name, int *failed, char *err, size_t errlen) {
    char path[1200];
    size_t len;
    *failed = 0;
    if (path_join(path, sizeof path, dir, name) != 0 || !path_exists(path)) return NULL;
    char *s = read_regular_file(path, 256u << 20, &len, err, errlen);
    if (!s) {
        *failed = -1;
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(s, len);
    free(s);
    return j;
}

static void put_hparams(struct gguf_writer *w, const struct pxq_hparams *hp) {
    const char *a = hp->arch_name;
    char k[128];
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", a, suffix), k)
    gguf_w_u32(w, KEY("block_count"), (uint32_t)(hp->n_layer + hp->n_mtp_layer)); /* llama.cpp counts the MTP layers */
    if (hp->n_mtp_layer) gguf_w_u32(w, KEY("nextn_predict_layers"), (uint32_t)hp->n_mtp_layer);
    gguf_w_u32(w, KEY("context_length"), (uint32_t)hp->n_ctx_train);
    gguf_w_u32(w, KEY("embedding_length"), (uint32_t)hp->n_embd);
    if (hp->n_ff) gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)hp->n_ff);
    gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)hp->n_head);
    gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)hp->n_head_kv);
    gguf_w_f32(w, KEY("rope.freq_base"), hp->rope_theta);
    gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), hp->rms_eps);
    gguf_w_u32(w, KEY("attention.key_length"), (uint32_t)hp->head_dim);
    gguf_w_u32(w, KEY("attention.value_length"), (uint32_t)hp->head_dim);
    if (hp->arch == ARCH_LLAMA || hp->n_rot != hp->head_dim) gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t)hp->n_rot);
    if (hp->arch == ARCH_LLAMA) gguf_w_u32(w, KEY("vocab_size"), (uint32_t)hp->n_vocab);
    if (hp->arch == ARCH_QWEN3MOE) {
        gguf_w_u32(w, KEY("expert_count"), (uint32_t)hp->n_expert);
        gguf_w_u32(w, KEY("expert_used_count"), (uint32_t)hp->n_expert_used);
        gguf_w_u32(w, KEY("expert_feed_forward_length"), (uint32_t)hp->n_ff_exp);
    }
    if (hp->arch == ARCH_QWEN35) {
        int interval = 0;
        for (int il = 0; il < hp->n_layer; il++)
            if (hp->layer_kind[il] == LAYER_ATTN) {
                interval = il + 1;
                break;
            }
        gguf_w_u32(w, KEY("ssm.conv_kernel"), (uint32_t)hp->ssm_conv_kernel);
        gguf_w_u32(w, KEY("ssm.state_size"), (uint32_t)hp->ssm_head_k_dim);
        gguf_w_u32(w, KEY("ssm.group_count"), (uint32_t)hp->ssm_n_k_head);
        gguf_w_u32(w, KEY("ssm.time_step_rank"), (uint32_t)hp->ssm_n_v_head);
        gguf_w_u32(w, KEY("ssm.inner_size"), (uint32_t)(hp->ssm_n_v_head * hp->ssm_head_v_dim));
        gguf_w_u32(w, KEY("full_attention_interval"), (uint32_t)(interval ? interval : 4));
        gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t)hp->n_rot);
        const int32_t sections[4] = {11, 11, 10, 0}; /* llama.cpp's converter default (text-only: unused) */
        gguf_w_arr_i32(w, KEY("rope.dimension_sections"), sections, 4);
    }
#undef KEY
}

/* "<|...|>" looks special to llama.cpp's converter (does_token_look_special). */
static int looks_special(const char *s) {
    size_t n = strlen(s);
    return n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>");
}

static int32_t token_id_of(const cJSON *vocab, const cJSON *added, const char *s) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(vocab, s);
    if (cJSON_IsNumber(v)) return (int32_t)v->valuedouble;
    const cJSON *a;
    cJSON_ArrayForEach(a, added) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content"), *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (cJSON_IsString(c) && cJSON_IsNumber(id) && !strcmp(c->valuestring, s)) return (int32_t)id->valuedouble;
    }
    return -1;
}

/* tokenizer.ggml.* from tokenizer.json (BPE: vocab, merges, added tokens), tokenizer_config.json
 * (pad token, chat template) and chat_template.jinja. Token types: 1 NORMAL, 3 CONTROL (special
 * added tokens), 4 USER_DEFINED (other added tokens), 5 UNUSED ("[PAD<id>]" filler up to n_vocab). */
static int put_tokenizer(struct gguf_writer *w, const struct pxq_hparams *hp, const char *dir, char *err, size_t errlen) {
    int failed;
    cJSON *tj = read_json(dir, "tokenizer.json", &failed, err, errlen);
    if (!tj) return failed; /* no tokenizer (random test models): ids only */
    int rc = -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(tj, "added_tokens");
    cJSON *cfg = NULL;
    char **tok = NULL;
    size_t *tlen = NULL, n_merges = 0;
    int32_t *ttype = NULL;
    char **mer = NULL;
    size_t *mlen = NULL;
    int n = hp->n_vocab;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") || !cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        set_err(err, errlen, "%s/tokenizer.json: only BPE tokenizers (model.type \"BPE\" with vocab and merges) can be exported", dir);
        goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) if (cJSON_IsNumber(it) && it->valuedouble + 1 > n) n = (int)it->valuedouble + 1;
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        if (cJSON_IsNumber(id) && id->valuedouble + 1 > n) n = (int)id->valuedouble + 1;
    }
    if (n > 16 << 20) {
        set_err(err, errlen, "%s/tokenizer.json: token id %d out of range", dir, n - 1);
        goto out;
    }
    tok = xcalloc((size_t)n, sizeof *tok);
    tlen = xcalloc((size_t)n, sizeof *tlen);
    ttype = xcalloc((size_t)n, sizeof *ttype);
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0) continue;
        int id = (int)it->valuedouble;
        free(tok[id]);
        tok[id] = xstrdup(it->string);
        ttype[id] = 1;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id"), *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || !cJSON_IsString(c)) continue;
        int i = (int)id->valuedouble;
        free(tok[i]);
        tok[i] = xstrdup(c->valuestring);
        ttype[i] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special")) || looks_special(c->valuestring) ? 3 : 4;
    }
    for (int i = 0; i < n; i++) {
        if (!tok[i]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%d]", i);
            tok[i] = xstrdup(pad);
            ttype[i] = 5;
        }
        tlen[i] = strlen(tok[i]);
    }
    n_merges = (size_t)cJSON_GetArraySize(merges);
    mer = xcalloc(n_merges + 1, sizeof *mer);
    mlen = xcalloc(n_merges + 1, sizeof *mlen);
    size_t k = 0;
    cJSON_ArrayForEach(it, merges) { /* "a b" strings, or ["a", "b"] pairs (tokenizers >= 0.20) */
        if (cJSON_IsString(it)) {
            mer[k] = xstrdup(it->valuestring);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            const char *a = cJSON_GetArrayItem(it, 0)->valuestring, *b = cJSON_GetArrayItem(it, 1)->valuestring;
            mer[k] = xmalloc(strlen(a) + strlen(b) + 2);
            sprintf(mer[k], "%s %s", a, b);
        } else {
            set_err(err, errlen, "%s/tokenizer.json: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", dir, k);
            n_merges = k;
            goto out;
        }
        mlen[k] = strlen(mer[k]);
        k++;
    }
    gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_w_str(w, "tokenizer.ggml.pre", "qwen2"); /* Qwen2's pre-tokenizer regex (llama.cpp's name) */
    gguf_w_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, tlen, (size_t)n);
    gguf_w_arr_i32(w, "tokenizer.ggml.token_type", ttype, (size_t)n);
    gguf_w_arr_str(w, "tokenizer.ggml.merges", (const char *const *)mer, mlen, n_merges);
    int32_t eos = hp->n_eos ? hp->eos_ids[0] : -1, pad = -1;
    cfg = read_json(dir, "tokenizer_config.json", &failed, err, errlen);
    if (failed) goto out;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(cfg, "pad_token");
    if (cJSON_IsObject(pt)) pt = cJSON_GetObjectItemCaseSensitive(pt, "content");
    if (cJSON_IsString(pt)) pad = token_id_of(vocab, added, pt->valuestring);
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token");
    if (cJSON_IsObject(et)) et = cJSON_GetObjectItemCaseSensitive(et, "content");
    if (eos < 0 && cJSON_IsString(et)) eos = token_id_of(vocab, added, et->valuestring);
    if (eos >= 0) gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (pad >= 0) gguf_w_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
    if (hp->bos_id >= 0) gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)hp->bos_id);
    /* chat template: chat_template.jinja, else tokenizer_config.json's chat_template string */
    char path[1200];
    size_t len;
    if (path_join(path, sizeof path, dir, "chat_template.jinja") == 0 && path_exists(path)) {
        char *t = read_regular_file(path, 16u << 20, &len, err, errlen);
        if (!t) goto out;
        gguf_w_strn(w, "tokenizer.chat_template", t, len);
        free(t);
    } else {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (cJSON_IsString(ct)) gguf_w_str(w, "tokenizer.chat_template", ct->valuestring);
    }
    rc = 0;
out:
    for (int i = 0; tok && i < n; i++) free(tok[i]);
    for (size_t i = 0; mer && i < n_merges; i++) free(mer[i]);
    free(tok), free(tlen), free(ttype), free(mer), free(mlen);
    cJSON_Delete(cfg);
    cJSON_Delete(tj);
    return rc;
}

int quantize_put_meta(struct gguf_writer *w, const struct pxq_hparams *hp, const char *model_dir, uint32_t file_type,
                      char *err, size_t errlen) {
    gguf_w_str(w, "general.architecture", hp->arch_name);
    gguf_w_str(w, "general.type", "model");
    char name[256];
    const char *base = strrchr(model_dir, '/');
    base = base && base[1] ? base + 1 : model_dir;
    snprintf(name, sizeof name, "%s", base);
    size_t nl = strlen(name);
    if (nl && name[nl - 1] == '/') name[nl - 1] = 0;
    gguf_w_str(w, "general.name", name);
    put_hparams(w, hp);
    gguf_w_u32(w, "general.quantization_version", 2);
    gguf_w_u32(w, "general.file_type", file_type);
    return put_tokenizer(w, hp, model_dir, err, errlen);
}
