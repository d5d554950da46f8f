#!/usr/bin/env bash
# Builds the test guest: a small operating system that uses the network, made from
# Debian's packages only, for the tests and the bench. It is a BIOS-bootable raw disk
# (a FAT filesystem with SYSLINUX in its boot sector, no partition table) holding:
#
#   vmlinuz   Debian 12's kernel (linux-image-<abi>-amd64, fetched with apt-get download
#             and unpacked, never installed)
#   initrd    a busybox (busybox-static) initramfs with the kernel's virtio (balloon too:
#             its memory statistics) and e1000 modules and an /init that
#               - brings up the first network interface, asks for a DHCPv4 lease with
#                 busybox's udhcpc and applies it (address, routes, MTU, DNS, search
#                 list, host name; classless routes too),
#               - writes what the lease said to /www/dhcp (key=value lines),
#               - counts its boots on each blank or counted data disk (vdb, ...) in
#                 the disk's first sector and lists the disks in /www/disks,
#               - serves /www with busybox httpd on ports 80 and 8080, and answers
#                 http://<guest>/cgi-bin/echo with the request's remote address,
#               - prints "virtnode-guest: ready ip=<address>" on the serial console,
#               - runs a shell on the serial console.
#
# The guest needs nothing writable: the boot disk can be attached read-only. It boots under
# KVM or software emulation (TCG) alike. Cached by key (this script and the package
# versions) under $VIRTNODE_CACHE/guest/ (default ~/.cache/virtnode); prints the directory
# of guest.img, which also holds the kernel and initramfs alone (vmlinuz, initrd).
#
#   deploy/guest/build.sh
set -euo pipefail
build_name=guest/build.sh
# shellcheck source=../build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../build_lib.sh"

# The kernel's modules the initramfs loads, in dependency order.
MODULES=(
  drivers/virtio/virtio_ring.ko
  drivers/virtio/virtio.ko
  drivers/virtio/virtio_pci_modern_dev.ko
  drivers/virtio/virtio_pci_legacy_dev.ko
  drivers/virtio/virtio_pci.ko
  drivers/virtio/virtio_balloon.ko
  net/core/failover.ko
  drivers/net/net_failover.ko
  drivers/net/virtio_net.ko
  drivers/net/ethernet/intel/e1000/e1000.ko
  drivers/char/virtio_console.ko
  drivers/block/virtio_blk.ko
)

kernel_package=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
[[ -n $kernel_package ]] || {
  echo "guest/build.sh: Cannot find the kernel package linux-image-amd64 depends on (apt-get update?)" >&2
  exit 1
}
kernel_version=$(apt-cache policy "$kernel_package" | sed -n 's/^ *Candidate: //p')
for tool in busybox syslinux mformat mcopy gzip; do
  command -v "$tool" >/dev/null || {
    echo "guest/build.sh: Cannot build the test guest: \"$tool\" is missing (deploy/setup.sh installs it)" >&2
    exit 1
  }
done
busybox_version=$(dpkg-query -W -f='${Version}' busybox-static)
syslinux_version=$(dpkg-query -W -f='${Version}' syslinux)

key=$(
  {
    sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1
    echo "$kernel_package $kernel_version busybox-static $busybox_version syslinux $syslinux_version"
  } | sha256sum | cut -c1-16
)
cache=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/guest
out=$cache/$key
built() { [[ -f $out/guest.img ]]; }
cache_enter "$cache" built

work=$(mktemp -d "$cache/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
log "fetching $kernel_package $kernel_version (apt-get download)"
(cd "$work" && apt-get download -qq "$kernel_package=$kernel_version" 2>/dev/null)
dpkg-deb -x "$work"/"$kernel_package"_*.deb "$work/kernel"
abi=${kernel_package#linux-image-}

log "initramfs: busybox $busybox_version, ${#MODULES[@]} modules"
root=$work/root
mkdir -p "$root"/{bin,dev,proc,sys,etc,www/cgi-bin,lib/modules,tmp,run}
cp /bin/busybox "$root/bin/busybox"
for module in "${MODULES[@]}"; do
  cp "$work/kernel/lib/modules/$abi/kernel/$module" "$root/lib/modules/"
  basename "$module" >>"$root/etc/modules"
done

cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
for module in $(cat /etc/modules); do insmod "/lib/modules/$module" 2>/dev/null; done
ip link set lo up
iface=""
for tries in $(seq 50); do
  for dir in /sys/class/net/*; do
    name=${dir##*/}
    [ "$name" = lo ] || { iface=$name; break; }
  done
  [ -n "$iface" ] && break
  sleep 0.1
done
if [ -z "$iface" ]; then
  echo "virtnode-guest: no network interface"
else
  echo "virtnode-guest: asking for a lease on $iface"
  ip link set "$iface" up
  # Ask until answered, once a second: the guest's tap may join its bridge after boot.
  udhcpc -i "$iface" -s /etc/lease -t 0 -T 1 -A 1 -b -O search -O staticroutes -O mtu -O hostname -O domain
fi
# Data disks: a virtio disk whose first sector is blank, or starts "virtnode-data <n>", gets
# "virtnode-data <n+1>" written there and flushed; any other content (the boot disk) is left
# alone. /www/disks lists each disk: "<name> <512-byte sectors> <n, - or readonly>".
: >/www/disks
for dir in /sys/block/vd*; do
  [ -e "$dir" ] || continue
  dev=${dir##*/}
  count=-
  head=$(dd if="/dev/$dev" bs=512 count=1 2>/dev/null | tr -d '\000')
  case "$head" in
    "") count=1 ;;
    "virtnode-data "*) n=${head#virtnode-data }; n=${n%%[!0-9]*}; count=$((n + 1)) ;;
  esac
  if [ "$count" != - ]; then
    printf 'virtnode-data %s\n' "$count" | dd of="/dev/$dev" bs=512 count=1 conv=sync,fsync 2>/dev/null ||
      count=readonly
  fi
  echo "$dev $(cat "$dir/size") $count" >>/www/disks
done
echo "virtnode-guest: disks $(tr '\n' ';' </www/disks)"
httpd -p 80 -h /www
httpd -p 8080 -h /www
echo "virtnode-guest: serving http on ports 80 and 8080"
# A shell on the serial console (the console tests type into it); one that ends is replaced.
while :; do sh </dev/ttyS0 >/dev/ttyS0 2>&1; sleep 1; done
INIT

# udhcpc's script: apply the lease, record it, say so on the console.
cat >"$root/etc/lease" <<'LEASE'
#!/bin/sh
case "$1" in
  deconfig)
    ip addr flush dev "$interface"
    ip link set "$interface" up
    ;;
  bound|renew)
    prefix=$(ipcalc -p "$ip" "$subnet" | cut -d= -f2)
    ip addr flush dev "$interface"
    ip addr add "$ip/$prefix" dev "$interface"
    [ -n "$mtu" ] && ip link set "$interface" mtu "$mtu"
    if [ -n "$staticroutes" ]; then
      set -- $staticroutes
      while [ $# -ge 2 ]; do
        if [ "$1" = 0.0.0.0/0 ]; then ip route replace default via "$2" dev "$interface" onlink
        else ip route replace "$1" via "$2" dev "$interface" onlink; fi
        shift 2
      done
    elif [ -n "$router" ]; then
      for gw in $router; do ip route replace default via "$gw" dev "$interface" onlink; break; done
    fi
    : >/etc/resolv.conf
    [ -n "$search" ] && echo "search $search" >>/etc/resolv.conf
    for server in $dns; do echo "nameserver $server" >>/etc/resolv.conf; done
    [ -n "$hostname" ] && hostname "$hostname"
    {
      echo "interface=$interface"
      echo "ip=$ip"
      echo "prefix=$prefix"
      echo "router=$router"
      echo "dns=$dns"
      echo "domain=$domain"
      echo "search=$search"
      echo "hostname=$hostname"
      echo "mtu=$mtu"
      echo "staticroutes=$staticroutes"
      echo "lease=$lease"
      echo "serverid=$serverid"
      echo "mac=$(cat /sys/class/net/$interface/address)"
      echo "linkmtu=$(cat /sys/class/net/$interface/mtu)"
    } >/www/dhcp
    echo "virtnode-guest: ready ip=$ip"
    ;;
esac
exit 0
LEASE

cat >"$root/www/index.html" <<'HTML'
virtnode test guest
HTML
cat >"$root/www/cgi-bin/echo" <<'CGI'
#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\nremote=%s\nhostname=%s\n' "$REMOTE_ADDR" "$(hostname)"
CGI
chmod 0755 "$root/init" "$root/etc/lease" "$root/www/cgi-bin/echo"
(cd "$root" && find . | LC_ALL=C sort | busybox cpio -o -H newc 2>/dev/null) | gzip -9 >"$work/initrd"

log "disk: FAT with SYSLINUX"
disk=$work/guest.img
size_kib=$(($(du -k "$work/kernel/boot/vmlinuz-$abi" | cut -f1) + $(du -k "$work/initrd" | cut -f1) + 4096))
truncate -s "${size_kib}K" "$disk"
mformat -i "$disk" -v VIRTNODE ::
cat >"$work/syslinux.cfg" <<'CFG'
DEFAULT guest
PROMPT 0
TIMEOUT 0
LABEL guest
  KERNEL /vmlinuz
  INITRD /initrd
  APPEND console=ttyS0,115200 quiet loglevel=3 panic=-1 mitigations=off
CFG
mcopy -i "$disk" "$work/kernel/boot/vmlinuz-$abi" ::/vmlinuz
mcopy -i "$disk" "$work/initrd" ::/initrd
mcopy -i "$disk" "$work/syslinux.cfg" ::/syslinux.cfg
syslinux --install "$disk"

mkdir -p "$out.tmp"
mv "$disk" "$out.tmp/guest.img"
# The same kernel and initramfs on their own, for kernel boot (firmware.kernelBoot).
cp "$work/kernel/boot/vmlinuz-$abi" "$out.tmp/vmlinuz"
cp "$work/initrd" "$out.tmp/initrd"
echo "$kernel_package $kernel_version" >"$out.tmp/versions"
echo "busybox-static $busybox_version" >>"$out.tmp/versions"
echo "syslinux $syslinux_version" >>"$out.tmp/versions"
rm -rf "$out"
mv "$out.tmp" "$out"
log "built: $out ($(du -h "$out/guest.img" | cut -f1))"
echo "$out"
