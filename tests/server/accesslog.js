// accesslog.js - pxq serve's access log (one stderr line per HTTP request, src/server/http.c
// access_log, docs/SERVER.md) parsed field by field: a completion, a streamed chat completion, a
// 400, a 404, /health and a request whose client leaves; then the SIGTERM drain's closing count.
'use strict';
const { startServer, request, post, stream, check, finish } = require('./common');

const FIELDS = ['id', 'method', 'route', 'status', 'prompt_tokens', 'completion_tokens', 'ttft_ms', 'tok_s', 'e2e_ms', 'finish'];

// Every access line of the log, as {field: value}; null for a line that is not in the stable form.
function accessLines(log) {
  return log.split('\n').filter((l) => l.startsWith('pxq serve: access ')).map((l) => {
    const kv = l.slice('pxq serve: access '.length).split(' ').map((w) => w.split('='));
    if (kv.length !== FIELDS.length || kv.some(([k, v], i) => k !== FIELDS[i] || v === undefined || v === '')) return null;
    return Object.fromEntries(kv);
  });
}

const num = (v) => v !== '-' && Number.isFinite(+v);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

(async () => {
  try {
    const s = await startServer(['--max-model-len', '256']);
    const a = await post(s.port, '/v1/completions', { prompt: 'Once upon a time', max_tokens: 12, ignore_eos: true, temperature: 0 });
    const ja = JSON.parse(a.body);
    const b = await stream(s.port, '/v1/chat/completions', { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 1,
      ignore_eos: true, stream: true, stream_options: { include_usage: true } });
    const usageB = b.events[b.events.length - 1].usage;
    const c = await post(s.port, '/v1/completions', { prompt: 'x', max_tokens: -1 });
    const d = await request(s.port, 'GET', '/no/such"path');
    const e = await request(s.port, 'GET', '/health');
    // a client that leaves mid-stream
    const http = require('http');
    await new Promise((resolve) => {
      const body = JSON.stringify({ prompt: 'The sea', max_tokens: 200, ignore_eos: true, stream: true });
      const req = http.request({ host: '127.0.0.1', port: s.port, method: 'POST', path: '/v1/completions', agent: false,
        headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) } }, (res) => {
        res.once('data', () => { req.destroy(); resolve(); });
      });
      req.on('error', () => resolve());
      req.end(body);
    });
    await sleep(500);
    s.proc.kill('SIGTERM');
    const ex = await s.exited;
    check('exit status 0', ex.code === 0, JSON.stringify(ex));

    const lines = accessLines(s.log());
    check('every access line has the stable form (' + lines.length + ' lines)', lines.length === 6 && lines.every((l) => l),
      s.log().split('\n').filter((l) => l.includes('access')).join('\n'));
    const find = (route, status) => lines.find((l) => l && l.route === route && l.status === String(status));
    const l1 = find('/v1/completions', 200);
    check('completion: id, route, status, tokens as in the response', l1 && l1.id === ja.id && l1.method === 'POST' &&
      +l1.prompt_tokens === ja.usage.prompt_tokens && +l1.completion_tokens === 12 && l1.finish === 'length', JSON.stringify(l1));
    check('completion: ttft_ms, tok_s and e2e_ms are numbers, ttft <= e2e', l1 && num(l1.ttft_ms) && num(l1.tok_s) && +l1.tok_s > 0 &&
      num(l1.e2e_ms) && +l1.ttft_ms <= +l1.e2e_ms, JSON.stringify(l1));
    const l2 = find('/v1/chat/completions', 200);
    check('streamed chat: its id, 1 token: ttft a number, tok_s "-"', l2 && l2.id.startsWith('chatcmpl-') &&
      +l2.prompt_tokens === usageB.prompt_tokens && l2.completion_tokens === '1' && num(l2.ttft_ms) && l2.tok_s === '-',
      JSON.stringify(l2));
    const l3 = find('/v1/completions', 400);
    check('a 400: no id, tokens "-"', c.status === 400 && l3 && l3.id === '-' && l3.prompt_tokens === '-' && l3.ttft_ms === '-' &&
      l3.finish === '-', JSON.stringify(l3));
    const l4 = lines.find((l) => l && l.status === '404');
    check('a 404: the path logged without its quote or spaces', d.status === 404 && l4 && l4.route === '/no/such?path' && l4.method === 'GET',
      JSON.stringify(l4));
    const l5 = find('/health', 200);
    check('/health is logged', e.status === 200 && l5 && l5.id === '-', JSON.stringify(l5));
    const l6 = lines.find((l) => l && l.finish === 'abort');
    check('a client that left: finish=abort, fewer tokens than asked', l6 && +l6.completion_tokens < 200, JSON.stringify(l6));
    check('the lines come in the order the requests ended', lines[0] === l1 && lines[4] === l5, JSON.stringify(lines[0]));

    // the drain says how many requests it finished
    const t = await startServer(['--max-model-len', '512']);
    let sent = false;
    const onEvent = () => { if (!sent) { sent = true; t.proc.kill('SIGTERM'); } };
    await Promise.all([0, 1, 2].map((i) => stream(t.port, '/v1/completions', { prompt: 'Once', max_tokens: 32, ignore_eos: true,
      stream: true }, i === 0 ? { onEvent } : {})));
    const et = await t.exited;
    const m = t.log().match(/pxq serve: stopped: (\d+) request\(s\) finished while draining, (\d+) cut short/);
    check('SIGTERM: "stopped: 3 request(s) finished while draining, 0 cut short"', et.code === 0 && m && m[1] === '3' && m[2] === '0',
      t.log().split('\n').slice(-4).join('\n'));
  } catch (e) {
    check('no exception', false, e.stack);
  }
  finish();
})();
