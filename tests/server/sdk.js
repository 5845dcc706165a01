// sdk.js - the official openai SDK, unmodified, against pxq serve: models, a plain completion, a chat
// completion, a streamed chat with usage, stop strings, seeds, logprobs, and the SDK's error classes
// for a bad API key, an unknown model and an over-long request.
'use strict';
const { OpenAI, AuthenticationError, NotFoundError, BadRequestError } = require('openai');
const { startServer, request, check, finish } = require('./common');

(async () => {
  const srv = await startServer(['--api-key', 'sk-test', '--served-model-name', 'tiny', '--max-model-len', '512']);
  const client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'sk-test', maxRetries: 0, timeout: 60000 });
  try {
    const models = await client.models.list();
    check('models.list names the served model', models.data.length === 1 && models.data[0].id === 'tiny', JSON.stringify(models.data));

    const c = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 16, temperature: 0 });
    check('completion: text', typeof c.choices[0].text === 'string' && c.choices[0].text.length > 0, JSON.stringify(c));
    check('completion: object and finish_reason', c.object === 'text_completion' && ['stop', 'length'].includes(c.choices[0].finish_reason));
    check('completion: usage', c.usage.prompt_tokens > 0 && c.usage.completion_tokens > 0 && c.usage.completion_tokens <= 16 &&
      c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens, JSON.stringify(c.usage));
    const c2 = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 16, temperature: 0 });
    check('completion: greedy is deterministic', c2.choices[0].text === c.choices[0].text);

    const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Tell me about the sea.' }];
    const chat = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 24, temperature: 0 });
    const content = chat.choices[0].message.content;
    check('chat: assistant message', chat.object === 'chat.completion' && chat.choices[0].message.role === 'assistant' &&
      typeof content === 'string' && content.length > 0, JSON.stringify(chat));
    check('chat: usage', chat.usage.completion_tokens > 0 && chat.usage.completion_tokens <= 24);

    const st = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 24, temperature: 0, stream: true,
      stream_options: { include_usage: true } });
    let text = '', usage = null, finishReason = null, nChunks = 0, ids = new Set();
    for await (const chunk of st) {
      nChunks++;
      ids.add(chunk.id);
      if (chunk.usage) usage = chunk.usage;
      const ch = chunk.choices[0];
      if (ch && ch.delta && ch.delta.content) text += ch.delta.content;
      if (ch && ch.finish_reason) finishReason = ch.finish_reason;
    }
    check('streamed chat: same text as the non-streamed greedy request', text === content, JSON.stringify([text, content]));
    check('streamed chat: usage chunk', usage && usage.completion_tokens === chat.usage.completion_tokens &&
      usage.prompt_tokens === chat.usage.prompt_tokens, JSON.stringify(usage));
    check('streamed chat: finish_reason and one id', finishReason === chat.choices[0].finish_reason && ids.size === 1 && nChunks > 2);

    // stop: a word from the greedy text ends generation before it
    const long = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 40, temperature: 0 });
    const words = long.choices[0].text.split(/\s+/).filter((w) => w.length >= 3);
    const stopWord = words[Math.min(3, words.length - 1)];
    const stopped = await client.completions.create({ model: 'tiny', prompt: 'Once upon a time', max_tokens: 40, temperature: 0, stop: [stopWord] });
    const cut = long.choices[0].text.indexOf(stopWord);
    check('stop string: text ends before it, finish_reason stop', stopped.choices[0].finish_reason === 'stop' &&
      stopped.choices[0].text === long.choices[0].text.slice(0, cut), JSON.stringify([stopWord, stopped.choices[0].text]));

    const s1 = await client.completions.create({ model: 'tiny', prompt: 'The sea', max_tokens: 20, temperature: 1, seed: 42 });
    const s2 = await client.completions.create({ model: 'tiny', prompt: 'The sea', max_tokens: 20, temperature: 1, seed: 42 });
    check('seed: same seed, same sampled text', s1.choices[0].text === s2.choices[0].text);

    const lp = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3 });
    const lc = lp.choices[0].logprobs && lp.choices[0].logprobs.content;
    check('logprobs: one entry per token', lc && lc.length === lp.usage.completion_tokens, JSON.stringify(lp.choices[0].logprobs).slice(0, 300));
    check('logprobs: greedy token is the top alternative, logprobs <= 0 and sorted', lc && lc.every((e) => e.logprob <= 0 &&
      e.top_logprobs.length === 3 && e.top_logprobs[0].token === e.token && Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-5 &&
      e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob && e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob));

    const bad = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'wrong', maxRetries: 0 });
    let err = null;
    try { await bad.models.list(); } catch (e) { err = e; }
    check('bad API key: AuthenticationError (401)', err instanceof AuthenticationError && err.status === 401, String(err));
    err = null;
    try { await client.completions.create({ model: 'nope', prompt: 'x', max_tokens: 4 }); } catch (e) { err = e; }
    check('unknown model: NotFoundError (404)', err instanceof NotFoundError && err.status === 404, String(err));
    err = null;
    try { await client.completions.create({ model: 'tiny', prompt: 'x', max_tokens: 100000 }); } catch (e) { err = e; }
    check('prompt + max_tokens > max-model-len: BadRequestError (400)', err instanceof BadRequestError && err.status === 400 &&
      err.param === 'max_tokens', String(err));
    err = null;
    try { await client.chat.completions.create({ model: 'tiny', messages: msgs, temperature: 'hot' }); } catch (e) { err = e; }
    check('wrong type: BadRequestError naming the param', err instanceof BadRequestError && err.param === 'temperature', String(err));

    // /metrics: Prometheus text, every family present, counters that moved with the requests above
    const m = await request(srv.port, 'GET', '/metrics');
    const lines = m.body.split('\n').filter((l) => l && !l.startsWith('#'));
    check('/metrics: text format (name{labels} value)', m.status === 200 && /^text\/plain/.test(m.headers['content-type']) &&
      lines.every((l) => /^[a-z_:][a-z0-9_:]*(\{[^}]*\})? [-+0-9.eE]+$/.test(l)), lines.find((l) => !/^[a-z_]+(\{[^}]*\})? [-+0-9.eE]+$/.test(l)));
    const val = (name) => { const l = lines.find((x) => x.startsWith(name + ' ')); return l ? Number(l.split(' ')[1]) : NaN; };
    for (const f of ['pxq_prompt_tokens_total', 'pxq_generation_tokens_total', 'pxq_num_requests_running', 'pxq_num_requests_waiting',
      'pxq_kv_blocks_used', 'pxq_kv_blocks_free', 'pxq_time_to_first_token_seconds_count', 'pxq_inter_token_latency_seconds_count'])
      check('/metrics: ' + f, Number.isFinite(val(f)), m.body.slice(0, 200));
    check('/metrics: tokens out >= those counted by the usage objects above', val('pxq_generation_tokens_total') >=
      c.usage.completion_tokens + chat.usage.completion_tokens + usage.completion_tokens);
    check('/metrics: one TTFT per finished request, ITL per later token', val('pxq_time_to_first_token_seconds_count') >= 9 &&
      val('pxq_inter_token_latency_seconds_count') === val('pxq_generation_tokens_total') - val('pxq_time_to_first_token_seconds_count'));
    check('/metrics: idle server holds no KV', val('pxq_kv_blocks_used') === 0 && val('pxq_num_requests_running') === 0);
  } catch (e) {
    check('no unexpected exception', false, e.stack);
  }
  const { code } = await srv.stop();
  check('SIGTERM: exit 0', code === 0, code);
  finish();
})();
