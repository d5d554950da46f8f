/**
 * What the guest's DHCP lease says about DNS, from the resolver configuration of the pod
 * (KubeVirt's launcher reads its own `/etc/resolv.conf`; a pod-less launcher host the
 * host's): the name servers, the search list and the domain name, and the guest's host
 * name.
 *
 * @module
 */

import { familyOf, isLoopbackAddress } from "./address.ts";

/** The DNS facts a lease carries. */
export interface GuestDns {
  /** IPv4 name servers (`8.8.8.8` when the file names none at all, as KubeVirt does). */
  servers4: string[];
  /** IPv6 name servers. */
  servers6: string[];
  /** The search list, lower case; `cluster.local` when the file has none (KubeVirt's default). */
  search: string[];
  /** The domain name: the longest search domain. */
  domain?: string;
}

const DEFAULT_SERVER = "8.8.8.8";
const DEFAULT_SEARCH = "cluster.local";

/**
 * Reads a resolv.conf. Loopback servers (a node's local stub resolver) are left out: the
 * guest cannot reach its host's loopback. With `subdomain`, `<subdomain>.<the longest
 * search domain with ".svc.">` leads the search list, so the guest's FQDN resolves as a
 * pod's would.
 */
export function parseResolvConf(text: string, subdomain?: string): GuestDns {
  const servers: string[] = [];
  let search: string[] = [];
  for (const raw of text.split("\n")) {
    const line = raw.replace(/[#;].*$/, "").trim();
    const [keyword, ...values] = line.split(/\s+/);
    if (keyword === "nameserver" && values[0] && !isLoopbackAddress(values[0])) {
      servers.push(values[0].replace(/%.*$/, ""));
    }
    if (keyword === "search") search = values.map((v) => v.toLowerCase().replace(/\.$/, ""));
    if (keyword === "domain" && search.length === 0 && values[0]) {
      search = [values[0].toLowerCase().replace(/\.$/, "")];
    }
  }
  search = search.filter((d) =>
    /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/.test(d)
  );
  if (search.length === 0) search = [DEFAULT_SEARCH];
  if (subdomain) {
    const svc = search.filter((d) => d.includes(".svc.")).sort((a, b) => b.length - a.length)[0];
    if (svc) search = [`${subdomain}.${svc}`, ...search];
  }
  const servers4 = servers.filter((s) => familyOf(s) === 4);
  const servers6 = servers.filter((s) => familyOf(s) === 6);
  return {
    servers4: servers.length === 0 ? [DEFAULT_SERVER] : servers4,
    servers6,
    search,
    domain: [...search].sort((a, b) => b.length - a.length)[0],
  };
}

/**
 * The guest's host name as virt-controller gives the launcher pod one: `spec.hostname`,
 * else the VMI's name, cut to 63 characters and without dots.
 */
export function guestHostname(
  vmi: { metadata: { name: string }; spec: { hostname?: string } },
): string {
  const name = vmi.spec.hostname || vmi.metadata.name;
  return name.slice(0, 63).split(".")[0];
}
