// sigterm.js - SIGTERM with requests in flight: (1) with the default grace period the streams run to
// their end; (2) with --shutdown-timeout 0.5 long streams are ended cleanly (finish chunk, usage,
// [DONE]) and a waiting non-streamed request gets its answer; (3) a second SIGTERM while draining changes
// nothing. Every server exits 0.
'use strict';
const { startServer, post, stream, check, finish } = require('./common');

const body = (max_tokens, extra = {}) => ({ prompt: 'Once upon a time', max_tokens, ignore_eos: true, temperature: 0, stream: true,
  stream_options: { include_usage: true }, ...extra });

function intact(s) {
  const usage = s.events.length && s.events[s.events.length - 1].usage;
  const fin = s.events.filter((o) => o.choices.length && o.choices[0].finish_reason);
  return s.status === 200 && s.done && usage && fin.length === 1 ? { usage, reason: fin[0].choices[0].finish_reason } : null;
}

(async () => {
  try {
    // 1. streams finish
    const a = await startServer(['--max-model-len', '512']);
    let signalled = false;
    const onEvent = () => { if (!signalled) { signalled = true; a.proc.kill('SIGTERM'); } };
    const streams = await Promise.all([0, 1, 2, 3].map((i) => stream(a.port, '/v1/completions', body(48), i === 0 ? { onEvent } : {})));
    const ok = streams.map(intact);
    check('SIGTERM mid-stream: every stream completes all 48 tokens with [DONE]', ok.every((x) => x && x.usage.completion_tokens === 48 &&
      x.reason === 'length'), JSON.stringify(ok));
    const ea = await a.exited;
    check('exit status 0', ea.code === 0, JSON.stringify(ea));

    // 2. grace period over: long streams are ended cleanly
    const b = await startServer(['--max-model-len', '2048', '--shutdown-timeout', '0.5']);
    let sent = false, t_sig = 0;
    const onEvent2 = () => { if (!sent) { sent = true; t_sig = Date.now(); b.proc.kill('SIGTERM'); } };
    const waiting = post(b.port, '/v1/completions', { prompt: 'The sea', max_tokens: 2000, ignore_eos: true });
    const long = await Promise.all([0, 1, 2].map((i) => stream(b.port, '/v1/completions', body(2000), i === 0 ? { onEvent: onEvent2 } : {})));
    const okb = long.map(intact);
    check('grace period over: streams end with a finish chunk, usage and [DONE]', okb.every((x) => x && x.usage.completion_tokens < 2000),
      JSON.stringify(okb));
    check('... within a few seconds of SIGTERM', Date.now() - t_sig < 10000, Date.now() - t_sig);
    const w = await waiting.catch((e) => ({ status: String(e) }));
    check('a non-streamed request in flight still gets its answer', w.status === 200 && JSON.parse(w.body).choices[0].finish_reason === 'length',
      w.status);
    const late = await post(b.port, '/v1/completions', { prompt: 'x', max_tokens: 2 }).then((r) => r.status, (e) => e.code);
    check('after SIGTERM new requests are refused (' + late + ')', late === 503 || late === 'ECONNREFUSED' || late === 'ECONNRESET');
    const eb = await b.exited;
    check('exit status 0', eb.code === 0, JSON.stringify(eb));

    // 3. a second SIGTERM while draining (an impatient supervisor) is not fatal: the signal is blocked in
    // every thread, the engine's workers included, so it cannot take its default action in one of them
    const c = await startServer(['--max-model-len', '2048']);
    let twice = false;
    const onEvent3 = () => {
      if (twice) return;
      twice = true;
      c.proc.kill('SIGTERM');
      setTimeout(() => c.proc.kill('SIGTERM'), 200);
    };
    const drained = await Promise.all([0, 1].map((i) => stream(c.port, '/v1/completions', body(300), i === 0 ? { onEvent: onEvent3 } : {})));
    const okc = drained.map(intact); // all 300 tokens, or fewer if a slow (sanitizer) build outlives the grace period
    check('SIGTERM twice mid-stream: every stream ends with a finish chunk, usage and [DONE]', okc.every((x) => x && x.reason === 'length'),
      JSON.stringify(okc));
    const ec = await c.exited;
    check('exit status 0 after two SIGTERMs', ec.code === 0, JSON.stringify(ec));
  } catch (e) {
    check('no exception', false, e.stack);
  }
  finish();
})();
