/**
 * Pod-less mode: the handler starts `virtnode launcher` itself, one process per
 * VMI, where KubeVirt would have virt-controller create a launcher pod.
 *
 * Launchers are started in their own session (`setsid`) with their output in a
 * log file, so that neither the handler's death nor a signal to its terminal
 * stops a VM: a restarted handler finds them again through their ghost records.
 * Restart policy is none, as for a launcher pod: a launcher that exits is
 * reported and its VMI fails. The launcher's PID is kept in a file so that a
 * restarted handler can still stop a launcher it did not start.
 *
 * @module
 */
import { join } from "node:path";
import { closeOnExecFrom } from "../../ffi/mod.ts";
import { SocketNames } from "../api/mod.ts";
import { sleep } from "../lifecycle/mod.ts";
import { getLogger } from "../log/mod.ts";

const log = getLogger("handler", "launcher-spawner");

/** The PID of a running `virtnode launcher ... --uid <uid>` process, from /proc. */
export async function findLauncherByUid(uid: string): Promise<number | undefined> {
  const needle = `\0--uid\0${uid}\0`;
  for await (const entry of Deno.readDir("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    let cmdline: string;
    try {
      cmdline = await Deno.readTextFile(`/proc/${entry.name}/cmdline`);
    } catch {
      continue; // exited meanwhile
    }
    if (cmdline.includes("\0launcher\0") && `\0${cmdline}`.includes(needle)) {
      return Number(entry.name);
    }
  }
  return undefined;
}

/** What a launcher is started for. */
export interface LauncherSpec {
  /** The VMI's namespace. */
  namespace: string;
  /** The VMI's name. */
  name: string;
  /** The VMI's UID. */
  uid: string;
  /** The VMI's grace period, seconds. */
  gracePeriodSeconds: number;
  /** The launcher's own directory (its socket lives there). */
  socketDir: string;
}

/** Options of {@linkcode LauncherSpawner}. */
export interface LauncherSpawnerOptions {
  /** Builds the command line that runs `virtnode launcher` for a spec. */
  command(spec: LauncherSpec): { cmd: string; args: string[] };
  /** Where launcher logs and PID files go. */
  stateDir: string;
  /** Called when a launcher this handler started exits. */
  onExit?(uid: string, code: number, signal: string | null): void;
  /** Called when a launcher this handler started has its cmd socket ready. */
  onReady?(uid: string): void;
  /**
   * Launchers allowed to be starting (spawned, socket not ready yet) at once; default
   * twice the CPUs, at least 4. Starting a launcher is CPU-bound: starting 200 at once
   * on 2 cores left the first VMI waiting 17 s for the others.
   */
  maxStarting?: number;
}

/** Starts, watches and stops launcher processes. */
export class LauncherSpawner {
  readonly #opts: LauncherSpawnerOptions;
  readonly #children = new Map<string, Deno.ChildProcess>();
  readonly #dir: string;
  readonly #starting = new Set<string>();
  readonly #slotWaiters: (() => void)[] = [];
  readonly #maxStarting: number;

  /** Creates the spawner; nothing starts until {@linkcode start}. */
  constructor(options: LauncherSpawnerOptions) {
    this.#opts = options;
    this.#dir = join(options.stateDir, "launchers");
    this.#maxStarting = options.maxStarting ??
      Math.max(4, 2 * (navigator.hardwareConcurrency || 2));
  }

  /** Whether another launcher may start now (see `maxStarting`). */
  canStart(): boolean {
    return this.#starting.size < this.#maxStarting;
  }

  /** Calls `fn` once, when a starting launcher becomes ready or exits. */
  onSlotFree(fn: () => void): void {
    this.#slotWaiters.push(fn);
  }

  #release(uid: string): void {
    if (!this.#starting.delete(uid)) return;
    this.#slotWaiters.shift()?.();
  }

  #pidFile(uid: string): string {
    return join(this.#dir, `${uid}.pid`);
  }

  /** The log file of a UID's launcher. */
  logFile(uid: string): string {
    return join(this.#dir, `${uid}.log`);
  }

  /** Whether this handler process started the UID's launcher and it still runs. */
  isChild(uid: string): boolean {
    return this.#children.has(uid);
  }

  /** The PID of a UID's launcher if one is alive (child or adopted). */
  async alivePid(uid: string): Promise<number | undefined> {
    const child = this.#children.get(uid);
    if (child) return child.pid;
    let pid: number;
    try {
      pid = Number((await Deno.readTextFile(this.#pidFile(uid))).trim());
    } catch {
      // No PID file: a handler killed between spawning a launcher and writing the
      // file must not start a second one after its restart. Look for it in /proc.
      return await findLauncherByUid(uid);
    }
    if (!Number.isInteger(pid) || pid <= 1) return undefined;
    try {
      const cmdline = await Deno.readTextFile(`/proc/${pid}/cmdline`);
      // A recycled PID is not our launcher: it must carry the UID on its command line.
      return cmdline.includes(uid) ? pid : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * Whether a launcher was ever started for this UID on this host: its PID file or log
   * exists, or a process carries the UID. A handler killed between writing a ghost record
   * and spawning leaves a record whose launcher never existed; that one may be started,
   * while a launcher that ran and died is a failed VMI (restart policy none).
   */
  async everStarted(uid: string): Promise<boolean> {
    if (this.#children.has(uid)) return true;
    for (const file of [this.#pidFile(uid), this.logFile(uid)]) {
      if (await exists(file)) return true;
    }
    return (await findLauncherByUid(uid)) !== undefined;
  }

  /** Starts the launcher of a spec unless one is alive already. */
  async start(spec: LauncherSpec): Promise<void> {
    if (await this.alivePid(spec.uid)) return;
    await Deno.mkdir(this.#dir, { recursive: true, mode: 0o700 });
    await Deno.mkdir(spec.socketDir, { recursive: true, mode: 0o700 });
    const { cmd, args } = this.#opts.command(spec);
    const logFile = this.logFile(spec.uid);
    // The launcher must hold none of the handler's sockets (a launcher holding the notify
    // listener would swallow the connects of every launcher after a handler restart).
    closeOnExecFrom(3);
    // sh only redirects output to the log file; setsid gives the launcher its own
    // session so the handler's terminal and process group signals never reach it.
    const child = new Deno.Command("/bin/sh", {
      args: [
        "-c",
        'log=$1; shift; exec setsid "$@" >>"$log" 2>&1 </dev/null',
        "sh",
        logFile,
        cmd,
        ...args,
      ],
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
    child.unref();
    this.#children.set(spec.uid, child);
    this.#starting.add(spec.uid);
    this.#watchReady(spec).finally(() => this.#release(spec.uid));
    await Deno.writeTextFile(this.#pidFile(spec.uid), `${child.pid}\n`, { mode: 0o600 });
    log.info("Started launcher {pid}", {
      namespace: spec.namespace,
      name: spec.name,
      uid: spec.uid,
      pid: child.pid,
      logFile,
    });
    child.status.then((status) => {
      if (this.#children.get(spec.uid) === child) this.#children.delete(spec.uid);
      this.#release(spec.uid);
      log.info("Launcher exited with code {code}", {
        uid: spec.uid,
        code: status.code,
        signal: status.signal,
      });
      this.#opts.onExit?.(spec.uid, status.code, status.signal);
    });
  }

  /**
   * Tells `onReady` as soon as the launcher renames its socket to `launcher-sock`
   * (inotify on its directory), so the VMI is synced at once instead of at the next
   * poll. Gives up after a minute; the controller's fallback poll still applies.
   */
  async #watchReady(spec: LauncherSpec): Promise<void> {
    const socket = join(spec.socketDir, SocketNames.Launcher);
    let watcher: Deno.FsWatcher;
    try {
      watcher = Deno.watchFs(spec.socketDir, { recursive: false });
    } catch {
      return;
    }
    const timer = setTimeout(() => watcher.close(), 60_000);
    try {
      // It may have been quicker than the watcher.
      if (await exists(socket)) return this.#ready(spec.uid);
      for await (const event of watcher) {
        if (event.paths.includes(socket) && await exists(socket)) return this.#ready(spec.uid);
      }
    } catch {
      /* closed */
    } finally {
      clearTimeout(timer);
      try {
        watcher.close();
      } catch { /* closed already */ }
    }
  }

  #ready(uid: string): void {
    this.#release(uid);
    this.#opts.onReady?.(uid);
  }

  /**
   * Stops a UID's launcher: SIGTERM (it shuts its guest down within the grace
   * period), then SIGKILL after `timeoutMs`. Returns once it is gone.
   */
  async stop(uid: string, timeoutMs: number): Promise<void> {
    const pid = await this.alivePid(uid);
    if (pid !== undefined) {
      try {
        Deno.kill(pid, "SIGTERM");
      } catch { /* already gone */ }
      const deadline = Date.now() + timeoutMs;
      while (Date.now() < deadline && (await this.alivePid(uid)) !== undefined) {
        await sleep(50);
      }
      if ((await this.alivePid(uid)) !== undefined) {
        log.warn("Launcher did not stop in time; killing it", { uid, pid });
        try {
          Deno.kill(pid, "SIGKILL");
        } catch { /* gone meanwhile */ }
      }
    }
    this.#children.delete(uid);
    await Deno.remove(this.#pidFile(uid)).catch(() => {});
  }

  /** Forgets children without stopping them (the handler is exiting; VMs keep running). */
  release(): void {
    this.#children.clear();
  }
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}
