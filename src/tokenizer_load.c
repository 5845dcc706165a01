/* tokenizer_load.c - the tokenizer from HF tokenizer.json (+ tokenizer_config.json, chat_template.jinja)
 * or from GGUF metadata (llama.cpp llama-vocab.cpp semantics), into tok_build (tokenizer.c). */
#include "tokenizer_impl.h"

#include "gguf.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The GGUF pre-tokenizer regexes (llama.cpp llama-vocab.cpp, by tokenizer.ggml.pre). */
static const char RE_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const RE_DEFAULT[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)", "\\p{N}+",
    "[0-9][0-9][0-9]"};
/* tokenizer.ggml.pre -> regex (NULL: RE_DEFAULT), NFC (Qwen's tokenizer.json has it), ignore_merges */
static const struct { const char *name, *re; int nfc, ignore_merges; } GGUF_PRE[] = {
    {"qwen2", RE_QWEN2, 1, 0}, {"deepseek-r1-qwen", RE_QWEN2, 1, 0}, {"qwen35", RE_QWEN35, 1, 0},
    {"stablelm2", RE_QWEN2, 0, 0}, {"llama3", RE_LLAMA3, 0, 1}, {"llama-v3", RE_LLAMA3, 0, 1},
    {"llama-bpe", RE_LLAMA3, 0, 1}, {"gpt-2", TOK_RE_GPT2, 0, 0}, {"default", NULL, 0, 0}};


static void add_eos(struct pxq_tokenizer *t, int64_t id) {
    if (id < 0 || id >= t->n_vocab || t->raw_len[id] == UINT32_MAX || t->n_eos == MAX_EOS) return;
    for (int i = 0; i < t->n_eos; i++) if (t->eos[i] == id) return;
    t->eos[t->n_eos++] = (int32_t)id;
}

/* ---- tokenizer.json ----------------------------------------------------------------------------- */

static int jbool(const cJSON *o, const char *k, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}
static const char *jtype(const cJSON *o) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(v) ? v->valuestring : "";
}
static int jid(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < MAX_ID) ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return -1;
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int parse_normalizer(const cJSON *nz, struct tok_spec *sp, int depth, char *err, size_t errlen) {
    if (!nz || cJSON_IsNull(nz)) return 0;
    const char *ty = jtype(nz);
    if (!strcmp(ty, "NFC")) { sp->nfc = 1; return 0; }
    if (!strcmp(ty, "Sequence") && depth < 4) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(nz, "normalizers"), *x;
        if (!cJSON_IsArray(arr)) return set_err(err, errlen, "tokenizer.json: normalizer Sequence without a list");
        cJSON_ArrayForEach(x, arr) if (parse_normalizer(x, sp, depth + 1, err, errlen)) return -1;
        return 0;
    }
    return set_err(err, errlen, "tokenizer.json: unsupported normalizer \"%.40s\" (NFC or none only)", ty);
}

static int parse_pretok(const cJSON *pt, struct tok_spec *sp, int *have_bl, int depth, char *err, size_t errlen) {
    const char *ty = jtype(pt);
    if (*have_bl) return set_err(err, errlen, "tokenizer.json: pre-tokenizer after ByteLevel is not supported");
    if (!strcmp(ty, "Sequence") && depth < 4) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers"), *x;
        if (!cJSON_IsArray(arr)) return set_err(err, errlen, "tokenizer.json: pre_tokenizer Sequence without a list");
        cJSON_ArrayForEach(x, arr) if (parse_pretok(x, sp, have_bl, depth + 1, err, errlen)) return -1;
        return 0;
    }
    if (!strcmp(ty, "ByteLevel")) {
        *have_bl = 1;
        sp->bytelevel_prefix = jbool(pt, "add_prefix_space", 1);
        sp->bytelevel_regex = jbool(pt, "use_regex", 1);
        return 0;
    }
    if (!strcmp(ty, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(pt, "behavior");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") || jbool(pt, "invert", 0))
            return set_err(err, errlen, "tokenizer.json: Split supports behavior \"Isolated\" without invert only");
        if (!cJSON_IsString(re) && !cJSON_IsString(str))
            return set_err(err, errlen, "tokenizer.json: Split without a Regex or String pattern");
        if (sp->n_split == MAX_STEPS - 1) return set_err(err, errlen, "tokenizer.json: too many Split steps");
        sp->literal[sp->n_split] = !cJSON_IsString(re);
        sp->patterns[sp->n_split++] = cJSON_IsString(re) ? re->valuestring : str->valuestring;
        return 0;
    }
    return set_err(err, errlen, "tokenizer.json: unsupported pre_tokenizer \"%.40s\"", ty);
}

/* ---- tokenizer.json, SentencePiece forms (Llama 2, Mistral, TinyLlama: BPE with byte_fallback) ---- */

static const char METASPACE[] = "\xE2\x96\x81"; /* U+2581 */

static int is_str(const cJSON *v, const char *s) { return cJSON_IsString(v) && !strcmp(v->valuestring, s); }

/* The legacy form: normalizer Sequence[Prepend("▁"), Replace(" " -> "▁")] (or Replace alone). */
static int spm_normalizer(const cJSON *nz, struct tok_spec *sp, int *replaces, int depth, char *err, size_t errlen) {
    if (!nz || cJSON_IsNull(nz)) return 0;
    const char *ty = jtype(nz);
    const cJSON *x;
    if (!strcmp(ty, "Sequence") && depth < 4) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(nz, "normalizers");
        if (!cJSON_IsArray(arr)) return set_err(err, errlen, "tokenizer.json: normalizer Sequence without a list");
        cJSON_ArrayForEach(x, arr) if (spm_normalizer(x, sp, replaces, depth + 1, err, errlen)) return -1;
        return 0;
    }
    if (!strcmp(ty, "Prepend") && is_str(cJSON_GetObjectItemCaseSensitive(nz, "prepend"), METASPACE) && !*replaces) {
        sp->space_prefix = SPM_PREFIX_ALL;
        return 0;
    }
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(nz, "pattern");
    if (!strcmp(ty, "Replace") && is_str(cJSON_GetObjectItemCaseSensitive(pat, "String"), " ") &&
        is_str(cJSON_GetObjectItemCaseSensitive(nz, "content"), METASPACE)) {
        *replaces = 1;
        return 0;
    }
    return set_err(err, errlen, "tokenizer.json: unsupported normalizer \"%.40s\" for a byte_fallback BPE (Prepend \"\u2581\" "
                   "then Replace \" \" with \"\u2581\" only)", ty);
}

/* The newer form: pre_tokenizer Metaspace (prepend_scheme always / first / never, split). */
static int spm_pretok(const cJSON *pt, struct tok_spec *sp, int *replaces, char *err, size_t errlen) {
    if (!pt || cJSON_IsNull(pt)) return 0;
    if (strcmp(jtype(pt), "Metaspace") || !is_str(cJSON_GetObjectItemCaseSensitive(pt, "replacement"), METASPACE))
        return set_err(err, errlen, "tokenizer.json: unsupported pre_tokenizer \"%.40s\" for a byte_fallback BPE "
                       "(Metaspace with replacement \"\u2581\" only)", jtype(pt));
    const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(pt, "prepend_scheme");
    int pre = jbool(pt, "add_prefix_space", 1) ? SPM_PREFIX_ALL : SPM_PREFIX_NONE; /* before prepend_scheme */
    if (is_str(scheme, "first")) pre = SPM_PREFIX_FIRST;
    else if (is_str(scheme, "never")) pre = SPM_PREFIX_NONE;
    else if (scheme && !is_str(scheme, "always")) return set_err(err, errlen, "tokenizer.json: Metaspace prepend_scheme is not always, first or never");
    sp->space_prefix = pre == SPM_PREFIX_NONE ? pre : pre | SPM_PREFIX_UNLESS_SPACE;
    sp->metaspace_split = jbool(pt, "split", 1);
    *replaces = 1;
    return 0;
}

/* The decoder turns "▁" back into spaces and <0xNN> into bytes (what tokenizer_decode does for SPM);
 * Strip(" ", start 1) or a prepending Metaspace drops the first space, as llama.cpp's detokenize. */
static int spm_decoder(const cJSON *dec, struct tok_spec *sp, int depth, char *err, size_t errlen) {
    if (!dec || cJSON_IsNull(dec)) return 0;
    const char *ty = jtype(dec);
    const cJSON *x;
    if (!strcmp(ty, "Sequence") && depth < 4) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(dec, "decoders");
        if (!cJSON_IsArray(arr)) return set_err(err, errlen, "tokenizer.json: decoder Sequence without a list");
        cJSON_ArrayForEach(x, arr) if (spm_decoder(x, sp, depth + 1, err, errlen)) return -1;
        return 0;
    }
    if (!strcmp(ty, "ByteFallback") || !strcmp(ty, "Fuse")) return 0;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(dec, "pattern");
    if (!strcmp(ty, "Replace") && is_str(cJSON_GetObjectItemCaseSensitive(pat, "String"), METASPACE) &&
        is_str(cJSON_GetObjectItemCaseSensitive(dec, "content"), " "))
        return 0;
    if (!strcmp(ty, "Strip") && is_str(cJSON_GetObjectItemCaseSensitive(dec, "content"), " ")) {
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(dec, "start");
        sp->strip_space = cJSON_IsNumber(start) && start->valuedouble >= 1;
        return 0;
    }
    if (!strcmp(ty, "Metaspace")) {
        const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(dec, "prepend_scheme");
        sp->strip_space = !is_str(scheme, "never") && jbool(dec, "add_prefix_space", 1);
        return 0;
    }
    return set_err(err, errlen, "tokenizer.json: unsupported decoder \"%.40s\" for a byte_fallback BPE", ty);
}

/* post_processor TemplateProcessing: the special tokens before and after $A of "single" become BOS
 * and EOS (one each at most); others add none. */
static int spm_post(const cJSON *pp, const char **bos, const char **eos, char *err, size_t errlen) {
    if (!pp || cJSON_IsNull(pp) || strcmp(jtype(pp), "TemplateProcessing")) return 0;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single"), *x;
    int seen_a = 0;
    cJSON_ArrayForEach(x, single) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(x, "SpecialToken");
        if (cJSON_GetObjectItemCaseSensitive(x, "Sequence")) { seen_a = 1; continue; }
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(st, "id");
        if (!cJSON_IsString(id)) return set_err(err, errlen, "tokenizer.json: post_processor.single entry is neither Sequence nor SpecialToken");
        const char **slot = seen_a ? eos : bos;
        if (*slot) return set_err(err, errlen, "tokenizer.json: post_processor adds more than one token %s the text", seen_a ? "after" : "before");
        *slot = id->valuestring;
    }
    return 0;
}

static int parse_hf_spm(const cJSON *root, struct tok_spec *sp, char *err, size_t errlen) {
    int replaces = 0;
    sp->kind = TOK_SPM_BPE;
    if (spm_normalizer(cJSON_GetObjectItemCaseSensitive(root, "normalizer"), sp, &replaces, 0, err, errlen) ||
        spm_pretok(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), sp, &replaces, err, errlen) ||
        spm_decoder(cJSON_GetObjectItemCaseSensitive(root, "decoder"), sp, 0, err, errlen) ||
        spm_post(cJSON_GetObjectItemCaseSensitive(root, "post_processor"), &sp->bos_tok, &sp->eos_tok, err, errlen))
        return -1;
    if (!replaces)
        return set_err(err, errlen, "tokenizer.json: a byte_fallback BPE needs a Metaspace pre-tokenizer or a normalizer "
                       "that replaces \" \" with \"\u2581\"");
    for (int i = 0; i < sp->n_vocab; i++)
        sp->vocab[i].type = spm_byte_token(sp->vocab[i].s, sp->vocab[i].len) >= 0 ? TT_BYTE : TT_NORMAL;
    for (int i = 0; i < sp->n_added; i++) sp->added[i].normalized = 0; /* matched in the raw text (see tokenizer_spm.c) */
    return 0;
}

/* Fill sp from a parsed tokenizer.json; pointers in sp point into root. */
static int parse_hf(const cJSON *root, struct tok_spec *sp, char *err, size_t errlen) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model"), *x;
    if (!cJSON_IsObject(model)) return set_err(err, errlen, "tokenizer.json: no \"model\" object");
    if (cJSON_GetObjectItemCaseSensitive(model, "type") && strcmp(jtype(model), "BPE"))
        return set_err(err, errlen, "tokenizer.json: model type \"%.40s\" is not BPE", jtype(model));
    const char *bad[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, bad[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
            return set_err(err, errlen, "tokenizer.json: model.%s is not supported", bad[i]);
    }
    const int byte_fallback = jbool(model, "byte_fallback", 0);
    sp->ignore_merges = jbool(model, "ignore_merges", 0);
    sp->fuse_unk = jbool(model, "fuse_unk", 0);
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk)) { sp->unk = unk->valuestring; sp->unk_len = strlen(unk->valuestring); }

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return set_err(err, errlen, "tokenizer.json: model.vocab is not an object");
    int nv = cJSON_GetArraySize(vocab);
    sp->vocab = xcalloc(nv ? nv : 1, sizeof *sp->vocab);
    cJSON_ArrayForEach(x, vocab) {
        struct tok_src *v = &sp->vocab[sp->n_vocab];
        if (jid(x, &v->id)) return set_err(err, errlen, "tokenizer.json: vocab \"%.40s\": id is not an integer in [0, 2^24)", x->string);
        v->s = x->string;
        v->len = strlen(x->string);
        sp->n_vocab++;
    }
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (merges && !cJSON_IsArray(merges)) return set_err(err, errlen, "tokenizer.json: model.merges is not a list");
    int nm = cJSON_GetArraySize(merges);
    sp->merges = xcalloc(nm ? nm : 1, sizeof *sp->merges);
    cJSON_ArrayForEach(x, merges) {
        struct merge_src *m = &sp->merges[sp->n_merges];
        if (cJSON_IsString(x)) { /* "a b"; HF skips "#version" lines */
            const char *s = x->valuestring, *sp1 = s[0] ? strchr(s + 1, ' ') : NULL;
            if (!strncmp(s, "#version", 8)) continue;
            if (!sp1 || strchr(sp1 + 1, ' '))
                return set_err(err, errlen, "tokenizer.json: merge %d \"%.40s\" is not \"a b\"", sp->n_merges, s);
            *m = (struct merge_src){s, (size_t)(sp1 - s), sp1 + 1, strlen(sp1 + 1)};
        } else if (cJSON_GetArraySize(x) == 2 && cJSON_IsString(x->child) && cJSON_IsString(x->child->next)) {
            const char *a = x->child->valuestring, *b = x->child->next->valuestring;
            *m = (struct merge_src){a, strlen(a), b, strlen(b)};
        } else {
            return set_err(err, errlen, "tokenizer.json: merge %d is neither \"a b\" nor [a, b]", sp->n_merges);
        }
        sp->n_merges++;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return set_err(err, errlen, "tokenizer.json: added_tokens is not a list");
    int na = cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0;
    sp->added = xcalloc(na ? na : 1, sizeof *sp->added);
    for (x = na ? added->child : NULL; x; x = x->next) {
        struct added_src *a = &sp->added[sp->n_added];
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(x, "content");
        if (!cJSON_IsString(c) || jid(cJSON_GetObjectItemCaseSensitive(x, "id"), &a->id))
            return set_err(err, errlen, "tokenizer.json: added_tokens[%d] needs a string content and an id in [0, 2^24)", sp->n_added);
        a->s = c->valuestring;
        a->len = strlen(c->valuestring);
        a->special = jbool(x, "special", 0);
        a->normalized = jbool(x, "normalized", !a->special);
        a->lstrip = jbool(x, "lstrip", 0);
        a->rstrip = jbool(x, "rstrip", 0);
        a->single_word = jbool(x, "single_word", 0);
        sp->n_added++;
    }
    if (byte_fallback) return parse_hf_spm(root, sp, err, errlen);
    if (parse_normalizer(cJSON_GetObjectItemCaseSensitive(root, "normalizer"), sp, 0, err, errlen)) return -1;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    int have_bl = 0;
    if (pt && !cJSON_IsNull(pt) && parse_pretok(pt, sp, &have_bl, 0, err, errlen)) return -1;
    if (!have_bl) return set_err(err, errlen, "tokenizer.json: no ByteLevel pre-tokenizer (only byte-level BPE is supported)");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (dec && !cJSON_IsNull(dec) && strcmp(jtype(dec), "ByteLevel"))
        return set_err(err, errlen, "tokenizer.json: unsupported decoder \"%.40s\" (ByteLevel only)", jtype(dec));
    return 0;
}

static void free_spec(struct tok_spec *sp) {
    free(sp->vocab);
    free(sp->added);
    free(sp->merges);
}

struct pxq_tokenizer *tokenizer_load_hf_buffer(const char *json, size_t len, char *err, size_t errlen) {
    if (!json) { set_err(err, errlen, "tokenizer.json: no data"); return NULL; }
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= json && at <= json + len ? (size_t)(at - json) : 0;
        set_err(err, errlen, "tokenizer.json: malformed JSON near byte %zu", off);
        return NULL;
    }
    struct tok_spec sp = {.hf_ids = 1};
    struct pxq_tokenizer *t = NULL;
    if (parse_hf(root, &sp, err, errlen) == 0) t = tok_build(&sp, err, errlen);
    if (t && sp.kind != TOK_BYTELEVEL) { /* the post-processor's BOS / EOS, by their text */
        t->bos_id = sp.bos_tok ? tokenizer_token_id(t, sp.bos_tok) : -1;
        t->eos_id = sp.eos_tok ? tokenizer_token_id(t, sp.eos_tok) : -1;
        t->add_bos = t->bos_id >= 0;
        t->add_eos = t->eos_id >= 0;
        if ((sp.bos_tok && t->bos_id < 0) || (sp.eos_tok && t->eos_id < 0)) {
            set_err(err, errlen, "tokenizer.json: post_processor token \"%.40s\" is not in the vocab",
                    sp.bos_tok && t->bos_id < 0 ? sp.bos_tok : sp.eos_tok);
            tokenizer_free(t);
            t = NULL;
        }
    }
    free_spec(&sp);
    cJSON_Delete(root);
    return t;
}

/* eos_token of tokenizer_config.json: "<|im_end|>" or {"content": "<|im_end|>", ...}, and the chat
 * template (chat_template.jinja, else tokenizer_config.json's). Both files are optional; one that is
 * there but is a pipe or device is an error (-1, "PATH: not a regular file"), not skipped: the EOS id
 * or the template would go missing without a word. */
static int read_tokenizer_config(struct pxq_tokenizer *t, const char *dir, char *err, size_t errlen) {
    char path[4096], e[256];
    size_t n;
    static const char *const names[] = {"chat_template.jinja", "tokenizer_config.json"};
    for (int i = 0; i < 2; i++)
        if (path_join(path, sizeof path, dir, names[i]) == 0 && is_special(path))
            return set_err(err, errlen, "%s: not a regular file", path);
    if (path_join(path, sizeof path, dir, "chat_template.jinja") == 0 && file_exists(path))
        t->chat_template = read_regular_file(path, 1 << 20, &n, e, sizeof e);
    if (path_join(path, sizeof path, dir, "tokenizer_config.json") != 0) return 0;
    char *txt = file_exists(path) ? read_regular_file(path, 64 << 20, &n, e, sizeof e) : NULL;
    cJSON *cfg = txt ? cJSON_ParseWithLength(txt, n) : NULL;
    free(txt);
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token");
    if (cJSON_IsObject(eos)) eos = cJSON_GetObjectItemCaseSensitive(eos, "content");
    if (cJSON_IsString(eos)) add_eos(t, tokenizer_token_id(t, eos->valuestring));
    if (t->kind != TOK_BYTELEVEL) { /* add_bos_token / add_eos_token (LlamaTokenizerFast) over the post-processor */
        const cJSON *bos = cJSON_GetObjectItemCaseSensitive(cfg, "bos_token");
        if (cJSON_IsObject(bos)) bos = cJSON_GetObjectItemCaseSensitive(bos, "content");
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
        const cJSON *ae = cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
        if (t->bos_id < 0 && cJSON_IsString(bos)) t->bos_id = tokenizer_token_id(t, bos->valuestring);
        if (t->eos_id < 0 && cJSON_IsString(eos)) t->eos_id = tokenizer_token_id(t, eos->valuestring);
        if (cJSON_IsBool(ab)) t->add_bos = cJSON_IsTrue(ab) && t->bos_id >= 0;
        if (cJSON_IsBool(ae)) t->add_eos = cJSON_IsTrue(ae) && t->eos_id >= 0;
    }
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template"), *x;
    if (!t->chat_template && cJSON_IsString(ct)) t->chat_template = xstrdup(ct->valuestring);
    if (!t->chat_template && cJSON_IsArray(ct)) /* [{"name": "default", "template": "..."}, ...] */
        cJSON_ArrayForEach(x, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(x, "name");
            const cJSON *tp = cJSON_GetObjectItemCaseSensitive(x, "template");
            if (cJSON_IsString(nm) && !strcmp(nm->valuestring, "default") && cJSON_IsString(tp))
                t->chat_template = xstrdup(tp->valuestring);
        }
    cJSON_Delete(cfg);
    return 0;
}

struct pxq_tokenizer *tokenizer_load_hf(const char *path, char *err, size_t errlen) {
    char file[4096], dir[4096];
    if (!path) { set_err(err, errlen, "tokenizer: no path"); return NULL; }
    if (is_dir(path)) {
        snprintf(dir, sizeof dir, "%s", path);
        if (path_join(file, sizeof file, path, "tokenizer.json")) { set_err(err, errlen, "tokenizer: path too long"); return NULL; }
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    }
    size_t n;
    char *json = read_regular_file(file, (size_t)1 << 30, &n, err, errlen);
    if (!json) {
        char xz[4100];
        snprintf(xz, sizeof xz, "%s.xz", file);
        if (!file_exists(file) && file_exists(xz)) /* a compressed copy (the repo's own fixtures) */
            set_err(err, errlen, "%s: not found; %s is there: decompress it first (xz -dk %s)", file, xz, xz);
        return NULL;
    }
    struct pxq_tokenizer *t = tokenizer_load_hf_buffer(json, n, err, errlen);
    free(json);
    if (t && read_tokenizer_config(t, dir, err, errlen) != 0) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

/* ---- GGUF metadata (llama.cpp llama-vocab.cpp) -------------------------------------------------- */

/* An SPM special-token id key: the id, dflt when absent, -1 when the default is out of range too;
 * a present id out of range is an error (llama.cpp warns and keeps its default). */
static int spm_special_id(const struct gguf_file *g, const char *key, int64_t dflt, int64_t n, int32_t *out,
                          char *err, size_t errlen) {
    int64_t id = dflt;
    if (gguf_find_key(g, key) >= 0 && (gguf_get_i64(g, key, &id) || id < 0 || id >= n))
        return set_err(err, errlen, "gguf: %s is not a token id in [0, %lld)", key, (long long)n);
    *out = id < n ? (int32_t)id : -1;
    return 0;
}

static int spm_flag(const struct gguf_file *g, const char *key, int dflt, int *out, char *err, size_t errlen) {
    *out = dflt;
    if (gguf_find_key(g, key) >= 0 && gguf_get_bool(g, key, out))
        return set_err(err, errlen, "gguf: %s is not a bool", key);
    return 0;
}

/* A GGUF's end-of-turn and end-of-message ids as more stop tokens (after its EOS), and its chat
 * template: the tail of both GGUF loaders. */
static void gguf_stops_and_template(struct pxq_tokenizer *t, const struct gguf_file *g) {
    const char *keys[] = {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"};
    for (int i = 0; i < 2; i++) {
        int64_t id;
        if (gguf_get_i64(g, keys[i], &id) == 0) add_eos(t, id);
    }
    const char *tmpl = gguf_get_str(g, "tokenizer.chat_template");
    if (tmpl) t->chat_template = xstrdup(tmpl);
}

/* tokenizer.ggml.model "llama": SentencePiece as llama.cpp loads it (llama_vocab::impl::load). */
static struct pxq_tokenizer *load_gguf_spm(const struct gguf_file *g, char *err, size_t errlen) {
    int64_t n = gguf_arr_len(g, "tokenizer.ggml.tokens");
    if (n <= 0 || n >= MAX_ID || gguf_arr_type(g, "tokenizer.ggml.tokens") != GGUF_STRING) {
        set_err(err, errlen, "gguf: tokenizer.ggml.tokens must be a non-empty string array under 2^24 entries");
        return NULL;
    }
    if (gguf_arr_len(g, "tokenizer.ggml.scores") != n || gguf_arr_type(g, "tokenizer.ggml.scores") != GGUF_FLOAT32) {
        set_err(err, errlen, "gguf: tokenizer.ggml.scores must be a float32 array of %lld entries, one per token "
                "(SentencePiece merges by score)%s", (long long)n,
                gguf_find_key(g, "tokenizer.ggml.scores") < 0 ? ": it is missing" : "");
        return NULL;
    }
    if (gguf_arr_len(g, "tokenizer.ggml.token_type") != n) {
        set_err(err, errlen, "gguf: tokenizer.ggml.token_type must be an integer array of %lld entries, one per token "
                "(SentencePiece tells byte and control tokens by it)%s", (long long)n,
                gguf_find_key(g, "tokenizer.ggml.token_type") < 0 ? ": it is missing" : "");
        return NULL;
    }
    struct tok_spec sp = {.kind = TOK_SPM, .space_prefix = SPM_PREFIX_ALL};
    struct pxq_tokenizer *t = NULL;
    int32_t bos, eos, unk;
    int want_bos, want_eos, add_prefix;
    if (spm_special_id(g, "tokenizer.ggml.bos_token_id", 1, n, &bos, err, errlen) ||
        spm_special_id(g, "tokenizer.ggml.eos_token_id", 2, n, &eos, err, errlen) ||
        spm_special_id(g, "tokenizer.ggml.unknown_token_id", 0, n, &unk, err, errlen) ||
        spm_flag(g, "tokenizer.ggml.add_bos_token", 1, &want_bos, err, errlen) ||
        spm_flag(g, "tokenizer.ggml.add_eos_token", 0, &want_eos, err, errlen) ||
        spm_flag(g, "tokenizer.ggml.add_space_prefix", 1, &add_prefix, err, errlen))
        return NULL;
    sp.space_prefix = add_prefix ? SPM_PREFIX_ALL : SPM_PREFIX_NONE;
    sp.strip_space = add_prefix;
    sp.vocab = xcalloc(n, sizeof *sp.vocab);
    sp.added = xcalloc(n, sizeof *sp.added);
    for (int64_t i = 0; i < n; i++) {
        size_t len;
        const char *s = gguf_arr_str(g, "tokenizer.ggml.tokens", i, &len);
        int64_t ty;
        float score;
        if (!s || gguf_arr_i64(g, "tokenizer.ggml.token_type", i, &ty) || gguf_arr_f32(g, "tokenizer.ggml.scores", i, &score)) {
            set_err(err, errlen, "gguf: tokenizer.ggml.tokens/scores/token_type entry %lld unreadable", (long long)i);
            goto out;
        }
        if (len == 0) { /* llama.cpp renames it "[EMPTY_i]"; nothing can match or merge into it */
            set_err(err, errlen, "gguf: tokenizer.ggml.tokens[%lld] is empty", (long long)i);
            goto out;
        }
        if (ty < TT_UNDEFINED || ty > TT_BYTE) ty = TT_UNDEFINED;
        if (ty == TT_BYTE && spm_byte_token(s, len) < 0) {
            set_err(err, errlen, "gguf: token %lld \"%.*s\" has token_type 6 (byte) but is not <0xNN>", (long long)i,
                    (int)(len < 40 ? len : 40), s);
            goto out;
        }
        sp.vocab[sp.n_vocab++] = (struct tok_src){s, len, i, score, (int)ty};
        /* CONTROL and UNKNOWN: special added tokens (matched with parse_special); USER_DEFINED: always
         * matched (llama.cpp tokenizer_st_partition) */
        if (ty == TT_CONTROL || ty == TT_UNKNOWN || ty == TT_USER_DEFINED)
            sp.added[sp.n_added++] = (struct added_src){s, len, i, ty != TT_USER_DEFINED, 0, 0, 0, 0};
    }
    if (!(t = tok_build(&sp, err, errlen))) goto out;
    for (int b = 0; b < 256; b++) {
        if (t->spm_byte[b] < 0) { /* llama.cpp's fallback: the byte itself as a token */
            char c = (char)b;
            t->spm_byte[b] = tok_vocab_find(t, &c, 1);
        }
        if (t->spm_byte[b] < 0) {
            set_err(err, errlen, "gguf: the SentencePiece vocab has no byte token <0x%02X> (byte fallback needs all 256)", b);
            tokenizer_free(t);
            t = NULL;
            goto out;
        }
    }
    t->unk_id = unk;
    t->bos_id = bos;
    t->eos_id = eos;
    t->add_bos = want_bos && bos >= 0;
    t->add_eos = want_eos && eos >= 0;
    add_eos(t, eos);
    gguf_stops_and_template(t, g);
out:
    free_spec(&sp);
    return t;
}

struct pxq_tokenizer *tokenizer_load_gguf(const struct gguf_file *g, char *err, size_t errlen) {
    const char *model = g ? gguf_get_str(g, "tokenizer.ggml.model") : NULL;
    if (model && !strcmp(model, "llama")) return load_gguf_spm(g, err, errlen);
    if (!model || strcmp(model, "gpt2")) {
        set_err(err, errlen, "gguf: tokenizer.ggml.model is \"%.40s\"; supported: \"gpt2\" (byte-level BPE), "
                "\"llama\" (SentencePiece)", model ? model : "(missing)");
        return NULL;
    }
    const char *pre = gguf_get_str(g, "tokenizer.ggml.pre");
    int k = 0, n_pre = (int)(sizeof GGUF_PRE / sizeof *GGUF_PRE);
    while (k < n_pre && strcmp(pre ? pre : "default", GGUF_PRE[k].name)) k++;
    if (k == n_pre) {
        set_err(err, errlen, "gguf: unknown tokenizer.ggml.pre \"%.40s\" (supported: qwen2, qwen35, "
                "deepseek-r1-qwen, stablelm2, llama-bpe, llama3, llama-v3, gpt-2, default)", pre);
        return NULL;
    }
    struct tok_spec sp = {.nfc = GGUF_PRE[k].nfc, .ignore_merges = GGUF_PRE[k].ignore_merges, .n_split = 1};
    sp.patterns[0] = GGUF_PRE[k].re;
    if (!GGUF_PRE[k].re) {
        sp.n_split = 4;
        for (int i = 0; i < 4; i++) sp.patterns[i] = RE_DEFAULT[i];
    }
    int64_t n = gguf_arr_len(g, "tokenizer.ggml.tokens");
    if (n <= 0 || n >= MAX_ID || gguf_arr_type(g, "tokenizer.ggml.tokens") != GGUF_STRING) {
        set_err(err, errlen, "gguf: tokenizer.ggml.tokens must be a non-empty string array under 2^24 entries");
        return NULL;
    }
    int64_t nt = gguf_arr_len(g, "tokenizer.ggml.token_type");
    if (nt >= 0 && nt != n) {
        set_err(err, errlen, "gguf: tokenizer.ggml.token_type has %lld entries, tokens has %lld",
                (long long)nt, (long long)n);
        return NULL;
    }
    int64_t nm = gguf_arr_len(g, "tokenizer.ggml.merges");
    if (nm >= MAX_ID || (nm > 0 && gguf_arr_type(g, "tokenizer.ggml.merges") != GGUF_STRING)) {
        set_err(err, errlen, "gguf: tokenizer.ggml.merges must be a string array under 2^24 entries");
        return NULL;
    }
    struct pxq_tokenizer *t = NULL;
    sp.vocab = xcalloc(n, sizeof *sp.vocab);
    sp.added = xcalloc(n, sizeof *sp.added);
    sp.merges = xcalloc(nm > 0 ? nm : 1, sizeof *sp.merges);
    for (int64_t i = 0; i < n; i++) {
        size_t len;
        const char *s = gguf_arr_str(g, "tokenizer.ggml.tokens", i, &len);
        int64_t ty = 1;
        if (!s || (nt > 0 && gguf_arr_i64(g, "tokenizer.ggml.token_type", i, &ty))) {
            set_err(err, errlen, "gguf: tokenizer.ggml.tokens/token_type entry %lld unreadable", (long long)i);
            goto out;
        }
        if (ty == 3 || ty == 4) /* CONTROL -> special added token; USER_DEFINED -> added, not special */
            sp.added[sp.n_added++] = (struct added_src){s, len, i, ty == 3, 0, 0, 0, 0};
        else
            sp.vocab[sp.n_vocab++] = (struct tok_src){s, len, i, 0, TT_NORMAL};
    }
    for (int64_t i = 0; i < nm; i++) {
        size_t len;
        const char *s = gguf_arr_str(g, "tokenizer.ggml.merges", i, &len);
        const char *sp1 = s && len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp1) {
            set_err(err, errlen, "gguf: tokenizer.ggml.merges[%lld] is not \"a b\"", (long long)i);
            goto out;
        }
        sp.merges[sp.n_merges++] = (struct merge_src){s, (size_t)(sp1 - s), sp1 + 1, len - (size_t)(sp1 - s) - 1};
    }
    if (!(t = tok_build(&sp, err, errlen))) goto out;
    int64_t eos;
    if (gguf_get_i64(g, "tokenizer.ggml.eos_token_id", &eos) == 0) add_eos(t, eos);
    gguf_stops_and_template(t, g);
out:
    free_spec(&sp);
    return t;
}
