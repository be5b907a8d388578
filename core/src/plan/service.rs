//! Which Services are nodelb's, and a Service's spec read into checked, plain values: ports,
//! families, traffic policy, source ranges, node selector, address filter.

use super::addresses::{
    AddressFilter, InvalidAddresses, ADDRESS_CIDRS_ANNOTATION, ADDRESS_TYPES_ANNOTATION,
};
use super::cidr::Cidr;
use super::config::Config;
use super::diagnosis::{NotServed, ObjectRef, Warning};
use super::node::NodeInfo;
use super::selector::Selector;
use super::servicelb::ServiceLb;
use crate::objects::index::{Service, ServiceSpec, TrafficDistribution};
use crate::vocab::{dns_label, IpFamily, Protocol, ServiceKey, ServicePortId, Str};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeSet;
use std::net::IpAddr;

/// Label that takes a node out of every LoadBalancer's serving nodes (any value).
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// Annotation holding a label selector that limits a Service's serving nodes.
pub const NODE_SELECTOR_ANNOTATION: &str = "nodelb.io/node-selector";
/// Annotation, on a Node or a Service: the addresses (comma separated) the status publishes in
/// place of the node addresses of their family (see [`crate::status::published`]); the kernel
/// still serves the node's own.
pub const PUBLISHED_ADDRESSES_ANNOTATION: &str = "nodelb.io/published-addresses";

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

/// `sessionAffinity: ClientIP` without a timeout: kube-proxy's default, three hours.
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;
/// The longest `sessionAffinityConfig.clientIP.timeoutSeconds` the API accepts (a day).
pub const MAX_AFFINITY_TIMEOUT_SECONDS: u32 = 86_400;

/// `sessionAffinity: ClientIP`: a client keeps the endpoint it was sent to for this many
/// seconds after its last new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientIpAffinity {
    pub timeout_seconds: u32,
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
    /// `sessionAffinity: ClientIP`, with its timeout.
    pub affinity: Option<ClientIpAffinity>,
    /// The `nodelb.io/node-selector` annotation, if set.
    pub node_selector: Option<&'a str>,
    /// The `nodelb.io/address-types` annotation, if set (see [`super::addresses`]).
    pub address_types: Option<&'a str>,
    /// The `nodelb.io/address-cidrs` annotation, if set.
    pub address_cidrs: Option<&'a str>,
    /// The `nodelb.io/published-addresses` annotation, if set: read by the status only.
    pub published: Option<&'a str>,
    /// ServiceLB's pool: the label `svccontroller.k3s.cattle.io/lbpool`, if set and not empty
    /// (read only with `--servicelb-compat`, see `servicelb`).
    pub pool: Option<&'a str>,
    /// `spec.trafficDistribution`, if set (a value nodelb does not know is warned about).
    pub distribution: Option<TrafficDistribution>,
}

impl LbService<'_> {
    /// Which of the node's addresses serve the Service: its annotations over the flags'
    /// default (`default`: [`Config::addresses`]). An annotation that does not parse is warned
    /// about and the Service is served nowhere, as with an invalid node selector: never on
    /// addresses it did not ask for.
    pub fn address_filter(
        &self,
        default: &AddressFilter,
        warnings: &mut Vec<Warning>,
    ) -> Result<AddressFilter, NotServed> {
        AddressFilter::of_service(self.address_types, self.address_cidrs, default).map_err(
            |errors: Vec<InvalidAddresses>| {
                for e in &errors {
                    warnings.push(Warning::new(
                        ObjectRef::service(&self.key),
                        format!("{e}; served nowhere"),
                    ));
                }
                let first = errors.into_iter().next().expect("an error");
                NotServed::InvalidAddresses {
                    annotation: first.annotation.to_string(),
                    value: first.value,
                    error: first.error,
                }
            },
        )
    }
}

/// Whether nodelb handles this Service at all: `type: LoadBalancer` and our class, or no class
/// while `--default-class`; never one labelled `service.kubernetes.io/service-proxy-name`
/// (another proxy's, which kube-proxy leaves alone too).
pub fn is_handled(svc: &Service, config: &Config) -> bool {
    if svc.metadata.other_proxy {
        return false;
    }
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
        match read_port(&p.name, p.port, p.protocol.as_deref(), &ports) {
            Ok(port) => ports.push(port),
            Err(m) => warn(m),
        }
    }
    if ports.is_empty() {
        warn("no valid port: nothing to program".to_string());
    }
    let mut families = read_families(spec.ip_families.as_deref(), &mut warn);
    if families.is_empty() {
        let cluster_ips = spec
            .cluster_ips
            .iter()
            .flatten()
            .chain(spec.cluster_ip.iter());
        families = families_of(cluster_ips);
    }
    if families.is_empty() {
        families.push(IpFamily::V4);
    }
    let policy = read_policy(spec.external_traffic_policy.as_deref(), &mut warn);
    let source_ranges = spec
        .load_balancer_source_ranges
        .as_deref()
        .filter(|r| !r.is_empty())
        .map(|r| read_source_ranges(r, &mut warn));
    let affinity = read_affinity(spec, &mut warn);
    let distribution = spec.traffic_distribution;
    if distribution == Some(TrafficDistribution::Unknown) {
        warn(
            "trafficDistribution is not PreferClose, PreferSameZone or PreferSameNode; \
             the endpoints' topology hints are used as they are"
                .to_string(),
        );
    }
    let annotation = |name: &str| {
        svc.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(name))
            .map(String::as_str) // annotations keep String
    };
    let node_selector = annotation(NODE_SELECTOR_ANNOTATION);
    let address_types = annotation(ADDRESS_TYPES_ANNOTATION);
    let address_cidrs = annotation(ADDRESS_CIDRS_ANNOTATION);
    let published = annotation(PUBLISHED_ADDRESSES_ANNOTATION);
    let pool = svc.metadata.lbpool.as_deref();

    LbService {
        key,
        created: svc.metadata.creation_timestamp.as_ref(),
        ports,
        families,
        policy,
        source_ranges,
        affinity,
        node_selector,
        address_types,
        address_cidrs,
        published,
        pool,
        distribution,
    }
}

/// `spec.sessionAffinity` and its timeout. Anything but `ClientIP` is no affinity (a value
/// that is not `None` is warned about); a timeout outside 1..=86400 seconds, which the API
/// refuses, is warned about and the default used, as kube-proxy does.
fn read_affinity(spec: &ServiceSpec, warn: &mut impl FnMut(String)) -> Option<ClientIpAffinity> {
    match spec.session_affinity.as_deref() {
        Some("ClientIP") => {}
        None | Some("") | Some("None") => return None,
        Some(other) => {
            warn(format!(
                "sessionAffinity {other:?} is not None or ClientIP; no affinity"
            ));
            return None;
        }
    }
    let timeout = spec
        .session_affinity_config
        .as_ref()
        .and_then(|c| c.client_ip.as_ref())
        .and_then(|c| c.timeout_seconds);
    let timeout_seconds = match timeout {
        None => DEFAULT_AFFINITY_TIMEOUT_SECONDS,
        Some(t) if t > 0 && t as u32 <= MAX_AFFINITY_TIMEOUT_SECONDS => t as u32,
        Some(t) => {
            warn(format!(
                "sessionAffinityConfig.clientIP.timeoutSeconds {t} is not 1-{MAX_AFFINITY_TIMEOUT_SECONDS}; using {DEFAULT_AFFINITY_TIMEOUT_SECONDS}"
            ));
            DEFAULT_AFFINITY_TIMEOUT_SECONDS
        }
    };
    Some(ClientIpAffinity { timeout_seconds })
}

/// One entry of `spec.ports`, given the valid ports before it; `Err`: the warning that skips it.
fn read_port(
    name: &Option<Str>,
    port: i32,
    protocol: Option<&str>,
    before: &[ServicePortId],
) -> Result<ServicePortId, String> {
    let name = name.clone().filter(|n| !n.is_empty());
    let what = match &name {
        Some(n) => format!("port {n:?} ({port})"),
        None => format!("port {port}"),
    };
    // A real API server allows only DNS labels; the name goes into counter names and comments.
    if name.as_deref().is_some_and(|n| !dns_label(n)) {
        return Err(format!("{what}: the name is not a DNS label; port skipped"));
    }
    let Some(protocol) = Protocol::parse(protocol) else {
        return Err(format!(
            "{what}: protocol {:?} is not TCP, UDP or SCTP; port skipped",
            protocol.unwrap_or_default()
        ));
    };
    let Some(port) = u16::try_from(port).ok().filter(|p| *p > 0) else {
        return Err(format!("{what}: port must be 1-65535; port skipped"));
    };
    if before
        .iter()
        .any(|q| q.protocol == protocol && q.port == port)
    {
        return Err(format!(
            "{what}: {protocol} port {port} is listed twice; the later one skipped"
        ));
    }
    Ok(ServicePortId {
        name,
        protocol,
        port,
    })
}

/// `spec.ipFamilies`, each once, in order.
fn read_families(names: Option<&[Str]>, warn: &mut impl FnMut(String)) -> Vec<IpFamily> {
    let mut families = Vec::new();
    for f in names.unwrap_or_default() {
        match IpFamily::parse(f) {
            Some(f) if !families.contains(&f) => families.push(f),
            Some(_) => {}
            None => warn(format!("ipFamilies: {f:?} is not IPv4 or IPv6; ignored")),
        }
    }
    families
}

/// The families of the cluster IPs that parse, each once, in order.
fn families_of<'s>(ips: impl Iterator<Item = &'s Str>) -> Vec<IpFamily> {
    let mut families = Vec::new();
    for ip in ips {
        if let Ok(ip) = ip.parse::<IpAddr>() {
            let f = IpFamily::of(&ip);
            if !families.contains(&f) {
                families.push(f);
            }
        }
    }
    families
}

/// `spec.externalTrafficPolicy`; anything but `Local` is `Cluster`.
fn read_policy(policy: Option<&str>, warn: &mut impl FnMut(String)) -> TrafficPolicy {
    match policy {
        None | Some("") | Some("Cluster") => TrafficPolicy::Cluster,
        Some("Local") => TrafficPolicy::Local,
        Some(other) => {
            warn(format!(
                "externalTrafficPolicy {other:?} is not Cluster or Local; using Cluster"
            ));
            TrafficPolicy::Cluster
        }
    }
}

/// A non-empty `spec.loadBalancerSourceRanges`: the valid prefixes, nested ones folded into the
/// outer one (an interval set cannot hold overlapping prefixes).
fn read_source_ranges(ranges: &[Str], warn: &mut impl FnMut(String)) -> Vec<Cidr> {
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
    let all: Vec<Cidr> = cidrs.iter().copied().collect();
    all.iter()
        .filter(|c| !all.iter().any(|o| o != *c && o.contains(c)))
        .copied()
        .collect()
}

/// Whether this node is one of the Service's serving nodes: not excluded, chosen by
/// ServiceLB's labels under `--servicelb-compat` (`servicelb`), and inside the node selector.
/// An invalid selector is warned about and serves nowhere.
pub fn serving(
    svc: &LbService,
    node: &NodeInfo,
    servicelb: ServiceLb,
    warnings: &mut Vec<Warning>,
) -> Result<(), NotServed> {
    if node.labels.contains_key(EXCLUDE_LABEL) {
        return Err(NotServed::ExcludedByLabel);
    }
    servicelb.serving(svc.pool, &node.labels)?;
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
