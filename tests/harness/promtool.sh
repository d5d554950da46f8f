#!/usr/bin/env bash
# Puts promtool, from Debian's prometheus package, into a cache outside git and prints
# its path (the only line on stdout). The package is downloaded and unpacked, never
# installed: installing it would also enable and start a Prometheus server on the host.
# Keyed by the package version.
#
#   tests/harness/promtool.sh
set -euo pipefail
build_name=promtool.sh
# shellcheck source=../../deploy/build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../deploy/build_lib.sh"

version=$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: //p')
[[ -n $version && $version != "(none)" ]] || {
  echo "promtool.sh: Debian's prometheus package is not available (apt-get update?)" >&2
  exit 1
}
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/promtool
out=$cache_root/${version//[^A-Za-z0-9.+-]/_}
built() { [[ -x $out/promtool ]]; }
if built; then
  log "cached: $out/promtool"
  echo "$out/promtool"
  exit 0
fi
mkdir -p "$cache_root"
exec 9>"$cache_root/.lock"
flock 9
staging_dir=$(mktemp -d "$cache_root/.build.XXXXXX")
trap 'rm -rf "$staging_dir"' EXIT
chmod 755 "$staging_dir" # apt-get download runs as _apt where it can
log "apt-get download prometheus=$version"
(cd "$staging_dir" && apt-get download -q "prometheus=$version" >/dev/null)
dpkg-deb -x "$staging_dir"/prometheus_*.deb "$staging_dir/root"
mkdir "$staging_dir/out"
cp "$staging_dir/root/usr/bin/promtool" "$staging_dir/out/promtool"
rm -rf "$out"
mv "$staging_dir/out" "$out"
log "done: $out/promtool"
echo "$out/promtool"
