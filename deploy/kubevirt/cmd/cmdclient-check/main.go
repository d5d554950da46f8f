// Command cmdclient-check drives a launcher through KubeVirt's own
// handler-side code: the cmd client of pkg/virt-handler/cmd-client (version
// negotiation through CmdInfo.Info included) and the notify server of
// pkg/virt-handler/notify-server, which receives the launcher's domain and
// Kubernetes events. Whatever KubeVirt's code cannot parse fails here.
//
//	cmdclient-check --share-dir DIR --socket SOCKET --vmi VMI.json
//
// It starts the notify server at DIR/domain-notify.sock, prints
// {"notify": "<path>"} and waits for SOCKET to appear. Then it runs Sync,
// Pause, Unpause, GetDomain, GetDomainStats, GetGuestInfo, GetUsers,
// GetFilesystems, Shutdown, Kill and Delete, printing one JSON line per step
// with what KubeVirt's code read, and a last line with every event the notify
// server received. It exits 1 when a step failed.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	v1 "kubevirt.io/api/core/v1"

	cmdclient "kubevirt.io/kubevirt/pkg/virt-handler/cmd-client"
	notifyserver "kubevirt.io/kubevirt/pkg/virt-handler/notify-server"
	cmdv1 "kubevirt.io/kubevirt/pkg/handler-launcher-com/cmd/v1"
	"kubevirt.io/kubevirt/pkg/virt-launcher/virtwrap/api"
)

type result struct {
	Step   string         `json:"step"`
	OK     bool           `json:"ok"`
	Error  string         `json:"error,omitempty"`
	Detail map[string]any `json:"detail,omitempty"`
}

var failed bool

func report(step string, err error, detail map[string]any) bool {
	r := result{Step: step, OK: err == nil, Detail: detail}
	if err != nil {
		r.Error = err.Error()
		failed = true
	}
	line, _ := json.Marshal(r)
	fmt.Println(string(line))
	return err == nil
}

type eventLog struct {
	mu     sync.Mutex
	events []map[string]any
}

func (l *eventLog) add(e map[string]any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) snapshot() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]map[string]any(nil), l.events...)
}

func main() {
	shareDir := flag.String("share-dir", "", "directory for the notify server's socket")
	socket := flag.String("socket", "", "the launcher's cmd socket")
	vmiFile := flag.String("vmi", "", "the VMI as JSON")
	flag.Parse()
	if *shareDir == "" || *socket == "" || *vmiFile == "" {
		fmt.Fprintln(os.Stderr, "usage: cmdclient-check --share-dir DIR --socket SOCKET --vmi VMI.json")
		os.Exit(2)
	}
	raw, err := os.ReadFile(*vmiFile)
	if err != nil {
		fatal(err)
	}
	vmi := &v1.VirtualMachineInstance{}
	if err := json.Unmarshal(raw, vmi); err != nil {
		fatal(fmt.Errorf("%s: %w", *vmiFile, err))
	}

	// The notify server: domain events arrive on a channel, Kubernetes events
	// through a recorder for VMIs found in the store.
	events := make(chan watch.Event, 256)
	recorder := record.NewFakeRecorder(256)
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	if err := store.Add(vmi); err != nil {
		fatal(err)
	}
	stop := make(chan struct{})
	served := make(chan error, 1)
	go func() { served <- notifyserver.RunServer(*shareDir, stop, events, recorder, store) }()
	notifySocket := filepath.Join(*shareDir, "domain-notify.sock")
	if !waitFor(func() bool { _, err := os.Stat(notifySocket); return err == nil }, 10*time.Second) {
		fatal(fmt.Errorf("the notify server did not create %s", notifySocket))
	}
	line, _ := json.Marshal(map[string]string{"notify": notifySocket})
	fmt.Println(string(line))

	received := &eventLog{}
	go func() {
		for event := range events {
			entry := map[string]any{"type": string(event.Type)}
			if domain, ok := event.Object.(*api.Domain); ok {
				entry["status"] = string(domain.Status.Status)
				entry["reason"] = string(domain.Status.Reason)
				entry["name"] = domain.ObjectMeta.Name
				entry["uid"] = string(domain.Spec.Metadata.KubeVirt.UID)
			}
			received.add(entry)
		}
	}()
	go func() {
		for message := range recorder.Events {
			received.add(map[string]any{"type": "K8sEvent", "message": message})
		}
	}()

	if !waitFor(func() bool { _, err := os.Stat(*socket); return err == nil }, 60*time.Second) {
		fatal(fmt.Errorf("no launcher socket at %s after 60 s", *socket))
	}
	client, err := cmdclient.NewClient(*socket)
	if !report("connect", err, nil) {
		finish(received, stop, served)
	}
	report("ping", client.Ping(), nil)

	options := &cmdv1.VirtualMachineOptions{
		VirtualMachineSMBios: &cmdv1.SMBios{Manufacturer: "virtnode-check", Family: "KubeVirt"},
	}
	if report("sync", client.SyncVirtualMachine(vmi, options), nil) {
		report("running", waitForStatus(client, api.Running), nil)
	}
	domain, exists, err := client.GetDomain()
	if err == nil && !exists {
		err = fmt.Errorf("GetDomain: no domain")
	}
	report("getDomain", err, describe(domain))

	stats, exists, err := client.GetDomainStats()
	if err == nil && !exists {
		err = fmt.Errorf("GetDomainStats: no stats")
	}
	statsDetail := map[string]any{}
	if stats != nil {
		statsDetail["name"] = stats.Name
		statsDetail["uuid"] = stats.UUID
		if stats.Cpu != nil {
			statsDetail["cpuTimeSet"] = stats.Cpu.TimeSet
		}
		if stats.Memory != nil {
			statsDetail["rssSet"] = stats.Memory.RSSSet
		}
		statsDetail["vcpus"] = len(stats.Vcpu)
	}
	report("getDomainStats", err, statsDetail)

	if report("pause", client.PauseVirtualMachine(vmi), nil) {
		report("paused", waitForStatus(client, api.Paused), nil)
	}
	if report("unpause", client.UnpauseVirtualMachine(vmi), nil) {
		report("unpaused", waitForStatus(client, api.Running), nil)
	}

	guest, err := client.GetGuestInfo()
	guestDetail := map[string]any{}
	if guest != nil {
		guestDetail["guestAgentVersion"] = guest.GAVersion
		guestDetail["hostname"] = guest.Hostname
	}
	report("getGuestInfo", err, guestDetail)
	users, err := client.GetUsers()
	report("getUsers", err, map[string]any{"users": len(users.Items)})
	filesystems, err := client.GetFilesystems()
	report("getFilesystems", err, map[string]any{"filesystems": len(filesystems.Items)})

	report("shutdown", client.ShutdownVirtualMachine(vmi), nil)
	if report("kill", client.KillVirtualMachine(vmi), nil) {
		report("killed", waitForStatus(client, api.Shutoff), nil)
	}
	if report("delete", client.DeleteDomain(vmi), nil) {
		var gone error = fmt.Errorf("the domain still exists after 30 s")
		if waitFor(func() bool {
			_, exists, err := client.GetDomain()
			return err == nil && !exists
		}, 30*time.Second) {
			gone = nil
		}
		report("deleted", gone, nil)
	}
	finish(received, stop, served)
}

// describe returns what virt-handler reads from a launcher's domain.
func describe(domain *api.Domain) map[string]any {
	if domain == nil {
		return nil
	}
	detail := map[string]any{
		"name":   domain.ObjectMeta.Name,
		"uid":    string(domain.Spec.Metadata.KubeVirt.UID),
		"status": string(domain.Status.Status),
		"reason": string(domain.Status.Reason),
	}
	if domain.Spec.OS.Type.Machine != "" {
		detail["machine"] = domain.Spec.OS.Type.Machine
	}
	if domain.Spec.CurrentMemory != nil {
		detail["currentMemory"] = fmt.Sprintf("%d %s", domain.Spec.CurrentMemory.Value, domain.Spec.CurrentMemory.Unit)
	}
	if domain.Spec.Memory.Value != 0 {
		detail["memory"] = fmt.Sprintf("%d %s", domain.Spec.Memory.Value, domain.Spec.Memory.Unit)
	}
	var channels []map[string]string
	for _, channel := range domain.Spec.Devices.Channels {
		if channel.Target != nil {
			channels = append(channels, map[string]string{"name": channel.Target.Name, "state": channel.Target.State})
		}
	}
	detail["channels"] = channels
	detail["panicDevices"] = len(domain.Spec.Devices.PanicDevices)
	return detail
}

func waitForStatus(client cmdclient.LauncherClient, want api.LifeCycle) error {
	var last api.LifeCycle
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		domain, exists, err := client.GetDomain()
		if err != nil {
			return err
		}
		if exists {
			last = domain.Status.Status
			if last == want {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("domain is %q, not %q, after 60 s", last, want)
}

func waitFor(check func() bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if check() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func finish(received *eventLog, stop chan struct{}, served chan error) {
	// Events sent just before the last step may still be in flight.
	time.Sleep(500 * time.Millisecond)
	line, _ := json.Marshal(map[string]any{"events": received.snapshot()})
	fmt.Println(string(line))
	close(stop)
	if err := <-served; err != nil {
		fmt.Fprintf(os.Stderr, "cmdclient-check: notify server: %v\n", err)
		failed = true
	}
	if failed {
		os.Exit(1)
	}
	os.Exit(0)
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "cmdclient-check: %v\n", err)
	os.Exit(1)
}
