//! Which conntrack entries an update makes stale (docs/design.md, "Conntrack cleanup": when an
//! endpoint stops serving a UDP or SCTP Service port, its entries go, while one that still
//! serves keeps them; and those made while the port had no endpoint, once it has one). One
//! test per way an endpoint stops serving, each named for the rule.
//!
//! Every step is planned twice from the same planner: as the incremental update the agent
//! makes, and as a rebuild; both must name the same stale flows.

use super::config::Config;
use super::endpoints::EndpointAddr;
use super::flows::{ServedPort, StaleFlows};
use super::listeners::HostListeners;
use super::node::NodeInfo;
use super::*;
use crate::fixtures::{node, Ep, Slice, Svc};
use crate::vocab::{Listener, Protocol, ServiceKey};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;

const NODE_V4: &str = "203.0.113.1";
const NODE_V6: &str = "2001:db8::1";

/// A node, its objects, and the planner that has planned them so far.
struct Node {
    objects: Objects,
    ctx: Context,
    planner: Planner,
}

impl Node {
    /// `node-a` with an IPv4 and an IPv6 address, both families programmed; nothing planned.
    fn new() -> Node {
        let info = node("node-a")
            .label("kubernetes.io/hostname", "node-a")
            .address("InternalIP", NODE_V4)
            .address("InternalIP", NODE_V6)
            .info();
        let local = info.addresses.iter().map(|a| a.1).collect();
        let ctx = Context::new(
            info,
            local,
            Families { v4: true, v6: true },
            Config::default(),
        );
        Node {
            objects: Objects::default(),
            ctx,
            planner: Planner::new(),
        }
    }

    /// Puts `services` and `slices` and plans once from nothing, as the agent does at start;
    /// returns what that start deletes.
    fn start(&mut self, services: &[Svc], slices: &[Slice]) -> Vec<StaleFlows> {
        for s in services {
            self.put_service(s);
        }
        for s in slices {
            self.put_slice(s);
        }
        self.planner
            .update(&self.objects, &self.ctx, None)
            .flows
            .stale()
    }

    /// Puts one Service; returns the Services it touched.
    fn put_service(&mut self, s: &Svc) -> BTreeSet<ServiceKey> {
        self.objects
            .put_service(Arc::new(s.index()))
            .into_iter()
            .collect()
    }

    /// Puts one EndpointSlice; returns the Services it touched.
    fn put_slice(&mut self, s: &Slice) -> BTreeSet<ServiceKey> {
        self.objects
            .put_slice(Arc::new(s.index()))
            .into_iter()
            .collect()
    }

    /// One step: the objects changed, planned incrementally and (from a copy of the planner of
    /// before) as a rebuild; both must make the same flows stale.
    fn step(&mut self, dirty: BTreeSet<ServiceKey>) -> Vec<StaleFlows> {
        let mut rebuilt = self.planner.clone();
        let incremental = self.planner.update(&self.objects, &self.ctx, Some(&dirty));
        assert!(matches!(incremental.change, TableChange::Edit(_)));
        let rebuild = rebuilt.update(&self.objects, &self.ctx, None);
        assert_eq!(
            incremental.flows.stale(),
            rebuild.flows.stale(),
            "incremental and rebuild disagree"
        );
        assert_eq!(self.planner.flows(), rebuilt.flows());
        incremental.flows.stale()
    }

    /// The host's listeners become `sockets` (address, protocol, port): an edit, as in the
    /// agent, that replans the Services claiming the ports they take or free.
    fn listen(&mut self, sockets: &[(&str, Protocol, u16)]) -> Vec<StaleFlows> {
        let sockets = sockets
            .iter()
            .map(|(address, protocol, port)| Listener {
                protocol: *protocol,
                address: address.parse().unwrap(),
                port: *port,
                process: Some("dnsmasq".into()),
            })
            .collect();
        self.ctx = self.ctx.clone().with_listeners(HostListeners::new(sockets));
        self.step(BTreeSet::new())
    }

    /// Changes the node-wide context (a rebuild, as in the agent).
    fn with_ctx(
        &mut self,
        change: impl FnOnce(&mut NodeInfo, &mut BTreeSet<IpAddr>, &mut Families),
    ) -> Vec<StaleFlows> {
        let (mut node, mut local, mut families) = (
            self.ctx.node.clone(),
            self.ctx.local_addresses.clone(),
            self.ctx.families,
        );
        change(&mut node, &mut local, &mut families);
        self.ctx = Context::new(node, local, families, Config::default());
        let u = self
            .planner
            .update(&self.objects, &self.ctx, Some(&BTreeSet::new()));
        assert!(matches!(u.change, TableChange::Rebuild));
        u.flows.stale()
    }
}

/// The dual-stack LoadBalancer Service `default/dns`, one port `dns` of `protocol` on port 53.
fn dns(protocol: &str) -> Svc {
    Svc::lb("default", "dns")
        .created("2024-01-01T00:00:00Z")
        .dual_stack()
        .port("dns", 53, protocol)
}

/// The IPv4 slice `<service>-v4`, port `dns` → 8053, one endpoint per entry in
/// [`Ep::parse`]'s short form but for the address, a host in 198.51.100.0/24:
/// `host [node] [ready=..] [serving=..] [terminating=..] [for-zones=zone]`.
fn slice(service: &str, protocol: &str, endpoints: &[&str]) -> Slice {
    let eps = endpoints
        .iter()
        .map(|e| Ep::parse(&format!("198.51.100.{e}")));
    Slice::ipv4("default", &format!("{service}-v4"), service)
        .port("dns", 8053, protocol)
        .endpoints(eps)
}

/// The IPv6 slice `<service>-v6`: one endpoint, 2001:db8:b::<host>.
fn slice6(service: &str, protocol: &str, host: u8) -> Slice {
    Slice::ipv6("default", &format!("{service}-v6"), service)
        .port("dns", 8053, protocol)
        .endpoint(Ep::at(format!("2001:db8:b::{host}")))
}

fn served(protocol: Protocol, address: &str) -> ServedPort {
    ServedPort {
        protocol,
        address: address.parse().unwrap(),
        port: 53,
    }
}

fn ep(host: u8) -> EndpointAddr {
    EndpointAddr {
        addr: IpAddr::from([198, 51, 100, host]),
        port: 8053,
    }
}

fn ep6(host: u8) -> EndpointAddr {
    EndpointAddr {
        addr: format!("2001:db8:b::{host}").parse().unwrap(),
        port: 8053,
    }
}

fn left(address: &str, endpoint: EndpointAddr) -> StaleFlows {
    StaleFlows::Left {
        port: served(Protocol::Udp, address),
        endpoint,
    }
}

/// Every endpoint of [`dns_node`] left every port.
fn every_endpoint_left() -> Vec<StaleFlows> {
    vec![
        left(NODE_V4, ep(2)),
        left(NODE_V4, ep(3)),
        left(NODE_V6, ep6(2)),
    ]
}

/// A UDP Service `dns` with endpoints .2 and .3 (IPv4) and ::2 (IPv6), planned.
fn dns_node() -> Node {
    let mut n = Node::new();
    n.start(
        &[dns("UDP")],
        &[slice("dns", "UDP", &["2", "3"]), slice6("dns", "UDP", 2)],
    );
    n
}

#[test]
fn a_udp_endpoint_that_leaves_has_its_flows_deleted() {
    let mut n = dns_node();
    let d = n.put_slice(&slice("dns", "UDP", &["3"]));
    assert_eq!(n.step(d), vec![left(NODE_V4, ep(2))]);
}

#[test]
fn an_sctp_endpoint_that_leaves_has_its_flows_deleted() {
    let mut n = Node::new();
    n.start(&[dns("SCTP")], &[slice("dns", "SCTP", &["2", "3"])]);
    let d = n.put_slice(&slice("dns", "SCTP", &["3"]));
    assert_eq!(
        n.step(d),
        vec![StaleFlows::Left {
            port: served(Protocol::Sctp, NODE_V4),
            endpoint: ep(2)
        }]
    );
}

#[test]
fn tcp_endpoints_that_leave_keep_their_flows() {
    let mut n = Node::new();
    n.start(&[dns("TCP")], &[slice("dns", "TCP", &["2", "3"])]);
    let d = n.put_slice(&slice("dns", "TCP", &["3"]));
    assert_eq!(n.step(d), vec![]);
    let d = n.put_slice(&slice("dns", "TCP", &[]));
    assert_eq!(n.step(d), vec![], "not even the last one");
}

#[test]
fn an_endpoint_no_longer_ready_has_its_flows_deleted() {
    let mut n = dns_node();
    let d = n.put_slice(&slice("dns", "UDP", &["2 ready=false serving=false", "3"]));
    assert_eq!(n.step(d), vec![left(NODE_V4, ep(2))]);
}

#[test]
fn serving_terminating_endpoint_keeps_its_udp_flows() {
    // A rolling update: the endpoint a session landed on gets SIGTERM. It still serves while
    // it drains, so its flows stay (new flows go to the ready one); they move only once it
    // stops serving, or leaves the slice.
    let draining = "2 ready=false serving=true terminating=true";
    let mut n = dns_node();
    let d = n.put_slice(&slice("dns", "UDP", &[draining, "3"]));
    assert_eq!(n.step(d), vec![]);
    let d = n.put_slice(&slice(
        "dns",
        "UDP",
        &["2 ready=false serving=false terminating=true", "3"],
    ));
    assert_eq!(n.step(d), vec![left(NODE_V4, ep(2))], "stops serving");
    let mut n = dns_node();
    let d = n.put_slice(&slice("dns", "UDP", &[draining, "3"]));
    assert_eq!(n.step(d), vec![]);
    let d = n.put_slice(&slice("dns", "UDP", &["3"]));
    assert_eq!(n.step(d), vec![left(NODE_V4, ep(2))], "leaves the slice");
}

#[test]
fn a_serving_terminating_sctp_endpoint_keeps_its_association() {
    let mut n = Node::new();
    n.start(&[dns("SCTP")], &[slice("dns", "SCTP", &["2", "3"])]);
    let d = n.put_slice(&slice(
        "dns",
        "SCTP",
        &["2 ready=false serving=true terminating=true", "3"],
    ));
    assert_eq!(n.step(d), vec![]);
}

#[test]
fn an_endpoint_used_only_elsewhere_keeps_its_flows_until_it_stops_serving() {
    // Zone hints: node-a (zone-a) sends new flows to .2 only; .3 (zone-b) still serves, so the
    // flows it answers here (made before the hints, or by the node's own clients) stay.
    let mut n = Node::new();
    n.with_ctx(|node, _, _| {
        node.labels
            .insert("topology.kubernetes.io/zone".into(), "zone-a".into());
    });
    n.start(&[dns("UDP")], &[slice("dns", "UDP", &["2", "3"])]);
    let d = n.put_slice(&slice(
        "dns",
        "UDP",
        &["2 for-zones=zone-a", "3 for-zones=zone-b"],
    ));
    assert_eq!(n.step(d), vec![], "narrowed by topology, nothing stale");
    let d = n.put_slice(&slice(
        "dns",
        "UDP",
        &[
            "2 for-zones=zone-a",
            "3 ready=false serving=false for-zones=zone-b",
        ],
    ));
    assert_eq!(n.step(d), vec![left(NODE_V4, ep(3))]);
}

#[test]
fn a_udp_port_that_gets_endpoints_deletes_flows_made_while_rejecting() {
    let mut n = Node::new();
    n.start(&[dns("UDP")], &[slice("dns", "UDP", &[])]);
    let d = n.put_slice(&slice("dns", "UDP", &["2", "3"]));
    assert_eq!(
        n.step(d),
        vec![StaleFlows::Opened {
            port: served(Protocol::Udp, NODE_V4),
            endpoints: vec![ep(2), ep(3)]
        }]
    );
}

#[test]
fn a_udp_port_that_loses_its_last_endpoint_deletes_its_flows() {
    let mut n = dns_node();
    let d = n.put_slice(&slice("dns", "UDP", &[]));
    assert_eq!(n.step(d), vec![left(NODE_V4, ep(2)), left(NODE_V4, ep(3))]);
}

#[test]
fn a_new_udp_service_deletes_the_flows_its_address_and_port_had_before() {
    let mut n = Node::new();
    n.start(&[], &[]);
    let mut d = n.put_slice(&slice("dns", "UDP", &["2"]));
    d.extend(n.put_service(&dns("UDP")));
    assert_eq!(
        n.step(d),
        vec![StaleFlows::Opened {
            port: served(Protocol::Udp, NODE_V4),
            endpoints: vec![ep(2)]
        }]
    );
}

#[test]
fn at_start_every_udp_port_deletes_the_flows_none_of_its_endpoints_answers() {
    let mut n = Node::new();
    let stale = n.start(
        &[dns("UDP")],
        &[slice("dns", "UDP", &["2", "3"]), slice6("dns", "UDP", 2)],
    );
    assert_eq!(
        stale,
        vec![
            StaleFlows::Opened {
                port: served(Protocol::Udp, NODE_V4),
                endpoints: vec![ep(2), ep(3)]
            },
            StaleFlows::Opened {
                port: served(Protocol::Udp, NODE_V6),
                endpoints: vec![ep6(2)]
            },
        ]
    );
}

#[test]
fn a_change_that_keeps_the_endpoints_deletes_nothing() {
    let mut n = dns_node();
    let ranges = json!(["192.0.2.0/24", "2001:db8:c::/64"]);
    let d = n.put_service(&dns("UDP").spec("loadBalancerSourceRanges", ranges));
    assert_eq!(n.step(d), vec![]);
}

#[test]
fn a_removed_port_has_its_flows_deleted() {
    let mut n = dns_node();
    let web = Svc::lb("default", "dns")
        .created("2024-01-01T00:00:00Z")
        .dual_stack()
        .port("web", 80, "TCP");
    let d = n.put_service(&web);
    assert_eq!(n.step(d), every_endpoint_left());
}

#[test]
fn a_deleted_service_has_its_flows_deleted() {
    let mut n = dns_node();
    let d = n
        .objects
        .delete_service(&dns("UDP").index())
        .into_iter()
        .collect();
    assert_eq!(n.step(d), every_endpoint_left());
}

#[test]
fn a_node_selector_that_no_longer_matches_deletes_the_flows() {
    let mut n = dns_node();
    let d = n.put_service(
        &dns("UDP").annotation("nodelb.io/node-selector", "kubernetes.io/hostname=node-b"),
    );
    assert_eq!(n.step(d), every_endpoint_left());
}

#[test]
fn a_node_excluded_by_label_deletes_the_flows() {
    let mut n = dns_node();
    let stale = n.with_ctx(|node, _, _| {
        node.labels.insert(
            "node.kubernetes.io/exclude-from-external-load-balancers".into(),
            "".into(),
        );
    });
    assert_eq!(stale, every_endpoint_left());
}

#[test]
fn a_family_no_longer_programmed_deletes_its_flows() {
    let mut n = dns_node();
    let stale = n.with_ctx(|_, _, families| families.v6 = false);
    assert_eq!(stale, vec![left(NODE_V6, ep6(2))]);
}

#[test]
fn a_served_address_gone_from_the_host_deletes_its_flows() {
    let mut n = dns_node();
    let stale = n.with_ctx(|_, local, _| {
        local.remove(&NODE_V4.parse().unwrap());
    });
    assert_eq!(stale, vec![left(NODE_V4, ep(2)), left(NODE_V4, ep(3))]);
    // Back on the host: the port opens there again, and nothing of before is kept.
    let stale = n.with_ctx(|_, local, _| {
        local.insert(NODE_V4.parse().unwrap());
    });
    assert_eq!(
        stale,
        vec![StaleFlows::Opened {
            port: served(Protocol::Udp, NODE_V4),
            endpoints: vec![ep(2), ep(3)]
        }]
    );
}

#[test]
fn a_lost_port_conflict_deletes_the_flows_to_the_losers_endpoints() {
    let mut n = dns_node();
    // An older Service takes UDP 53 on this node (named to be replanned before the loser).
    let mut d = n.put_slice(&slice("apex", "UDP", &["9"]));
    let apex = Svc::lb("default", "apex")
        .created("2023-01-01T00:00:00Z")
        .dual_stack()
        .port("dns", 53, "UDP");
    d.extend(n.put_service(&apex));
    assert_eq!(
        n.step(d),
        vec![
            left(NODE_V4, ep(2)),
            left(NODE_V4, ep(3)),
            // IPv6: `apex` has no IPv6 endpoint, so it rejects there.
            left(NODE_V6, ep6(2))
        ]
    );
}

#[test]
fn a_local_endpoint_that_leaves_has_its_flows_deleted_and_the_nodes_own_clients_keep_theirs() {
    let mut n = Node::new();
    n.start(
        &[dns("UDP").spec("externalTrafficPolicy", "Local")],
        &[slice("dns", "UDP", &["2 node-a", "3 node-b"])],
    );
    // Only the endpoint elsewhere is left: outside clients are dropped, the node's own go
    // there, so its flows are kept.
    let d = n.put_slice(&slice("dns", "UDP", &["3 node-b"]));
    assert_eq!(n.step(d), vec![left(NODE_V4, ep(2))]);
}

#[test]
fn a_udp_port_a_host_listener_takes_deletes_its_flows() {
    let mut n = dns_node();
    // dnsmasq binds UDP 53 on the IPv4 wildcard: the Service's IPv4 flows here go, so a client
    // that keeps its source port reaches dnsmasq, not the endpoint it was DNATed to before.
    // IPv6 stays the Service's.
    assert_eq!(
        n.listen(&[("0.0.0.0", Protocol::Udp, 53)]),
        vec![left(NODE_V4, ep(2)), left(NODE_V4, ep(3))]
    );
    // It stops: the port DNATs again, and the flows dnsmasq answered go.
    assert_eq!(
        n.listen(&[]),
        vec![StaleFlows::Opened {
            port: served(Protocol::Udp, NODE_V4),
            endpoints: vec![ep(2), ep(3)]
        }]
    );
    // On the node's IPv6 address: the IPv6 flows go.
    assert_eq!(
        n.listen(&[(NODE_V6, Protocol::Udp, 53)]),
        vec![left(NODE_V6, ep6(2))]
    );
    // A TCP listener on the same port takes nothing of the UDP port.
    n.listen(&[]);
    assert_eq!(n.listen(&[("0.0.0.0", Protocol::Tcp, 53)]), vec![]);
}

#[test]
fn a_udp_port_withheld_for_a_listener_on_another_port_deletes_its_flows() {
    let mut n = Node::new();
    n.start(
        &[dns("UDP").port("admin", 5380, "TCP")],
        &[slice("dns", "UDP", &["2", "3"])],
    );
    // A host process takes the Service's TCP port on IPv4: all or nothing, its UDP port
    // there has no rules either, and its flows go.
    assert_eq!(
        n.listen(&[("0.0.0.0", Protocol::Tcp, 5380)]),
        vec![left(NODE_V4, ep(2)), left(NODE_V4, ep(3))]
    );
}
