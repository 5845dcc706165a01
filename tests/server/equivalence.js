// equivalence.js - continuous batching changes no output: 16 greedy requests of different prompt
// lengths sent concurrently each return exactly the text and the logprobs (bit for bit) the same
// request returns alone. This holds for the bundled model (Q4_K_M: the CPU's int8-dot matmul gives a
// token the same arithmetic in a chunk of any size); docs/SERVER.md says which models it does not.
//   1. one server, chunked prefill (--max-num-batched-tokens 32, so long prompts are prefilled over
//      several steps while the others decode): alone vs all 16 at once; and a running stream keeps
//      getting tokens while a long prompt is prefilled;
//   2. a server whose KV pool is too small for the 16 at once (--num-gpu-blocks-override), so the
//      scheduler must queue (admission control) and preempt sequences whose KV no longer fits:
//      the same 16 texts; then 3 long generations at once that cannot all fit: the same text as
//      alone, the preemption counter moved, and every KV block is free afterwards.
'use strict';
const { startServer, post, stream, check, finish, corpusPrompts, metric, metricSettles } = require('./common');

const N = 16, MAX_TOKENS = 24;

async function complete(port, prompt) {
  const r = await post(port, '/v1/completions', { prompt, max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true, logprobs: 0 });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${r.body}`);
  const o = JSON.parse(r.body);
  return { text: o.choices[0].text, lp: JSON.stringify(o.choices[0].logprobs.token_logprobs), n: o.usage.completion_tokens,
    n_prompt: o.usage.prompt_tokens };
}

(async () => {
  const prompts = corpusPrompts(N, 1, 150);
  const common = ['--max-model-len', '512', '--max-num-seqs', '16'];
  const a = await startServer([...common, '--max-num-batched-tokens', '32']);
  let alone = [];
  try {
    for (const p of prompts) alone.push(await complete(a.port, p));
    const lens = alone.map((x) => x.n_prompt);
    check('prompt lengths differ (' + Math.min(...lens) + '..' + Math.max(...lens) + ' tokens)', new Set(lens).size === N && Math.max(...lens) > 128);
    check('every request generated max_tokens', alone.every((x) => x.n === MAX_TOKENS));
    const together = await Promise.all(prompts.map((p) => complete(a.port, p)));
    const diff = together.map((x, i) => x.text === alone[i].text && x.lp === alone[i].lp ? -1 : i).filter((i) => i >= 0);
    check('16 concurrent (chunked prefill) == 16 alone (text and logprobs)', diff.length === 0,
      diff.map((i) => `#${i}: ${JSON.stringify(alone[i].text)} vs ${JSON.stringify(together[i].text)}`).join('; '));

    // chunked prefill: while the longest prompt is prefilled in chunks of <= 32 tokens, a running
    // stream keeps getting tokens (without chunking it would get none until the prefill is done)
    const arrivals = [];
    let tSend = 0, tFirst = 0, long = null;
    const running = stream(a.port, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 200, ignore_eos: true, temperature: 0,
      stream: true }, { onEvent: () => {
      arrivals.push(Date.now());
      if (arrivals.length === 5) {
        tSend = Date.now();
        // a prompt no earlier request began with: the prefix cache has none of its blocks
        long = stream(a.port, '/v1/completions', { prompt: 'Chapter ' + prompts[N - 1], max_tokens: 1, stream: true },
          { onEvent: (o) => { if (!tFirst && o.choices[0].text) tFirst = Date.now(); } });
      }
    } });
    await running;
    await long;
    const during = arrivals.filter((t) => t > tSend && t < tFirst).length;
    check(`chunked prefill: a stream got ${during} tokens while a ${alone[N - 1].n_prompt}-token prompt was prefilled`, tFirst > 0 && during >= 3);
  } catch (e) {
    check('server A: no exception', false, e.stack);
  }
  check('server A: SIGTERM exit 0', (await a.stop()).code === 0);

  // 20 blocks of 16 positions = 320 positions for 16 requests that need up to ~220 each
  const b = await startServer([...common, '--max-num-batched-tokens', '128', '--num-gpu-blocks-override', '20']);
  try {
    const together = await Promise.all(prompts.map((p) => complete(b.port, p)));
    const diff = together.map((x, i) => x.text === alone[i].text && x.lp === alone[i].lp ? -1 : i).filter((i) => i >= 0);
    check('small KV pool: 16 concurrent == 16 alone (text and logprobs)', diff.length === 0,
      diff.map((i) => `#${i}: ${JSON.stringify(alone[i].text)} vs ${JSON.stringify(together[i].text)}`).join('; '));
    // Whether the 16 above collide depends on how their arrivals interleave; three long generations
    // started together cannot all fit (3 x ~16 blocks > 20), so at least one must be preempted.
    const longPrompt = 'Once upon a time';
    const longReq = { prompt: longPrompt, max_tokens: 250, temperature: 0, ignore_eos: true, logprobs: 0 };
    const soloLong = await post(b.port, '/v1/completions', longReq);
    const three = await Promise.all([0, 1, 2].map(() => post(b.port, '/v1/completions', longReq)));
    const key = (r) => { const c = JSON.parse(r.body).choices[0]; return c.text + JSON.stringify(c.logprobs.token_logprobs); };
    check('small KV pool: 3 long generations at once == alone (text and logprobs)', three.every((r) => r.status === 200 && key(r) === key(soloLong)));
    const pre = await metric(b.port, 'pxq_num_preemptions_total');
    check('small KV pool: sequences were preempted and recomputed (' + pre + ')', pre > 0);
    check('small KV pool: all blocks free afterwards', (await metricSettles(b.port, 'pxq_kv_blocks_used', 0)) === 0);
  } catch (e) {
    check('server B: no exception', false, e.stack);
  }
  check('server B: SIGTERM exit 0', (await b.stop()).code === 0);
  finish();
})();
