/**
 * `virtnode handler`: the node agent's main job (seed 3.1 to 3.6), wired from
 * the Kubernetes layer, the launcher clients, the notify server, ghost records
 * and (pod-less mode) the launcher spawner.
 *
 * Start-up re-adopts what already runs before anything else: ghost records give
 * each launcher's socket, the launchers are asked for their domains, and only
 * then does the VMI informer feed the queue, so a restarted handler finds every
 * VM where it left it and never stops one. SIGTERM turns the handler not ready,
 * stops taking work, lets in-flight syncs finish and leaves every VM running.
 *
 * @module
 */
import { join } from "node:path";
import {
  Labels,
  SocketNames,
  type VirtualMachineInstance,
  type VirtualMachineInstanceStatus,
  VMI_RESOURCE,
} from "../api/mod.ts";
import type { Config } from "../config/mod.ts";
import {
  EventRecorder,
  Expectations,
  Informer,
  type KubeClient,
  StatusWriter,
  WorkQueue,
} from "../kube/mod.ts";
import { getLogger } from "../log/mod.ts";
import { GhostRecordStore } from "./ghost_records.ts";
import { LauncherClients } from "./launcher_clients.ts";
import { LauncherSpawner, type LauncherSpec } from "./launcher_spawner.ts";
import { type LauncherMode, VmiController } from "./controller.ts";
import { NotifyServer } from "./notify_server.ts";

export { GhostRecordStore } from "./ghost_records.ts";
export { type LauncherSpec } from "./launcher_spawner.ts";
export { computeStatus, EventReason, SYNC_FAILED_REASON } from "./status.ts";

const log = getLogger("handler");

/** Options of {@linkcode startHandler} beyond the shared configuration. */
export interface HandlerOptions {
  /** Pod-less mode: spawn launchers with this command line; KubeVirt mode when absent. */
  launcherCommand?: (spec: LauncherSpec) => { cmd: string; args: string[] };
  /** `host:port` of the health endpoints (`/healthz`, `/readyz`); none when undefined. */
  healthAddress?: string;
  /** Concurrent syncs (KubeVirt's handler threadiness). */
  workers?: number;
  /** The kubelet's pods directory (KubeVirt mode). */
  podsDir?: string;
  /** Resync of every launcher's domain (5 min). */
  resyncMs?: number;
  /** Removes a dead launcher's leftover domain (pod-less mode). */
  reapDomain?: (namespace: string, name: string, uid: string) => Promise<void>;
}

/** A running handler. */
export interface Handler {
  /** The controller (for tests and the local mode's display). */
  controller: VmiController;
  /** The VMI informer. */
  informer: Informer<VirtualMachineInstance>;
  /** Whether `/readyz` answers 200. */
  ready(): boolean;
  /** Graceful stop: not ready, drain in-flight syncs, leave VMs running. */
  stop(): Promise<void>;
  /** Resolves when the handler has stopped. */
  done: Promise<void>;
}

/** The paths the handler uses below the configured directories. */
export function handlerPaths(config: Config) {
  return {
    ghostDir: join(config.stateDir, "ghost-records"),
    socketRoot: join(config.runDir, "sockets"),
    notifySocket: join(config.runDir, SocketNames.DomainNotify),
  };
}

/** Starts the handler with a connected Kubernetes client. */
export async function startHandler(
  config: Config,
  client: KubeClient,
  options: HandlerOptions = {},
): Promise<Handler> {
  const started = performance.now();
  const paths = handlerPaths(config);
  const ghosts = new GhostRecordStore(paths.ghostDir);
  for (const bad of await ghosts.load()) {
    log.error("Ghost record set aside: {reason}", {
      file: bad.file,
      movedTo: bad.movedTo,
      reason: bad.reason,
    });
  }

  const queue = new WorkQueue<string>();
  const expectations = new Expectations();
  const informer = new Informer<VirtualMachineInstance>(client, {
    path: `/apis/kubevirt.io/v1/${VMI_RESOURCE}`,
    labelSelector: `${Labels.NodeName}=${config.nodeName}`,
    onError: (error) => log.warn("VMI watch interrupted, retrying: {error}", { error }),
    // managedFields grows with every status write and is never read; an update without
    // it leaves the server's copy as it is.
    transform: (vmi) => {
      delete (vmi.metadata as { managedFields?: unknown }).managedFields;
      return vmi;
    },
  });
  const recorder = new EventRecorder(client, { host: config.nodeName });
  const statusWriter = new StatusWriter<VirtualMachineInstanceStatus, VirtualMachineInstance>(
    client,
    { groupVersionPath: "/apis/kubevirt.io/v1", plural: VMI_RESOURCE },
  );
  // The controller is built after the pool it uses; it is told of dead launchers from then on.
  const gone: ((uid: string) => void)[] = [];
  const ready: ((uid: string) => void)[] = [];
  const launchers = new LauncherClients({ onUnresponsive: (uid) => gone.forEach((f) => f(uid)) });

  let mode: LauncherMode;
  if (options.launcherCommand) {
    const spawner = new LauncherSpawner({
      command: options.launcherCommand,
      stateDir: config.stateDir,
      onExit: (uid, code, signal) => {
        launchers.markUnresponsive(uid, `launcher exited (code ${code}, signal ${signal})`);
      },
      onReady: (uid) => ready.forEach((f) => f(uid)),
    });
    mode = { kind: "podless", spawner, socketRoot: paths.socketRoot };
  } else {
    mode = {
      kind: "kubevirt",
      podsDir: options.podsDir ?? "/var/lib/kubelet/pods",
      linkDir: join(config.runDir, "pod-sockets"),
    };
  }
  const controller = new VmiController({
    nodeName: config.nodeName,
    mode,
    informer,
    queue,
    expectations,
    statusWriter,
    recorder,
    ghosts,
    launchers,
    reapDomain: options.reapDomain,
  });
  gone.push((uid) => controller.launcherGone(uid));
  ready.push((uid) => controller.wake(uid));

  const notify = await NotifyServer.start(paths.notifySocket, {
    onDomainEvent: (e) => controller.domainEvent(e.type, e.domain),
    onK8sEvent: (e) => {
      recorder.record(
        {
          apiVersion: "kubevirt.io/v1",
          kind: "VirtualMachineInstance",
          metadata: { namespace: e.namespace, name: e.name, uid: e.uid },
        },
        e.type,
        e.reason,
        e.message,
      ).catch((error) => log.warn("Cannot record launcher event: {error}", { error }));
    },
  });

  // Re-adopt: ask every launcher a ghost record names for its domain.
  const adopted = await adoptLaunchers(ghosts, launchers, controller);
  launchers.startMonitor();

  // Workers start only once the informer has listed: before that, a VMI missing from
  // the cache would look deleted and its running VM would be shut down (seed 2.2).
  informer.start();
  let readyFlag = false;
  informer.waitForSync().then(() => {
    if (queue.shuttingDown()) return;
    controller.run(options.workers ?? 8);
    readyFlag = true;
    log.info("Handler ready: {vmis} VMIs on this node, {adopted} launchers re-adopted", {
      vmis: informer.list().length,
      adopted,
      startupMs: Math.round(performance.now() - started),
    });
  });

  const resync = setInterval(() => {
    adoptLaunchers(ghosts, launchers, controller).catch((error) =>
      log.warn("Domain resync failed: {error}", { error })
    );
  }, options.resyncMs ?? 5 * 60_000);

  let health: Deno.HttpServer | undefined;
  if (options.healthAddress) {
    const [hostname, port] = splitHostPort(options.healthAddress);
    health = Deno.serve({ hostname, port, onListen: () => {} }, (req) => {
      const path = new URL(req.url).pathname;
      if (path === "/healthz") return new Response("ok\n");
      if (path === "/readyz") {
        return readyFlag ? new Response("ok\n") : new Response("not ready\n", { status: 503 });
      }
      return new Response("not found\n", { status: 404 });
    });
  }

  let resolveDone!: () => void;
  const done = new Promise<void>((r) => (resolveDone = r));
  let stopping: Promise<void> | undefined;
  const stop = () => {
    stopping ??= (async () => {
      readyFlag = false;
      log.info("Handler stopping: draining in-flight syncs; VMs keep running");
      clearInterval(resync);
      const t0 = performance.now();
      const step = (what: string) =>
        log.debug("Stop step {what} done after {ms} ms", {
          what,
          ms: Math.round(performance.now() - t0),
        });
      await queue.shutDownWithDrain();
      await controller.stopped();
      step("drain");
      await informer.stop();
      step("informer");
      await notify.stop();
      step("notify");
      if (mode.kind === "podless") mode.spawner.release();
      launchers.close();
      await health?.shutdown();
      step("health");
      log.info("Handler stopped");
      resolveDone();
    })();
    return stopping;
  };
  return { controller, informer, ready: () => readyFlag, stop, done };
}

async function adoptLaunchers(
  ghosts: GhostRecordStore,
  launchers: LauncherClients,
  controller: VmiController,
): Promise<number> {
  let adopted = 0;
  const records = ghosts.list();
  const limit = 32;
  for (let i = 0; i < records.length; i += limit) {
    await Promise.all(
      records.slice(i, i + limit).map(async (rec) => {
        const client = launchers.getOrCreate(rec.uid, rec.socketFile);
        try {
          await Deno.lstat(rec.socketFile);
          const domain = await client.getDomain();
          if (domain) controller.domainEvent("ADDED", domain);
          adopted++;
        } catch (error) {
          log.warn("Launcher of ghost record not answering yet: {error}", {
            namespace: rec.namespace,
            name: rec.name,
            uid: rec.uid,
            error,
          });
        }
      }),
    );
  }
  return adopted;
}

function splitHostPort(address: string): [string, number] {
  const i = address.lastIndexOf(":");
  const port = Number(address.slice(i + 1));
  if (i < 0 || !Number.isInteger(port) || port < 0 || port > 65535) {
    throw new Error(`Invalid health address ${JSON.stringify(address)}: expected host:port`);
  }
  return [address.slice(0, i) || "0.0.0.0", port];
}
