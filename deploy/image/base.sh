#!/usr/bin/env bash
# Builds the lower layer of the virtnode image: a minimal Debian 12 with what the handler
# loads through FFI (libvirt's client library) and the programs it runs. Deno and the
# program go in the layer above it (deploy/image/image.ts). Cached by key (this script,
# the package list, the root builder) under $VIRTNODE_CACHE/images/ (default
# ~/.cache/virtnode); prints its directory, whose root/ is the layer. Needs root and
# debootstrap.
#
#   bash deploy/image/base.sh
set -euo pipefail
build_name=image/base.sh
# shellcheck source=../build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../build_lib.sh"

SUITE=bookworm
# The archive this machine's apt uses (a local mirror or proxy included).
MIRROR=$(debian_mirror "$SUITE")
# libvirt0: the FFI bindings and the node labeller's child; util-linux: nsenter and mount;
# procps: pgrep/kill for an operator's shell in the pod; iproute2 and nftables: the pod
# network bindings the handler builds in launcher pods.
PACKAGES=(libvirt0 util-linux procps iproute2 nftables)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

key=$(
  {
    echo "$SUITE $MIRROR ${PACKAGES[*]}"
    cat "$here/base.sh"
    declare -f debian_root
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/images
out=$cache_root/virtnode-base-$key
built() { [[ -f $out/.done ]]; }
cache_enter "$cache_root" built

cache_stage "$cache_root"
debian_root "$staging" "$cache_root/apt-archives" "$SUITE" "$MIRROR" "${PACKAGES[@]}"
touch "$staging/.done"
cache_done "$(du -sh "$staging/root" | cut -f1)"
