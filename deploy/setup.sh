#!/usr/bin/env bash
# Installs what virtnode and its tests need on a Debian 12 machine, then runs a
# deno task. Idempotent: a second run finds everything in place and only prints
# what it checked.
#
#   bash deploy/setup.sh            # install only
#   bash deploy/setup.sh start      # install, then run the agent in local mode
#   bash deploy/setup.sh test       # install, then run the whole test suite
set -euo pipefail

DENO_VERSION=2.9.3
APT_PACKAGES=(
  libvirt0 libvirt-clients libvirt-daemon libvirt-daemon-driver-qemu
  qemu-system-x86 qemu-utils ovmf genisoimage xorriso iproute2 util-linux openssl python3 kmod systemd
  libxml2-utils
)

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
step() { printf '\n==> %s\n' "$*"; }
started=$(date +%s)

step "Debian packages: ${APT_PACKAGES[*]}"
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "all installed"
else
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

step "Deno $DENO_VERSION (npm package \"deno\")"
if command -v deno >/dev/null && deno --version 2>/dev/null | head -1 | grep -q "deno $DENO_VERSION "; then
  echo "$(command -v deno): $(deno --version | head -1)"
else
  command -v npm >/dev/null || { echo "npm is needed to install Deno: apt-get install npm" >&2; exit 1; }
  npm install -g --no-fund --no-audit "deno@$DENO_VERSION" >/dev/null
  hash -r
  echo "$(command -v deno): $(deno --version | head -1)"
fi

step "npm dependencies (deno.lock)"
deno install --frozen --quiet
echo "ok"

if [ -x deploy/cluster/build.sh ]; then
  step "Test control plane (kube-apiserver and etcd built from Go modules; cached)"
  bash deploy/cluster/build.sh
fi

echo
echo "setup done in $(($(date +%s) - started)) s"

if [ $# -gt 0 ]; then
  task=$1
  shift
  step "deno task $task $*"
  exec deno task "$task" "$@"
fi
