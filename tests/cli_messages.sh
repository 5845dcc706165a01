#!/bin/sh
# Messages a user meets on a first try, each checked by exit status and text:
# - a directory that holds no model (no config.json): run and info exit 1 and say it is not a model
#   directory and what a model is (config.json with *.safetensors, or a .gguf file);
# - --gpu-mem (run) and --gpu-memory-utilization (serve) with the CPU backend: one warning line on
#   stderr, and the command goes on (exit 0); no warning without the flag;
# - a directory given for --config or perplexity -f, and a PXQ_MODEL that names nothing: exit 1 and
#   said so; --gpu-mem's unit in lower case is taken;
# - a model path longer than 1023 bytes: exit 1, its length and the limit named;
# - pxq quantize on a calibration text shorter than one --calib-seq-len sequence: a warning that
#   names the token count, and the file is still written; none for a text long enough.
D=tests/data
. tests/lib.sh
tmp=$(mktemp -d /tmp/pxq-cli-messages.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# a directory that is not a model
mkdir "$tmp/empty" "$tmp/other"
printf 'notes\n' > "$tmp/other/README.txt"
not_model() { # name, args...
    name=$1; shift
    $PXQ "$@" > /dev/null 2> "$tmp/err"; rc=$?
    check "$name: exit 1, one line: not a model directory, config.json, *.safetensors, .gguf" \
        '[ $rc = 1 ] && grep -q "not a model directory" "$tmp/err" && grep -q "config.json" "$tmp/err" &&
         grep -q "\*\.safetensors" "$tmp/err" && grep -q "\.gguf" "$tmp/err" && [ $(wc -l < "$tmp/err") = 1 ]'
}
not_model "info on an empty directory" info "$tmp/empty"
not_model "run -m an empty directory" run -m "$tmp/empty" -p hi -n 1
not_model "info on a directory with a README alone" info "$tmp/other"

# GPU memory flags on the CPU backend
warned() { [ "$(grep -c -e "$1 has no effect on the CPU backend" "$tmp/err")" = 1 ]; }
for dev in "" "--device cpu"; do
    out=$($PXQ run $dev --gpu-mem 1GiB -p "Once upon a time" -n 4 --temp 0 2> "$tmp/err"); rc=$?
    check "run ${dev:+$dev }--gpu-mem 1GiB: exit 0, text, one warning line" '[ $rc = 0 ] && [ -n "$out" ] && warned --gpu-mem'
done
$PXQ run -p "Once upon a time" -n 4 --temp 0 > /dev/null 2> "$tmp/err"
check "run without --gpu-mem: no warning" '! grep -q "warning" "$tmp/err"'
$PXQ serve --port 0 --gpu-memory-utilization 0.5 > /dev/null 2> "$tmp/err" &
pid=$!
i=0
while [ $i -lt 300 ] && kill -0 $pid 2>/dev/null && ! grep -q "listening on" "$tmp/err"; do sleep 0.05; i=$((i + 1)); done
up=0; grep -q "listening on" "$tmp/err" && up=1
kill -TERM $pid 2>/dev/null; wait $pid; rc=$?
check "serve --gpu-memory-utilization 0.5 on the CPU: one warning line, serves, exits 0 on SIGTERM" \
    '[ $up = 1 ] && [ $rc = 0 ] && warned --gpu-memory-utilization'

# a directory where a file is meant, a PXQ_MODEL that names nothing, a lower-case size unit
$PXQ plan --load-format dummy --config presets --dtype q4_0 > /dev/null 2> "$tmp/err"; rc=$?
check "plan --config DIRECTORY: exit 1, says it is a directory, not a JSON file" \
    '[ $rc = 1 ] && grep -q "presets: is a directory, not a JSON file" "$tmp/err"'
$PXQ perplexity -f presets > /dev/null 2> "$tmp/err"; rc=$?
check "perplexity -f DIRECTORY: exit 1, says it is a directory" '[ $rc = 1 ] && grep -q "presets: is a directory, not a text file" "$tmp/err"'
for cmd in "run -p hi -n 1" "info" "tokenize hi"; do
    PXQ_MODEL=$tmp/nosuch.gguf $PXQ $cmd > /dev/null 2> "$tmp/err"; rc=$?
    check "$cmd with PXQ_MODEL naming nothing: exit 1, says to fix PXQ_MODEL" '[ $rc = 1 ] && grep -q "fix PXQ_MODEL" "$tmp/err"'
done
$PXQ run --gpu-mem 0GiB -p hi -n 1 > /dev/null 2> "$tmp/err"; rc=$?
check "--gpu-mem 0GiB: exit 2, must be more than 0" '[ $rc = 2 ] && grep -q "must be more than 0" "$tmp/err"'
$PXQ bench --gpu-mem 1000T > /dev/null 2> "$tmp/err"; rc=$?
check "--gpu-mem 1000T: exit 2, says it is more than the largest size, not that the unit is missing" \
    '[ $rc = 2 ] && grep -q "1000T: more than 1e+15 bytes" "$tmp/err"'
if [ -w /dev/full ]; then
    $PXQ run -p "Once upon a time" -n 200 --ignore-eos --temp 0 > /dev/full 2> "$tmp/err"; rc=$?
    check "run > /dev/full: exit 1, stops at the first failed write (decodes 1 token, not 200)" \
        '[ $rc = 1 ] && grep -q "error writing standard output" "$tmp/err" && grep -q "decode 1 tokens" "$tmp/err"'
fi
$PXQ plan --load-format dummy --config presets/qwen3-32b.json --gpu-mem 24gib > "$tmp/out" 2> "$tmp/err"; rc=$?
check "--gpu-mem 24gib (the unit in lower case): taken as 24GiB" '[ $rc = 0 ] && grep -q "24.00 GiB" "$tmp/out"'

# a model path longer than model_open takes: a clear error, not a name cut short
long=$tmp
for i in 1 2 3 4 5; do long=$long/$(printf 'd%.0s' $(seq 220)); done
mkdir -p "$long" && ln -s "$(pwd)/$D/gguf/tiny-qwen3-Q4_0.gguf" "$long/m.gguf"
$PXQ info "$long/m.gguf" > /dev/null 2> "$tmp/err"; rc=$?
check "a model path over 1023 bytes: exit 1, says how long and the limit" \
    '[ $rc = 1 ] && grep -q "model path of [0-9]* bytes: at most 1023 are supported" "$tmp/err"'

# a calibration text shorter than one sequence
printf 'To be, or not to be, that is the question.\n' > "$tmp/short.txt"
$PXQ quantize --model $D/tiny-qwen3 --method awq --calib-file "$tmp/short.txt" --output "$tmp/awq.gguf" > /dev/null 2> "$tmp/err"; rc=$?
check "awq on a 1-line text: exit 0, file written, warning names the tokens and --calib-seq-len 512" \
    '[ $rc = 0 ] && [ -s "$tmp/awq.gguf" ] &&
     grep -Eq "warning: calibration file .*short.txt gives only [0-9]+ tokens, fewer than one sequence of --calib-seq-len 512" "$tmp/err"'
$PXQ quantize --model $D/tiny-qwen3 --method awq --calib-file $D/calib-shakespeare.txt --calib-size 2 --calib-seq-len 64 \
    --output "$tmp/awq2.gguf" > /dev/null 2> "$tmp/err"; rc=$?
check "awq on a text longer than a sequence: exit 0, no warning" '[ $rc = 0 ] && ! grep -q "warning" "$tmp/err"'

exit $fail
