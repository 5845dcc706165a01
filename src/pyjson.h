/* pyjson.h - JSON text written out again as Python's json.dumps(json.loads(text), ensure_ascii=False)
 * writes it, and spans of the raw values inside JSON text.
 *
 * Why: chat templates print tools and tool-call arguments with `tojson`, which HF's
 * apply_chat_template defines as json.dumps(x, ensure_ascii=False) (not Jinja's own filter: no key
 * sorting, no HTML escapes); vLLM hands the template Python objects made by json.loads, and its
 * hermes tool parser returns arguments as json.dumps(arguments, ensure_ascii=False). Matching those
 * bytes needs the raw number lexemes (1.0 stays "1.0", 1 stays "1"), which a parsed cJSON tree has
 * lost, so this works on the text.
 *
 * Python's rules, as written: separators ", " and ": "; keys keep their order, a repeated key keeps
 * its first place and its last value (dict assignment); strings escape only '"', '\\', \b \f \n \r
 * \t and other bytes below 0x20 as \u00XX, everything else (all non-ASCII) is written as UTF-8;
 * integers (no fraction, no exponent) keep their digits ("-0" is "0"); other numbers are floats,
 * written as repr() writes them ("1.0", "1e-05", "1e+16"; "Infinity" past the double range).
 * json.loads's NaN, Infinity and -Infinity literals are accepted. Invalid JSON, lone surrogates
 * (\ud800 alone cannot be UTF-8), nesting deeper than PYJSON_MAX_DEPTH and objects with more than
 * PYJSON_MAX_MEMBERS members fail with a message.
 */
#ifndef PXQ_PYJSON_H
#define PXQ_PYJSON_H

#include <stddef.h>

#include "util.h"

#define PYJSON_MAX_DEPTH 512
#define PYJSON_MAX_MEMBERS 4096

/* Append json.dumps(json.loads(json[0..n))) to out. 0, or -1 with a message (out then holds a
 * partial write the caller discards). */
int pyjson_dump(struct sbuf *out, const char *json, size_t n, char *err, size_t errlen);

/* Spans of raw values in valid JSON text (check it first: these skip, they do not validate).
 * pyjson_member: the value of member `key` of the object json[0..n) (leading whitespace allowed);
 * last = 0 finds the first such member (cJSON's lookup), 1 the last (Python's dict). Returns 0 with
 * *off, *len, or -1 if json is not an object or has no such member.
 * pyjson_elem: element i of an array; -1 if not an array or too short.
 * pyjson_type: the first character of the value ('{', '[', '"', 't', 'f', 'n', or a number's). */
int pyjson_member(const char *json, size_t n, const char *key, int last, size_t *off, size_t *len);
int pyjson_elem(const char *json, size_t n, int i, size_t *off, size_t *len);
char pyjson_type(const char *json, size_t n);
/* The members of the object json[0..n) in order: start with *pos = 0; each call gives the next
 * member's key (raw, quotes included) and value spans and returns 0, then -1 at the end. */
int pyjson_next_member(const char *json, size_t n, size_t *pos, size_t *koff, size_t *klen, size_t *voff, size_t *vlen);
/* Decode the JSON string value json[0..n) into a malloc'd NUL-terminated string; NULL if it is not
 * a valid string or holds a NUL or a lone surrogate. */
char *pyjson_string(const char *json, size_t n);

#endif
