// Command kubevirt-install prints, as one JSON List on stdout, what virt-operator
// installs for KubeVirt's control plane and node agent beside the CRDs, made by
// virt-operator's own generators (kubevirt.io/kubevirt/pkg/virt-operator): the
// ServiceAccounts and RBAC of virt-api, virt-controller and virt-handler, the CA and
// the components' certificate Secrets, the kubevirt-ca ConfigMap, virt-api's mutating
// and validating webhook configurations with the CA bundle filled in, and the
// kubevirt-cluster-critical PriorityClass. The
// test harness applies the List, writes each Secret's files where the component reads
// them, and runs the programs (tests/harness/node/kubevirt.ts).
//
// With --handler-image it prints instead virt-handler's DaemonSet as the operator makes
// it, for that image and --launcher-image (the launcher image also runs its node
// labeller as the DaemonSet's init container).
//
//	kubevirt-install [--namespace kubevirt]
//	kubevirt-install --handler-image IMAGE --launcher-image IMAGE [--namespace kubevirt]
package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	k8sv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/rbac"
)

func main() {
	namespace := flag.String("namespace", "kubevirt", "the namespace KubeVirt is installed in")
	handlerImage := flag.String("handler-image", "", "print virt-handler's DaemonSet for this image")
	launcherImage := flag.String("launcher-image", "", "the launcher image virt-handler's DaemonSet names")
	flag.Parse()
	if *handlerImage != "" {
		if *launcherImage == "" {
			fmt.Fprintln(os.Stderr, "kubevirt-install: --handler-image needs --launcher-image")
			os.Exit(2)
		}
		ds := components.NewHandlerDaemonSet(*namespace, "", "", "", "", "", "", "", "", "",
			*handlerImage, *launcherImage, "", "", k8sv1.PullIfNotPresent, nil, nil, "2", nil, false)
		if err := json.NewEncoder(os.Stdout).Encode(ds); err != nil {
			fmt.Fprintf(os.Stderr, "kubevirt-install: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*namespace); err != nil {
		fmt.Fprintf(os.Stderr, "kubevirt-install: %v\n", err)
		os.Exit(1)
	}
}

func run(namespace string) error {
	var items []any
	add := func(objects ...any) { items = append(items, objects...) }
	for _, objects := range [][]runtime.Object{
		rbac.GetAllCluster(),
		rbac.GetAllApiServer(namespace),
		rbac.GetAllController(namespace),
		rbac.GetAllHandler(namespace),
	} {
		for _, o := range objects {
			add(o)
		}
	}

	// A day is ample for a test cluster; virt-operator's defaults rotate far later.
	duration := &metav1.Duration{Duration: 24 * time.Hour}
	var ca *tls.Certificate
	for _, secret := range components.NewCACertSecrets(namespace) {
		if secret.Name != components.KubeVirtCASecretName {
			continue
		}
		if err := components.PopulateSecretWithCertificate(secret, nil, duration); err != nil {
			return fmt.Errorf("the CA: %w", err)
		}
		loaded, err := components.LoadCertificates(secret)
		if err != nil {
			return fmt.Errorf("the CA: %w", err)
		}
		ca = loaded
		add(secret)
	}
	if ca == nil {
		return fmt.Errorf("virt-operator's generator made no %s Secret", components.KubeVirtCASecretName)
	}
	bundle := secretCert(items[len(items)-1].(*k8sv1.Secret))
	for _, configMap := range components.NewCAConfigMaps(namespace) {
		if configMap.Name == components.KubeVirtCASecretName {
			configMap.Data = map[string]string{components.CABundleKey: string(bundle)}
			add(configMap)
		}
	}
	for _, secret := range components.NewCertSecrets(namespace, namespace) {
		if err := components.PopulateSecretWithCertificate(secret, ca, duration); err != nil {
			return fmt.Errorf("Secret %s: %w", secret.Name, err)
		}
		add(secret)
	}

	mutating := components.NewVirtAPIMutatingWebhookConfiguration(namespace)
	for i := range mutating.Webhooks {
		mutating.Webhooks[i].ClientConfig.CABundle = bundle
	}
	validating := components.NewVirtAPIValidatingWebhookConfiguration(namespace)
	for i := range validating.Webhooks {
		validating.Webhooks[i].ClientConfig.CABundle = bundle
	}
	add(mutating, validating)
	// virt-api's subresources (console, VNC, addvolume, ...) through the aggregation layer.
	for _, service := range components.NewVirtAPIAPIServices(namespace) {
		service.Spec.CABundle = bundle
		add(service)
	}
	// What KubeVirt's own pods (virt-handler's among them) run at.
	add(components.NewKubeVirtPriorityClassCR())

	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"apiVersion": "v1",
		"kind":       "List",
		"items":      items,
	})
}

func secretCert(secret *k8sv1.Secret) []byte {
	return secret.Data[k8sv1.TLSCertKey]
}
