// structured_cost.js - what structured output costs per token: on one server, one request at a
// time, a generation of N tokens without constraint (ignore_eos) alternated R times with the same
// request held to each schema below. Two measures, medians over the rounds:
//   - the decode rate of each run, the server's own (the access log's tok_s: tokens after the first
//     over the time from the first to the last), and the constrained run's extra time per token
//     against the unconstrained run of the same round (on a loaded machine this one is noisy);
//   - the time the server spent on the masks of the run's tokens (computing, applying, advancing the
//     matcher: /metrics pxq_structured_output_mask_seconds_total over _tokens_total), in us per
//     token and as a share of the unconstrained run's time per token.
//   strings   an array of at least N strings: mostly string states, which the mask cache serves
//             within a string (the array is unrolled to N items: each item's states are new);
//   records   an array of at least N objects {id, name, tags: [enum], ok}: the array is unrolled to
//             N items, so no state recurs and every step walks the trie (the worst case);
//   json      any JSON object (response_format json_object).
// A constrained run the model ends before N tokens counts the tokens it made (shown).
// Not run by make test. Usage:
//   node tests/server/structured_cost.js [--tokens 1000] [--rounds 3] [--temperature 1] [-- SERVE_FLAGS]
// e.g. -- -m /tmp/random-qwen3-151k (tools/make_random_qwen3.py) for Qwen3's vocabulary.
'use strict';
const { startServer, post, percentile, metric } = require('./common');

const argv = process.argv.slice(2);
const dd = argv.indexOf('--');
const own = dd >= 0 ? argv.slice(0, dd) : argv, serveArgs = dd >= 0 ? argv.slice(dd + 1) : [];
const opt = (name, def) => (own.includes(name) ? +own[own.indexOf(name) + 1] : def);
const N = opt('--tokens', 1000), ROUNDS = opt('--rounds', 3), TEMP = opt('--temperature', 1);

const SCHEMAS = {
  strings: { type: 'array', minItems: N, items: { type: 'string' } },
  records: { type: 'array', minItems: N, items: { type: 'object', required: ['id', 'name', 'tags', 'ok'], properties: {
    id: { type: 'integer' }, name: { type: 'string' }, tags: { type: 'array', items: { enum: ['alpha', 'beta', 'gamma'] } },
    ok: { type: 'boolean' } } } },
  json: null,
};

(async () => {
  const srv = await startServer(['--served-model-name', 'm', '--max-model-len', String(N + 64), ...serveArgs]);
  const base = { model: 'm', prompt: 'Here is the data as JSON:', max_tokens: N, temperature: TEMP };
  const run = async (extra) => {
    const s0 = await metric(srv.port, 'pxq_structured_output_mask_seconds_total');
    const n0 = await metric(srv.port, 'pxq_structured_output_tokens_total');
    const r = await post(srv.port, '/v1/completions', { ...base, ...extra });
    const o = JSON.parse(r.body);
    if (r.status !== 200) throw new Error(r.body);
    await new Promise((res) => setTimeout(res, 50)); // the access line is written as the response ends
    const line = srv.log().split('\n').find((l) => l.includes(`id=${o.id} `));
    const tok_s = +line.match(/tok_s=(\S+)/)[1];
    const ds = (await metric(srv.port, 'pxq_structured_output_mask_seconds_total')) - s0;
    const dn = (await metric(srv.port, 'pxq_structured_output_tokens_total')) - n0;
    return { ms: 1000 / tok_s, n: o.usage.completion_tokens, finish: o.choices[0].finish_reason, mask_us: dn ? (ds / dn) * 1e6 : 0 };
  };
  const rows = { none: [] };
  for (const k of Object.keys(SCHEMAS)) rows[k] = [];
  await run({ seed: 0, ignore_eos: true, max_tokens: 32 }); // warm up
  for (let round = 0; round < ROUNDS; round++) {
    const seed = round + 1;
    const plain = await run({ seed, ignore_eos: true });
    rows.none.push({ ...plain, extra: 0 });
    for (const [k, schema] of Object.entries(SCHEMAS)) {
      const rf = schema ? { type: 'json_schema', json_schema: { name: k, schema } } : { type: 'json_object' };
      const c = await run({ seed, response_format: rf });
      rows[k].push({ ...c, extra: c.ms / plain.ms - 1, share: c.mask_us / 1000 / plain.ms });
    }
  }
  console.log(`${N} tokens, temperature ${TEMP}, ${ROUNDS} rounds, serve ${serveArgs.join(' ') || '(bundled model)'}`);
  console.log('constraint   ms/token   extra   mask us/token   mask/token   tokens made');
  const med = (rs, f) => percentile(rs.map(f), 50);
  for (const [k, rs] of Object.entries(rows))
    console.log(`${k.padEnd(12)} ${med(rs, (r) => r.ms).toFixed(3).padStart(8)}   ${(100 * med(rs, (r) => r.extra)).toFixed(1).padStart(5)}%` +
      (k === 'none' ? ' '.repeat(29) : `   ${med(rs, (r) => r.mask_us).toFixed(1).padStart(13)}   ${(100 * med(rs, (r) => r.share)).toFixed(2).padStart(9)}%`) +
      `   ${rs.map((r) => r.n).join(' ')}`);
  await srv.stop();
})().catch((e) => { console.error(e); process.exit(1); });
