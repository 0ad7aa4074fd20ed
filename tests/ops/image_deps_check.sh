#!/usr/bin/env bash
# image_deps_check.sh DOCKERFILE BINARY...: no Docker engine runs here, so
# this proves the part of an image build that is most likely to break
# quietly: that the runtime stage of docker/Dockerfile installs every shared
# library giftd, giftctl and libgiftclient load. Each binary (built here, on
# the same Debian release as the image) is run through ldd; each library is
# mapped to its Debian package (dpkg -S); each package must be one that the
# stage's `apt-get install` line pulls in (apt-cache depends --recurse) or
# one of the release's required packages, which debian:*-slim holds.
# Sanitizer runtimes (an ASan build), the CUDA toolkit's libraries of a CUDA
# build (the image builds CUDA off) and the project's own libraries are
# left out. Exit 77 (skipped) without dpkg/apt-cache or package lists.
set -euo pipefail
dockerfile=${1:?usage: image_deps_check.sh DOCKERFILE BINARY...}
shift
skip() { echo "image_deps_check: SKIP: $*" >&2; exit 77; }
for t in dpkg-query apt-cache ldd; do command -v "$t" >/dev/null 2>&1 || skip "$t not found"; done
apt-cache show libc6 >/dev/null 2>&1 || skip "no apt package lists (apt-get update)"

# The packages of the runtime stage's apt-get install.
mapfile -t listed < <(awk '
    /^FROM / { stage = ($3 == "AS" || $3 == "as") ? $4 : "" }
    stage == "runtime" { buf = buf " " $0 }
    END {
        n = split(buf, w, /[ \t\\]+/)
        on = 0
        for (i = 1; i <= n; i++) {
            if (w[i] == "--no-install-recommends") { on = 1; continue }
            if (on && (w[i] == "&&" || w[i] == "")) { if (w[i] == "&&") on = 0; continue }
            if (on && w[i] !~ /^-/) print w[i]
        }
    }' "$dockerfile")
[[ ${#listed[@]} -gt 0 ]] || { echo "image_deps_check: FAIL: no apt-get install in the runtime stage" >&2; exit 1; }
echo "image_deps_check: runtime stage installs: ${listed[*]}"

# Every package any stage installs exists in this release.
mapfile -t all < <(awk '
    /^FROM / { buf = buf " ;FROM " }
    { buf = buf " " $0 }
    END {
        n = split(buf, w, /[ \t\\]+/)
        on = 0
        for (i = 1; i <= n; i++) {
            if (w[i] == "--no-install-recommends") { on = 1; continue }
            if (w[i] == "&&" || w[i] == ";FROM") { on = 0; continue }
            if (on && w[i] != "" && w[i] !~ /^-/) print w[i]
        }
    }' "$dockerfile" | sort -u)
declare -A cand=()
while read -r p c; do cand[$p]=$c; done < <(apt-cache policy "${all[@]}" 2>/dev/null |
    awk '/^[^ ].*:$/ { sub(/:$/, ""); p = $0 } /^  Candidate:/ { print p, $2 }')
for p in "${all[@]}"; do
    if [[ -z ${cand[$p]:-} || ${cand[$p]} == "(none)" ]]; then
        echo "image_deps_check: FAIL: the Dockerfile installs $p, which this release does not have" >&2
        exit 1
    fi
done
echo "image_deps_check: all ${#all[@]} packages the stages install exist in this Debian release"

declare -A have=()
while read -r p; do have[$p]=1; done < <(
    apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances "${listed[@]}" 2>/dev/null | grep -v '^ ' | sed 's/:.*//' | sort -u)
while read -r p prio; do
    [[ $prio == required ]] && have[$p]=1
done < <(dpkg-query -W -f '${Package} ${Priority}\n')
for p in "${listed[@]}"; do have[$p]=1; done

# The image configures -DGIFT_WITH_CUDA=OFF, so its libgiftclient loads
# nothing of the CUDA toolkit; a CUDA build here (nvcc found) links the
# toolkit's cudart/cuBLAS into it. Those are left out, and only then.
cuda_off=0
grep -q -- '-DGIFT_WITH_CUDA=OFF' "$dockerfile" && cuda_off=1
ncuda=0

# Every library the binaries load, once: "lib path" lines.
declare -A libs=()
for bin in "$@"; do
    [[ -e $bin ]] || { echo "image_deps_check: FAIL: $bin missing" >&2; exit 1; }
    while read -r lib path; do
        case $lib in
            libasan.so* | libubsan.so* | liblsan.so* | libtsan.so* | libgift*) continue ;;
        esac
        if [[ $cuda_off == 1 && $path == /usr/local/cuda* ]]; then
            ncuda=$((ncuda + 1))
            continue
        fi
        libs[$lib]=$path
    done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 } $2 == "=>" && $3 == "not" { print $1, "" }')
done

[[ $ncuda == 0 ]] || echo "image_deps_check: left out $ncuda CUDA toolkit libraries of this CUDA build (the image builds with -DGIFT_WITH_CUDA=OFF)"

# One dpkg-query for all of them (it reads its whole database per call):
# each library by its resolved path and the /usr-merged twin of that path.
declare -A real=() owner=()
queries=()
for lib in "${!libs[@]}"; do
    [[ -n ${libs[$lib]} ]] || continue
    r=$(readlink -f "${libs[$lib]}")
    real[$lib]=$r
    case $r in
        /usr/lib/*) queries+=("$r" "${r#/usr}") ;;
        /lib/*) queries+=("$r" "/usr$r") ;;
        *) queries+=("$r") ;;
    esac
done
while IFS= read -r line; do
    pkgs=${line%%: *}
    owner[${line#*: }]=${pkgs%%[:,]*}
done < <(dpkg-query -S "${queries[@]}" 2>/dev/null || true)

bad=0
for lib in "${!libs[@]}"; do
    if [[ -z ${libs[$lib]} ]]; then
        echo "image_deps_check: FAIL: $lib not found by ldd" >&2
        bad=1
        continue
    fi
    r=${real[$lib]}
    case $r in
        /usr/lib/*) twin=${r#/usr} ;;
        /lib/*) twin=/usr$r ;;
        *) twin=$r ;;
    esac
    pkg=${owner[$r]:-${owner[$twin]:-}}
    if [[ -z $pkg ]]; then
        echo "image_deps_check: FAIL: no Debian package owns $r ($lib)" >&2
        bad=1
    elif [[ -z ${have[$pkg]:-} ]]; then
        echo "image_deps_check: FAIL: $lib comes from $pkg, which the runtime stage does not install" >&2
        bad=1
    fi
done
[[ $bad -eq 0 ]] || exit 1
echo "image_deps_check: ok: the ${#libs[@]} libraries of $# binaries come with the runtime stage"
