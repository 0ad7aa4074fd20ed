#!/usr/bin/env bash
# docker/base-image.sh [RELEASE]: makes the base images docker/Dockerfile
# starts FROM, debian:RELEASE and debian:RELEASE-slim (RELEASE: bookworm),
# on a machine that cannot pull them, from the Debian mirror this machine's
# apt already uses (/etc/apt/sources.list and /etc/apt/sources.list.d/).
# An image that is already there, pulled or made by an earlier run, is left
# alone, so the script can run before every build.
#
#   debian:RELEASE       debootstrap --variant=minbase, imported with
#                        `tar -C ROOT -c . | docker import - debian:RELEASE`
#   debian:RELEASE-slim  the same root without documentation, manual pages
#                        and translations, and dpkg told to keep them out
#
# Both get the apt sources of the host's Debian mirror (the release, and its
# -updates and -security suites where the host has them) and the apt
# settings of Docker's official Debian images. Runs as root (debootstrap),
# needs a running dockerd and the debootstrap package. Exits 0 when both
# images exist afterwards, 1 with a message saying what to do otherwise.
set -euo pipefail

release=${1:-bookworm}
me=base-image.sh
die() { echo "$me: $*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 || die "no docker command (apt-get install docker.io)"
if ! docker info >/dev/null 2>&1; then
    die "dockerd is not running or not reachable (docker info fails); start it, e.g.
    dockerd --iptables=false --ip-forward=false &    (or: systemctl start docker)"
fi

missing=()
for tag in "$release" "$release-slim"; do
    if docker image inspect "debian:$tag" >/dev/null 2>&1; then
        echo "$me: debian:$tag present"
    else
        missing+=("$tag")
    fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

[[ $(id -u) -eq 0 ]] || die "debootstrap needs root to make ${missing[*]/#/debian:}"
command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found (apt-get install debootstrap)"

# "URI SUITE" for every enabled deb source of this release, one-line
# (sources.list) and deb822 (*.sources) formats alike.
apt_sources() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f $f ]] || continue
        sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" { print $2, $3 }'
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] || continue
        awk 'function flush() {
                 if (deb && on)
                     for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) print u[i], s[j]
                 deb = 0; on = 1; nu = ns = 0
             }
             BEGIN { on = 1 }
             /^[ \t]*#/ { next }
             /^[ \t]*$/ { flush(); next }
             { k = tolower($1); sub(/:$/, "", k) }
             k == "types"   { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
             k == "uris"    { for (i = 2; i <= NF; i++) u[++nu] = $i }
             k == "suites"  { for (i = 2; i <= NF; i++) s[++ns] = $i }
             k == "enabled" { on = (tolower($2) != "no") }
             END { flush() }' "$f"
    done
}
mapfile -t sources < <(apt_sources | awk -v r="$release" \
    '$2 == r || $2 == r "-updates" || $2 == r "-security" { sub(/\/$/, "", $1); print $1, $2 }' | sort -u)
mirror=
for line in "${sources[@]}"; do
    [[ ${line#* } == "$release" ]] && { mirror=${line% *}; break; }
done
[[ -n $mirror ]] || die "no Debian mirror for $release in /etc/apt/sources.list*: add one, e.g.
    deb http://deb.debian.org/debian $release main"

work=$(mktemp -d /var/tmp/giftd-base-XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root

echo "$me: debootstrap --variant=minbase $release from $mirror"
t0=$SECONDS
if ! debootstrap --variant=minbase "$release" "$root" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -n 20 "$work/debootstrap.log" >&2
    grep -hs -m5 -iE 'fail|error|unable' "$root/debootstrap/debootstrap.log" >&2 || true
    die "debootstrap could not make $release from $mirror (above: its last lines); check that
    apt-get update works on this machine and that $mirror serves $release"
fi
echo "$me: root file system in $((SECONDS - t0)) s"

# apt inside the images: the host's suites of this release, main only.
{
    for line in "${sources[@]}"; do
        echo "Types: deb"
        echo "URIs: ${line% *}"
        echo "Suites: ${line#* }"
        echo "Components: main"
        echo "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
        echo
    done
} >"$root/etc/apt/sources.list.d/debian.sources"
rm -f "$root/etc/apt/sources.list"
# What Docker's official Debian images set: no package cache kept, no
# translations fetched, no suggestions installed.
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
echo 'Acquire::Languages "none";' >"$root/etc/apt/apt.conf.d/docker-no-languages"
echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$root/etc/apt/apt.conf.d/docker-autoremove-suggests"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/*.log \
    "$root"/var/log/apt/* "$root"/tmp/* "$root"/root/.bash_history
echo "$release" >"$root/etc/hostname"
: >"$root/etc/resolv.conf"   # dockerd provides it per container

# import TAG: the root as image debian:TAG. /dev, /proc and /sys stay empty
# directories: dockerd mounts them in every container.
import() {
    tar -C "$root" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' \
        --exclude='./sys/*' -c . |
        docker import --change 'CMD ["bash"]' \
            --change "LABEL org.giftd.base-image=debootstrap:$release" - "debian:$1" >/dev/null
    echo "$me: debian:$1 imported ($(docker image inspect -f '{{.Size}}' "debian:$1" |
        awk '{ printf "%.0f MB", $1 / 1e6 }'))"
}

for tag in "${missing[@]}"; do
    [[ $tag == "$release" ]] && import "$tag"
done
for tag in "${missing[@]}"; do
    [[ $tag == "$release-slim" ]] || continue
    cat >"$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
# Docker's slim images: no documentation, manual pages or translations.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
    find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$root"/usr/share/man/* "$root"/usr/share/groff/* "$root"/usr/share/info/* \
        "$root"/usr/share/lintian/* "$root"/usr/share/linda/*
    find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
    import "$tag"
done
