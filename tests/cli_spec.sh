#!/bin/sh
# Speculative decoding through the binary: `pxq run --spec ngram|draft|mtp` prints the same text as
# plain greedy decoding (tiny-qwen35, whose DeltaNet state rolls back; tiny-qwen3 drafting for it; an
# untrained MTP head) and an acceptance line on stderr; `bench --spec-verify` prints its pass table;
# bad flags are refused with a message naming the problem and exit 2.
. tests/lib.sh
M=tests/data/qwen35/tiny-qwen35
P="Once upon a time there was a little girl who lived in a village. Once upon a time there was a"
plain=$($PXQ run -m $M -p "$P" -n 40 --temp 0 -t 2 2>/dev/null)
ng=$($PXQ run -m $M -p "$P" -n 40 --temp 0 -t 2 --spec ngram --spec-k 4 2>/tmp/pxq_spec_err.$$)
check "--spec ngram: the plain greedy text" '[ -n "$plain" ] && [ "$ng" = "$plain" ]'
check "--spec ngram: acceptance on stderr" 'grep -q "speculation ngram k 4: [0-9]* passes, [0-9]* of [0-9]* drafts accepted" /tmp/pxq_spec_err.$$'
dr=$($PXQ run -m $M -p "$P" -n 40 --temp 0 -t 2 --spec draft --model-draft tests/data/tiny-qwen3 -md tests/data/tiny-qwen3 2>/dev/null)
check "--spec draft: the plain greedy text" '[ "$dr" = "$plain" ]'
b=$($PXQ bench --load-format dummy --config tests/data/dummy-tiny-qwen35.json -p 0 -n 0 --spec-verify 1,3 --spec-acceptance 0.5 -r 1 -t 2 2>&1)
check "bench --spec-verify: pass table with projection" 'printf "%s" "$b" | grep -q "^| 1 | 0 | 3 | [0-9.]* | [0-9.]* | 1.750 | [0-9.]* |$"'

# the MTP head's code paths with an untrained head (tools/make_untrained_mtp.py; the trained fixture is
# test_mtp's): greedy text equal to plain decoding for k 1 and 3, from the HF directory and from the
# GGUF pxq quantize writes of it (its nextn tensors), and bench's tg row with --spec mtp
T=$(mktemp -d)
if python3 tools/make_untrained_mtp.py $M $T/mtp >/dev/null; then
    m1=$($PXQ run -m $T/mtp -p "$P" -n 40 --temp 0 -t 2 --spec mtp --spec-k 1 2>/dev/null)
    m3=$($PXQ run -m $T/mtp -p "$P" -n 40 --temp 0 -t 2 --spec mtp --spec-k 3 2>$T/err)
    check "--spec mtp k 1 and 3 (untrained head): the plain greedy text" '[ "$m1" = "$plain" ] && [ "$m3" = "$plain" ]'
    check "--spec mtp: acceptance on stderr" 'grep -q "speculation mtp k 3: [0-9]* passes" $T/err'
    $PXQ quantize --model $T/mtp --dtype q8_0 --output $T/mtp.gguf >/dev/null 2>&1
    check "pxq quantize keeps the MTP layer" '$PXQ info $T/mtp.gguf 2>/dev/null | grep -q "MTP layers 1"'
    gp=$($PXQ run -m $T/mtp.gguf -p "$P" -n 40 --temp 0 -t 2 2>/dev/null)
    gm=$($PXQ run -m $T/mtp.gguf -p "$P" -n 40 --temp 0 -t 2 --spec mtp --spec-k 2 2>/dev/null)
    check "--spec mtp from the GGUF: its plain greedy text" '[ -n "$gp" ] && [ "$gm" = "$gp" ]'
    bm=$($PXQ bench -m $T/mtp -p 0 -n 16 -d 8 -r 1 -t 2 --spec mtp --spec-k 2 2>&1)
    check "bench --spec mtp: a tg row with its acceptance" 'printf "%s" "$bm" | grep -q "tg16 spec mtp k2: acceptance [0-9.]*, [0-9.]* tokens/pass"'
else
    check "tools/make_untrained_mtp.py runs" false
fi
rm -rf $T

refused() { # NAME EXPECTED-MESSAGE ARGS...: exit status 2 and the message on stderr
    name=$1 msg=$2
    shift 2
    out=$("$@" 2>&1 >/dev/null)
    st=$?
    check "$name" '[ $st -eq 2 ] && printf "%s" "$out" | grep -q "$msg"'
}
refused "--spec mtp without an MTP layer" "has no MTP layer" $PXQ run -m $M -p hi --spec mtp
refused "--spec-k 0" "expects an integer in \[1, 16\]" $PXQ run -m $M -p hi --spec ngram --spec-k 0
refused "--spec-k 17" "expects an integer in \[1, 16\]" $PXQ run -m $M -p hi --spec ngram --spec-k 17
refused "a draft model with another vocabulary" "vocabulary has 512 tokens" $PXQ run -m $M -p hi --spec draft --model-draft tests/data/random-qwen2
refused "--spec draft without a draft model" "needs --model-draft" $PXQ run -m $M -p hi --spec draft
refused "--model-draft without --spec draft" "draft model of --spec draft" $PXQ run -m $M -p hi --model-draft tests/data/tiny-qwen3
refused "an unknown drafter" "unknown drafter 'eagle'" $PXQ run -m $M -p hi --spec eagle
refused "--spec-k without --spec" "give --spec" $PXQ run -m $M -p hi --spec-k 3
refused "--spec-acceptance without --spec-verify" "give --spec-verify" $PXQ bench --load-format dummy --config tests/data/dummy-tiny-qwen35.json --spec-acceptance 0.5
rm -f /tmp/pxq_spec_err.$$
exit $fail
