#!/usr/bin/env bash
# Builds Multus's thin CNI plugin for the real test node, from the Go module proxy at the
# version multus/go.mod names (its tool block), into a cache outside git, and prints the
# directory (the only line on stdout). It holds:
#
#   multus          the thin plugin: the kubelet's CNI configuration chains the pod network
#                   through it, and it adds each network a pod's
#                   k8s.v1.cni.cncf.io/networks annotation names
#   networks-crd.yaml
#                   the NetworkAttachmentDefinition CRD, from the
#                   network-attachment-definition-client module Multus reads it with
#
#   tests/harness/node/build_multus.sh
#
# Environment: VIRTNODE_CACHE (default ~/.cache/virtnode), GO, GOTOOLCHAIN (as
# deploy/build_lib.sh).
set -euo pipefail
build_name=node/build_multus.sh
# shellcheck source=../../../deploy/build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/build_lib.sh"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
module=$here/multus
find_go

go_version=$("$GO" env GOVERSION)
key=$(
  {
    echo "$go_version $("$GO" env GOOS GOARCH) multus"
    cat "$here/build_multus.sh" "$module/go.mod" "$module/go.sum"
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/multus
out=$cache_root/$key
built() { [[ -x $out/multus && -s $out/networks-crd.yaml ]]; }
cache_enter "$cache_root" built

log "building with $go_version (key $key) into $out"
cache_stage "$cache_root"
cd "$module"
export CGO_ENABLED=0
log "go build multus"
"$GO" build -mod=readonly -trimpath -ldflags "-s -w" -o "$staging/multus" \
  gopkg.in/k8snetworkplumbingwg/multus-cni.v4/cmd/multus
nad=github.com/k8snetworkplumbingwg/network-attachment-definition-client
nad_dir=$("$GO" list -mod=readonly -m -f '{{.Dir}}' "$nad")
if [[ -z $nad_dir || ! -s $nad_dir/artifacts/networks-crd.yaml ]]; then
  "$GO" mod download "$nad"
  nad_dir=$("$GO" list -mod=readonly -m -f '{{.Dir}}' "$nad")
fi
cp "$nad_dir/artifacts/networks-crd.yaml" "$staging/networks-crd.yaml"
cache_done "$("$GO" list -mod=readonly -m -f '{{.Version}}' gopkg.in/k8snetworkplumbingwg/multus-cni.v4)"
