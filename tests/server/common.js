// common.js - helpers for the pxq serve tests: start a server on a free port, plain HTTP and SSE
// clients (node's http module, no dependencies), percentiles, a tiny assertion counter.
'use strict';
const { spawn } = require('child_process');
const http = require('http');
const path = require('path');
const fs = require('fs');

const ROOT = path.resolve(__dirname, '..', '..');
const PXQ = path.resolve(ROOT, process.env.PXQ || path.join(process.env.BUILD || 'build', 'pxq'));
const live = new Set();

process.on('exit', () => { for (const p of live) try { p.kill('SIGKILL'); } catch (_) {} });
for (const s of ['SIGINT', 'SIGTERM']) process.on(s, () => process.exit(1));

// Start `pxq serve --port 0 ...args`; resolves when it prints its port. stop() sends SIGTERM and
// resolves with {code, signal}; the process is SIGKILLed if it outlives the test. opts.nice: run it
// under `nice -n N` (nice execs pxq: the pid and signals are pxq's).
function startServer(args = [], env = {}, opts = {}) {
  const argv = ['serve', '--port', '0', '-t', process.env.PXQ_THREADS || '2', ...args];
  const proc = spawn(opts.nice ? 'nice' : PXQ, opts.nice ? ['-n', String(opts.nice), PXQ, ...argv] : argv, {
    cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, ...env },
  });
  live.add(proc);
  let log = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => { live.delete(proc); resolve({ code, signal }); }));
  proc.stderr.on('data', (d) => { log += d; });
  proc.on('error', (e) => { log += `cannot run ${PXQ}: ${e.message}\n`; });
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('pxq serve did not start:\n' + log)), 60000);
    const onData = () => {
      const m = log.match(/listening on http:\/\/[^\s]+:(\d+)/);
      if (!m) return;
      clearTimeout(t);
      proc.stderr.off('data', onData);
      const port = +m[1];
      resolve({
        proc, port, base: `http://127.0.0.1:${port}`, log: () => log, exited,
        stop: async (sig = 'SIGTERM') => { proc.kill(sig); return exited; },
      });
    };
    proc.stderr.on('data', onData);
    exited.then(({ code, signal }) => { clearTimeout(t); reject(new Error(`pxq serve exited (${code}, ${signal}):\n${log}`)); });
    proc.on('error', (e) => { clearTimeout(t); reject(new Error(`cannot run ${PXQ}: ${e.message}`)); });
  });
}

// One request; resolves {status, headers, body} (body as a string). Network errors reject.
function request(port, method, urlPath, body, headers = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    const req = http.request({ host: '127.0.0.1', port, method, path: urlPath, agent: false,
      headers: { ...(data ? { 'Content-Type': 'application/json', 'Content-Length': data.length } : {}), ...headers } }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    if (data) req.write(data);
    req.end();
  });
}

const post = (port, p, body, headers) => request(port, 'POST', p, body, headers);

// A streaming request. Resolves {status, events (parsed JSON objects), done (saw [DONE]), raw,
// ttft (ms from send to the first event with text), t_end}.
function stream(port, urlPath, body, { onEvent } = {}) {
  return new Promise((resolve, reject) => {
    const data = Buffer.from(JSON.stringify(body));
    const t0 = process.hrtime.bigint();
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: urlPath, agent: false,
      headers: { 'Content-Type': 'application/json', 'Content-Length': data.length } }, (res) => {
      let buf = '', raw = '', ttft = null, done = false, afterDone = false;
      const events = [];
      res.setEncoding('utf8');
      res.on('data', (c) => {
        raw += c;
        buf += c;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (!ev.startsWith('data: ')) throw new Error('bad SSE event: ' + JSON.stringify(ev));
          const payload = ev.slice(6);
          if (done) afterDone = true;
          if (payload === '[DONE]') { done = true; continue; }
          const o = JSON.parse(payload);
          const ch = o.choices && o.choices[0];
          const text = ch ? (ch.text !== undefined ? ch.text : ch.delta && ch.delta.content) : '';
          if (ttft === null && text) ttft = Number(process.hrtime.bigint() - t0) / 1e6;
          events.push(o);
          if (onEvent) onEvent(o, req);
        }
      });
      res.on('end', () => resolve({ status: res.statusCode, events, done: done && !afterDone && buf === '', raw, ttft,
        t_end: Number(process.hrtime.bigint() - t0) / 1e6 }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.write(data);
    req.end();
  });
}

// Text of a stream's events (completions: choices[0].text, chat: choices[0].delta.content).
function streamText(events) {
  let s = '';
  for (const o of events) {
    const ch = o.choices && o.choices[0];
    if (!ch) continue;
    if (ch.text !== undefined) s += ch.text;
    else if (ch.delta && ch.delta.content) s += ch.delta.content;
  }
  return s;
}

function percentile(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  if (!s.length) return NaN;
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

let failures = 0;
function check(name, ok, detail) {
  if (ok) console.log('ok   ' + name);
  else { failures++; console.log('FAIL ' + name + (detail !== undefined ? ': ' + detail : '')); }
}
function finish() {
  console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
  process.exit(failures ? 1 : 0);
}

// Prompts of different lengths from the test corpus.
function corpusPrompts(n, minWords = 1, maxWords = 300) {
  const words = fs.readFileSync(path.join(ROOT, 'tests/data/frankenstein.txt'), 'utf8').split(/\s+/).filter(Boolean);
  const out = [];
  for (let i = 0; i < n; i++) {
    const len = Math.round(minWords + ((maxWords - minWords) * i) / Math.max(1, n - 1));
    const start = (i * 977) % (words.length - len - 1);
    out.push(words.slice(start, start + len).join(' '));
  }
  return out;
}

async function metric(port, name) {
  const r = await request(port, 'GET', '/metrics');
  const m = r.body.match(new RegExp('^' + name.replace(/[{}"]/g, (c) => '\\' + c) + ' (\\S+)$', 'm'));
  return m ? Number(m[1]) : NaN;
}

// Poll a metric until it equals `want` or `ms` pass; resolves the last value. The scheduler publishes
// its gauges at the end of a step, which can come just after a client has its answer.
async function metricSettles(port, name, want, ms = 5000) {
  const t0 = Date.now();
  let v = await metric(port, name);
  while (v !== want && Date.now() - t0 < ms) {
    await new Promise((r) => setTimeout(r, 50));
    v = await metric(port, name);
  }
  return v;
}

module.exports = { ROOT, PXQ, startServer, request, post, stream, streamText, percentile, check, finish, corpusPrompts, metric, metricSettles };
