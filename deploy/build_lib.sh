# Sourced by the build scripts under deploy/ (cluster/build.sh, kubevirt/build.sh,
# node/build.sh, node/images.sh): finding Go, timestamped logs on stderr, and the
# content-keyed cache directory with its lock.
#
#   build_name=<name>                 # the log prefix
#   source "$(dirname "${BASH_SOURCE[0]}")/../build_lib.sh"
#   find_go                           # sets GO unless set, exports GOTOOLCHAIN
#   log "message"                     # [<name>  12.3s] message
#   out=<cache dir>/<key>
#   cache_enter <cache dir> <check>   # when <check> passes (now, or after waiting for
#                                     # another build's lock): prints $out and exits;
#                                     # otherwise returns holding the lock
#   cache_stage <cache dir>           # $staging: a fresh folder there, gone on exit
#   cache_done [detail]               # $staging becomes $out; prints it
#   mirror=$(debian_mirror bookworm)  # the Debian archive this machine's apt uses
#   debian_root <staging> <apt cache> <suite> <mirror> <packages...>
#                                     # a minimal Debian root in <staging>/root

build_started=${EPOCHREALTIME/./}

log() {
  local elapsed=$(((${EPOCHREALTIME/./} - build_started) / 100000))
  printf '[%s %4d.%ds] %s\n' "${build_name:-build}" $((elapsed / 10)) $((elapsed % 10)) "$*" >&2
}

# setup.sh passes GO; otherwise the Go on PATH, the official tarball's, or backports' 1.23
# (which fetches the toolchain the go.mod names: GOTOOLCHAIN=auto).
find_go() {
  if [[ -z ${GO:-} ]]; then
    GO=/usr/local/go/bin/go
    if command -v go >/dev/null; then
      GO=go
    elif [[ ! -x $GO && -x /usr/lib/go-1.23/bin/go ]]; then
      GO=/usr/lib/go-1.23/bin/go
    fi
  fi
  export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
}

cache_enter() {
  local root=$1 check=$2
  if "$check"; then
    log "cached: $out"
    echo "$out"
    exit 0
  fi
  mkdir -p "$root"
  # One build at a time: processes that start together wait for the first.
  exec 9>"$root/.lock"
  flock 9
  if "$check"; then
    log "built by another process: $out"
    echo "$out"
    exit 0
  fi
}

# Makes $staging, a fresh folder in <cache dir> that the build writes into and that is
# removed when the script exits before cache_done.
cache_stage() {
  staging=$(mktemp -d "$1/.build.XXXXXX")
  trap 'rm -rf "$staging"' EXIT
}

# Puts the finished $staging in place as $out (replacing what a failed build left), logs it
# with [detail] and prints it, the script's one line on stdout.
cache_done() {
  rm -rf "$out"
  mv "$staging" "$out"
  chmod 755 "$out"
  trap - EXIT
  log "done: $out${1:+ ($1)}"
  echo "$out"
}

# Prints the Debian archive this machine's apt takes <suite> (default bookworm) from: the
# URI of the first enabled `deb` entry for that suite in /etc/apt/sources.list,
# sources.list.d/*.list (one-line) or sources.list.d/*.sources (deb822), so that a local
# mirror or proxy serves every build too. VIRTNODE_DEBIAN_MIRROR overrides it;
# VIRTNODE_APT_ROOT reads another root's files (tests). Fails naming the files read when
# none has such an entry.
debian_mirror() {
  local suite=${1:-bookworm} root=${VIRTNODE_APT_ROOT:-} files=() f uri
  if [[ -n ${VIRTNODE_DEBIAN_MIRROR:-} ]]; then
    echo "$VIRTNODE_DEBIAN_MIRROR"
    return 0
  fi
  for f in "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*.list \
    "$root"/etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] && files+=("$f")
  done
  if [[ ${#files[@]} -gt 0 ]]; then
    uri=$(awk -v suite="$suite" '
      function has(list, word,   n, i, a) {
        n = split(list, a, /[ \t]+/)
        for (i = 1; i <= n; i++) if (a[i] == word) return 1
        return 0
      }
      # A deb822 stanza ends at a blank line or with its file.
      function stanza() {
        if (uris != "" && has(types, "deb") && has(suites, suite) && enabled != "no") {
          split(uris, u, /[ \t]+/); print u[1]; found = 1; exit
        }
        types = ""; uris = ""; suites = ""; enabled = ""
      }
      FNR == 1 { stanza() }
      FILENAME ~ /\.sources$/ {
        if ($0 ~ /^[ \t]*$/) { stanza(); next }
        if ($0 ~ /^#/) next
        key = tolower($1); sub(/:$/, "", key)
        value = $0; sub(/^[^:]*:[ \t]*/, "", value)
        if (key == "types") types = value
        else if (key == "uris") uris = value
        else if (key == "suites") suites = value
        else if (key == "enabled") enabled = tolower(value)
        next
      }
      $1 == "deb" {
        line = $0; gsub(/\[[^]]*\]/, "", line)
        n = split(line, f, /[ \t]+/)
        if (n >= 3 && f[3] == suite) { print f[2]; found = 1; exit }
      }
      END { if (!found) stanza() }
    ' "${files[@]}")
  fi
  if [[ -z ${uri:-} ]]; then
    echo "Cannot find a Debian archive for $suite: no enabled 'deb' entry for it in" \
      "${files[*]:-$root/etc/apt/sources.list or $root/etc/apt/sources.list.d/}" \
      "(add one, or set VIRTNODE_DEBIAN_MIRROR)" >&2
    return 1
  fi
  echo "${uri%/}"
}

# Builds a minimal Debian root (debootstrap's minbase) in <staging>/root and installs
# <packages> into it from <mirror>, with no service started and apt's lists and caches left
# out; <apt cache> keeps the downloaded packages for the next build. The logs stay in
# <staging>; their last lines go to stderr when a step fails. Needs root.
debian_root() {
  local staging=$1 apt_cache=$2 suite=$3 mirror=$4
  shift 4
  local root=$staging/root
  mkdir -p "$apt_cache"
  log "debootstrap $suite (minbase) from $mirror"
  debootstrap --variant=minbase --cache-dir="$apt_cache" "$suite" "$root" "$mirror" \
    >"$staging/debootstrap.log" 2>&1 || {
    tail -20 "$staging/debootstrap.log" >&2
    return 1
  }
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  log "apt-get install $*"
  # /proc for the packages' scripts, in a mount namespace that ends with the command.
  unshare --mount --fork -- bash -c "
    mount -t proc proc '$root/proc'
    chroot '$root' apt-get update -qq
    DEBIAN_FRONTEND=noninteractive chroot '$root' apt-get install -y -qq \\
      --no-install-recommends $*
    chroot '$root' apt-get clean
  " >"$staging/apt.log" 2>&1 || {
    tail -20 "$staging/apt.log" >&2
    return 1
  }
  rm -f "$root/usr/sbin/policy-rc.d"
  rm -rf "$root/var/lib/apt/lists"/* "$root/var/cache/apt"/*.bin
}
