#!/usr/bin/env bash
# Installs what the node-side tests and local mode need: Debian's containerd (with the CRI plugin)
# and docker-registry (the CNCF distribution registry). Only as root; otherwise says what is missing.
# The containerd that runs is PREWARM_CONTAINERD (2.1 by default, 1.7 or 1.6): 2.1 (sid) and 1.7 (trixie)
# are taken from a Debian root filesystem made with mmdebstrap, never installed on the host; only
# their containerd, shim and ctr are kept, under $PREWARM_CONTAINERD_CACHE/<version>/bin.
set -euo pipefail
cache=${PREWARM_CONTAINERD_CACHE:-/var/cache/prewarm/containerd}
version=${PREWARM_CONTAINERD:-2.1}
case "$version" in
  2.1) suite=sid ;;
  1.7) suite=trixie ;;
  1.6) suite= ;;
  *) echo "node-deps: PREWARM_CONTAINERD=$version is not one of 2.1, 1.7, 1.6" >&2; exit 2 ;;
esac
if [ -n "$suite" ] && [ ! -x "$cache/$version/bin/containerd" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "node-deps: containerd $version is missing; node tests will be skipped. As root: make node-deps" >&2
  else
    if ! command -v mmdebstrap >/dev/null 2>&1; then
      echo "node-deps: installing mmdebstrap" >&2
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
    fi
    echo "node-deps: building containerd $version from Debian $suite (mmdebstrap, about 15 s)" >&2
    rootfs=$(mktemp -d)
    # sid's Release can be past its Valid-Until; the packages are checked by their signed hashes all the same.
    mmdebstrap --quiet --variant=apt --include=containerd,runc --aptopt='Acquire::Check-Valid-Until "false"' \
      "$suite" "$rootfs" >/dev/null
    mkdir -p "$cache/$version.new/bin"
    cp "$rootfs"/usr/bin/containerd "$rootfs"/usr/bin/containerd-shim-runc-v2 "$rootfs"/usr/bin/ctr "$cache/$version.new/bin/"
    rm -rf "$rootfs" "$cache/$version"
    mv "$cache/$version.new" "$cache/$version"
    "$cache/$version/bin/containerd" --version >&2
  fi
fi
# Debian's kubectl 1.20 (kubernetes-client) for the old-client test, unpacked under build/ rather than
# installed: the package conflicts with a newer kubectl that may already be on the machine.
old_kubectl=build/kubectl-1.20/usr/bin/kubectl
if [ ! -x "$old_kubectl" ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  workdir=$(mktemp -d)
  if (cd "$workdir" && apt-get download -qq kubernetes-client >/dev/null 2>&1) ||
     { apt-get update -qq >/dev/null 2>&1 && (cd "$workdir" && apt-get download -qq kubernetes-client >/dev/null 2>&1); }; then
    mkdir -p build/kubectl-1.20 && dpkg-deb -x "$workdir"/kubernetes-client_*.deb build/kubectl-1.20
  else
    echo "node-deps: Debian's kubernetes-client could not be downloaded; the kubectl 1.20 test will be skipped" >&2
  fi
  rm -rf "$workdir"
fi
# Debian's pigz, unpacked under build/ for benchmarks/pull_limit.py: containerd decompresses layers with
# unpigz when it is on its PATH, and the benchmark pulls with and without it.
pigz_dir=build/pigz/usr/bin
if [ ! -x "$pigz_dir/unpigz" ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  workdir=$(mktemp -d)
  if (cd "$workdir" && apt-get download -qq pigz >/dev/null 2>&1); then
    mkdir -p build/pigz && dpkg-deb -x "$workdir"/pigz_*.deb build/pigz
  else
    echo "node-deps: Debian's pigz could not be downloaded; pull_limit.py will skip its unpigz runs" >&2
  fi
  rm -rf "$workdir"
fi
missing=()
# The host's containerd is 1.6, and brings runc, which every version uses.
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
