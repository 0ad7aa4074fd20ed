#!/usr/bin/env bash
# layout_check.sh SOURCE_DIR: every source file of the libraries and
# programs (the .c, .cu and .py files of common/ codec/ proto/ server/
# client/ gpu/ tools/ python/gift/, and tools/giftrun) is named in the
# Layout section of docs/ARCHITECTURE.md, so that the table a newcomer reads
# matches the tree. Prints every file missing and exits 1, or prints a
# count and exits 0.
set -euo pipefail
src=${1:?usage: layout_check.sh SOURCE_DIR}
cd "$src"
doc=docs/ARCHITECTURE.md
[[ -f $doc ]] || { echo "layout_check: FAIL: $doc is missing" >&2; exit 1; }
layout=$(sed -n '/^## Layout/,/^## /p' "$doc")
[[ -n $layout ]] || { echo "layout_check: FAIL: $doc has no '## Layout' section" >&2; exit 1; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    files=$(git ls-files common codec proto server client gpu tools python/gift)
else
    files=$(find common codec proto server client gpu tools python/gift -type f | sort)
fi
missing=() n=0
while IFS= read -r f; do
    case $f in
    *.c | *.cu | *.py | tools/giftrun) ;;
    *) continue ;;
    esac
    n=$((n + 1))
    b=$(basename "$f")
    grep -qF "\`$b\`" <<<"$layout" || missing+=("$f")
done <<<"$files"
if ((${#missing[@]})); then
    echo "layout_check: FAIL: ${#missing[@]} of $n source files are not named (as \`name\`) in the Layout section of $doc:" >&2
    printf '  %s\n' "${missing[@]}" >&2
    exit 1
fi
echo "layout_check: ok: all $n source files are named in $doc's Layout section"
