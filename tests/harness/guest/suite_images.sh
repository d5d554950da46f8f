#!/usr/bin/env bash
# Builds substitutes for the guest images KubeVirt's functional test suite boots, from
# Debian's packages only (none of KubeVirt's own images can be fetched here). They are
# look-alikes, not the real systems: each says so in /etc/os-release and on its console.
#
#   cirros   for cirros-container-disk-demo and cirros-custom-container-disk-demo:
#            "login as 'cirros' user..." banner, "<hostname> login:", user cirros with
#            password gocubsgo and the prompt "$ ", sudo without a password
#   alpine   for alpine-container-disk-demo and alpine-with-test-tooling-container-disk:
#            "<hostname> login:", root without a password, the prompt "<hostname>:~# "
#   fedora   for fedora-with-test-tooling-container-disk: user fedora with password fedora,
#            the prompt "[fedora@<hostname> ~]$ ", sudo without a password (`sudo su` keeps
#            the prompt's form: "[root@<hostname> fedora]# "), QEMU's guest agent, OpenSSH's
#            sshd on port 22, a freezable ext4 filesystem at /data (on a RAM disk)
#   vm-killer  the root of the suite's helper pod image: busybox, bash, ncat (as nc),
#            iputils' ping, util-linux, user 1001
#
# The three disks are Debian 12's kernel and a busybox (busybox-static) initramfs on a FAT
# disk with SYSLINUX (guest_lib.sh), with busybox init on the serial console ttyS0 and:
#   - a DHCPv4 lease on the first interface (guest/lease.sh),
#   - cloud-init's NoCloud (label cidata) and ConfigDrive (label config-2) sources, read by
#     a shell reader: the host name from the meta-data (local-hostname, hostname), the
#     meta-data's public keys into the default user's ~/.ssh/authorized_keys, the
#     instance ID in /var/lib/cloud/data/instance-id, and user-data that starts with "#!"
#     run once per boot as root (output in /var/log/cloud-init-output.log),
#   - busybox acpid: the ACPI power button powers off,
#   - the i6300esb watchdog driver (busybox's watchdog applet feeds /dev/watchdog),
#   - a boot record in /var/log/wtmp, kept on the boot disk (`last reboot` counts boots),
#   - programs from Debian's packages: iputils' ping (unprivileged through ICMP sockets),
#     nmap's ncat behind an nc that takes busybox nc's "-e PROG ARGS..." form, util-linux's
#     last, jq (the reader's JSON), sudo (cirros, fedora), bash, sshd and qemu-ga (fedora).
#
# Cached by key (this script, guest_lib.sh, lease.sh, utmp.sh, package versions) under
# $VIRTNODE_CACHE/suite-guests/ (default ~/.cache/virtnode); prints the directory that
# holds disk.img (or root/ for vm-killer).
#
#   tests/harness/guest/suite_images.sh cirros|alpine|fedora|vm-killer
set -euo pipefail
build_name=guest/suite_images.sh
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../../../deploy/build_lib.sh
source "$here/../../../deploy/build_lib.sh"
# shellcheck source=guest_lib.sh
source "$here/guest_lib.sh"

flavour=${1:-}
case $flavour in cirros | alpine | fedora | vm-killer) ;; *)
  echo "usage: suite_images.sh cirros|alpine|fedora|vm-killer" >&2
  exit 2
  ;;
esac

# The kernel's modules, in dependency order: build.sh's virtio, network, FAT and ext4 set,
# plus ISO 9660 (cloud-init's seed), the watchdog, the ACPI button and evdev (acpid).
MODULES=(
  drivers/virtio/virtio_ring.ko drivers/virtio/virtio.ko
  drivers/virtio/virtio_pci_modern_dev.ko drivers/virtio/virtio_pci_legacy_dev.ko
  drivers/virtio/virtio_pci.ko drivers/virtio/virtio_balloon.ko
  net/core/failover.ko drivers/net/net_failover.ko drivers/net/virtio_net.ko
  drivers/net/ethernet/intel/e1000/e1000.ko drivers/char/virtio_console.ko
  drivers/char/hw_random/virtio-rng.ko drivers/block/virtio_blk.ko
  fs/fat/fat.ko fs/fat/vfat.ko fs/nls/nls_cp437.ko fs/nls/nls_ascii.ko fs/nls/nls_utf8.ko
  drivers/cdrom/cdrom.ko fs/isofs/isofs.ko lib/crc16.ko fs/mbcache.ko fs/jbd2/jbd2.ko crypto/crc32c_generic.ko
  fs/ext4/ext4.ko drivers/block/brd.ko
  drivers/watchdog/watchdog.ko drivers/watchdog/i6300esb.ko
  drivers/input/evdev.ko drivers/acpi/button.ko
)
# Programs taken from Debian's packages (path in the package tree), and the packages whose
# files they and the libraries they load come from (copy_program checks it).
# Debian's dynamic busybox, not busybox-static: its shell runs what PATH finds, where
# busybox-static's prefers its own applets (its ping, nc and last are not the ones above).
PROGRAMS=(bin/ping usr/bin/ncat usr/bin/last usr/bin/jq)
PACKAGES=(busybox iputils-ping ncat util-linux jq libc6 libcap2 libidn2-0 libunistring2 libssl3
  libpcap0.8 libdbus-1-3 libsystemd0 libgcrypt20 liblzma5 libzstd1 liblz4-1 libgpg-error0
  liblua5.3-0 libjq1 libonig5)
case $flavour in
  cirros | fedora)
    PROGRAMS+=(usr/bin/sudo usr/libexec/sudo/sudoers.so)
    PACKAGES+=(sudo libaudit1 libselinux1 libcap-ng0 libpcre2-8-0 libpam0g libpam-modules
      zlib1g)
    ;;&
  fedora)
    PROGRAMS+=(bin/bash bin/su usr/sbin/sshd usr/bin/ssh-keygen usr/sbin/qemu-ga)
    PACKAGES+=(bash libtinfo6 openssh-server openssh-client libcrypt1 libwrap0
      libgssapi-krb5-2 libkrb5-3 libcom-err2 libnsl2 libtirpc3 libk5crypto3 libkrb5support0 libkeyutils1
      qemu-guest-agent libglib2.0-0 libnuma1 libudev1 liburing2)
    ;;
  vm-killer)
    PROGRAMS+=(bin/bash)
    PACKAGES+=(bash libtinfo6)
    ;;
esac

guest_kernel
package_versions "${PACKAGES[@]}"

key=$(
  {
    echo "$flavour"
    cat "${BASH_SOURCE[0]}" "$here/guest_lib.sh" "$here/lease.sh" "$here/utmp.sh"
    echo "$kernel_package $kernel_version busybox-static $busybox_version syslinux $syslinux_version"
    echo "${package_pins[*]}"
  } | sha256sum | cut -c1-16
)
cache=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/suite-guests
out=$cache/$flavour-$key
built() { [[ -f $out/.done ]]; }
cache_enter "$cache" built

work=$(mktemp -d "$cache/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
log "$flavour: fetching ${#package_pins[@]} packages (apt-get download)"
unpack_packages "$work/debs" "${package_pins[@]}"

root=$work/root
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,etc,tmp,run,root,mnt,var/log,var/lib/cloud}
ln -s ../run "$root/var/run"
chmod 1777 "$root/tmp"
copy_program "$root" "$work/debs" bin/busybox
for applet in $("$root/bin/busybox" --list); do [[ $applet == busybox ]] || ln -s busybox "$root/bin/$applet"; done
# Debian's programs stand where the packages put them; busybox's same-named applets
# (earlier on PATH) give way to them.
for program in "${PROGRAMS[@]}"; do
  rm -f "$root/bin/$(basename "$program")"
  copy_program "$root" "$work/debs" "$program"
done
ln -sf ../usr/bin/last "$root/bin/last"
ln -sf ../usr/bin/ncat "$root/bin/ncat"
# OpenSSL's legacy provider, which ncat loads at start (and complains without).
mkdir -p "$root/usr/lib/x86_64-linux-gnu/ossl-modules"
cp "$work/debs/usr/lib/x86_64-linux-gnu/ossl-modules/legacy.so" "$root/usr/lib/x86_64-linux-gnu/ossl-modules/"
cat >"$root/etc/passwd.base" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat >"$root/etc/group.base" <<'GROUP'
root:x:0:
nobody:x:65534:
GROUP

if [[ $flavour == vm-killer ]]; then
  # The pod image: no init; the suite runs its own commands (bash -c, nc, sleep, ...).
  ln -sf ncat "$root/bin/nc"
  mv "$root/etc/passwd.base" "$root/etc/passwd"
  mv "$root/etc/group.base" "$root/etc/group"
  echo "vm-killer:x:1001:1001:virtnode substitute for vm-killer:/tmp:/bin/bash" >>"$root/etc/passwd"
  echo "vm-killer:x:1001:" >>"$root/etc/group"
  cat >"$root/etc/os-release" <<'OSRELEASE'
PRETTY_NAME="virtnode substitute for KubeVirt's vm-killer test image (Debian 12 packages, busybox)"
NAME="virtnode substitute for vm-killer"
ID=virtnode-substitute
OSRELEASE
  rm -rf "$out"
  mkdir -p "$out.tmp"
  mv "$root" "$out.tmp/root"
  printf '%s\n' "${package_pins[@]}" >"$out.tmp/versions"
  touch "$out.tmp/.done"
  mv "$out.tmp" "$out"
  log "built: $out"
  echo "$out"
  exit 0
fi

log "$flavour: fetching $kernel_package $kernel_version (apt-get download)"
unpack_packages "$work/kernel" "$kernel_package=$kernel_version"
mkdir -p "$root/lib/modules"
for module in "${MODULES[@]}"; do
  cp "$work/kernel/lib/modules/$abi/kernel/$module" "$root/lib/modules/"
  basename "$module" >>"$root/etc/modules"
done

# What differs between the three: names, users, prompt, banner, daemons.
case $flavour in
  cirros)
    hostname=cirros name=cirros user=cirros password=gocubsgo home=/home/cirros
    ps1='$ '
    issue="login as 'cirros' user. default password: 'gocubsgo'. use 'sudo' for root."
    ;;
  alpine)
    hostname=localhost name=alpine user=root password="" home=/root
    ps1='\h:\w\$ '
    issue="Welcome to a virtnode substitute for Alpine Linux"
    ;;
  fedora)
    hostname=fedora name=fedora user=fedora password=fedora home=/home/fedora
    ps1='[\u@\h \W]\$ '
    issue="Fedora look-alike"
    ;;
esac
echo "$hostname" >"$root/etc/hostname"
cat >"$root/etc/os-release" <<OSRELEASE
PRETTY_NAME="virtnode substitute for $name (Debian 12 kernel and packages, busybox)"
NAME="virtnode substitute for $name"
VERSION_ID="1"
ID=virtnode-$name-substitute
OSRELEASE
printf 'virtnode substitute for %s (Debian 12 kernel, busybox userland)\n%s\n\n' "$name" "$issue" >"$root/etc/issue"
mv "$root/etc/passwd.base" "$root/etc/passwd"
mv "$root/etc/group.base" "$root/etc/group"
hash=""
[[ -z $password ]] || hash=$(busybox mkpasswd -m sha512 "$password")
if [[ $user == root ]]; then
  echo "root:$hash:19000:0:99999:7:::" >"$root/etc/shadow"
else
  echo "root:*:19000:0:99999:7:::" >"$root/etc/shadow"
  echo "$user:x:1000:1000:$user:$home:/bin/sh" >>"$root/etc/passwd"
  echo "$user:x:1000:" >>"$root/etc/group"
  echo "$user:$hash:19000:0:99999:7:::" >>"$root/etc/shadow"
  mkdir -p "$root$home"
fi
chmod 0600 "$root/etc/shadow"
echo "$user" >"$root/etc/default-user"
cat >"$root/etc/profile" <<PROFILE
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
export PS1='$ps1'
PROFILE

if [[ -e $root/usr/bin/sudo ]]; then
  # The user's sudo without a password; PS1 crosses it, so that `sudo su` prompts
  # "[root@<hostname> <dir>]# " as Fedora's root shell does.
  cat >"$root/etc/sudoers" <<SUDOERS
Defaults env_keep += "PS1"
Defaults !pam_session, !pam_setcred, !lecture
root ALL=(ALL:ALL) ALL
$user ALL=(ALL:ALL) NOPASSWD: ALL
SUDOERS
  chmod 0440 "$root/etc/sudoers"
  mkdir -p "$root/etc/pam.d" "$root/lib/x86_64-linux-gnu/security"
  printf 'auth required pam_permit.so\naccount required pam_permit.so\nsession required pam_permit.so\n' \
    >"$root/etc/pam.d/sudo"
  cp "$work/debs/lib/x86_64-linux-gnu/security/pam_permit.so" "$root/lib/x86_64-linux-gnu/security/"
  cp -a "$work/debs/usr/libexec/sudo/libsudo_util.so.0"* "$root/lib/x86_64-linux-gnu/"
  chmod 4755 "$root/usr/bin/sudo"
  if [[ -e $root/bin/su ]]; then
    # su for root alone (`sudo su`): not setuid, and PAM lets only root through.
    chmod 0755 "$root/bin/su"
    printf 'auth sufficient pam_rootok.so\nauth required pam_deny.so\naccount required pam_permit.so\nsession required pam_permit.so\n' \
      >"$root/etc/pam.d/su"
    cp "$work/debs/lib/x86_64-linux-gnu/security/"pam_{rootok,deny}.so "$root/lib/x86_64-linux-gnu/security/"
  fi
  echo "127.0.0.1 localhost" >"$root/etc/hosts"
fi

cp "$here/lease.sh" "$root/etc/lease"
cp "$here/utmp.sh" "$root/etc/utmp.sh"
mkdir -p "$root/www"

# busybox nc's options (cirros's and alpine's nc) over ncat: "-e PROG ARGS..." takes the
# rest of the line as the program (the suite's `nc -klp PORT -e echo -e "Hello World!"`);
# "-i SEC" paces lines sent, which ncat does not do (its -i is an idle timeout: dropped);
# a client reads the network side to its end after stdin ends (ncat's --no-shutdown).
rm "$root/bin/nc"
cat >"$root/bin/nc" <<'NC'
#!/bin/sh
# virtnode substitute: busybox nc's options over nmap's ncat.
listen="" command=""
set -- "$@" --end--
while [ "$1" != --end-- ]; do
  case "$1" in
    -e)
      shift
      while [ "$1" != --end-- ]; do
        command="$command '$(printf '%s' "$1" | sed "s/'/'\\\\''/g")'"
        shift
      done
      break
      ;;
    -i) shift 2 ;;
    -l* | -*l*) listen=1 && set -- "$@" "$1" && shift ;;
    *) set -- "$@" "$1" && shift ;;
  esac
done
shift
[ -n "$command" ] && set -- "$@" --sh-exec "$command"
[ -n "$listen" ] || set -- "$@" --no-shutdown
exec /usr/bin/ncat "$@"
NC

# qemu-ga's guest-shutdown runs /sbin/shutdown: busybox init's poweroff or reboot.
cat >"$root/sbin/shutdown" <<'SHUTDOWN'
#!/bin/sh
# virtnode substitute for shutdown(8): -r reboots, anything else powers off, now.
case " $* " in *" -r "*) exec /bin/reboot ;; *) exec /bin/poweroff ;; esac
SHUTDOWN

mkdir -p "$root/etc/acpi/PWRF"
printf '#!/bin/sh\nexec /bin/poweroff\n' >"$root/etc/acpi/PWRF/00000080"

cat >"$root/etc/inittab" <<'INITTAB'
::sysinit:/etc/rcS
ttyS0::respawn:/bin/getty -L 115200 ttyS0 vt100
::ctrlaltdel:/bin/reboot
::shutdown:/etc/rcK
INITTAB
if [[ $flavour == fedora ]]; then
  echo "::respawn:/etc/agent" >>"$root/etc/inittab"
  cat >"$root/etc/agent" <<'AGENT'
#!/bin/sh
# QEMU's guest agent on its virtio port, once the host has announced the port. Started
# after rcS has run the user-data, and, as Fedora's unit does, with the commands that
# /etc/sysconfig/qemu-ga's BLACKLIST_RPC names blocked (the suite's user-data appends one).
BLACKLIST_RPC=""
[ -f /etc/sysconfig/qemu-ga ] && . /etc/sysconfig/qemu-ga
while :; do
  for port in /sys/class/virtio-ports/*; do
    [ "$(cat "$port/name" 2>/dev/null)" = org.qemu.guest_agent.0 ] &&
      exec /usr/sbin/qemu-ga -m virtio-serial -p "/dev/${port##*/}" -t /run \
        ${BLACKLIST_RPC:+-b "$BLACKLIST_RPC"}
  done
  sleep 1
done
AGENT
  mkdir -p "$root/etc/ssh" "$root/run/sshd" "$root/etc/sysconfig"
  # Fedora's file, with nothing blocked (the test tooling image's agent offers every command).
  echo "BLACKLIST_RPC=" >"$root/etc/sysconfig/qemu-ga"
  echo "sshd:x:100:65534::/run/sshd:/bin/false" >>"$root/etc/passwd"
  printf 'HostKey /etc/ssh/ssh_host_ed25519_key\nUsePAM no\nPermitRootLogin no\nPidFile /run/sshd.pid\n' \
    >"$root/etc/ssh/sshd_config"
  # Debian's qemu-ga sets the clock (guest-set-time) only where /sbin/hwclock is.
  ln -s ../bin/busybox "$root/sbin/hwclock"
fi

cat >"$root/etc/rcS" <<'RCS'
#!/bin/sh
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mkdir -p /run/sshd /var/lib/cloud/data /var/lib/cloud/seed
for module in $(cat /etc/modules); do insmod "/lib/modules/$module" 2>/dev/null; done
hostname -F /etc/hostname
echo "127.0.1.1 $(hostname)" >>/etc/hosts
ip link set lo up
# iputils' ping for every user through ICMP sockets, as distributions allow.
echo "0 2147483647" >/proc/sys/net/ipv4/ping_group_range
# The boot disk (FAT) read-write at /boot: the wtmp file lives there, across reboots.
for dir in /sys/block/vd*; do
  [ -e "$dir" ] || continue
  mount -t vfat "/dev/${dir##*/}" /boot 2>/dev/null && [ -f /boot/syslinux.cfg ] && break
  umount /boot 2>/dev/null
done
. /etc/utmp.sh
if touch /boot/wtmp 2>/dev/null; then ln -sf /boot/wtmp /var/log/wtmp; fi
utmp_record 2 0 "~" "~~" reboot >>/var/log/wtmp
sync
# cloud-init's NoCloud (cidata) or ConfigDrive (config-2) seed.
seed=/var/lib/cloud/seed
# The label of an ISO 9660 volume (at byte 32808) or a FAT one (byte 43, or 71 on FAT32).
label() { dd if="$1" bs="$2" skip="$3" count="$4" 2>/dev/null | tr -d ' \000'; }
dev=""
for candidate in /dev/vd? /dev/sr?; do
  [ -b "$candidate" ] || continue
  for type in "iso9660 8 4101 4" "vfat 1 43 11" "vfat 1 71 11"; do
    set -- $type
    case "$(label "$candidate" "$2" "$3" "$4")" in
      cidata | CIDATA | config-2 | CONFIG-2) mount -t "$1" -o ro "$candidate" "$seed" && dev=$candidate ;;
    esac
    [ -n "$dev" ] && break 2
  done
done
user=$(cat /etc/default-user)
home=$(awk -F: -v u="$user" '$1 == u { print $6 }' /etc/passwd)
if [ -f "$seed/meta-data" ]; then
  meta=$seed/meta-data user_data=$seed/user-data
  name=$(jq -r '."local-hostname" // empty' "$meta" 2>/dev/null)
  id=$(jq -r '."instance-id" // empty' "$meta" 2>/dev/null)
  keys=$(jq -r '."public-keys" // {} | .[]' "$meta" 2>/dev/null)
elif [ -f "$seed/openstack/latest/meta_data.json" ]; then
  meta=$seed/openstack/latest/meta_data.json user_data=$seed/openstack/latest/user_data
  name=$(jq -r '.local_hostname // .hostname // empty' "$meta" 2>/dev/null)
  id=$(jq -r '.instance_id // .uuid // empty' "$meta" 2>/dev/null)
  keys=$(jq -r '.public_keys // {} | .[]' "$meta" 2>/dev/null)
else
  meta=""
fi
if [ -n "$meta" ]; then
  echo "virtnode-substitute: cloud-init seed on $dev"
  [ -n "$name" ] && hostname "$name" && echo "127.0.1.1 $name" >>/etc/hosts
  [ -n "$id" ] && echo "$id" >/var/lib/cloud/data/instance-id
  if [ -n "$keys" ]; then
    mkdir -p "$home/.ssh"
    echo "$keys" >>"$home/.ssh/authorized_keys"
    chown -R "$user:" "$home/.ssh"
    chmod 0700 "$home/.ssh"
  fi
  if [ -f "$user_data" ] && [ "$(head -c 2 "$user_data")" = "#!" ]; then
    cp "$user_data" /var/lib/cloud/user-data
    chmod 0700 /var/lib/cloud/user-data
    (/var/lib/cloud/user-data >>/var/log/cloud-init-output.log 2>&1 ||
      echo "virtnode-substitute: user-data exited $?") </dev/null
  fi
fi
[ -d "$home" ] && [ "$home" != /root ] && chown "$user:" "$home"
iface=""
for dir in /sys/class/net/*; do
  [ "${dir##*/}" = lo ] || { iface=${dir##*/}; break; }
done
if [ -n "$iface" ]; then
  ip link set "$iface" up
  mkdir -p /www
  udhcpc -i "$iface" -s /etc/lease -t 0 -T 1 -A 1 -b -O search -O staticroutes -O mtu -O hostname -O domain >/dev/null 2>&1
fi
acpid -c /etc/acpi
if [ -x /usr/sbin/sshd ]; then
  /usr/bin/ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key && /usr/sbin/sshd
fi
if [ -x /usr/sbin/qemu-ga ] && mke2fs -q /dev/ram0 >/dev/null 2>&1; then
  mkdir -p /data && mount -t ext4 /dev/ram0 /data
fi
echo "virtnode-substitute: booted $(. /etc/os-release; echo "$NAME")"
RCS
cat >"$root/etc/rcK" <<'RCK'
#!/bin/sh
sync
umount /boot 2>/dev/null
RCK
chmod 0755 "$root/bin/nc" "$root/sbin/shutdown" "$root/etc/acpi/PWRF/00000080" "$root/etc/rcS" \
  "$root/etc/rcK" "$root/etc/lease"
[[ ! -e $root/etc/agent ]] || chmod 0755 "$root/etc/agent"
ln -s bin/busybox "$root/init"

log "$flavour: initramfs and disk"
pack_initramfs "$root" "$work/initrd"
boot_disk "$work/disk.img" VIRTNODE "$work/kernel/boot/vmlinuz-$abi" "$work/initrd" \
  "console=ttyS0,115200 quiet loglevel=3 panic=-1 mitigations=off" 8192
fit_crc32_int32 "$work/disk.img"
rm -rf "$out"
mkdir -p "$out.tmp"
mv "$work/disk.img" "$out.tmp/disk.img"
{
  echo "$kernel_package $kernel_version"
  echo "busybox-static $busybox_version"
  echo "syslinux $syslinux_version"
  printf '%s\n' "${package_pins[@]}"
} >"$out.tmp/versions"
touch "$out.tmp/.done"
mv "$out.tmp" "$out"
log "built: $out ($(du -h "$out/disk.img" | cut -f1))"
echo "$out"
