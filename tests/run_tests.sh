#!/bin/sh
# Runs every unit/model test binary in $BUILD/tests and the CLI and bad-input scripts, as independent
# suites in parallel: at most $PXQ_TEST_JOBS at a time (default: nproc; 1: one after the other, as
# before), each on its share of the CPUs (taskset), each suite's output captured
# to a file and printed whole, in the fixed order below, as soon as it and the suites before it are
# done. Ends with one line "N passed, N failed" (suites), after the names of those that failed; the
# exit status is 1 if any failed.
# Usage: tests/run_tests.sh [cuda]   (cuda: only the tests that exercise the CUDA backend, one at a time)
BUILD=${BUILD:-build}
export BUILD
mode=${1:-cpu}
JOBS=${PXQ_TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}
[ "$mode" = cuda ] && JOBS=${PXQ_TEST_JOBS:-1} # one GPU: the CUDA suites one at a time
out=$(mktemp -d "${TMPDIR:-/tmp}/pxq-tests.XXXXXX") || exit 1
runner=
trap 'rm -rf "$out"' EXIT
trap '[ -n "$runner" ] && kill $runner 2>/dev/null; exit 130' INT TERM

# the suites, in print order
: >"$out/list"
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d) continue ;; esac
    if [ "$mode" = cuda ]; then case "$t" in *cuda*) ;; *) continue ;; esac; fi
    echo "$t" >>"$out/list"
done
if [ "$mode" = cuda ]; then scripts="tests/cuda_*.sh"; else scripts="tests/cli_*.sh tests/bad_input.sh"; fi
for s in $scripts; do [ -f "$s" ] && echo "$s" >>"$out/list"; done

# The CPUs to share out: with JOBS at most their number, slot k of xargs runs its suites under
# taskset on CPUs k*PER .. k*PER+PER-1 (PER = CPUs / JOBS), so pxq's default threads (its affinity
# mask) and the server tests' PXQ_THREADS fit the slot: two suites with a spinning thread pool each on
# every core ran slower than one after the other.
cpus=$(awk '/^Cpus_allowed_list/ { n = split($2, r, ","); for (i = 1; i <= n; i++) { m = split(r[i], ab, "-");
        for (c = ab[1]; c <= (m > 1 ? ab[2] : ab[1]); c++) print c } }' /proc/self/status 2>/dev/null | tr '\n' ' ')
n_cpu=$(echo $cpus | wc -w)
per=0
if [ "$n_cpu" -ge "$JOBS" ] && command -v taskset >/dev/null 2>&1; then per=$((n_cpu / JOBS)); fi
export PXQ_TEST_CPUS="$cpus" PXQ_TEST_PER=$per

# Started longest first, so the last to finish is a short one: the suites of over 10 CPU seconds in
# the order of their cost (CPU seconds on one core, 2026-12-07: cli_server 118, cli_kvcache 74,
# cli_qwen35 69, test_spec 68, cli_core 68, cli_quantize 14, cli_messages 12), then the other
# scripts, then the other binaries. Each writes N.log and then N.rc (its exit status and seconds),
# by a rename: the printer below reads N.rc as soon as it exists, and a file written in place could
# be read empty (a pass printed as "FAILED: ... (exit )").
n=0
while read -r s; do
    n=$((n + 1))
    case "$s" in
        tests/cli_server.sh) p=0 ;;
        tests/cli_kvcache.sh) p=1 ;;
        tests/cli_qwen35.sh) p=2 ;;
        */test_spec) p=3 ;;
        tests/cli_core.sh) p=4 ;;
        tests/cli_quantize.sh) p=5 ;;
        tests/cli_messages.sh) p=6 ;;
        tests/*.sh) p=7 ;;
        *) p=8 ;;
    esac
    echo "$p $n $s"
done <"$out/list" | sort -n -k1,1 -k2,2 | while read -r _ i s; do printf '%s\0%s\0' "$i" "$s"; done |
    xargs -0 -n 2 -P "$JOBS" --process-slot-var=SLOT sh -c '
        o=$0 i=$1 s=$2
        set --
        if [ "$PXQ_TEST_PER" -gt 0 ]; then
            pin=$(echo $PXQ_TEST_CPUS | tr " " "\n" | sed -n "$((SLOT * PXQ_TEST_PER + 1)),$((SLOT * PXQ_TEST_PER + PXQ_TEST_PER))p" | paste -sd, -)
            [ -n "$pin" ] && set -- taskset -c "$pin" && export PXQ_THREADS=$PXQ_TEST_PER
        fi
        t0=$(date +%s.%N)
        case "$s" in *.sh) "$@" sh "$s" ;; *) "$@" "$s" ;; esac >"$o/$i.log" 2>&1 </dev/null
        rc=$?
        echo "$rc $(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN { printf \"%.1f\", b - a }")" >"$o/$i.rc.part" &&
            mv "$o/$i.rc.part" "$o/$i.rc"' "$out" &
runner=$!

# print in order as the suites finish
pass=0 nfail=0 failed=""
i=0
while read -r s; do
    i=$((i + 1))
    while [ ! -f "$out/$i.rc" ]; do
        if ! kill -0 $runner 2>/dev/null && [ ! -f "$out/$i.rc" ]; then
            echo "(did not run)" >"$out/$i.log"
            echo "127 0" >"$out/$i.rc"
        fi
        sleep 0.1
    done
    read -r rc secs <"$out/$i.rc"
    name=${s#"$BUILD"/tests/}
    echo "== $name (${secs:-?} s)"
    cat "$out/$i.log"
    if [ "$rc" = 0 ]; then
        pass=$((pass + 1))
    else
        echo "FAILED: $name (exit $rc)"
        nfail=$((nfail + 1))
        failed="$failed $name"
    fi
done <"$out/list"
wait $runner
[ $nfail = 0 ] || echo "failed:$failed"
echo "$pass passed, $nfail failed"
[ $nfail = 0 ]
