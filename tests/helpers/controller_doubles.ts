/**
 * A VmiController whose launcher runs and answers, with test doubles for the rest: the VMIs
 * of its cache are set by the test, Events are kept as `<type> <reason> <message>` lines,
 * and the provider, launcher client and pod networks have the members a test gives on top of
 * do-nothing ones.
 */
import type { VirtualMachineInstance } from "../../mod/api/mod.ts";
import { LifeCycle, newDomain, StateChangeReason } from "../../mod/domain/mod.ts";
import { type ControllerDeps, VmiController } from "../../mod/handler/testing.ts";
import { Expectations, WorkQueue } from "../../mod/kube/mod.ts";

/** What {@linkcode runningController} gives a test. */
export interface RunningController {
  /** The controller, its domain of `uid` Running. */
  controller: VmiController;
  /** The informer's cache: set a VMI by `namespace/name`. */
  cache: Map<string, VirtualMachineInstance>;
  /** The Events recorded, `<type> <reason> <message>`. */
  events: string[];
  /** Ends the controller's queue. */
  stop(): void;
}

/** The parts a test gives on top of the do-nothing doubles. */
export interface RunningControllerOptions {
  /** The VMI's UID (its domain runs under `default/vm1`). */
  uid: string;
  /** The launcher client's members. */
  client: Record<string, unknown>;
  /** Provider members beside the do-nothing ones. */
  provider?: Record<string, unknown>;
  /** Pod-network members beside the do-nothing ones. */
  networks?: Record<string, unknown>;
  /** The SR-IOV backoff's clock. */
  sriovClock?: () => number;
}

/** The controller of the module doc, with `default/vm1`'s domain Running. */
export function runningController(options: RunningControllerOptions): RunningController {
  const cache = new Map<string, VirtualMachineInstance>();
  const events: string[] = [];
  const queue = new WorkQueue<string>();
  const deps = {
    nodeName: "node1",
    provider: {
      notReadyRequeueMs: 1_000,
      socketOf: () => Promise.resolve("/s"),
      start: () => Promise.resolve({ socket: "/s" }),
      prepareDisks: () => Promise.resolve("ready"),
      forLauncher: (v: VirtualMachineInstance) => v,
      hotplug: () => Promise.resolve(),
      hotplugMounted: () => Promise.resolve(new Set<string>()),
      launcherRoot: () => Promise.resolve(undefined),
      unplug: () => Promise.resolve(),
      podNetwork: () => Promise.resolve(undefined),
      adoptedPodNetwork: () => Promise.resolve(undefined),
      releasePodNetwork: () => Promise.resolve(),
      ...options.provider,
    },
    informer: {
      addHandlers: () => {},
      hasSynced: () => true,
      waitForSync: () => Promise.resolve(),
      get: (key: string) => cache.get(key),
      list: () => [...cache.values()],
    },
    queue,
    expectations: new Expectations(),
    statusWriter: {
      update: () => Promise.resolve({ written: false }),
      removeFinalizer: () => Promise.resolve(false),
    },
    recorder: {
      record: (_o: unknown, type: string, reason: string, message: string) => {
        events.push(`${type} ${reason} ${message}`);
        return Promise.resolve();
      },
    },
    ghosts: {
      get: () => undefined,
      findByKey: () => [],
      lastKnownUid: () => undefined,
      delete: () => Promise.resolve(),
    },
    launchers: {
      get: () => options.client,
      getOrCreate: () => options.client,
      state: () => Promise.resolve("responsive"),
      isReady: () => Promise.resolve(true),
      remove: () => {},
      forgetMark: () => Promise.resolve(),
    },
    networks: {
      addresses: () => Promise.resolve(new Map()),
      teardown: () => Promise.resolve(),
      ...options.networks,
    },
    sriovClock: options.sriovClock,
  } as unknown as ControllerDeps;
  const controller = new VmiController(deps);
  controller.domainEvent(
    "ADDED",
    newDomain({ namespace: "default", name: "vm1", uid: options.uid }, {
      status: LifeCycle.Running,
      reason: StateChangeReason.Unknown,
    }),
  );
  return { controller, cache, events, stop: () => queue.shutDown() };
}
