#!/bin/sh
# Messages a user meets on a first try, each checked by exit status and text:
# - a directory that holds no model (no config.json): run and info exit 1 and say it is not a model
#   directory and what a model is (config.json with *.safetensors, or a .gguf file);
set -u
BUILD=${BUILD:-build}
PXQ=$BUILD/pxq
D=tests/data
fail=0
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

exit $fail
