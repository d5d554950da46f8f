#!/usr/bin/env bash
# Builds KubeVirt's virtctl and what it reaches a node's handler through, from the Go module
# proxy (the kubevirt.io/kubevirt version go.mod names), into a cache outside git, and
# prints the directory (the only line on stdout). It holds:
#
#   virtctl            KubeVirt's client (console, vnc, pause, ...)
#   virt-api           KubeVirt's API server: its webhooks and the subresources virtctl calls
#   kubevirt-install   what virt-operator installs for virt-api and the handler (cmd/)
#
# Local mode runs them with `--virtctl` (deploy/kubevirt/virt_api.ts); the tests' KubeVirt
# programs (tests/harness/kubevirt/build_peers.sh) link virt-api and kubevirt-install from
# here. Kept apart from build.sh so that local mode's default start does not wait for them.
# virtctl is built in a copy of go.mod and go.sum, which its build may extend, so the tree's
# own stay as they are.
#
#   deploy/kubevirt/build_virtctl.sh
#
# Environment: VIRTNODE_CACHE (default ~/.cache/virtnode), GO, GOTOOLCHAIN (as build.sh).
set -euo pipefail
build_name=kubevirt/build_virtctl.sh
# shellcheck source=../build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../build_lib.sh"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
find_go

go_version=$("$GO" env GOVERSION)
key=$(
  {
    echo "$go_version $("$GO" env GOOS GOARCH) virtctl virt-api kubevirt-install"
    cat build_virtctl.sh go.mod go.sum cmd/kubevirt-install/main.go
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/virtctl
out=$cache_root/$key
built() { [[ -x $out/virtctl && -x $out/virt-api && -x $out/kubevirt-install ]]; }
cache_enter "$cache_root" built

log "building with $go_version (key $key) into $out"
cache_stage "$cache_root"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
# Stamped with the module's version as KubeVirt's release builds are (hack/version.sh): an
# unstamped virtctl that fails checks its version against the server's, cannot parse its own
# placeholder and prints that instead of a version mismatch, above the real error.
kubevirt_version=$(awk '$1 == "kubevirt.io/kubevirt" && $2 ~ /^v/ { print $2; exit }' go.mod)
[[ -n $kubevirt_version ]] || { log "go.mod names no kubevirt.io/kubevirt version"; exit 1; }
version_flags="-s -w -X kubevirt.io/client-go/version.gitVersion=$kubevirt_version"
version_flags+=" -X kubevirt.io/client-go/version.gitTreeState=clean"
log "go build kubevirt-install"
"$GO" build -trimpath -ldflags "-s -w" -o "$staging/kubevirt-install" ./cmd/kubevirt-install
log "go build kubevirt.io/kubevirt/cmd/virt-api"
"$GO" build -trimpath -ldflags "$version_flags" -o "$staging/virt-api" kubevirt.io/kubevirt/cmd/virt-api
mkdir "$staging/module"
cp go.mod go.sum "$staging/module/"
log "go build kubevirt.io/kubevirt/cmd/virtctl"
(
  cd "$staging/module"
  "$GO" build -trimpath -ldflags "$version_flags" -o "$staging/virtctl" kubevirt.io/kubevirt/cmd/virtctl
)
rm -rf "$staging/module"
cache_done
