#!/usr/bin/env bash
# metrics_check.sh GIFTD: starts giftd on 127.0.0.1 (free ports), scrapes
# /metrics with curl and runs `promtool check metrics` on it, once idle and
# once after some traffic (a client that sends garbage and gets an Error
# frame, so the error counters and labels are rendered too). Garbage on the
# HTTP port gets a 400 at once (with python3).
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

# Garbage on the HTTP port is answered at once with a 400 (Content-Length,
# Connection: close, a one-line body) and closed, well before the idle
# timeout (http_timeout, 2 s); an unknown path keeps its 404, another method
# its 405, and a request sent in pieces is still served. Skipped without
# python3.
if command -v python3 >/dev/null 2>&1; then
    python3 - "$http_port" <<'PY' || fail "HTTP port: garbage not answered with 400 at once"
import socket, sys, time
port = int(sys.argv[1])

def ask(pieces, want, limit=1.0):
    """Sends pieces (0.05 s apart), reads to EOF; want: the status code."""
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    for i, p in enumerate(pieces):
        if i:
            time.sleep(0.05)
        s.sendall(p)
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    dt = time.monotonic() - t0
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = lines[0].decode(errors="replace")
    assert status.startswith("HTTP/1.1 %d " % want), (pieces[0][:40], status, data[:200])
    assert dt < limit, (pieces[0][:40], "answered after %.2f s" % dt)
    hdrs = {l.split(b":")[0].lower(): l.split(b":", 1)[1].strip() for l in lines[1:]}
    assert int(hdrs[b"content-length"]) == len(body), (status, hdrs, body)
    assert hdrs[b"connection"] == b"close", hdrs
    if want == 400:
        assert body.endswith(b"\n") and body.count(b"\n") == 1 and body.startswith(b"bad request"), body
    print("metrics_check: %-28r -> %s in %.3f s: %s" % (pieces[0][:28], status, dt, body.strip().decode()))

ask([b"\0" * 64], 400)
ask([bytes(range(128, 256))], 400)
ask([b"GARBAGE GARBAGE GARBAGE"], 400)
ask([b"GET /" + b"a" * 2000], 400)
ask([b"GET /livez HTTP/1.1\r\nHost: x\0\r\n"], 400)
ask([b"GET /livez\r\n\r\n"], 400)
ask([b"\r\n\r\n"], 400)
ask([b"GET /nope HTTP/1.1\r\n\r\n"], 404)
ask([b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"], 405)
ask([b"GE", b"T /li", b"vez HTTP/1", b".1\r\nHost: x\r\n", b"\r\n"], 200)
PY
else
    echo "metrics_check: python3 not found; HTTP garbage not checked" >&2
fi

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
