//! Which Services are nodelb's, and a Service's spec read into checked, plain values: ports,
//! families, traffic policy, source ranges, node selector.

use super::config::Config;
use super::diagnosis::{NotServed, ObjectRef, Warning};
use super::index::Service;
use super::node::NodeInfo;
use super::selector::Selector;
use crate::vocab::{IpFamily, Protocol, ServiceKey, ServicePortId};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

/// Label that takes a node out of every LoadBalancer's serving nodes (any value).
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// Annotation holding a label selector that limits a Service's serving nodes.
pub const NODE_SELECTOR_ANNOTATION: &str = "nodelb.io/node-selector";

impl ServiceKey {
    /// The key of a Service object: a missing namespace is `default`, as kubectl reads files.
    pub fn of(svc: &Service) -> Option<ServiceKey> {
        let name = svc.metadata.name.as_deref().filter(|n| !n.is_empty())?;
        let ns = svc
            .metadata
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or("default");
        Some(ServiceKey::new(ns, name))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrafficPolicy {
    Cluster,
    Local,
}

/// A client prefix from `loadBalancerSourceRanges`, host bits cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub len: u8,
}

impl Cidr {
    /// `192.0.2.0/24` or `2001:db8::/32`; host bits are cleared.
    pub fn parse(s: &str) -> Option<Cidr> {
        let (a, l) = s.trim().split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        let len: u8 = l.parse().ok()?;
        let addr = match addr {
            IpAddr::V4(a) if len <= 32 => {
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) if len <= 128 => {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
            _ => return None,
        };
        Some(Cidr { addr, len })
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.addr)
    }

    /// Whether `other` lies inside this prefix.
    pub fn contains(&self, other: &Cidr) -> bool {
        if self.family() != other.family() || other.len < self.len {
            return false;
        }
        Cidr::parse(&format!("{}/{}", other.addr, self.len)).is_some_and(|c| c.addr == self.addr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// A handled Service's spec, read and checked. Bad parts were dropped with a warning.
#[derive(Clone, Debug)]
pub struct LbService<'a> {
    pub key: ServiceKey,
    pub created: Option<&'a Time>,
    /// Valid ports in spec order, no (protocol, port) twice.
    pub ports: Vec<ServicePortId>,
    /// The Service's families in `ipFamilies` order.
    pub families: Vec<IpFamily>,
    pub policy: TrafficPolicy,
    /// `None` when unrestricted; else the valid ranges, nested ones folded into the outer one.
    pub source_ranges: Option<Vec<Cidr>>,
    /// The `nodelb.io/node-selector` annotation, if set.
    pub node_selector: Option<&'a str>,
}

/// Whether nodelb handles this Service at all: `type: LoadBalancer` and our class, or no class
/// while `--default-class`.
pub fn is_handled(svc: &Service, config: &Config) -> bool {
    let Some(spec) = &svc.spec else {
        return false;
    };
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return false;
    }
    match spec
        .load_balancer_class
        .as_deref()
        .filter(|c| !c.is_empty())
    {
        Some(class) => class == config.lb_class,
        None => config.default_class,
    }
}

/// Read a handled Service; every problem becomes one warning on it.
pub fn read<'a>(svc: &'a Service, key: ServiceKey, warnings: &mut Vec<Warning>) -> LbService<'a> {
    let obj = ObjectRef::service(&key);
    let mut warn = |m: String| warnings.push(Warning::new(obj.clone(), m));
    let spec = svc.spec.as_ref().expect("handled Services have a spec");

    let mut ports: Vec<ServicePortId> = Vec::new();
    for p in spec.ports.as_deref().unwrap_or_default() {
        let name = p.name.clone().filter(|n| !n.is_empty());
        let what = match &name {
            Some(n) => format!("port {n:?} ({})", p.port),
            None => format!("port {}", p.port),
        };
        let Some(protocol) = Protocol::parse(p.protocol.as_deref()) else {
            warn(format!(
                "{what}: protocol {:?} is not TCP, UDP or SCTP; port skipped",
                p.protocol.as_deref().unwrap_or_default()
            ));
            continue;
        };
        let Some(port) = u16::try_from(p.port).ok().filter(|p| *p > 0) else {
            warn(format!("{what}: port must be 1-65535; port skipped"));
            continue;
        };
        if ports
            .iter()
            .any(|q| q.protocol == protocol && q.port == port)
        {
            warn(format!(
                "{what}: {protocol} port {port} is listed twice; the later one skipped"
            ));
            continue;
        }
        ports.push(ServicePortId {
            name,
            protocol,
            port,
        });
    }
    if ports.is_empty() {
        warn("no valid port: nothing to program".to_string());
    }

    let mut families = Vec::new();
    for f in spec.ip_families.as_deref().unwrap_or_default() {
        match IpFamily::parse(f) {
            Some(f) if !families.contains(&f) => families.push(f),
            Some(_) => {}
            None => warn(format!("ipFamilies: {f:?} is not IPv4 or IPv6; ignored")),
        }
    }
    if families.is_empty() {
        let cluster_ips = spec
            .cluster_ips
            .iter()
            .flatten()
            .chain(spec.cluster_ip.iter());
        for ip in cluster_ips {
            if let Ok(ip) = ip.parse::<IpAddr>() {
                let f = IpFamily::of(&ip);
                if !families.contains(&f) {
                    families.push(f);
                }
            }
        }
    }
    if families.is_empty() {
        families.push(IpFamily::V4);
    }

    let policy = match spec.external_traffic_policy.as_deref() {
        None | Some("") | Some("Cluster") => TrafficPolicy::Cluster,
        Some("Local") => TrafficPolicy::Local,
        Some(other) => {
            warn(format!(
                "externalTrafficPolicy {other:?} is not Cluster or Local; using Cluster"
            ));
            TrafficPolicy::Cluster
        }
    };

    let source_ranges = match spec.load_balancer_source_ranges.as_deref() {
        None | Some([]) => None,
        Some(ranges) => {
            let mut cidrs = BTreeSet::new();
            for r in ranges {
                match Cidr::parse(r) {
                    Some(c) => {
                        cidrs.insert(c);
                    }
                    None => warn(format!(
                        "loadBalancerSourceRanges: {r:?} is not a CIDR; ignored"
                    )),
                }
            }
            // An interval set cannot hold overlapping prefixes: keep only the outermost.
            let all: Vec<Cidr> = cidrs.iter().copied().collect();
            let outer = all
                .iter()
                .filter(|c| !all.iter().any(|o| o != *c && o.contains(c)))
                .copied()
                .collect();
            Some(outer)
        }
    };

    let node_selector = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NODE_SELECTOR_ANNOTATION))
        .map(String::as_str); // annotations keep String

    LbService {
        key,
        created: svc.metadata.creation_timestamp.as_ref(),
        ports,
        families,
        policy,
        source_ranges,
        node_selector,
    }
}

/// Whether this node is one of the Service's serving nodes. An invalid selector is warned
/// about and serves nowhere.
pub fn serving(
    svc: &LbService,
    node: &NodeInfo,
    warnings: &mut Vec<Warning>,
) -> Result<(), NotServed> {
    if node.labels.contains_key(EXCLUDE_LABEL) {
        return Err(NotServed::ExcludedByLabel);
    }
    let Some(sel) = svc.node_selector else {
        return Ok(());
    };
    match Selector::parse(sel) {
        Ok(s) if s.matches(&node.labels) => Ok(()),
        Ok(_) => Err(NotServed::NodeSelectorMismatch {
            selector: sel.to_string(),
        }),
        Err(e) => {
            warnings.push(Warning::new(
                ObjectRef::service(&svc.key),
                format!("annotation {NODE_SELECTOR_ANNOTATION} {sel:?}: {e}; served nowhere"),
            ));
            Err(NotServed::InvalidNodeSelector {
                selector: sel.to_string(),
                error: e.to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_with_host_bits_cleared() {
        assert_eq!(
            Cidr::parse("192.0.2.77/24").unwrap().to_string(),
            "192.0.2.0/24"
        );
        assert_eq!(
            Cidr::parse(" 2001:db8::1/32 ").unwrap().to_string(),
            "2001:db8::/32"
        );
        assert_eq!(Cidr::parse("0.0.0.0/0").unwrap().to_string(), "0.0.0.0/0");
        assert_eq!(
            Cidr::parse("192.0.2.1/32").unwrap().to_string(),
            "192.0.2.1/32"
        );
        for bad in [
            "192.0.2.0/33",
            "192.0.2.0",
            "2001:db8::/129",
            "x/8",
            "192.0.2.0/-1",
        ] {
            assert!(Cidr::parse(bad).is_none(), "{bad}");
        }
        let outer = Cidr::parse("198.51.100.0/24").unwrap();
        assert!(outer.contains(&Cidr::parse("198.51.100.128/25").unwrap()));
        assert!(!outer.contains(&Cidr::parse("198.51.0.0/16").unwrap()));
        assert!(!outer.contains(&Cidr::parse("2001:db8::/64").unwrap()));
    }
}
