// abuse.js - 1,000 malformed or hostile requests against pxq serve over raw sockets: truncated JSON,
// random bytes, invalid UTF-8, huge and out-of-range numbers, wrong types, deep nesting, 10 MB
// bodies, broken HTTP, wrong paths and methods, over-long prompts, slow clients, and clients that
// disconnect mid-upload, while waiting, and mid-stream. Each malformed request must get a 4xx (or,
// for broken HTTP, a closed connection); nothing may get a 5xx; the server must stay up, answer a
// normal request afterwards, have freed every sequence and KV block, and exit 0 on SIGTERM.
// Run it under AddressSanitizer with: PXQ=build-asan/pxq node tests/server/abuse.js
'use strict';
const net = require('net');
const { startServer, post, request, check, finish, metric } = require('./common');

const N_TOTAL = Number(process.env.ABUSE_N || 1000), CONCURRENCY = 24;

// Send raw bytes; resolve {status (number or null), closed} once the response head arrives, the
// server closes, or `timeout` ms pass (then status null, timedOut). opts.slowMs: delay per byte;
// opts.abortAfterBytes: destroy the socket after that many response bytes; opts.abortAfterMs:
// destroy after that long; opts.writeOnly: stop writing after that many request bytes.
function raw(port, bytes, opts = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let got = Buffer.alloc(0), done = false, status = null;
    const end = (why) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      sock.destroy();
      resolve({ status, why, head: got.slice(0, 200).toString('latin1') });
    };
    const timer = setTimeout(() => end('timeout'), opts.timeout || 20000);
    if (opts.abortAfterMs) setTimeout(() => end('aborted'), opts.abortAfterMs);
    sock.on('data', (d) => {
      got = Buffer.concat([got, d]);
      const m = got.toString('latin1').match(/^HTTP\/1\.[01] (\d{3})/);
      if (m) status = Number(m[1]);
      if (opts.abortAfterBytes !== undefined) {
        if (got.length >= opts.abortAfterBytes && got.includes('data: ')) end('aborted');
      } else if (got.includes('\r\n\r\n')) end('response');
    });
    sock.on('error', () => end('error'));
    sock.on('close', () => end('closed'));
    sock.on('connect', async () => {
      const b = opts.writeOnly !== undefined ? bytes.slice(0, opts.writeOnly) : bytes;
      if (opts.slowMs) {
        for (let i = 0; i < b.length && !done; i += 8) {
          sock.write(b.slice(i, i + 8));
          await new Promise((r) => setTimeout(r, opts.slowMs));
        }
      } else {
        sock.write(b);
      }
    });
  });
}

const httpReq = (method, path, body, headers = {}) => {
  const b = Buffer.isBuffer(body) ? body : Buffer.from(body === undefined ? '' : body, 'latin1');
  const h = { Host: 'x', 'Content-Type': 'application/json', Connection: 'close', ...headers };
  if (body !== undefined && !('Content-Length' in h) && !('Transfer-Encoding' in h)) h['Content-Length'] = b.length;
  let head = `${method} ${path} HTTP/1.1\r\n`;
  for (const [k, v] of Object.entries(h)) if (v !== null) head += `${k}: ${v}\r\n`;
  return Buffer.concat([Buffer.from(head + '\r\n', 'latin1'), b]);
};

// deterministic pseudo-random numbers
let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296);
const pick = (xs) => xs[Math.floor(rnd() * xs.length)];

const C = '/v1/completions', CH = '/v1/chat/completions';
const goodC = { model: 'tiny', prompt: 'Once upon a time', max_tokens: 8, temperature: 0.7, top_p: 0.9, stop: ['\n\n'], seed: 3 };
const goodCH = { model: 'tiny', messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 8, top_k: 20, stream: false };

function buildCases() {
  const cases = [];
  const add = (name, bytes, expect, opts) => cases.push({ name, bytes, expect, opts: opts || {} });
  const json = (path, obj, expect = '4xx', name) => add(name || 'json ' + JSON.stringify(obj).slice(0, 60), httpReq('POST', path, JSON.stringify(obj)), expect);

  // truncated JSON
  for (let i = 0; i < 200; i++) {
    const [path, o] = i % 2 ? [C, goodC] : [CH, goodCH];
    const s = JSON.stringify(o);
    add('truncated JSON', httpReq('POST', path, s.slice(0, 1 + Math.floor(rnd() * (s.length - 1)))), '4xx');
  }
  // random bytes as the body
  for (let i = 0; i < 80; i++) {
    const b = Buffer.alloc(1 + Math.floor(rnd() * 400));
    for (let j = 0; j < b.length; j++) b[j] = Math.floor(rnd() * 256);
    add('random body', httpReq('POST', pick([C, CH]), b), '4xx');
  }
  // invalid UTF-8 inside otherwise valid JSON, and bad \u escapes
  const badUtf8 = ['\xff', '\xc0\xaf', '\xe0\x80\xaf', '\xed\xa0\x80', '\xf4\x90\x80\x80', '\x80', '\xc3', '\xe2\x82', '\xf8\x88\x80\x80\x80'];
  for (let i = 0; i < 90; i++) {
    const bad = badUtf8[i % badUtf8.length];
    const body = i % 3 === 2 ? `{"model":"tiny","messages":[{"role":"user","content":"hi ${bad} there"}]}`
      : `{"prompt":"abc${bad}def","max_tokens":4}`;
    add('invalid UTF-8', httpReq('POST', i % 3 === 2 ? CH : C, Buffer.from(body, 'latin1')), '4xx');
  }
  for (const esc of ['\\ud800', '\\udc00', '\\ud800\\u0041', '\\uzzzz', '\\u12', '\\x41', '\\q', '\\u00g0', '\\u0000'])
    add('bad escape ' + esc, httpReq('POST', C, `{"prompt":"a${esc}b","max_tokens":4}`), '4xx');
  // huge and out-of-range numbers
  const numCases = [
    ['max_tokens', ['1e400', '1e308', '-1', '0', '1.5', '9007199254740993', '-1e400', '1e15']],
    ['max_completion_tokens', ['1e999', '0', '-5', '0.5']],
    ['temperature', ['1e308', '-0.5', '3', '1e400', '-1e-9']],
    ['top_p', ['0', '2', '-1', '1e300']],
    ['top_k', ['1e20', '-5', '2.5', '1e400']],
    ['min_p', ['-0.1', '1.5', '1e99']],
    ['seed', ['1e30', '-1e30', '0.5', '1e400', '18446744073709551615', '18446744073709551616', '9007199254740992']], // |seed| <= 2^53 - 1
    ['presence_penalty', ['3', '-2.5', '1e308']],
    ['frequency_penalty', ['2.01', '-1e308']],
    ['repetition_penalty', ['0', '-1', '5']],
    ['n', ['17', '0', '1e9', '-1']],
    ['logprobs', ['21', '-1', '1e9', '0.5']],
  ];
  for (let rep = 0; rep < 3; rep++)
    for (const [f, vals] of numCases)
      for (const v of vals) add(`${f}=${v}`, httpReq('POST', C, `{"prompt":"hi","${f}":${v}}`), '4xx');
  for (const v of ['21', '-1', '1e9']) add(`top_logprobs=${v}`, httpReq('POST', CH, `{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":${v}}`), '4xx');
  // wrong types
  const wrong = { s: '"str"', a: '[1,2]', o: '{"a":1}', b: 'true', n: '12', f: '1.5', e: '[]', eo: '{}' };
  const fieldsC = { model: 'sabnfeeo', prompt: 'obfeoe', max_tokens: 'saobf', max_completion_tokens: 'saob', temperature: 'saob',
    top_p: 'saob', top_k: 'saobf', min_p: 'saob', seed: 'saobf', stop: 'obnfo', stream: 'saonfeeo', stream_options: 'sabnf',
    logprobs: 'saobf', presence_penalty: 'saob', frequency_penalty: 'saob', n: 'saob', ignore_eos: 'saonf', echo: 'sanfo' };
  const keyOf = { s: 's', a: 'a', o: 'o', b: 'b', n: 'n', f: 'f', e: 'e' };
  for (const [f, kinds] of Object.entries(fieldsC))
    for (const k of new Set(kinds.split('').map((c) => keyOf[c]).filter(Boolean))) {
      const v = k === 'e' && kinds.includes('eo') ? wrong.e : wrong[k];
      const base = f === 'prompt' ? '{' : '{"prompt":"hi",';
      add(`completions ${f}=${v}`, httpReq('POST', C, `${base}"${f}":${v},"max_tokens":2}`), '4xx');
    }
  const msgCases = ['"hi"', '{}', '[]', '[1]', '["x"]', '[{"content":"x"}]', '[{"role":1,"content":"x"}]', '[{"role":"user","content":5}]',
    '[{"role":"user","content":[{"type":"image_url","image_url":"x"}]}]', '[{"role":"user","content":[1]}]', '[{"role":"user","content":{"a":1}}]',
    'null', 'true', '[{"role":["user"],"content":"x"}]', '[{"role":"robot","content":"x"}]', '[{"role":"user"}]',
    '[{"role":"user","content":[]}]', '[{"role":"user","content":null}]'];
  for (let rep = 0; rep < 3; rep++)
    for (const m of msgCases) add('messages ' + m, httpReq('POST', CH, `{"messages":${m},"max_tokens":2}`), '4xx');
  for (const [f, v] of [['logprobs', '"yes"'], ['logprobs', '3'], ['top_logprobs', '"3"'], ['stream_options', '[]'], ['model', '7'], ['stop', '[1]']])
    add(`chat ${f}=${v}`, httpReq('POST', CH, `{"messages":[{"role":"user","content":"x"}],"${f}":${v}}`), '4xx');
  for (const body of ['[]', '"str"', '42', 'null', 'true', '', ' ', '{}', '{"prompt":null}', '{"prompt":""}', '{"prompt":[]}',
    '{"prompt":[-1]}', '{"prompt":[99999999]}', '{"prompt":[1.5]}', '{"prompt":["a","b"]}', '{"prompt":[[1],[2]]}', '{"prompt":"x"} trailing'])
    for (let rep = 0; rep < 2; rep++) add('body ' + body, httpReq('POST', C, body), '4xx');
  // deep nesting
  for (let i = 0; i < 10; i++) {
    const d = 2000 * (i + 1);
    add('nesting ' + d, httpReq('POST', C, '{"prompt":' + '['.repeat(d) + ']'.repeat(d) + '}'), '4xx');
    add('nesting obj ' + d, httpReq('POST', CH, '{"x":' + '{"a":'.repeat(d) + '1' + '}'.repeat(d) + '}'), '4xx');
  }
  // 10 MB bodies
  const big = Buffer.from('{"prompt":"' + 'a'.repeat(10 * 1024 * 1024) + '"}');
  add('10 MB body', httpReq('POST', C, big), '4xx');
  add('10 MB body, chunked', httpReq('POST', C, Buffer.concat([Buffer.from(big.length.toString(16) + '\r\n'), big, Buffer.from('\r\n0\r\n\r\n')]),
    { 'Transfer-Encoding': 'chunked' }), '4xx');
  add('10 MB body, lying Content-Length', httpReq('POST', CH, big.slice(0, 1000), { 'Content-Length': String(big.length) }), '4xx-or-closed', { timeout: 5000 });
  // over-long requests (the server runs with --max-model-len 256)
  for (let i = 0; i < 10; i++) {
    json(C, { prompt: 'word '.repeat(300 + i), max_tokens: 4 }, '4xx', 'prompt beyond max-model-len');
    json(C, { prompt: 'hi', max_tokens: 256 + i }, '4xx', 'prompt + max_tokens beyond max-model-len');
    json(CH, { messages: [{ role: 'user', content: 'x' }], max_completion_tokens: 1000 + i }, '4xx', 'chat max_completion_tokens too big');
    json(C, { model: 'gpt-4o', prompt: 'hi' }, '4xx', 'unknown model');
  }
  // broken HTTP
  const brokenHttp = [
    'GARBAGE\r\n\r\n', 'GET\r\n\r\n', 'POST /v1/completions HTTP/9.9\r\nHost: x\r\n\r\n', 'POST /v1/completions\r\n\r\n',
    'POST /v1/completions HTTP/1.1\r\n\r\n{}', 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}',
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}',
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n{}',
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n',
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\n{}}\r\n0\r\n\r\n',
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n', 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nX: ' + 'a'.repeat(100000) + '\r\n\r\n',
    'POST /v1/completions HTTP/1.1\r\n' + 'H: v\r\n'.repeat(5000) + '\r\n', '\x00\x01\x02\x03\r\n\r\n', 'POST ' + '/a'.repeat(20000) + ' HTTP/1.1\r\nHost: x\r\n\r\n',
    'POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\nContent-Length: 2\r\n\r\n{}',
  ];
  for (let rep = 0; rep < 3; rep++) for (const b of brokenHttp) add('broken HTTP ' + JSON.stringify(b.slice(0, 40)), Buffer.from(b, 'latin1'), '4xx-or-closed', { timeout: 8000 });
  // wrong paths and methods
  for (const [m, p] of [['GET', C], ['PUT', C], ['DELETE', CH], ['POST', '/v1/nope'], ['GET', '/../../etc/passwd'], ['POST', '/v1/models'],
    ['GET', '/v1/models/other'], ['POST', '/health'], ['PATCH', '/metrics'], ['GET', '/v2/completions'], ['BREW', '/'], ['GET', '/v1/%00']])
    for (let rep = 0; rep < 3; rep++) add(`${m} ${p}`, httpReq(m, p, m === 'GET' ? undefined : '{}'), '4xx-or-closed');
  // clients that go away: mid-upload, while waiting for a non-streamed answer, mid-stream
  const longStream = (path) => httpReq('POST', path, JSON.stringify(path === C
    ? { prompt: 'Once upon a time', max_tokens: 200, ignore_eos: true, stream: true }
    : { messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 200, ignore_eos: true, stream: true }));
  for (let i = 0; i < 100; i++) add('disconnect mid-stream', longStream(i % 2 ? C : CH), 'any-non-5xx', { abortAfterBytes: 300 + (i % 7) * 200 });
  for (let i = 0; i < 20; i++)
    add('disconnect while waiting', httpReq('POST', C, JSON.stringify({ prompt: 'The sea', max_tokens: 200, ignore_eos: true })), 'any-non-5xx',
      { abortAfterMs: 50 + i * 10 });
  for (let i = 0; i < 20; i++) {
    const b = httpReq('POST', C, JSON.stringify({ prompt: 'x'.repeat(2000), max_tokens: 4 }));
    add('disconnect mid-upload', b, 'any-non-5xx', { writeOnly: 100 + i * 50, abortAfterMs: 200 });
  }
  // slow clients: a valid request trickled in (must be answered), and ones that stall half-way
  for (let i = 0; i < 6; i++) add('slow client, valid request', httpReq('POST', C, JSON.stringify({ prompt: 'Hello', max_tokens: 4 })), '200', { slowMs: 15 });
  for (let i = 0; i < 6; i++) add('slow client that stalls', httpReq('POST', C, JSON.stringify({ prompt: 'Hello', max_tokens: 4 })), 'any-non-5xx',
    { slowMs: 20, writeOnly: 60, abortAfterMs: 1500 });
  return cases;
}

function judge(c, r) {
  if (r.why === 'timeout' && c.expect !== 'any-non-5xx') return 'no answer within the timeout';
  // libmicrohttpd answers an unknown HTTP major version with 505 (RFC 9110 15.6.6) before the
  // server sees the request; that one case is allowed
  if (r.status === 505 && c.name.includes('HTTP/9.9')) return null;
  if (r.status !== null && r.status >= 500) return 'status ' + r.status;
  if (c.expect === '4xx' && !(r.status >= 400 && r.status < 500)) return `expected 4xx, got ${r.status} (${r.why}) ${JSON.stringify(r.head)}`;
  if (c.expect === '4xx-or-closed' && r.status !== null && !(r.status >= 400 && r.status < 500)) return `expected 4xx or close, got ${r.status}`;
  if (c.expect === '200' && r.status !== 200) return `expected 200, got ${r.status} (${r.why})`;
  return null;
}

(async () => {
  const srv = await startServer(['--served-model-name', 'tiny', '--max-model-len', '256', '--max-num-seqs', '16',
    '--connection-timeout', '3']);
  let cases = buildCases();
  // fill up to N_TOTAL with more truncations / random bodies, keeping every kind above
  while (cases.length < N_TOTAL) {
    const s = JSON.stringify(goodC);
    cases.push({ name: 'truncated JSON', bytes: httpReq('POST', C, s.slice(0, 1 + Math.floor(rnd() * (s.length - 1)))), expect: '4xx', opts: {} });
  }
  cases = cases.slice(0, Math.max(N_TOTAL, 0));
  const fails = [];
  let next = 0, counts = {};
  const t0 = Date.now();
  const worker = async () => {
    while (next < cases.length) {
      const c = cases[next++];
      const r = await raw(srv.port, c.bytes, c.opts);
      const why = judge(c, r);
      counts[c.expect] = (counts[c.expect] || 0) + 1;
      if (why) fails.push(`${c.name}: ${why}`);
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  const dt = ((Date.now() - t0) / 1000).toFixed(1);
  check(`${cases.length} hostile requests in ${dt} s (${JSON.stringify(counts)}): each got a 4xx or a closed connection`,
    fails.length === 0, fails.slice(0, 10).join('\n  '));
  check('server still running', srv.proc.exitCode === null && srv.proc.signalCode === null);
  try {
    const h = await request(srv.port, 'GET', '/health');
    check('/health answers 200 afterwards', h.status === 200);
    const r = await post(srv.port, C, { model: 'tiny', prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
    check('a normal completion works afterwards', r.status === 200 && JSON.parse(r.body).choices[0].text.length > 0, r.body);
    // a stop string longer than the output whose prefix is the whole output: every token is held back
    // as a possible start of it, and all of it must come out when max_tokens ends the request
    const text = JSON.parse(r.body).choices[0].text;
    const held = await post(srv.port, C, { model: 'tiny', prompt: 'Once upon a time', max_tokens: 8, temperature: 0,
      stop: [text + 'z'.repeat(100000), 'q'.repeat(1000000)] });
    check('stop strings longer than the output (1 MB): the held-back text is returned', held.status === 200 &&
      JSON.parse(held.body).choices[0].text === text, held.body.slice(0, 300));
    let running = -1, used = -1;
    for (let i = 0; i < 50; i++) { // cancelled sequences are dropped at the scheduler's next step
      running = await metric(srv.port, 'pxq_num_requests_running');
      used = await metric(srv.port, 'pxq_kv_blocks_used');
      if (running === 0 && used === 0) break;
      await new Promise((res) => setTimeout(res, 100));
    }
    check('disconnected clients: no sequence left running and every KV block free', running === 0 && used === 0, `running ${running}, used ${used}`);
    const aborted = await metric(srv.port, 'pxq_request_success_total{finished_reason="abort"}');
    check(`disconnected clients were cancelled (${aborted})`, aborted >= 50);
  } catch (e) {
    check('no exception', false, e.stack);
  }
  const { code } = await srv.stop();
  check('SIGTERM: exit 0', code === 0, code);
  const log = srv.log();
  check('no sanitizer report in the server log', !/AddressSanitizer|LeakSanitizer|runtime error:/.test(log),
    log.split('\n').filter((l) => /Sanitizer|runtime error/.test(l)).slice(0, 5).join('\n'));
  finish();
})();
