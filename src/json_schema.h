/* json_schema.h - grammars (grammar.h) for structured output: a JSON Schema, any JSON object
 * (OpenAI's JSON mode), and Qwen3/Hermes tool calls whose arguments follow each tool's schema.
 *
 * The schema subset (JSON Schema 2020-12 keywords; OpenAI's structured outputs use the same):
 *   type (a name or an array of names: object, array, string, number, integer, boolean, null),
 *   properties, required, additionalProperties, items, minItems, maxItems, minLength, maxLength,
 *   enum, const, anyOf, allOf of one schema, $ref to "#" or "#/..." (with $defs / definitions),
 *   boolean schemas, and the annotations (title, description, default, examples, $schema, $id,
 *   $comment, deprecated, readOnly, writeOnly), which change nothing. Any other keyword (pattern,
 *   format, minimum, oneOf, ...) is refused with its name and where it is: a constraint the output
 *   would not keep is never dropped silently.
 *
 * What is generated (every output validates; not every valid document can be generated):
 *   - objects hold the declared properties in the schema's order, each required one present and each
 *     optional one present or not; no other property is written, whatever additionalProperties
 *     allows (an object without declared properties takes any keys unless additionalProperties is
 *     false, with values of its schema when it is one);
 *   - numbers: -?(0|[1-9][0-9]{0,15})(.[0-9]{1,16})?([eE][+-]?[0-9]{1,2})?, integers without the
 *     fraction and exponent: at most 16 digits, so a model cannot write digits forever, and every
 *     number parses to a finite double;
 *   - strings: any UTF-8 text, escapes included (\uD800-\uDFFF surrogate escapes are refused:
 *     characters count as code points, as minLength / maxLength count them);
 *   - enum / const values as JSON in compact form (cJSON's printing of the value);
 *   - whitespace: where JSON allows it (after '{', '[', ',' and ':', before '}' and ']', and
 *     around the whole value) at most one space, or one newline followed by at most 20 spaces or
 *     tabs; nothing before ',' and ':'. Bounded, so a model cannot pad forever, and enough for
 *     compact, "json.dumps" and indented styles.
 *
 * Errors are written to err[errlen] as "PATH: message", PATH from `path` (e.g.
 * "response_format.json_schema.schema") down to the keyword (".properties.age.minimum").
 */
#ifndef PXQ_JSON_SCHEMA_H
#define PXQ_JSON_SCHEMA_H

#include <cJSON.h>
#include <stddef.h>

#include "grammar.h"

#define JSON_SCHEMA_MAX_DEPTH 64       /* nesting of schemas */
#define JSON_SCHEMA_MAX_ITEMS 4096     /* minItems / maxItems larger than this are refused */
#define JSON_SCHEMA_MAX_OPTIONAL 64    /* optional properties of one object */

/* Whitespace, then one value valid under `schema`, then whitespace. NULL with a message. */
struct gm_grammar *json_schema_grammar(const cJSON *schema, const char *path, char *err, size_t errlen);
/* Whitespace, any JSON object, whitespace (response_format {"type": "json_object"}). */
struct gm_grammar *json_object_grammar(void);

/* Tool calls as Qwen3's template writes them and the hermes parser (server/parsers.c) reads them:
 *   <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
 * NAME one of the tools' names, ARGS valid under that tool's parameters schema (any JSON object
 * when it has none); `multiple`: one or more calls separated by "\n", else exactly one. path names
 * the tools for messages (e.g. "tools"). NULL with a message. */
struct json_tool { const char *name; const cJSON *parameters; };
struct gm_grammar *json_tool_call_grammar(const struct json_tool *tools, int n_tools, int multiple, const char *path, char *err,
                                          size_t errlen);

#endif
