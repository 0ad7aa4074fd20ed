#!/usr/bin/env python3
"""churn.py: giftd's memory and descriptors under connection churn (issue 41).

Starts a giftd (--world-size 2, 127.0.0.1, port 0, a temporary data_dir) and
opens --conns (80,000) bad connections to it one after another, in turn of
three kinds, the mix of tests/server/test_hostile.c's churn test:

  garbage   "GET / HTTP/1.1" on the protocol port; giftd answers
            GIFT_EBADMAGIC and closes
  hello     a Hello as rank 0 of 2, its HelloAck read, then close
  4gib      a frame preamble announcing a 2^32-byte payload; giftd answers
            GIFT_EFRAMESIZE and closes

Before the first connection and after every --every (10,000) it samples the
process's VmRSS (/proc/PID/status) and open descriptors (/proc/PID/fd),
once the descriptor count has settled (giftd closing the last connections).
--parallel P (1) keeps P connections in flight at once (P client threads).
--repeats (3) fresh giftd processes; the table gives the median of the
repeats at each point (and their min and max), and --json FILE (default
bench/out/churn.json) the same and every sample. Bounded: --budget-s (300)
for the whole run, 5 s per connection; past the budget it stops, prints what
it has and exits 1. Exit 0 when every repeat completed and giftd exited 0 on
SIGTERM; 2 on a usage error.

  bench/churn.py --giftd build-b/server/giftd
"""
import argparse
import json
import os
import platform
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def field_bytes(num, b):
    return varint(num << 3 | 2) + varint(len(b)) + b


def frame(header, payload_len=0):
    """GIF1, u32 header length, u64 payload length (little endian), header."""
    return b"GIF1" + struct.pack("<IQ", len(header), payload_len) + header


# Envelope { hello (1): Hello { protocol_version 1, rank 0, world_size 2,
# client_name "churn" } } (proto/gift.proto). rank 0 is encoded although it
# is the default, as giftd does not need it to be.
HELLO = frame(field_bytes(1, field_varint(1, 1) + field_varint(2, 0) + field_varint(3, 2) +
                          field_bytes(5, b"churn")))
GARBAGE = b"GET / HTTP/1.1\r\n\r\n"
# The preamble of test_hostile.c: header of 8 bytes, payload of 2^32 bytes.
PREAMBLE_4GIB = b"GIF1" + struct.pack("<IQ", 8, 1 << 32)
KINDS = ("garbage", "hello", "4gib")


def proc_sample(pid):
    rss = None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def settled_sample(pid, limit_s=3.0):
    """The sample once the descriptor count is the same three times 50 ms
    apart (giftd has closed what the client closed), or after limit_s."""
    end = time.monotonic() + limit_s
    last, same = None, 0
    while True:
        rss, fds = proc_sample(pid)
        same = same + 1 if fds == last else 0
        last = fds
        if same >= 2 or time.monotonic() > end:
            return rss, fds
        time.sleep(0.05)


def one_conn(port, kind, counts):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5.0)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(GARBAGE if kind == 0 else HELLO if kind == 1 else PREAMBLE_4GIB)
        # Each kind gets one answer (an Error frame, or the HelloAck) before
        # the close; read its start, not necessarily all of it.
        data = s.recv(4096)
        counts["answered" if data else "closed_silently"] += 1
    except (socket.timeout, TimeoutError):
        counts["timeouts"] += 1
    except OSError:
        counts["errors"] += 1
    finally:
        s.close()


def start_giftd(giftd, work):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIFT_", "GIFTD_"))}
    log = open(os.path.join(work, "giftd.log"), "wb")
    p = subprocess.Popen([giftd, "--bind", "127.0.0.1", "--port", "0", "--http-port", "0",
                          "--world-size", "2", "--data-dir", os.path.join(work, "data")],
                         stdout=subprocess.PIPE, stderr=log, env=env)
    end = time.monotonic() + 15
    line = b""
    os.set_blocking(p.stdout.fileno(), False)
    while time.monotonic() < end and not line.endswith(b"\n"):
        if p.poll() is not None:
            break
        try:
            chunk = p.stdout.read()
        except BlockingIOError:
            chunk = None
        if chunk:
            line += chunk
        else:
            time.sleep(0.02)
    text = line.decode(errors="replace").strip()
    if not text.startswith("giftd ready "):
        p.kill()
        p.wait()
        log.close()
        with open(os.path.join(work, "giftd.log"), errors="replace") as f:
            sys.exit(f"churn: giftd did not start: {text!r}\n{f.read()[-2000:]}")
    port = int(text.split(" port=")[1].split()[0])
    return p, port, log


def churn_block(port, first, n, parallel, counts):
    """Connections first .. first + n - 1, parallel of them in flight at once
    (each of parallel threads opens its share one after another)."""
    if parallel == 1:
        for i in range(first, first + n):
            one_conn(port, i % 3, counts)
        return
    parts = [{k: 0 for k in counts} for _ in range(parallel)]

    def work(t):
        for i in range(first + t, first + n, parallel):
            one_conn(port, i % 3, parts[t])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for part in parts:
        for k, v in part.items():
            counts[k] += v


def run_repeat(giftd, conns, every, parallel, deadline):
    with tempfile.TemporaryDirectory(prefix="giftd-churn-") as work:
        p, port, log = start_giftd(giftd, work)
        counts = {"answered": 0, "closed_silently": 0, "timeouts": 0, "errors": 0}
        samples = []
        done = 0
        try:
            time.sleep(0.2)
            rss, fds = settled_sample(p.pid)
            samples.append({"conns": 0, "rss_kb": rss, "fds": fds, "t_s": 0.0})
            t0 = time.monotonic()
            while done < conns and time.monotonic() < deadline:
                n = min(every, conns - done)
                churn_block(port, done, n, parallel, counts)
                done += n
                rss, fds = settled_sample(p.pid)
                samples.append({"conns": done, "rss_kb": rss, "fds": fds,
                                "t_s": round(time.monotonic() - t0, 2)})
                print(f"  {done:6d} connections: VmRSS {rss} kB, {fds} fds "
                      f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
        finally:
            p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
            log.close()
        return {"port": port, "samples": samples, "counts": counts, "exit": rc,
                "complete": done == conns}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--giftd", default=os.path.join(HERE, "..", "build", "server", "giftd"))
    ap.add_argument("--conns", type=int, default=80000)
    ap.add_argument("--every", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=1,
                    help="connections in flight at once (threads; default 1)")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--json", default=os.path.join("bench", "out", "churn.json"))
    a = ap.parse_args()
    if a.conns < 1 or a.every < 1 or a.repeats < 1 or not 1 <= a.parallel <= 512:
        ap.error("--conns, --every and --repeats want at least 1, --parallel 1 to 512")
    if not os.access(a.giftd, os.X_OK):
        ap.error(f"no giftd at {a.giftd} (--giftd PATH)")
    deadline = time.monotonic() + a.budget_s
    reps = []
    for r in range(a.repeats):
        if time.monotonic() >= deadline:
            break
        print(f"churn: repeat {r + 1} of {a.repeats}", file=sys.stderr, flush=True)
        reps.append(run_repeat(a.giftd, a.conns, a.every, a.parallel, deadline))
    points = sorted({s["conns"] for rep in reps for s in rep["samples"]})
    rows = []
    for c in points:
        got = [s for rep in reps for s in rep["samples"] if s["conns"] == c]
        rss = [s["rss_kb"] for s in got]
        fds = [s["fds"] for s in got]
        rows.append({"conns": c, "n": len(got), "rss_kb_median": statistics.median(rss),
                     "rss_kb_min": min(rss), "rss_kb_max": max(rss),
                     "fds_median": statistics.median(fds), "fds_min": min(fds),
                     "fds_max": max(fds)})
    ok = len(reps) == a.repeats and all(rep["complete"] and rep["exit"] == 0 for rep in reps)
    print(f"giftd connection churn: {a.conns} connections (garbage, Hello then close, "
          f"4 GiB preamble, in turn), {a.parallel} in flight at once, {len(reps)} repeats, "
          f"a fresh giftd each")
    print()
    print("| connections | VmRSS kB, median | min - max | open fds, median | min - max |")
    print("|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['conns']:,} | {row['rss_kb_median']:,.0f} | {row['rss_kb_min']:,} - "
              f"{row['rss_kb_max']:,} | {row['fds_median']:.0f} | {row['fds_min']} - "
              f"{row['fds_max']} |")
    if rows:
        base = rows[0]["rss_kb_median"]
        peak = max(r["rss_kb_median"] for r in rows)
        print()
        print(f"median VmRSS {base:,.0f} kB at start, {rows[-1]['rss_kb_median']:,.0f} kB at the "
              f"end ({100 * (rows[-1]['rss_kb_median'] - base) / base:+.1f}%), highest median "
              f"{peak:,.0f} kB; highest single sample "
              f"{max(r['rss_kb_max'] for r in rows):,} kB")
    for i, rep in enumerate(reps):
        print(f"repeat {i + 1}: {rep['counts']}, giftd exit {rep['exit']}"
              f"{'' if rep['complete'] else ', INCOMPLETE (budget)'}")
    out = {"benchmark": "churn", "conns": a.conns, "every": a.every, "repeats": a.repeats,
           "parallel": a.parallel,
           "giftd": os.path.abspath(a.giftd), "kinds": list(KINDS),
           "machine": {"nproc": os.cpu_count(), "cpu": cpu_model(), "kernel": platform.release()},
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rows": rows, "runs": reps, "ok": ok}
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"JSON: {a.json}")
    return 0 if ok else 1


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
