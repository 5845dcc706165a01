#!/bin/sh
# peer-bench.sh - PXQ's CPU backend beside llama.cpp on the same GGUF files, same threads, alternating.
#
#   tools/peer-bench.sh [-r ROUNDS] [-t "1 2"] [-p 512] [-n 128] [-q "Q4_0 Q8_0"] [-x "EXTRA.gguf ..."]
#
# Environment: PXQ (default build/pxq), PEER_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/pxq-peer: the
# npm package and the generated models live there, outside the repository).
#
# 1. node-llama-cpp@3.21.1 (llama.cpp's prebuilt CPU binaries) is installed into PEER_DIR once.
# 2. A random checkpoint of Qwen3-0.6B's shape (hidden 1024, 28 layers, 16/8 heads of 128, FFN 3072,
#    vocab 151936, tied embeddings, weights N(0, 0.02)) is written by tools/make_random_qwen3.py, and
#    `pxq quantize --dtype q4_0|q8_0` makes the GGUFs (lm_head/token_embd Q8_0, pxq quantize's default).
# 3. Each round runs, for every file and thread count, `pxq bench -p P -n N -t T -r 1` and
#    tools/peer-bench.mjs with the same P, N, T (each with its own untimed warm-up); the engine that
#    goes first alternates from round to round. The table gives the medians over the rounds and
#    PXQ / llama.cpp. Both start each test from an empty cache, with random token ids.
# 4. The read bandwidth (tests/bench_membw, next to PXQ's binary: a read-only stream over 1 GiB, best of
#    7) is measured for each thread count after the rounds; the decode rows give PXQ's GB/s (pxq
#    bench's bytes per step: weights + KV) as a share of it.
# It is a benchmark, not a test: CI runs none of it. Check the load (uptime) first; 2 threads on a
# 2-core machine are slowed by anything else running.
set -eu
cd "$(dirname "$0")/.."
ROUNDS=3 THREADS="1 2" P=512 N=128 QUANTS="Q4_0 Q8_0" EXTRA=""
while [ $# -gt 0 ]; do
    case "$1" in
    -r) ROUNDS=$2; shift 2 ;;
    -t) THREADS=$2; shift 2 ;;
    -p) P=$2; shift 2 ;;
    -n) N=$2; shift 2 ;;
    -q) QUANTS=$2; shift 2 ;;
    -x) EXTRA=$2; shift 2 ;;
    *) echo "usage: $0 [-r ROUNDS] [-t \"1 2\"] [-p 512] [-n 128] [-q \"Q4_0 Q8_0\"] [-x \"EXTRA.gguf ...\"]" >&2; exit 2 ;;
    esac
done
PXQ=${PXQ:-build/pxq}
PEER_DIR=${PEER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pxq-peer}
mkdir -p "$PEER_DIR"
[ -x "$PXQ" ] || { echo "peer-bench: $PXQ not built (make NVCC=, or PXQ=path)" >&2; exit 1; }

if [ ! -f "$PEER_DIR/node_modules/node-llama-cpp/package.json" ]; then
    echo "peer-bench: installing node-llama-cpp@3.21.1 into $PEER_DIR" >&2
    npm install --prefix "$PEER_DIR" --no-audit --no-fund --loglevel=error node-llama-cpp@3.21.1 >&2
fi
HF="$PEER_DIR/qwen3-0.6b-shape"
if [ ! -f "$HF/model.safetensors" ]; then
    python3 tools/make_random_qwen3.py --out "$HF" --hidden 1024 --layers 28 --heads 16 --kv-heads 8 \
        --head-dim 128 --ff 3072 --vocab 151936 --std 0.02 --seed 0 >&2
fi
FILES=""
for q in $QUANTS; do
    f="$PEER_DIR/qwen3-0.6b-shape-$q.gguf"
    [ -f "$f" ] || "$PXQ" quantize --model "$HF" --dtype "$(echo "$q" | tr A-Z a-z)" --output "$f" --no-progress >&2
    FILES="$FILES $f"
done
FILES="$FILES $EXTRA"

RES="$PEER_DIR/results-$(date -u +%Y%m%dT%H%M%S).tsv" # engine file threads test t/s [GB/s]
echo "peer-bench: $(uname -n), $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg); pxq $(git rev-parse --short HEAD 2>/dev/null); raw rows: $RES" >&2
run_pxq() { # file threads
    "$PXQ" bench -m "$1" -p "$P" -n "$N" -t "$2" -r 1 --json 2>/dev/null |
        node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{for(const r of JSON.parse(s))
            console.log(["pxq",process.argv[1],process.argv[2],r.n_prompt?"pp":"tg",r.avg_ts,r.value].join("\t"))})' "$1" "$2"
}
run_peer() {
    UV_THREADPOOL_SIZE=1 node tools/peer-bench.mjs --peer-dir "$PEER_DIR" -m "$1" -p "$P" -n "$N" -t "$2" -r 1 |
        node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const r=JSON.parse(s);
            for(const k of ["pp","tg"]) for(const v of r[k]) console.log(["llama.cpp",process.argv[1],process.argv[2],k,v].join("\t"))})' "$1" "$2"
}
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for f in $FILES; do
        for t in $THREADS; do
            if [ $((r % 2)) -eq 1 ]; then run_pxq "$f" "$t"; run_peer "$f" "$t"; else run_peer "$f" "$t"; run_pxq "$f" "$t"; fi
        done
    done >>"$RES"
    echo "peer-bench: round $r of $ROUNDS done, load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    r=$((r + 1))
done

MEMBW="$(dirname "$PXQ")/tests/bench_membw"
if [ -x "$MEMBW" ]; then
    for t in $THREADS; do printf 'membw\t-\t%s\t-\t%s\n' "$t" "$("$MEMBW" "$t" | sed 's/read GB\/s: \([0-9.]*\).*/\1/')"; done >>"$RES"
else
    echo "peer-bench: no $MEMBW (make tests): no read bandwidth column" >&2
fi
echo "peer-bench: done, load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# medians over the rounds, PXQ / llama.cpp; decode GB/s against the read bandwidth
node -e '
const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(l => l.split("\t"));
const med = a => { a = [...a].sort((x, y) => x - y); const m = a.length >> 1; return a.length % 2 ? a[m] : (a[m - 1] + a[m]) / 2; };
const g = {}, bw = {}, gbs = {};
for (const [e, f, t, k, v, gb] of rows) {
    if (e === "membw") { bw[t] = +v; continue; }
    ((g[[f, t, k]] ??= {})[e] ??= []).push(+v);
    if (e === "pxq" && k === "tg") (gbs[[f, t, k]] ??= []).push(+gb);
}
console.log("| model | threads | test | PXQ t/s | llama.cpp t/s | PXQ / llama.cpp | PXQ GB/s (% of read) | rounds |");
console.log("| --- | -: | --- | -: | -: | -: | -: | -: |");
for (const [key, v] of Object.entries(g)) {
    const [f, t, k] = key.split(","), a = med(v.pxq ?? [NaN]), b = med(v["llama.cpp"] ?? [NaN]);
    const test = k === "pp" ? "pp" + process.argv[2] : "tg" + process.argv[3];
    const gb = gbs[key] ? med(gbs[key]) : null;
    const bwc = gb === null ? "" : bw[t] ? `${gb.toFixed(2)} (${(100 * gb / bw[t]).toFixed(1)}%)` : gb.toFixed(2);
    console.log(`| ${f.split("/").pop()} | ${t} | ${test} | ${a.toFixed(2)} | ${b.toFixed(2)} | ${(a / b).toFixed(2)}x | ${bwc} | ${v.pxq?.length ?? 0} |`);
}
for (const [t, v] of Object.entries(bw)) console.log(`\nread bandwidth, ${t} threads: ${v.toFixed(2)} GB/s (tests/bench_membw)`);
' "$RES" "$P" "$N"
