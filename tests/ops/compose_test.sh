#!/usr/bin/env bash
# compose_test.sh SRC: builds the images of SRC/docker/Dockerfile and runs
# the compose cluster of SRC/docker/docker-compose.yml, the sequence of the
# docs/DEPLOYING.md's compose section:
#
#   - docker/base-image.sh (debian:bookworm{,-slim}, kept between runs),
#     `docker build --network host` of the giftd and worker targets;
#   - run 1: 2 shards, 2 workers training examples/train_llama.py for
#     STEPS (20) steps at width DIM (32); the shards reach each other on the
#     project's bridge network, /metrics answers on 127.0.0.1 only, both
#     workers exit 0 and the final loss is finite;
#   - run 2, on fresh volumes, KILL_STEPS (60) steps, a checkpoint every
#     CKPT_STEPS (10): once shard 0 (which holds this small model's only
#     chunk) has written its first, `docker kill` (SIGKILL) it while the
#     workers run, start it again, and check that the workers finish and
#     that the shard logged the restore of that checkpoint;
#   - after each run `compose down -v` leaves no container, network or volume
#     of the project (giftd-test) behind; on any exit too (trap).
#
# When no dockerd answers, the test starts one, as root, with
# --iptables=false --ip-forward=false --bridge=none (it must not change the
# machine's firewall or routing; it checks that it did not, and that no
# bridge of Docker's is left) and stops it at the end.
# Exits 77 (skipped), saying why, when docker, compose or dockerd is missing
# or dockerd cannot start. Installs nothing: scripts/deps.sh does.
set -euo pipefail

src=$(cd "${1:?usage: compose_test.sh SRC}" && pwd)
STEPS=${STEPS:-20}
KILL_STEPS=${KILL_STEPS:-60}
CKPT_STEPS=${CKPT_STEPS:-10}   # the shards' checkpoint_steps in run 2
DIM=${DIM:-32}
WAIT_S=${WAIT_S:-300}   # the most one training run may take
project=giftd-test      # fixed: a run killed before its trap is cleaned up by the next
me=compose_test

skip() { echo "$me: SKIP: $*" >&2; exit 77; }
fail() { echo "$me: FAIL: $*" >&2; exit 1; }
say() { echo "$me: $*"; }

command -v docker >/dev/null 2>&1 || skip "no docker command (scripts/deps.sh installs docker.io)"
command -v curl >/dev/null 2>&1 || skip "no curl (scripts/deps.sh installs it)"
work=$(mktemp -d "${TMPDIR:-/tmp}/giftd-compose-XXXXXX")
dockerd_pid=
compose=()
t_start=$SECONDS

# A compose command: `docker compose` (v2) where present, else Debian's
# docker-compose (1.29). Both read COMPOSE_PROJECT_NAME and the variables
# of docker-compose.yml from the environment.
if docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
fi

# leftovers: the project's containers, networks and volumes, one per line.
leftovers() {
    local f=label=com.docker.compose.project=$project
    docker ps -aq --filter "$f" | sed 's/^/container /'
    docker network ls -q --filter "$f" | sed 's/^/network /'
    docker volume ls -q --filter "$f" | sed 's/^/volume /'
}

down() {
    (cd "$src/docker" && "${compose[@]}" down -v --remove-orphans -t 10) >>"$work/down.log" 2>&1
}

cleanup() {
    local rc=$?
    set +e
    if [[ ${#compose[@]} -gt 0 ]] && docker info >/dev/null 2>&1; then
        if [[ $rc -ne 0 && $rc -ne 77 ]]; then
            (cd "$src/docker" && "${compose[@]}" logs --no-color --tail 25) >&2 2>/dev/null
        fi
        down
        # What compose could not remove (a run killed half-way).
        leftovers | while read -r kind id; do docker "$kind" rm -f "$id" >/dev/null 2>&1; done
    fi
    if [[ -n $dockerd_pid ]]; then
        kill -TERM "$dockerd_pid" 2>/dev/null
        for _ in $(seq 1 150); do kill -0 "$dockerd_pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$dockerd_pid" 2>/dev/null && { echo "$me: dockerd $dockerd_pid did not stop" >&2; rc=1; }
        [[ $rc -ne 0 && $rc -ne 77 ]] && tail -n 20 "$work/dockerd.log" >&2
        say "stopped the dockerd it started (pid $dockerd_pid)"
        docker_bridges | comm -13 "$work/bridges.before" - >"$work/bridges.left"
        if [[ -s $work/bridges.left ]]; then
            echo "$me: FAIL: bridges left behind: $(tr '\n' ' ' <"$work/bridges.left")" >&2
            [[ $rc -eq 0 ]] && rc=1
        fi
    fi
    rm -rf "$work" 2>/dev/null
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[[ ${#compose[@]} -gt 0 ]] || skip "neither docker compose nor docker-compose (scripts/deps.sh installs docker-compose)"

# --- dockerd ------------------------------------------------------------------
net_state() {
    { iptables -S 2>/dev/null || true; iptables -t nat -S 2>/dev/null || true
      cat /proc/sys/net/ipv4/ip_forward; } | sort
}
# Docker's bridges: docker0 and br-<network id>.
docker_bridges() { ip -o link show type bridge 2>/dev/null | awk -F': ' '$2 ~ /^(docker0|br-[0-9a-f]{12})/ { print $2 }' | sort; }
if ! docker info >/dev/null 2>&1; then
    command -v dockerd >/dev/null 2>&1 || skip "no dockerd answers and none is installed (docker.io)"
    [[ $(id -u) -eq 0 ]] || skip "no dockerd answers, and starting one needs root"
    net_state >"$work/net.before"
    docker_bridges >"$work/bridges.before"
    # --bridge=none: no default bridge docker0, which dockerd would leave
    # behind with its route; the cluster has its project's own network.
    dockerd --iptables=false --ip-forward=false --bridge=none >"$work/dockerd.log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 1 150); do
        docker info >/dev/null 2>&1 && break
        kill -0 "$dockerd_pid" 2>/dev/null || break
        sleep 0.2
    done
    if ! docker info >/dev/null 2>&1; then
        tail -n 10 "$work/dockerd.log" >&2
        kill -TERM "$dockerd_pid" 2>/dev/null || true
        wait "$dockerd_pid" 2>/dev/null || true
        dockerd_pid=
        skip "dockerd --iptables=false --ip-forward=false --bridge=none cannot start here (its log above)"
    fi
    say "started dockerd (pid $dockerd_pid) with --iptables=false --ip-forward=false --bridge=none"
    net_state >"$work/net.after"
    diff "$work/net.before" "$work/net.after" >&2 ||
        fail "dockerd changed the firewall or ip_forward (above)"
fi
say "docker $(docker version -f '{{.Server.Version}}'), $("${compose[@]}" version --short 2>/dev/null || echo "${compose[*]}")"

# --- images (docs/DEPLOYING.md's sequence) --------------------------------------------
t=$SECONDS
"$src/docker/base-image.sh"
t_base=$((SECONDS - t))
t=$SECONDS
cd "$src"
docker build --network host -f docker/Dockerfile --target giftd -t giftd:latest . >"$work/build-giftd.log" 2>&1 ||
    { tail -n 30 "$work/build-giftd.log" >&2; fail "docker build --target giftd"; }
docker build --network host -f docker/Dockerfile --target worker -t giftd-worker:latest . >"$work/build-worker.log" 2>&1 ||
    { tail -n 30 "$work/build-worker.log" >&2; fail "docker build --target worker"; }
t_build=$((SECONDS - t))
size() { docker image inspect -f '{{.Size}}' "$1" | awk '{ printf "%.0f MB", $1 / 1e6 }'; }
say "images: giftd:latest $(size giftd:latest), giftd-worker:latest $(size giftd-worker:latest) (base $t_base s, build $t_build s)"

# Each image: user giftd, both programs, no compiler (no network needed).
for img in giftd:latest giftd-worker:latest; do
    drun=(docker run --rm --network none)
    u=$("${drun[@]}" --entrypoint id "$img" -u)
    [[ $u == 10001 ]] || fail "$img runs as uid $u, not 10001"
    "${drun[@]}" --entrypoint giftd "$img" --help >/dev/null || fail "giftd --help in $img"
    "${drun[@]}" --entrypoint giftctl "$img" --help >/dev/null || fail "giftctl --help in $img"
    if "${drun[@]}" --entrypoint sh "$img" -c 'command -v cc || command -v gcc || command -v cmake'; then
        fail "$img holds a compiler"
    fi
done

# --- the cluster's settings ----------------------------------------------------
# DEPLOYING.md's way: docker/make-key.sh writes a fresh key (mode 600, owner
# 10001 as root) where there is none.
key=$work/giftd_auth_key
"$src/docker/make-key.sh" "$key" 2>/dev/null
[[ $(stat -c %a "$key") == 600 ]] || fail "make-key.sh: $key has mode $(stat -c %a "$key"), not 600"
if [[ $(id -u) -ne 0 ]]; then   # a member of group docker: let a container give it to uid 10001
    docker run --rm --network none -v "$work:/k" --entrypoint chown debian:bookworm-slim \
        10001:10001 /k/giftd_auth_key
fi
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export COMPOSE_PROJECT_NAME=$project GIFT_COMPOSE_KEY=$key GIFT_COMPOSE_DIM=$DIM
GIFT_COMPOSE_METRICS0=$(free_port)
GIFT_COMPOSE_METRICS1=$(free_port)
[[ $GIFT_COMPOSE_METRICS0 != "$GIFT_COMPOSE_METRICS1" ]] || GIFT_COMPOSE_METRICS1=$(free_port)
export GIFT_COMPOSE_METRICS0 GIFT_COMPOSE_METRICS1
cd "$src/docker"
down   # a killed earlier run's
[[ -z $(leftovers) ]] || fail "leftovers of an earlier run that compose down cannot remove: $(leftovers | tr '\n' ' ')"

cid() { "${compose[@]}" ps -q "$1"; }

# wait_workers RUN: both workers exit 0 within WAIT_S; prints rank 0's final
# validation loss, which must be finite.
wait_workers() {
    local run=$1 w0 w1 codes loss
    w0=$(cid worker0)
    w1=$(cid worker1)
    codes=$(timeout "$WAIT_S" docker wait "$w0" "$w1" | tr '\n' ' ') ||
        fail "run $run: the workers did not finish within $WAIT_S s"
    [[ $codes == "0 0 " ]] || fail "run $run: the workers exited $codes"
    loss=$(docker logs "$w0" 2>&1 | sed -n 's/^done: val \([^,]*\),.*/\1/p' | tail -n 1)
    python3 -c 'import math, sys; sys.exit(not math.isfinite(float(sys.argv[1])))' "${loss:-x}" 2>/dev/null ||
        fail "run $run: final validation loss '${loss}' is not a finite number"
    echo "$loss"
}

# gone RUN: compose down -v leaves nothing of the project behind.
gone() {
    down || fail "run $1: compose down -v failed: $(tail -n 5 "$work/down.log")"
    local left
    left=$(leftovers | tr '\n' ' ')
    [[ -z $left ]] || fail "run $1: compose down -v left $left"
}

# --- run 1: train ----------------------------------------------------------------
t=$SECONDS
export GIFT_COMPOSE_STEPS=$STEPS
"${compose[@]}" up -d >"$work/up1.log" 2>&1 || { cat "$work/up1.log" >&2; fail "run 1: compose up -d"; }
s0=$(cid shard0)
# The bridge network carries traffic between containers (dockerd's
# iptables and ip_forward are off): shard0 reaches shard1 by its name.
docker exec "$s0" giftctl --servers shard1:7070 --timeout 5 ping --ready >/dev/null ||
    fail "run 1: shard0 cannot reach shard1:7070 on the project network"
for svc in shard0 shard1; do
    pub=$("${compose[@]}" port "$svc" 7071)
    [[ $pub == 127.0.0.1:* ]] || fail "run 1: $svc's /metrics is published on '$pub', not on 127.0.0.1 only"
    curl -fsS -o "$work/metrics-$svc" "http://$pub/metrics" || fail "run 1: no /metrics from $svc at $pub"
    grep -q '^giftd_' "$work/metrics-$svc" || fail "run 1: no giftd_ metrics from $svc at $pub"
done
loss1=$(wait_workers 1)
t_run1=$((SECONDS - t))
say "run 1: $STEPS steps, final validation loss $loss1, both workers exit 0 ($t_run1 s)"
gone 1

# --- run 2: kill shard 0 mid-run and restart it ------------------------------------
t=$SECONDS
export GIFT_COMPOSE_STEPS=$KILL_STEPS GIFT_COMPOSE_CHECKPOINT_STEPS=$CKPT_STEPS
"${compose[@]}" up -d >"$work/up2.log" 2>&1 || { cat "$work/up2.log" >&2; fail "run 2: compose up -d"; }
s0=$(cid shard0)
w0=$(cid worker0)
for _ in $(seq 1 $((WAIT_S * 5))); do
    docker logs "$s0" 2>&1 | grep -q 'checkpoint 1 written' && break
    sleep 0.2
done
docker logs "$s0" 2>&1 | grep -q 'checkpoint 1 written' || fail "run 2: shard0 wrote no checkpoint within $WAIT_S s"
sleep 1   # a few steps into the step log after it
[[ $(docker inspect -f '{{.State.Running}}' "$w0") == true ]] ||
    fail "run 2: the workers finished before the kill; raise KILL_STEPS"
docker kill "$s0" >/dev/null
[[ $(docker inspect -f '{{.State.Running}}' "$s0") == false ]] || fail "run 2: shard0 still runs after docker kill"
say "run 2: killed shard0 (SIGKILL) after its first checkpoint; starting it again"
docker start "$s0" >/dev/null
loss2=$(wait_workers 2)
restored=$(docker logs "$s0" 2>&1 | grep -m1 'restored from /var/lib/giftd: checkpoint found' || true)
[[ -n $restored ]] || fail "run 2: shard0 logged no restore of its checkpoint"
t_run2=$((SECONDS - t))
say "run 2: $KILL_STEPS steps, final validation loss $loss2, both workers exit 0 ($t_run2 s)"
say "run 2: shard0: ${restored#*INFO  }"
gone 2

say "ok in $((SECONDS - t_start)) s (base images $t_base s, images $t_build s, run 1 $t_run1 s, run 2 $t_run2 s)"
