/**
 * Reaching a unix socket that lives in a directory someone else controls (a launcher
 * pod's volume) without ever following a symlink out of it: the socket file is opened
 * with `O_PATH` beneath its root by `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, checked
 * to be a socket, and connected to through `/proc/self/fd/<fd>`, which names exactly that
 * inode however the directory changes afterwards.
 *
 * @module
 */
import {
  close,
  fileIdentity,
  O_DIRECTORY,
  O_PATH,
  openBeneath,
  openRoot,
  RESOLVE_IN_ROOT,
  RESOLVE_NO_MAGICLINKS,
} from "./files.ts";

/** A socket opened beneath its root; connect to {@linkcode BeneathSocket.path}. */
export interface BeneathSocket {
  /** `/proc/self/fd/<fd>`: connects to the socket that was opened, nothing else. */
  readonly path: string;
  /** Closes the descriptor; {@linkcode BeneathSocket.path} is useless afterwards. */
  release(): void;
}

/** A path beneath a root that is not a socket, or not reachable without a symlink. */
export class NotASocketError extends Error {
  /** Creates `Cannot use "<path>" beneath "<root>" as a socket: <detail>`. */
  constructor(root: string, path: string, detail: string, options?: ErrorOptions) {
    super(`Cannot use "${path}" beneath "${root}" as a socket: ${detail}`, options);
    this.name = "NotASocketError";
  }
}

/**
 * Opens the socket at `path` (relative) beneath the directory `root`, refusing any
 * symlink on the way (the last component included) and any `..` out of `root`.
 * Throws {@linkcode NotASocketError}.
 */
export function openSocketBeneath(root: string, path: string): BeneathSocket {
  let rootFd: number;
  try {
    rootFd = openRoot(root);
  } catch (error) {
    throw new NotASocketError(root, path, (error as Error).message, { cause: error });
  }
  let fd: number;
  try {
    fd = openBeneath(rootFd, path, { flags: O_PATH });
  } catch (error) {
    throw new NotASocketError(root, path, (error as Error).message, { cause: error });
  } finally {
    close(rootFd);
  }
  const magic = `/proc/self/fd/${fd}`;
  let isSocket = false;
  try {
    isSocket = Deno.statSync(magic).isSocket === true;
  } catch { /* treated as not a socket */ }
  if (!isSocket) {
    close(fd);
    throw new NotASocketError(root, path, "not a socket");
  }
  let open = true;
  return {
    path: magic,
    release() {
      if (!open) return;
      open = false;
      close(fd);
    },
  };
}

/** A directory opened inside a root; create and remove entries below {@linkcode BeneathDirectory.path}. */
export interface BeneathDirectory {
  /** `/proc/self/fd/<fd>`: names exactly the directory that was opened. */
  readonly path: string;
  /** Closes the descriptor; {@linkcode BeneathDirectory.path} is useless afterwards. */
  release(): void;
}

/**
 * Opens the directory `path` inside `root` as if `root` were `/` (`RESOLVE_IN_ROOT`):
 * symlinks on the way — a container's `/var/run -> ../run` — are followed, but absolute
 * ones and `..` stay inside `root`, and no magic link (`/proc/<pid>/...`) is followed.
 * `root` itself may be a process's `/proc/<pid>/root`. Entries created below the result's
 * path land in that directory, wherever the root's links point later.
 */
export function openDirectoryInRoot(root: string, path: string): BeneathDirectory {
  const rootFd = openRoot(root);
  let fd: number;
  try {
    fd = openBeneath(rootFd, path, {
      flags: O_PATH | O_DIRECTORY,
      resolve: RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    });
  } finally {
    close(rootFd);
  }
  let open = true;
  return {
    path: `/proc/self/fd/${fd}`,
    release() {
      if (!open) return;
      open = false;
      close(fd);
    },
  };
}

/**
 * Opens the regular file `name` in the directory `dir` (a {@linkcode BeneathDirectory}'s
 * path, or any directory the caller trusts) for reading and writing in place, following no
 * symlink (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`): a link, a device or a FIFO planted
 * there is refused before anything is opened for writing. Nothing is created or truncated.
 */
export function openRegularFileBeneath(dir: string, name: string): Deno.FsFile {
  if (name.includes("/") || name === "" || name === "." || name === "..") {
    throw new Error(`Invalid file name ${JSON.stringify(name)}`);
  }
  const dirFd = openRoot(dir);
  let fd: number;
  try {
    fd = openBeneath(dirFd, name, { flags: O_PATH });
  } finally {
    close(dirFd);
  }
  try {
    if ((fileIdentity(fd).mode & 0o170000) !== 0o100000) {
      throw new Error(`Cannot open "${name}" in "${dir}": not a regular file`);
    }
    // The descriptor's own inode, reopened for writing: the name is not looked up again.
    return Deno.openSync(`/proc/self/fd/${fd}`, { read: true, write: true });
  } finally {
    close(fd);
  }
}
