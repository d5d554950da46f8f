/**
 * The VM's network, as KubeVirt's handler and launcher set it up: so far the DHCPv4
 * messages a one-guest server exchanges with the guest behind its bridge.
 *
 * @module
 */

export {
  answerDhcp4,
  decodeDhcp4,
  Dhcp4Error,
  type Dhcp4Lease,
  type Dhcp4Message,
  type Dhcp4Route,
  DhcpMessageType,
  DhcpOption,
  encodeClasslessRoutes,
  encodeDhcp4,
  encodeSearchDomains,
  LEASE_SECONDS,
  prefixMask,
} from "./dhcp4.ts";
