/**
 * The VM's pod network, as KubeVirt's handler and launcher set it up: the plan of a VMI's
 * pod-network interfaces and their bindings (bridge, masquerade), the handler's part (the
 * links, addresses and rules it builds in the launcher's network namespace, with KubeVirt's
 * progress markers and caches), the launcher's part (the guest's DHCPv4 and DHCPv6 servers
 * and what the domain's interface opens) and pod-less mode's pod networks from the CNI
 * plugins.
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
export {
  answerDhcp6,
  decodeDhcp6,
  Dhcp6Error,
  type Dhcp6Lease,
  type Dhcp6Message,
  Dhcp6MessageType,
  Dhcp6Option,
  dhcp6Option,
  duidLl,
  encodeDhcp6,
  iaNaAddress,
} from "./dhcp6.ts";
export {
  type Cidr,
  cidrContains,
  familyOf,
  isGlobalUnicast,
  isLoopbackAddress,
  nthAddress,
  parseCidr,
} from "./address.ts";
export {
  DEFAULT_VM_CIDR4,
  DEFAULT_VM_CIDR6,
  type ForwardedPort,
  hashedPodInterfaceName,
  hostTapFor,
  hostTapName,
  isLinkName,
  libvirtNicModel,
  MASQUERADE_BRIDGE_MAC,
  NetworkSpecError,
  type PodBinding,
  type PodInterfacePlan,
  podNetworkPlan,
} from "./plan.ts";
export {
  bridgeDhcpCache,
  type BridgeDhcpFacts,
  NetworkState,
  type NetworkStateRecord,
  parseBridgeDhcpCache,
  type PodDiscovery,
  readNetworkState,
} from "./cache.ts";
export {
  adoptHostTapSteps,
  type BindingOptions,
  type BindingSteps,
  bindingSteps,
  bridgeFakeAddress,
  masqueradeAddresses,
  type NatFamily,
  natScript,
} from "./bindings.ts";
export {
  globalAddresses,
  type Link,
  type NamespaceState,
  parseNamespaceState,
  READ_STATE_COMMANDS,
  type Route,
} from "./links.ts";
export {
  hostLinkExists,
  type PodAddresses,
  PodNetworkError,
  PodNetworks,
  type PodNetworkTarget,
} from "./pod_network.ts";
export { type GuestDns, guestHostname, parseResolvConf } from "./dns.ts";
export { DhcpServers, type GuestLeases } from "./dhcp_server.ts";
export {
  type GuestNetworkEnv,
  GuestNetworkError,
  type PreparedInterface,
  prepareGuestNetwork,
  restoreGuestNetwork,
} from "./guest_network.ts";
export {
  checkPodlessNetwork,
  CniError,
  parseNetworkConfig,
  type PluginConfig,
  POD_INTERFACE,
  PODLESS_NETWORK_NAME,
  type PodlessNetworkConfig,
  PodlessNetworks,
  type PodlessNetworksOptions,
  type SecondaryAttachment,
} from "./cni.ts";
