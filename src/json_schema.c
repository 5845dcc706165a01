/* json_schema.c - see json_schema.h: JSON Schema (the subset named there) to a grammar.
 *
 * Each schema becomes a rule that derives exactly the JSON texts this compiler writes for it. The
 * pieces every schema shares (whitespace, numbers, any value) are made once per grammar. Objects
 * keep their properties in the schema's order with the optional ones skippable, as llama.cpp's
 * json-schema-to-grammar and xgrammar do:
 *   object  ::= "{" ws inner
 *   inner   ::= first_1 ws "}"  | "}"  (the second when no property is required)
 *   first_i ::= kv_i after_(i+1) | first_(i+1)  (the second when property i is optional)
 *   after_i ::= "," ws kv_i after_(i+1) | after_(i+1)  (likewise; after_(n+1) is empty)
 *   kv_i    ::= "\"name_i\"" ":" ws value_i
 * and arrays are unrolled up to their bounds:
 *   array ::= "[" ws inner;  inner ::= "]" | item rest_1;  rest_k ::= ws "]" | "," ws item rest_(k+1)
 * (rest_k without ws "]" below minItems, without the "," branch at maxItems, looping on itself once
 * past minItems when there is no maxItems).
 */
#include "json_schema.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

struct ref_memo { const cJSON *target; uint32_t rule; };

struct jsc {
    struct gm_builder *b;
    const cJSON *root;              /* the document $ref "#..." points into */
    char *err;
    size_t errlen;
    int failed;
    char path[512];                 /* where the compiler is, for messages */
    size_t path_len;
    int depth;
    struct ref_memo *refs;
    int n_refs, cap_refs;
    /* shared rules, made on first use (GM_NIL: not yet) */
    uint32_t eps, ws, digits15, digits1, integer, number, string, boolean, null, any, any_object;
};

#define NONE 0xFFFFFFFFu

static int fail(struct jsc *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct jsc *c, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = 1;
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->path_len <= 160) set_err(c->err, c->errlen, "%s: %s", c->path, msg);
    else set_err(c->err, c->errlen, "%.60s...%s: %s", c->path, c->path + c->path_len - 100, msg); /* deep: its ends */
    return -1;
}

/* path segments: ".key" (or "[i]") pushed while compiling below them */
static size_t path_push(struct jsc *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t path_push(struct jsc *c, const char *fmt, ...) {
    size_t old = c->path_len;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(c->path + old, sizeof c->path - old, fmt, ap);
    va_end(ap);
    c->path_len = k < 0 || old + (size_t)k >= sizeof c->path ? sizeof c->path - 1 : old + (size_t)k;
    return old;
}
static void path_pop(struct jsc *c, size_t old) {
    c->path_len = old;
    c->path[old] = 0;
}

/* ---- shared rules ---- */

/* rule ::= "" */
static uint32_t eps(struct jsc *c) {
    if (c->eps == NONE) c->eps = gm_rule(c->b), gm_alt(c->b, c->eps);
    return c->eps;
}

/* r_k ::= "" | SET r_(k-1), r_0 ::= "": up to k bytes of the set. */
static uint32_t up_to(struct jsc *c, const char *set, int k) {
    uint32_t r = eps(c);
    for (int i = 1; i <= k; i++) {
        uint32_t n = gm_rule(c->b);
        gm_alt(c->b, n);
        gm_alt(c->b, n), gm_set(c->b, set), gm_ref(c->b, r);
        r = n;
    }
    return r;
}

/* ws ::= "" | " " | "\n" [ \t]{0,20} */
static uint32_t ws(struct jsc *c) {
    if (c->ws != NONE) return c->ws;
    uint32_t indent = up_to(c, "  \t\t", 20);
    c->ws = gm_rule(c->b);
    gm_alt(c->b, c->ws);
    gm_alt(c->b, c->ws), gm_lit(c->b, " ", 1);
    gm_alt(c->b, c->ws), gm_lit(c->b, "\n", 1), gm_ref(c->b, indent);
    return c->ws;
}

/* integer ::= "-"? ("0" | [1-9] [0-9]{0,15}) */
static uint32_t integer(struct jsc *c) {
    if (c->integer != NONE) return c->integer;
    if (c->digits15 == NONE) c->digits15 = up_to(c, "09", 15);
    uint32_t abs = gm_rule(c->b);
    gm_alt(c->b, abs), gm_lit(c->b, "0", 1);
    gm_alt(c->b, abs), gm_set(c->b, "19"), gm_ref(c->b, c->digits15);
    c->integer = gm_rule(c->b);
    gm_alt(c->b, c->integer), gm_ref(c->b, abs);
    gm_alt(c->b, c->integer), gm_lit(c->b, "-", 1), gm_ref(c->b, abs);
    return c->integer;
}

/* number ::= integer ("." [0-9]{1,16})? ([eE] [+-]? [0-9]{1,2})? */
static uint32_t number(struct jsc *c) {
    if (c->number != NONE) return c->number;
    uint32_t in = integer(c);
    if (c->digits1 == NONE) c->digits1 = up_to(c, "09", 1);
    uint32_t frac = gm_rule(c->b), exp = gm_rule(c->b), sign = gm_rule(c->b);
    gm_alt(c->b, frac);
    gm_alt(c->b, frac), gm_lit(c->b, ".", 1), gm_set(c->b, "09"), gm_ref(c->b, c->digits15);
    gm_alt(c->b, sign);
    gm_alt(c->b, sign), gm_set(c->b, "++--");
    gm_alt(c->b, exp);
    gm_alt(c->b, exp), gm_set(c->b, "eeEE"), gm_ref(c->b, sign), gm_set(c->b, "09"), gm_ref(c->b, c->digits1);
    c->number = gm_rule(c->b);
    gm_alt(c->b, c->number), gm_ref(c->b, in), gm_ref(c->b, frac), gm_ref(c->b, exp);
    return c->number;
}

/* "\"" body "\"" with the body's length in characters in [min, max] */
static uint32_t string_rule(struct jsc *c, uint32_t min, uint32_t max) {
    if (min == 0 && max == GM_UNBOUNDED && c->string != NONE) return c->string;
    uint32_t r = gm_rule(c->b);
    gm_alt(c->b, r), gm_lit(c->b, "\"", 1), gm_str(c->b, min, max), gm_lit(c->b, "\"", 1);
    if (min == 0 && max == GM_UNBOUNDED) c->string = r;
    return r;
}

static uint32_t literal_rule(struct jsc *c, const char *const *lits, int n) {
    uint32_t r = gm_rule(c->b);
    for (int i = 0; i < n; i++) gm_alt(c->b, r), gm_lit(c->b, lits[i], strlen(lits[i]));
    return r;
}

static uint32_t any_value(struct jsc *c);

/* An object of any keys ("{" ws ( "}" | member rest )), values from rule `value`. */
static uint32_t free_object(struct jsc *c, uint32_t value) {
    const uint32_t w = ws(c), key = string_rule(c, 0, GM_UNBOUNDED);
    uint32_t obj = gm_rule(c->b), inner = gm_rule(c->b), member = gm_rule(c->b), rest = gm_rule(c->b);
    gm_alt(c->b, obj), gm_lit(c->b, "{", 1), gm_ref(c->b, w), gm_ref(c->b, inner);
    gm_alt(c->b, inner), gm_lit(c->b, "}", 1);
    gm_alt(c->b, inner), gm_ref(c->b, member), gm_ref(c->b, rest);
    gm_alt(c->b, member), gm_ref(c->b, key), gm_lit(c->b, ":", 1), gm_ref(c->b, w), gm_ref(c->b, value);
    gm_alt(c->b, rest), gm_ref(c->b, w), gm_lit(c->b, "}", 1);
    gm_alt(c->b, rest), gm_lit(c->b, ",", 1), gm_ref(c->b, w), gm_ref(c->b, member), gm_ref(c->b, rest);
    return obj;
}

/* An array of items from rule `item`, with min..max of them (max GM_UNBOUNDED: no bound). */
static uint32_t array_rule(struct jsc *c, uint32_t item, uint32_t min, uint32_t max) {
    const uint32_t w = ws(c);
    uint32_t arr = gm_rule(c->b);
    if (max == 0) {
        gm_alt(c->b, arr), gm_lit(c->b, "[", 1), gm_ref(c->b, w), gm_lit(c->b, "]", 1);
        return arr;
    }
    const uint32_t k_max = max == GM_UNBOUNDED ? (min > 1 ? min : 1) : max;
    const uint32_t first = gm_rule(c->b);
    for (uint32_t k = 1; k < k_max; k++) gm_rule(c->b); /* rest_k = first + k - 1 */
    uint32_t inner = gm_rule(c->b);
    gm_alt(c->b, arr), gm_lit(c->b, "[", 1), gm_ref(c->b, w), gm_ref(c->b, inner);
    if (min == 0) gm_alt(c->b, inner), gm_lit(c->b, "]", 1);
    gm_alt(c->b, inner), gm_ref(c->b, item), gm_ref(c->b, first);
    for (uint32_t k = 1; k <= k_max; k++) {
        const uint32_t rest = first + k - 1;
        if (k >= min) gm_alt(c->b, rest), gm_ref(c->b, w), gm_lit(c->b, "]", 1);
        if (k < k_max || max == GM_UNBOUNDED)
            gm_alt(c->b, rest), gm_lit(c->b, ",", 1), gm_ref(c->b, w), gm_ref(c->b, item), gm_ref(c->b, k < k_max ? rest + 1 : rest);
    }
    return arr;
}

/* value ::= object | array | string | number | true | false | null, all of any content */
static uint32_t any_value(struct jsc *c) {
    if (c->any != NONE) return c->any;
    c->any = gm_rule(c->b); /* referenced below before its alternatives exist */
    uint32_t obj = free_object(c, c->any), arr = array_rule(c, c->any, 0, GM_UNBOUNDED);
    c->any_object = obj;
    uint32_t str = string_rule(c, 0, GM_UNBOUNDED), num = number(c);
    static const char *const lits[] = {"true", "false", "null"};
    uint32_t kw = literal_rule(c, lits, 3);
    const uint32_t alts[] = {obj, arr, str, num, kw};
    for (int i = 0; i < 5; i++) gm_alt(c->b, c->any), gm_ref(c->b, alts[i]);
    return c->any;
}

/* ---- schemas ---- */

static const char *const ANNOTATIONS[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
static const char *const KEYWORDS[] = {"type", "properties", "required", "additionalProperties", "items", "minItems",
                                       "maxItems", "minLength", "maxLength", "enum", "const", "anyOf", "allOf", "$ref"};
#define SUPPORTED_LIST "type, properties, required, additionalProperties, items, minItems, maxItems, minLength, " \
                       "maxLength, enum, const, anyOf, allOf (one schema), $ref, $defs"

static int in_list(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}
#define IN(k, list) in_list(k, list, sizeof list / sizeof *list)

static uint32_t compile(struct jsc *c, const cJSON *s);

/* A non-negative integer keyword (absent: *out unchanged). */
static int count_kw(struct jsc *c, const cJSON *s, const char *name, uint32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) || v->valuedouble > 4e9)
        return fail(c, "'%s' must be a non-negative integer", name);
    *out = (uint32_t)v->valuedouble;
    return 0;
}

/* The JSON type name of a value (integer for whole numbers). */
static const char *value_type(const cJSON *v) {
    if (cJSON_IsString(v)) return "string";
    if (cJSON_IsBool(v)) return "boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsObject(v)) return "object";
    if (cJSON_IsArray(v)) return "array";
    return v->valuedouble == floor(v->valuedouble) ? "integer" : "number";
}

/* 1 if the value's type is allowed by the schema's "type" (absent: any). */
static int type_allows(const cJSON *type, const cJSON *v) {
    if (!type) return 1;
    const char *t = value_type(v);
    for (const cJSON *x = cJSON_IsArray(type) ? type->child : type; x; x = cJSON_IsArray(type) ? x->next : NULL) {
        if (!cJSON_IsString(x)) continue;
        if (!strcmp(x->valuestring, t) || (!strcmp(x->valuestring, "number") && !strcmp(t, "integer"))) return 1;
    }
    return 0;
}

/* 1 if a number in v (at any depth) is an integer cJSON may not have read exactly (beyond 2^53):
 * written back it would be another number. */
static int inexact_number(const cJSON *v) {
    if (cJSON_IsNumber(v)) return fabs(v->valuedouble) > 9007199254740992.0 && v->valuedouble == floor(v->valuedouble);
    for (const cJSON *x = cJSON_IsArray(v) || cJSON_IsObject(v) ? v->child : NULL; x; x = x->next)
        if (inexact_number(x)) return 1;
    return 0;
}

/* enum / const: the values, written compactly, as alternatives. Only "type" may come with them
 * (it filters the values); another keyword would have to be checked against each value. */
static uint32_t compile_enum(struct jsc *c, const cJSON *s, const cJSON *vals, const char *kw) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    for (const cJSON *k = s->child; k; k = k->next)
        if (strcmp(k->string, kw) && strcmp(k->string, "type") && !IN(k->string, ANNOTATIONS))
            return fail(c, "'%s' together with '%.64s' is not supported", kw, k->string), NONE;
    uint32_t r = gm_rule(c->b);
    int n = 0;
    for (const cJSON *v = vals; v; v = !strcmp(kw, "const") ? NULL : v->next) {
        if (inexact_number(v)) return fail(c, "'%s' holds an integer beyond 2^53, which PXQ cannot write back exactly", kw), NONE;
        if (!type_allows(type, v)) continue;
        char *t = cJSON_PrintUnformatted(v);
        if (!t) return fail(c, "'%s' could not be written", kw), NONE;
        gm_alt(c->b, r), gm_lit(c->b, t, strlen(t));
        free(t);
        n++;
    }
    if (!n) return fail(c, "no value of '%s' has the schema's type", kw), NONE;
    return r;
}

static uint32_t resolve_ref(struct jsc *c, const char *ref) {
    if (ref[0] != '#' || (ref[1] && ref[1] != '/'))
        return fail(c, "'$ref' '%.100s' is not supported: only references into this schema (\"#\" or \"#/...\")", ref), NONE;
    const cJSON *t = c->root;
    for (const char *p = ref + 1; *p == '/' && t;) {
        const char *e = strchr(p + 1, '/');
        size_t n = e ? (size_t)(e - p - 1) : strlen(p + 1);
        char key[256];
        size_t k = 0;
        for (size_t i = 0; i < n && k < sizeof key - 1; i++) { /* RFC 6901: ~1 is '/', ~0 is '~' */
            char ch = p[1 + i];
            if (ch == '~' && i + 1 < n && (p[2 + i] == '0' || p[2 + i] == '1')) ch = p[2 + i] == '0' ? '~' : '/', i++;
            key[k++] = ch;
        }
        key[k] = 0;
        if (cJSON_IsArray(t)) {
            char *end;
            long idx = strtol(key, &end, 10);
            t = *key && !*end && idx >= 0 ? cJSON_GetArrayItem(t, (int)idx) : NULL;
        } else {
            t = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, key) : NULL;
        }
        p += 1 + n;
    }
    if (!t) return fail(c, "'$ref' '%.100s' points at nothing in the schema", ref), NONE;
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].target == t) return c->refs[i].rule;
    /* a rule for the target made before compiling it, so that recursion refers to it */
    uint32_t r = gm_rule(c->b);
    if (c->n_refs == c->cap_refs) {
        c->cap_refs = c->cap_refs ? c->cap_refs * 2 : 8;
        c->refs = xrealloc(c->refs, (size_t)c->cap_refs * sizeof *c->refs);
    }
    c->refs[c->n_refs++] = (struct ref_memo){t, r};
    size_t old = path_push(c, "[$ref %.100s]", ref);
    uint32_t inner = compile(c, t);
    path_pop(c, old);
    if (inner == NONE) return NONE;
    gm_alt(c->b, r), gm_ref(c->b, inner);
    return r;
}

static uint32_t compile_object(struct jsc *c, const cJSON *s) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, "'properties' must be an object"), NONE;
    if (req && !cJSON_IsArray(req)) return fail(c, "'required' must be an array of strings"), NONE;
    for (const cJSON *x = req ? req->child : NULL; x; x = x->next) {
        if (!cJSON_IsString(x)) return fail(c, "'required' must be an array of strings"), NONE;
        for (const cJSON *y = req->child; y != x; y = y->next)
            if (!strcmp(y->valuestring, x->valuestring)) return fail(c, "'required' names '%.100s' twice", x->valuestring), NONE;
    }
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl))
        return fail(c, "'additionalProperties' must be a boolean or a schema"), NONE;
    /* the properties to write: the declared ones in order, then required names not declared */
    int n = 0, n_opt = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) n++;
    for (const cJSON *x = req ? req->child : NULL; x; x = x->next)
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, x->valuestring)) n++;
    if (n == 0) {
        if (cJSON_IsFalse(addl)) {
            uint32_t w = ws(c), r = gm_rule(c->b);
            gm_alt(c->b, r), gm_lit(c->b, "{", 1), gm_ref(c->b, w), gm_lit(c->b, "}", 1);
            return r;
        }
        if (cJSON_IsObject(addl)) {
            size_t old = path_push(c, ".additionalProperties");
            uint32_t v = compile(c, addl);
            path_pop(c, old);
            return v == NONE ? NONE : free_object(c, v);
        }
        any_value(c);
        return c->any_object;
    }
    const char **name = xmalloc((size_t)n * sizeof *name);
    uint32_t *value = xmalloc((size_t)n * sizeof *value);
    uint8_t *required = xmalloc((size_t)n);
    int k = 0;
    uint32_t result = NONE;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, k++) {
        name[k] = p->string;
        required[k] = 0;
        for (const cJSON *x = req ? req->child : NULL; x; x = x->next) required[k] |= !strcmp(x->valuestring, p->string);
        size_t old = path_push(c, ".properties.%.100s", p->string);
        value[k] = compile(c, p);
        path_pop(c, old);
        if (value[k] == NONE) goto out;
    }
    /* a required name that is not declared: its value follows additionalProperties */
    for (const cJSON *x = req ? req->child : NULL; x && k < n; x = x->next) {
        if (props && cJSON_GetObjectItemCaseSensitive(props, x->valuestring)) continue;
        if (cJSON_IsFalse(addl)) {
            fail(c, "'required' names '%.100s', which 'properties' lacks and additionalProperties false forbids: no object is valid",
                 x->valuestring);
            goto out;
        }
        name[k] = x->valuestring, required[k] = 1;
        if (cJSON_IsObject(addl)) {
            size_t old = path_push(c, ".additionalProperties");
            value[k] = compile(c, addl);
            path_pop(c, old);
            if (value[k] == NONE) goto out;
        } else {
            value[k] = any_value(c);
        }
        k++;
    }
    for (int i = 0; i < n; i++) n_opt += !required[i];
    if (n_opt > JSON_SCHEMA_MAX_OPTIONAL) {
        fail(c, "%d optional properties: at most %d are supported (list the others in 'required')", n_opt, JSON_SCHEMA_MAX_OPTIONAL);
        goto out;
    }
    const uint32_t w = ws(c);
    /* kv_i, then after_i and first_i from the last property back */
    uint32_t *kv = xmalloc((size_t)n * sizeof *kv);
    for (int i = 0; i < n; i++) {
        cJSON *key = cJSON_CreateString(name[i]);
        char *t = cJSON_PrintUnformatted(key);
        cJSON_Delete(key);
        kv[i] = gm_rule(c->b);
        gm_alt(c->b, kv[i]), gm_lit(c->b, t, strlen(t)), gm_lit(c->b, ":", 1), gm_ref(c->b, w), gm_ref(c->b, value[i]);
        free(t);
    }
    uint32_t after = eps(c), first = NONE;
    for (int i = n - 1; i >= 0; i--) {
        uint32_t a = gm_rule(c->b), f = gm_rule(c->b);
        gm_alt(c->b, a), gm_lit(c->b, ",", 1), gm_ref(c->b, w), gm_ref(c->b, kv[i]), gm_ref(c->b, after);
        if (!required[i]) gm_alt(c->b, a), gm_ref(c->b, after);
        gm_alt(c->b, f), gm_ref(c->b, kv[i]), gm_ref(c->b, after);
        if (!required[i] && first != NONE) gm_alt(c->b, f), gm_ref(c->b, first);
        after = a, first = f;
    }
    free(kv);
    uint32_t obj = gm_rule(c->b), inner = gm_rule(c->b);
    gm_alt(c->b, obj), gm_lit(c->b, "{", 1), gm_ref(c->b, w), gm_ref(c->b, inner);
    gm_alt(c->b, inner), gm_ref(c->b, first), gm_ref(c->b, w), gm_lit(c->b, "}", 1);
    if (n_opt == n) gm_alt(c->b, inner), gm_lit(c->b, "}", 1);
    result = obj;
out:
    free(name), free(value), free(required);
    return result;
}

static uint32_t compile_array(struct jsc *c, const cJSON *s) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    uint32_t min = 0, max = GM_UNBOUNDED;
    if (count_kw(c, s, "minItems", &min) || count_kw(c, s, "maxItems", &max)) return NONE;
    if (cJSON_IsArray(items)) return fail(c, "'items' as an array (tuple validation) is not supported"), NONE;
    if (items && !cJSON_IsBool(items) && !cJSON_IsObject(items)) return fail(c, "'items' must be a schema"), NONE;
    if (cJSON_IsFalse(items)) max = 0;
    if (min > max) return fail(c, "minItems (%u) is larger than maxItems (%u)%s", min, max, cJSON_IsFalse(items) ? " ('items': false)" : ""), NONE;
    if (min > JSON_SCHEMA_MAX_ITEMS || (max != GM_UNBOUNDED && max > JSON_SCHEMA_MAX_ITEMS))
        return fail(c, "minItems / maxItems above %d are not supported", JSON_SCHEMA_MAX_ITEMS), NONE;
    uint32_t item;
    if (items && !cJSON_IsBool(items)) {
        size_t old = path_push(c, ".items");
        item = compile(c, items);
        path_pop(c, old);
        if (item == NONE) return NONE;
    } else {
        item = any_value(c);
    }
    return array_rule(c, item, min, max);
}

static uint32_t compile_type(struct jsc *c, const cJSON *s, const char *t) {
    if (!strcmp(t, "string")) {
        uint32_t min = 0, max = GM_UNBOUNDED;
        if (count_kw(c, s, "minLength", &min) || count_kw(c, s, "maxLength", &max)) return NONE;
        if (min > max) return fail(c, "minLength (%u) is larger than maxLength (%u)", min, max), NONE;
        return string_rule(c, min, max);
    }
    if (!strcmp(t, "integer")) return integer(c);
    if (!strcmp(t, "number")) return number(c);
    if (!strcmp(t, "boolean")) {
        static const char *const b[] = {"true", "false"};
        if (c->boolean == NONE) c->boolean = literal_rule(c, b, 2);
        return c->boolean;
    }
    if (!strcmp(t, "null")) {
        static const char *const nul[] = {"null"};
        if (c->null == NONE) c->null = literal_rule(c, nul, 1);
        return c->null;
    }
    if (!strcmp(t, "object")) return compile_object(c, s);
    if (!strcmp(t, "array")) return compile_array(c, s);
    return fail(c, "unknown type '%.64s' (the types are object, array, string, number, integer, boolean, null)", t), NONE;
}

/* Keywords other than annotations, besides `except`, present in s: the first one's name, or NULL. */
static const char *other_keyword(const cJSON *s, const char *except) {
    for (const cJSON *k = s->child; k; k = k->next)
        if (strcmp(k->string, except) && !IN(k->string, ANNOTATIONS)) return k->string;
    return NULL;
}

static uint32_t compile(struct jsc *c, const cJSON *s) {
    if (c->failed) return NONE;
    if (cJSON_IsTrue(s)) return any_value(c);
    if (cJSON_IsFalse(s)) return fail(c, "the schema false admits no value"), NONE;
    if (!cJSON_IsObject(s)) return fail(c, "a schema must be an object or a boolean"), NONE;
    if (c->depth >= JSON_SCHEMA_MAX_DEPTH) return fail(c, "schemas nested deeper than %d are not supported", JSON_SCHEMA_MAX_DEPTH), NONE;
    if (gm_builder_size(c->b) >= GM_MAX_ELEMS) return fail(c, "the schema is too large"), NONE;
    for (const cJSON *k = s->child; k; k = k->next)
        if (!IN(k->string, ANNOTATIONS) && !IN(k->string, KEYWORDS))
            return fail(c, "'%.64s' is not supported (supported: " SUPPORTED_LIST ")", k->string), NONE;
    c->depth++;
    uint32_t r = NONE;
    const cJSON *v, *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const char *other;
    if (type && !cJSON_IsString(type) && !(cJSON_IsArray(type) && type->child)) {
        fail(c, "'type' must be a type name or a non-empty array of them");
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        if (!cJSON_IsString(v)) fail(c, "'$ref' must be a string");
        else if ((other = other_keyword(s, "$ref"))) fail(c, "'$ref' together with '%.64s' is not supported", other);
        else r = resolve_ref(c, v->valuestring);
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) {
        if (!cJSON_IsArray(v) || !v->child) fail(c, "'anyOf' must be a non-empty array of schemas");
        else if ((other = other_keyword(s, "anyOf"))) fail(c, "'anyOf' together with '%.64s' is not supported", other);
        else {
            uint32_t alt[64];
            int n = 0;
            for (const cJSON *x = v->child; x && !c->failed; x = x->next, n++) {
                if (n == 64) {
                    fail(c, "'anyOf' with more than 64 schemas is not supported");
                    break;
                }
                size_t old = path_push(c, ".anyOf[%d]", n);
                alt[n] = compile(c, x);
                path_pop(c, old);
            }
            if (!c->failed) {
                r = gm_rule(c->b);
                for (int i = 0; i < n; i++) gm_alt(c->b, r), gm_ref(c->b, alt[i]);
            }
        }
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 1) fail(c, "'allOf' is supported with exactly one schema");
        else if ((other = other_keyword(s, "allOf"))) fail(c, "'allOf' together with '%.64s' is not supported", other);
        else {
            size_t old = path_push(c, ".allOf[0]");
            r = compile(c, v->child);
            path_pop(c, old);
        }
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        r = compile_enum(c, s, v, "const");
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        if (!cJSON_IsArray(v) || !v->child) fail(c, "'enum' must be a non-empty array");
        else r = compile_enum(c, s, v->child, "enum");
    } else if (cJSON_IsString(type)) {
        r = compile_type(c, s, type->valuestring);
    } else if (type) { /* several types: one alternative each */
        uint32_t alt[7];
        int n = 0;
        for (const cJSON *x = type->child; x && !c->failed; x = x->next) {
            if (!cJSON_IsString(x)) {
                fail(c, "'type' must be a type name or a non-empty array of them");
                break;
            }
            if (n == 7) {
                fail(c, "'type' names a type twice");
                break;
            }
            alt[n++] = compile_type(c, s, x->valuestring);
        }
        if (!c->failed) {
            r = gm_rule(c->b);
            for (int i = 0; i < n; i++) gm_alt(c->b, r), gm_ref(c->b, alt[i]);
        }
    } else if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
               cJSON_GetObjectItemCaseSensitive(s, "additionalProperties")) {
        r = compile_object(c, s); /* no type: the keywords say which */
    } else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
               cJSON_GetObjectItemCaseSensitive(s, "maxItems")) {
        r = compile_array(c, s);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength")) {
        r = compile_type(c, s, "string");
    } else {
        r = any_value(c);
    }
    c->depth--;
    return c->failed ? NONE : r;
}

/* ---- entry points ---- */

static void jsc_init(struct jsc *c, const cJSON *root, const char *path, char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    c->b = gm_builder_new();
    c->root = root;
    c->err = err, c->errlen = errlen;
    snprintf(c->path, sizeof c->path, "%s", path ? path : "schema");
    c->path_len = strlen(c->path);
    c->eps = c->ws = c->digits15 = c->digits1 = c->integer = c->number = NONE;
    c->string = c->boolean = c->null = c->any = c->any_object = NONE;
}

static struct gm_grammar *jsc_build(struct jsc *c, uint32_t root) {
    struct gm_grammar *g = NULL;
    if (!c->failed) {
        char e[256];
        g = gm_build(c->b, root, e, sizeof e);
        if (!g) set_err(c->err, c->errlen, "%s: the schema cannot be used: %s", c->path, e);
    }
    gm_builder_free(c->b);
    free(c->refs);
    return g;
}

/* top ::= ws value ws */
static uint32_t top(struct jsc *c, uint32_t value) {
    uint32_t w = ws(c), r = gm_rule(c->b);
    gm_alt(c->b, r), gm_ref(c->b, w), gm_ref(c->b, value), gm_ref(c->b, w);
    return r;
}

struct gm_grammar *json_schema_grammar(const cJSON *schema, const char *path, char *err, size_t errlen) {
    struct jsc c;
    jsc_init(&c, schema, path, err, errlen);
    uint32_t v = compile(&c, schema);
    return jsc_build(&c, c.failed ? 0 : top(&c, v));
}

struct gm_grammar *json_object_grammar(void) {
    struct jsc c;
    char err[64];
    jsc_init(&c, NULL, NULL, err, sizeof err);
    any_value(&c);
    struct gm_grammar *g = jsc_build(&c, top(&c, c.any_object));
    if (!g) die("json_object_grammar: %s", err);
    return g;
}

struct gm_grammar *json_tool_call_grammar(const struct json_tool *tools, int n_tools, int multiple, const char *path, char *err,
                                          size_t errlen) {
    struct jsc c;
    jsc_init(&c, NULL, path, err, errlen);
    if (n_tools < 1) fail(&c, "no tools to call");
    uint32_t call = gm_rule(c.b);
    uint32_t *args = xcalloc((size_t)(n_tools > 0 ? n_tools : 1), sizeof *args);
    for (int i = 0; i < n_tools && !c.failed; i++) {
        size_t old = path_push(&c, "[%d].function.parameters", i);
        c.root = tools[i].parameters;
        args[i] = tools[i].parameters ? compile(&c, tools[i].parameters) : (any_value(&c), c.any_object);
        path_pop(&c, old);
    }
    for (int i = 0; i < n_tools && !c.failed; i++) {
        static const char open[] = "<tool_call>\n{\"name\": ", mid[] = ", \"arguments\": ", close[] = "}\n</tool_call>";
        cJSON *name = cJSON_CreateString(tools[i].name);
        char *t = cJSON_PrintUnformatted(name);
        cJSON_Delete(name);
        gm_alt(c.b, call), gm_lit(c.b, open, sizeof open - 1), gm_lit(c.b, t, strlen(t)), gm_lit(c.b, mid, sizeof mid - 1);
        gm_ref(c.b, args[i]), gm_lit(c.b, close, sizeof close - 1);
        free(t);
    }
    free(args);
    uint32_t root = call;
    if (multiple && !c.failed) { /* calls ::= call | call "\n" calls */
        root = gm_rule(c.b);
        gm_alt(c.b, root), gm_ref(c.b, call);
        gm_alt(c.b, root), gm_ref(c.b, call), gm_lit(c.b, "\n", 1), gm_ref(c.b, root);
    }
    return jsc_build(&c, root);
}
