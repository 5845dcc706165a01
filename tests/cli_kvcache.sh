#!/bin/sh
# The pxq KV cache's calibration through the binary (docs/KVCACHE.md): kv-calibrate on the Q8_0 GGUF
# (a few chunks of Shakespeare) writes the pxq.kv.* keys with the calibration file's sha256, keeps
# every tensor, refuses its input as output (the input intact, no temp file left), and the result,
# at ratio 0.15 under the acceptance protocol (frankenstein, -c 256 --chunks 64) against the same
# model with the f16 cache, is within the targets: PPL +1% and KLD < 0.02 with the default
# window and sinks, PPL +3% with every token quantized. With every token quantized, calibrated
# levels beat uniform ones on KLD (ratio 0, 16 chunks), and the 8-bit heads improve on ratio 0.
# A model without the keys under pxq warns once and runs; pxq quantize --kv-quant int2 writes them.
D=tests/data
M=$D/gguf/tiny-qwen3-Q8_0.gguf
C=$D/calib-shakespeare.txt
. tests/lib.sh
tmp=$(mktemp -d /tmp/pxq-cli-kvcache.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
field() { printf '%s' "$1" | sed "s/.*\"$2\": \([0-9.e+-]*\).*/\1/"; }
kl() { # model, chunks, flags...: the JSON line of perplexity against the f16 cache
    _m=$1; _n=$2; shift 2
    $PXQ perplexity -m "$_m" -f $D/frankenstein.txt -c 256 --chunks "$_n" --kv-cache-type pxq --kl-base-kv-cache-type f16 --json "$@" 2>/dev/null | tail -n 1
}

"$PXQ" kv-calibrate -m $M --calib-file $C -o $tmp/k15.gguf --chunks 4 --sens-chunks 1 > $tmp/out 2> $tmp/err; rc=$?
check "kv-calibrate at 0.15 exits 0 and says 2 of 12 heads keep 8 bits" '[ $rc = 0 ] && grep -q "2 of 12 KV heads keep V at 8 bits" $tmp/err'
"$PXQ" info -v $tmp/k15.gguf > $tmp/info 2>&1
sum=$(sha256sum $C | cut -d' ' -f1)
check "the keys: v_bits [12], v_levels [48], ratio, the calibration file's sha256" \
    'grep -q "pxq.kv.v_bits *\[uint8 x 12\]" $tmp/info && grep -q "pxq.kv.v_levels *\[float32 x 48\]" $tmp/info &&
     grep -q "pxq.kv.sensitive_ratio *0.15" $tmp/info && grep -q "pxq.kv.calib_sha256 *\"$sum\"" $tmp/info'
check "every tensor and key of the input is kept" \
    '[ "$("$PXQ" info -v $M 2>&1 | grep -v "^model:" | grep -c .)" -le "$(grep -v "^model:" $tmp/info | grep -c .)" ] &&
     "$PXQ" info -v $M 2>&1 | grep -v "^model:\|^  general.alignment" > $tmp/a; grep -v "^model:\|pxq.kv" $tmp/info > $tmp/b; diff $tmp/a $tmp/b > /dev/null'
"$PXQ" kv-calibrate -m $M --calib-file $C -o $tmp/k0.gguf --chunks 4 --sens-chunks 1 --kv-sensitive-ratio 0 2> $tmp/err; rc=$?
check "kv-calibrate at ratio 0 keeps no head at 8 bits" '[ $rc = 0 ] && grep -q "0 of 12 KV heads" $tmp/err'

cp $tmp/k0.gguf $tmp/in.gguf
gsum=$(sha256sum < $tmp/in.gguf)
"$PXQ" kv-calibrate -m $tmp/in.gguf --calib-file $C -o $tmp/./in.gguf > /dev/null 2> $tmp/err; rc=$?
check "the input as output: exit 2, says so, input intact, no temp file" \
    '[ $rc = 2 ] && grep -q "is the input model itself" $tmp/err && [ "$(sha256sum < $tmp/in.gguf)" = "$gsum" ] && ! ls $tmp | grep -q tmp'
"$PXQ" kv-calibrate -m $M --calib-file $tmp/nope.txt -o $tmp/x.gguf > /dev/null 2> $tmp/err; rc=$?
check "a missing calibration file: exit 1, names it, no output" '[ $rc = 1 ] && grep -q "nope.txt" $tmp/err && [ ! -e $tmp/x.gguf ]'
"$PXQ" kv-calibrate -m $M --calib-file $C -o $tmp/x.gguf --kv-sensitive-ratio 1.5 > /dev/null 2> $tmp/err; rc=$?
check "ratio 1.5: exit 2" '[ $rc = 2 ] && grep -q "kv-sensitive-ratio" $tmp/err && [ ! -e $tmp/x.gguf ]'

"$PXQ" perplexity -m $M -f $D/frankenstein.txt -c 256 --chunks 1 --kv-cache-type pxq > /dev/null 2> $tmp/err; rc=$?
check "an uncalibrated model under pxq: one warning, runs" \
    '[ $rc = 0 ] && [ "$(grep -c "warning: .*no KV calibration.*uniform 2-bit levels" $tmp/err)" = 1 ]'
"$PXQ" perplexity -m $tmp/k15.gguf -f $D/frankenstein.txt -c 256 --chunks 1 --kv-cache-type pxq > /dev/null 2> $tmp/err
check "a calibrated model: no warning" '! grep -q warning $tmp/err'

# the targets, under the acceptance protocol
j=$(kl $tmp/k15.gguf 64)
p=$(field "$j" ppl); b=$(field "$j" ppl_base); k=$(field "$j" kld)
echo "     ratio 0.15, defaults: ppl $p (f16 cache $b), kld $k"
check "ratio 0.15, default window and sinks: PPL within +1% of the f16 cache, KLD < 0.02" \
    'awk -v p=$p -v b=$b -v k=$k "BEGIN { exit !(p > 0 && p <= 1.01 * b && k < 0.02) }"'
j=$(kl $tmp/k15.gguf 64 --kv-window 0 --kv-sink 0)
p=$(field "$j" ppl); b=$(field "$j" ppl_base); k15=$(field "$j" kld)
echo "     ratio 0.15, every token quantized: ppl $p (f16 cache $b), kld $k15"
check "ratio 0.15, every token quantized: PPL within +3% of the f16 cache" 'awk -v p=$p -v b=$b "BEGIN { exit !(p > 0 && p <= 1.03 * b) }"'

# calibrated against uniform levels, every token quantized (16 chunks)
k0=$(field "$(kl $tmp/k0.gguf 16 --kv-window 0 --kv-sink 0)" kld)
ku=$(field "$(kl $M 16 --kv-window 0 --kv-sink 0)" kld)
k15s=$(field "$(kl $tmp/k15.gguf 16 --kv-window 0 --kv-sink 0)" kld)
echo "     every token quantized, 16 chunks: kld uniform $ku, calibrated $k0, calibrated + 8-bit heads $k15s"
check "calibrated levels beat uniform on KLD" 'awk -v a=$k0 -v u=$ku "BEGIN { exit !(a > 0 && a < u) }"'
check "the 8-bit heads lower the KLD further" 'awk -v a=$k15s -v b=$k0 "BEGIN { exit !(a > 0 && a < b) }"'

# pxq quantize --kv-quant int2
"$PXQ" quantize --model $D/tiny-qwen3 --output $tmp/q.gguf --dtype q8_0 --kv-quant int2 --calib-file $C --kv-chunks 2 \
    --no-progress > /dev/null 2> $tmp/err; rc=$?
check "quantize --kv-quant int2 writes the pxq.kv.* keys" \
    '[ $rc = 0 ] && "$PXQ" info -v $tmp/q.gguf 2>&1 | grep -q "pxq.kv.v_bits *\[uint8 x 12\] .*8" && ! ls $tmp | grep -q "q.gguf.tmp"'
"$PXQ" quantize --model $D/tiny-qwen3 --output $tmp/q2.gguf --kv-quant int2 > /dev/null 2> $tmp/err; rc=$?
check "quantize --kv-quant int2 without --calib-file: exit 2" '[ $rc = 2 ] && grep -q "needs --calib-file" $tmp/err && [ ! -e $tmp/q2.gguf ]'
exit $fail
