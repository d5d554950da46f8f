#!/usr/bin/env bash
# Runs inside the fresh root (see check.sh), from the checkout: checks that every
# program and library the tests and local mode call is installed, and that Deno
# type-checks the agent. Prints one line per check; exits 1 when any failed.
set -uo pipefail

failed=0
check() {
  local what=$1 out
  shift
  if out=$("$@" 2>&1); then
    printf 'ok       %-34s %s\n' "$what" "$(head -1 <<<"$out")"
  else
    printf 'MISSING  %-34s %s\n' "$what" "$(head -3 <<<"$out" | tr '\n' ' ')"
    failed=$((failed + 1))
  fi
}

# The local plan (setup.sh local) installs what local mode calls, not the tests' programs.
plan=${VIRTNODE_FRESH_PLAN:-all}
if [[ $plan == all ]]; then
  while read -r program; do
    [[ -n $program ]] && check "$program" command -v "$program"
  done < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' tests/fresh/programs.txt)
else
  for program in deno virsh qemu-system-x86_64 qemu-img ip nft xorriso kubectl; do
    check "$program" command -v "$program"
  done
fi

check "libvirt.so.0 (FFI)" bash -c 'ldconfig -p | grep -m1 "libvirt\.so\.0 "'
check "/usr/share/OVMF/OVMF_CODE_4M.fd" ls /usr/share/OVMF/OVMF_CODE_4M.fd
[[ $plan == all ]] && check "virt-xml-validate on a fixture" \
  virt-xml-validate tests/fixtures/converter/bios-serial.xml domain
check "kubectl version --client" kubectl version --client
check "deno --version" deno --version
# What cluster.ts runs: build.sh must find Go and its cache without setup.sh's GO.
check "deploy/cluster/build.sh (cached)" \
  bash -c 'env -u GO bash deploy/cluster/build.sh 2>/dev/null | tail -1 | xargs -I{} ls {}/etcd {}/kube-apiserver {}/kubectl'
check "deploy/kubevirt/build.sh (cached)" \
  bash -c 'env -u GO bash deploy/kubevirt/build.sh 2>/dev/null | tail -1 | xargs -I{} ls {}/kubevirt-admission {}/crds/virtualmachineinstances.kubevirt.io.json'
[[ $plan == all ]] && check "tests/harness/kubevirt/build_peers.sh (cached)" \
  bash -c 'env -u GO bash tests/harness/kubevirt/build_peers.sh 2>/dev/null | tail -1 | xargs -I{} ls {}/virt-launcher {}/virt-launcher-monitor {}/virt-handler {}/crds/virtualmachineinstances.kubevirt.io.json'
check "deno check main.ts" deno check main.ts

if [[ $failed -gt 0 ]]; then
  echo "$failed checks failed"
  exit 1
fi
echo "all checks passed"
