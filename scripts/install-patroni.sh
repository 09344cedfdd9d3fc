#!/usr/bin/env bash
# install-patroni.sh: installs what the TestPatroni_ tests need when it is
# missing: Debian's patroni (with python3-etcd, its etcd client) and
# etcd-server. Run as root. The tests start etcd and the three Patroni
# members themselves (internal/testdb/patroni.go), on ports of their own,
# and stop them by pid; this script starts nothing. Debian's packages do
# not start their daemons in a container without systemd.
set -euo pipefail
missing=()
command -v patroni >/dev/null 2>&1 || missing+=(patroni)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
/usr/bin/python3 -c 'import etcd' 2>/dev/null || missing+=(python3-etcd)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q "${missing[@]}"; }
