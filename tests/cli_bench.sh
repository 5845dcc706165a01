#!/bin/sh
# pxq plan and pxq bench, on the CPU.
# plan: the Qwen3-32B preset at Q4_0, 4K context: the weight and KV bytes equal an independent count
# (awk, from the config's values: matrices x 18/32 bytes + f32 norms; 64 layers x 2 x 8 heads x 128
# x 2 B per token); with --gpu-mem 16GiB it does not fit (exit 1) and the shortfall is at least
# weights + KV - 16 GiB and at most 0.5 GiB more (activations, logits, workspace); with 24GiB it fits;
# the largest context it reports fits and 16 more tokens do not. Qwen3.5-27B: 64 KiB of KV per token,
# the DeltaNet state per sequence counted by hand, and 16384 tokens fit in 16 GiB.
# bench: --json rows for the bundled model and for a dummy tiny config are well-formed.
. tests/lib.sh
tmp=/tmp/pxq-cli-bench.$$
trap 'rm -f $tmp.*' EXIT

cfg() { sed -n "s/.*\"$2\": *\([0-9.e+-]*\).*/\1/p" "$1" | head -n 1; }
P=presets/qwen3-32b.json
H=$(cfg $P hidden_size); I=$(cfg $P intermediate_size); L=$(cfg $P num_hidden_layers)
NH=$(cfg $P num_attention_heads); KV=$(cfg $P num_key_value_heads); HD=$(cfg $P head_dim); V=$(cfg $P vocab_size)
wbytes=$(awk -v H=$H -v I=$I -v L=$L -v NH=$NH -v KV=$KV -v HD=$HD -v V=$V 'BEGIN {
    q = NH * HD; kv = KV * HD
    mat = 2 * V * H + L * (H * q + 2 * H * kv + q * H + 3 * H * I)   # untied embedding and lm_head
    vec = H + L * (2 * H + 2 * HD)                                    # output_norm, attn/ffn norms, q/k norms
    printf "%.0f", mat * 18 / 32 + vec * 4 }')
kvtok=$(awk -v L=$L -v KV=$KV -v HD=$HD 'BEGIN { printf "%.0f", L * 2 * KV * HD * 2 }')
check "independent counts are sane" '[ "$wbytes" -gt 18000000000 ] && [ "$kvtok" = 262144 ]'

$PXQ plan --load-format dummy --config $P --dtype q4_0 -c 4096 --gpu-mem 16GiB > $tmp.16; rc16=$?
check "plan 32B Q4_0 4K in 16GiB: does not fit, exit 1" '[ $rc16 = 1 ] && grep -q "^does not fit: short by" $tmp.16'
check "plan weight bytes = params x 18/32 + f32 norms ($wbytes)" 'grep -q "weights .* $wbytes bytes" $tmp.16'
check "plan KV = $kvtok B/token x 4096" 'grep -q "KV cache *1.00 GiB *256.00 KiB/token" $tmp.16'
short=$(sed -n 's/^does not fit: short by \([0-9.]*\) GiB/\1/p' $tmp.16)
check "shortfall $short GiB is weights + KV - 16 GiB plus at most 0.5 GiB" \
    'awk -v s="$short" -v w=$wbytes -v k=$kvtok "BEGIN { lo = (w + k * 4096) / 2^30 - 16; exit !(s >= lo - 0.005 && s <= lo + 0.5) }"'

zero=$($PXQ plan --load-format dummy --config $P -c 4096 --gpu-mem 0GiB 2>&1; echo "rc=$?")
check "plan --gpu-mem 0GiB: an error naming the flag, exit 2" \
    'printf "%s" "$zero" | grep -q "gpu-mem must be more than 0" && printf "%s" "$zero" | grep -q "rc=2"'
$PXQ plan --load-format dummy --config $P -c 4096 --gpu-mem 24GiB > $tmp.24; rc24=$?
check "plan 32B Q4_0 4K in 24GiB: fits, exit 0" '[ $rc24 = 0 ] && grep -q "^fits:" $tmp.24'
maxc=$(sed -n 's/^largest context that fits: \([0-9]*\) tokens.*/\1/p' $tmp.24)
check "largest context $maxc fits and $maxc + 16 does not" \
    '[ -n "$maxc" ] && $PXQ plan --load-format dummy --config $P -c $maxc --gpu-mem 24GiB >/dev/null &&
     ! $PXQ plan --load-format dummy --config $P -c $((maxc + 16)) --gpu-mem 24GiB >/dev/null'

Q=presets/qwen3.5-27b.json
$PXQ plan --load-format dummy --config $Q -c 16384 --gpu-mem 16GiB > $tmp.q35; rcq=$?
state=$(awk 'BEGIN { conv_dim = 2 * 16 * 128 + 48 * 128; printf "%.2f MiB", 48 * ((4 - 1) * conv_dim + 48 * 128 * 128) * 4 / 2^20 }')
check "plan Qwen3.5-27B: 16 attention layers, 64 KiB/token, 16384 tokens fit in 16GiB" \
    '[ $rcq = 0 ] && grep -q "16 attention, 48 DeltaNet" $tmp.q35 && grep -q "64.00 KiB/token" $tmp.q35'
check "plan Qwen3.5-27B: recurrent state $state per sequence" 'grep -q "recurrent state *$state" $tmp.q35'
# quantized caches, counted by hand: per layer and KV head of 256, q8_0 is 8 groups x (2 + 32) bytes and
# q2nu 8 x (2 + 8); 16 layers x 4 heads: q8_0 (272 + 272) x 64 = 34 KiB, pxq (272 + 80) x 64 = 22 KiB per
# token; the residual (4 + 128 + 512 positions) x 64 KiB x 2 in float32 = 80.5 MiB per sequence. The
# largest context grows as the bytes per token shrink.
ctx() { sed -n 's/^largest context that fits: \([0-9]*\) tokens.*/\1/p' "$1"; }
for kt in f16 q8_0 pxq; do $PXQ plan --load-format dummy --config $Q --gpu-mem 15.2GiB --kv-cache-type $kt > $tmp.kv$kt; done
check "plan Qwen3.5-27B --kv-cache-type q8_0: 34 KiB/token + 80.50 MiB/seq residual" \
    'grep -q "34.00 KiB/token" $tmp.kvq8_0 && grep -q "80.50 MiB/seq exact residual" $tmp.kvq8_0'
check "plan Qwen3.5-27B --kv-cache-type pxq: 22 KiB/token, the type named in the largest context" \
    'grep -q "22.00 KiB/token" $tmp.kvpxq && grep -q "with the pxq KV cache" $tmp.kvpxq'
check "largest context at 15.2GiB: f16 $(ctx $tmp.kvf16) < q8_0 $(ctx $tmp.kvq8_0) < pxq $(ctx $tmp.kvpxq)" \
    '[ "$(ctx $tmp.kvf16)" -lt "$(ctx $tmp.kvq8_0)" ] && [ "$(ctx $tmp.kvq8_0)" -lt "$(ctx $tmp.kvpxq)" ]'
bad=$($PXQ plan --load-format dummy --config $Q --kv-cache-type int4 2>&1; echo "rc=$?")
check "an unknown --kv-cache-type lists the valid ones, exit 2" \
    'printf "%s" "$bad" | grep -q "unknown KV cache type .int4.; the types are f16, q8_0, pxq" && printf "%s" "$bad" | grep -q "rc=2"'
$PXQ plan --load-format dummy --config presets/qwen3-30b-a3b.json -c 4096 > $tmp.moe
check "plan Qwen3-30B-A3B without a budget: exit 0, 48 attention layers" '[ $? = 0 ] && grep -q "48 attention" $tmp.moe'

# bench --json: well-formed rows (node or python3 parse them)
json_rows() { # file, expected rows, expected tests (space-separated)
    if command -v node >/dev/null 2>&1; then
        node -e '
const [f, n, tests] = process.argv.slice(1); const r = JSON.parse(require("fs").readFileSync(f, "utf8"));
const keys = ["model", "quant", "weights_resident", "backend", "kernel_path", "kv_cache", "batch", "test", "depth", "avg_ts", "stddev_ts",
              "samples_ts", "metric", "value", "roofline", "roofline_pct", "peak_mem_bytes"];
let ok = Array.isArray(r) && r.length == +n && r.map(x => x.test).join(" ") == tests;
for (const x of r) ok = ok && keys.every(k => k in x) && x.avg_ts > 0 && x.value > 0 && x.roofline > 0 && x.peak_mem_bytes > 0 &&
                       x.weights_resident == "yes" && x.samples_ts.length == x.reps;
process.exit(ok ? 0 : 1);' "$1" "$2" "$3"
    elif command -v python3 >/dev/null 2>&1; then
        python3 -c '
import json, sys
f, n, tests = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = json.load(open(f))
ok = isinstance(r, list) and len(r) == n and " ".join(x["test"] for x in r) == tests
ok = ok and all(x["avg_ts"] > 0 and x["value"] > 0 and x["roofline"] > 0 and len(x["samples_ts"]) == x["reps"] for x in r)
sys.exit(0 if ok else 1)' "$1" "$2" "$3"
    else
        echo "(no node or python3: checking the brackets only)"; head -c 1 "$1" | grep -q '\['
    fi
}
$PXQ bench --device cpu -m models/tiny-qwen3-Q4_K_M.gguf -p 32 -n 8 -r 2 -t 2 --json > $tmp.b1 2>$tmp.e1; rcb=$?
check "bench tiny Q4_K_M --json: 2 well-formed rows" '[ $rcb = 0 ] && json_rows $tmp.b1 2 "pp32 tg8"'
$PXQ bench --load-format dummy --config tests/data/dummy-tiny.json --dtype q4_0 -p 16 -n 4 -b 1,2 -d 8 -r 1 -t 2 --json > $tmp.b2 2>$tmp.e2; rcd=$?
check "bench dummy tiny q4_0, b 1,2, depth 8: 4 well-formed rows" '[ $rcd = 0 ] && json_rows $tmp.b2 4 "pp16 tg4 pp16 tg4"'
$PXQ bench --load-format dummy --config tests/data/dummy-tiny-qwen35.json --dtype q4_k -p 8 -n 2 -r 1 -t 2 > $tmp.b3 2>&1; rcq=$?
check "bench dummy tiny qwen35 q4_k: markdown table with pp8 and tg2 rows" \
    '[ $rcq = 0 ] && grep -q "| pp8 | 0 |" $tmp.b3 && grep -q "| tg2 | 0 |" $tmp.b3 && grep -q "^roofline: copy" $tmp.b3'

# bad input: a clear message and exit 2
bad() { "$@" >/dev/null 2>$tmp.err; rc=$?; [ $rc = 2 ] && [ "$(wc -l < $tmp.err)" = 1 ]; }
check "plan: dummy without --config" 'bad $PXQ plan --load-format dummy'
check "plan: -m and dummy together" 'bad $PXQ plan -m models/tiny-qwen3-Q4_K_M.gguf --load-format dummy --config $P'
check "plan: bad --dtype" 'bad $PXQ plan --load-format dummy --config $P --dtype q3_0'
check "plan: bad --gpu-mem" 'bad $PXQ plan --load-format dummy --config $P --gpu-mem 16XB'
check "plan: --gpu-mem without a unit" 'bad $PXQ plan --load-format dummy --config $P --gpu-mem 16 && grep -q "with a unit" $tmp.err'
check "bench: --gpu-mem without a unit" 'bad $PXQ bench --gpu-mem 16'
check "plan: bad --kv-cache-type" 'bad $PXQ plan --load-format dummy --config $P --kv-cache-type q2'
check "bench: -b 0" 'bad $PXQ bench -b 0'
check "bench: -p 0 -n 0" 'bad $PXQ bench -p 0 -n 0'
check "bench: bad list" 'bad $PXQ bench -b 1,,4'
check "bench: trailing comma in a list" 'bad $PXQ bench -b 1,4,'
$PXQ bench --device cuda -m tests/data/no-such.gguf >/dev/null 2>$tmp.err
check "bench: a missing model is named before any device probe, exit 1" '[ $? = 1 ] && grep -q "no-such.gguf" $tmp.err'
$PXQ plan --load-format dummy --config tests/data/no-such.json >/dev/null 2>$tmp.err
check "plan: missing config file, exit 1 naming it" '[ $? = 1 ] && grep -q "no-such.json" $tmp.err'
exit $fail
