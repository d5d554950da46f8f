#!/usr/bin/env bash
# Builds the root filesystem of the test node's launcher image from a minimal Debian 12
# (debootstrap; deploy/build_lib.sh's debian_root) and Debian's packages: KubeVirt's
# launcher image, with libvirt's daemon and QEMU (bookworm-backports'), KubeVirt's own virt-launcher,
# virt-launcher-monitor and helpers (virt-tail, virt-probe, virt-freezer, container-disk,
# node-labeller.sh) and the /etc files KubeVirt's image carries (build_peers.sh's)
# where virt-controller's pods expect them. Debian 12 has no modular daemons:
# /usr/sbin/virtqemud starts the monolithic libvirtd, which serves the same socket. (The
# virtnode image's own Debian layer is deploy/image/base.sh's.)
#
# The root is cached by key (this script, the package list, the root builder, the
# binaries) under $VIRTNODE_CACHE/images/ (default ~/.cache/virtnode); prints its
# directory.
#
#   tests/harness/node/images.sh launcher <kubevirt build dir>
set -euo pipefail
build_name=node/images.sh
# shellcheck source=../../../deploy/build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/build_lib.sh"

SUITE=bookworm
# The archive this machine's apt uses (a local mirror or proxy included).
MIRROR=$(debian_mirror "$SUITE")
image=${1:-}
[[ $image == launcher && -n ${2:-} ]] || {
  echo "usage: images.sh launcher <kubevirt build dir>" >&2
  exit 2
}
kubevirt=$2
# KubeVirt's launcher image's /usr/bin (its node-labeller.sh comes with launcher-files).
launcher_bin=(virt-launcher virt-launcher-monitor virt-tail virt-probe virt-freezer
  container-disk)
# nftables: KubeVirt's virt-handler image, built on this root, runs nft for masquerade.
# xorriso: the launcher writes a VMI's cloud-init disk with xorrisofs, as KubeVirt's
# image has it.
PACKAGES=(procps nftables xorriso)
# libvirt and QEMU from bookworm-backports (libvirt 11.3, QEMU 10.0), the versions KubeVirt
# v1.7.0's launcher is made for: Debian 12's libvirt 9.0 refuses the domain KubeVirt writes
# for a VMI with room for memory hot-plug (`<maxMemory slots='0'>`: "both maximum memory
# size and memory slot count must be specified") and a block migration's
# `migrate_disks_detect_zeroes`. virt-launcher was built against 9.0's headers; the newer
# library keeps every call it makes.
BACKPORTS=(libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86
  qemu-utils ovmf)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

key=$(
  {
    echo "$image $SUITE $MIRROR ${PACKAGES[*]} backports ${BACKPORTS[*]}"
    cat "$here/images.sh"
    declare -f debian_root
    sha256sum "${launcher_bin[@]/#/$kubevirt/}" "$kubevirt"/launcher-files/* | cut -d' ' -f1
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/images
out=$cache_root/$image-$key
built() { [[ -f $out/.done ]]; }
cache_enter "$cache_root" built

cache_stage "$cache_root"
root=$staging/root
debian_root "$staging" "$cache_root/apt-archives" "$SUITE" "$MIRROR" "${PACKAGES[@]}"
log "apt-get install -t $SUITE-backports ${BACKPORTS[*]}"
echo "deb $MIRROR $SUITE-backports main" >"$root/etc/apt/sources.list.d/backports.list"
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
unshare --mount --fork -- bash -c "
  mount -t proc proc '$root/proc'
  chroot '$root' apt-get update -qq
  DEBIAN_FRONTEND=noninteractive chroot '$root' apt-get install -y -qq \\
    --no-install-recommends -t '$SUITE-backports' ${BACKPORTS[*]}
  chroot '$root' apt-get clean
" >"$staging/apt-backports.log" 2>&1 || {
  tail -20 "$staging/apt-backports.log" >&2
  exit 1
}
rm -f "$root/usr/sbin/policy-rc.d"
rm -rf "$root/var/lib/apt/lists"/* "$root/var/cache/apt"/*.bin
chroot "$root" dpkg-query -W libvirt-daemon qemu-system-x86 | sed 's/^/  /' >&2
install -m 0755 "${launcher_bin[@]/#/$kubevirt/}" "$kubevirt/launcher-files/node-labeller.sh" \
  "$root/usr/bin/"
# As KubeVirt's image: the monitor starts a non-root launcher with NET_BIND_SERVICE as an
# ambient capability, which it can only raise when its file grants it.
setcap cap_net_bind_service=+ep "$root/usr/bin/virt-launcher-monitor"
# A non-root launcher's libvirt runs in session mode, whose socket the monolithic daemon
# names libvirt-sock where virtqemud's is virtqemud-sock (in $XDG_RUNTIME_DIR/libvirt,
# which the pod sets): the link lets virt-launcher find it under virtqemud's name.
cat >"$root/usr/sbin/virtqemud" <<'EOF'
#!/bin/sh
if [ "$(id -u)" != 0 ]; then
  dir=${XDG_RUNTIME_DIR:-/var/run}/libvirt
  mkdir -p "$dir" && ln -sfn libvirt-sock "$dir/virtqemud-sock"
fi
exec /usr/sbin/libvirtd "$@"
EOF
chmod 755 "$root/usr/sbin/virtqemud"
# KubeVirt's launcher runs QEMU as qemu (107); it panics without the user. (Backports'
# packages may have made a qemu group or user already: they get KubeVirt's IDs.)
if chroot "$root" getent group qemu >/dev/null; then
  chroot "$root" groupmod -g 107 qemu
else
  chroot "$root" groupadd -g 107 qemu
fi
if chroot "$root" getent passwd qemu >/dev/null; then
  chroot "$root" usermod -u 107 -g 107 -d /home/qemu -s /bin/bash qemu
else
  chroot "$root" useradd -u 107 -g 107 -d /home/qemu -s /bin/bash qemu
fi
# Debian's libvirt resolves its built-in default user before reading qemu.conf
# (libvirt-daemon-system creates it on a host; this image has no such package).
chroot "$root" getent group libvirt-qemu >/dev/null || chroot "$root" groupadd --system libvirt-qemu
chroot "$root" getent passwd libvirt-qemu >/dev/null ||
  chroot "$root" useradd --system -g libvirt-qemu -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu
# What KubeVirt's image adds: its libvirt settings, the qemu hook, nsswitch.conf.
files=$kubevirt/launcher-files
install -m 0644 "$files/qemu.conf" "$files/virtqemud.conf" "$root/etc/libvirt/"
install -m 0644 "$files/nsswitch.conf" "$root/etc/nsswitch.conf"
install -D -m 0755 "$files/qemu" "$root/etc/libvirt/hooks/qemu"
# virtlogd will not start without its file; Debian ships it with libvirt-daemon-system.
: >"$root/etc/libvirt/virtlogd.conf"
# Nor will a daemonized libvirtd (node-labeller.sh's `virtqemud -d`) without its log directory.
mkdir -p "$root/var/log/libvirt"
# /var/run as KubeVirt's Fedora-based images have it, a relative link. Debian's absolute one
# breaks KubeVirt's handler, which reaches launcher sockets as
# /proc/<launcher pid>/root/var/run/...: an absolute link there resolves in the handler's own
# root, not the launcher's ("Failed finding unix socket for serial console").
ln -sfn ../run "$root/var/run"
touch "$staging/.done"
cache_done "$(du -sh "$root" | cut -f1)"
