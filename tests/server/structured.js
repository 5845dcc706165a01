// structured.js - structured output end to end with the official openai SDK and the bundled tiny
// model: response_format json_schema on five schemas (nested objects, arrays, enums, numbers,
// strings with escapes), 100 seeded samples each at temperature 1, every one of which must parse and
// validate, checked twice: by the small validator below (the schema subset PXQ supports) and, where
// python3 has it, by the jsonschema package (Debian's python3-jsonschema); response_format
// json_object on /v1/completions; streaming, n > 1 and max_tokens cutting the output ("length");
// tool_choice "required" and a named function (Qwen3's template, no --tool-call-parser), whose
// calls come back as tool_calls with arguments valid under the tool's parameters; and the 400s of
// bad schemas, unsupported keywords and unknown response_format types.
// Usage: node tests/server/structured.js [--samples N]
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { spawnSync } = require('child_process');
const { OpenAI, BadRequestError } = require('openai');
const { ROOT, startServer, post, check, finish } = require('./common');

const argv = process.argv.slice(2);
const SAMPLES = argv.includes('--samples') ? +argv[argv.indexOf('--samples') + 1] : 100;

const SCHEMAS = {
  'nested objects': { type: 'object', additionalProperties: false, required: ['user', 'active'], properties: {
    user: { type: 'object', additionalProperties: false, required: ['name', 'address'], properties: {
      name: { type: 'string', maxLength: 30 },
      address: { type: 'object', additionalProperties: false, required: ['city', 'zip'], properties: {
        city: { type: 'string', maxLength: 30 }, zip: { type: 'string', minLength: 5, maxLength: 5 } } } } },
    active: { type: 'boolean' }, note: { type: 'string', maxLength: 20 } } },
  arrays: { type: 'object', additionalProperties: false, required: ['matrix', 'words'], properties: {
    matrix: { type: 'array', minItems: 2, maxItems: 3, items: { type: 'array', minItems: 1, maxItems: 3, items: { type: 'integer' } } },
    words: { type: 'array', maxItems: 5, items: { type: 'string', maxLength: 12 } } } },
  enums: { type: 'object', additionalProperties: false, required: ['color', 'size', 'mode', 'status'], properties: {
    color: { enum: ['red', 'green', 'blue'] }, size: { enum: ['S', 'M', 1, 2.5, null, true] }, mode: { const: 'fast' },
    status: { anyOf: [{ enum: ['on', 'off'] }, { type: 'null' }] } } },
  numbers: { type: 'object', additionalProperties: false, required: ['count', 'ratio', 'values', 'maybe'], properties: {
    count: { type: 'integer' }, ratio: { type: 'number' }, values: { type: 'array', minItems: 2, maxItems: 5, items: { type: 'number' } },
    maybe: { type: ['number', 'null'] } } },
  // the model writes prose into quote; path and sig make it write escapes (quote, backslash,
  // control characters, \u0001) and non-ASCII characters, which must come back as the same strings
  'strings with escapes': { type: 'object', additionalProperties: false, required: ['quote', 'path', 'sig'], properties: {
    quote: { type: 'string', minLength: 1, maxLength: 60 },
    path: { enum: ['C:\\Users\\me', 'say "hi"', 'line1\nline2', 'tab\tend', 'caf\u00e9 \u2603 \ud83d\ude00', '\u0001'] },
    sig: { const: '\\"/\b\f\n\r\t' } } },
};

// ---- a validator for the subset (type, properties, required, additionalProperties, items,
// minItems, maxItems, minLength, maxLength, enum, const, anyOf, allOf, $ref) ----
function deepEqual(a, b) { return JSON.stringify(a) === JSON.stringify(b); }
function typeOk(t, v) {
  switch (t) {
    case 'object': return v !== null && typeof v === 'object' && !Array.isArray(v);
    case 'array': return Array.isArray(v);
    case 'string': return typeof v === 'string';
    case 'integer': return typeof v === 'number' && Number.isInteger(v);
    case 'number': return typeof v === 'number' && Number.isFinite(v);
    case 'boolean': return typeof v === 'boolean';
    case 'null': return v === null;
    default: return false;
  }
}
function validate(s, v, root = s) {
  if (s === true) return true;
  if (s === false) return false;
  if (s.$ref) return validate(s.$ref.slice(2).split('/').filter(Boolean).reduce((o, k) => o[k], root), v, root);
  if (s.type && ![].concat(s.type).some((t) => typeOk(t, v))) return false;
  if (s.enum && !s.enum.some((e) => deepEqual(e, v))) return false;
  if ('const' in s && !deepEqual(s.const, v)) return false;
  if (s.anyOf && !s.anyOf.some((x) => validate(x, v, root))) return false;
  if (s.allOf && !s.allOf.every((x) => validate(x, v, root))) return false;
  if (typeof v === 'string') {
    const n = [...v].length;
    if ((s.minLength !== undefined && n < s.minLength) || (s.maxLength !== undefined && n > s.maxLength)) return false;
  }
  if (Array.isArray(v)) {
    if ((s.minItems !== undefined && v.length < s.minItems) || (s.maxItems !== undefined && v.length > s.maxItems)) return false;
    if (s.items !== undefined && !v.every((x) => validate(s.items, x, root))) return false;
  }
  if (typeOk('object', v)) {
    for (const k of s.required || []) if (!(k in v)) return false;
    for (const [k, x] of Object.entries(v)) {
      if (s.properties && k in s.properties) { if (!validate(s.properties[k], x, root)) return false; }
      else if (s.additionalProperties !== undefined && !validate(s.additionalProperties, x, root)) return false;
    }
  }
  return true;
}

// The independent oracle: python3's jsonschema (Draft 2020-12). Returns per-case booleans, or null
// when python3 or the package is missing.
function jsonschemaOracle(cases) {
  const code = `
import json, sys
try:
    import jsonschema
except ImportError:
    print("null"); sys.exit(0)
out = []
for c in json.load(sys.stdin):
    v = jsonschema.Draft202012Validator(c["schema"])
    ok = []
    for t in c["texts"]:
        try:
            v.validate(json.loads(t)); ok.append(True)
        except Exception:
            ok.append(False)
    out.append(ok)
print(json.dumps(out))`;
  const r = spawnSync('python3', ['-c', code], { input: JSON.stringify(cases), encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.status !== 0) return null;
  return JSON.parse(r.stdout);
}

function parses(text) { try { return { ok: true, v: JSON.parse(text) }; } catch (_) { return { ok: false }; } }

async function refused(client, name, body, param, re) {
  let err = null;
  try { await client.chat.completions.create({ model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, ...body }); } catch (e) { err = e; }
  check(`${name}: 400 naming ${param}`, err instanceof BadRequestError && err.param === param && re.test(err.message), String(err));
}

(async () => {
  const srv = await startServer(['--served-model-name', 'tiny', '--max-model-len', '2048']);
  const client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'x', maxRetries: 0, timeout: 300000 });
  const MSGS = [{ role: 'system', content: 'Reply in JSON.' }, { role: 'user', content: 'Tell me about the sea.' }];
  const rf = (name, schema) => ({ type: 'json_schema', json_schema: { name: name.replace(/\W/g, '_'), schema, strict: true } });
  try {
    // ---- 100 seeded samples per schema ----
    const oracleCases = [];
    const t0 = Date.now();
    let tokens = 0;
    for (const [name, schema] of Object.entries(SCHEMAS)) {
      const res = [];
      for (let i = 0; i < SAMPLES; i += 25) { // 25 at a time: the server batches 16
        const batch = [];
        for (let k = i; k < Math.min(SAMPLES, i + 25); k++)
          batch.push(client.chat.completions.create({ model: 'tiny', messages: MSGS, temperature: 1, seed: k + 1, max_tokens: 1500,
            response_format: rf(name, schema) }));
        res.push(...await Promise.all(batch));
      }
      const texts = res.map((r) => r.choices[0].message.content);
      tokens += res.reduce((a, r) => a + r.usage.completion_tokens, 0);
      const parsed = texts.map(parses);
      const nParse = parsed.filter((p) => p.ok).length, nValid = parsed.filter((p) => p.ok && validate(schema, p.v)).length;
      const nStop = res.filter((r) => r.choices[0].finish_reason === 'stop').length;
      const nEsc = texts.filter((t) => /\\/.test(t)).length;
      console.log(`     ${name}: ${nParse}/${SAMPLES} parse, ${nValid}/${SAMPLES} valid, ${nStop} finish_reason stop, ${nEsc} with escapes; e.g. ${JSON.stringify(texts[0]).slice(0, 160)}`);
      check(`${name}: ${SAMPLES} of ${SAMPLES} samples parse and validate`, nParse === SAMPLES && nValid === SAMPLES && nStop === SAMPLES,
        JSON.stringify(texts.filter((t, k) => !(parsed[k].ok && validate(schema, parsed[k].v))).slice(0, 3)));
      if (name === 'strings with escapes') check('escapes written and read back', nEsc === SAMPLES, nEsc);
      oracleCases.push({ name, schema, texts });
    }
    console.log(`     ${5 * SAMPLES} samples, ${tokens} tokens in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    const oracle = jsonschemaOracle(oracleCases);
    if (!oracle) console.log('SKIP jsonschema oracle: python3 -c "import jsonschema" failed (apt install python3-jsonschema)');
    else oracleCases.forEach((c, k) => check(`${c.name}: python3 jsonschema validates all ${SAMPLES}`, oracle[k].every(Boolean),
      oracle[k].filter((x) => !x).length + ' invalid'));

    // ---- the same through the stream, n > 1, json_object, max_tokens ----
    const schema = SCHEMAS.enums;
    const one = await client.chat.completions.create({ model: 'tiny', messages: MSGS, seed: 7, temperature: 1, response_format: rf('e', schema) });
    let streamed = '';
    for await (const ch of await client.chat.completions.create({ model: 'tiny', messages: MSGS, seed: 7, temperature: 1, stream: true,
      response_format: rf('e', schema) })) streamed += (ch.choices[0] && ch.choices[0].delta.content) || '';
    check('streamed: the same text as not streamed, valid', streamed === one.choices[0].message.content && validate(schema, JSON.parse(streamed)),
      JSON.stringify([streamed, one.choices[0].message.content]));
    const many = await client.chat.completions.create({ model: 'tiny', messages: MSGS, n: 4, temperature: 1, seed: 3, response_format: rf('e', schema) });
    check('n = 4: every choice valid', many.choices.length === 4 && many.choices.every((c) => { const p = parses(c.message.content); return p.ok && validate(schema, p.v); }),
      JSON.stringify(many.choices.map((c) => c.message.content)));
    // JSON mode bounds no string, so the tiny model, which writes prose, does not always close its
    // strings within max_tokens: every output that ended is an object, the others a prefix of one
    const objs = await Promise.all([...Array(20).keys()].map((k) => client.completions.create({ model: 'tiny', prompt: 'The sea is', temperature: 1,
      seed: k, max_tokens: 300, response_format: { type: 'json_object' } })));
    const ended = objs.filter((r) => r.choices[0].finish_reason === 'stop');
    console.log(`     json_object: ${ended.length} of 20 ended within 300 tokens`);
    check('json_object on /v1/completions: the outputs that ended are JSON objects, the others cut by length', ended.length >= 5 &&
      ended.every((r) => { const p = parses(r.choices[0].text); return p.ok && typeOk('object', p.v); }) &&
      objs.every((r) => r.choices[0].finish_reason === 'stop' || r.choices[0].finish_reason === 'length'),
      JSON.stringify(objs.map((r) => r.choices[0].text).slice(0, 3)));
    const cut = await client.chat.completions.create({ model: 'tiny', messages: MSGS, seed: 1, max_tokens: 3, response_format: rf('n', SCHEMAS['nested objects']) });
    check('max_tokens before the end: finish_reason length, an unfinished prefix', cut.choices[0].finish_reason === 'length' &&
      !parses(cut.choices[0].message.content).ok, JSON.stringify(cut.choices[0]));

    // ---- bad input ----
    await refused(client, 'a keyword PXQ lacks', { response_format: rf('x', { type: 'object', properties: { a: { type: 'string', pattern: '^a' } } }) },
      'response_format', /response_format\.json_schema\.schema\.properties\.a: 'pattern' is not supported/);
    await refused(client, 'an invalid schema', { response_format: rf('x', { type: 'strng' }) }, 'response_format', /unknown type 'strng'/);
    await refused(client, 'a schema that is not one', { response_format: rf('x', 5) }, 'response_format', /must be an object or a boolean/);
    await refused(client, 'a $ref cycle', { response_format: rf('x', { $defs: { a: { $ref: '#/$defs/a' } }, $ref: '#/$defs/a' }) }, 'response_format', /the schema cannot be used/);
    await refused(client, 'an unknown response_format type', { response_format: { type: 'xml' } }, 'response_format', /'xml' is not supported/);
    await refused(client, 'json_schema without a schema', { response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, 'response_format', /schema is required/);
    await refused(client, 'ignore_eos with a schema', { ignore_eos: true, response_format: { type: 'json_object' } }, 'ignore_eos', /structured output/);
    await refused(client, 'tool_choice required without tools', { tool_choice: 'required' }, 'tool_choice', /needs 'tools'/);
    let deep = { type: 'string' };
    for (let i = 0; i < 70; i++) deep = { type: 'object', properties: { a: deep } };
    await refused(client, 'schemas nested 70 deep', { response_format: rf('x', deep) }, 'response_format', /nested deeper than 64/);
    await refused(client, 'anyOf of 65 schemas', { response_format: rf('x', { anyOf: [...Array(65)].map(() => ({ type: 'null' })) }) },
      'response_format', /more than 64/);
    await refused(client, 'maxItems 5000', { response_format: rf('x', { type: 'array', maxItems: 5000 }) }, 'response_format', /above 4096/);
    await refused(client, '65 optional properties', { response_format: rf('x', { type: 'object', properties: Object.fromEntries(
      [...Array(65).keys()].map((k) => ['p' + k, { type: 'integer' }])) }) }, 'response_format', /65 optional properties/);
    const bigEnum = await client.chat.completions.create({ model: 'tiny', messages: MSGS, max_tokens: 50, seed: 1,
      response_format: rf('x', { enum: [...Array(5000).keys()].map((k) => `value number ${k}`) }) });
    check('an enum of 5,000 strings: one of them', /^\s*"value number \d+"\s*$/.test(bigEnum.choices[0].message.content),
      bigEnum.choices[0].message.content);
    const r404 = await post(srv.port, '/v1/completions', { model: 'tiny', prompt: 'x', response_format: { type: 'json_schema', json_schema: { schema: { type: 'integer', minimum: 0 } } } });
    check('completions: an unsupported keyword, 400 naming it', r404.status === 400 && /'minimum' is not supported/.test(r404.body), r404.body);
  } catch (e) {
    check('no unexpected exception', false, e.stack);
  }
  const { code } = await srv.stop();
  check('SIGTERM: exit 0', code === 0, code);

  // ---- forced tool calls, Qwen3's template, no --tool-call-parser ----
  const tmpl = path.join(os.tmpdir(), `pxq-qwen3-structured-${process.pid}.jinja`);
  fs.writeFileSync(tmpl, JSON.parse(fs.readFileSync(path.join(ROOT, 'tests/data/qwen3-tokenizer/tokenizer_config.json'))).chat_template);
  const srv2 = await startServer(['--served-model-name', 'tiny', '--max-model-len', '2048', '--chat-template', tmpl]);
  const c2 = new OpenAI({ baseURL: srv2.base + '/v1', apiKey: 'x', maxRetries: 0, timeout: 300000 });
  const TOOLS = [
    { type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: { type: 'object',
      properties: { city: { type: 'string', maxLength: 20 }, days: { type: 'integer' } }, required: ['city'] } } },
    { type: 'function', function: { name: 'set_mode', parameters: { type: 'object', properties: { mode: { enum: ['on', 'off'] } },
      required: ['mode'], additionalProperties: false } } },
  ];
  const params = Object.fromEntries(TOOLS.map((t) => [t.function.name, t.function.parameters]));
  try {
    const MSG = [{ role: 'user', content: 'What is the weather in Paris?' }];
    // one call each ("required" with parallel_tool_calls false, a named function): the tiny model
    // would go on calling after a call where one more is allowed
    const validCall = (c) => { const p = parses(c.function.arguments);
      return params[c.function.name] && p.ok && validate(params[c.function.name], p.v) && /^call_/.test(c.id); };
    for (const [label, extra] of [['required, parallel_tool_calls false', { tool_choice: 'required', parallel_tool_calls: false }],
      ['named set_mode', { tool_choice: { type: 'function', function: { name: 'set_mode' } } }]]) {
      const rs = await Promise.all([...Array(20).keys()].map((k) => c2.chat.completions.create({ model: 'tiny', messages: MSG, tools: TOOLS,
        temperature: 1, seed: k, max_tokens: 300, ...extra })));
      const good = rs.filter((r) => {
        const m = r.choices[0].message, calls = m.tool_calls || [];
        return r.choices[0].finish_reason === 'tool_calls' && calls.length === 1 && m.content === null && validCall(calls[0]) &&
          (label.startsWith('required') || calls[0].function.name === 'set_mode');
      }).length;
      check(`tool_choice ${label}: 20 of 20 answers are tool_calls with valid arguments`, good === 20,
        JSON.stringify(rs.map((r) => r.choices[0]).slice(0, 2)));
    }
    // "required" with parallel calls: every call that finished is valid (the tiny model may be cut
    // by max_tokens in the middle of another)
    const par = await c2.chat.completions.create({ model: 'tiny', messages: MSG, tools: TOOLS, tool_choice: 'required', temperature: 1,
      seed: 1, max_tokens: 200 });
    const pc = par.choices[0].message.tool_calls || [];
    check('tool_choice required: one or more calls, each valid', par.choices[0].finish_reason === 'tool_calls' && pc.length >= 1 &&
      pc.every(validCall), JSON.stringify(par.choices[0]));
    await refused(c2, 'parallel_tool_calls false with auto', { tools: TOOLS, parallel_tool_calls: false }, 'parallel_tool_calls', /not with "auto"/);
    await refused(c2, 'tool_choice naming a function not in tools', { tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } },
      'tool_choice', /'nope', which is not in 'tools'/);
    await refused(c2, 'response_format and a forced call', { tools: TOOLS, tool_choice: 'required', response_format: { type: 'json_object' } },
      'response_format', /cannot be combined/);
    await refused(c2, 'a tool schema PXQ lacks', { tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object',
      properties: { n: { type: 'integer', maximum: 3 } } } } }], tool_choice: 'required' }, 'tools', /tools\[0\]\.function\.parameters\.properties\.n: 'maximum'/);
  } catch (e) {
    check('no unexpected exception (tools)', false, e.stack);
  }
  fs.unlinkSync(tmpl);
  const r2 = await srv2.stop();
  check('SIGTERM: exit 0', r2.code === 0, r2.code);
  finish();
})();
