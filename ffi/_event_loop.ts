/**
 * libvirt's default event loop, driven from the main thread without blocking it.
 * Private to `ffi/`.
 *
 * `virEventRunDefaultImpl` is declared `nonblocking`, so each iteration waits in poll() on
 * a pool thread while JavaScript keeps running. libvirt invokes event callbacks on that
 * thread; they are `Deno.UnsafeCallback.threadSafe`, so their JavaScript runs here on the
 * main thread while the loop thread waits for it. The loop runs while at least one
 * connection is open; a disabled timer is armed to wake it up when it must stop.
 *
 * @module
 */

import type { LibvirtLibrary } from "./_libvirt_symbols.ts";

const TIMEOUT_CALLBACK = { parameters: ["i32", "pointer"], result: "void" } as const;

let registeredWith: LibvirtLibrary | null = null;
let users = 0;
let running = false;
let loop: Promise<void> | null = null;
let stopping: Promise<void> | null = null;
let wakeTimer = -1;
let wakeCallback: Deno.UnsafeCallback<typeof TIMEOUT_CALLBACK> | null = null;
let failures = 0;

/**
 * Registers libvirt's default event loop implementation, once per process. Must happen
 * before the first connection is opened.
 */
export function registerEventImpl(lib: LibvirtLibrary): void {
  if (registeredWith !== null) return;
  if (lib.symbols.virEventRegisterDefaultImpl() < 0) {
    throw new Error("Cannot register libvirt's default event loop implementation");
  }
  registeredWith = lib;
}

async function run(lib: LibvirtLibrary): Promise<void> {
  while (running) {
    const rc = await lib.symbols.virEventRunDefaultImpl();
    if (rc < 0) {
      // The error belongs to a pool thread we cannot read it from; back off briefly.
      failures++;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}

/** Starts the loop (if needed) for one more user; pair with {@linkcode releaseEventLoop}. */
export function acquireEventLoop(lib: LibvirtLibrary): void {
  registerEventImpl(lib);
  users++;
  if (running) return;
  if (wakeCallback === null) {
    wakeCallback = Deno.UnsafeCallback.threadSafe(TIMEOUT_CALLBACK, (timer) => {
      lib.symbols.virEventUpdateTimeout(timer, -1);
    });
    // The loop's pending iteration keeps the process alive, not this callback.
    wakeCallback.unref();
    wakeTimer = lib.symbols.virEventAddTimeout(-1, wakeCallback.pointer, null, null);
    if (wakeTimer < 0) throw new Error("Cannot add libvirt's event loop wake-up timer");
  }
  running = true;
  // A stop may still be waiting for its last iteration; never run two iterations at once.
  const previous = stopping;
  loop = previous === null ? run(lib) : previous.then(() => run(lib));
}

/** Drops one user; the last one stops the loop and waits for its final iteration. */
export async function releaseEventLoop(): Promise<void> {
  users = Math.max(0, users - 1);
  if (users > 0 || !running || registeredWith === null) return;
  running = false;
  registeredWith.symbols.virEventUpdateTimeout(wakeTimer, 0);
  const finished = loop;
  loop = null;
  stopping = finished;
  try {
    await finished;
  } finally {
    if (stopping === finished) stopping = null;
  }
}

/** Whether the loop is running, and how many iterations failed so far (for tests). */
export function eventLoopStatus(): { running: boolean; users: number; failures: number } {
  return { running, users, failures };
}
