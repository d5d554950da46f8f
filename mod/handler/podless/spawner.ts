/**
 * Pod-less mode: the handler starts `virtnode launcher` itself, one process per
 * VMI, where KubeVirt would have virt-controller create a launcher pod.
 *
 * Launchers are started in their own session (`setsid`) with their output in a
 * log file, so that neither the handler's death nor a signal to its terminal
 * stops a VM: a restarted handler finds them again through their ghost records.
 * The log file is bounded: the launcher is told it (`VIRTNODE_LOG_FILE`) and writes its
 * log there itself through a rotating writer (`mod/log`'s `RotatingFile`), since it
 * outlives the handler and no pipe to the handler could carry its output; the rest of
 * its output (a crash's last words) is appended by the shell, and a start rotates a
 * file that is full.
 * Restart policy is none, as for a launcher pod: a launcher that exits is
 * reported and its VMI fails. The launcher's PID is kept in `<uid>.pid` (one number, as
 * scripts and older handlers read it) and its start time in `<uid>.start`, so that a
 * restarted handler can still stop a launcher it did not start.
 *
 * Every signal goes through a pidfd, opened before the process behind a PID is checked to
 * be the UID's launcher (`launcher --uid <uid>` on its command line, our user, and the
 * start time recorded when it was spawned): a PID reused by another process between the
 * check and the signal can never be hit.
 *
 * @module
 */
import { join } from "node:path";
import {
  close,
  closeOnExecFrom,
  ErrnoError,
  pidfdExited,
  pidfdOpen,
  pidfdSendSignal,
  processStartTime,
  SIGKILL,
  SIGTERM,
  writeFileDurably,
} from "../../../ffi/mod.ts";
import { SocketNames } from "../../api/mod.ts";
import { removeIfPresent, sleep } from "../../lifecycle/mod.ts";
import { getLogger, LOG_FILE_ENV, rotateLogFileIfFull } from "../../log/mod.ts";

const log = getLogger("handler", "launcher-spawner");

/**
 * The PID of a running `virtnode launcher ... --uid <uid>` process of this user, from
 * /proc. Only a hint: signal it through {@linkcode LauncherSpawner.stop}, which checks
 * the process again behind a pidfd.
 */
export function findLauncherByUid(
  uid: string,
  identity: ProcessIdentity = LAUNCHER_IDENTITY,
): Promise<number | undefined> {
  // Read synchronously: Deno 2.9.3 may close a node:net socket's descriptor twice, and a
  // directory's read on another thread must not fall in between (docs/compatibility.md).
  for (const entry of Deno.readDirSync("/proc")) {
    if (!/^\d+$/.test(entry.name)) continue;
    const pid = Number(entry.name);
    if (isLauncherProcess(pid, uid, undefined, identity)) return Promise.resolve(pid);
  }
  return Promise.resolve(undefined);
}

/** How a spawned process is recognised in /proc: its subcommand and the flag of its key. */
export interface ProcessIdentity {
  /** e.g. `launcher`. */
  subcommand: string;
  /** e.g. `--uid`, followed by the key. */
  keyFlag: string;
}

/** `virtnode launcher ... --uid <uid>`. */
export const LAUNCHER_IDENTITY: ProcessIdentity = { subcommand: "launcher", keyFlag: "--uid" };

/** Where a launcher was started: its PID and start time, as its files record them. */
interface LauncherRecord {
  pid: number;
  /** Field 22 of /proc/<pid>/stat; unknown for a launcher of an older handler. */
  startTime?: string;
}

/** A PID file's PID, or undefined when it holds anything else. */
function parsePid(text: string): number | undefined {
  const pid = Number(text.trim());
  return /^\d+$/.test(text.trim()) && pid > 1 ? pid : undefined;
}

/** The real user ID a process runs as (`Uid:` of /proc/<pid>/status). */
function processOwner(pid: number): number | undefined {
  try {
    const status = Deno.readTextFileSync(`/proc/${pid}/status`);
    const uid = /^Uid:\s+(\d+)/m.exec(status)?.[1];
    return uid === undefined ? undefined : Number(uid);
  } catch {
    return undefined;
  }
}

/**
 * Whether `pid` is the UID's launcher: `launcher` and `--uid <uid>` on its command line,
 * run by this user, and, when known, started at `startTime`.
 */
function isLauncherProcess(
  pid: number,
  uid: string,
  startTime?: string,
  identity: ProcessIdentity = LAUNCHER_IDENTITY,
): boolean {
  let cmdline: string;
  try {
    cmdline = `\0${Deno.readTextFileSync(`/proc/${pid}/cmdline`)}`;
  } catch {
    return false; // exited meanwhile
  }
  if (
    !cmdline.includes(`\0${identity.subcommand}\0`) ||
    !cmdline.includes(`\0${identity.keyFlag}\0${uid}\0`)
  ) return false;
  if (processOwner(pid) !== Deno.uid()) return false;
  return startTime === undefined || processStartTime(pid) === startTime;
}

/**
 * A launcher held by a pidfd: signals reach that process or none, never one that reused
 * its PID. Shared by the children map and a running `stop`; the last holder to release it
 * closes the descriptor.
 */
class PidfdProcess {
  readonly pid: number;
  readonly #fd: number;
  #holders = 1;

  constructor(pid: number, fd: number) {
    this.pid = pid;
    this.#fd = fd;
  }

  /** Opens a pidfd for `pid` and keeps it only if `pid` is the UID's launcher. */
  static openLauncher(
    uid: string,
    record: LauncherRecord,
    identity: ProcessIdentity = LAUNCHER_IDENTITY,
  ): PidfdProcess | undefined {
    let fd: number;
    try {
      fd = pidfdOpen(record.pid);
    } catch (error) {
      if (error instanceof ErrnoError && error.code === "ESRCH") return undefined;
      throw error;
    }
    const process = new PidfdProcess(record.pid, fd);
    // Checked after the pidfd is open, and alive after the check: /proc described the
    // process the pidfd holds, not a later one with its PID.
    if (isLauncherProcess(record.pid, uid, record.startTime, identity) && !process.exited()) {
      return process;
    }
    process.release();
    return undefined;
  }

  /** One more holder; each holder calls {@linkcode release} once. */
  retain(): PidfdProcess {
    this.#holders++;
    return this;
  }

  /** Drops one holder; the last closes the pidfd. */
  release(): void {
    if (--this.#holders === 0) close(this.#fd);
  }

  /** Whether the process has exited (reaped or not). */
  exited(): boolean {
    return pidfdExited(this.#fd);
  }

  /** Sends a signal; false when the process had exited already. */
  signal(signal: number): boolean {
    try {
      pidfdSendSignal(this.#fd, signal);
      return true;
    } catch (error) {
      if (error instanceof ErrnoError && error.code === "ESRCH") return false;
      throw error;
    }
  }
}

/** A launcher this handler spawned, held by the pidfd opened before it could be reaped. */
interface Child {
  child: Deno.ChildProcess;
  process: PidfdProcess;
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
  /** The file in `socketDir` whose appearance means ready; `launcher-sock` unless told. */
  readyName?: string;
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
  /** How the spawned processes are recognised; `virtnode launcher --uid <uid>` unless told. */
  identity?: ProcessIdentity;
}

/** Starts, watches and stops launcher processes. */
export class LauncherSpawner {
  readonly #opts: LauncherSpawnerOptions;
  readonly #children = new Map<string, Child>();
  readonly #dir: string;
  readonly #starting = new Set<string>();
  readonly #slotWaiters: (() => void)[] = [];
  readonly #maxStarting: number;
  readonly #identity: ProcessIdentity;

  /** Creates the spawner; nothing starts until {@linkcode start}. */
  constructor(options: LauncherSpawnerOptions) {
    this.#opts = options;
    this.#dir = join(options.stateDir, "launchers");
    this.#identity = options.identity ?? LAUNCHER_IDENTITY;
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

  /** The start time of the process the PID file names (written before the PID file). */
  #startFile(uid: string): string {
    return join(this.#dir, `${uid}.start`);
  }

  /** The log file of a UID's launcher. */
  logFile(uid: string): string {
    return join(this.#dir, `${uid}.log`);
  }

  /** Whether this handler process started the UID's launcher and it still runs. */
  isChild(uid: string): boolean {
    return this.#children.has(uid);
  }

  /**
   * The PID of a UID's launcher if one is alive (child or adopted): the process its PID
   * file names, if that is still the launcher (command line, owner and start time).
   */
  async alivePid(uid: string): Promise<number | undefined> {
    const launcher = await this.#openLauncher(uid);
    if (!launcher) return undefined;
    launcher.release();
    return launcher.pid;
  }

  /** The UID's live launcher behind a pidfd, or undefined; the caller releases it. */
  async #openLauncher(uid: string): Promise<PidfdProcess | undefined> {
    const child = this.#children.get(uid);
    if (child) return child.process.exited() ? undefined : child.process.retain();
    let text: string;
    try {
      text = await Deno.readTextFile(this.#pidFile(uid));
    } catch {
      // No PID file: a handler killed between spawning a launcher and writing the
      // file must not start a second one after its restart. Look for it in /proc, and
      // write the files it missed, so the next reader need not look again.
      const pid = await findLauncherByUid(uid, this.#identity);
      if (pid === undefined) return undefined;
      const found = PidfdProcess.openLauncher(uid, { pid }, this.#identity);
      if (found) {
        const startTime = processStartTime(pid);
        if (startTime !== undefined) await writeFileDurably(this.#startFile(uid), `${startTime}\n`);
        await writeFileDurably(this.#pidFile(uid), `${pid}\n`);
        log.info("Launcher {pid} found without its PID file; PID file written", { uid, pid });
      }
      return found;
    }
    const pid = parsePid(text);
    if (pid === undefined) return undefined;
    const startTime = (await Deno.readTextFile(this.#startFile(uid)).catch(() => "")).trim();
    return PidfdProcess.openLauncher(
      uid,
      { pid, startTime: startTime || undefined },
      this.#identity,
    );
  }

  /**
   * Writes the PID and start-time files of a UID's launcher that has none (its handler was
   * killed between spawning it and writing them), found in /proc; no-op when the PID
   * file exists or no launcher runs.
   */
  async ensurePidFile(uid: string): Promise<void> {
    if (await exists(this.#pidFile(uid))) return;
    await this.alivePid(uid);
  }

  /** Drops the handle of the UID's child, if it is `only` (or any, unless told). */
  #forgetChild(uid: string, only?: Child): void {
    const child = this.#children.get(uid);
    if (!child || (only && child !== only)) return;
    this.#children.delete(uid);
    child.process.release();
  }

  /**
   * Whether a launcher was ever started for this UID on this host: its PID file or log
   * exists, or a launcher process of ours carries the UID. A handler killed between
   * writing a ghost record and spawning leaves a record whose launcher never existed;
   * that one may be started, while a launcher that ran and died is a failed VMI (restart
   * policy none).
   */
  async everStarted(uid: string): Promise<boolean> {
    if (this.#children.has(uid)) return true;
    for (const file of [this.#pidFile(uid), this.logFile(uid)]) {
      if (await exists(file)) return true;
    }
    return (await findLauncherByUid(uid, this.#identity)) !== undefined;
  }

  /** Starts the launcher of a spec unless one is alive already. */
  async start(spec: LauncherSpec): Promise<void> {
    if (await this.alivePid(spec.uid)) return;
    await Deno.mkdir(this.#dir, { recursive: true, mode: 0o700 });
    await Deno.mkdir(spec.socketDir, { recursive: true, mode: 0o700 });
    const { cmd, args } = this.#opts.command(spec);
    const logFile = this.logFile(spec.uid);
    try {
      // A host restarted again and again appends its start-up output each time.
      rotateLogFileIfFull(logFile);
    } catch (error) {
      log.warn("Cannot rotate the launcher's log file: {error}", { uid: spec.uid, error });
    }
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
      // The launcher writes its log there itself, rotating it at its bound.
      env: { [LOG_FILE_ENV]: logFile },
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
    // Before anything awaits, so before Deno can reap it: the PID is still this child's
    // (sh execs setsid, which execs the launcher: one process, one start time).
    let fd: number;
    try {
      fd = pidfdOpen(child.pid);
    } catch (error) {
      child.kill("SIGKILL"); // Deno's own handle: valid until it reaps the child
      throw error;
    }
    const startTime = processStartTime(child.pid);
    child.unref();
    const entry: Child = { child, process: new PidfdProcess(child.pid, fd) };
    this.#children.set(spec.uid, entry);
    this.#starting.add(spec.uid);
    this.#watchReady(spec).finally(() => this.#release(spec.uid));
    // The start time first: a PID file is never read without it (but an older handler's).
    if (startTime !== undefined) {
      await writeFileDurably(this.#startFile(spec.uid), `${startTime}\n`);
    }
    await writeFileDurably(this.#pidFile(spec.uid), `${child.pid}\n`);
    log.info("Started launcher {pid}", {
      namespace: spec.namespace,
      name: spec.name,
      uid: spec.uid,
      pid: child.pid,
      logFile,
    });
    child.status.then((status) => {
      this.#forgetChild(spec.uid, entry);
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
    const socket = join(spec.socketDir, spec.readyName ?? SocketNames.Launcher);
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
   * period), then SIGKILL after `timeoutMs`. Returns once it is gone. Both signals go
   * through a pidfd of the verified launcher; a PID file naming any other process
   * signals nothing.
   */
  async stop(uid: string, timeoutMs: number): Promise<void> {
    const launcher = await this.#openLauncher(uid);
    if (launcher) {
      try {
        launcher.signal(SIGTERM);
        if (!await exitedWithin(launcher, timeoutMs)) {
          log.warn("Launcher did not stop in time; killing it", { uid, pid: launcher.pid });
          launcher.signal(SIGKILL);
          await exitedWithin(launcher, KILL_WAIT_MS);
        }
      } finally {
        launcher.release();
      }
    }
    this.#forgetChild(uid);
    // The launcher is stopped already, and stop() is called from error paths that must go
    // on; a stale pid file is told apart by its start file.
    for (const file of [this.#pidFile(uid), this.#startFile(uid)]) {
      await removeIfPresent(file).catch((error) =>
        log.warn("Cannot remove {file}: {error}", { uid, file, error })
      );
    }
  }

  /** Forgets children without stopping them (the handler is exiting; VMs keep running). */
  release(): void {
    for (const uid of [...this.#children.keys()]) this.#forgetChild(uid);
  }
}

/** How long `stop` waits for a SIGKILLed launcher to be gone. */
const KILL_WAIT_MS = 5_000;

/** Polls until the process exits or `timeoutMs` passes; whether it exited. */
async function exitedWithin(process: PidfdProcess, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!process.exited()) {
    if (Date.now() >= deadline) return false;
    await sleep(50);
  }
  return true;
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch {
    return false;
  }
}
