#!/usr/bin/env bash
# Builds KubeVirt's virtctl from the Go module proxy (the kubevirt.io/kubevirt version
# go.mod names), the client the node tier reaches virtnode's REST server with through
# virt-api, into a cache outside git, and prints the directory (the only line on stdout)
# holding `virtctl`. Kept apart from build.sh so that adding the client does not rebuild
# KubeVirt's other programs; built in a copy of go.mod and go.sum, which a build may
# extend, so the tree's own stay as they are.
#
#   tests/harness/kubevirt/build_virtctl.sh
#
# Environment: VIRTNODE_CACHE (default ~/.cache/virtnode), GO, GOTOOLCHAIN (as build.sh).
set -euo pipefail
build_name=kubevirt/build_virtctl.sh
# shellcheck source=../../../deploy/build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/build_lib.sh"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# KubeVirt's module recipe (go.mod, go.sum) is deploy/kubevirt's, shared with its build.sh.
cd "$here/../../../deploy/kubevirt"
find_go

go_version=$("$GO" env GOVERSION)
key=$(
  {
    echo "$go_version $("$GO" env GOOS GOARCH) virtctl"
    cat "$here/build_virtctl.sh" go.mod go.sum
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/virtctl
out=$cache_root/$key
built() { [[ -x $out/virtctl ]]; }
cache_enter "$cache_root" built

staging_dir=$(mktemp -d "$cache_root/.build.XXXXXX")
trap 'rm -rf "$staging_dir"' EXIT
mkdir "$staging_dir/module"
cp go.mod go.sum "$staging_dir/module/"
log "go build kubevirt.io/kubevirt/cmd/virtctl ($go_version)"
(
  cd "$staging_dir/module"
  CGO_ENABLED=0 GOFLAGS=-mod=mod "$GO" build -trimpath -ldflags "-s -w" \
    -o "$staging_dir/virtctl" kubevirt.io/kubevirt/cmd/virtctl
)
rm -rf "$staging_dir/module"
rm -rf "$out"
mv "$staging_dir" "$out"
chmod 755 "$out"
log "done: $out"
echo "$out"
