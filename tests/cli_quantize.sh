#!/bin/sh
# pxq quantize through the binary: bad input gives a clear error and leaves no output (nor temp)
# file: a missing model directory, an unsupported dtype or group size, int8 --asym, empty and invalid
# calibration files, a calibrated method without one, an output directory that does not exist, an
# output path that is a named pipe or a symbolic link (both left as they were), an output path that
# is a file of the input (a shard, config.json, the calibration text: refused, the input intact), a
# named pipe as a shard, tokenizer.json or calibration file (refused, no hang), a
# full disk (a file-size limit: SIGXFSZ ignored, write fails with EFBIG), SIGINT and SIGTERM in the
# middle of writing. Then GPTQ on a small calibration text (plain and JSON): the metadata records
# the method, group size and the file's sha256 (as sha256sum computes it), the output loads and
# runs, and against the BF16 model its KL divergence is below RTN's on the same chunks; the model
# against itself gives KL 0 and top-1 agreement 1.
D=tests/data
M=$D/tiny-qwen3
. tests/lib.sh
tmp=$(mktemp -d /tmp/pxq-cli-quantize.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/out.gguf
none_left() { [ ! -e "$out" ] && [ -z "$(ls "$tmp" | grep 'out.gguf.tmp')" ]; }

# bad input: exit status, the message, and no file left
bad() { # name, expected status, message regex, args...
    name=$1; want=$2; re=$3; shift 3
    "$PXQ" quantize "$@" > "$tmp/stdout" 2> "$tmp/stderr"; rc=$?
    check "$name: exit $want, says '$re', leaves no file" \
        '[ $rc = $want ] && grep -Eq "$re" "$tmp/stderr" && [ $(wc -l < "$tmp/stderr") -le 2 ] && none_left'
}
printf '' > $tmp/empty.txt
printf '   \n\n' > $tmp/blank.txt
printf '["unterminated' > $tmp/bad.json
printf '[]' > $tmp/emptylist.json
printf '["ok", 3]' > $tmp/notstr.json
bad "missing model dir" 1 "no such model directory" --model $tmp/nope --output $out
bad "a GGUF file as the model" 1 "a file; pxq quantize reads an HF model directory" --model models/tiny-qwen3-Q4_K_M.gguf --output $out
bad "unsupported dtype" 2 "unsupported dtype 'int3'" --model $M --dtype int3 --output $out
bad "group size 64" 2 "group size 64: no GGUF type" --model $M --group-size 64 --output $out
bad "int8 asym" 2 "int8 --asym: no GGUF weight type" --model $M --dtype int8 --asym --output $out
bad "q4_0 with --asym" 2 "dtype q4_0 is symmetric: drop --asym" --model $M --dtype q4_0 --asym --output $out
bad "unknown method" 2 "unknown method" --model $M --method foo --output $out
bad "gptq without calibration" 2 "needs --calib-file" --model $M --method gptq --output $out
bad "empty calibration file" 1 "is empty" --model $M --method gptq --calib-file $tmp/empty.txt --output $out
bad "blank calibration file" 1 "is empty" --model $M --method awq --calib-file $tmp/blank.txt --output $out
bad "missing calibration file" 1 "nope.txt" --model $M --method gptq --calib-file $tmp/nope.txt --output $out
bad "invalid JSON calibration" 1 "not valid JSON" --model $M --method gptq --calib-file $tmp/bad.json --output $out
bad "empty JSON list" 1 "list of texts is empty" --model $M --method gptq --calib-file $tmp/emptylist.json --output $out
bad "JSON item not a string" 1 "item 1 is not a string" --model $M --method gptq --calib-file $tmp/notstr.json --output $out
bad "output in a missing directory" 1 "does not exist" --model $M --output $tmp/no/such/dir/out.gguf
mkfifo $tmp/fifo; printf 'x' > $tmp/target; ln -s $tmp/target $tmp/link
bad "output a named pipe" 1 "is not a regular file" --model $M --output $tmp/fifo
bad "output a symbolic link" 1 "is not a regular file" --model $M --output $tmp/link
check "the pipe and the link are left as they were" '[ -p $tmp/fifo ] && [ -L $tmp/link ] && [ "$(cat $tmp/target)" = x ]'
# an output that is a file of the input (the rename at the end would replace it): refused before
# anything is written, the input left byte for byte; by device and inode, so a hard link or a
# "dir/./name" is caught too. A new file in the model directory is fine, and so is writing it again.
cp -r $M $tmp/hfq && ln $tmp/hfq/model-00003-of-00003.safetensors $tmp/hardlink.safetensors
cp $D/calib-shakespeare.txt $tmp/calib.txt && cp models/tiny-qwen3-Q4_K_M.gguf $tmp/m.gguf
sums() { (cd $tmp && sha256sum hfq/* calib.txt m.gguf); }
before=$(sums)
for o in hfq/model-00002-of-00003.safetensors hfq/config.json hfq/./model.safetensors.index.json hfq/tokenizer.json \
         hfq/chat_template.jinja hardlink.safetensors; do
    "$PXQ" quantize --model $tmp/hfq --no-progress --output $tmp/$o > /dev/null 2> $tmp/stderr; rc=$?
    check "output $o, a file of the input model: exit 1, says so, writes nothing" \
        '[ $rc = 1 ] && grep -q "is the same file as the input model.s .*would replace it" $tmp/stderr && [ "$(sums)" = "$before" ] && [ -z "$(ls $tmp/hfq | grep .tmp.)" ]'
done
"$PXQ" quantize --model $tmp/hfq --method gptq --calib-file $tmp/calib.txt --output $tmp/calib.txt > /dev/null 2> $tmp/stderr; rc=$?
check "output the calibration file: exit 1, says so, the file unchanged" \
    '[ $rc = 1 ] && grep -q "is the same file as the calibration file" $tmp/stderr && [ "$(sums)" = "$before" ]'
gsum=$(sha256sum < $tmp/m.gguf)
"$PXQ" quantize --model $tmp/m.gguf --output $tmp/m.gguf > /dev/null 2> $tmp/stderr; rc=$?
check "a GGUF model as its own output: exit 1 (--model takes an HF directory), the file unchanged" \
    '[ $rc = 1 ] && grep -q "m.gguf" $tmp/stderr && [ "$(sha256sum < $tmp/m.gguf)" = "$gsum" ]'
"$PXQ" quantize --model $tmp/hfq --no-progress --output $tmp/hfq/new-Q4_0.gguf > /dev/null 2>&1 && r1=0 || r1=1
"$PXQ" quantize --model $tmp/hfq --no-progress --output $tmp/hfq/new-Q4_0.gguf > /dev/null 2>&1 && r2=0 || r2=1
check "a new file in the model directory, and again over it: exit 0, the output loads" \
    '[ $r1 = 0 ] && [ $r2 = 0 ] && "$PXQ" info $tmp/hfq/new-Q4_0.gguf > /dev/null 2>&1'
rm -f $tmp/hfq/new-Q4_0.gguf
# a named pipe in place of a shard, tokenizer.json or the calibration text: refused by name, no wait
# for a writer (timeout: a regression fails instead of hanging)
for f in model-00001-of-00003.safetensors tokenizer.json; do
    rm -rf $tmp/piped && cp -r $M $tmp/piped && rm $tmp/piped/$f && mkfifo $tmp/piped/$f
    timeout 30 "$PXQ" quantize --model $tmp/piped --no-progress --output $out > /dev/null 2> $tmp/stderr; rc=$?
    check "$f a named pipe: exit 1, 'not a regular file', no file left" \
        '[ $rc = 1 ] && grep -q "piped/$f: not a regular file" $tmp/stderr && none_left'
done
rm -rf $tmp/piped
timeout 30 "$PXQ" quantize --model $M --method gptq --calib-file $tmp/fifo --output $out > /dev/null 2> $tmp/stderr; rc=$?
check "--calib-file a named pipe: exit 1, 'not a regular file', no file left" \
    '[ $rc = 1 ] && grep -q "fifo: not a regular file" $tmp/stderr && none_left'
rm -f $out # (a regression that wrote it would fail the checks below as well)
bad "bad --output-type" 2 "unsupported type" --model $M --output-type q3_k --output $out
# the GGUF type names of bench and plan: q4_1 is int4 --asym
"$PXQ" quantize --model $M --dtype q4_1 --no-progress --output $tmp/q41.gguf > /dev/null 2>&1; rc=$?
check "--dtype q4_1: exit 0, the weights are Q4_1" '[ $rc = 0 ] && "$PXQ" info $tmp/q41.gguf 2>/dev/null | grep -q "^ *q4_1 "'
"$PXQ" quantize --model $M --dtype Q8_0 --no-progress --output $tmp/q8.gguf > /dev/null 2>&1; rc=$?
check "--dtype Q8_0 (upper case): exit 0, the weights are Q8_0" '[ $rc = 0 ] && "$PXQ" info $tmp/q8.gguf 2>/dev/null | grep -q "^ *q8_0 "'

# a full disk: a 1 MiB file-size limit (the file is 5.5 MiB)
( ulimit -f 2048; exec "$PXQ" quantize --model $M --output $out ) > /dev/null 2> $tmp/stderr; rc=$?
check "file-size limit: exit 1, 'File too large', no file left" '[ $rc = 1 ] && grep -q "File too large" $tmp/stderr && none_left'

# signals while writing (GPTQ's write phase takes seconds): the temp file appears, then goes with the process
for sig in INT TERM; do
    "$PXQ" quantize --model $M --method gptq --calib-file $D/calib-shakespeare.txt --calib-size 1 --calib-seq-len 64 \
        --output $out > /dev/null 2>&1 &
    pid=$!
    seen=0; i=0
    while [ $i -lt 1500 ] && kill -0 $pid 2>/dev/null; do
        if ls "$tmp" | grep -q 'out.gguf.tmp'; then seen=1; break; fi
        sleep 0.02; i=$((i + 1))
    done
    kill -$sig $pid 2>/dev/null; wait $pid 2>/dev/null; rc=$? # (the shell's "Terminated" line not shown)
    check "SIG$sig while writing: temp file seen, process killed by it, no file left" '[ $seen = 1 ] && [ $rc -gt 128 ] && none_left'
done

# GPTQ on a small calibration text
sum=$(sha256sum $D/calib-shakespeare.txt | cut -d' ' -f1)
"$PXQ" quantize --model $M --method gptq --calib-file $D/calib-shakespeare.txt --calib-size 8 --calib-seq-len 256 \
    --output $tmp/gptq.gguf > /dev/null 2> $tmp/stderr
check "gptq on a calibration excerpt: exit 0" '[ $? = 0 ] && [ -s $tmp/gptq.gguf ]'
"$PXQ" info -v $tmp/gptq.gguf > $tmp/info 2>&1
check "metadata: method gptq, group size 32, calibration sha256 $sum" \
    'grep -q "pxq.quantize.method *\"gptq\"" $tmp/info && grep -q "pxq.quantize.group_size *32" $tmp/info &&
     grep -q "pxq.quantize.calib_sha256 *\"$sum\"" $tmp/info && grep -q "q4_0 *42" $tmp/info'
"$PXQ" quantize --model $M --method gptq --calib-file $D/calib-shakespeare.json --calib-size 4 --calib-seq-len 128 \
    --output $tmp/gptq-json.gguf > /dev/null 2> $tmp/stderr
check "gptq with a JSON list of texts: exit 0, file loads" '[ $? = 0 ] && "$PXQ" info $tmp/gptq-json.gguf > /dev/null'
"$PXQ" quantize --model $M --output $tmp/rtn.gguf > /dev/null 2>&1
kl() { "$PXQ" perplexity -m "$1" --kl-base $M -f $D/frankenstein.txt -c 256 --chunks 4 --json 2>/dev/null | tail -n 1; }
field() { echo "$1" | sed -n "s/.*\"$2\": *\([0-9.e+-]*\).*/\1/p"; }
j_rtn=$(kl $tmp/rtn.gguf); j_gptq=$(kl $tmp/gptq.gguf); j_self=$(kl $M)
k_rtn=$(field "$j_rtn" kld); k_gptq=$(field "$j_gptq" kld)
echo "     KLD vs BF16 on 4 chunks: RTN $k_rtn, GPTQ $k_gptq; top-1 RTN $(field "$j_rtn" top1), GPTQ $(field "$j_gptq" top1)"
check "GPTQ's KL divergence ($k_gptq) is below RTN's ($k_rtn)" 'awk -v a="$k_gptq" -v b="$k_rtn" "BEGIN { exit !(a > 0 && a < b) }"'
check "the model against itself: KL 0, top-1 1" '[ "$(field "$j_self" kld)" = 0.00000000 ] && [ "$(field "$j_self" top1)" = 1.000000 ]'
"$PXQ" run -m $tmp/gptq.gguf -p "First Citizen:" -n 8 > $tmp/run 2>&1
check "the GPTQ file generates text" '[ $? = 0 ] && [ -s $tmp/run ]'

exit $fail
