#!/bin/sh
# The guest's chpasswd, which QEMU's guest agent runs for guest-set-user-password (busybox
# has no chpasswd): reads "user:password" lines on standard input and puts each password's
# SHA-512 crypt into /etc/shadow; with -e the passwords come crypted already. A user not in
# /etc/shadow is an error, as it is for shadow's chpasswd.
crypted=
[ "$1" = -e ] && crypted=1
status=0
while IFS= read -r line || [ -n "$line" ]; do
  user=${line%%:*}
  password=${line#*:}
  if ! grep -q "^$user:" /etc/shadow; then
    echo "chpasswd: user '$user' does not exist" >&2
    status=1
    continue
  fi
  if [ -n "$crypted" ]; then hash=$password; else hash=$(mkpasswd -m sha512 "$password"); fi
  awk -F: -v OFS=: -v u="$user" -v h="$hash" '$1 == u { $2 = h } { print }' /etc/shadow \
    >/etc/shadow.new && mv /etc/shadow.new /etc/shadow && chmod 600 /etc/shadow
done
exit $status
