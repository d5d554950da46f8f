#!/usr/bin/env bash
# Fresh-machine check: installs virtnode with deploy/setup.sh into a freshly
# debootstrapped Debian 12 root and checks that every program the tests and local
# mode call is there afterwards, so a package installed by hand on a developer's
# machine cannot hide a gap in setup.sh.
#
#   bash tests/fresh/check.sh
#
# Two settings measure a new user's first run instead (timings at the end):
#   VIRTNODE_FRESH_PLAN=local   `setup.sh local` (what `setup.sh start` installs) and the
#                               checks of what local mode calls, instead of all of it
#   VIRTNODE_FRESH_COLD=1       none of the host's caches: every download and build
#                               from nothing, as on a new machine
#
# - The debootstrapped root is cached by key under $VIRTNODE_CACHE/fresh/ (default
#   ~/.cache/virtnode) and stays pristine: each run works on an overlay of it.
# - The checkout is the working tree without what git ignores (node_modules,
#   caches): an edit to setup.sh is checked before it is committed.
# - The host's build caches (Go modules and build cache, ~/.cache/virtnode with
#   the built control plane, npm's and Deno's caches, and an apt archive cache of
#   this check's own) are bind-mounted, so the run checks installation, not
#   compile or download time.
# - Everything runs in a private mount namespace; the trap ends every process in
#   the root, unmounts and removes the temporary root, also on failure or Ctrl-C.
# Needs root, debootstrap and unshare (setup.sh installs them).
set -euo pipefail

SUITE=bookworm
VARIANT=minbase
PLAN=${VIRTNODE_FRESH_PLAN:-all}
[[ $PLAN == all || $PLAN == local ]] || {
  echo "fresh check: VIRTNODE_FRESH_PLAN must be all or local, not \"$PLAN\"" >&2
  exit 2
}
COLD=${VIRTNODE_FRESH_COLD:-}
setup_args=""
[[ $PLAN == local ]] && setup_args=local

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# The archive this machine's apt uses (a local mirror or proxy included); the fresh root's
# own sources.list names it too, and its setup.sh finds it there.
# shellcheck source=../../deploy/build_lib.sh
source "$repo/deploy/build_lib.sh"
MIRROR=$(debian_mirror "$SUITE")
cache=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}
fresh_cache=$cache/fresh

# Mounts made from here on vanish with the namespace, whatever ends this script.
if [[ -z ${VIRTNODE_FRESH_NAMESPACE:-} ]]; then
  exec env VIRTNODE_FRESH_NAMESPACE=1 unshare --mount --propagation private -- bash "$0" "$@"
fi

started=${EPOCHREALTIME/./}
phase_started=$started
timings=()
log() {
  local elapsed=$(((${EPOCHREALTIME/./} - started) / 100000))
  printf '[fresh %4d.%ds] %s\n' $((elapsed / 10)) $((elapsed % 10)) "$*"
}
# Ends a timed phase: remembers "name: seconds" for the summary.
phase_done() {
  local now=${EPOCHREALTIME/./}
  local tenths=$(((now - phase_started) / 100000))
  timings+=("$(printf '%s: %d.%d s' "$1" $((tenths / 10)) $((tenths % 10)))")
  phase_started=$now
  log "$1 done"
}
fail() {
  echo "fresh check: $*" >&2
  exit 1
}

[[ $(id -u) == 0 ]] || fail "Cannot build a root: must run as root"
command -v debootstrap >/dev/null || fail "Cannot build a root: debootstrap is not installed (bash deploy/setup.sh)"

run_dir=""
merged=""
cleanup() {
  local status=$?
  set +e
  trap - EXIT INT TERM
  [[ $status == 0 ]] || phase_done "failed step"
  if [[ -n $merged ]]; then
    # Daemons a package started in the root would keep its mounts busy.
    local pid
    for pid in $(ls /proc | grep -E '^[0-9]+$'); do
      [[ $(readlink "/proc/$pid/root" 2>/dev/null) == "$merged" ]] && kill -KILL "$pid" 2>/dev/null
    done
    umount -R "$merged" 2>/dev/null || umount -R -l "$merged"
  fi
  [[ -n $run_dir ]] && rm -rf "$run_dir"
  phase_done "cleanup"
  echo
  echo "fresh check timings:"
  printf '  %s\n' "${timings[@]}"
  if [[ $status == 0 ]]; then echo "fresh check: passed"; else echo "fresh check: FAILED (exit $status)"; fi
  exit "$status"
}
trap cleanup EXIT
trap 'echo "fresh check: interrupted" >&2; exit 130' INT
trap 'exit 143' TERM

# --- The cached root -----------------------------------------------------------
key=$(
  echo "$SUITE $MIRROR $VARIANT $(dpkg --print-architecture) $(dpkg-query -W -f='${Version}' debootstrap)" |
    sha256sum | cut -c1-16
)
base=$fresh_cache/root-$key
mkdir -p "$fresh_cache/apt-archives/partial" "$fresh_cache/apt-lists/partial"
if [[ -f $base/.virtnode-complete ]]; then
  log "cached root: $base"
else
  exec 9>"$fresh_cache/.lock"
  flock 9
  if [[ ! -f $base/.virtnode-complete ]]; then
    log "debootstrap $SUITE ($VARIANT) into $base"
    rm -rf "$base.tmp"
    debootstrap --variant="$VARIANT" --cache-dir="$fresh_cache/apt-archives" \
      "$SUITE" "$base.tmp" "$MIRROR" >"$fresh_cache/debootstrap.log" 2>&1 ||
      fail "Cannot debootstrap $SUITE: see $fresh_cache/debootstrap.log"
    rm -rf "$base"
    touch "$base.tmp/.virtnode-complete"
    mv "$base.tmp" "$base"
    phase_done "debootstrap (cold)"
  fi
  exec 9>&-
fi
[[ ${#timings[@]} -gt 0 ]] || phase_done "cached root (warm)"

# --- A throwaway root on top of it -------------------------------------------------
run_dir=$(mktemp -d /var/tmp/virtnode-fresh.XXXXXX)
mkdir "$run_dir/upper" "$run_dir/work" "$run_dir/root"
mount -t overlay overlay \
  -o "lowerdir=$base,upperdir=$run_dir/upper,workdir=$run_dir/work" "$run_dir/root"
merged=$run_dir/root
mount -t proc proc "$merged/proc"
mount -t sysfs sysfs "$merged/sys"
mount --rbind /dev "$merged/dev"
# The machine's network setup, not something setup.sh installs: name servers and
# the local CA certificates an egress proxy may need (ca-certificates adds them).
cp /etc/resolv.conf "$merged/etc/resolv.conf"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$merged/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$merged/usr/local/share/ca-certificates/"
fi
# Packages must not start their daemons (libvirtd, virtlogd) inside the root.
printf '#!/bin/sh\nexit 101\n' >"$merged/usr/sbin/policy-rc.d"
chmod 755 "$merged/usr/sbin/policy-rc.d"

bind_cache() {
  local host=$1 inside=$merged$2
  mkdir -p "$host" "$inside"
  mount --bind "$host" "$inside"
}
go_env() {
  if command -v go >/dev/null; then go env "$1"; else echo "$2"; fi
}
if [[ -n $COLD ]]; then
  log "cold: none of the host's caches (Go, builds, npm, Deno, apt)"
else
  bind_cache "$(go_env GOMODCACHE "$HOME/go/pkg/mod")" /root/go/pkg/mod
  bind_cache "$(go_env GOCACHE "$HOME/.cache/go-build")" /root/.cache/go-build
  bind_cache "$cache" /root/.cache/virtnode
  bind_cache "$HOME/.npm" /root/.npm
  bind_cache "${DENO_DIR:-$HOME/.cache/deno}" /root/.cache/deno
  # The host's own /var/cache/apt/archives may be emptied after every install
  # (Docker-style images do that), so the check keeps an archive cache of its own.
  bind_cache "$fresh_cache/apt-archives" /var/cache/apt/archives
  bind_cache "$fresh_cache/apt-lists" /var/lib/apt/lists
fi

mkdir -p "$merged/root/virtnode"
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$repo" ls-files -z --cached --others --exclude-standard | (cd "$repo" && tar --null -T - --ignore-failed-read -cf - 2>/dev/null) |
    tar -xf - -C "$merged/root/virtnode"
else
  tar -C "$repo" --exclude=./.git --exclude=./node_modules -cf - . | tar -xf - -C "$merged/root/virtnode"
fi
phase_done "prepare root (overlay, mounts, checkout)"

# Runs a command in the root with a login-like environment and nothing of ours.
in_root() {
  local env=(HOME=/root LANG=C.UTF-8 TERM=dumb NO_COLOR=1
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
  local name
  for name in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    [[ -n ${!name:-} ]] && env+=("$name=${!name}")
  done
  chroot "$merged" /usr/bin/env -i "${env[@]}" bash -c "cd /root/virtnode && $1"
}

# --- Install -------------------------------------------------------------------
# Runs $1 in the root, its output indented. In the background with `wait`, so Ctrl-C
# reaches the trap at once instead of after dpkg, which ignores SIGINT, finishes.
in_root_shown() {
  in_root "$1" 2>&1 | sed -u 's/^/  | /' &
  wait $!
}

log "in the root: bash deploy/setup.sh $setup_args"
in_root_shown "bash deploy/setup.sh $setup_args" || fail "deploy/setup.sh failed in a fresh root"
phase_done "deploy/setup.sh $setup_args in the fresh root (plan $PLAN${COLD:+, cold})"

log "in the root: bash deploy/setup.sh $setup_args again (must install nothing)"
in_root "bash deploy/setup.sh $setup_args" >"$run_dir/second.log" 2>&1 &
wait $! || {
  sed 's/^/  | /' "$run_dir/second.log"
  fail "the second deploy/setup.sh failed"
}
if grep -E '^(apt-get install|adding bookworm-backports|linked|updated)' "$run_dir/second.log"; then
  fail "the second deploy/setup.sh changed the machine: it is not idempotent"
fi
phase_done "deploy/setup.sh again (idempotent)"

# --- What the tests and local mode call ----------------------------------------------
log "in the root: programs and libraries"
# Every program named literally by a Deno.Command must be on the list the root is checked against.
unlisted=$(
  grep -rhoE --include='*.ts' 'new Deno\.Command\("[^"]+"' "$repo/main.ts" "$repo/mod" "$repo/ffi" \
    "$repo/deploy" "$repo/tests" | sed -E 's/.*\("([^"]+)"/\1/' | sort -u |
    while read -r program; do
      grep -qxF "$program" <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$here/programs.txt") || echo "$program"
    done
)
[[ -z $unlisted ]] || fail "programs called by the code but missing from tests/fresh/programs.txt: $unlisted"
in_root_shown "VIRTNODE_FRESH_PLAN=$PLAN bash tests/fresh/_inside.sh" ||
  fail "the fresh root lacks what the tests call (see above)"
phase_done "checks in the root (programs, deno check main.ts)"
