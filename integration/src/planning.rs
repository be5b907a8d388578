//! Kubernetes objects planned as the agent plans them, for tests that trace or send packets
//! through the result: the golden fixtures planned for their fixed node (`fixtures/README.md`),
//! and Services and EndpointSlices written as small YAML for the node of a [`Topology`].
//!
//! The YAML shapes are `tests/planned_dataplane.rs`'s (every Service dual stack, every port
//! named `<proto>-<port>`, every endpoint on [`BACKEND_PORT`]), so the tracer's kernel test
//! and the dataplane tests speak of the same tables.

use crate::netns::{route, Topology};
use nodelb_agent::object_files::ObjectFiles;
use nodelb_core::plan::config::Config;
use nodelb_core::plan::node::{AddressKind, NodeInfo};
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

/// `fixtures/<name>.yaml` planned for the fixture node, both families, default config: the
/// plan whose tables `golden/<name>.nft` holds.
pub fn plan_fixture(name: &str) -> Plan {
    let path = fixtures_dir().join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let objects = ObjectFiles::from_text(&path, &text)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let addresses: Vec<IpAddr> = FIXTURE_ADDRESSES
        .iter()
        .map(|a| a.parse().expect("a fixture address"))
        .collect();
    let node = NodeInfo {
        name: FIXTURE_NODE.into(),
        labels: FIXTURE_LABELS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        addresses: addresses
            .iter()
            .map(|a| (AddressKind::InternalIP, *a))
            .collect(),
    };
    plan_objects(&objects, &node, &addresses.into_iter().collect())
}

/// `objects` planned for `node`, whose host holds `local`, both families, default config.
pub fn plan_objects(objects: &ObjectFiles, node: &NodeInfo, local: &BTreeSet<IpAddr>) -> Plan {
    let config = Config::default();
    plan(&Input {
        services: objects.services.iter().collect(),
        slices: objects.slices.iter().collect(),
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
/// The topology client's subnets, both families, as a Service spec's source ranges.
pub const CLIENT_RANGES: &str = "  loadBalancerSourceRanges: [203.0.113.0/24, 2001:db8:c::/64]\n";

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

/// A dual-stack LoadBalancer Service `default/<name>` with ports `(protocol, port)`, each named
/// `<proto>-<port>`; `extra` is appended to the spec (indented two spaces already).
pub fn service(name: &str, policy: &str, ports: &[(Proto, u16)], extra: &str) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: default, name: {name}, creationTimestamp: \"2024-01-01T00:00:00Z\"}}\nspec:\n  type: LoadBalancer\n  externalTrafficPolicy: {policy}\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  ports:\n"
    );
    for (proto, port) in ports {
        y += &format!(
            "  - {{name: {}-{port}, port: {port}, protocol: {}}}\n",
            proto.k8s().to_lowercase(),
            proto.k8s()
        );
    }
    y + extra + "---\n"
}

/// Spec lines of `sessionAffinity: ClientIP` with `timeoutSeconds`, for [`service`].
pub fn client_ip_affinity(timeout: u32) -> String {
    format!(
        "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {timeout}}}}}\n"
    )
}

/// An IPv4 and an IPv6 EndpointSlice of `default/<service>`: every port of the Service maps to
/// [`BACKEND_PORT`]; `endpoints` are `(backend index, nodeName)`.
pub fn slices(
    topo: &Topology,
    service: &str,
    ports: &[(Proto, u16)],
    endpoints: &[(usize, &str)],
) -> String {
    let mut y = String::new();
    for f in FAMILIES {
        let suffix = if f == IpFamily::V4 { "v4" } else { "v6" };
        y += &format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: default\n  name: {service}-{suffix}\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {f}\nports:\n"
        );
        for (proto, port) in ports {
            y += &format!(
                "- {{name: {}-{port}, port: {BACKEND_PORT}, protocol: {}}}\n",
                proto.k8s().to_lowercase(),
                proto.k8s()
            );
        }
        y += if endpoints.is_empty() {
            "endpoints: []\n"
        } else {
            "endpoints:\n"
        };
        for (i, node) in endpoints {
            let addr = backend_addr(topo, f, *i);
            y += &format!("- {{addresses: [\"{addr}\"], nodeName: {node}}}\n");
        }
        y += "---\n";
    }
    y
}

/// The topology's node as its Node object says: its client-facing addresses as InternalIPs.
pub fn topology_node(topo: &Topology) -> NodeInfo {
    NodeInfo {
        name: TOPOLOGY_NODE.into(),
        labels: [(
            "kubernetes.io/hostname".to_string(),
            TOPOLOGY_NODE.to_string(),
        )]
        .into(),
        addresses: FAMILIES
            .iter()
            .map(|f| (AddressKind::InternalIP, node_addr(topo, *f)))
            .collect(),
    }
}

/// Plans `yaml` for the topology's node, whose host addresses are whatever the node
/// namespace holds now. The YAML must be clean: a skipped document or a planner warning
/// panics.
pub fn plan_topology(topo: &Topology, yaml: &str) -> Vec<Table> {
    let objects =
        ObjectFiles::from_text(Path::new("test.yaml"), yaml).expect("the test's YAML reads");
    assert!(objects.skipped.is_empty(), "{:?}", objects.skipped);
    let p = plan_objects(&objects, &topology_node(topo), &topo.node.addresses());
    assert!(p.warnings.is_empty(), "planner warnings: {:?}", p.warnings);
    assert_eq!(p.tables.len(), 2, "one table per family");
    p.tables
}
