// cdp.js - headless Chromium driven over the Chrome DevTools Protocol, with no npm package: Debian
// 12's Node.js 18 has no WebSocket client, so a minimal one (RFC 6455: masked text frames out,
// fragmented frames, ping and close in) is written here over node's http upgrade.
//   const b = await launch();            // chromium --headless=new --remote-debugging-port=0
//   const page = await b.newPage();      // a tab, attached as a flat session
//   await page.goto(url); await page.eval('document.title'); await b.close();
'use strict';
const { spawn, spawnSync } = require('child_process');
const crypto = require('crypto');
const fs = require('fs');
const http = require('http');
const os = require('os');
const path = require('path');

// The browser binary: $CHROMIUM, else the first of Debian's and others' names on PATH; null if none.
function findChromium() {
  const names = process.env.CHROMIUM ? [process.env.CHROMIUM] : ['chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable'];
  for (const n of names) {
    if (n.includes('/')) { if (fs.existsSync(n)) return n; continue; }
    const r = spawnSync('sh', ['-c', 'command -v "$0"', n], { encoding: 'utf8' });
    if (r.status === 0 && r.stdout.trim()) return r.stdout.trim();
  }
  return null;
}

// A WebSocket client connection to ws://host:port/path. Resolves {send(text), close(), onmessage}.
function wsConnect(url) {
  const u = new URL(url);
  const key = crypto.randomBytes(16).toString('base64');
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, path: u.pathname + u.search, agent: false,
      headers: { Connection: 'Upgrade', Upgrade: 'websocket', 'Sec-WebSocket-Version': '13', 'Sec-WebSocket-Key': key } });
    req.on('response', (res) => reject(new Error(`WebSocket upgrade refused: HTTP ${res.statusCode}`)));
    req.on('error', reject);
    req.on('upgrade', (res, sock, head) => {
      const want = crypto.createHash('sha1').update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
      if (res.headers['sec-websocket-accept'] !== want) { sock.destroy(); reject(new Error('bad Sec-WebSocket-Accept')); return; }
      sock.setNoDelay(true);
      const ws = { onmessage: () => {}, onclose: () => {} };
      const frame = (op, payload) => { // client frames are masked (RFC 6455 5.3)
        const n = payload.length, mask = crypto.randomBytes(4);
        let h;
        if (n < 126) h = Buffer.from([0x80 | op, 0x80 | n]);
        else if (n < 65536) { h = Buffer.from([0x80 | op, 0x80 | 126, 0, 0]); h.writeUInt16BE(n, 2); }
        else { h = Buffer.alloc(10); h[0] = 0x80 | op; h[1] = 0x80 | 127; h.writeBigUInt64BE(BigInt(n), 2); }
        const body = Buffer.from(payload);
        for (let i = 0; i < n; i++) body[i] ^= mask[i & 3];
        sock.write(Buffer.concat([h, mask, body]));
      };
      ws.send = (text) => frame(1, Buffer.from(text, 'utf8'));
      ws.close = () => { try { frame(8, Buffer.alloc(0)); } catch (_) {} sock.end(); };
      let buf = head && head.length ? Buffer.from(head) : Buffer.alloc(0), parts = [];
      sock.on('data', (d) => {
        buf = Buffer.concat([buf, d]);
        for (;;) {
          if (buf.length < 2) return;
          const fin = buf[0] & 0x80, op = buf[0] & 0x0f, masked = buf[1] & 0x80;
          let n = buf[1] & 0x7f, off = 2;
          if (n === 126) { if (buf.length < 4) return; n = buf.readUInt16BE(2); off = 4; }
          else if (n === 127) { if (buf.length < 10) return; n = Number(buf.readBigUInt64BE(2)); off = 10; }
          const moff = off;
          if (masked) off += 4;
          if (buf.length < off + n) return;
          const payload = Buffer.from(buf.subarray(off, off + n));
          if (masked) for (let i = 0; i < n; i++) payload[i] ^= buf[moff + (i & 3)];
          buf = buf.subarray(off + n);
          if (op === 8) { sock.end(); return; }
          if (op === 9) { frame(10, payload); continue; }
          if (op === 10) continue;
          parts.push(payload);
          if (fin) { const msg = Buffer.concat(parts).toString('utf8'); parts = []; ws.onmessage(msg); }
        }
      });
      sock.on('close', () => ws.onclose());
      sock.on('error', () => {});
      resolve(ws);
    });
    req.end();
  });
}

// Start Chromium headless on a fresh profile; resolves {newPage(), close(), log()}.
async function launch({ binary = findChromium(), timeoutMs = 30000 } = {}) {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'pxq-chromium-'));
  // --no-sandbox: CI containers and root shells have no user namespaces for Chromium's sandbox; the
  // browser loads only the test server's page.
  const args = ['--headless=new', '--remote-debugging-port=0', '--user-data-dir=' + profile, '--no-sandbox', '--no-first-run',
    '--no-default-browser-check', '--disable-gpu', '--disable-dev-shm-usage', '--disable-extensions', '--disable-sync',
    '--disable-background-networking', '--disable-component-update', '--disable-default-apps', '--mute-audio',
    '--password-store=basic', '--use-mock-keychain', 'about:blank'];
  const proc = spawn(binary, args, { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
  const killAll = () => { try { process.kill(-proc.pid, 'SIGKILL'); } catch (_) {} };
  process.on('exit', () => { killAll(); fs.rmSync(profile, { recursive: true, force: true }); });
  let log = '';
  const exited = new Promise((r) => proc.on('exit', r));
  const wsUrl = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('Chromium did not start:\n' + log)), timeoutMs);
    proc.on('error', (e) => { clearTimeout(t); reject(e); });
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/DevTools listening on (ws:\/\/\S+)/);
      if (m) { clearTimeout(t); resolve(m[1]); }
    });
    exited.then(() => { clearTimeout(t); reject(new Error('Chromium exited:\n' + log)); });
  });
  const ws = await wsConnect(wsUrl);
  let nextId = 1;
  const pending = new Map(), listeners = new Set();
  ws.onmessage = (text) => {
    const m = JSON.parse(text);
    if (m.id !== undefined) {
      const p = pending.get(m.id);
      if (!p) return;
      pending.delete(m.id);
      if (m.error) p.reject(new Error(`${p.method}: ${m.error.message}`));
      else p.resolve(m.result);
    } else {
      for (const l of listeners) l(m.method, m.params, m.sessionId);
    }
  };
  ws.onclose = () => { for (const p of pending.values()) p.reject(new Error('DevTools connection closed')); pending.clear(); };
  const send = (method, params = {}, sessionId) => new Promise((resolve, reject) => {
    const id = nextId++;
    pending.set(id, { resolve, reject, method });
    ws.send(JSON.stringify(sessionId ? { id, method, params, sessionId } : { id, method, params }));
  });

  async function newPage() {
    const { targetId } = await send('Target.createTarget', { url: 'about:blank' });
    const { sessionId } = await send('Target.attachToTarget', { targetId, flatten: true });
    const cmd = (method, params) => send(method, params, sessionId);
    const page = { events: [], cmd };
    listeners.add((method, params, sid) => { if (sid === sessionId) page.events.push({ method, params }); });
    await cmd('Page.enable');
    await cmd('Runtime.enable');
    await cmd('Log.enable');
    await cmd('Network.enable');

    // The value of a JS expression (awaited); throws with the page's exception text.
    page.eval = async (expression) => {
      const r = await cmd('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true });
      if (r.exceptionDetails) throw new Error('in the page: ' + (r.exceptionDetails.exception && r.exceptionDetails.exception.description
        || r.exceptionDetails.text));
      return r.result.value;
    };
    // Poll a JS expression until it is truthy; resolves its value, rejects after ms.
    page.waitFor = async (expression, ms = 10000, what = expression) => {
      const t0 = Date.now();
      for (let polls = 1; ; polls++) {
        const v = await page.eval(expression);
        if (v) return v;
        if (Date.now() - t0 > ms) throw new Error(`timed out after ${ms} ms (${polls} polls) waiting for ${what}`);
        await new Promise((r) => setTimeout(r, 25));
      }
    };
    page.goto = async (url) => {
      const loaded = new Promise((resolve) => {
        const l = (method, _p, sid) => { if (sid === sessionId && method === 'Page.loadEventFired') { listeners.delete(l); resolve(); } };
        listeners.add(l);
      });
      const r = await cmd('Page.navigate', { url });
      if (r.errorText) throw new Error(`navigating to ${url}: ${r.errorText}`);
      await loaded;
    };
    // A real click (mouse pressed and released) at the centre of the element matching selector.
    page.click = async (selector) => {
      const box = await page.eval(`(() => { const e = document.querySelector(${JSON.stringify(selector)}); if (!e) return null;
        e.scrollIntoView({ block: 'center' }); const r = e.getBoundingClientRect(); return { x: r.x + r.width / 2, y: r.y + r.height / 2 }; })()`);
      if (!box) throw new Error('no element ' + selector);
      for (const type of ['mousePressed', 'mouseReleased'])
        await cmd('Input.dispatchMouseEvent', { type, x: box.x, y: box.y, button: 'left', clickCount: 1 });
    };
    // Typed text goes to the focused element, as an IME commit would (input events, no key events).
    page.type = (text) => cmd('Input.insertText', { text });
    page.press = async (key) => {
      const keys = { Enter: { code: 'Enter', windowsVirtualKeyCode: 13, text: '\r' }, Tab: { code: 'Tab', windowsVirtualKeyCode: 9 } };
      const k = keys[key];
      await cmd('Input.dispatchKeyEvent', { type: 'keyDown', key, ...k });
      await cmd('Input.dispatchKeyEvent', { type: 'keyUp', key, code: k.code, windowsVirtualKeyCode: k.windowsVirtualKeyCode });
    };
    return page;
  }

  async function close() {
    try { await Promise.race([send('Browser.close'), new Promise((r) => setTimeout(r, 2000))]); } catch (_) {}
    await Promise.race([exited, new Promise((r) => setTimeout(r, 3000))]);
    killAll();
    ws.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }

  return { newPage, close, log: () => log };
}

module.exports = { findChromium, launch, wsConnect };
