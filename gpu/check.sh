#!/bin/sh
# gpu/check.sh: the device check of the CUDA twins, in one go on a GPU machine.
#
#   gpu/check.sh [BUILD_DIR]      (default build-gpu-check; GIFT_CHECK_MIB=256)
#
# 1. configures and builds the GPU targets (Release, nvcc for sm_80/90/100),
# 2. runs the GPU tests (every twin against the CPU codec, bit for bit for
#    encode/decode; by normalised error for the cuBLAS transform and sketch;
#    libgiftclient's device tensors end to end against giftd, test_client_device;
#    plus the emulated ones, test_gpu_emu* and test_client_device_emu, which
#    need no device),
# 3. runs `gift-bench codec --gpu`: encode/decode GB/s of every format beside
#    a device-to-device copy measured in the same run, a bit-for-bit check on
#    the benchmark tensor, and the transform for k = 8, 32, 128,
# and prints the benchmark's table (also in BUILD_DIR/check-gpu.md, JSON in
# bench/out/codec_gpu.json). Exits 0 when everything passed, 77 when the
# machine has no CUDA device (nothing was measured), 1 otherwise.
# Meant to finish in well under 5 minutes on one GPU with a few cores.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-gpu-check}
mib=${GIFT_CHECK_MIB:-256}
jobs=$(nproc 2>/dev/null || echo 4)
start=$(date +%s)

say() { printf 'gpu/check.sh: %s\n' "$*" >&2; }

nvcc=""
for c in "${CUDACXX:-}" "$(command -v nvcc 2>/dev/null || true)" /usr/local/cuda/bin/nvcc; do
    if [ -n "$c" ] && [ -x "$c" ]; then nvcc=$c; break; fi
done
[ -n "$nvcc" ] || { say "no nvcc found: cannot build gpu/"; exit 1; }

gen=""
command -v ninja >/dev/null 2>&1 && gen="-G Ninja"
mkdir -p "$build" || exit 1
say "configure ($build, nvcc $nvcc)"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" $gen -DCMAKE_BUILD_TYPE=Release -DGIFT_WITH_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc" >"$build/check-configure.log" 2>&1 ||
    { tail -30 "$build/check-configure.log"; say "configure failed"; exit 1; }
say "build the GPU tests (-j$jobs)"
cmake --build "$build" -j "$jobs" \
    --target test_gpu_probe test_gpu_codec test_gpu_transform test_gpu_pipeline \
    test_gpu_emu test_gpu_emu_transform test_gpu_emu_pipeline \
    test_client_device test_client_device_emu \
    >"$build/check-build.log" 2>&1 ||
    { tail -40 "$build/check-build.log"; say "build failed"; exit 1; }
# gift-bench links the whole project (giftd, libgiftclient): build it apart,
# so a break elsewhere still leaves the tests to run.
bench=1
say "build gift-bench"
cmake --build "$build" -j "$jobs" --target gift-bench >>"$build/check-build.log" 2>&1 ||
    { tail -20 "$build/check-build.log"; say "gift-bench failed to build"; bench=0; }
say "built in $(( $(date +%s) - start )) s"

"$build/tests/gpu/test_gpu_probe"
rc=$?
if [ "$rc" -eq 77 ]; then
    say "no CUDA device on this machine: the GPU tests and figures are skipped"
    exit 77
fi
[ "$rc" -eq 0 ] || { say "the device probe failed"; exit 1; }

status=0
say "GPU tests"
ctest --test-dir "$build" -R '^test_gpu_|^test_client_device' --output-on-failure --timeout 240 ||
    status=1

if [ "$bench" -eq 1 ]; then
    say "gift-bench codec --gpu --mib $mib"
    (cd "$root" && "$build/bench/gift-bench" codec --gpu --mib "$mib"
     echo "exit $?" >"$build/check-gpu.rc") | tee "$build/check-gpu.md"
    grep -qx 'exit 0' "$build/check-gpu.rc" ||
        { say "gift-bench codec --gpu: $(cat "$build/check-gpu.rc")"; status=1; }
else
    status=1
fi

say "done in $(( $(date +%s) - start )) s: $([ $status -eq 0 ] && echo PASS || echo FAIL)" \
    "(performance targets: see the table's PASS/FAIL column)"
exit $status
