#!/usr/bin/env bash
# Installs what virtnode needs on a Debian 12 machine, then runs a deno task. Idempotent:
# a second run finds everything in place and only prints what it checked. A fresh Debian
# 12 needs nothing beforehand: Debian's packages, npm (for Deno), a Go from
# bookworm-backports (which fetches the toolchain that deploy/cluster/go.mod names from the
# Go module proxy) and a kubectl built from the same k8s.io/kubernetes module as the
# control plane.
#
#   bash deploy/setup.sh start      # what local mode runs, then local mode
#   bash deploy/setup.sh test       # all of it (the tests' peers, node and guests too),
#                                   # then the whole test suite
#   bash deploy/setup.sh            # all of it, nothing run
#   bash deploy/setup.sh local      # what local mode runs, nothing run
#
# Each step prints a line when it starts, with its number, and one when it ends, with how
# long it took and what is left.
set -euo pipefail

DENO_VERSION=2.9.3
# What local mode runs: libvirt and QEMU, the cloud-init disk's ISO tools, the pod-less pod
# network (iproute2, nftables, the CNI plugins), and the preflight's tools.
LOCAL_PACKAGES=(
  libvirt0 libvirt-clients libvirt-daemon libvirt-daemon-driver-qemu
  qemu-system-x86 qemu-utils ovmf genisoimage xorriso iproute2 util-linux openssl kmod systemd
  procps ca-certificates nftables containernetworking-plugins
)
# What only the tests need besides.
TEST_PACKAGES=(
  python3 libxml2-utils debootstrap
  # The local mode test types into and reads a real terminal.
  tmux
  # KubeVirt's virt-launcher, built as a test peer, links libvirt with cgo.
  libvirt-dev pkgconf gcc libc6-dev
  # The test node (tests/harness/node/node.ts): container runtime, kube-proxy's rules.
  containerd runc iptables
  # The launcher image: setcap gives virt-launcher-monitor its file capability.
  libcap2-bin
  # readelf reads the header of a memory dump (virtctl memory-dump) as a user checks it.
  binutils
  # The test guest (Debian's kernel is fetched with apt-get download, never installed:
  # tests/harness/guest/build.sh); a real DHCP client.
  busybox-static syslinux syslinux-common mtools isc-dhcp-client
  # The conformance tier's cluster DNS (kube-system/kube-dns), which KubeVirt's suite needs.
  dnsmasq-base
  # The conformance tier records the commit its results came from.
  git
)
# Debian 12's own Go is 1.19; backports has one that can fetch a newer toolchain.
GO_BACKPORTS_PACKAGE=golang-1.23-go
GO_BACKPORTS_BIN=/usr/lib/go-1.23/bin/go
BACKPORTS_FILE=/etc/apt/sources.list.d/virtnode-bookworm-backports.list

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# debian_mirror: the archive this machine's apt uses, for bookworm-backports.
# shellcheck source=build_lib.sh
source deploy/build_lib.sh
case ${1:-} in
  start | local) plan=local ;;
  *) plan=all ;;
esac
# The steps of this run, in order: their names, for the "left" of each progress line.
steps=("Debian packages" "npm" "Deno" "npm dependencies" "Go")
[[ $plan == all ]] && steps+=("downloads in the background")
steps+=("control plane and kubectl" "KubeVirt's CRDs and admission")
if [[ $plan == all ]]; then
  steps+=("virtctl" "KubeVirt's programs as test peers"
    "KubeVirt's monitoring rules" "the test node's programs" "containerd 2" "Multus"
    "the launcher image" "the downloads' end")
fi
steps+=("kubectl on PATH")
started=${EPOCHREALTIME/./}
step_started=$started
step_index=0
seconds_since() {
  local tenths=$(((${EPOCHREALTIME/./} - $1) / 100000))
  printf '%d.%d' $((tenths / 10)) $((tenths % 10))
}
# The steps after the first $1, joined ("none" at the end).
left_steps() {
  local rest=("${steps[@]:$1}")
  if [[ ${#rest[@]} -eq 0 ]]; then
    echo none
  else
    local IFS=,
    echo "${#rest[@]} (${rest[*]})" | sed 's/,/, /g'
  fi
}
# Ends the step before (its time, what is left) and starts the next.
step() {
  if [[ $step_index -gt 0 ]]; then
    local left=$((${#steps[@]} - step_index))
    printf '    done in %s s (%s s so far); left: %s\n' "$(seconds_since "$step_started")" \
      "$(seconds_since "$started")" "$(left_steps "$step_index")"
  fi
  step_started=${EPOCHREALTIME/./}
  step_index=$((step_index + 1))
  printf '\n==> [%d/%d] %s\n' "$step_index" "${#steps[@]}" "$*"
}
apt_updated=false

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if ! $apt_updated; then
    echo "apt-get update"
    apt-get update -qq
    apt_updated=true
  fi
  echo "apt-get install $*"
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Prints the Go version $1 runs as for deploy/cluster (after any toolchain switch).
go_version_for_cluster() {
  (cd deploy/cluster && GOTOOLCHAIN=auto "$1" env GOVERSION 2>/dev/null) | sed -n 's/^go//p'
}

# True when version $1 is at least version $2.
version_at_least() {
  [[ $(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1) == "$2" ]]
}

packages=("${LOCAL_PACKAGES[@]}")
[[ $plan == all ]] && packages+=("${TEST_PACKAGES[@]}")
step "Debian packages ($plan): ${packages[*]}"
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "all installed"
else
  echo "installing: ${missing[*]}"
  apt_install "${missing[@]}"
fi

step "npm (installs Deno)"
if command -v npm >/dev/null; then
  echo "$(command -v npm): $(npm --version)"
else
  apt_install npm
  echo "$(command -v npm): $(npm --version)"
fi

step "Deno $DENO_VERSION (npm package \"deno\")"
if command -v deno >/dev/null && deno --version 2>/dev/null | head -1 | grep -q "deno $DENO_VERSION "; then
  echo "$(command -v deno): $(deno --version | head -1)"
else
  npm install -g --no-fund --no-audit "deno@$DENO_VERSION" >/dev/null
  hash -r
  echo "$(command -v deno): $(deno --version | head -1)"
fi

# Deno trusts only its own copy of Mozilla's roots unless told: behind a proxy that signs
# TLS with a CA of its own (installed in the system's store), it cannot fetch npm packages.
# The system's store too, for this and for the deno task this script runs.
export DENO_TLS_CA_STORE=${DENO_TLS_CA_STORE:-mozilla,system}

step "npm dependencies (deno.lock)"
deno install --frozen --quiet
echo "ok"

go_needed=$(sed -n 's/^toolchain go//p' deploy/cluster/go.mod)
go_needed=${go_needed:-$(sed -n 's/^go //p' deploy/cluster/go.mod)}
step "Go >= $go_needed (deploy/cluster/go.mod)"
go_bin=""
tried=" "
for candidate in "${GO:-}" "$(command -v go || true)" /usr/local/go/bin/go "$GO_BACKPORTS_BIN"; do
  [[ -n $candidate && -x $candidate && $tried != *" $candidate "* ]] || continue
  tried+="$candidate "
  have=$(go_version_for_cluster "$candidate")
  echo "$candidate runs as go${have:-?}"
  if [[ -n $have ]] && version_at_least "$have" "$go_needed"; then
    go_bin=$candidate
    break
  fi
done
if [[ -z $go_bin ]]; then
  # From the machine's own Debian archive (a local mirror or proxy included).
  mirror=$(debian_mirror bookworm)
  BACKPORTS_LINE="deb $mirror bookworm-backports main"
  if ! grep -rqsF "$BACKPORTS_LINE" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "adding bookworm-backports: $BACKPORTS_FILE"
    echo "$BACKPORTS_LINE" >"$BACKPORTS_FILE"
    apt_updated=false
  fi
  apt_install -t bookworm-backports "$GO_BACKPORTS_PACKAGE"
  echo "fetching go$go_needed from the Go module proxy (GOTOOLCHAIN=auto)"
  have=$(go_version_for_cluster "$GO_BACKPORTS_BIN")
  if [[ -z $have ]] || ! version_at_least "$have" "$go_needed"; then
    echo "setup.sh: Cannot get go$go_needed: $GO_BACKPORTS_BIN runs as go${have:-?}" >&2
    exit 1
  fi
  go_bin=$GO_BACKPORTS_BIN
  echo "$go_bin runs as go$have"
fi
# build.sh (also run by the tests) finds the same Go; GO makes it explicit here.
export GO=$go_bin GOTOOLCHAIN=auto

# The builds that mostly wait on Debian's archive (promtool, the virtnode image's Debian layer,
# the test guest's kernel and busybox) run beside the Go builds, which keep both cores busy.
# Their output goes to a log that is printed when they are waited for.
background_log=""
background_pid=""
if [[ $plan == all ]]; then
  step "downloads in the background: promtool from Debian's prometheus package (tests/harness/promtool.sh), the virtnode image's Debian layer (deploy/image/base.sh), the test guest (tests/harness/guest/build.sh); all cached"
  background_log=$(mktemp /tmp/virtnode-setup-background.XXXXXX)
  (
    set -e
    bash tests/harness/promtool.sh
    bash deploy/image/base.sh
    bash tests/harness/guest/build.sh
  ) >"$background_log" 2>&1 &
  background_pid=$!
  echo "started (pid $background_pid, log $background_log)"
fi

step "control plane and kubectl (built from Go modules by deploy/cluster/build.sh; cached)"
cluster_bin=$(bash deploy/cluster/build.sh)
echo "$cluster_bin"
step "KubeVirt's CRDs and admission (built from kubevirt.io/kubevirt by deploy/kubevirt/build.sh; cached)"
bash deploy/kubevirt/build.sh

if [[ $plan == all ]]; then
  step "virtctl and KubeVirt's virt-api, which local mode's --virtctl runs too (deploy/kubevirt/build_virtctl.sh; cached)"
  bash deploy/kubevirt/build_virtctl.sh
  step "KubeVirt's programs as test peers: launcher, handler, controller, clients (tests/harness/kubevirt/build_peers.sh; cached)"
  kubevirt_bin=$(bash tests/harness/kubevirt/build_peers.sh)
  echo "$kubevirt_bin"
  step "KubeVirt's alerts, recording rules and virt-handler's metric families (tests/harness/kubevirt/build_monitoring.sh; cached)"
  bash tests/harness/kubevirt/build_monitoring.sh
  step "the test node's programs: kubelet, scheduler, controller manager, kube-proxy (tests/harness/node/build.sh; cached)"
  bash tests/harness/node/build.sh
  step "containerd 2 for the node test of KubeVirt's ImageVolume gate (tests/harness/node/build_containerd.sh; cached)"
  bash tests/harness/node/build_containerd.sh
  step "Multus's thin plugin and the NetworkAttachmentDefinition CRD for the secondary-network tests (tests/harness/node/build_multus.sh; cached)"
  bash tests/harness/node/build_multus.sh
  step "the launcher image's root: Debian 12, libvirt, QEMU, KubeVirt's virt-launcher (tests/harness/node/images.sh; cached)"
  bash tests/harness/node/images.sh launcher "$kubevirt_bin"
  step "the downloads' end: promtool, the virtnode image's Debian layer, the test guest"
  background_status=0
  wait "$background_pid" || background_status=$?
  cat "$background_log"
  rm -f "$background_log"
  if [[ $background_status -ne 0 ]]; then
    echo "setup.sh: a background build failed (exit $background_status); its log is above" >&2
    exit 1
  fi
fi

step "kubectl on PATH"
# A link we made earlier points into the cache; a kubectl of the machine's own is kept.
link=/usr/local/bin/kubectl
if [[ -L $link && $(readlink "$link") == */cluster/*/kubectl ]] && [[ $(readlink "$link") != "$cluster_bin/kubectl" ]]; then
  ln -sfn "$cluster_bin/kubectl" "$link"
  echo "updated $link -> $cluster_bin/kubectl"
elif command -v kubectl >/dev/null; then
  echo "$(command -v kubectl) (already on PATH)"
else
  ln -sfn "$cluster_bin/kubectl" "$link"
  echo "linked $link -> $cluster_bin/kubectl"
fi
kubectl version --client | sed -n 1p

printf '    done in %s s\n' "$(seconds_since "$step_started")"
echo
echo "setup ($plan) done in $(seconds_since "$started") s"

if [[ $# -gt 0 && $1 != local ]]; then
  task=$1
  shift
  printf '\n==> deno task %s\n' "$task $*"
  exec deno task "$task" "$@"
fi
