#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the normal build and
# the address+undefined sanitizer build. Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh

JOBS="${GIFT_JOBS:-2}"

# One formatting rule (.clang-format, clang-format 14): a file that does not
# follow it fails here, before anything is built; scripts/format.sh fixes it.
scripts/format.sh --check
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

run_build() {
  local dir="$1"; shift
  echo "== configure $dir ($*)"
  cmake -S . -B "$dir" "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
  echo "== build $dir"
  cmake --build "$dir" -j "$JOBS"
  echo "== test $dir"
  ctest --test-dir "$dir" --output-on-failure -j "$JOBS"
}

mkdir -p build
run_build build -DCMAKE_BUILD_TYPE=RelWithDebInfo
# The sanitizer build skips CUDA: nvcc objects are not instrumented.
run_build build-asan -DCMAKE_BUILD_TYPE=Debug -DGIFT_SANITIZE=ON -DGIFT_WITH_CUDA=OFF

# Fuzzing: the libFuzzer harnesses of tests/fuzz (clang, ASan, UBSan), built
# on their own, run from the committed seed corpus for GIFT_FUZZ_SECONDS
# (60) in all; a crash, leak or timeout fails the script and leaves the input
# in build-fuzz/fuzz-artifacts/ (add it to tests/fuzz/regressions/).
echo "== configure build-fuzz (clang, -fsanitize=fuzzer,address,undefined)"
command -v clang >/dev/null || { echo "clang not found: the fuzz run needs it" >&2; exit 1; }
cmake -C tests/fuzz/fuzz.cmake -S . -B build-fuzz >build-fuzz.configure.log 2>&1 ||
  { cat build-fuzz.configure.log; exit 1; }
echo "== build build-fuzz"
cmake --build build-fuzz -j "$JOBS" --target fuzz_reader fuzz_shard
echo "== fuzz for ${GIFT_FUZZ_SECONDS:-60} s"
tests/fuzz/run.sh build-fuzz "${GIFT_FUZZ_SECONDS:-60}"
echo "== all tests passed"
