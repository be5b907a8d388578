//! The names and comments of what a Service owns in a table, and reading a counter's name back
//! (the metrics label each counter from its name).

use super::*;

/// Name of the shared chain that picks one of `n` endpoints.
pub(super) fn endpoint_chain_name(n: usize) -> String {
    format!("endpoints-{n}")
}

/// Name of the shared chain that sends a packet to the endpoint in slot `i`.
pub(super) fn slot_chain_name(i: usize) -> String {
    format!("slot-{i}")
}

/// `namespace/name:port`, the comment on everything a Service port owns.
pub fn comment(service: &ServiceKey, port: &ServicePortId) -> String {
    format!("{service}:{}", port.label())
}

/// `<namespace>/<name>-<proto>-<port>`: what names a Service port's chains and sets.
pub(super) fn port_ident(service: &ServiceKey, port: &ServicePortId) -> String {
    format!(
        "{}/{}-{}-{}",
        service.namespace,
        service.name,
        port.protocol.keyword(),
        port.port
    )
}

/// The chain of one Service port.
pub fn service_chain(service: &ServiceKey, port: &ServicePortId) -> String {
    format!("svc-{}", port_ident(service, port))
}

/// The set of the clients one Service port with ClientIP affinity keeps (`client . slot`, the
/// slot being the endpoint's index in `map endpoints`): `aff-<16 hex digits>`, a stable hash
/// (FNV-1a, 64 bits) of `<namespace>/<name>-<proto>-<port>`; its comment names the port. A set
/// per port, so a flood of new clients fills only the set of the port it is aimed at. Short
/// names, because the kernel finds a set a rule names by walking the table's sets and
/// comparing names: readable ones (30 to 140 characters) made a full install at 1,000
/// affinity ports 1.7x slower (docs/benchmarks.md).
pub fn affinity_set(service: &ServiceKey, port: &ServicePortId) -> String {
    format!("aff-{:016x}", fnv1a(port_ident(service, port).as_bytes()))
}

/// FNV-1a, 64 bits: the same on every build and release (std's hasher promises neither).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What a counter object counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterKind {
    /// Every packet of the Service port's connections, both directions.
    Traffic,
    /// Packets from sources outside `loadBalancerSourceRanges`, dropped.
    SourceRangeDrops,
}

impl CounterKind {
    fn prefix(self) -> &'static str {
        match self {
            CounterKind::Traffic => "svc",
            CounterKind::SourceRangeDrops => "drops",
        }
    }
}

/// The counter object of one Service port: `svc/<namespace>/<name>/<port>` or
/// `drops/<namespace>/<name>/<port>` (`<port>` is the port's name, else its number, as in
/// comments).
pub fn counter_name(kind: CounterKind, service: &ServiceKey, port: &ServicePortId) -> String {
    format!(
        "{}/{}/{}/{}",
        kind.prefix(),
        service.namespace,
        service.name,
        port.label()
    )
}

/// What a counter's name says: kind, namespace, Service name and port label; `None` for names
/// nodelb does not make. Namespaces, names and port names hold no `/`, so this is exact.
pub fn parse_counter_name(name: &str) -> Option<(CounterKind, &str, &str, &str)> {
    let mut it = name.split('/');
    let kind = match it.next()? {
        "svc" => CounterKind::Traffic,
        "drops" => CounterKind::SourceRangeDrops,
        _ => return None,
    };
    let (ns, svc, port) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() || ns.is_empty() || svc.is_empty() || port.is_empty() {
        return None;
    }
    Some((kind, ns, svc, port))
}

/// The source-range set of one Service.
pub fn source_set(service: &ServiceKey) -> String {
    format!("src-{}/{}", service.namespace, service.name)
}
