#!/usr/bin/env bash
# install_check.sh SOURCE_DIR BINARY_DIR: installs the built tree into a
# temporary prefix and uses libgiftclient from there, as an outside program
# would.
#
#   1. `cmake --install BINARY_DIR --prefix TMP/prefix`; the expected files
#      are there and none of them points back into the build tree.
#   2. libgiftclient.so.0 has its SONAME and exports exactly the functions
#      declared in gift/client.h and gift/gift_error.h; libgiftclient.a
#      defines every gift symbol its own objects use (self-contained).
#   3. The installed examples/push_pull.c is built outside the tree three
#      ways: pkg-config (shared; NEEDED libgiftclient.so.0, found in the
#      prefix through the RPATH that `pkg-config --libs` gives for a prefix
#      outside the system's library folders; `--cflags` is the prefix's
#      include folder alone), pkg-config --static (libgiftclient.a linked in), and a CMake
#      project with find_package(giftclient) for giftclient::giftclient and
#      giftclient::giftclient_static (and once more with no pkg-config, for
#      the shared target alone). The header also compiles as C++.
#   4. Every binary run with no servers set fails with a clear message; run
#      against a fresh giftd (BINARY_DIR/server/giftd, world size 1) it
#      succeeds and prints one line per step. Nothing runs with
#      LD_LIBRARY_PATH set.
#   5. The installed giftrun, with the build tree off PATH, starts the
#      installed giftd (2 shards) and 2 workers of the pkg-config build, and
#      hands them the installed library as GIFT_LIBRARY.
#   6. `pip install --no-build-isolation` of a copy of SOURCE_DIR/python into
#      a venv made with /usr/bin/python3 -m venv --system-site-packages (so
#      Debian's torch is seen); outside the source tree, the installed
#      package imports gift.torch and loads the installed library, through
#      GIFT_LIBRARY and through LD_LIBRARY_PATH. Skipped with a note when
#      that Python has no venv, pip or setuptools; gift.torch only with torch.
#
# Environment: CC (the compiler; default cc), GIFT_TEST_CFLAGS (added to
# every outside compile and link, e.g. the sanitizer flags of the build),
# GIFT_TEST_PRELOAD (LD_PRELOAD for the venv's Python, e.g. the sanitizer
# runtimes an instrumented library needs loaded first).
# Exits 77 (skipped) when pkg-config is missing. Everything lives in one
# temporary directory, removed on the way out with any giftd still running.
set -euo pipefail
# (No `grep -q` at the end of a pipeline: with pipefail, the writer's SIGPIPE
# would fail it.)

src=${1:?usage: install_check.sh SOURCE_DIR BINARY_DIR}
bin=${2:?usage: install_check.sh SOURCE_DIR BINARY_DIR}
src=$(cd "$src" && pwd)
bin=$(cd "$bin" && pwd)
cc=${CC:-cc}
read -r -a extra <<<"${GIFT_TEST_CFLAGS:-}"
strict=(-std=c11 -Wall -Wextra -Werror -pedantic)

if ! command -v pkg-config >/dev/null 2>&1; then
    echo "install_check: pkg-config not found; skipping" >&2
    exit 77
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/giftclient-install-XXXXXX")
prefix=$work/prefix
pid=
cleanup() {
    local rc=$?
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT

fail() {
    echo "install_check: FAIL: $*" >&2
    exit 1
}
step() { echo "install_check: $*"; }

# Nothing from the caller's environment chooses servers or ranks.
unset GIFT_SERVERS GIFT_RANK GIFT_WORLD RANK WORLD_SIZE PKG_CONFIG_PATH CMAKE_PREFIX_PATH DESTDIR
unset GIFT_LIBRARY LD_LIBRARY_PATH PYTHONPATH

# --- 1. install -------------------------------------------------------------
cmake --install "$bin" --prefix "$prefix" >"$work/install.log" 2>&1 ||
    { cat "$work/install.log" >&2; fail "cmake --install $bin --prefix $prefix"; }
pc=$(find "$prefix" -name giftclient.pc -path '*/pkgconfig/*' | head -n 1)
[[ -n $pc ]] || fail "no giftclient.pc installed"
libdir=$(dirname "$(dirname "$pc")")
inc=$prefix/include
example=$prefix/share/giftd/examples/push_pull.c
for f in "$libdir/libgiftclient.so" "$libdir/libgiftclient.so.0" "$libdir/libgiftclient.a" \
    "$inc/gift/client.h" "$inc/gift/gift_error.h" "$example" \
    "$libdir/cmake/giftclient/giftclientConfig.cmake" \
    "$libdir/cmake/giftclient/giftclientConfigVersion.cmake"; do
    [[ -e $f ]] || fail "not installed: ${f#"$prefix"/}"
done
so=$(readlink -f "$libdir/libgiftclient.so.0")
if grep -rlF "$bin" "$libdir/cmake/giftclient" "$pc" >"$work/leaks" 2>/dev/null ||
    readelf -d "$so" | grep -E 'R(UN)?PATH' | grep -F "$bin" >/dev/null; then
    cat "$work/leaks" >&2
    fail "an installed file refers to the build tree $bin"
fi
step "installed into $prefix (libdir ${libdir#"$prefix"/})"

# --- 2. the libraries ---------------------------------------------------------
version=$(sed -n 's/^#define GIFT_CLIENT_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' \
    "$inc/gift/client.h" | paste -sd.)
export PKG_CONFIG_PATH=$libdir/pkgconfig
[[ $(pkg-config --modversion giftclient) == "$version" ]] ||
    fail "giftclient.pc says version $(pkg-config --modversion giftclient), client.h $version"
[[ $so == */libgiftclient.so.$version ]] || fail "libgiftclient.so.0 -> $so, expected .so.$version"
soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $soname == libgiftclient.so.0 ]] || fail "SONAME is '$soname', expected libgiftclient.so.0"

# The API: every function the public headers declare (comments stripped by
# the preprocessor).
printf '#include <gift/client.h>\n' | "$cc" -E -P -I"$inc" -x c - |
    grep -oE '\bgift_[a-z0-9_]+[[:space:]]*\(' | tr -d '( \t' | sort -u >"$work/api"
nm -D --defined-only "$so" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$work/exported"
if ! diff "$work/api" "$work/exported" >"$work/api.diff"; then
    sed 's/^</  declared, not exported:/; s/^>/  exported, not declared:/' "$work/api.diff" |
        grep -v '^[0-9]' >&2
    fail "libgiftclient.so does not export exactly the public API (see client/giftclient.map)"
fi
nm -D --undefined-only "$so" | grep -E ' gift_' >&2 &&
    fail "libgiftclient.so leaves gift symbols undefined"
nm -g --defined-only "$libdir/libgiftclient.a" 2>/dev/null | awk 'NF == 3 {print $3}' |
    sort -u >"$work/a.defined"
nm -u "$libdir/libgiftclient.a" 2>/dev/null | awk '{print $NF}' | grep -E '^gift_' |
    sort -u >"$work/a.undefined" || true
missing=$(comm -23 "$work/a.undefined" "$work/a.defined")
[[ -z $missing ]] || fail "libgiftclient.a is not self-contained; missing: $missing"
comm -23 "$work/api" "$work/a.defined" >"$work/a.api" || true
[[ ! -s $work/a.api ]] || fail "libgiftclient.a lacks API functions: $(cat "$work/a.api")"
step "libgiftclient $version: SONAME $soname, $(wc -l <"$work/api") exported functions = the header's; libgiftclient.a self-contained"

# --- 3. build outside the tree ---------------------------------------------------
needs_so() { # needs_so BINARY: 0 when BINARY has libgiftclient.so.0 in NEEDED
    readelf -d "$1" | grep 'NEEDED.*\[libgiftclient\.so\.0\]' >/dev/null
}

# --cflags: the include folder alone (none of the dependencies' folders).
cflags=$(pkg-config --cflags giftclient)
[[ $cflags == "-I$inc" || $cflags == "-I$inc " ]] ||
    fail "pkg-config --cflags giftclient is '$cflags', expected -I$inc alone"
read -r -a pc_shared <<<"$(pkg-config --cflags --libs giftclient)"
"$cc" "${strict[@]}" "${extra[@]}" "$example" -o "$work/pp_pkgconfig" \
    "${pc_shared[@]}" || fail "pkg-config build (shared)"
needs_so "$work/pp_pkgconfig" || fail "pp_pkgconfig does not link libgiftclient.so.0"
resolved=$(ldd "$work/pp_pkgconfig" | awk '$1 == "libgiftclient.so.0" {print $3}')
[[ $(readlink -f "$resolved") == "$so" ]] ||
    fail "pp_pkgconfig loads libgiftclient.so.0 from '$resolved', not from $libdir"
step "pkg-config (shared): $(pkg-config --cflags --libs giftclient)"

# A static user links the archive by name (with the .so next to it, -lgiftclient
# would take the .so); Requires.private and Libs.private supply the rest.
static_libs=$(pkg-config --static --libs giftclient | sed 's/-lgiftclient\b/-l:libgiftclient.a/')
read -r -a pc_static <<<"$(pkg-config --cflags giftclient) $static_libs"
"$cc" "${strict[@]}" "${extra[@]}" "$example" -o "$work/pp_pkgconfig_static" \
    "${pc_static[@]}" || fail "pkg-config --static build"
needs_so "$work/pp_pkgconfig_static" && fail "pp_pkgconfig_static needs libgiftclient.so.0"
nm "$work/pp_pkgconfig_static" | grep ' T gift_client_open$' >/dev/null ||
    fail "pp_pkgconfig_static does not hold gift_client_open"
step "pkg-config --static: $static_libs"

mkdir -p "$work/app"
cat >"$work/app/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(giftclient_app LANGUAGES C)
option(WITH_STATIC "also giftclient::giftclient_static" ON)
if(WITH_STATIC)
  find_package(giftclient 0.1 REQUIRED COMPONENTS static)
else()
  find_package(giftclient 0.1 REQUIRED)
endif()
add_executable(pp_cmake ${EXAMPLE})
target_link_libraries(pp_cmake PRIVATE giftclient::giftclient)
if(WITH_STATIC)
  add_executable(pp_cmake_static ${EXAMPLE})
  target_link_libraries(pp_cmake_static PRIVATE giftclient::giftclient_static)
endif()
EOF
cmake_app() { # cmake_app BUILD_DIR ARGS...: configures and builds the project
    local dir=$1
    shift
    { cmake -S "$work/app" -B "$dir" -DCMAKE_PREFIX_PATH="$prefix" -DEXAMPLE="$example" \
        -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="${extra[*]} -Wall -Wextra -Werror" "$@" &&
        cmake --build "$dir" -j 2; } >"$dir.log" 2>&1 || { cat "$dir.log" >&2; return 1; }
}
cmake_app "$work/app-build" || fail "find_package(giftclient COMPONENTS static) project"
needs_so "$work/app-build/pp_cmake" || fail "pp_cmake does not link libgiftclient.so.0"
needs_so "$work/app-build/pp_cmake_static" && fail "pp_cmake_static needs libgiftclient.so.0"
# The shared target needs neither pkg-config nor the dependencies' .pc files.
cmake_app "$work/app-shared" -DWITH_STATIC=OFF -DPKG_CONFIG_EXECUTABLE="$work/no-pkg-config" ||
    fail "find_package(giftclient) without pkg-config"
needs_so "$work/app-shared/pp_cmake" || fail "app-shared/pp_cmake does not link libgiftclient.so.0"
step "find_package(giftclient): giftclient::giftclient and giftclient::giftclient_static; shared without pkg-config"

if command -v c++ >/dev/null 2>&1; then
    printf '%s\n' '#include <gift/client.h>' \
        'int main() { gift_client_opts_t o = GIFT_CLIENT_OPTS_INIT; (void)o;' \
        '  return gift_strerror(GIFT_OK) == nullptr; }' >"$work/header.cc"
    c++ -std=c++11 -Wall -Wextra -Werror -fsyntax-only -I"$inc" "$work/header.cc" ||
        fail "gift/client.h does not compile as C++"
    step "gift/client.h compiles as C++"
fi

# --- 4. run -------------------------------------------------------------------
binaries=("$work/pp_pkgconfig" "$work/pp_pkgconfig_static" "$work/app-build/pp_cmake"
    "$work/app-build/pp_cmake_static")
for exe in "${binaries[@]}"; do
    rc=0
    timeout 60 "$exe" >"$work/run.out" 2>"$work/run.err" || rc=$?
    [[ $rc -ne 0 && $rc -ne 124 ]] || fail "$(basename "$exe") with no servers: exit status $rc"
    grep -q 'cannot open the client' "$work/run.err" ||
        { cat "$work/run.err" >&2; fail "$(basename "$exe") with no servers: no clear message"; }
done
step "with no servers set, each binary exits $rc: $(head -n 1 "$work/run.err")"

giftd=$bin/server/giftd
if [[ ! -x $giftd ]]; then
    step "ok ($giftd not built: not run against a server)"
    exit 0
fi
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep '^GIFTD_' || true)
for exe in "${binaries[@]}"; do
    name=$(basename "$exe")
    # A fresh file per run: reading the previous giftd's ready line (the
    # background redirect may not have truncated it yet) gave a stale port.
    rm -f "$work/ready"
    : >"$work/ready"
    "$giftd" --bind 127.0.0.1 --port 0 --http-port off --world-size 1 \
        >"$work/ready" 2>"$work/giftd.log" &
    pid=$!
    port=
    for _ in $(seq 1 200); do
        if read -r line <"$work/ready" 2>/dev/null && [[ $line == "giftd ready "* ]]; then
            port=$(sed -n 's/.* port=\([0-9]*\).*/\1/p' <<<"$line")
            break
        fi
        kill -0 "$pid" 2>/dev/null || { cat "$work/giftd.log" >&2; fail "giftd exited before it was ready"; }
        sleep 0.05
    done
    [[ -n $port ]] || fail "no ready line from giftd within 10 s"
    rc=0
    GIFT_SERVERS=127.0.0.1:$port RANK=0 WORLD_SIZE=1 timeout 120 "$exe" \
        >"$work/run.out" 2>"$work/run.err" || rc=$?
    if [[ $rc -ne 0 ]] || [[ $(grep -c '^step [0-9]*: ' "$work/run.out") -lt 1 ]]; then
        cat "$work/run.out" "$work/run.err" >&2
        echo "--- giftd log ---" >&2
        tail -n 20 "$work/giftd.log" >&2
        fail "$name against giftd on port $port: exit status $rc"
    fi
    kill -TERM "$pid"
    wait "$pid" || fail "giftd exited with status $? after SIGTERM"
    pid=
    step "$name against giftd: $(grep -c '^step ' "$work/run.out") steps, last: $(tail -n 1 "$work/run.out")"
done

# --- 5. the installed giftrun ----------------------------------------------------------
ilib=$(readlink -f "$libdir/libgiftclient.so.0")
# shellcheck disable=SC2016  # expanded by the worker's shell
printf '%s\n' 'echo "lib $GIFT_LIBRARY"' 'exec "$@"' >"$work/show_lib.sh"
rc=0
PATH=/usr/bin:/bin timeout 120 "$prefix/bin/giftrun" --workers 2 --shards 2 -- \
    bash "$work/show_lib.sh" "$work/pp_pkgconfig" >"$work/giftrun.out" 2>&1 || rc=$?
if [[ $rc -ne 0 ]] || ! grep -q '^giftrun: done: 2 workers exited 0' "$work/giftrun.out"; then
    tail -n 30 "$work/giftrun.out" >&2
    fail "installed giftrun with 2 workers and 2 shards: exit status $rc"
fi
lib=$(sed -n 's/^\[worker0\] lib //p' "$work/giftrun.out")
[[ $(readlink -f "$lib") == "$ilib" ]] || fail "giftrun gave GIFT_LIBRARY='$lib', not the installed $ilib"
[[ $(grep -c '^\[worker[01]\] step [0-9]*: ' "$work/giftrun.out") -ge 2 ]] ||
    fail "installed giftrun: no step lines from both workers"
step "installed giftrun: 2 shards (installed giftd), 2 workers, GIFT_LIBRARY=${lib#"$prefix"/}"

# --- 6. pip install ./python ------------------------------------------------------------
py=/usr/bin/python3
if ! "$py" -c 'import venv, ensurepip, setuptools, pip' 2>/dev/null; then
    step "ok (pip install ./python not tried: $py lacks venv, ensurepip, pip or setuptools)"
    exit 0
fi
cp -r "$src/python" "$work/python"  # pip builds in the folder it is given
"$py" -m venv --system-site-packages "$work/venv" >"$work/venv.log" 2>&1 ||
    { cat "$work/venv.log" >&2; fail "$py -m venv --system-site-packages"; }
"$work/venv/bin/pip" install --no-build-isolation --no-index -q "$work/python" >"$work/pip.log" 2>&1 ||
    { cat "$work/pip.log" >&2; fail "pip install --no-build-isolation ./python"; }
rm -rf "$work/python"
[[ $("$work/venv/bin/pip" show giftclient 2>/dev/null | sed -n 's/^Version: //p') == "$version" ]] ||
    fail "pip show giftclient: not version $version"
module=gift
"$py" -c 'import torch' 2>/dev/null && module=gift.torch
vpy=("$work/venv/bin/python")
[[ -n ${GIFT_TEST_PRELOAD:-} ]] && vpy=(env "LD_PRELOAD=$GIFT_TEST_PRELOAD" ASAN_OPTIONS=detect_leaks=0 "${vpy[@]}")
# The library actually mapped, whatever name it was loaded by.
probe="import $module, gift; print(gift.__file__); print(next(l.split()[-1] for l in open('/proc/self/maps') if 'libgiftclient.so' in l)); print(gift.version())"
for how in GIFT_LIBRARY LD_LIBRARY_PATH; do
    if [[ $how == GIFT_LIBRARY ]]; then
        out=$(cd "$work" && GIFT_LIBRARY=$libdir/libgiftclient.so.0 "${vpy[@]}" -c "$probe" 2>&1) ||
            { echo "$out" >&2; fail "import $module from the venv (GIFT_LIBRARY)"; }
    else
        out=$(cd "$work" && LD_LIBRARY_PATH=$libdir "${vpy[@]}" -c "$probe" 2>&1) ||
            { echo "$out" >&2; fail "import $module from the venv (LD_LIBRARY_PATH)"; }
    fi
    mapfile -t got <<<"$out"
    [[ ${got[0]} == "$work/venv/lib/"*/site-packages/gift/__init__.py ]] ||
        fail "gift imported from ${got[0]}, not from the venv"
    [[ $(readlink -f "${got[1]}") == "$ilib" ]] ||
        fail "the venv's gift loaded ${got[1]}, not the installed library ($how)"
    [[ ${got[2]} == "$version" ]] || fail "gift.version() is '${got[2]}', expected $version"
done
step "pip install ./python into a venv (--system-site-packages): import $module, library through GIFT_LIBRARY and LD_LIBRARY_PATH"
step "ok"
