// Command kubevirt-admission serves KubeVirt's own admission for
// VirtualMachineInstances and their migrations: the mutating and validating
// webhooks of virt-api (KubeVirt's packages, configured from the KubeVirt CR
// the way virt-api configures them), over HTTPS on a loopback address.
//
// It registers KubeVirt's generated webhook configurations, keeping the
// webhooks whose paths it serves and pointing them at itself by URL with the
// CA it generated, and deletes them again when it stops. It prints
// "ready <url>" on stdout (and into --ready-file) once the apiserver can call it.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	k8serrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/clientcmd"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	v1 "kubevirt.io/api/core/v1"
	"kubevirt.io/client-go/kubecli"

	"kubevirt.io/kubevirt/pkg/controller"
	netadmitter "kubevirt.io/kubevirt/pkg/network/admitter"
	"kubevirt.io/kubevirt/pkg/virt-api/webhooks"
	mutating_webhook "kubevirt.io/kubevirt/pkg/virt-api/webhooks/mutating-webhook"
	validating_webhook "kubevirt.io/kubevirt/pkg/virt-api/webhooks/validating-webhook"
	virtconfig "kubevirt.io/kubevirt/pkg/virt-config"
	"kubevirt.io/kubevirt/pkg/virt-operator/resource/generate/components"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	namespace := flag.String("namespace", "kubevirt", "namespace of the KubeVirt CR")
	listen := flag.String("listen", "127.0.0.1:0", "address to serve HTTPS on")
	readyFile := flag.String("ready-file", "", "file to write the ready line to as well")
	flag.Parse()
	if *kubeconfig == "" {
		fail(fmt.Errorf("--kubeconfig is required"))
	}

	restConfig, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(fmt.Errorf("kubeconfig: %w", err))
	}
	virtCli, err := kubecli.GetKubevirtClientFromRESTConfig(restConfig)
	if err != nil {
		fail(fmt.Errorf("client: %w", err))
	}
	aggregator := aggregatorclient.NewForConfigOrDie(restConfig)

	stop := make(chan struct{})
	factory := controller.NewKubeInformerFactory(virtCli.RestClient(), virtCli, aggregator, *namespace)
	kubeVirtInformer := factory.KubeVirt()
	crdInformer := factory.CRD()
	informers := &webhooks.Informers{
		VMIPresetInformer:  factory.VirtualMachinePreset(),
		VMRestoreInformer:  factory.VirtualMachineRestore(),
		DataSourceInformer: factory.DummyDataSource(),
		NamespaceInformer:  factory.Namespace(),
	}
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	clusterConfig, err := virtconfig.NewClusterConfig(crdInformer, kubeVirtInformer, *namespace)
	if err != nil {
		fail(fmt.Errorf("cluster config: %w", err))
	}
	serviceAccounts := webhooks.KubeVirtServiceAccounts(*namespace)

	mux := http.NewServeMux()
	mux.HandleFunc(components.VMIMutatePath, func(w http.ResponseWriter, r *http.Request) {
		mutating_webhook.ServeVMIs(w, r, clusterConfig, informers, serviceAccounts)
	})
	mux.HandleFunc(components.VMICreateValidatePath, func(w http.ResponseWriter, r *http.Request) {
		validating_webhook.ServeVMICreate(w, r, clusterConfig, serviceAccounts,
			func(path *field.Path, spec *v1.VirtualMachineInstanceSpec, cfg *virtconfig.ClusterConfig) []metav1.StatusCause {
				return netadmitter.Validate(path, spec, cfg)
			})
	})
	mux.HandleFunc(components.VMIUpdateValidatePath, func(w http.ResponseWriter, r *http.Request) {
		validating_webhook.ServeVMIUpdate(w, r, clusterConfig, serviceAccounts)
	})
	mux.HandleFunc(components.MigrationMutatePath, func(w http.ResponseWriter, r *http.Request) {
		mutating_webhook.ServeMigrationCreate(w, r)
	})
	mux.HandleFunc(components.MigrationCreateValidatePath, func(w http.ResponseWriter, r *http.Request) {
		validating_webhook.ServeMigrationCreate(w, r, clusterConfig, virtCli, serviceAccounts)
	})
	mux.HandleFunc(components.MigrationUpdateValidatePath, func(w http.ResponseWriter, r *http.Request) {
		validating_webhook.ServeMigrationUpdate(w, r)
	})
	served := map[string]bool{
		components.VMIMutatePath: true, components.VMICreateValidatePath: true,
		components.VMIUpdateValidatePath: true, components.MigrationMutatePath: true,
		components.MigrationCreateValidatePath: true, components.MigrationUpdateValidatePath: true,
	}

	caPEM, serving, err := selfSignedServing()
	if err != nil {
		fail(fmt.Errorf("certificates: %w", err))
	}
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		fail(fmt.Errorf("listen: %w", err))
	}
	base := "https://" + listener.Addr().String()
	server := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{serving}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() {
		if err := server.ServeTLS(listener, "", ""); err != nil && err != http.ErrServerClosed {
			fail(fmt.Errorf("serve: %w", err))
		}
	}()

	ctx := context.Background()
	mutating := components.NewVirtAPIMutatingWebhookConfiguration(*namespace)
	var mutatingHooks []admissionregistrationv1.MutatingWebhook
	for _, hook := range mutating.Webhooks {
		if path := hookPath(hook.ClientConfig); served[path] {
			hook.ClientConfig = urlConfig(base, path, caPEM)
			mutatingHooks = append(mutatingHooks, hook)
		}
	}
	mutating.Webhooks = mutatingHooks
	validating := components.NewVirtAPIValidatingWebhookConfiguration(*namespace)
	var validatingHooks []admissionregistrationv1.ValidatingWebhook
	for _, hook := range validating.Webhooks {
		if path := hookPath(hook.ClientConfig); served[path] {
			hook.ClientConfig = urlConfig(base, path, caPEM)
			validatingHooks = append(validatingHooks, hook)
		}
	}
	validating.Webhooks = validatingHooks

	registrations := virtCli.AdmissionregistrationV1()
	_ = registrations.MutatingWebhookConfigurations().Delete(ctx, mutating.Name, metav1.DeleteOptions{})
	_ = registrations.ValidatingWebhookConfigurations().Delete(ctx, validating.Name, metav1.DeleteOptions{})
	if _, err := registrations.MutatingWebhookConfigurations().Create(ctx, mutating, metav1.CreateOptions{}); err != nil {
		fail(fmt.Errorf("registering %s: %w", mutating.Name, err))
	}
	if _, err := registrations.ValidatingWebhookConfigurations().Create(ctx, validating, metav1.CreateOptions{}); err != nil {
		fail(fmt.Errorf("registering %s: %w", validating.Name, err))
	}
	ready := fmt.Sprintf("ready %s %d mutating %d validating webhooks\n", base, len(mutatingHooks), len(validatingHooks))
	fmt.Print(ready)
	if *readyFile != "" {
		if err := os.WriteFile(*readyFile, []byte(ready), 0o644); err != nil {
			fail(fmt.Errorf("writing %s: %w", *readyFile, err))
		}
	}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
	for _, remove := range []func() error{
		func() error {
			return registrations.MutatingWebhookConfigurations().Delete(ctx, mutating.Name, metav1.DeleteOptions{})
		},
		func() error {
			return registrations.ValidatingWebhookConfigurations().Delete(ctx, validating.Name, metav1.DeleteOptions{})
		},
	} {
		if err := remove(); err != nil && !k8serrors.IsNotFound(err) {
			fmt.Fprintf(os.Stderr, "kubevirt-admission: removing a webhook configuration: %v\n", err)
		}
	}
	close(stop)
	shutdown, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_ = server.Shutdown(shutdown)
}

func hookPath(config admissionregistrationv1.WebhookClientConfig) string {
	if config.Service == nil || config.Service.Path == nil {
		return ""
	}
	return *config.Service.Path
}

func urlConfig(base, path string, caPEM []byte) admissionregistrationv1.WebhookClientConfig {
	url := base + path
	return admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM}
}

// selfSignedServing makes a CA and a serving certificate for 127.0.0.1 signed
// by it; the CA goes into the webhook configurations' caBundle.
func selfSignedServing() ([]byte, tls.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kubevirt-admission-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kubevirt-admission"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	serving := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), serving, nil
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "kubevirt-admission: %v\n", err)
	os.Exit(1)
}
