#!/usr/bin/env bash
# scripts/format.sh [--check]: formats every tracked C and CUDA source with
# clang-format and .clang-format (--check: changes nothing, lists the files
# that are not formatted and exits 1). The rule is pinned to Debian 12's
# clang-format 14 (.clang-format says so); another major version formats a
# few constructs differently, so --check then says so and skips (exit 0).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format.sh: clang-format not found (scripts/deps.sh installs it)" >&2; exit 1; }
major=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
if [[ ${1:-} == --check ]]; then
    if [[ $major != 14 ]]; then
        echo "format.sh: clang-format $major, the rule is pinned to 14: not checked" >&2
        exit 0
    fi
    bad=()
    for f in "${files[@]}"; do
        clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
    done
    if ((${#bad[@]})); then
        echo "format.sh: ${#bad[@]} of ${#files[@]} files are not formatted (scripts/format.sh fixes them):" >&2
        printf '  %s\n' "${bad[@]}" >&2
        exit 1
    fi
    echo "format.sh: all ${#files[@]} C and CUDA files formatted"
    exit 0
fi
clang-format -i "${files[@]}"
