#!/usr/bin/env bash
# Builds KubeVirt v1.7.0's own programs the tests run beside virtnode, from the Go module
# proxy with deploy/kubevirt's module recipe (go.mod), into a cache outside git, and
# prints the directory (the only line on stdout). The directory holds:
#
#   crds/, examples/, kubevirt-crds, kubevirt-admission
#                        links to deploy/kubevirt/build.sh's output (local mode's part)
#   virt-api, kubevirt-install, virtctl
#                        links to deploy/kubevirt/build_virtctl.sh's output (local mode's
#                        --virtctl): KubeVirt's API server; what virt-operator installs
#                        beside the CRDs, from its generators; KubeVirt's client
#   cmdclient-check      KubeVirt's handler-side cmd client and notify server
#   virt-launcher        KubeVirt's launcher (cgo against libvirt-dev's libvirt)
#   virt-launcher-monitor  the launcher pod's entry point, which runs virt-launcher
#   virt-tail, virt-probe, virt-freezer, container-disk
#                        the rest of KubeVirt's launcher image's /usr/bin
#   virt-controller      KubeVirt's controller, as its image runs it
#   virt-handler, virt-chroot   KubeVirt's own node agent (the yardstick virtnode replaces)
#   launcher-files/      what KubeVirt's launcher image adds to /etc: qemu.conf and
#                        virtqemud.conf (/etc/libvirt), the qemu hook, nsswitch.conf,
#                        and node-labeller.sh (its /usr/bin)
#
#   tests/harness/kubevirt/build_peers.sh
#
# Environment: VIRTNODE_CACHE (default ~/.cache/virtnode), GO (as in
# deploy/cluster/build.sh), GOTOOLCHAIN (default auto).
set -euo pipefail
build_name=kubevirt/build_peers.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
# shellcheck source=../../../deploy/build_lib.sh
source "$repo/deploy/build_lib.sh"

local_dir=$(bash "$repo/deploy/kubevirt/build.sh")
kit_dir=$(bash "$repo/deploy/kubevirt/build_virtctl.sh")
cd "$repo/deploy/kubevirt"
find_go

# The module's own test commands (cmd/), KubeVirt's commands as they are (the go.mod tool
# block): its control plane (pure Go), what its launcher image carries beside the launcher
# (pure Go; container-disk is C), and its node programs (cgo: the launcher links libvirt).
programs=(cmdclient-check vhostmd-read)
control_programs=(virt-controller)
launcher_helpers=(virt-tail virt-probe virt-freezer)
launcher_programs=(virt-launcher virt-launcher-monitor virt-handler virt-chroot)
go_version=$("$GO" env GOVERSION)
# The launcher links libvirt: the headers it was built against belong in the key.
libvirt_version=$(pkg-config --modversion libvirt 2>/dev/null || echo none)
key=$(
  {
    echo "$local_dir $kit_dir $go_version $("$GO" env GOOS GOARCH) ${programs[*]} ${control_programs[*]}"
    echo "${launcher_helpers[*]} ${launcher_programs[*]} container-disk libvirt $libvirt_version"
    cat "$here/build_peers.sh" go.mod go.sum
    for program in "${programs[@]}"; do cat "cmd/$program/main.go"; done
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/kubevirt-peers
out=$cache_root/$key

built() {
  local program
  for program in "${programs[@]}" "${control_programs[@]}" "${launcher_helpers[@]}" \
    "${launcher_programs[@]}" container-disk; do
    [[ -x $out/$program ]] || return 1
  done
  [[ -x $out/virt-api && -x $out/kubevirt-install && -x $out/virtctl ]] || return 1
  [[ -s $out/launcher-files/qemu.conf && -s $out/crds/virtualmachineinstances.kubevirt.io.json ]]
}

cache_enter "$cache_root" built

log "building with $go_version (key $key) into $out"
cache_stage "$cache_root"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
for program in "${programs[@]}"; do
  log "go build $program"
  "$GO" build -trimpath -ldflags "-s -w" -o "$staging/$program" "./cmd/$program"
done
for program in "${control_programs[@]}" "${launcher_helpers[@]}"; do
  log "go build kubevirt.io/kubevirt/cmd/$program"
  "$GO" build -trimpath -ldflags "-s -w" -o "$staging/$program" "kubevirt.io/kubevirt/cmd/$program"
done
if [[ $libvirt_version == none ]]; then
  log "virt-launcher needs libvirt's headers (apt-get install libvirt-dev pkgconf)"
  exit 1
fi
for program in "${launcher_programs[@]}"; do
  log "go build kubevirt.io/kubevirt/cmd/$program (cgo, libvirt $libvirt_version)"
  CGO_ENABLED=1 "$GO" build -trimpath -ldflags "-s -w" -o "$staging/$program" \
    "kubevirt.io/kubevirt/cmd/$program"
done
module_dir=$("$GO" list -m -f '{{.Dir}}' kubevirt.io/kubevirt)
log "cc container-disk (static, as KubeVirt's image has it)"
gcc -static -O2 -o "$staging/container-disk" "$module_dir/cmd/container-disk-v2alpha/main.c"
mkdir "$staging/launcher-files"
cp "$module_dir"/cmd/virt-launcher/{qemu.conf,virtqemud.conf,nsswitch.conf,qemu} \
  "$module_dir"/cmd/virt-launcher/node-labeller/node-labeller.sh "$staging/launcher-files/"
chmod -R u+w "$staging/launcher-files"
for part in crds examples kubevirt-crds kubevirt-admission; do
  ln -s "$local_dir/$part" "$staging/$part"
done
for part in virt-api kubevirt-install virtctl; do
  ln -s "$kit_dir/$part" "$staging/$part"
done
cache_done
