#!/usr/bin/env bash
# Installs what the node-side tests and local mode need: Debian's containerd (with the CRI plugin)
# and docker-registry (the CNCF distribution registry). Only as root; otherwise says what is missing.
set -euo pipefail
missing=()
command -v containerd >/dev/null 2>&1 || missing+=(containerd)
command -v docker-registry >/dev/null 2>&1 || [ -x /usr/bin/docker-registry ] || missing+=(docker-registry)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "node-deps: missing ${missing[*]}; node tests will be skipped. As root: apt-get install -y ${missing[*]}" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "node-deps: missing ${missing[*]} and no apt-get to install them; node tests will be skipped" >&2
  exit 0
fi
echo "node-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The Debian packages start services on install where an init system exists; tests run their own.
for svc in containerd docker-registry; do
  if command -v systemctl >/dev/null 2>&1; then systemctl stop "$svc" >/dev/null 2>&1 || true; fi
done
