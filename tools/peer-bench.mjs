#!/usr/bin/env node
// peer-bench.mjs - llama.cpp's prefill and decode on a GGUF, timed as llama-bench times them, through
// node-llama-cpp's native context (the prebuilt CPU binaries of node-llama-cpp@3.21.1).
//
// Usage (tools/peer-bench.sh installs the package and runs this beside `pxq bench`):
//   UV_THREADPOOL_SIZE=1 node tools/peer-bench.mjs --peer-dir DIR \
//       -m MODEL.gguf -p 512 -n 128 -t 2 [-r 1] [--fa auto|on|off]
// DIR holds node_modules/node-llama-cpp (`npm install --prefix DIR node-llama-cpp@3.21.1`).
// prints one JSON line: {"engine":"llama.cpp", "model", "threads", "pp":[t/s...], "tg":[t/s...], ...}
//
// What is timed (llama-bench's pp / tg tests):
//   ppP: the cache emptied, then one batch of P random token ids at positions 0..P-1, logits for the
//        last one; t/s = P / time of the decode call.
//   tgN: the cache emptied, then N single-token batches at positions 0..N-1, each asking for its
//        logits; t/s = N / time of the N calls. The token fed is a fixed random id: no sampling and no
//        JavaScript generator in the loop, only initBatch / addToBatch / decodeBatch of the addon.
// One untimed warm-up of each test comes first. decodeBatch runs on libuv's thread pool: with its
// default 4 threads on 2 cores each 2-thread decode step stalled by about 11 ms, so the caller must
// set UV_THREADPOOL_SIZE=1 (checked below).
import { join } from "node:path";
import { pathToFileURL } from "node:url";

function parseArgs(argv) {
    const o = { dir: null, model: null, p: 512, n: 128, t: 2, r: 1, fa: "auto", seed: 1 };
    for (let i = 2; i < argv.length; i++) {
        const f = argv[i], v = argv[i + 1];
        if (f === "--peer-dir") o.dir = v;
        else if (f === "-m") o.model = v;
        else if (f === "-p") o.p = +v;
        else if (f === "-n") o.n = +v;
        else if (f === "-t") o.t = +v;
        else if (f === "-r") o.r = +v;
        else if (f === "--fa") o.fa = v;
        else if (f === "--seed") o.seed = +v;
        else throw new Error(`unknown option ${f}`);
        i++;
    }
    if (!o.model || !o.dir) throw new Error("usage: peer-bench.mjs --peer-dir DIR -m MODEL.gguf [-p 512] [-n 128] [-t 2] [-r 1] [--fa auto|on|off]");
    return o;
}

function rng(seed) { // xorshift32: the same ids on every run
    let s = seed >>> 0 || 1;
    return () => { s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0; return s; };
}

async function main() {
    const o = parseArgs(process.argv);
    if (process.env.UV_THREADPOOL_SIZE !== "1") throw new Error("set UV_THREADPOOL_SIZE=1 (see the header)");
    const { getLlama, LlamaLogLevel } = await import(pathToFileURL(join(o.dir, "node_modules/node-llama-cpp/dist/index.js")).href);
    const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
    const model = await llama.loadModel({ modelPath: o.model, gpuLayers: 0 });
    const fa = o.fa === "auto" ? "auto" : o.fa === "on";
    const context = await model.createContext({
        contextSize: Math.max(o.p, o.n) + 64, batchSize: Math.max(o.p, 1), sequences: 1, threads: o.t, flashAttention: fa,
    });
    const ctx = context._ctx; // the addon's context: no batching dispatcher, no sampler
    ctx.setThreads(o.t);
    const nVocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length ?? 32000;
    const next = rng(o.seed);
    const ids = n => Uint32Array.from({ length: n }, () => next() % nVocab);
    const clear = () => ctx.removeTokenCellsFromSequence(0, 0, -1);

    async function pp(tokens) {
        clear();
        ctx.initBatch(tokens.length);
        ctx.addToBatch(0, 0, tokens, Uint32Array.of(tokens.length - 1));
        const t0 = process.hrtime.bigint();
        await ctx.decodeBatch();
        return Number(process.hrtime.bigint() - t0) / 1e9;
    }
    async function tg(n, tok) {
        clear();
        const one = Uint32Array.of(tok), logit = Uint32Array.of(0);
        const t0 = process.hrtime.bigint();
        for (let i = 0; i < n; i++) {
            ctx.initBatch(1);
            ctx.addToBatch(0, i, one, logit);
            await ctx.decodeBatch();
        }
        return Number(process.hrtime.bigint() - t0) / 1e9;
    }

    const out = { engine: "llama.cpp", via: "node-llama-cpp@3.21.1", model: o.model, threads: ctx.getThreads(),
                  flash_attention: o.fa, p: o.p, n: o.n, pp: [], tg: [] };
    const prompt = ids(Math.max(o.p, 1)), tok = ids(1)[0];
    if (o.p > 0) {
        await pp(prompt); // warm-up
        for (let r = 0; r < o.r; r++) out.pp.push(o.p / await pp(prompt));
    }
    if (o.n > 0) {
        await tg(o.n, tok); // warm-up
        for (let r = 0; r < o.r; r++) out.tg.push(o.n / await tg(o.n, tok));
    }
    console.log(JSON.stringify(out));
    await context.dispose();
    await model.dispose();
    await llama.dispose();
}

main().catch(e => { console.error(`peer-bench: ${e.message}`); process.exit(1); });
