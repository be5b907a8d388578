//! Kubernetes objects planned as the agent plans them, for tests that compare, trace or send
//! packets through the result: the golden fixtures planned for their fixed node
//! (`fixtures/README.md`), and a [`Topology`]'s Services and EndpointSlices, built with
//! `nodelb_core::fixtures`, planned for its node.
//!
//! A topology's objects have one shape (every Service dual stack, every port named
//! `<proto>-<port>`, every endpoint on [`BACKEND_PORT`]), so the golden tests, the tracer's
//! kernel test and the dataplane tests speak of the same tables.

use crate::netns::{route, Topology};
use nodelb_agent::object_files::ObjectFiles;
use nodelb_core::fixtures::{node, Ep, Slice, Svc};
use nodelb_core::plan::config::Config;
use nodelb_core::plan::node::NodeInfo;
use nodelb_core::plan::{plan, Input, Plan};
use nodelb_core::vocab::{Families, IpFamily};
use nodelb_netfilter::{L4Proto, Table};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The node the golden fixtures are planned for.
pub const FIXTURE_NODE: &str = "node-a";
/// Its addresses: its InternalIPs, and the host's only addresses.
pub const FIXTURE_ADDRESSES: [&str; 2] = ["203.0.113.10", "2001:db8:1::10"];
const FIXTURE_LABELS: [(&str, &str); 3] = [
    ("kubernetes.io/hostname", "node-a"),
    ("nodelb.io/pool", "edge"),
    ("topology.kubernetes.io/zone", "zone-a"),
];

/// `integration/fixtures`.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// `fixtures/<name>.yaml` as the agent's file reader reads it.
pub fn read_fixture(path: &Path) -> ObjectFiles {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    ObjectFiles::from_text(path, &text)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `fixtures/<name>.yaml` planned for the fixture node: the plan whose tables
/// `golden/<name>.nft` holds.
pub fn plan_fixture(name: &str) -> Plan {
    plan_for_fixture_node(&read_fixture(&fixtures_dir().join(format!("{name}.yaml"))))
}

/// `objects` planned for the fixture node (`FIXTURE_NODE` with its labels, its addresses its
/// InternalIPs and the host's only addresses), both families, default config.
pub fn plan_for_fixture_node(objects: &ObjectFiles) -> Plan {
    let node = FIXTURE_LABELS
        .iter()
        .fold(node(FIXTURE_NODE), |n, (k, v)| n.label(k, v));
    let node = FIXTURE_ADDRESSES
        .iter()
        .fold(node, |n, a| n.address("InternalIP", a))
        .info();
    let local = node.addresses.iter().map(|(_, a)| *a).collect();
    plan_objects(&objects.services, &objects.slices, &node, &local)
}

/// Services and slices, as the index keeps them, planned for `node`, whose host holds
/// `local`, both families, default config.
pub fn plan_objects(
    services: &[nodelb_core::objects::index::Service],
    slices: &[nodelb_core::objects::index::EndpointSlice],
    node: &NodeInfo,
    local: &BTreeSet<IpAddr>,
) -> Plan {
    let config = Config::default();
    plan(&Input {
        services: services.iter().collect(),
        slices: slices.iter().collect(),
        node,
        local_addresses: local,
        families: Families { v4: true, v6: true },
        config: &config,
        listeners: &Default::default(),
    })
}

/// A [`Topology`] node's name; endpoints with this `nodeName` are local.
pub const TOPOLOGY_NODE: &str = "node-a";
/// The port every backend listens on (the slices' target port).
pub const BACKEND_PORT: u16 = 8080;
pub const FAMILIES: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];
/// The topology client's subnets, both families: a Service's `loadBalancerSourceRanges`
/// that admit it.
pub const CLIENT_RANGES: [&str; 2] = ["203.0.113.0/24", "2001:db8:c::/64"];

/// The protocols a topology's namespaces have sockets for (this kernel has no SCTP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn k8s(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
        }
    }

    /// The name its ports get: `tcp-80`.
    pub fn port_name(self, port: u16) -> String {
        format!("{}-{port}", self.k8s().to_lowercase())
    }

    pub fn l4(self) -> L4Proto {
        match self {
            Proto::Tcp => L4Proto::Tcp,
            Proto::Udp => L4Proto::Udp,
        }
    }
}

/// The node's address facing the client.
pub fn node_addr(topo: &Topology, f: IpFamily) -> IpAddr {
    match f {
        IpFamily::V4 => topo.node_v4().into(),
        IpFamily::V6 => topo.node_v6().into(),
    }
}

pub fn client_addr(topo: &Topology, f: IpFamily) -> IpAddr {
    match f {
        IpFamily::V4 => topo.client_v4().into(),
        IpFamily::V6 => topo.client_v6().into(),
    }
}

pub fn backend_addr(topo: &Topology, f: IpFamily, i: usize) -> IpAddr {
    match f {
        IpFamily::V4 => topo.backend_v4(i).into(),
        IpFamily::V6 => topo.backend_v6(i).into(),
    }
}

/// The node's address on backend `i`'s link: what a masqueraded client is to that backend.
pub fn node_toward_backend(topo: &Topology, f: IpFamily, i: usize) -> IpAddr {
    match f {
        IpFamily::V4 => topo.node_v4_toward_backend(i).into(),
        IpFamily::V6 => topo.node_v6_toward_backend(i).into(),
    }
}

pub fn extra_client_addr(topo: &Topology, f: IpFamily, i: usize) -> IpAddr {
    match f {
        IpFamily::V4 => topo.extra_client_v4(i).into(),
        IpFamily::V6 => topo.extra_client_v6(i).into(),
    }
}

/// A topology with a second client ("stranger", 192.0.2.0/24 and 2001:db8:d::/64) that talks
/// to the same node addresses as the first client, so the source is the only difference.
/// Returns the stranger's index.
pub fn topology_with_stranger(backends: usize) -> (Topology, usize) {
    let mut topo = Topology::new(backends);
    let other = topo.add_client("stranger", "192.0.2.0/24", "2001:db8:d::/64");
    let ns = topo.extra_client(other);
    let via4 = topo.node_v4_toward_extra_client(other).to_string();
    let via6 = topo.node_v6_toward_extra_client(other).to_string();
    route(ns, "203.0.113.0/24", &via4);
    route(ns, "2001:db8:c::/64", &via6);
    (topo, other)
}

/// A dual-stack LoadBalancer Service `default/<name>` with `externalTrafficPolicy: policy` and
/// ports `(protocol, port)`, each named `<proto>-<port>`.
pub fn service(name: &str, policy: &str, ports: &[(Proto, u16)]) -> Svc {
    let s = Svc::lb("default", name)
        .created("2024-01-01T00:00:00Z")
        .spec("externalTrafficPolicy", policy)
        .dual_stack();
    ports.iter().fold(s, |s, (proto, port)| {
        s.port(&proto.port_name(*port), *port, proto.k8s())
    })
}

/// An IPv4 and an IPv6 EndpointSlice of `default/<service>`: every port of the Service maps to
/// [`BACKEND_PORT`]; `endpoints` are `(backend index, nodeName)`.
pub fn slices(
    topo: &Topology,
    service: &str,
    ports: &[(Proto, u16)],
    endpoints: &[(usize, &str)],
) -> Vec<Slice> {
    FAMILIES
        .iter()
        .map(|f| {
            let suffix = if *f == IpFamily::V4 { "v4" } else { "v6" };
            let name = format!("{service}-{suffix}");
            let s = ports.iter().fold(
                Slice::of("default", &name, service, &f.to_string()),
                |s, (proto, port)| s.port(&proto.port_name(*port), BACKEND_PORT, proto.k8s()),
            );
            s.endpoints(
                endpoints
                    .iter()
                    .map(|(i, node)| Ep::at(backend_addr(topo, *f, *i)).node(node)),
            )
        })
        .collect()
}

/// The topology's node as its Node object says: its client-facing addresses as InternalIPs.
pub fn topology_node(topo: &Topology) -> NodeInfo {
    let n = node(TOPOLOGY_NODE).label("kubernetes.io/hostname", TOPOLOGY_NODE);
    FAMILIES
        .iter()
        .fold(n, |n, f| n.address("InternalIP", node_addr(topo, *f)))
        .info()
}

/// Fixture `services` and `slices` planned for `node`, whose host holds `local`, both
/// families, default config.
pub fn plan_built(
    services: &[Svc],
    slices: &[Slice],
    node: &NodeInfo,
    local: &BTreeSet<IpAddr>,
) -> Plan {
    let services: Vec<_> = services.iter().map(Svc::index).collect();
    let slices: Vec<_> = slices.iter().map(Slice::index).collect();
    plan_objects(&services, &slices, node, local)
}

/// Plans `services` and `slices` for the topology's node, whose host addresses are whatever
/// the node namespace holds now. They must plan cleanly: a planner warning panics.
pub fn plan_topology(topo: &Topology, services: &[Svc], slices: &[Slice]) -> Vec<Table> {
    let local = topo.node.addresses();
    let p = plan_built(services, slices, &topology_node(topo), &local);
    assert!(p.warnings.is_empty(), "planner warnings: {:?}", p.warnings);
    assert_eq!(p.tables.len(), 2, "one table per family");
    p.tables
}

/// `tables` with `ct state new` taken out of every rule that has it: the planner's rejects as
/// they were before they asked for new connections only (what the tests of that rule compare
/// against).
pub fn rejects_on_every_packet(tables: &[Table]) -> Vec<Table> {
    use nodelb_netfilter::{CtKey, Expr, Stmt};
    let mut tables = tables.to_vec();
    let mut taken = 0;
    for r in tables
        .iter_mut()
        .flat_map(|t| t.chains.values_mut())
        .flat_map(|c| &mut c.rules)
    {
        let before = r.stmts.len();
        r.stmts.retain(|s| {
            !matches!(
                s,
                Stmt::AnyBits {
                    left: Expr::Ct(CtKey::State),
                    ..
                }
            )
        });
        taken += before - r.stmts.len();
    }
    assert!(
        taken > 0,
        "the planned tables ask for new connections nowhere"
    );
    tables
}
