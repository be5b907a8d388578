//! The names and comments of what a Service owns in a table, and reading a counter's name back
//! (the metrics label each counter from its name).

use super::*;

/// Name of the shared chain that picks one of `n` endpoints.
pub(super) fn endpoint_chain_name(n: usize) -> String {
    format!("endpoints-{n}")
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

/// An endpoint in a chain or set name: its address and port, IPv6 with `.` for `:` (names
/// hold no `:`), written so that two addresses never read the same (no dotted IPv4 tail).
pub(super) fn endpoint_ident(e: &EndpointAddr) -> String {
    let addr = match e.addr {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => {
            let seg = a.segments();
            // The longest run of zero groups (two or more), the first of equals, as `..`.
            let mut run = (0, 0);
            let mut i = 0;
            while i < 8 {
                let len = seg[i..].iter().take_while(|g| **g == 0).count();
                if len > run.1 {
                    run = (i, len);
                }
                i += len.max(1);
            }
            let hex = |s: &[u16]| s.iter().map(|g| format!("{g:x}")).collect::<Vec<_>>();
            if run.1 >= 2 {
                let (head, tail) = (hex(&seg[..run.0]), hex(&seg[run.0 + run.1..]));
                format!("{}..{}", head.join("."), tail.join("."))
            } else {
                hex(&seg).join(".")
            }
        }
    };
    format!("{addr}-{}", e.port)
}

/// The chain of one endpoint of a Service port with ClientIP affinity.
pub fn affinity_endpoint_chain(
    service: &ServiceKey,
    port: &ServicePortId,
    e: &EndpointAddr,
) -> String {
    format!("ep-{}-{}", port_ident(service, port), endpoint_ident(e))
}

/// The set of the clients one endpoint of a ClientIP affinity Service port keeps.
pub fn affinity_set(service: &ServiceKey, port: &ServicePortId, e: &EndpointAddr) -> String {
    format!(
        "affinity-{}-{}",
        port_ident(service, port),
        endpoint_ident(e)
    )
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
