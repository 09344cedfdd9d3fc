#!/usr/bin/env bash
# docker-images.sh builds the two images that the docker pass
# (tests/dockerpass) asks for, postgres:15 and mariadb:10.11, when the
# Docker engine (the one DOCKER_HOST names, or the default) does not have
# them, for a machine that reaches no image registry. Each is a Debian root
# filesystem made with debootstrap (minbase, and the server's package),
# imported with docker import, with an entrypoint of ours (scripts/docker/)
# that behaves like the official image's for what dockerpass uses. Where a
# registry is reachable, the official images (docker pull postgres:15
# mariadb:10.11) work with dockerpass too, and this script leaves them alone.
#
# It runs as root (debootstrap does), needs debootstrap and a few hundred MB
# of disk, and takes one to two minutes an image. The Debian release and
# mirror are this machine's (/etc/os-release, the apt sources), unless
# DEBIAN_SUITE or DEBIAN_MIRROR say otherwise.
set -euo pipefail
cd "$(dirname "$0")"

suite=${DEBIAN_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}

# apt_mirror prints the first Debian mirror of this machine's apt sources
# that serves $suite (deb822 .sources files, then sources.list), or
# Debian's own when there is none.
apt_mirror() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] || continue
    # Stanzas of URIs, Suites and Components lines, ended by a blank line.
    uri=$(awk -v suite="$suite" '
      /^URIs:/   { uri = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
      /^[[:space:]]*$/ { if (ok && uri ~ /debian\/?$/) { found = uri; exit } ok = 0; uri = "" }
      END { if (found == "" && ok && uri ~ /debian\/?$/) found = uri; print found }' "$f")
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -e "$f" ] || continue
    uri=$(awk -v suite="$suite" '$1 == "deb" && $3 == suite && $2 ~ /debian\/?$/ { print $2; exit }' "$f")
    [ -n "$uri" ] && { echo "$uri"; return; }
  done
  echo http://deb.debian.org/debian
}

mirror=${DEBIAN_MIRROR:-$(apt_mirror)}

# build IMAGE PACKAGE ENTRYPOINT [CHANGE...] makes IMAGE from a minbase root
# filesystem with PACKAGE, and ENTRYPOINT (a file of scripts/docker/) as
# /usr/local/bin/docker-entrypoint.sh; each CHANGE is a Dockerfile
# instruction for docker import --change.
build() {
  local image=$1 package=$2 entrypoint=$3
  shift 3
  if docker image inspect "$image" >/dev/null 2>&1; then
    echo "docker-images: $image is there"
    return 0
  fi
  local start=$SECONDS root="$work/${image%%:*}"
  echo "docker-images: building $image from Debian $suite ($mirror), with $package"
  if ! debootstrap --variant=minbase --include="$package" "$suite" "$root" "$mirror" >"$root.log" 2>&1; then
    tail -n 30 "$root.log" >&2
    echo "docker-images: debootstrap failed (log above)" >&2
    return 1
  fi
  trim "$root" "$package"
  install -m 0755 "docker/$entrypoint" "$root/usr/local/bin/docker-entrypoint.sh"
  local changes=(--change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]')
  for c in "$@"; do changes+=(--change "$c"); done
  tar -C "$root" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . |
    docker import "${changes[@]}" --message "built by gormlease's scripts/docker-images.sh" - "$image" >/dev/null
  rm -rf --one-file-system "$root" "$root.log"
  echo "docker-images: $image built in $((SECONDS - start)) s ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%d MB", $1 / 1e6}'))"
}

# trim removes from the root filesystem what a test server does not need:
# the package caches and lists, documentation and translations, the host's
# resolver settings that debootstrap copied in, and the data that PACKAGE's
# own setup made (the entrypoint makes its own at the first start).
trim() {
  local root=$1 package=$2
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/*.log \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
  find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
  : >"$root/etc/resolv.conf"
  case $package in
  postgresql-*) rm -rf "$root"/etc/postgresql/* "$root"/var/lib/postgresql/* ;;
  mariadb-server) rm -rf "$root"/var/lib/mysql/* ;;
  esac
}

command -v docker >/dev/null || { echo "docker-images: no docker command" >&2; exit 1; }
docker info >/dev/null 2>&1 || { echo "docker-images: no Docker engine answers (DOCKER_HOST=${DOCKER_HOST:-})" >&2; exit 1; }
if ! docker image inspect postgres:15 >/dev/null 2>&1 || ! docker image inspect mariadb:10.11 >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "docker-images: debootstrap needs root" >&2; exit 1; }
  command -v debootstrap >/dev/null || { echo "docker-images: no debootstrap (apt-get install debootstrap)" >&2; exit 1; }
  [ -n "$suite" ] || { echo "docker-images: no Debian release in /etc/os-release: set DEBIAN_SUITE" >&2; exit 1; }
fi

# work holds the root filesystems while they are built. --one-file-system:
# never into a /proc or /sys that an interrupted debootstrap left mounted.
work=$(mktemp -d /var/tmp/gormlease-images.XXXXXX)
trap 'rm -rf --one-file-system "$work"' EXIT

build postgres:15 postgresql-15 postgres-entrypoint.sh \
  'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  'ENV PGDATA=/var/lib/postgresql/data' 'ENV LANG=C.UTF-8' 'EXPOSE 5432' 'CMD ["postgres"]'
build mariadb:10.11 mariadb-server mariadb-entrypoint.sh \
  'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  'ENV LANG=C.UTF-8' 'EXPOSE 3306' 'CMD ["mariadbd"]'
