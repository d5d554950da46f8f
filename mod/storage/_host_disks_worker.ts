/**
 * The worker thread behind `prepareHostDisks` (`host_disks.ts`): file system work on a
 * launcher's claims runs here, where a mount that stopped answering stalls this thread and
 * not the handler's event loop. Private to `mod/storage`.
 *
 * @module
 */
import { answerCalls } from "../../ffi/mod.ts";
import { hostDisksOutcome } from "./host_disks.ts";

answerCalls({ prepareHostDisks: hostDisksOutcome });
