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
#               - gives its other interfaces the static addresses of a cloud-init NoCloud
#                 disk (ISO 9660, label cidata): network-config version 1, each
#                 `physical` entry matched by mac_address, its `static` subnets'
#                 addresses (secondary networks have no DHCP, as in KubeVirt),
#               - counts its boots on each blank or counted data disk (vdb, ...) in
#                 the disk's first sector and lists the disks in /www/disks,
#               - serves /www with busybox httpd on ports 80 and 8080, and answers
#                 http://<guest>/cgi-bin/echo with the request's remote address,
#                 /boot_id with this boot's random ID and /cgi-bin/uptime with the
#                 seconds since it (a guest that live-migrated keeps both going),
#               - prints "virtnode-guest: ready ip=<address>" on the serial console,
#               - mounts the boot disk read-only at /boot and an ext2 filesystem on a RAM
#                 disk (brd) at /data, mounted by the ext4 driver, which can freeze (FAT
#                 cannot): real filesystems for the agent to list and freeze,
#               - runs QEMU's guest agent (qemu-guest-agent and the libraries it links,
#                 from Debian's packages, fetched and unpacked, never installed) on the
#                 org.qemu.guest_agent.0 port when the domain has one; the guest has an
#                 /etc/os-release and one logged-in user, "virtnode" on ttyS0, in utmp,
#               - runs a shell on the serial console.
#
# The guest needs nothing writable: the boot disk can be attached read-only. It boots under
# KVM or software emulation (TCG) alike. Cached by key (this script and the package
# versions) under $VIRTNODE_CACHE/guest/ (default ~/.cache/virtnode); prints the directory
# of guest.img, which also holds the kernel and initramfs alone (vmlinuz, initrd).
#
#   tests/harness/guest/build.sh
set -euo pipefail
build_name=guest/build.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../../../deploy/build_lib.sh
source "$here/../../../deploy/build_lib.sh"
# shellcheck source=guest_lib.sh
source "$here/guest_lib.sh"

# The kernel's modules the initramfs loads, in dependency order.
MODULES=(
  drivers/virtio/virtio_ring.ko
  drivers/virtio/virtio.ko
  drivers/virtio/virtio_pci_modern_dev.ko
  drivers/virtio/virtio_pci_legacy_dev.ko
  drivers/virtio/virtio_pci.ko
  drivers/virtio/virtio_balloon.ko
  drivers/virtio/virtio_mem.ko
  net/core/failover.ko
  drivers/net/net_failover.ko
  drivers/net/virtio_net.ko
  drivers/net/ethernet/intel/e1000/e1000.ko
  drivers/char/virtio_console.ko
  drivers/block/virtio_blk.ko
  fs/fat/fat.ko
  fs/fat/vfat.ko
  fs/nls/nls_cp437.ko
  fs/nls/nls_ascii.ko
  fs/nls/nls_utf8.ko
  lib/crc16.ko
  fs/mbcache.ko
  fs/jbd2/jbd2.ko
  crypto/crc32c_generic.ko
  fs/ext4/ext4.ko
  drivers/block/brd.ko
  drivers/cdrom/cdrom.ko
  fs/isofs/isofs.ko
)

# QEMU's guest agent and the packages whose libraries it links (checked below: every
# library it loads must come from these).
AGENT_PACKAGES=(qemu-guest-agent libglib2.0-0 libnuma1 libudev1 liburing2 libpcre2-8-0 libc6)

guest_kernel
package_versions "${AGENT_PACKAGES[@]}"
agent_versions=("${package_pins[@]}")

key=$(
  {
    cat "${BASH_SOURCE[0]}" "$here/guest_lib.sh" "$here/lease.sh" "$here/utmp.sh" "$here/chpasswd.sh" "$here/getent.sh" | sha256sum | cut -d' ' -f1
    echo "$kernel_package $kernel_version busybox-static $busybox_version syslinux $syslinux_version"
    echo "${agent_versions[*]}"
  } | sha256sum | cut -c1-16
)
cache=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/guest
out=$cache/$key
built() { [[ -f $out/guest.img ]]; }
cache_enter "$cache" built

work=$(mktemp -d "$cache/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
log "fetching $kernel_package $kernel_version (apt-get download)"
unpack_packages "$work/kernel" "$kernel_package=$kernel_version"
log "fetching the guest agent: ${agent_versions[*]} (apt-get download)"
unpack_packages "$work/agent" "${agent_versions[@]}"

log "initramfs: busybox $busybox_version, ${#MODULES[@]} modules"
root=$work/root
mkdir -p "$root"/{bin,dev,proc,sys,etc,www/cgi-bin,lib/modules,tmp,run}
cp /bin/busybox "$root/bin/busybox"
# The agent and, resolved against the unpacked packages alone, every library it loads.
mkdir -p "$root"/{var,boot}
ln -s ../run "$root/var/run"
copy_program "$root" "$work/agent" usr/sbin/qemu-ga
cp "$here/lease.sh" "$root/etc/lease"
cp "$here/utmp.sh" "$root/etc/utmp.sh"
# Users for the agent's access credentials (guest-ssh-add-authorized-keys looks the user up
# in /etc/passwd; guest-set-user-password runs chpasswd, which writes /etc/shadow; without
# guest-ssh-*, KubeVirt's launcher runs getent, mkdir, chown and chmod).
cp "$here/chpasswd.sh" "$root/bin/chpasswd"
cp "$here/getent.sh" "$root/bin/getent"
mkdir -p "$root/root" "$root/home/virtnode"
chmod 0700 "$root/root"
printf 'root:x:0:0:root:/root:/bin/sh\nvirtnode:x:1000:1000:virtnode:/home/virtnode:/bin/sh\n' \
  >"$root/etc/passwd"
printf 'root:x:0:\nvirtnode:x:1000:\n' >"$root/etc/group"
printf 'root:*:19000:0:99999:7:::\nvirtnode:*:19000:0:99999:7:::\n' >"$root/etc/shadow"
chmod 0600 "$root/etc/shadow"
cat >"$root/etc/os-release" <<'OSRELEASE'
PRETTY_NAME="virtnode test guest"
NAME="virtnode test guest"
VERSION_ID="1"
VERSION="1"
ID=virtnode-guest
OSRELEASE
for module in "${MODULES[@]}"; do
  cp "$work/kernel/lib/modules/$abi/kernel/$module" "$root/lib/modules/"
  basename "$module" >>"$root/etc/modules"
done

cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
# qemu-ga sets the guest's clock (guest-set-time) only where /sbin/hwclock is.
mkdir -p /sbin && ln -s /bin/busybox /sbin/hwclock
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
# Static addresses from a cloud-init NoCloud disk's network-config (version 1): an entry's
# mac_address, then its subnets' address lines, as "<mac> <address/prefix>" pairs.
mkdir -p /cidata
for dir in /sys/block/vd*; do
  [ -e "$dir" ] || continue
  mount -t iso9660 -o ro "/dev/${dir##*/}" /cidata 2>/dev/null || continue
  if [ -f /cidata/network-config ]; then
    awk '/mac_address:/ { mac = tolower($2); gsub(/["\047]/, "", mac) }
      /address:/ && $1 != "mac_address:" { a = $2; gsub(/["\047]/, "", a); print mac, a }' \
      /cidata/network-config >/tmp/static
    while read -r mac address; do
      for link in /sys/class/net/*; do
        [ "$(cat "$link/address")" = "$mac" ] || continue
        ip link set "${link##*/}" up
        ip addr add "$address" dev "${link##*/}" &&
          echo "virtnode-guest: ${link##*/} $address (cloud-init)"
      done
    done </tmp/static
  fi
  umount /cidata
  break
done
# Data disks: a virtio disk whose first sector is blank, or starts "virtnode-data <n>", gets
# "virtnode-data <n+1>" written there and flushed; any other content (the boot disk, an ISO
# 9660 disk such as cloud-init's) is left alone. /www/disks lists each disk: "<name>
# <512-byte sectors> <n, - or readonly>".
: >/www/disks
for dir in /sys/block/vd*; do
  [ -e "$dir" ] || continue
  dev=${dir##*/}
  count=-
  head=$(dd if="/dev/$dev" bs=512 count=1 2>/dev/null | tr -d '\000')
  iso=$(dd if="/dev/$dev" bs=1 skip=32769 count=5 2>/dev/null)
  [ "$iso" = CD001 ] && head=iso9660
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
# This boot's random ID: a guest that moved to another node still has it, a rebooted one not.
cat /proc/sys/kernel/random/boot_id >/www/boot_id
httpd -p 80 -h /www
httpd -p 8080 -h /www
echo "virtnode-guest: serving http on ports 80 and 8080"
# The boot disk (FAT) read-only at /boot, and a RAM disk's filesystem at /data: the agent
# lists both and freezes /data (the kernel cannot freeze FAT).
for dir in /sys/block/vd*; do
  [ -e "$dir" ] || continue
  mount -t vfat -o ro "/dev/${dir##*/}" /boot 2>/dev/null && break
done
mkdir -p /data
mke2fs -q /dev/ram0 2>/dev/null && mount -t ext4 /dev/ram0 /data &&
  echo "virtnode-guest: /data on a RAM disk"
# One logged-in user for the agent's guest-get-users: a USER_PROCESS record of glibc's
# 384-byte struct utmp for "virtnode" on ttyS0, logged in now.
. /etc/utmp.sh
utmp_record 7 $$ ttyS0 S0 virtnode >/run/utmp
# The agent's port appears once the host has told the console driver about it, which can
# come well after this point on a busy host under emulation: looked for in the background
# for as long as the guest runs (said once on the console after 30 s without it; a domain
# without the channel never has the port).
(
  tries=0
  while :; do
    for port in /sys/class/virtio-ports/*; do
      [ "$(cat "$port/name" 2>/dev/null)" = org.qemu.guest_agent.0 ] || continue
      /usr/sbin/qemu-ga -m virtio-serial -p "/dev/${port##*/}" -t /run -f /run/qemu-ga.pid -d &&
        echo "virtnode-guest: guest agent on ${port##*/} after $((tries / 10)) s"
      exit 0
    done
    tries=$((tries + 1))
    [ "$tries" = 300 ] && echo "virtnode-guest: no guest agent port yet after 30 s"
    if [ "$tries" -lt 300 ]; then sleep 0.1; else sleep 1; tries=$((tries + 9)); fi
  done
) &
# Hot-plugged vCPUs and memory blocks come up offline: brought online within a second, as
# a distribution's udev rules bring them (/cgi-bin/hw tells what the guest has).
(
  while :; do
    for f in /sys/devices/system/cpu/cpu*/online; do
      [ "$(cat "$f" 2>/dev/null)" = 0 ] && echo 1 >"$f"
    done
    for f in /sys/devices/system/memory/memory*/state; do
      [ "$(cat "$f" 2>/dev/null)" = offline ] && echo online >"$f"
    done
    sleep 1
  done
) &
# A shell on the serial console (the console tests type into it); one that ends is replaced.
while :; do sh </dev/ttyS0 >/dev/ttyS0 2>&1; sleep 1; done
INIT

cat >"$root/www/index.html" <<'HTML'
virtnode test guest
HTML
cat >"$root/www/cgi-bin/echo" <<'CGI'
#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\nremote=%s\nhostname=%s\n' "$REMOTE_ADDR" "$(hostname)"
CGI
cat >"$root/www/cgi-bin/uptime" <<'CGI'
#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n%s\n' "$(cut -d' ' -f1 /proc/uptime)"
CGI
# What the guest has: online vCPUs, MemTotal in KiB and its NICs' MACs
# ("cpus=2 memory_kib=190000 macs=02:00:00:00:00:01,02:00:00:0a:96:0a").
cat >"$root/www/cgi-bin/hw" <<'CGI'
#!/bin/sh
cpus=$(grep -c '^processor' /proc/cpuinfo)
memory=$(sed -n 's/^MemTotal: *\([0-9]*\) kB$/\1/p' /proc/meminfo)
macs=$(for d in /sys/class/net/eth*; do cat "$d/address"; done 2>/dev/null | tr '\n' ',')
printf 'Content-Type: text/plain\r\n\r\ncpus=%s memory_kib=%s macs=%s\n' "$cpus" "$memory" "${macs%,}"
CGI
chmod 0755 "$root/init" "$root/bin/chpasswd" "$root/bin/getent" "$root/etc/lease" "$root/www/cgi-bin/echo" "$root/www/cgi-bin/uptime" "$root/www/cgi-bin/hw"
pack_initramfs "$root" "$work/initrd"

log "disk: FAT with SYSLINUX"
disk=$work/guest.img
boot_disk "$disk" VIRTNODE "$work/kernel/boot/vmlinuz-$abi" "$work/initrd" \
  "console=ttyS0,115200 quiet loglevel=3 panic=-1 mitigations=off"

mkdir -p "$out.tmp"
mv "$disk" "$out.tmp/guest.img"
# The same kernel and initramfs on their own, for kernel boot (firmware.kernelBoot).
cp "$work/kernel/boot/vmlinuz-$abi" "$out.tmp/vmlinuz"
cp "$work/initrd" "$out.tmp/initrd"
echo "$kernel_package $kernel_version" >"$out.tmp/versions"
echo "busybox-static $busybox_version" >>"$out.tmp/versions"
echo "syslinux $syslinux_version" >>"$out.tmp/versions"
printf '%s\n' "${agent_versions[@]}" >>"$out.tmp/versions"
rm -rf "$out"
mv "$out.tmp" "$out"
log "built: $out ($(du -h "$out/guest.img" | cut -f1))"
echo "$out"
