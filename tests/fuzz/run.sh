#!/usr/bin/env bash
# run.sh BUILD_DIR SECONDS [HARNESS...]: fuzzes each harness (default:
# reader and shard) for SECONDS / number-of-harnesses seconds, starting from
# a scratch copy of its committed seed corpus, and fails when libFuzzer
# reports a crash, a leak or a timeout. The crashing input is kept in
# BUILD_DIR/fuzz-artifacts/; copy it to tests/fuzz/regressions/HARNESS/ to
# make it a regression test. Prints libFuzzer's last status line per harness.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: run.sh BUILD_DIR SECONDS [HARNESS...]}
secs=${2:?usage: run.sh BUILD_DIR SECONDS [HARNESS...]}
shift 2
harnesses=("$@")
[[ ${#harnesses[@]} -gt 0 ]] || harnesses=(reader shard)
per=$((secs / ${#harnesses[@]}))
[[ $per -ge 1 ]] || per=1
bin=$(cd "$bin" && pwd)
art=$bin/fuzz-artifacts
mkdir -p "$art"
work=$(mktemp -d "${TMPDIR:-/tmp}/gift-fuzz-XXXXXX")
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1
status=0
for h in "${harnesses[@]}"; do
    exe=$bin/tests/fuzz/fuzz_$h
    [[ -x $exe ]] || { echo "run.sh: $exe not built (configure with -C tests/fuzz/fuzz.cmake)" >&2; exit 1; }
    mkdir -p "$work/$h"
    cp "$here/corpus/$h"/* "$work/$h/"
    log=$bin/fuzz-$h.log
    echo "== fuzz $h for ${per}s (log $log)"
    if "$exe" -max_total_time="$per" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
        -print_final_stats=1 -artifact_prefix="$art/$h-" \
        "$work/$h" "$here/regressions/$h" >"$log" 2>&1; then
        grep -E '^#[0-9]+.*(DONE|pulse)' "$log" | tail -n 1 || true
        grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$log" || true
    else
        echo "run.sh: fuzz_$h FAILED; the input is in $art/:" >&2
        grep -E 'ERROR|SUMMARY|Test unit written' "$log" >&2 || tail -n 40 "$log" >&2
        status=1
    fi
done
exit $status
