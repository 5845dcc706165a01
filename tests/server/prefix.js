// prefix.js - n > 1 choices and automatic prefix caching (the KV pool's block sharing):
//   1. n = 4 at temperature 0: four equal choices, equal to n = 1, with one prefill of the prompt
//      (pxq_prefill_tokens_total moves by the prompt once) and usage counting the prompt once;
//      seeded n = 3 sampling: 3 choices, the same again for the same seed; streaming n = 2 chat:
//      deltas carry their index, each choice ends once; n above the cap and best_of != n: 400;
//   2. a second request with the same ~1,000-token prefix prefills only its suffix (prefix cache
//      hits cover the prefix's full blocks) and its greedy output equals a server's without
//      prefix caching;
//   3. a pool too small to keep everything (--num-gpu-blocks-override): cached blocks are evicted
//      and the outputs stay those of the server without prefix caching;
//   4. a hybrid model (Qwen3.5) refuses n > 1 with a 400 and keeps prefix caching off.
'use strict';
const { startServer, post, stream, check, finish, corpusPrompts, metric, metricSettles } = require('./common');

async function completion(port, body) {
  const r = await post(port, '/v1/completions', body);
  if (r.status !== 200) throw new Error(`status ${r.status}: ${r.body}`);
  return JSON.parse(r.body);
}
const key = (c) => c.text + JSON.stringify(c.logprobs && c.logprobs.token_logprobs);

(async () => {
  const common = ['--max-model-len', '1536', '--max-num-seqs', '8'];
  const a = await startServer(common);
  const off = await startServer([...common, '--no-enable-prefix-caching']);
  try {
    check('start line says prefix caching is on', /prefix caching on/.test(a.log()), a.log());
    check('start line says it is off with --no-enable-prefix-caching', /prefix caching off/.test(off.log()));
    // ---- 1. n > 1 ----
    const prompt = corpusPrompts(3, 60, 60)[1];
    const one = await completion(a.port, { prompt, max_tokens: 12, temperature: 0, ignore_eos: true, logprobs: 0 });
    const pre0 = await metric(a.port, 'pxq_prefill_tokens_total'), pt0 = await metric(a.port, 'pxq_prompt_tokens_total');
    const p2 = 'Chapter 2. ' + prompt; // no cached block in common with the request above
    const four = await completion(a.port, { prompt: p2, n: 4, max_tokens: 12, temperature: 0, ignore_eos: true, logprobs: 0 });
    const np = four.usage.prompt_tokens;
    const pre1 = await metric(a.port, 'pxq_prefill_tokens_total');
    const pt1 = await metricSettles(a.port, 'pxq_prompt_tokens_total', pt0 + np); // recorded as the choices end
    check('n = 4: four choices, indexes 0..3', four.choices.length === 4 && four.choices.every((c, i) => c.index === i),
      JSON.stringify(four.choices.map((c) => c.index)));
    check('n = 4 at temperature 0: the choices are equal', four.choices.every((c) => key(c) === key(four.choices[0])));
    check('n = 4: each choice has its finish_reason', four.choices.every((c) => c.finish_reason === 'length'));
    check('n = 4: usage counts the prompt once and every completion', four.usage.completion_tokens === 48 &&
      four.usage.total_tokens === np + 48, JSON.stringify(four.usage));
    check(`n = 4: one prefill (${pre1 - pre0} prompt tokens computed for a ${np}-token prompt)`, pre1 - pre0 === np);
    check('n = 4: pxq_prompt_tokens_total counts the prompt once', pt1 - pt0 === np, `${pt1 - pt0}`);
    const solo = await completion(off.port, { prompt: p2, max_tokens: 12, temperature: 0, ignore_eos: true, logprobs: 0 });
    check('n = 4 choice == n = 1 on a server without sharing (text and logprobs)', key(four.choices[3]) === key(solo.choices[0]));
    check('n = 1 answers one choice', one.choices.length === 1);

    const seeded = { prompt, n: 3, max_tokens: 16, temperature: 1, seed: 1234 };
    const s1 = await completion(a.port, seeded), s2 = await completion(a.port, seeded);
    check('seeded n = 3: three choices', s1.choices.length === 3);
    check('seeded n = 3: reproducible', s1.choices.every((c, i) => c.text === s2.choices[i].text));
    check('seeded n = 3: the choices differ (distinct derived seeds)', new Set(s1.choices.map((c) => c.text)).size > 1,
      JSON.stringify(s1.choices.map((c) => c.text)));
    const s3 = await completion(off.port, seeded);
    check('seeded n = 3: the same without prefix caching', s1.choices.every((c, i) => c.text === s3.choices[i].text));

    const st = await stream(a.port, '/v1/chat/completions', { messages: [{ role: 'user', content: 'Tell me a story.' }], n: 2,
      max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true } });
    const byIdx = [[], []];
    let finishes = [0, 0], bad = 0;
    for (const e of st.events) {
      for (const c of e.choices || []) {
        if (c.index !== 0 && c.index !== 1) { bad++; continue; }
        if (c.delta && c.delta.content) byIdx[c.index].push(c.delta.content);
        if (c.finish_reason) finishes[c.index]++;
      }
    }
    const usage = st.events.filter((e) => e.usage).map((e) => e.usage);
    check('stream n = 2: deltas carry index 0 or 1, each choice finishes once', st.done && !bad && finishes[0] === 1 && finishes[1] === 1,
      JSON.stringify({ bad, finishes }));
    check('stream n = 2 at temperature 0: equal texts', byIdx[0].join('') === byIdx[1].join('') && byIdx[0].length > 0);
    check('stream n = 2: one usage chunk, 16 completion tokens', usage.length === 1 && usage[0].completion_tokens === 16,
      JSON.stringify(usage));

    const big = await post(a.port, '/v1/completions', { prompt, n: 17 });
    check('n = 17: 400 naming n', big.status === 400 && JSON.parse(big.body).error.param === 'n', big.body);
    const bo = await post(a.port, '/v1/completions', { prompt, n: 1, best_of: 2 });
    check('best_of != n: 400 naming best_of', bo.status === 400 && JSON.parse(bo.body).error.param === 'best_of', bo.body);
    const bo2 = await post(a.port, '/v1/completions', { prompt, n: 2, best_of: 2, max_tokens: 2 });
    check('best_of == n: accepted', bo2.status === 200 && JSON.parse(bo2.body).choices.length === 2, bo2.body);

    // ---- 2. prefix caching ----
    const prefix = corpusPrompts(1, 700, 700)[0];
    const q = (s) => ({ prompt: prefix + s, max_tokens: 16, temperature: 0, ignore_eos: true, logprobs: 0 });
    const r1 = await completion(a.port, q(' And then the first ending came.'));
    const h0 = await metric(a.port, 'pxq_prefix_cache_hits_total'), pf0 = await metric(a.port, 'pxq_prefill_tokens_total');
    const r2 = await completion(a.port, q(' But the second ending was different.'));
    const h1 = await metric(a.port, 'pxq_prefix_cache_hits_total'), pf1 = await metric(a.port, 'pxq_prefill_tokens_total');
    const nPrefix = r1.usage.prompt_tokens - 8; // the suffixes are about 8 tokens; the blocks before are shared
    check(`prefix: ${r1.usage.prompt_tokens}-token prompts`, r1.usage.prompt_tokens >= 900, `${r1.usage.prompt_tokens}`);
    check(`prefix: the second request hit ${h1 - h0} cached tokens (>= ${Math.floor(nPrefix / 16) * 16 - 16})`,
      h1 - h0 >= Math.floor(nPrefix / 16) * 16 - 16 && (h1 - h0) % 16 === 0);
    check(`prefix: it prefilled only its suffix (${pf1 - pf0} of ${r2.usage.prompt_tokens} tokens)`,
      pf1 - pf0 === r2.usage.prompt_tokens - (h1 - h0) && pf1 - pf0 < 48);
    const o1 = await completion(off.port, q(' And then the first ending came.'));
    const o2 = await completion(off.port, q(' But the second ending was different.'));
    check('prefix: greedy outputs equal those without prefix caching (text and logprobs)',
      key(r1.choices[0]) === key(o1.choices[0]) && key(r2.choices[0]) === key(o2.choices[0]));
    check('prefix: the server without it counts no hits', (await metric(off.port, 'pxq_prefix_cache_hits_total')) === 0);
    // ---- 3. eviction: 100 blocks of 16 = 1600 positions, prompts of ~1,000 tokens ----
    const small = await startServer(['--max-model-len', '1536', '--max-num-seqs', '2', '--num-gpu-blocks-override', '100']);
    try {
      const longs = corpusPrompts(4, 650, 700);
      const res = [];
      for (const p of [...longs, longs[0], longs[3], longs[0]]) res.push(await completion(small.port, { prompt: p, max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: 0 }));
      const ref = [];
      for (const p of longs) ref.push(await completion(off.port, { prompt: p, max_tokens: 8, temperature: 0, ignore_eos: true, logprobs: 0 }));
      const want = [0, 1, 2, 3, 0, 3, 0].map((i) => key(ref[i].choices[0]));
      check('small pool: outputs through evictions equal those without prefix caching', res.every((r, i) => key(r.choices[0]) === want[i]));
      const hits = await metric(small.port, 'pxq_prefix_cache_hits_total');
      check(`small pool: some prompts still hit (${hits} tokens), others were evicted`, hits > 0 &&
        hits < 3 * Math.min(...res.slice(4).map((r) => r.usage.prompt_tokens)));
      check('small pool: every block free or cached at the end', (await metric(small.port, 'pxq_kv_blocks_used')) === 0);
    } finally {
      await small.stop();
    }
  } catch (e) {
    check('no exception', false, e.stack);
  }
  // ---- a hybrid model (Qwen3.5: DeltaNet layers keep a recurrent state): no sharing ----
  const h = await startServer(['-m', 'tests/data/qwen35/tiny-qwen35-Q8_0.gguf', '--max-model-len', '256']);
  try {
    check('hybrid: the start line says prefix caching is off and n is 1', /prefix caching off \(recurrent layers\), n up to 1/.test(h.log()), h.log());
    const r = await post(h.port, '/v1/completions', { prompt: 'Hello', n: 2, max_tokens: 2 });
    check('hybrid: n = 2 is a 400 naming n', r.status === 400 && JSON.parse(r.body).error.param === 'n' &&
      /recurrent/.test(JSON.parse(r.body).error.message), r.body);
    const ok = await post(h.port, '/v1/completions', { prompt: 'Hello', n: 1, max_tokens: 2 });
    check('hybrid: n = 1 works', ok.status === 200);
  } catch (e) {
    check('hybrid: no exception', false, e.stack);
  }
  await h.stop();
  check('server with prefix caching: SIGTERM exit 0', (await a.stop()).code === 0);
  check('server without: SIGTERM exit 0', (await off.stop()).code === 0);
  finish();
})();
