#!/usr/bin/env bash
# Builds kube-apiserver and etcd for the test control plane, and kubectl, into a
# cache outside git and prints the directory that holds them (the only line on
# stdout). kubectl comes from the same k8s.io/kubernetes module (go.mod's `tool`
# line) so a machine without one gets a matching client; setup.sh links it.
#
#   deploy/cluster/build.sh [--regenerate]
#
# --regenerate  rewrite the k8s.io staging replaces in go.mod even when go.mod
#               already names K8S_VERSION.
# Environment: VIRTNODE_CACHE (default ~/.cache/virtnode), K8S_VERSION,
# ETCD_VERSION, GO (default: go on PATH, else /usr/local/go/bin/go, else
# Debian's /usr/lib/go-1.23/bin/go), GOTOOLCHAIN (default auto: a Go older than
# go.mod's toolchain line fetches that toolchain from the Go module proxy).
set -euo pipefail
build_name=build.sh
# shellcheck source=../build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../build_lib.sh"

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
# Staging modules are tagged v0.<minor>.<patch> for kubernetes v1.<minor>.<patch>.
STAGING_VERSION=v0.${K8S_VERSION#v1.}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

find_go

regenerate=false
for arg in "$@"; do
  case $arg in
    --regenerate) regenerate=true ;;
    *) echo "build.sh: unknown argument \"$arg\"" >&2; exit 2 ;;
  esac
done


# go.mod is fresh when it requires the wanted versions and replaces the staging
# modules with the matching tag; otherwise regenerate the replaces and tidy.
go_mod_is_fresh() {
  grep -Eq "^\s*(require\s+)?k8s\.io/kubernetes $K8S_VERSION\b" go.mod &&
    grep -Eq "^\s*(require\s+)?go\.etcd\.io/etcd/server/v3 $ETCD_VERSION\b" go.mod &&
    grep -Eq "^\s*(replace\s+)?k8s\.io/api => k8s\.io/api $STAGING_VERSION\$" go.mod &&
    [[ -s go.sum ]]
}

generate_go_mod() {
  log "reading the go.mod of k8s.io/kubernetes@$K8S_VERSION"
  local info upstream_mod
  info=$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION")
  upstream_mod=$(sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p' <<<"$info")
  if [[ ! -f $upstream_mod ]]; then
    echo "build.sh: Cannot find the go.mod of k8s.io/kubernetes@$K8S_VERSION: $info" >&2
    exit 1
  fi
  # Upstream points every staging module at ./staging/src/k8s.io/X; the
  # published module is k8s.io/X at the matching v0 tag.
  local staging
  staging=$(sed -n 's#^\s*\(k8s\.io/[^ ]*\) => \./staging/src/k8s\.io/.*#\1#p' "$upstream_mod")
  if [[ -z $staging ]]; then
    echo "build.sh: Cannot generate replaces: no staging modules in \"$upstream_mod\"" >&2
    exit 1
  fi
  # The block is rewritten whole, always last, so regenerating the same
  # version leaves go.mod byte for byte as it was (and the cache key with it).
  local begin="// Generated staging replaces"
  {
    sed -e "\#^$begin#,/^)\$/d" -e '/^replace k8s\.io\/[^ ]* => k8s\.io\//d' go.mod |
      sed -e :a -e '/^\n*$/{$d;N;ba' -e '}'
    echo
    echo "$begin (build.sh, from k8s.io/kubernetes@$K8S_VERSION)"
    echo "replace ("
    local module
    for module in $staging; do
      printf '\t%s => %s %s\n' "$module" "$module" "$STAGING_VERSION"
    done
    echo ")"
  } >go.mod.new
  mv go.mod.new go.mod
  "$GO" mod edit -require="k8s.io/kubernetes@$K8S_VERSION" \
    -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  log "wrote $(wc -w <<<"$staging") staging replaces (=> $STAGING_VERSION) into go.mod"
  log "go mod tidy"
  GOFLAGS=-mod=mod "$GO" mod tidy
  log "go mod tidy done"
}

if $regenerate || ! go_mod_is_fresh; then
  generate_go_mod
fi

go_version=$("$GO" env GOVERSION)
ldflags="-s -w"
ldflags+=" -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
ldflags+=" -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION")"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
# kubectl reports its client version from client-go's copy of these variables.
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
ldflags+=" -X k8s.io/client-go/pkg/version.gitMajor=1"
ldflags+=" -X k8s.io/client-go/pkg/version.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION")"
ldflags+=" -X k8s.io/client-go/pkg/version.gitTreeState=clean"
key=$(
  {
    echo "$go_version $K8S_VERSION $ETCD_VERSION $ldflags $("$GO" env GOOS GOARCH)"
    cat go.mod go.sum cmd/*/main.go
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/cluster
out=$cache_root/$key

built() { [[ -x $out/kube-apiserver && -x $out/etcd && -x $out/kubectl ]]; }

cache_enter "$cache_root" built

log "building with $go_version (key $key) into $out"
staging_dir=$(mktemp -d "$cache_root/.build.XXXXXX")
trap 'rm -rf "$staging_dir"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod
log "go build etcd ($ETCD_VERSION)"
"$GO" build -trimpath -ldflags "-s -w" -o "$staging_dir/etcd" ./cmd/etcd
log "go build etcd done"
log "go build kube-apiserver ($K8S_VERSION)"
"$GO" build -trimpath -ldflags "$ldflags" -o "$staging_dir/kube-apiserver" ./cmd/kube-apiserver
log "go build kube-apiserver done"
log "go build kubectl ($K8S_VERSION)"
"$GO" build -trimpath -ldflags "$ldflags" -o "$staging_dir/kubectl" k8s.io/kubernetes/cmd/kubectl
log "go build kubectl done"
rm -rf "$out"
mv "$staging_dir" "$out"
chmod 755 "$out"
log "done: $out"
echo "$out"
