#!/usr/bin/env bash
# Makes, once per machine, the base images deploy/Dockerfile and docker-compose.yml name but that no registry
# here can serve (this workplace reaches Debian's packages and PyPI only):
#   docker.io/library/debian:bookworm-slim   Debian bookworm (minbase) from debootstrap, imported as is
#   docker.io/library/swift:6.2-bookworm     that plus Swift's run-time packages, this machine's toolchain
#                                            (/opt/swift) and local package copies (/opt/swift-packages)
#   localhost/attune-standin/postgres:15     Debian's PostgreSQL 15 behind the official image's contract
#   localhost/attune-standin/rabbitmq:3.13-management   Debian's RabbitMQ behind the official image's contract
# The first two carry the official names so that deploy/Dockerfile, and every earlier release's copy of it,
# builds unchanged; the servers' stand-ins keep names of their own and reach compose through
# ATTUNE_POSTGRES_IMAGE and ATTUNE_RABBITMQ_IMAGE (the file's defaults are the official images). Each image is
# labelled with a hash of what made it and is made again only when that changes. Prints the two variables.
# Usage: scripts/container-images.sh   (root; installs podman, runc and debootstrap if missing)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
defs=$here/containers
cache=${ATTUNE_IMAGE_CACHE:-$HOME/.cache/attune/images}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$defs/containers.conf}
mirror=${ATTUNE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
say() { echo "[$(date +%T)] container-images: $*" >&2; }

missing=()
for p in podman runc debootstrap containernetworking-plugins golang-github-containernetworking-plugin-dnsname iptables; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
mkdir -p "$cache"

# made NAME HASH: true when NAME exists and was made from the definitions that hash to HASH.
made() { [ "$(podman image inspect --format '{{index .Labels "org.attune.standin.hash"}}' "$1" 2>/dev/null)" = "$2" ]; }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }

# Debian: debootstrap's minbase, with the same mirror as apt-get inside builds, and no package lists kept.
debian=docker.io/library/debian:bookworm-slim
# Bump the recipe's number when the steps below change.
debian_hash=$(echo "bookworm minbase recipe 1 $mirror" | sha256sum | cut -c1-16)
if ! made "$debian" "$debian_hash"; then
  tarball=$cache/bookworm-minbase-$debian_hash.tar
  if [ ! -s "$tarball" ]; then
    say "debootstrap bookworm (minbase) from $mirror (about 2 minutes, once)"
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    debootstrap --variant=minbase bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
      { tail -n 20 "$cache/debootstrap.log" >&2; echo "container-images: debootstrap failed (log: $cache/debootstrap.log)" >&2; exit 1; }
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n' \
      "$mirror" "$mirror" >"$root/etc/apt/sources.list"
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
    tar -C "$root" --numeric-owner -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$root"
  fi
  say "importing $debian"
  podman import --change 'CMD ["bash"]' --change "LABEL org.attune.standin=debian:bookworm-slim" \
    --change "LABEL org.attune.standin.hash=$debian_hash" "$tarball" "$debian" >/dev/null
fi

# build NAME CONTAINERFILE [podman build options]: the stand-in NAME from a file in scripts/containers/.
build() {
  local name=$1 file=$2; shift 2
  local h; h=$(hash_of "$defs/$file" "$defs"/*entrypoint.sh <(echo "$debian_hash"))
  made "$name" "$h" && return 0
  say "building $name ($file)"
  podman build --quiet --label "org.attune.standin.hash=$h" -f "$defs/$file" -t "$name" "$@" "$defs" >/dev/null
}
build docker.io/library/swift:6.2-bookworm swift-build.Containerfile \
  --volume /opt/swift:/mnt/host-swift:ro --volume /opt/swift-packages:/mnt/host-swift-packages:ro
build localhost/attune-standin/postgres:15 postgres.Containerfile
build localhost/attune-standin/rabbitmq:3.13-management rabbitmq.Containerfile
echo "export ATTUNE_POSTGRES_IMAGE=localhost/attune-standin/postgres:15"
echo "export ATTUNE_RABBITMQ_IMAGE=localhost/attune-standin/rabbitmq:3.13-management"
