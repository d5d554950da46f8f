#!/usr/bin/env bash
# Builds what the conformance tier needs of KubeVirt beyond build.sh, from the Go module
# proxy (the kubevirt.io/kubevirt version go.mod names), into a cache outside git, and
# prints the directory (the only line on stdout). The directory holds:
#
#   tests.test           KubeVirt's functional test suite (the Ginkgo package
#                        kubevirt.io/kubevirt/tests), compiled with `go test -c`
#   virt-operator        KubeVirt's operator, as its image runs it
#   manifest-templator   KubeVirt's tool that fills in its release manifests
#   virt-operator.yaml   manifests/release/kubevirt-operator.yaml.in, as the templator fills
#                        it for the image prefix and tag below (kubevirt namespace)
#   kubevirt-cr.yaml     the KubeVirt CR of the release, filled in the same way
#   testing/             manifests/testing of the module (the suite's RBAC and helpers)
#   tests/               the suite's data files: tests/testdata and tests/*-config.json
#
# The images the manifests name are `virtnode.local/kubevirt/<name>:v1.7.0`
# (SUITE_IMAGE_PREFIX, SUITE_IMAGE_TAG): tests/harness/node builds them and imports them under
# those names, since no registry is reachable here.
#
# Built in a copy of go.mod and go.sum (a build may extend them), with a tools file that
# pins the suite's own packages: kubevirt.io/kubevirt/tests holds only _test.go files.
#
#   tests/harness/kubevirt/build_suite.sh
#
# Environment: VIRTNODE_CACHE (default ~/.cache/virtnode), GO, GOTOOLCHAIN (as build.sh).
set -euo pipefail
build_name=kubevirt/build_suite.sh
# shellcheck source=../../../deploy/build_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../../deploy/build_lib.sh"

SUITE_IMAGE_PREFIX=virtnode.local/kubevirt
SUITE_IMAGE_TAG=v1.7.0

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# KubeVirt's module recipe (go.mod, go.sum) is deploy/kubevirt's, shared with its build.sh.
cd "$here/../../../deploy/kubevirt"
find_go

go_version=$("$GO" env GOVERSION)
key=$(
  {
    echo "$go_version $("$GO" env GOOS GOARCH) $SUITE_IMAGE_PREFIX $SUITE_IMAGE_TAG"
    cat "$here/build_suite.sh" go.mod go.sum
  } | sha256sum | cut -c1-16
)
cache_root=${VIRTNODE_CACHE:-$HOME/.cache/virtnode}/kubevirt-suite
out=$cache_root/$key
built() {
  [[ -x $out/tests.test && -x $out/virt-operator && -s $out/virt-operator.yaml &&
    -s $out/kubevirt-cr.yaml && -d $out/tests/testdata ]]
}
cache_enter "$cache_root" built

staging_dir=$(mktemp -d "$cache_root/.build.XXXXXX")
trap 'rm -rf "$staging_dir"' EXIT
module=$staging_dir/module
mkdir "$module"
cp go.mod go.sum "$module/"
cat >"$module/suite_tools.go" <<'EOF'
//go:build tools

// Pins the packages of KubeVirt's functional suite in this module's requirements.
package tools

import (
	_ "kubevirt.io/kubevirt/tests/decorators"
	_ "kubevirt.io/kubevirt/tests/flags"
	_ "kubevirt.io/kubevirt/tests/testsuite"
	_ "kubevirt.io/qe-tools/pkg/ginkgo-reporters"
)
EOF
(
  cd "$module"
  export CGO_ENABLED=0 GOFLAGS=-mod=mod
  log "go test -c kubevirt.io/kubevirt/tests ($go_version)"
  "$GO" test -c -trimpath -ldflags "-s -w" -o "$staging_dir/tests.test" kubevirt.io/kubevirt/tests
  for program in virt-operator; do
    log "go build kubevirt.io/kubevirt/cmd/$program"
    "$GO" build -trimpath -ldflags "-s -w" -o "$staging_dir/$program" \
      "kubevirt.io/kubevirt/cmd/$program"
  done
  log "go build kubevirt.io/kubevirt/tools/manifest-templator"
  "$GO" build -trimpath -ldflags "-s -w" -o "$staging_dir/manifest-templator" \
    kubevirt.io/kubevirt/tools/manifest-templator
)
module_dir=$(cd "$module" && GOFLAGS=-mod=mod "$GO" list -m -f '{{.Dir}}' kubevirt.io/kubevirt)
# As KubeVirt's hack/build-manifests.sh: the generated manifests go in first, then the
# variables (the second pass reads the first's output as its template).
for manifest in kubevirt-operator kubevirt-cr; do
  target=$manifest.yaml
  [[ $manifest == kubevirt-operator ]] && target=virt-operator.yaml
  log "filling in manifests/release/$manifest.yaml.in"
  "$staging_dir/manifest-templator" --process-files \
    --generated-manifests-dir="$module_dir/manifests/generated" \
    --input-file="$module_dir/manifests/release/$manifest.yaml.in" >"$staging_dir/$manifest.in"
  "$staging_dir/manifest-templator" --process-vars --input-file="$staging_dir/$manifest.in" \
    --kubevirt-logo-path="$module_dir/assets/kubevirt_logo.png" \
    --namespace=kubevirt --container-prefix="$SUITE_IMAGE_PREFIX" \
    --container-tag="$SUITE_IMAGE_TAG" --image-pull-policy=IfNotPresent \
    --verbosity=2 >"$staging_dir/$target"
  rm "$staging_dir/$manifest.in"
done
cp -r "$module_dir/manifests/testing" "$staging_dir/testing"
mkdir "$staging_dir/tests"
cp -r "$module_dir/tests/testdata" "$module_dir"/tests/*-config.json "$staging_dir/tests/"
chmod -R u+w "$staging_dir/testing" "$staging_dir/tests"
rm -rf "$module"
rm -rf "$out"
mv "$staging_dir" "$out"
chmod 755 "$out"
log "done: $out"
echo "$out"
