/* pyjson.c - see pyjson.h: JSON text re-serialised as Python's json.dumps(..., ensure_ascii=False). */
#include "pyjson.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pj {
    const char *s;
    size_t n, i;
    int depth;
    char *err;
    size_t errlen;
};

static int fail(struct pj *p, const char *what) {
    set_err(p->err, p->errlen, "invalid JSON at byte %zu: %s", p->i, what);
    return -1;
}

static void ws(struct pj *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static void put(struct sbuf *o, const char *s, size_t n) {
    if (o) sbuf_put(o, s, n);
}
static void puts_(struct sbuf *o, const char *s) { put(o, s, strlen(s)); }

/* Length of the valid UTF-8 sequence at s[0..n), or 0 (RFC 3629). */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0], lo = 0x80, hi = 0xBF;
    size_t len;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) len = 3;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if (s[k] < 0x80 || s[k] > 0xBF) return 0;
    return len;
}

static int hex4(struct pj *p, unsigned *u) {
    if (p->i + 4 > p->n) return fail(p, "short \\u escape");
    *u = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i++];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0') : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
        if (d == 16) return fail(p, "bad \\u escape");
        *u = *u << 4 | d;
    }
    return 0;
}

static void put_utf8(struct sbuf *o, unsigned u) {
    char b[4];
    size_t n;
    if (u < 0x80) b[0] = (char)u, n = 1;
    else if (u < 0x800) b[0] = (char)(0xC0 | u >> 6), b[1] = (char)(0x80 | (u & 63)), n = 2;
    else if (u < 0x10000) b[0] = (char)(0xE0 | u >> 12), b[1] = (char)(0x80 | (u >> 6 & 63)), b[2] = (char)(0x80 | (u & 63)), n = 3;
    else
        b[0] = (char)(0xF0 | u >> 18), b[1] = (char)(0x80 | (u >> 12 & 63)), b[2] = (char)(0x80 | (u >> 6 & 63)),
        b[3] = (char)(0x80 | (u & 63)), n = 4;
    put(o, b, n);
}

/* One code point as py_encode_basestring writes it (ensure_ascii=False). */
static void put_escaped(struct sbuf *o, unsigned u) {
    static const char *const esc[32] = {[8] = "\\b", [9] = "\\t", [10] = "\\n", [12] = "\\f", [13] = "\\r"};
    if (u == '"') puts_(o, "\\\"");
    else if (u == '\\') puts_(o, "\\\\");
    else if (u < 0x20 && esc[u]) puts_(o, esc[u]);
    else if (u < 0x20) {
        char b[8];
        snprintf(b, sizeof b, "\\u%04x", u);
        puts_(o, b);
    } else put_utf8(o, u);
}

/* A string at s[i] == '"'. escaped: write it as json.dumps does (quotes included); else write the
 * decoded bytes (a NUL fails: callers want C strings). */
static int string(struct pj *p, struct sbuf *o, int escaped) {
    p->i++;
    if (escaped) puts_(o, "\"");
    for (;;) {
        if (p->i >= p->n) return fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->i];
        unsigned u;
        if (c == '"') {
            p->i++;
            break;
        }
        if (c < 0x20) return fail(p, "control character in a string");
        if (c == '\\') {
            if (++p->i >= p->n) return fail(p, "unterminated string");
            char e = p->s[p->i++];
            switch (e) {
            case '"': u = '"'; break;
            case '\\': u = '\\'; break;
            case '/': u = '/'; break;
            case 'b': u = 8; break;
            case 'f': u = 12; break;
            case 'n': u = 10; break;
            case 'r': u = 13; break;
            case 't': u = 9; break;
            case 'u':
                if (hex4(p, &u)) return -1;
                if (u >= 0xDC00 && u <= 0xDFFF) return fail(p, "lone low surrogate");
                if (u >= 0xD800 && u <= 0xDBFF) {
                    unsigned lo;
                    if (p->i + 2 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') return fail(p, "lone high surrogate");
                    p->i += 2;
                    if (hex4(p, &lo)) return -1;
                    if (lo < 0xDC00 || lo > 0xDFFF) return fail(p, "lone high surrogate");
                    u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                }
                break;
            default: return fail(p, "bad escape");
            }
            if (!escaped && u == 0) return fail(p, "NUL in a string");
            if (escaped) put_escaped(o, u);
            else put_utf8(o, u);
            continue;
        }
        size_t k = utf8_len((const unsigned char *)p->s + p->i, p->n - p->i);
        if (!k) return fail(p, "invalid UTF-8 in a string");
        put(o, p->s + p->i, k);
        p->i += k;
    }
    if (escaped) puts_(o, "\"");
    return 0;
}

/* repr() of a finite double: the shortest digits that read back to x, in fixed notation when the
 * decimal point position decpt (x = 0.d1d2... * 10^decpt) is in (-4, 16], else as d.ddde+XX
 * (CPython's float_repr_style 'short', format code 'r'). */
static void float_repr(struct sbuf *o, double x) {
    if (isinf(x)) return puts_(o, x < 0 ? "-Infinity" : "Infinity");
    if (isnan(x)) return puts_(o, "NaN");
    if (x == 0) return puts_(o, signbit(x) ? "-0.0" : "0.0");
    char b[40], dig[24];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(b, sizeof b, "%.*e", prec - 1, x);
        if (strtod(b, NULL) == x) break;
    }
    const char *q = b;
    if (*q == '-') puts_(o, "-"), q++;
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    dig[nd] = 0;
    int decpt = atoi(q + 1) + 1;
    if (decpt <= -4 || decpt > 16) {
        put(o, dig, 1);
        if (nd > 1) puts_(o, "."), put(o, dig + 1, (size_t)nd - 1);
        snprintf(b, sizeof b, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
        puts_(o, b);
    } else if (decpt <= 0) {
        puts_(o, "0.");
        for (int k = 0; k < -decpt; k++) puts_(o, "0");
        put(o, dig, (size_t)nd);
    } else if (decpt >= nd) {
        put(o, dig, (size_t)nd);
        for (int k = nd; k < decpt; k++) puts_(o, "0");
        puts_(o, ".0");
    } else {
        put(o, dig, (size_t)decpt);
        puts_(o, ".");
        put(o, dig + decpt, (size_t)(nd - decpt));
    }
}

static int digits(struct pj *p) {
    size_t i0 = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    return p->i > i0 ? 0 : fail(p, "digit expected");
}

static int number(struct pj *p, struct sbuf *o) {
    size_t i0 = p->i;
    int is_float = 0;
    if (p->s[p->i] == '-') p->i++;
    if (p->i + 8 <= p->n && !memcmp(p->s + p->i, "Infinity", 8)) { /* json.loads's -Infinity */
        p->i += 8;
        return puts_(o, "-Infinity"), 0;
    }
    if (p->i < p->n && p->s[p->i] == '0') p->i++;
    else if (digits(p)) return -1;
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++, is_float = 1;
        if (digits(p)) return -1;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++, is_float = 1;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (digits(p)) return -1;
    }
    size_t len = p->i - i0;
    if (!is_float) { /* a Python int: its digits, "-0" being 0 */
        if (len == 2 && p->s[i0] == '-' && p->s[i0 + 1] == '0') puts_(o, "0");
        else put(o, p->s + i0, len);
        return 0;
    }
    if (o) {
        char *t = xmalloc(len + 1);
        memcpy(t, p->s + i0, len);
        t[len] = 0;
        float_repr(o, strtod(t, NULL));
        free(t);
    }
    return 0;
}

static int value(struct pj *p, struct sbuf *o);

struct member { size_t key, val, end; }; /* offsets into the output: key, value, end of value */

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* A repeated key keeps its first place and takes the last value: rebuild out[base..] from the
 * members' written pieces (keys compare equal as written, since the writing is one-to-one). */
static void dedup(struct sbuf *o, size_t base, struct member *m, int nm) {
    size_t cap = 16;
    while (cap < (size_t)nm * 2) cap *= 2;
    int *tab = xmalloc(cap * sizeof *tab), *last = xmalloc((size_t)nm * sizeof *last), dup = 0;
    for (size_t k = 0; k < cap; k++) tab[k] = -1;
    for (int j = 0; j < nm; j++) {
        size_t kl = m[j].val - m[j].key, h = (size_t)fnv(o->p + m[j].key, kl) & (cap - 1);
        last[j] = -1;
        for (;; h = (h + 1) & (cap - 1)) {
            int f = tab[h];
            if (f < 0) {
                tab[h] = j, last[j] = j;
                break;
            }
            if (m[f].val - m[f].key == kl && !memcmp(o->p + m[f].key, o->p + m[j].key, kl)) {
                last[f] = j, dup = 1;
                break;
            }
        }
    }
    if (dup) {
        struct sbuf t = {0};
        sbuf_put(&t, "{", 1);
        int first = 1;
        for (int j = 0; j < nm; j++) {
            if (last[j] < 0) continue;
            if (!first) sbuf_put(&t, ", ", 2);
            first = 0;
            sbuf_put(&t, o->p + m[j].key, m[j].val - m[j].key);
            sbuf_put(&t, o->p + m[last[j]].val, m[last[j]].end - m[last[j]].val);
        }
        sbuf_put(&t, "}", 1);
        o->n = base;
        sbuf_put(o, t.p, t.n);
        free(t.p);
    }
    free(tab), free(last);
}

static int object(struct pj *p, struct sbuf *o) {
    size_t base = o ? o->n : 0;
    struct member *m = NULL;
    int nm = 0, cap = 0, rc = -1;
    p->i++;
    puts_(o, "{");
    ws(p);
    if (p->i < p->n && p->s[p->i] == '}') {
        p->i++;
        puts_(o, "}");
        return 0;
    }
    for (;;) {
        ws(p);
        if (p->i >= p->n || p->s[p->i] != '"') {
            fail(p, "object key expected");
            goto out;
        }
        if (nm == cap) m = xrealloc(m, (size_t)(cap = cap ? cap * 2 : 8) * sizeof *m);
        if (nm) puts_(o, ", ");
        m[nm].key = o ? o->n : 0;
        if (string(p, o, 1)) goto out;
        ws(p);
        if (p->i >= p->n || p->s[p->i] != ':') {
            fail(p, "':' expected");
            goto out;
        }
        p->i++;
        puts_(o, ": ");
        m[nm].val = o ? o->n : 0;
        if (value(p, o)) goto out;
        m[nm++].end = o ? o->n : 0;
        ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            break;
        }
        fail(p, "',' or '}' expected");
        goto out;
    }
    puts_(o, "}");
    if (o) dedup(o, base, m, nm);
    rc = 0;
out:
    free(m);
    return rc;
}

static int array(struct pj *p, struct sbuf *o) {
    p->i++;
    puts_(o, "[");
    ws(p);
    if (p->i < p->n && p->s[p->i] == ']') {
        p->i++;
        puts_(o, "]");
        return 0;
    }
    for (int k = 0;; k++) {
        if (k) puts_(o, ", ");
        if (value(p, o)) return -1;
        ws(p);
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            continue;
        }
        if (p->i < p->n && p->s[p->i] == ']') {
            p->i++;
            puts_(o, "]");
            return 0;
        }
        return fail(p, "',' or ']' expected");
    }
}

static int literal(struct pj *p, struct sbuf *o, const char *lit) {
    size_t k = strlen(lit);
    if (p->i + k > p->n || memcmp(p->s + p->i, lit, k)) return fail(p, "unexpected character");
    p->i += k;
    puts_(o, lit);
    return 0;
}

static int value(struct pj *p, struct sbuf *o) {
    ws(p);
    if (p->i >= p->n) return fail(p, "value expected");
    if (++p->depth > PYJSON_MAX_DEPTH) return fail(p, "nested too deeply");
    int rc;
    char c = p->s[p->i];
    if (c == '{') rc = object(p, o);
    else if (c == '[') rc = array(p, o);
    else if (c == '"') rc = string(p, o, 1);
    else if (c == '-' || (c >= '0' && c <= '9')) rc = number(p, o);
    else if (c == 't') rc = literal(p, o, "true");
    else if (c == 'f') rc = literal(p, o, "false");
    else if (c == 'n') rc = literal(p, o, "null");
    else if (c == 'N') rc = literal(p, o, "NaN");
    else if (c == 'I') rc = literal(p, o, "Infinity");
    else rc = fail(p, "unexpected character");
    p->depth--;
    return rc;
}

int pyjson_dump(struct sbuf *out, const char *json, size_t n, char *err, size_t errlen) {
    struct pj p = {json, n, 0, 0, err, errlen};
    if (value(&p, out)) return -1;
    ws(&p);
    if (p.i != n) return fail(&p, "trailing characters");
    return 0;
}

/* ---- spans in valid JSON ---- */

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* End of the value starting at s[i] (valid JSON assumed; stops at n regardless). */
static size_t skip_value(const char *s, size_t n, size_t i) {
    int depth = 0;
    do {
        if (i >= n) return n;
        char c = s[i];
        if (c == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                if (s[i] == '\\') i++;
            i++;
        } else if (c == '{' || c == '[') {
            depth++, i++;
        } else if (c == '}' || c == ']') {
            depth--, i++;
        } else if (c == ',' || c == ':' || c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            i++;
        } else {
            while (i < n && !strchr(",}] \t\n\r", s[i])) i++;
        }
    } while (depth > 0);
    return i;
}

int pyjson_member(const char *json, size_t n, const char *key, int last, size_t *off, size_t *len) {
    size_t i = skip_ws(json, n, 0);
    int found = 0;
    if (i >= n || json[i] != '{') return -1;
    i = skip_ws(json, n, i + 1);
    while (i < n && json[i] == '"') {
        size_t k0 = i, k1 = skip_value(json, n, i);
        char *k = pyjson_string(json + k0, k1 - k0);
        i = skip_ws(json, n, k1);
        if (i < n && json[i] == ':') i++;
        i = skip_ws(json, n, i);
        size_t v1 = skip_value(json, n, i);
        if (k && !strcmp(k, key) && (last || !found)) *off = i, *len = v1 - i, found = 1;
        free(k);
        i = skip_ws(json, n, v1);
        if (i < n && json[i] == ',') i = skip_ws(json, n, i + 1);
    }
    return found ? 0 : -1;
}

int pyjson_next_member(const char *json, size_t n, size_t *pos, size_t *koff, size_t *klen, size_t *voff, size_t *vlen) {
    size_t i = *pos;
    if (i == 0) {
        i = skip_ws(json, n, 0);
        if (i >= n || json[i] != '{') return -1;
        i = skip_ws(json, n, i + 1);
    }
    if (i >= n || json[i] != '"') return -1;
    size_t k1 = skip_value(json, n, i);
    *koff = i, *klen = k1 - i;
    i = skip_ws(json, n, k1);
    if (i < n && json[i] == ':') i++;
    i = skip_ws(json, n, i);
    size_t v1 = skip_value(json, n, i);
    *voff = i, *vlen = v1 - i;
    i = skip_ws(json, n, v1);
    if (i < n && json[i] == ',') i = skip_ws(json, n, i + 1);
    *pos = i;
    return 0;
}

int pyjson_elem(const char *json, size_t n, int idx, size_t *off, size_t *len) {
    size_t i = skip_ws(json, n, 0);
    if (i >= n || json[i] != '[') return -1;
    i = skip_ws(json, n, i + 1);
    for (int k = 0; i < n && json[i] != ']'; k++) {
        size_t v1 = skip_value(json, n, i);
        if (k == idx) return *off = i, *len = v1 - i, 0;
        i = skip_ws(json, n, v1);
        if (i < n && json[i] == ',') i = skip_ws(json, n, i + 1);
    }
    return -1;
}

char pyjson_type(const char *json, size_t n) {
    size_t i = skip_ws(json, n, 0);
    return i < n ? json[i] : 0;
}

char *pyjson_string(const char *json, size_t n) {
    char e[8];
    struct pj p = {json, n, skip_ws(json, n, 0), 0, e, sizeof e};
    if (p.i >= n || json[p.i] != '"') return NULL;
    struct sbuf b = {0};
    sbuf_put(&b, "", 0);
    if (string(&p, &b, 0) || skip_ws(json, n, p.i) != n) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
