# Sourced by the guest builders (guest/build.sh, guest/suite_images.sh), after
# build_lib.sh: the pieces every guest made from Debian's packages shares.
#
#   guest_kernel                       # checks the build's tools; sets kernel_package,
#                                      # kernel_version, abi, busybox_version, syslinux_version
#   package_versions <pkg>...          # sets package_pins: pkg=version, as apt has them
#   unpack_packages <dir> <pkg=ver>... # apt-get download and dpkg-deb -x into <dir>
#   copy_program <root> <tree> <path>  # <tree>/<path> to <root>/<path>, with every
#                                      # library it loads, found in <tree> only
#   pack_initramfs <root> <out>        # a gzipped newc cpio of <root>
#   boot_disk <disk> <label> <vmlinuz> <initrd> <append> [<spare KiB>]
#                                      # a FAT filesystem with SYSLINUX, no partitions
#
# guest/utmp.sh is not sourced here: the guests' own shells source it at boot.

guest_kernel() {
  kernel_package=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
  [[ -n $kernel_package ]] || {
    echo "$build_name: Cannot find the kernel package linux-image-amd64 depends on (apt-get update?)" >&2
    exit 1
  }
  kernel_version=$(apt-cache policy "$kernel_package" | sed -n 's/^ *Candidate: //p')
  abi=${kernel_package#linux-image-}
  local tool
  for tool in busybox syslinux mformat mcopy gzip python3; do
    command -v "$tool" >/dev/null || {
      echo "$build_name: Cannot build a guest: \"$tool\" is missing (deploy/setup.sh installs it)" >&2
      exit 1
    }
  done
  busybox_version=$(dpkg-query -W -f='${Version}' busybox-static)
  syslinux_version=$(dpkg-query -W -f='${Version}' syslinux)
}

package_versions() {
  package_pins=()
  local package version
  for package in "$@"; do
    version=$(apt-cache policy "$package" | sed -n 's/^ *Candidate: //p')
    [[ -n $version && $version != "(none)" ]] || {
      echo "$build_name: Cannot find the package $package (apt-get update?)" >&2
      exit 1
    }
    package_pins+=("$package=$version")
  done
}

unpack_packages() {
  local dir=$1 deb
  shift
  mkdir -p "$dir/.debs"
  (cd "$dir/.debs" && apt-get download -qq "$@" 2>/dev/null)
  for deb in "$dir"/.debs/*.deb; do dpkg-deb -x "$deb" "$dir"; done
  rm -rf "$dir/.debs"
}

# Copies a program and, resolved against the unpacked tree alone (never this machine's
# libraries), each library it loads into <root>/lib/x86_64-linux-gnu; the loader too.
copy_program() {
  local root=$1 tree=$2 path=$3 name arrow lib _
  mkdir -p "$root/$(dirname "$path")" "$root/lib/x86_64-linux-gnu" "$root/lib64"
  rm -f "$root/$path"
  cp -a "$tree/$path" "$root/$path"
  local libs=$tree/lib/x86_64-linux-gnu:$tree/usr/lib/x86_64-linux-gnu:$tree/usr/libexec/sudo
  while read -r name arrow lib _; do
    [[ $arrow == "=>" ]] || continue
    [[ $lib == "$tree/"* ]] || {
      echo "$build_name: $path loads $name from $lib, outside the packages unpacked for it" >&2
      exit 1
    }
    cp -L "$lib" "$root/lib/x86_64-linux-gnu/$name"
  done < <(LD_LIBRARY_PATH=$libs ldd "$tree/$path")
  cp -L "$tree/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$root/lib64/ld-linux-x86-64.so.2"
}

pack_initramfs() {
  (cd "$1" && find . | LC_ALL=C sort | busybox cpio -o -H newc 2>/dev/null) | gzip -9 >"$2"
}

boot_disk() {
  local disk=$1 label=$2 vmlinuz=$3 initrd=$4 append=$5 spare=${6:-4096}
  local size_kib=$(($(du -k "$vmlinuz" | cut -f1) + $(du -k "$initrd" | cut -f1) + spare))
  truncate -s "${size_kib}K" "$disk"
  mformat -i "$disk" -v "$label" ::
  local cfg
  cfg=$(mktemp)
  printf 'DEFAULT guest\nPROMPT 0\nTIMEOUT 0\nLABEL guest\n  KERNEL /vmlinuz\n  INITRD /initrd\n  APPEND %s\n' \
    "$append" >"$cfg"
  mcopy -i "$disk" "$vmlinuz" ::/vmlinuz
  mcopy -i "$disk" "$initrd" ::/initrd
  mcopy -i "$disk" "$cfg" ::/syslinux.cfg
  rm -f "$cfg"
  syslinux --install "$disk"
}

# Sets the FAT volume serial of a boot_disk image so that the image's CRC-32 (IEEE) is below
# 2^31. KubeVirt v1.7.0's virt-handler reports each containerDisk's CRC-32 in a VMI status field
# its CRD declares int32, and Kubernetes v1.37's apiserver refuses a larger value, so that
# handler could never report a VMI of such an image Running. mformat picks a random serial,
# so without this half of all builds would hit it. Nothing in the guest reads the serial.
fit_crc32_int32() {
  python3 - "$1" <<'PY'
import struct, sys, zlib
path = sys.argv[1]
with open(path, "r+b") as f:
    data = bytearray(f.read())
    offset = 39  # BS_VolID of a FAT12/16 boot sector
    serial = struct.unpack_from("<I", data, offset)[0]
    for step in range(1024):
        struct.pack_into("<I", data, offset, (serial + step) & 0xFFFFFFFF)
        if zlib.crc32(data) < 2**31:
            f.seek(offset)
            f.write(data[offset:offset + 4])
            break
    else:
        sys.exit(f"{path}: no volume serial gives a CRC-32 below 2^31")
PY
}
