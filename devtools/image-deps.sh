#!/usr/bin/env bash
# Installs what building the agent image needs (devtools/prewarm_devtools/agent_image.py): mmdebstrap for
# the base, umoci for the image, qemu-user-static with binfmt_misc for a foreign architecture's package
# scripts, and skopeo, which reads (and pushes) the multi-architecture index. Only as root; otherwise says
# what is missing.
set -euo pipefail
missing=()
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v umoci >/dev/null 2>&1 || missing+=(umoci)
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
[ -e /usr/bin/qemu-aarch64-static ] || missing+=(qemu-user-static binfmt-support)
command -v arch-test >/dev/null 2>&1 || missing+=(arch-test)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "image-deps: missing ${missing[*]}; as root: apt-get install -y ${missing[*]}" >&2
    exit 0
  fi
  echo "image-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# A foreign architecture's package scripts run under qemu through binfmt_misc.
if [ "$(id -u)" -eq 0 ]; then
  [ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
  for arch in aarch64 x86_64; do
    [ -e "/proc/sys/fs/binfmt_misc/qemu-$arch" ] || update-binfmts --enable "qemu-$arch" >/dev/null 2>&1 || true
  done
fi
