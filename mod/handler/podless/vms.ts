/**
 * Pod-less mode's stand-in for virt-controller's VirtualMachine controller, for the VMs
 * this node owns: those whose template places their VMI here
 * (`spec.template.spec.nodeSelector` `kubernetes.io/hostname: <node>`, as a pod-less VMI is
 * placed; {@linkcode PodlessScheduler} then takes the VMI). Other nodes' VMs are left to
 * their nodes, and a VM that names no node has no VMI made for it.
 *
 * For each of its VMs the controller keeps the VMI the run strategy asks for (`Always`,
 * `RerunOnFailure`, `Once`, `Manual`, `Halted`, and the deprecated `running`), acts on the
 * start and stop requests virtctl's `start`, `stop` and `restart` put in the status, keeps
 * the VM's and the VMI's finalizers, and writes the VM's status as virt-controller does
 * (vm_status.ts), and carries out virtctl's memory dump requests (memory_dump.ts). A VMI it
 * asked for or asked to go is waited for before it acts again, as
 * virt-controller's expectations do. Events: `SuccessfulCreate`, `SuccessfulDelete`,
 * `FailedCreate`, `FailedDelete`, on the VM.
 *
 * Left out, as pod-less mode has no place for them: DataVolume templates, instance types,
 * controller revisions, live updates and the start-failure back-off.
 *
 * @module
 */
import {
  Finalizers,
  kubeTime,
  type RunStrategy,
  type VirtualMachine,
  type VirtualMachineInstance,
  type VirtualMachineStatus,
  VM_RESOURCE,
  VMI_RESOURCE,
  VmiPhase,
  type Volume,
} from "../../api/mod.ts";
import {
  detailOf,
  type EventRecorder,
  Informer,
  isApiStatus,
  type KubeClient,
  StatusWriter,
  WorkQueue,
} from "../../kube/mod.ts";
import type { Runnable } from "../../lifecycle/mod.ts";
import { getLogger } from "../../log/mod.ts";
import { DONE, type ReconcileResult, requeueAfter, runWorkers } from "../_workers.ts";
import { HOSTNAME_LABEL } from "./scheduler.ts";
import { liveUpdate } from "./live_update.ts";
import { MEMORY_DUMP_ANNOTATION, MEMORY_DUMP_ERROR, memoryDumpActions } from "./memory_dump.ts";
import {
  decideVm,
  isFinal,
  owningVm,
  runStrategyOf,
  vmiFromVm,
  vmStatus,
  type VmSyncError,
} from "./vm_status.ts";

const log = getLogger("podless-vms");

/** How long a VMI asked for (or asked to go) is waited for before the VM is looked at anew. */
const EXPECTATION_MS = 30_000;

/** Whether `node` owns `vm`: its template's node selector names the node. */
export function ownsVm(vm: VirtualMachine, node: string): boolean {
  return vm.spec.template?.spec?.nodeSelector?.[HOSTNAME_LABEL] === node;
}

/** Options of {@linkcode PodlessVms}. */
export interface PodlessVmsOptions {
  /** This node's name. */
  nodeName: string;
  /** The apiserver, as this node. */
  client: KubeClient;
  /** Where the VM's Events go. */
  recorder: EventRecorder;
  /** Workers (2). */
  workers?: number;
  /**
   * The handler's cached copy of a VMI of this node (`namespace/name`), if it has one: a
   * placed VMI is read from there; one not placed yet (or gone) is asked for.
   */
  cachedVmi?: (key: string) => VirtualMachineInstance | undefined;
  /** Whether running VMs' CPU and memory changes go live (the CR's `vmRolloutStrategy`). */
  liveUpdates?: () => boolean;
}

type Expectation =
  | { kind: "create"; at: number }
  | { kind: "delete"; uid: string; at: number };

/** The VM controller of one pod-less node; see the module doc. */
export class PodlessVms implements Runnable {
  /** For logs. */
  readonly name = "podless-vms";
  readonly #o: PodlessVmsOptions;
  readonly #informer: Informer<VirtualMachine>;
  readonly #queue = new WorkQueue<string>();
  readonly #vms: StatusWriter<VirtualMachineStatus, VirtualMachine>;
  readonly #vmObjects: StatusWriter<VirtualMachineStatus, VirtualMachine>;
  readonly #vmis: StatusWriter<
    NonNullable<VirtualMachineInstance["status"]>,
    VirtualMachineInstance
  >;
  readonly #expect = new Map<string, Expectation>();
  /** The memory dump annotation each claim (namespace/name) was seen or made to have. */
  readonly #annotated = new Map<string, string>();

  /** Creates the controller; nothing runs until {@linkcode run}. */
  constructor(options: PodlessVmsOptions) {
    this.#o = options;
    this.#informer = new Informer<VirtualMachine>(options.client, {
      path: `/apis/kubevirt.io/v1/${VM_RESOURCE}`,
      resource: "virtualmachines",
      onError: (error) => log.warn("VM watch interrupted, retrying: {error}", { error }),
    });
    const add = (vm: VirtualMachine) => {
      if (ownsVm(vm, options.nodeName)) this.#queue.add(keyOf(vm));
    };
    this.#informer.addHandlers({
      onAdd: add,
      onUpdate: (old, vm) => {
        // A VM moved to another node is let go of here: its status says so no more.
        if (ownsVm(old, options.nodeName) || ownsVm(vm, options.nodeName)) {
          this.#queue.add(keyOf(vm));
        }
      },
      onDelete: (vm) => this.#expect.delete(keyOf(vm)),
    });
    this.#vms = new StatusWriter(options.client, {
      groupVersionPath: "/apis/kubevirt.io/v1",
      plural: VM_RESOURCE,
      statusSubresource: true,
    });
    this.#vmObjects = new StatusWriter(options.client, {
      groupVersionPath: "/apis/kubevirt.io/v1",
      plural: VM_RESOURCE,
    });
    this.#vmis = new StatusWriter(options.client, {
      groupVersionPath: "/apis/kubevirt.io/v1",
      plural: VMI_RESOURCE,
    });
  }

  /** Wakes the VM a VMI belongs to, when the VMI changed or went. */
  vmiChanged(vmi: VirtualMachineInstance): void {
    const owner = owningVm(vmi);
    if (owner) this.#queue.add(`${vmi.metadata.namespace ?? "default"}/${owner.name}`);
  }

  /** Watches VMs and keeps this node's until `signal` aborts. */
  run(signal: AbortSignal): Promise<void> {
    return Promise.all([
      this.#informer.run(signal),
      runWorkers(this.#queue, (key) => this.reconcile(key), {
        workers: this.#o.workers ?? 2,
        log,
        ready: this.#informer.waitForSync(),
      }, signal),
    ]).then(() => {});
  }

  /** One look at a VM. */
  async reconcile(key: string): Promise<ReconcileResult> {
    const seen = this.#informer.get(key);
    if (!seen || !ownsVm(seen, this.#o.nodeName)) {
      this.#expect.delete(key);
      return DONE;
    }
    let vm = seen;
    const vmi = await this.#vmiOf(vm);
    const waiting = this.#waiting(key, vmi);
    if (waiting) return waiting;

    if (vm.metadata.deletionTimestamp) {
      if (!vmi) {
        await this.#vms.removeFinalizer(vm, Finalizers.VirtualMachineController);
        return DONE;
      }
      const syncError = await this.#stop(key, vm, vmi);
      await this.#writeStatus(vm, vmi, undefined, syncError);
      await this.#release(vmi);
      return DONE;
    }
    if (!vm.metadata.finalizers?.includes(Finalizers.VirtualMachineController)) {
      // The object itself: its status subresource would drop a metadata change.
      const written = await this.#vmObjects.updateObject(vm, (o) => {
        o.metadata.finalizers = [
          ...o.metadata.finalizers ?? [],
          Finalizers.VirtualMachineController,
        ];
      });
      vm = written.object ?? vm;
    }

    const strategy = runStrategyOf(vm);
    let syncError: VmSyncError | undefined;
    /** The VM's RestartRequired message, or "clear" once the VMI was started or stopped. */
    let restart: string | undefined;
    try {
      vm = await this.#memoryDump(vm, vmi);
    } catch (error) {
      syncError = {
        reason: MEMORY_DUMP_ERROR,
        message: `Error encountered while handling memory dump request: ${detailOf(error)}`,
      };
      await this.#writeStatus(vm, vmi, strategy instanceof Error ? undefined : strategy, syncError);
      return requeueAfter(5_000, syncError.message);
    }
    if (strategy instanceof Error) {
      syncError = {
        reason: "FailedCreate",
        message: `Error fetching RunStrategy: ${strategy.message}`,
      };
    } else {
      const action = decideVm(vm, vmi, strategy);
      if (action === "start") syncError = await this.#start(key, vm);
      if (action === "stop" && vmi) syncError = await this.#stop(key, vm, vmi);
      // A restart clears what needed one (virt-controller's rule at a start and a stop).
      if (action !== "none" && !syncError) restart = "clear";
      else if (action === "none" && vmi) {
        const live = await this.#liveUpdate(vm, vmi);
        syncError = live.error;
        if (live.restartRequired) restart = live.restartRequired;
      }
    }
    await this.#writeStatus(
      vm,
      vmi,
      strategy instanceof Error ? undefined : strategy,
      syncError,
      restart,
    );
    if (vmi) await this.#release(vmi);
    return syncError ? requeueAfter(5_000, syncError.message) : DONE;
  }

  /**
   * Carries out the VM's memory dump request (memory_dump.ts): the claim's annotation, the
   * VMI's volumes (a JSON patch that tests the volumes it read), the template's volumes (an
   * update of the VM, which is returned).
   */
  async #memoryDump(
    vm: VirtualMachine,
    vmi: VirtualMachineInstance | undefined,
  ): Promise<VirtualMachine> {
    const actions = memoryDumpActions(vm, vmi);
    const claim = vm.status?.memoryDumpRequest?.claimName;
    if (actions.annotation !== undefined && claim) {
      await this.#annotateClaim(vm.metadata.namespace ?? "default", claim, actions.annotation);
    }
    if (actions.vmiVolumes && vmi) await this.#patchVolumes(vmi, actions.vmiVolumes);
    if (!actions.templateVolumes) return vm;
    const next = structuredClone(vm);
    next.spec.template.spec.volumes = actions.templateVolumes;
    const written = await this.#o.client.request<VirtualMachine>("PUT", vmPath(vm), next);
    log.info("Memory dump volume {change} the VM's template", {
      namespace: vm.metadata.namespace,
      name: vm.metadata.name,
      claim,
      change: actions.templateVolumes.some((v) => v.name === claim) ? "added to" : "removed from",
    });
    return written;
  }

  /**
   * A running VM's CPU sockets and memory as its template has them now (live_update.ts):
   * the VMI's spec patched (the handler plugs them), unless the VM waits for a restart
   * already.
   */
  async #liveUpdate(
    vm: VirtualMachine,
    vmi: VirtualMachineInstance,
  ): Promise<{ error?: VmSyncError; restartRequired?: string }> {
    const due = vm.status?.conditions?.some((c) =>
      c.type === "RestartRequired" && c.status === "True"
    );
    if (due || this.#o.liveUpdates?.() === false) return {};
    const live = liveUpdate(vm, vmi);
    if (live.patch.length === 0) return live;
    try {
      await this.#o.client.request("PATCH", vmiPath(vmi), live.patch, {
        contentType: "application/json-patch+json",
      });
    } catch (error) {
      const cpu = live.patch.some((op) => op.path.startsWith("/spec/domain/cpu/"));
      return {
        ...live,
        error: cpu
          ? {
            reason: "HotPlugCPUError",
            message: `Error encountered while handling CPU change request: ${detailOf(error)}`,
          }
          : {
            reason: "HotPlugMemoryError",
            message: `error encountered while handling memory hotplug requests: ${detailOf(error)}`,
          },
      };
    }
    log.info("The VM's {what} go live: the VMI's spec follows its template", {
      namespace: vm.metadata.namespace,
      name: vm.metadata.name,
      what: live.patch.filter((op) => op.op === "replace").map((op) => op.path).join(", "),
    });
    return live;
  }

  /** Sets the claim's memory dump annotation, unless it says so already. */
  async #annotateClaim(namespace: string, claim: string, value: string): Promise<void> {
    const key = `${namespace}/${claim}`;
    if (this.#annotated.get(key) === value) return;
    const path = `/api/v1/namespaces/${encodeURIComponent(namespace)}/persistentvolumeclaims/${
      encodeURIComponent(claim)
    }`;
    const pvc = await this.#o.client.request<
      { metadata: { annotations?: Record<string, string> } }
    >(
      "GET",
      path,
    );
    if (pvc.metadata.annotations?.[MEMORY_DUMP_ANNOTATION] !== value) {
      await this.#o.client.request(
        "PATCH",
        path,
        { metadata: { annotations: { [MEMORY_DUMP_ANNOTATION]: value } } },
        { contentType: "application/merge-patch+json" },
      );
    }
    this.#annotated.set(key, value);
  }

  /** Replaces the VMI's volumes, if they are still what was read (virt-controller's patch). */
  async #patchVolumes(vmi: VirtualMachineInstance, volumes: Volume[]): Promise<void> {
    const old = vmi.spec.volumes;
    const ops = old && old.length > 0
      ? [
        { op: "test", path: "/spec/volumes", value: old },
        { op: "replace", path: "/spec/volumes", value: volumes },
      ]
      : [{ op: "add", path: "/spec/volumes", value: volumes }];
    await this.#o.client.request("PATCH", vmiPath(vmi), ops, {
      contentType: "application/json-patch+json",
    });
  }

  /**
   * Takes the VM controller's finalizer off a VMI that is done: final, or deleted before any
   * node took it (virt-controller's rule).
   */
  async #release(vmi: VirtualMachineInstance): Promise<void> {
    const phase = vmi.status?.phase;
    const unstarted = vmi.metadata.deletionTimestamp && (!phase || phase === VmiPhase.Pending);
    if (isFinal(vmi) || unstarted) {
      await this.#vmis.removeFinalizer(vmi, Finalizers.VirtualMachineController);
    }
  }

  /**
   * The VM's VMI, if one of its own exists (a VMI of the name another VM owns is not): the
   * handler's cached copy once the VMI is placed on this node (each of its status writes
   * wakes the VM: no request then), else what the apiserver has.
   */
  async #vmiOf(vm: VirtualMachine): Promise<VirtualMachineInstance | undefined> {
    const ours = (vmi: VirtualMachineInstance) => {
      const owner = owningVm(vmi);
      return !owner || owner.uid === vm.metadata.uid ? vmi : undefined;
    };
    const cached = this.#o.cachedVmi?.(keyOf(vm));
    if (cached) return ours(cached);
    try {
      return ours(await this.#o.client.request<VirtualMachineInstance>("GET", vmiPath(vm)));
    } catch (error) {
      if (isApiStatus(error, 404)) return undefined;
      throw error;
    }
  }

  /**
   * While a VMI asked for has not appeared, or one asked to go is still there as it was,
   * the VM waits (its VMI's events wake it; the wait ends on its own after
   * {@linkcode EXPECTATION_MS}).
   */
  #waiting(key: string, vmi: VirtualMachineInstance | undefined): ReconcileResult | undefined {
    const expected = this.#expect.get(key);
    if (!expected) return undefined;
    const left = expected.at + EXPECTATION_MS - Date.now();
    const pending = expected.kind === "create"
      ? !vmi
      : vmi?.metadata.uid === expected.uid && !vmi.metadata.deletionTimestamp;
    if (pending && left > 0) return requeueAfter(left, "waiting for the VMI asked for");
    this.#expect.delete(key);
    return undefined;
  }

  async #start(key: string, vm: VirtualMachine): Promise<VmSyncError | undefined> {
    const vmi = await vmiFromVm(vm);
    this.#expect.set(key, { kind: "create", at: Date.now() });
    try {
      await this.#o.client.request(
        "POST",
        `/apis/kubevirt.io/v1/namespaces/${
          encodeURIComponent(vm.metadata.namespace ?? "default")
        }/${VMI_RESOURCE}`,
        vmi,
      );
    } catch (error) {
      this.#expect.delete(key);
      const message = `Error creating virtual machine instance: ${detailOf(error)}`;
      this.#event(vm, "Warning", "FailedCreate", message);
      return { reason: "FailedCreate", message: `Failure while starting VMI: ${detailOf(error)}` };
    }
    log.info("Started the VM by creating its VMI", {
      namespace: vm.metadata.namespace,
      name: vm.metadata.name,
    });
    this.#event(
      vm,
      "Normal",
      "SuccessfulCreate",
      `Started the virtual machine by creating the new virtual machine instance ${vm.metadata.name}`,
    );
    return undefined;
  }

  async #stop(
    key: string,
    vm: VirtualMachine,
    vmi: VirtualMachineInstance,
  ): Promise<VmSyncError | undefined> {
    if (vmi.metadata.deletionTimestamp) return undefined;
    this.#expect.set(key, { kind: "delete", uid: vmi.metadata.uid ?? "", at: Date.now() });
    try {
      await this.#o.client.request("DELETE", vmiPath(vm));
    } catch (error) {
      this.#expect.delete(key);
      if (isApiStatus(error, 404)) return undefined;
      const message = `Error deleting virtual machine instance ${vm.metadata.name}: ${
        detailOf(error)
      }`;
      this.#event(vm, "Warning", "FailedDelete", message);
      return {
        reason: "FailedDelete",
        message: `Failure attempting to delete VMI: ${detailOf(error)}`,
      };
    }
    log.info("Stopped the VM by deleting its VMI", {
      namespace: vm.metadata.namespace,
      name: vm.metadata.name,
    });
    this.#event(
      vm,
      "Normal",
      "SuccessfulDelete",
      `Stopped the virtual machine by deleting the virtual machine instance ${vmi.metadata.uid}`,
    );
    return undefined;
  }

  async #writeStatus(
    vm: VirtualMachine,
    vmi: VirtualMachineInstance | undefined,
    strategy: RunStrategy | undefined,
    syncError: VmSyncError | undefined,
    restart?: string,
  ): Promise<void> {
    const key = keyOf(vm);
    const expected = this.#expect.get(key);
    await this.#vms.update(vm, (status) =>
      vmStatus({ ...vm, status }, vmi, strategy, {
        startExpected: expected?.kind === "create",
        stopExpected: expected?.kind === "delete",
        syncError,
        restartRequired: restart,
        now: kubeTime(),
      }));
  }

  #event(vm: VirtualMachine, type: "Normal" | "Warning", reason: string, message: string): void {
    this.#o.recorder.record(
      { apiVersion: "kubevirt.io/v1", kind: "VirtualMachine", metadata: vm.metadata },
      type,
      reason,
      message,
    ).catch((error) => log.warn("Cannot record an Event on the VM: {error}", { error }));
  }
}

function keyOf(vm: VirtualMachine): string {
  return `${vm.metadata.namespace ?? "default"}/${vm.metadata.name}`;
}

function vmPath(vm: VirtualMachine): string {
  return `/apis/kubevirt.io/v1/namespaces/${
    encodeURIComponent(vm.metadata.namespace ?? "default")
  }/${VM_RESOURCE}/${encodeURIComponent(vm.metadata.name)}`;
}

function vmiPath(vm: { metadata: { name: string; namespace?: string } }): string {
  return `/apis/kubevirt.io/v1/namespaces/${
    encodeURIComponent(vm.metadata.namespace ?? "default")
  }/${VMI_RESOURCE}/${encodeURIComponent(vm.metadata.name)}`;
}
