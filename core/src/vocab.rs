//! The words every part of the agent shares, at the bottom of the crate: a Service's key and
//! ports, transport protocols, IP families, the labels that tie objects together. Nothing here
//! imports from another module of the agent.

use nodelb_netfilter::L4Proto;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

/// The strings kept of an object: up to 24 bytes (names, protocols, addresses, versions) are
/// stored inline, not as an allocation of their own each.
pub type Str = compact_str::CompactString;

/// A 64-bit hash of `value`, kept where only equality with a later value is asked (what the
/// status writer wrote, a stored condition's message): the same in one process, never
/// compared across processes or written anywhere.
pub fn digest<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// Label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Label that gives a Service to another proxy (any value): nodelb leaves it alone, as
/// kube-proxy does.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";

/// k3s ServiceLB's node label (`--servicelb-compat`, `plan::servicelb`): once any node carries
/// it, only nodes where it is `true` serve.
pub const ENABLELB_LABEL: &str = "svccontroller.k3s.cattle.io/enablelb";
/// k3s ServiceLB's pool (`--servicelb-compat`, `plan::servicelb`): a label on Services and on
/// nodes.
pub const LBPOOL_LABEL: &str = "svccontroller.k3s.cattle.io/lbpool";

/// The `type` of the condition nodelb writes in each handled Service's status.
pub const SERVING_CONDITION: &str = "nodelb.io/Serving";

/// An IP family as Kubernetes names it (`spec.ipFamilies`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: &IpAddr) -> IpFamily {
        if ip.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }

    /// `"IPv4"` / `"IPv6"`, as in `spec.ipFamilies`.
    pub fn parse(s: &str) -> Option<IpFamily> {
        match s {
            "IPv4" => Some(IpFamily::V4),
            "IPv6" => Some(IpFamily::V6),
            _ => None,
        }
    }

    pub fn netfilter(self) -> nodelb_netfilter::Family {
        match self {
            IpFamily::V4 => nodelb_netfilter::Family::Ip,
            IpFamily::V6 => nodelb_netfilter::Family::Ip6,
        }
    }
}

impl IpFamily {
    /// `IPv4` or `IPv6`, as the API writes families.
    pub fn label(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }
}

impl std::fmt::Display for IpFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Which families this node programs: enabled by flag (`--ipv4`/`--ipv6`) and able to forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Families {
    pub v4: bool,
    pub v6: bool,
}

impl Families {
    pub fn contains(&self, f: IpFamily) -> bool {
        match f {
            IpFamily::V4 => self.v4,
            IpFamily::V6 => self.v6,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = IpFamily> + '_ {
        [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .filter(|f| self.contains(*f))
    }
}

/// `namespace/name` of a Service. Shared, not copied: the objects, the planners, the claims
/// and the status writer each index every Service by it, and a clone costs no allocation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl ServiceKey {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> ServiceKey {
        ServiceKey {
            namespace: namespace.as_ref().into(),
            name: name.as_ref().into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Whether a key can name nodelb's chains and sets: namespace and name are DNS labels, as a
/// real API server guarantees.
pub fn valid_key(key: &ServiceKey) -> bool {
    dns_label(&key.namespace) && dns_label(&key.name)
}

/// A DNS label (lowercase letters, digits and `-`, at most 63, a letter or digit at each end):
/// what a real API server allows as a namespace, a Service's name and a Service port's name,
/// and what nodelb's chain, set and counter names and comments can carry.
pub fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The transport protocols a Service port may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// Kubernetes spelling (`TCP`, `UDP`, `SCTP`); unset means TCP.
    pub fn parse(p: Option<&str>) -> Option<Protocol> {
        match p {
            None | Some("TCP") => Some(Protocol::Tcp),
            Some("UDP") => Some(Protocol::Udp),
            Some("SCTP") => Some(Protocol::Sctp),
            Some(_) => None,
        }
    }

    /// Whether conntrack keeps this protocol's flows on their endpoint by 5-tuple in a way
    /// only a deletion ends: UDP and SCTP, not TCP (a TCP connection to an endpoint that left
    /// ends on its own, and a new one has a new source port and a fresh pick).
    pub fn kept_by_tuple(self) -> bool {
        matches!(self, Protocol::Udp | Protocol::Sctp)
    }

    pub fn l4(self) -> L4Proto {
        match self {
            Protocol::Tcp => L4Proto::Tcp,
            Protocol::Udp => L4Proto::Udp,
            Protocol::Sctp => L4Proto::Sctp,
        }
    }

    pub fn keyword(self) -> &'static str {
        self.l4().keyword()
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        })
    }
}

/// A valid Service port: what nodelb matches on the node's addresses.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortId {
    /// `None` for an unnamed port (`name` unset or empty).
    pub name: Option<Str>,
    pub protocol: Protocol,
    pub port: u16,
}

impl ServicePortId {
    /// The port's name, else its number: the part after `:` in comments.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => n.to_string(),
            None => self.port.to_string(),
        }
    }
}

impl fmt::Display for ServicePortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(n) => write!(f, "{n}/{}/{}", self.protocol, self.port),
            None => write!(f, "{}/{}", self.protocol, self.port),
        }
    }
}

/// A socket on a node that takes traffic for a port: TCP or SCTP listening, UDP bound and not
/// connected. `address` is what it is bound to: its family's wildcard (`0.0.0.0`, `::`) or one
/// address. `process` names its owner where the host could tell (`/proc`); it never decides
/// anything.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Listener {
    pub protocol: Protocol,
    pub address: IpAddr,
    pub port: u16,
    pub process: Option<String>,
}

impl fmt::Display for Listener {
    /// `socat on 0.0.0.0`, or `a host process on 203.0.113.1` when the owner is not known.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.process {
            Some(p) => write!(f, "{p} on {}", self.address),
            None => write!(f, "a host process on {}", self.address),
        }
    }
}
