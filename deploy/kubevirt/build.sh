#!/usr/bin/env bash
# Builds what local mode and the test control plane take from KubeVirt v1.7.0, from the Go
# module proxy (kubevirt.io/kubevirt, see go.mod), into a cache outside git, and prints the
# directory (the only line on stdout). The directory holds:
#
#   kubevirt-crds        KubeVirt's CRD generator, run once into crds/
#   crds/*.json          every CRD KubeVirt installs
#   kubevirt-admission   virt-api's VMI and migration webhooks (KubeVirt's packages)
#   examples/            the examples/ folder of KubeVirt's module, as published
#
# KubeVirt's own programs the tests run beside virtnode (its launcher, handler, control
# plane, clients) are built by tests/harness/kubevirt/build_peers.sh from the same module.
#
#   deploy/kubevirt/build.sh
#
# Environment: VIRTNODE_CACHE (default ~/.cache/virtnode), GO (as in
# deploy/cluster/build.sh), GOTOOLCHAIN (default auto).
set -euo pipefail
build_name=kubevirt/build.sh
# shellcheck source=../build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../build_lib.sh"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

find_go

programs=(kubevirt-crds kubevirt-admission)
go_version=$("$GO" env GOVERSION)
key=$(
  {
    echo "$go_version $("$GO" env GOOS GOARCH) ${programs[*]}"
    cat build.sh go.mod go.sum
    for program in "${programs[@]}"; do cat "cmd/$program/main.go"; done
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/kubevirt
out=$cache_root/$key

built() {
  local program
  for program in "${programs[@]}"; do
    [[ -x $out/$program ]] || return 1
  done
  [[ -s $out/crds/virtualmachineinstances.kubevirt.io.json && -d $out/examples ]]
}

cache_enter "$cache_root" built

log "building with $go_version (key $key) into $out"
cache_stage "$cache_root"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
for program in "${programs[@]}"; do
  log "go build $program"
  "$GO" build -trimpath -ldflags "-s -w" -o "$staging/$program" "./cmd/$program"
done
module_dir=$("$GO" list -m -f '{{.Dir}}' kubevirt.io/kubevirt)
log "generating KubeVirt's CRDs"
"$staging/kubevirt-crds" "$staging/crds"
cp -r "$module_dir/examples" "$staging/examples"
chmod -R u+w "$staging/examples"
cache_done "$(ls "$staging/crds" | wc -l) CRDs"
