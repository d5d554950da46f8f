/** Paths cleaned as Go's `path.Clean` and ServeMux clean them (virt-handler's server). */
import assert from "node:assert/strict";
import { cleanUrlPath } from "../../mod/handler/testing.ts";

Deno.test("cleanUrlPath() collapses repeated slashes and resolves dot segments, as Go's ServeMux", () => {
  const rows: [string, string][] = [
    ["/healthz", "/healthz"],
    ["//healthz", "/healthz"],
    ["/a//b/./c/../d", "/a/b/d"],
    ["/../x", "/x"],
    ["/", "/"],
    ["//", "/"],
    ["/v1/sub/", "/v1/sub/"],
  ];
  for (const [path, clean] of rows) assert.equal(cleanUrlPath(path), clean, path);
});
