// spec.js - speculative decoding in the server changes no greedy output: 8 requests of different
// prompt lengths sent concurrently to a server with --spec ngram (and one with --spec draft) return
// exactly the text the same request returns from a plain server, with the drafts verified beside the
// other sequences' decodes and chunked prefills (--max-num-batched-tokens 48); the acceptance
// counters move in /metrics. Models: the bundled tiny-qwen3 Q4_K_M (attention: rollback by block
// table) and tiny-qwen35 (Gated DeltaNet: checkpoint and re-evaluation), each against itself plain;
// and tiny-qwen35 with an untrained MTP head (tools/make_untrained_mtp.py) under --spec mtp, whose
// head follows the chunked prefill (the drafts are rarely accepted: the check is the equality and
// that drafts were verified).
'use strict';
const { execFileSync } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');
const { ROOT, startServer, post, check, finish, corpusPrompts, metric } = require('./common');

const N = 8, MAX_TOKENS = 32;

async function complete(port, prompt) {
  const r = await post(port, '/v1/completions', { prompt, max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${r.body}`);
  return JSON.parse(r.body).choices[0].text;
}

async function texts(args, prompts) {
  const s = await startServer(args);
  try {
    const out = await Promise.all(prompts.map((p) => complete(s.port, p)));
    const m = { drafts: await metric(s.port, 'pxq_spec_decode_num_draft_tokens_total'),
      accepted: await metric(s.port, 'pxq_spec_decode_num_accepted_tokens_total'),
      passes: await metric(s.port, 'pxq_spec_decode_num_passes_total') };
    return { out, m, code: (await s.stop()).code };
  } catch (e) {
    await s.stop();
    throw e;
  }
}

(async () => {
  // prompts that repeat themselves, so that prompt lookup finds drafts
  const prompts = corpusPrompts(N, 3, 60).map((p) => p + ' ' + p);
  const common = ['--max-model-len', '512', '--max-num-seqs', '8', '--max-num-batched-tokens', '48'];
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pxq-mtp-'));
  const mtp = path.join(tmp, 'mtp');
  execFileSync('python3', [path.join(ROOT, 'tools/make_untrained_mtp.py'), path.join(ROOT, 'tests/data/qwen35/tiny-qwen35'), mtp]);
  const plains = new Map(); // the plain server's run, once per model (Q4_K_M serves two drafters)
  for (const [name, model, spec, needAccepted = true] of [
    ['tiny-qwen35 + untrained MTP head, mtp', ['-m', mtp], ['--spec', 'mtp', '--spec-k', '2'], false],
    ['tiny-qwen3 Q4_K_M, ngram', [], ['--spec', 'ngram', '--spec-k', '4']],
    ['tiny-qwen3 Q4_K_M, draft tiny-qwen3', [], ['--spec', 'draft', '--model-draft', 'tests/data/tiny-qwen3', '--spec-k', '3']],
    ['tiny-qwen35, ngram', ['-m', 'tests/data/qwen35/tiny-qwen35'], ['--spec', 'ngram', '--spec-k', '3']],
  ]) {
    try {
      const key = model.join(' ');
      if (!plains.has(key)) plains.set(key, await texts([...common, ...model], prompts));
      const plain = plains.get(key);
      const sp = await texts([...common, ...model, ...spec], prompts);
      const diff = sp.out.map((t, i) => (t === plain.out[i] ? -1 : i)).filter((i) => i >= 0);
      check(`${name}: 8 concurrent speculative == plain (greedy text)`, diff.length === 0,
        diff.map((i) => `#${i}: ${JSON.stringify(plain.out[i])} vs ${JSON.stringify(sp.out[i])}`).join('; '));
      check(`${name}: drafts proposed and accepted (${sp.m.accepted} of ${sp.m.drafts} in ${sp.m.passes} passes)`,
        sp.m.drafts > 0 && (sp.m.accepted > 0 || !needAccepted) && sp.m.passes > 0);
      check(`${name}: the plain server reports no speculation`, plain.m.drafts === 0);
      check(`${name}: both servers exit 0 on SIGTERM`, plain.code === 0 && sp.code === 0);
    } catch (e) {
      check(`${name}: no exception`, false, e.stack);
    }
  }
  fs.rmSync(tmp, { recursive: true, force: true });
  finish();
})();
