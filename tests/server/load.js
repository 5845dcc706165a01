// load.js - 64 concurrent streaming clients for a bounded time (LOAD_SECONDS, default 10) against
// 127.0.0.1. Each client loops: streamed greedy completion of one of 8 prompts, with logprobs so
// every generated token is one chunk. Every stream must end with [DONE] after a finish chunk and a
// usage chunk, all its chunks must carry its own id, it must hold exactly usage.completion_tokens
// token chunks, and its text must equal that prompt's text from a request sent alone: no lost,
// duplicated or interleaved tokens. Prints requests/s, tokens/s and p50/p99 time to first token.
// Usage: node load.js [--clients N] [--seconds S] [--max-tokens N]  (extra args after -- go to pxq serve)
'use strict';
const { startServer, post, stream, streamText, percentile, check, finish, corpusPrompts, metric, metricSettles } = require('./common');

const argv = process.argv.slice(2);
const opt = (name, def) => { const i = argv.indexOf(name); return i >= 0 ? Number(argv[i + 1]) : def; };
const CLIENTS = opt('--clients', 64), SECONDS = opt('--seconds', Number(process.env.LOAD_SECONDS || 10));
const MAX_TOKENS = opt('--max-tokens', 32);
const serveArgs = argv.includes('--') ? argv.slice(argv.indexOf('--') + 1) : [];

(async () => {
  const srv = await startServer(['--max-model-len', '256', '--max-num-seqs', String(Math.min(CLIENTS, 64)), ...serveArgs]);
  const prompts = corpusPrompts(8, 4, 40);
  const expected = [];
  let nReq = 0, nTok = 0, bad = [], ttfts = [];
  try {
    for (const p of prompts) {
      const r = await post(srv.port, '/v1/completions', { prompt: p, max_tokens: MAX_TOKENS, temperature: 0 });
      expected.push(JSON.parse(r.body).choices[0].text);
    }
    const t0 = Date.now(), deadline = t0 + SECONDS * 1000;
    const client = async (k) => {
      for (let j = 0; Date.now() < deadline; j++) {
        const pi = (k + j) % prompts.length;
        const s = await stream(srv.port, '/v1/completions', { prompt: prompts[pi], max_tokens: MAX_TOKENS, temperature: 0,
          stream: true, logprobs: 0, stream_options: { include_usage: true } });
        nReq++;
        const id = s.events.length && s.events[0].id;
        const usage = s.events.length && s.events[s.events.length - 1].usage;
        const tokenChunks = s.events.filter((o) => o.choices.length && o.choices[0].logprobs && o.choices[0].logprobs.tokens.length === 1);
        const finishes = s.events.filter((o) => o.choices.length && o.choices[0].finish_reason);
        const problems = [];
        if (s.status !== 200) problems.push('status ' + s.status);
        if (!s.done) problems.push('no [DONE] at the end');
        if (!s.events.every((o) => o.id === id)) problems.push('chunks of another stream');
        if (!usage || tokenChunks.length !== usage.completion_tokens) problems.push(`token chunks ${tokenChunks.length} vs usage ${JSON.stringify(usage)}`);
        if (finishes.length !== 1) problems.push(finishes.length + ' finish chunks');
        if (streamText(s.events) !== expected[pi]) problems.push(`text ${JSON.stringify(streamText(s.events))} != ${JSON.stringify(expected[pi])}`);
        if (problems.length) bad.push(`client ${k} request ${j}: ${problems.join(', ')}`);
        if (usage) nTok += usage.completion_tokens;
        if (s.ttft !== null) ttfts.push(s.ttft);
      }
    };
    await Promise.all(Array.from({ length: CLIENTS }, (_, k) => client(k)));
    const dt = (Date.now() - t0) / 1000;
    check(`${nReq} streams from ${CLIENTS} clients in ${dt.toFixed(1)} s all complete and intact`, bad.length === 0 && nReq >= CLIENTS,
      bad.slice(0, 5).join('\n  '));
    console.log(`load: clients ${CLIENTS}, ${dt.toFixed(1)} s, ${nReq} requests, ${(nReq / dt).toFixed(2)} requests/s, ` +
      `${(nTok / dt).toFixed(1)} generated tokens/s, TTFT p50 ${percentile(ttfts, 50).toFixed(1)} ms, p99 ${percentile(ttfts, 99).toFixed(1)} ms`);
    check('no sequence left running, KV all free', (await metricSettles(srv.port, 'pxq_num_requests_running', 0)) === 0 &&
      (await metricSettles(srv.port, 'pxq_kv_blocks_used', 0)) === 0);
  } catch (e) {
    check('no exception', false, e.stack);
  }
  check('SIGTERM: exit 0', (await srv.stop()).code === 0);
  finish();
})();
