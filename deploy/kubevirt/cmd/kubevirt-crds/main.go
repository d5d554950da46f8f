// Command kubevirt-crds writes the CustomResourceDefinitions of KubeVirt, as
// KubeVirt's operator generates them, one JSON file per CRD into the directory
// named by its only argument. Nothing here describes a CRD: every field comes
// from KubeVirt's own generator, so the tests run against the same schema a
// KubeVirt install applies.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	extv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kubevirt-crds <output directory>")
		os.Exit(2)
	}
	dir := os.Args[1]
	generators := []func() (*extv1.CustomResourceDefinition, error){
		components.NewVirtualMachineInstanceCrd,
		components.NewVirtualMachineCrd,
		components.NewPresetCrd,
		components.NewReplicaSetCrd,
		components.NewVirtualMachineInstanceMigrationCrd,
		components.NewKubeVirtCrd,
		components.NewVirtualMachinePoolCrd,
		components.NewVirtualMachineSnapshotCrd,
		components.NewVirtualMachineSnapshotContentCrd,
		components.NewVirtualMachineRestoreCrd,
		components.NewVirtualMachineExportCrd,
		components.NewVirtualMachineInstancetypeCrd,
		components.NewVirtualMachineClusterInstancetypeCrd,
		components.NewVirtualMachinePreferenceCrd,
		components.NewVirtualMachineClusterPreferenceCrd,
		components.NewMigrationPolicyCrd,
		components.NewVirtualMachineCloneCrd,
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fail(err)
	}
	for _, generate := range generators {
		crd, err := generate()
		if err != nil {
			fail(err)
		}
		crd.TypeMeta.APIVersion = "apiextensions.k8s.io/v1"
		crd.TypeMeta.Kind = "CustomResourceDefinition"
		// The generator leaves an empty status; the apiserver owns it.
		crd.Status = extv1.CustomResourceDefinitionStatus{}
		data, err := json.MarshalIndent(crd, "", "  ")
		if err != nil {
			fail(err)
		}
		path := filepath.Join(dir, crd.Name+".json")
		if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "kubevirt-crds: %v\n", err)
	os.Exit(1)
}
