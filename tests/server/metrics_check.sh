#!/usr/bin/env bash
# metrics_check.sh GIFTD: starts giftd on 127.0.0.1 (free ports), scrapes
# /metrics with curl and runs `promtool check metrics` on it, once idle and
# once after some traffic (a client that sends garbage and gets an Error
# frame, so the error counters and labels are rendered too).
# Exit 77 (skipped) when curl or promtool is missing. The daemon is always
# killed on the way out.
set -euo pipefail

giftd=${1:?usage: metrics_check.sh path/to/giftd}
for tool in curl promtool; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "metrics_check: $tool not found; skipping" >&2
        exit 77
    fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/giftd-metrics-XXXXXX")
pid=
cleanup() {
    local rc=$?
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    if [[ $rc -ne 0 && $rc -ne 77 && -s $work/giftd.log ]]; then
        echo "--- giftd log ---" >&2
        tail -n 40 "$work/giftd.log" >&2
    fi
    rm -rf "$work"
}
trap cleanup EXIT

fail() {
    echo "metrics_check: FAIL: $*" >&2
    exit 1
}

# Only the flags configure it.
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep '^GIFTD_' || true)

"$giftd" --bind 127.0.0.1 --port 0 --http-port 0 --world-size 1 \
    >"$work/ready" 2>"$work/giftd.log" &
pid=$!

port='' http_port=''
for _ in $(seq 1 200); do
    if read -r line <"$work/ready" 2>/dev/null && [[ $line == "giftd ready "* ]]; then
        port=$(sed -n 's/.* port=\([0-9]*\) .*/\1/p' <<<"$line")
        http_port=$(sed -n 's/.* http_port=\([0-9]*\)$/\1/p' <<<"$line")
        break
    fi
    kill -0 "$pid" 2>/dev/null || fail "giftd exited before it was ready"
    sleep 0.05
done
[[ -n $port && -n $http_port ]] || fail "no ready line from giftd within 10 s"

scrape() { # scrape NAME: fetches /metrics into $work/NAME and checks it
    curl --silent --show-error --fail --max-time 5 \
        "http://127.0.0.1:$http_port/metrics" -o "$work/$1" || fail "curl /metrics ($1)"
    promtool check metrics <"$work/$1" >"$work/$1.promtool" 2>&1 || {
        cat "$work/$1.promtool" >&2
        fail "promtool check metrics rejected the $1 scrape"
    }
    echo "metrics_check: $1 scrape: $(grep -vc '^#' "$work/$1") samples, promtool ok"
}

scrape idle
grep -q '^giftd_connections 0$' "$work/idle" || fail "idle: giftd_connections is not 0"
for pass in decode accumulate fused encode copy check residual scale; do
    grep -q "^giftd_pass_bytes_total{pass=\"$pass\"} 0\$" "$work/idle" ||
        fail "idle: no giftd_pass_bytes_total{pass=\"$pass\"} 0"
done
grep -Eq '^process_cpu_seconds_total [0-9]+\.[0-9]+$' "$work/idle" ||
    fail "idle: no process_cpu_seconds_total"

# Traffic: garbage on the protocol port is answered with a fatal Error
# (GIFT_EBADMAGIC) and the connection is closed. Exactly one preamble's
# worth (16 bytes) in one write, so nothing is left unread when the server
# closes; a write after its close must not kill the script either.
trap '' PIPE
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf '%s' 'GET /metrics HTT' >&3 || fail "cannot write to the protocol port"
timeout 5 cat <&3 >"$work/reply" || true
exec 3<&- 3>&-
[[ $(head -c 4 "$work/reply") == GIF1 ]] || fail "no Error frame for garbage bytes"

scrape traffic
grep -q '^giftd_errors_total{code="-8",.*} 1$' "$work/traffic" ||
    fail "traffic: no giftd_errors_total for GIFT_EBADMAGIC"
grep -Eq '^giftd_frames_total\{direction="out"\} [1-9]' "$work/traffic" ||
    fail "traffic: giftd_frames_total{direction=\"out\"} did not count the Error frame"

# SIGHUP re-reads the configuration and applies its log level (here the
# environment's): the daemon logs the new level and keeps serving.
kill -HUP "$pid"
for _ in $(seq 1 100); do
    grep -q 'log level is now' "$work/giftd.log" && break
    sleep 0.05
done
grep -q 'log level is now info' "$work/giftd.log" || fail "SIGHUP: no 'log level is now info' line"
curl --silent --fail --max-time 5 "http://127.0.0.1:$http_port/livez" >/dev/null ||
    fail "/livez after SIGHUP"

kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
pid=
[[ $rc -eq 0 ]] || fail "giftd exited with status $rc after SIGTERM"
echo "metrics_check: ok"
