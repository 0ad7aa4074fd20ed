#!/usr/bin/env bash
# systemd_check.sh UNIT GIFTD BUILD_DIR: `systemd-analyze verify` on
# conf/giftd.service, with ExecStart pointed at the built giftd (verify wants
# an executable there) and MANPATH at the built man pages (verify runs `man`
# on every Documentation= page). Then the same on a broken copy (a misspelt
# directive), which must fail. Exit 77 (skipped) without systemd-analyze.
set -euo pipefail
unit=${1:?usage: systemd_check.sh UNIT GIFTD BUILD_DIR}
giftd=${2:?}
build=${3:?}
command -v systemd-analyze >/dev/null 2>&1 || { echo "systemd_check: systemd-analyze not found; skipping" >&2; exit 77; }

work=$(mktemp -d "${TMPDIR:-/tmp}/giftd-unit-XXXXXX")
trap 'rm -rf "$work"' EXIT
man_opt=()
if [[ -f $build/man/man8/giftd.8 && -f $build/man/man5/giftd.conf.5 && -f $build/man/man1/giftctl.1 ]] &&
    command -v man >/dev/null 2>&1; then
    export MANPATH=$build/man
else
    echo "systemd_check: man pages or man(1) missing; not checking Documentation=" >&2
    man_opt=(--man=no)
fi

sed "s#^ExecStart=/usr/bin/giftd #ExecStart=$giftd #" "$unit" >"$work/giftd.service"
grep -q "^ExecStart=$giftd " "$work/giftd.service" || { echo "systemd_check: FAIL: no ExecStart=/usr/bin/giftd line" >&2; exit 1; }
if ! systemd-analyze verify "${man_opt[@]}" "$work/giftd.service" >"$work/out" 2>&1 || [[ -s $work/out ]]; then
    echo "systemd_check: FAIL: systemd-analyze verify:" >&2
    cat "$work/out" >&2
    exit 1
fi
echo "systemd_check: $unit verifies"

sed 's/^ProtectSystem=strict/ProtectSytem=strict/' "$work/giftd.service" >"$work/broken.service"
mv "$work/broken.service" "$work/giftd.service"
if systemd-analyze verify "${man_opt[@]}" "$work/giftd.service" >"$work/out" 2>&1 && [[ ! -s $work/out ]]; then
    echo "systemd_check: FAIL: a misspelt directive was not reported" >&2
    exit 1
fi
echo "systemd_check: the broken copy is rejected: $(head -n 1 "$work/out")"
