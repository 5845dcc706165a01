#!/bin/sh
# The flags users bring from llama.cpp and vLLM: each alias does what the PXQ flag does; a flag for a
# thing PXQ lacks fails (exit 2) saying what PXQ offers instead; an unknown flag names the nearest of the
# command's own; a context past the trained length without RoPE scaling is warned about by run and serve.
# Uses the bundled tiny model (6 layers, n_ctx_train 2048); runs on the CPU build.
. tests/lib.sh
T=${TMPDIR:-/tmp}/pxq-flags.$$
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
run() { $PXQ run -p "Once upon a time" -n 4 --temp 0 -t 2 "$@"; }

# -ngl / --n-gpu-layers: N > 0 is --device cuda (whatever this build does with it), 0 is cpu
run -ngl 0 >"$T/a.out" 2>"$T/a.err"; rc_a=$?
run --device cpu >"$T/b.out" 2>/dev/null
check "-ngl 0 runs on the CPU, the same text as --device cpu" '[ $rc_a = 0 ] && cmp -s "$T/a.out" "$T/b.out"'
run --n-gpu-layers 0 >"$T/c.out" 2>/dev/null
check "--n-gpu-layers 0 is -ngl 0" 'cmp -s "$T/a.out" "$T/c.out"'
run -ngl 99 >"$T/d.out" 2>"$T/d.err"; rc_d=$?
run --device cuda >"$T/e.out" 2>"$T/e.err"; rc_e=$?
check "-ngl 99 does what --device cuda does (exit $rc_d, $rc_e)" '[ $rc_d = $rc_e ] && cmp -s "$T/d.err" "$T/e.err"'
run -ngl all >/dev/null 2>"$T/f.err"; rc_f=$?
check "-ngl all is --device cuda too" '[ $rc_f = $rc_e ] && cmp -s "$T/f.err" "$T/e.err"'
run -ngl 3 >/dev/null 2>"$T/g.err"
check "-ngl 3 of 6 layers: warns that PXQ offloads all or none" 'grep -q "warning: -ngl 3: PXQ offloads all 6 layers or none" "$T/g.err"'
$PXQ run -p x -ngl many 2>"$T/h.err"; rc=$?
check "-ngl many: exit 2, the range named" '[ $rc = 2 ] && grep -q "ngl expects an integer" "$T/h.err"'
$PXQ help run | grep -q -- "-ngl, --n-gpu-layers N .*all layers or none"
check "pxq help run shows -ngl and says all layers or none" '[ $? = 0 ]'
$PXQ help bench | grep -q -- "-ngl, --n-gpu-layers"
check "pxq help bench shows -ngl" '[ $? = 0 ]'

# context: -c, --ctx-size, --max-model-len (run's help shows it)
for f in -c --ctx-size --max-model-len; do
    run $f 96 >/dev/null 2>"$T/ctx.err"
    check "run $f 96: n_ctx 96" 'grep -q "n_ctx 96," "$T/ctx.err"'
done
check "pxq help run shows --max-model-len" '$PXQ help run | grep -q -- "--ctx-size N .*--max-model-len"'

# --n-predict is -n
$PXQ run -p "Once upon a time" --n-predict 3 --temp 0 --ignore-eos 2>"$T/np.err" >/dev/null
check "run --n-predict 3: 3 tokens decoded" 'grep -q "decode 3 tokens" "$T/np.err"'

# KV cache types: vLLM's --kv-cache-dtype, llama.cpp's --cache-type-k/-v, -ctk/-ctv
run --kv-cache-type q8_0 >"$T/kv.out" 2>/dev/null
for fl in "--kv-cache-dtype q8_0" "--cache-type-k q8_0 --cache-type-v q8_0" "-ctk q8_0 -ctv q8_0"; do
    run $fl >"$T/kv2.out" 2>/dev/null
    check "$fl is --kv-cache-type q8_0" 'cmp -s "$T/kv.out" "$T/kv2.out"'
done
run --kv-cache-dtype auto >"$T/kv3.out" 2>/dev/null
check "--kv-cache-dtype auto is f16 (vLLM's default)" 'cmp -s "$T/kv3.out" "$T/a.out"'
$PXQ run -p x -ctk q4_0 2>"$T/kv.err"; rc=$?
check "-ctk q4_0: exit 2, PXQ's types named" '[ $rc = 2 ] && grep -q "f16 and q8_0" "$T/kv.err"'
$PXQ run -p x -ctk f16 -ctv q8_0 2>"$T/kv.err"; rc=$?
check "-ctk f16 -ctv q8_0: exit 2, one type for K and V" '[ $rc = 2 ] && grep -q "one type" "$T/kv.err"'
for c in run serve perplexity; do
    check "pxq help $c shows --kv-cache-type and its aliases" \
        '$PXQ help $c | grep -q -- "--kv-cache-type T .*--kv-cache-dtype, -ctk/-ctv"'
done

# what PXQ lacks: exit 2 and what it offers instead
refused() { # FLAGS... -- PATTERN
    pat=$(eval echo "\${$#}")
    $PXQ "$@" >/dev/null 2>"$T/r.err"
    rc=$?
    [ $rc = 2 ] && grep -q "$pat" "$T/r.err"
}
check "run --flash-attn: always flash attention on CUDA" 'refused run -p x --flash-attn "always uses flash attention on CUDA"'
check "run -fa on: the same" 'refused run -p x -fa on "always uses flash attention"'
check "run --mlock: memory-maps, no switch" 'refused run -p x --mlock "no switch for mmap or mlock"'
check "serve --tensor-parallel-size 2: one GPU" 'refused serve --tensor-parallel-size 2 "on one GPU"'
check "serve -tp 2: one GPU" 'refused serve -tp 2 "on one GPU"'
check "serve -np 4: --max-num-seqs" 'refused serve -np 4 "max-num-seqs"'
check "run --gpu-memory-utilization: serve's; --gpu-mem" 'refused run -p x --gpu-memory-utilization 0.9 "gpu-mem SIZE"'
check "serve --max-model-len=4096: the value is the next argument" \
    'refused serve --max-model-len=4096 "as the next argument (.--max-model-len 4096.)"'

# an unknown flag names the nearest of the command's own
check "run --kv-cache-typ: did you mean --kv-cache-type?" \
    'refused run -p x --kv-cache-typ f16 "unknown option .--kv-cache-typ.; did you mean --kv-cache-type?"'
check "serve --max-num-seq: did you mean --max-num-seqs?" 'refused serve --max-num-seq 4 "did you mean --max-num-seqs?"'
check "serve --max-model-length: did you mean --max-model-len?" 'refused serve --max-model-length 4 "did you mean --max-model-len?"'
check "perplexity --chunk: did you mean --chunks?" 'refused perplexity --chunk 4 "did you mean --chunks?"'
check "bench --repetition: did you mean --repetitions?" 'refused bench --repetition 3 "did you mean --repetitions?"'
check "quantize --calib-fil: did you mean --calib-file?" 'refused quantize --calib-fil x "did you mean --calib-file?"'
check "run --temperatur: did you mean --temperature?" 'refused run -p x --temperatur 0 "did you mean --temperature?"'
check "run --top_k: did you mean --top-k?" 'refused run -p x --top_k 4 "did you mean --top-k?"'
$PXQ run -p x --zzzzzzzzzz 2>"$T/u.err"; rc=$?
check "run --zzzzzzzzzz: exit 2, no guess, the help named" \
    '[ $rc = 2 ] && grep -qx "pxq run: unknown option .--zzzzzzzzzz. (see pxq run --help)" "$T/u.err"'

# past the trained context (2048) without RoPE scaling: run and serve warn; with --rope-scaling they do not
run -c 4096 >/dev/null 2>"$T/w.err"
check "run -c 4096: warns past the trained 2048 without RoPE scaling" 'grep -q "warning: the context (4096) passes the model.s trained 2048" "$T/w.err"'
run -c 4096 --rope-scaling yarn --rope-factor 2 >/dev/null 2>"$T/w.err"
check "run -c 4096 --rope-scaling yarn: no warning" '! grep -q "passes the model" "$T/w.err"'
# the host KV tier's flags (docs/KVCACHE.md): the same text with a 2-block device tier on the CPU
run > "$T/base.out" 2>/dev/null
run --kv-offload --kv-device-blocks 2 -c 256 > "$T/tier.out" 2>/dev/null
check "run --kv-offload --kv-device-blocks 2: the text of the run without a tier" 'cmp -s "$T/base.out" "$T/tier.out"'
out=$(run --swap-space 100000 2>&1; echo "rc=$?")
check "run --swap-space beyond the machine's memory: refused" 'printf "%s" "$out" | grep -q "swap-space 100000.00 GiB: this machine has" && printf "%s" "$out" | grep -q "rc=2"'
out=$(run -c 256 --swap-space 0.0009765625 --kv-device-blocks 2 2>&1; echo "rc=$?")
check "run with a host tier over --swap-space: refused, naming it" 'printf "%s" "$out" | grep -q "swap-space 1.0 MiB: the host KV tier needs" && printf "%s" "$out" | grep -q "rc=1"'
out=$(run --kv-device-blocks 4 2>&1 >/dev/null)
check "run --kv-device-blocks without --kv-offload: a warning" 'printf "%s" "$out" | grep -q "kv-device-blocks has no effect without --kv-offload"'
out=$($PXQ plan --load-format dummy --config presets/qwen3-32b.json -c 4096 --kv-device-blocks 4 --kv-sink 8 2>&1; echo "rc=$?")
check "plan --kv-device-blocks without --kv-offload, --kv-sink with f16: warned, as run warns" \
    'printf "%s" "$out" | grep -q "kv-device-blocks has no effect without --kv-offload" &&
     printf "%s" "$out" | grep -q "kv-sink and --kv-window have no effect with the f16 KV cache" && printf "%s" "$out" | grep -q "rc=0"'
out=$($PXQ plan --kv-offload 2>&1; echo "rc=$?")
check "plan --kv-offload without --gpu-mem: refused" 'printf "%s" "$out" | grep -q "give --gpu-mem" && printf "%s" "$out" | grep -q "rc=2"'
out=$($PXQ plan --load-format dummy --config presets/qwen3.5-27b.json --dtype q4_0 --gpu-mem 15.2GiB --kv-cache-type pxq -c 262144 --kv-offload; echo "rc=$?")
check "plan Qwen3.5-27B at 262144 in 15.2 GiB with --kv-offload: fits, with the host tier's line" \
    'printf "%s" "$out" | grep -q "^  KV host tier .*GiB  --kv-offload" && printf "%s" "$out" | grep -q "^fits with the host tier" && printf "%s" "$out" | grep -q "rc=0"'
check "... its KV line says the size is the device's part" \
    'printf "%s" "$out" | grep -q "^  KV cache .*MiB  on the device: the device tier.s blocks, the key bounds and the residual"'
out=$($PXQ plan --load-format dummy --config presets/qwen3.5-27b.json --dtype q4_0 --gpu-mem 15.2GiB --kv-cache-type pxq -c 262144 \
    --kv-offload --attention-window 4096 --attention-sinks 4 --kv-topk-blocks 2048; echo "rc=$?")
check "plan ... with block selection: the key bounds (2 GiB) on the device, no fit; the tier holds K and V only" \
    'printf "%s" "$out" | grep -q "min and max, 2.00 GiB, on the device" && printf "%s" "$out" | grep -q "blocks (352.00 KiB each) in pinned host" &&
     printf "%s" "$out" | grep -q "^does not fit" && printf "%s" "$out" | grep -q "rc=1"'
for f in --block-size --kv-block-size; do
    out=$($PXQ plan --load-format dummy --config presets/qwen3.5-27b.json --dtype q4_0 --gpu-mem 15.2GiB --kv-cache-type pxq -c 262144 \
        --kv-offload --attention-window 4096 --attention-sinks 4 --kv-topk-blocks 64 $f 64; echo "rc=$?")
    check "plan ... with block selection in blocks of 64 ($f): the bounds 512 MiB, fits with the host tier" \
        'printf "%s" "$out" | grep -q "in blocks of 64" && printf "%s" "$out" | grep -q "min and max, 512.00 MiB, on the device" &&
         printf "%s" "$out" | grep -q "^fits with the host tier" && printf "%s" "$out" | grep -q "rc=0"'
done
SEL="--load-format dummy --config presets/qwen3.5-27b.json --dtype q4_0 --gpu-mem 15.2GiB --kv-cache-type pxq --kv-offload --attention-window 4096 --attention-sinks 4 --kv-topk-blocks 64 --block-size 64"
out=$($PXQ plan $SEL -c 65536; echo "rc=$?")
check "plan ... at 65536 with a host tier: the small prefill tiles, their room in device blocks (567, not 102)" \
    'printf "%s" "$out" | grep -q "2 x 64.00 MiB: the small tiles, which leave the room to device-tier blocks" &&
     printf "%s" "$out" | grep -q "the device tier holds 567 blocks" && printf "%s" "$out" | grep -q "rc=0"'
out=$($PXQ plan $SEL -c 8192; echo "rc=$?")
check "plan ... at 8192, every block on the device: the whole-matrix tiles" \
    'printf "%s" "$out" | grep -q "tiles (2 x 384.00 MiB)" && printf "%s" "$out" | grep -q "every one of the 128 blocks fits the device tier" &&
     printf "%s" "$out" | grep -q "rc=0"'
out=$($PXQ plan $SEL -c 65536 --kv-select-cache 64; echo "rc=$?")
check "plan ... --kv-select-cache 64 at 65536: its 64 blocks counted in the device tier" \
    'printf "%s" "$out" | grep -q "64 of them the cache of chosen host blocks (--kv-select-cache)" && printf "%s" "$out" | grep -q "rc=0"'
out=$($PXQ plan $SEL -c 65536 --kv-select-cache 1024 --kv-device-blocks 1000; echo "rc=$?")
check "plan ... --kv-select-cache 1024 beside a device tier of 1000 blocks: does not fit, saying why" \
    'printf "%s" "$out" | grep -q "less than a step.s 1033 with --kv-select-cache.s" && printf "%s" "$out" | grep -q "rc=1"'
for bad in "--kv-select-cache 6" "--kv-select-cache 2048"; do
    out=$($PXQ plan $SEL -c 65536 $bad 2>&1; echo "rc=$?")
    check "plan $bad: refused" 'printf "%s" "$out" | grep -q "kv-select-cache" && printf "%s" "$out" | grep -q "rc=2"'
done
out=$(run --kv-select-cache 8 2>&1; echo "rc=$?")
check "run --kv-select-cache on the CPU without a tier: refused, naming it" \
    'printf "%s" "$out" | grep -q "kv-select-cache 8 needs --kv-offload and --kv-topk-blocks" && printf "%s" "$out" | grep -q "rc=1"'
out=$(run --kv-offload --kv-device-blocks 4 --attention-window 64 --attention-sinks 4 --kv-topk-blocks 4 --kv-select-cache 8 2>&1; echo "rc=$?")
check "run --kv-select-cache 8 on the CPU with a tier and selection: refused, naming the device" \
    'printf "%s" "$out" | grep -q "kv-select-cache 8 needs --device cuda" && printf "%s" "$out" | grep -q "rc=1"'
out=$(run -c 16 --attention-window 8 --attention-sinks 100 2>&1; echo "rc=$?")
check "run --attention-sinks 100 in a context of 16: refused" \
    'printf "%s" "$out" | grep -q "the sinks fewer than the context" && printf "%s" "$out" | grep -q "rc=1"'
out=$(run --rope-scaling yarn 2>&1; echo "rc=$?")
check "run --rope-scaling yarn without a factor: refused, naming --rope-factor" \
    'printf "%s" "$out" | grep -q "rope-scaling yarn needs --rope-factor F" && printf "%s" "$out" | grep -q "rc=2"'
for f in --rope-freq-scale --rope-freq-base --yarn-ext-factor; do
    out=$(run $f 0.5 2>&1; echo "rc=$?")
    check "run $f (llama.cpp's): refused with what PXQ does instead" \
        'printf "%s" "$out" | grep -q -- "$f: PXQ" && printf "%s" "$out" | grep -q "rc=2"'
done
out=$(run --kv-select-cache 5 2>&1; echo "rc=$?")
check "run --kv-select-cache 5: refused" 'printf "%s" "$out" | grep -q "give a multiple of 4" && printf "%s" "$out" | grep -q "rc=2"'
run --block-size 16 >"$T/bs16.out" 2>/dev/null
run >"$T/bs0.out" 2>/dev/null
check "run --block-size 16 is the default" 'cmp -s "$T/bs16.out" "$T/bs0.out"'
out=$(run --block-size 0 2>&1; echo "rc=$?")
check "run --block-size 0: exit 2, the range named" 'printf "%s" "$out" | grep -q "block-size expects an integer in \[1, 4096\]" && printf "%s" "$out" | grep -q "rc=2"'
out=$($PXQ plan --load-format dummy --config presets/qwen3.5-27b.json --dtype q4_0 --gpu-mem 15.2GiB --kv-cache-type pxq -c 262144 --swap-space 2; echo "rc=$?")
check "plan ... --swap-space 2: does not fit, the host tier over it" 'printf "%s" "$out" | grep -q "more than --swap-space 2.00 GiB" && printf "%s" "$out" | grep -q "rc=1"'
serve_log() { # ARGS...: start pxq serve, wait for it to listen, SIGTERM it; its stderr in $T/s.err
    $PXQ serve --port 0 -t 1 --max-num-seqs 1 "$@" 2>"$T/s.err" &
    pid=$!
    for _ in $(seq 100); do grep -q "listening on" "$T/s.err" && break; sleep 0.1; done
    kill -TERM $pid
    wait $pid
}
serve_log --max-model-len 4096
check "serve --max-model-len 4096: the same warning" 'grep -q "pxq serve: warning: the context (4096) passes the model.s trained 2048" "$T/s.err"'
serve_log --max-model-len 4096 --rope-scaling linear --rope-factor 2
check "serve ... --rope-scaling linear: no warning" 'grep -q "listening on" "$T/s.err" && ! grep -q "passes the model" "$T/s.err"'
serve_log --kv-block-size 64
check "serve --kv-block-size 64 (the alias): its pool in blocks of 64" 'grep -q "KV [0-9]* blocks of 64" "$T/s.err"'
exit $fail
