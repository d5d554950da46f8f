#!/usr/bin/env bash
# Builds what one real test node needs beside the control plane, into a cache outside
# git, and prints the directory (the only line on stdout):
#
#   kubelet, kube-scheduler, kube-controller-manager, kube-proxy
#       from the same k8s.io/kubernetes module and go.mod as the apiserver
#       (deploy/cluster/go.mod), with the same version stamps
#   pause   the pods' sandbox process (tests/harness/node/cmd/pause), static
#
#   tests/harness/node/build.sh
#
# Environment: VIRTNODE_CACHE (default ~/.cache/virtnode), GO (as in
# deploy/cluster/build.sh), GOTOOLCHAIN (default auto).
set -euo pipefail
build_name=node/build.sh
# shellcheck source=../../../deploy/build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/build_lib.sh"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
module=$(cd "$here/../../../deploy/cluster" && pwd)

find_go


k8s_version=$(sed -n 's/^\s*\(require\s\+\)\?k8s\.io\/kubernetes \(v[^ ]*\).*/\2/p' "$module/go.mod" | head -1)
if [[ -z $k8s_version ]]; then
  echo "node/build.sh: Cannot find k8s.io/kubernetes in $module/go.mod" >&2
  exit 1
fi
minor=$(cut -d. -f2 <<<"$k8s_version")
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean"
done
programs=(kubelet kube-scheduler kube-controller-manager kube-proxy)
go_version=$("$GO" env GOVERSION)
key=$(
  {
    echo "$go_version $k8s_version $ldflags $("$GO" env GOOS GOARCH) ${programs[*]}"
    cat "$here/build.sh" "$module/go.mod" "$module/go.sum" "$here"/cmd/*/main.go
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/node
out=$cache_root/$key

built() {
  local program
  for program in "${programs[@]}" pause; do [[ -x $out/$program ]] || return 1; done
}

cache_enter "$cache_root" built

log "building with $go_version, Kubernetes $k8s_version (key $key) into $out"
staging_dir=$(mktemp -d "$cache_root/.build.XXXXXX")
trap 'rm -rf "$staging_dir"' EXIT
export CGO_ENABLED=0
for program in "${programs[@]}"; do
  log "go build $program"
  (cd "$module" && "$GO" build -mod=readonly -trimpath -ldflags "$ldflags" \
    -o "$staging_dir/$program" "k8s.io/kubernetes/cmd/$program")
done
log "go build pause"
# Standard library only: built outside any module.
(cd "$here/cmd/pause" && GO111MODULE=off "$GO" build -trimpath -ldflags "-s -w" \
  -o "$staging_dir/pause" .)
rm -rf "$out"
mv "$staging_dir" "$out"
chmod 755 "$out"
log "done: $out"
echo "$out"
