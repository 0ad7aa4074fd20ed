#!/bin/sh
# make-key.sh [FILE]: the shared secret of the compose cluster (and of the
# Kubernetes Secret, see k8s/giftd.yaml). When FILE (default: giftd_auth_key
# beside this script, the file docker-compose.yml's GIFT_COMPOSE_KEY defaults
# to) does not exist, writes a fresh key there: 32 bytes of /dev/urandom in
# base64, mode 600 from the start (umask 077, noclobber), owned by uid 10001
# (the images' user) when run as root. An existing FILE is kept as it is, so
# a cluster restarted with the same volumes keeps its key; remove it for a
# new one. The key is never committed (docker/.gitignore) nor copied into an
# image (.dockerignore).
set -eu
file=${1:-$(dirname "$0")/giftd_auth_key}
if [ -e "$file" ]; then
    echo "make-key.sh: $file exists; keeping it (remove it for a fresh key)" >&2
    exit 0
fi
(
    umask 077
    set -C # noclobber: never write through a file that appeared meanwhile
    head -c 32 /dev/urandom | base64 >"$file"
)
if [ "$(id -u)" -eq 0 ]; then
    chown 10001:10001 "$file"
else
    echo "make-key.sh: wrote $file; the containers run as uid 10001:" \
        "sudo chown 10001:10001 $file" >&2
    exit 0
fi
echo "make-key.sh: wrote $file (mode 600, owner 10001)" >&2
