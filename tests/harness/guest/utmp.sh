# Sourced by the guests' busybox shells at boot (guest/build.sh, guest/suite_images.sh):
# glibc's 384-byte struct utmp records, which busybox has no program to write.
#
#   utmp_record <type> <pid> <line> <id> <user>   # one record on stdout, stamped now
#
# Types: 2 BOOT_TIME (line "~", user "reboot": what `last reboot` lists), 7 USER_PROCESS.

utmp_field() { printf '%s' "$1"; dd if=/dev/zero bs=1 count=$(($2 - ${#1})) 2>/dev/null; }

utmp_le32() {
  v=$1
  for byte in 0 1 2 3; do
    printf "\\$(printf %03o $((v & 255)))"
    v=$((v >> 8))
  done
}

utmp_record() {
  utmp_le32 "$1"
  utmp_le32 "$2"
  utmp_field "$3" 32
  utmp_field "$4" 4
  utmp_field "$5" 32
  utmp_field "" 256
  utmp_le32 0
  utmp_le32 0
  utmp_le32 "$(date +%s)"
  utmp_le32 0
  utmp_field "" 36
}
