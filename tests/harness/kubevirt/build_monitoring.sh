#!/usr/bin/env bash
# Builds deploy/kubevirt/cmd/kubevirt-monitoring against KubeVirt v1.7.0's monitoring
# packages (the kubevirt.io/kubevirt version deploy/kubevirt/go.mod names), runs it, and
# caches what it printed: virt-handler's metric families and KubeVirt's alerts and
# recording rules, as monitoring.json in the directory it prints (the only line on stdout).
#
#   tests/harness/kubevirt/build_monitoring.sh
#
# Environment: VIRTNODE_CACHE (default ~/.cache/virtnode), GO, GOTOOLCHAIN (as
# deploy/kubevirt/build.sh).
set -euo pipefail
build_name=kubevirt/build_monitoring.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
# shellcheck source=../../../deploy/build_lib.sh
source "$repo/deploy/build_lib.sh"

cd "$repo/deploy/kubevirt"
find_go
go_version=$("$GO" env GOVERSION)
key=$(
  {
    echo "$go_version $("$GO" env GOOS GOARCH) kubevirt-monitoring"
    cat "$here/build_monitoring.sh" go.mod go.sum cmd/kubevirt-monitoring/main.go
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/kubevirt-monitoring
out=$cache_root/$key
built() { [[ -s $out/monitoring.json ]]; }
cache_enter "$cache_root" built

log "building with $go_version (key $key) into $out"
cache_stage "$cache_root"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
# In a copy of go.mod and go.sum, which the build may extend: the tree's own stay as they are.
mkdir "$staging/module"
cp go.mod go.sum "$staging/module/"
cp -r cmd/kubevirt-monitoring "$staging/module/"
(
  cd "$staging/module"
  log "go build kubevirt-monitoring"
  "$GO" build -trimpath -ldflags "-s -w" -o "$staging/kubevirt-monitoring" ./kubevirt-monitoring
)
rm -rf "$staging/module"
"$staging/kubevirt-monitoring" > "$staging/monitoring.json"
cache_done
