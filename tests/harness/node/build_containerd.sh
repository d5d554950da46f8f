#!/usr/bin/env bash
# Builds containerd 2 (the daemon and its runc shim) from the Go module proxy into a cache
# outside git, and prints the directory (the only line on stdout):
#
#   containerd, containerd-shim-runc-v2
#       github.com/containerd/containerd/v2 at $CONTAINERD_VERSION, static (no cgo: the
#       btrfs snapshotter, the one part that needs it, is left out)
#
# Debian 12's containerd is 1.6, which cannot give a pod an image as a volume
# (Kubernetes' ImageVolume, which KubeVirt's ImageVolume gate renders containerDisks as);
# containerd 2.1 and later can. A test node started with `containerd: "v2"` runs these.
#
#   tests/harness/node/build_containerd.sh
#
# Environment: VIRTNODE_CACHE (default ~/.cache/virtnode), GO, GOTOOLCHAIN (as in
# tests/harness/node/build.sh).
set -euo pipefail
build_name=node/build_containerd.sh
# shellcheck source=../../../deploy/build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/build_lib.sh"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
find_go

CONTAINERD_VERSION=v2.4.2
module=github.com/containerd/containerd/v2
programs=(containerd containerd-shim-runc-v2)
ldflags="-s -w -X $module/version.Version=$CONTAINERD_VERSION -X $module/version.Package=$module"
# The Go the control plane builds with (deploy/cluster/go.mod's toolchain), for this build
# too: outside any module, a Go older than containerd's go line would switch to the newest
# toolchain it can find, and the key would differ between machines.
go_version=$(cd "$here/../../../deploy/cluster" && "$GO" env GOVERSION)
key=$(
  {
    echo "$go_version $CONTAINERD_VERSION $ldflags $("$GO" env GOOS GOARCH) ${programs[*]}"
    cat "$here/build_containerd.sh"
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/containerd
out=$cache_root/$key

built() {
  local program
  for program in "${programs[@]}"; do [[ -x $out/$program ]] || return 1; done
}

cache_enter "$cache_root" built

log "building containerd $CONTAINERD_VERSION with $go_version (key $key) into $out"
staging_dir=$(mktemp -d "$cache_root/.build.XXXXXX")
trap 'rm -rf "$staging_dir"' EXIT
export CGO_ENABLED=0
for program in "${programs[@]}"; do
  log "go install $program"
  # Outside any module: the version's own go.mod and go.sum decide every dependency.
  (cd "$staging_dir" && GOBIN="$staging_dir" GOTOOLCHAIN="$go_version" "$GO" install -trimpath \
    -tags "no_btrfs urfave_cli_no_docs" -ldflags "$ldflags" \
    "$module/cmd/$program@$CONTAINERD_VERSION")
done
rm -rf "$out"
mv "$staging_dir" "$out"
chmod 755 "$out"
log "done: $out"
echo "$out"
