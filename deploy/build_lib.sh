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
