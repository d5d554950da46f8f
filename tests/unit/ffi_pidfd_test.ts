import assert from "node:assert/strict";
import {
  close,
  ErrnoError,
  pidfdExited,
  pidfdOpen,
  pidfdSendSignal,
  SIGTERM,
} from "../../ffi/mod.ts";

Deno.test("pidfdSendSignal() reaches the process the pidfd was opened for and pidfdExited() sees it end", async () => {
  const child = new Deno.Command("sleep", { args: ["30"], stdin: "null" }).spawn();
  const fd = pidfdOpen(child.pid);
  try {
    assert.equal(pidfdExited(fd), false);
    pidfdSendSignal(fd, SIGTERM);
    const status = await child.status;
    assert.equal(status.signal, "SIGTERM");
    assert.equal(pidfdExited(fd), true);
    // Reaped: the pidfd still names that process, never a new one with its PID.
    assert.throws(
      () => pidfdSendSignal(fd, 0),
      (e) => e instanceof ErrnoError && e.code === "ESRCH",
    );
  } finally {
    close(fd);
  }
});
