// Shared bits of the grpc-js/Deno crash repro: the Echo service and target parsing.
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { fileURLToPath } from "node:url";

const def = protoLoader.loadSync(fileURLToPath(new URL("./echo.proto", import.meta.url)), {
  keepCase: true,
  defaults: true,
});
export const echoService = def["repro.Echo"] as unknown as grpc.ServiceDefinition;
export const EchoClient = grpc.makeClientConstructor(echoService, "Echo");

/** Parses a JSON object of channel/server options from an env var (default {}). */
export function envOptions(name: string): Record<string, unknown> {
  const raw = Deno.env.get(name);
  return raw ? JSON.parse(raw) : {};
}
export { grpc };
