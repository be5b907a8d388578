//! Real traffic through the tables the planner builds: Services and EndpointSlices built with
//! the fixtures (`nodelb_integration::planning`), planned with `nodelb_core::plan::plan` for
//! the `Topology`'s node (its
//! client-facing addresses as the Node's InternalIPs, every address in the node namespace as the
//! host's addresses), programmed with nodelb's own netlink batch, and exercised with TCP and UDP
//! over IPv4 and IPv6 from client namespaces through the node to backend namespaces.
//!
//! Every Service is dual stack, so each test programs both tables at once and checks both
//! families. Assertions are on what arrived: which backend answered, which source it saw,
//! reset or port unreachable or silence. Clients have no route to the backends, so a backend can
//! only answer through the node's DNAT, and each test first shows the state without the rule
//! under test so it fails if that rule does nothing.
//!
//! SCTP: this kernel has no SCTP sockets (EPROTONOSUPPORT), so SCTP is covered by
//! `planned.rs` (golden text, `nft -c`, differential) only.
//!
//! Run as root: `cargo test -p nodelb-integration --test planned_dataplane`.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use nodelb_agent::run::kernel::seed_slots;
use nodelb_core::fixtures::{Slice, Svc};
use nodelb_core::plan::config::Config;
use nodelb_core::plan::table::{HAIRPIN_SET, LOCAL_ADDRESSES_SET};
use nodelb_core::plan::{Context, Objects, Planner, TableChange};
use nodelb_core::vocab::{Families, IpFamily};
use nodelb_integration::commit::{replace, sync};
use nodelb_integration::flood::{self, Spoofed};
use nodelb_integration::netns::{require_root, Netns, Topology};
use nodelb_integration::nft::{list_ruleset, nft_f, nodelb_replace};
use nodelb_integration::planning::*;
use nodelb_integration::traffic::{
    tcp_request, tcp_request_from, tcp_server, udp_request, udp_server, IcmpError, Outcome, Server,
};
use nodelb_netfilter::{
    render_replace, Commit, Committed, Committer, Drift, Edit, Nft, Table, TableRef,
};

/// Deadline for a request that is expected to be answered (or refused).
const ANSWER: Duration = Duration::from_secs(2);
/// Deadline for a request that is expected to get nothing back.
const SILENCE: Duration = Duration::from_secs(1);
/// Tries allowed for numgen to pick every one of three backends; the chance that a fair pick
/// misses one of them is 3 * (2/3)^64, about 2e-11.
const SPREAD_TRIES: usize = 64;
/// This node's name; endpoints with this `nodeName` are local.
const NODE: &str = TOPOLOGY_NODE;

fn port_unreachable(f: IpFamily) -> IcmpError {
    match f {
        IpFamily::V4 => IcmpError::V4_PORT_UNREACHABLE,
        IpFamily::V6 => IcmpError::V6_PORT_UNREACHABLE,
    }
}

// ---- tables ----------------------------------------------------------------------------------

/// Replaces the node's nodelb tables through nodelb's netlink batch.
fn program(node: &Netns, tables: &[Table]) {
    if let Err(e) = nodelb_replace(node, tables) {
        panic!("nodelb_replace in {}: {e} ({e:?})", node.name());
    }
}

/// Removes every element of set `name` in each table: the planner's tables minus one rule's
/// effect, for "before" states.
fn without_elements(tables: &[Table], name: &str) -> Vec<Table> {
    tables
        .iter()
        .cloned()
        .map(|mut t| {
            t.sets
                .get_mut(name)
                .unwrap_or_else(|| panic!("the planned table has no set {name}"))
                .elements
                .clear();
            t
        })
        .collect()
}

// ---- servers and traffic -------------------------------------------------------------------

/// A TCP and a UDP server named `b<i>` on every backend's `BACKEND_PORT`, both families.
fn start_backends(topo: &Topology) -> Vec<Server> {
    let mut servers = Vec::new();
    for f in FAMILIES {
        for (i, ns) in topo.backends.iter().enumerate() {
            let addr = SocketAddr::new(backend_addr(topo, f, i), BACKEND_PORT);
            servers.push(tcp_server(ns, addr, &format!("b{i}")));
            servers.push(udp_server(ns, addr, &format!("b{i}")));
        }
    }
    servers
}

fn request(ns: &Netns, proto: Proto, dst: SocketAddr, timeout: Duration) -> Outcome {
    match proto {
        Proto::Tcp => tcp_request(ns, dst, timeout),
        Proto::Udp => udp_request(ns, dst, timeout),
    }
}

/// Splits an `Answered("<name> <peer-ip>")` into the server's name and the peer it saw;
/// panics with `what` and the node's ruleset on any other outcome.
fn answer(node: &Netns, out: &Outcome, what: &str) -> (String, IpAddr) {
    let Outcome::Answered(line) = out else {
        panic!(
            "{what}: expected an answer, got {out:?}\nnode ruleset:\n{}",
            list_ruleset(node)
        );
    };
    let (name, peer) = line
        .split_once(' ')
        .unwrap_or_else(|| panic!("{what}: malformed reply {line:?}"));
    let peer = peer
        .parse()
        .unwrap_or_else(|e| panic!("{what}: bad peer address in {line:?}: {e}"));
    (name.to_owned(), peer)
}

/// The index `i` of a server named `b<i>`.
fn backend_index(name: &str, backends: usize, what: &str) -> usize {
    name.strip_prefix('b')
        .and_then(|i| i.parse().ok())
        .filter(|i| *i < backends)
        .unwrap_or_else(|| panic!("{what}: answered by {name:?}, which is not a backend"))
}

/// Sends `n` requests; per request, the answering backend and the peer it saw.
fn answers(
    topo: &Topology,
    from: &Netns,
    proto: Proto,
    dst: SocketAddr,
    n: usize,
    what: &str,
) -> Vec<(usize, IpAddr)> {
    (0..n)
        .map(|k| {
            let what = format!("{what}, request {k}");
            let out = request(from, proto, dst, ANSWER);
            let (name, peer) = answer(&topo.node, &out, &what);
            (backend_index(&name, topo.backends.len(), &what), peer)
        })
        .collect()
}

/// Requests until every backend in `expected` has answered (at most `SPREAD_TRIES`); asserts
/// nobody else answers and each backend `i` sees `peer(i)`.
fn assert_spread(
    topo: &Topology,
    proto: Proto,
    dst: SocketAddr,
    expected: &BTreeSet<usize>,
    peer: impl Fn(usize) -> IpAddr,
    what: &str,
) {
    let mut seen = BTreeSet::new();
    let mut tries = 0;
    // Every request is a new connection or a new UDP socket (new source port), so a new
    // conntrack entry and a new numgen pick.
    while seen.len() < expected.len() && tries < SPREAD_TRIES {
        let what = format!("{what}, try {tries}");
        let out = request(&topo.client, proto, dst, ANSWER);
        let (name, got) = answer(&topo.node, &out, &what);
        let i = backend_index(&name, topo.backends.len(), &what);
        assert!(expected.contains(&i), "{what}: b{i} is not an endpoint");
        assert_eq!(got, peer(i), "{what}: b{i} saw the wrong source");
        seen.insert(i);
        tries += 1;
    }
    assert_eq!(
        &seen, expected,
        "{what}: only these backends answered in {tries} tries"
    );
}

/// Before any table is programmed nothing on the node answers `port`, and the client cannot
/// reach a backend directly: whatever answers later does so through nodelb's DNAT.
fn assert_only_dnat_reaches_backends(topo: &Topology, port: u16) {
    for f in FAMILIES {
        let node = SocketAddr::new(node_addr(topo, f), port);
        assert_eq!(
            tcp_request(&topo.client, node, ANSWER),
            Outcome::Refused { icmp: None },
            "before programming, {node}/tcp must be closed on the node"
        );
        for i in 0..topo.backends.len() {
            let backend = SocketAddr::new(backend_addr(topo, f, i), BACKEND_PORT);
            let out = tcp_request(&topo.client, backend, ANSWER);
            assert!(
                !matches!(out, Outcome::Answered(_)),
                "the client reached backend {backend} without DNAT: {out:?}"
            );
        }
    }
}

const WEB: [(Proto, u16); 2] = [(Proto::Tcp, 80), (Proto::Udp, 53)];

// ---- Cluster policy ------------------------------------------------------------------------

#[test]
fn cluster_policy_spreads_over_every_endpoint_and_masquerades() {
    if !require_root("cluster_policy_spreads_over_every_endpoint_and_masquerades") {
        return;
    }
    let topo = Topology::new(3);
    let _servers = start_backends(&topo);
    assert_only_dnat_reaches_backends(&topo, 80);

    // Endpoints on three nodes: Cluster policy uses all of them.
    let eps = [(0, NODE), (1, "node-b"), (2, "node-c")];
    let web = [service("web", "Cluster", &WEB)];
    program(
        &topo.node,
        &plan_topology(&topo, &web, &slices(&topo, "web", &WEB, &eps)),
    );

    let all: BTreeSet<usize> = [0, 1, 2].into();
    for f in FAMILIES {
        for (proto, port) in WEB {
            let dst = SocketAddr::new(node_addr(&topo, f), port);
            // Masquerade takes the node's address on the link towards the chosen backend.
            assert_spread(
                &topo,
                proto,
                dst,
                &all,
                |i| node_toward_backend(&topo, f, i),
                &format!("{f} {proto:?} {dst} Cluster"),
            );
        }
    }
}

// ---- Local policy --------------------------------------------------------------------------

#[test]
fn local_policy_keeps_client_address_and_uses_only_this_nodes_endpoint() {
    if !require_root("local_policy_keeps_client_address_and_uses_only_this_nodes_endpoint") {
        return;
    }
    let topo = Topology::new(4);
    let _servers = start_backends(&topo);
    assert_only_dnat_reaches_backends(&topo, 80);

    // b0 and b1 run here, b2 and b3 elsewhere. If the planner ignored nodeName, 12 more
    // requests would all stay on b0/b1 with chance 2^-12.
    let eps = [(0, NODE), (1, NODE), (2, "node-b"), (3, "node-c")];
    let web = [service("web", "Local", &WEB)];
    program(
        &topo.node,
        &plan_topology(&topo, &web, &slices(&topo, "web", &WEB, &eps)),
    );

    let here: BTreeSet<usize> = [0, 1].into();
    for f in FAMILIES {
        let client = client_addr(&topo, f);
        for (proto, port) in WEB {
            let dst = SocketAddr::new(node_addr(&topo, f), port);
            let what = format!("{f} {proto:?} {dst} Local");
            // Spread over both local endpoints, each seeing the client itself.
            assert_spread(&topo, proto, dst, &here, |_| client, &what);
            for (i, peer) in answers(&topo, &topo.client, proto, dst, 12, &what) {
                assert!(
                    here.contains(&i),
                    "{what}: answered by b{i}, on another node"
                );
                assert_eq!(peer, client, "{what}: the client's address was not kept");
            }
        }
    }
}

#[test]
fn local_policy_with_endpoints_only_on_other_nodes_is_silent() {
    if !require_root("local_policy_with_endpoints_only_on_other_nodes_is_silent") {
        return;
    }
    let topo = Topology::new(2);
    let _servers = start_backends(&topo);
    // Before: the node itself refuses (reset, port unreachable) — silence later is nodelb's.
    for f in FAMILIES {
        let dst = SocketAddr::new(node_addr(&topo, f), 80);
        assert_eq!(
            tcp_request(&topo.client, dst, ANSWER),
            Outcome::Refused { icmp: None },
            "{f} TCP {dst} before programming"
        );
        let dst = SocketAddr::new(node_addr(&topo, f), 53);
        assert_eq!(
            udp_request(&topo.client, dst, ANSWER),
            Outcome::Refused {
                icmp: Some(port_unreachable(f))
            },
            "{f} UDP {dst} before programming"
        );
    }

    let elsewhere = [(0, "node-b"), (1, "node-c")];
    // Control: the same endpoints under Cluster policy answer, so they are reachable and it is
    // the Local policy that keeps this node from using them.
    let control = [(Proto::Tcp, 81)];
    let services = [
        service("remote", "Local", &WEB),
        service("control", "Cluster", &control),
    ];
    let eps = [
        slices(&topo, "remote", &WEB, &elsewhere),
        slices(&topo, "control", &control, &elsewhere),
    ];
    program(&topo.node, &plan_topology(&topo, &services, &eps.concat()));

    for f in FAMILIES {
        let node = node_addr(&topo, f);
        let dst = SocketAddr::new(node, 81);
        answers(
            &topo,
            &topo.client,
            Proto::Tcp,
            dst,
            2,
            &format!("{f} control {dst}"),
        );
        for (proto, port) in WEB {
            let dst = SocketAddr::new(node, port);
            let out = request(&topo.client, proto, dst, SILENCE);
            assert_eq!(
                out,
                Outcome::TimedOut,
                "{f} {proto:?} {dst}: Local without a local endpoint must drop, not refuse\nnode ruleset:\n{}",
                list_ruleset(&topo.node)
            );
            // The node's own clients are not dropped: they go to the endpoints elsewhere, as
            // kube-proxy sends them ("connections from the node itself work").
            let out = request(&topo.node, proto, dst, ANSWER);
            assert!(
                matches!(&out, Outcome::Answered(line) if line.starts_with('b')),
                "{f} {proto:?} {dst} from the node itself: {out:?}\nnode ruleset:\n{}",
                list_ruleset(&topo.node)
            );
        }
    }
}

// ---- no endpoints --------------------------------------------------------------------------

#[test]
fn service_without_endpoints_resets_tcp_and_answers_udp_with_port_unreachable() {
    if !require_root("service_without_endpoints_resets_tcp_and_answers_udp_with_port_unreachable") {
        return;
    }
    let topo = Topology::new(1);
    // Real listeners on the node itself: without nodelb's reject the client would be answered,
    // so a refusal below cannot be the kernel's "nothing listens here".
    let mut servers = Vec::new();
    for f in FAMILIES {
        let node = node_addr(&topo, f);
        for (proto, port) in WEB {
            let addr = SocketAddr::new(node, port);
            servers.push(match proto {
                Proto::Tcp => tcp_server(&topo.node, addr, "node"),
                Proto::Udp => udp_server(&topo.node, addr, "node"),
            });
            assert_eq!(
                request(&topo.client, proto, addr, ANSWER),
                Outcome::Answered(format!("node {}", client_addr(&topo, f))),
                "{f} {proto:?} {addr} before programming"
            );
        }
    }

    // One Service with an empty slice, one with no slice at all.
    let tcp = [(Proto::Tcp, 80)];
    let udp = [(Proto::Udp, 53)];
    let services = [
        service("empty", "Cluster", &tcp),
        service("unscheduled", "Local", &udp),
    ];
    let tables = plan_topology(&topo, &services, &slices(&topo, "empty", &tcp, &[]));
    program(&topo.node, &tables);

    for f in FAMILIES {
        let node = node_addr(&topo, f);
        let dst = SocketAddr::new(node, 80);
        let ruleset = || list_ruleset(&topo.node);
        assert_eq!(
            tcp_request(&topo.client, dst, ANSWER),
            Outcome::Refused { icmp: None },
            "{f} TCP {dst}: expected a reset\n{}",
            ruleset()
        );
        assert_eq!(
            tcp_request(&topo.node, dst, ANSWER),
            Outcome::Refused { icmp: None },
            "{f} node-local TCP {dst}: expected a reset\n{}",
            ruleset()
        );
        let dst = SocketAddr::new(node, 53);
        assert_eq!(
            udp_request(&topo.client, dst, ANSWER),
            Outcome::Refused {
                icmp: Some(port_unreachable(f))
            },
            "{f} UDP {dst}: expected ICMP port unreachable\n{}",
            ruleset()
        );
    }

    // The same tables with the input chain emptied: clients are answered by the node's own
    // servers again, so it was the input chain that refused them; node-local clients are still
    // refused, by the filter-output chain alone (a local UDP sender learns of that reject from
    // sendmsg itself: EPERM).
    let tables: Vec<Table> = tables
        .into_iter()
        .map(|mut t| {
            t.chain_mut("input")
                .expect("the planned table has an input chain")
                .rules
                .clear();
            t
        })
        .collect();
    program(&topo.node, &tables);
    for f in FAMILIES {
        let node = node_addr(&topo, f);
        for (proto, port) in WEB {
            let dst = SocketAddr::new(node, port);
            assert_eq!(
                request(&topo.client, proto, dst, ANSWER),
                Outcome::Answered(format!("node {}", client_addr(&topo, f))),
                "{f} {proto:?} {dst} without the input chain's rejects"
            );
        }
        let dst = SocketAddr::new(node, 80);
        assert_eq!(
            tcp_request(&topo.node, dst, ANSWER),
            Outcome::Refused { icmp: None },
            "{f} node-local TCP {dst}, filter-output only: expected a reset"
        );
        let dst = SocketAddr::new(node, 53);
        let out = udp_request(&topo.node, dst, ANSWER);
        assert!(
            matches!(&out, Outcome::Failed(e) if e.starts_with("EPERM")),
            "{f} node-local UDP {dst}, filter-output only: expected EPERM, got {out:?}"
        );
    }
    drop(servers);
}

/// The node's own outbound connection whose ephemeral source port is a Service port without
/// endpoints: the replies come to the served address and that port, the very key the
/// no-endpoints reject looks up, and must get through (the reject sees new connections only).
/// The node namespace's `ip_local_port_range` is pinned to that one port, so every connection
/// the node opens uses it. Before the fix (the same tables with the reject on every packet)
/// the replies are rejected and the node hears nothing.
#[test]
fn a_reply_to_the_nodes_own_connection_from_a_port_without_endpoints_gets_through() {
    if !require_root(
        "a_reply_to_the_nodes_own_connection_from_a_port_without_endpoints_gets_through",
    ) {
        return;
    }
    // An ephemeral port must be at least ip_unprivileged_port_start (1024).
    const PINNED: u16 = 40080;
    let topo = Topology::new(1);
    topo.node.sh(&format!(
        "sysctl -qw net.ipv4.ip_local_port_range='{PINNED} {PINNED}'"
    ));
    assert_eq!(
        topo.node
            .sh("cat /proc/sys/net/ipv4/ip_local_port_range")
            .split_whitespace()
            .collect::<Vec<_>>(),
        [PINNED.to_string(), PINNED.to_string()],
        "the node's ephemeral ports are pinned"
    );
    // Servers in the client namespace, one port for the state before the fix and one after
    // (so no conntrack entry of the first attempts is reused).
    let (before_port, after_port) = (9000, 9001);
    let mut servers = Vec::new();
    for f in FAMILIES {
        for port in [before_port, after_port] {
            let addr = SocketAddr::new(client_addr(&topo, f), port);
            servers.push(tcp_server(&topo.client, addr, "client"));
            servers.push(udp_server(&topo.client, addr, "client"));
        }
    }
    let pinned = [(Proto::Tcp, PINNED), (Proto::Udp, PINNED)];
    let idle = [service("idle", "Cluster", &pinned)];
    let tables = plan_topology(&topo, &idle, &slices(&topo, "idle", &pinned, &[]));

    let outbound = |port: u16, timeout: Duration| -> Vec<(IpFamily, Proto, Outcome)> {
        let mut out = Vec::new();
        for f in FAMILIES {
            let dst = SocketAddr::new(client_addr(&topo, f), port);
            for proto in [Proto::Tcp, Proto::Udp] {
                out.push((f, proto, request(&topo.node, proto, dst, timeout)));
            }
        }
        out
    };

    program(&topo.node, &rejects_on_every_packet(&tables));
    for (f, proto, out) in outbound(before_port, SILENCE) {
        assert_eq!(
            out,
            Outcome::TimedOut,
            "{f} {proto:?}: with the reject on every packet the reply to port {PINNED} is rejected\n{}",
            list_ruleset(&topo.node)
        );
    }

    program(&topo.node, &tables);
    for (f, proto, out) in outbound(after_port, ANSWER) {
        assert_eq!(
            out,
            Outcome::Answered(format!("client {}", node_addr(&topo, f))),
            "{f} {proto:?}: the node's connection from port {PINNED}\n{}",
            list_ruleset(&topo.node)
        );
    }
    // New connections to the Service port are still refused.
    for f in FAMILIES {
        let dst = SocketAddr::new(node_addr(&topo, f), PINNED);
        assert_eq!(
            tcp_request(&topo.client, dst, ANSWER),
            Outcome::Refused { icmp: None },
            "{f} TCP {dst}: a new connection is reset"
        );
        assert_eq!(
            udp_request(&topo.client, dst, ANSWER),
            Outcome::Refused {
                icmp: Some(port_unreachable(f))
            },
            "{f} UDP {dst}: a new flow gets port unreachable"
        );
    }
    drop(servers);
}

// ---- loadBalancerSourceRanges ----------------------------------------------------------------

#[test]
fn source_ranges_admit_the_allowed_client_and_drop_another() {
    if !require_root("source_ranges_admit_the_allowed_client_and_drop_another") {
        return;
    }
    let (topo, other) = topology_with_stranger(2);
    let _servers = start_backends(&topo);
    let eps = [(0, NODE), (1, NODE)];
    // Control: the same backends without a range, so the stranger is shown to have a working
    // path to them.
    let open = [(Proto::Tcp, 81)];
    let services = [
        service("restricted", "Local", &WEB).spec("loadBalancerSourceRanges", CLIENT_RANGES),
        service("open", "Local", &open),
    ];
    let eps = [
        slices(&topo, "restricted", &WEB, &eps),
        slices(&topo, "open", &open, &eps),
    ];
    program(&topo.node, &plan_topology(&topo, &services, &eps.concat()));

    let stranger = topo.extra_client(other);
    for f in FAMILIES {
        let node = node_addr(&topo, f);
        let dst = SocketAddr::new(node, 81);
        let what = format!("{f} stranger -> unrestricted {dst}");
        for (i, peer) in answers(&topo, stranger, Proto::Tcp, dst, 2, &what) {
            assert_eq!(peer, extra_client_addr(&topo, f, other), "{what}: b{i}");
        }
        for (proto, port) in WEB {
            let dst = SocketAddr::new(node, port);
            let what = format!("{f} allowed client {proto:?} {dst}");
            for (i, peer) in answers(&topo, &topo.client, proto, dst, 2, &what) {
                assert_eq!(peer, client_addr(&topo, f), "{what}: b{i}");
            }
            // Dropped, not rejected: the stranger hears nothing at all.
            assert_eq!(
                request(stranger, proto, dst, SILENCE),
                Outcome::TimedOut,
                "{f} stranger {proto:?} {dst}\nnode ruleset:\n{}",
                list_ruleset(&topo.node)
            );
        }
    }
}

/// docs/design.md, "Source ranges": only sources inside the ranges reach the Service; others
/// are dropped. That holds while the Service has no endpoints too: a stranger must not learn from
/// a reset that the Service exists (kube-proxy checks source ranges before its no-endpoint
/// reject, too).
#[test]
fn source_ranges_drop_strangers_of_a_service_without_endpoints() {
    if !require_root("source_ranges_drop_strangers_of_a_service_without_endpoints") {
        return;
    }
    let (topo, other) = topology_with_stranger(1);
    let restricted =
        [service("restricted", "Cluster", &WEB).spec("loadBalancerSourceRanges", CLIENT_RANGES)];
    let eps = slices(&topo, "restricted", &WEB, &[]);
    program(&topo.node, &plan_topology(&topo, &restricted, &eps));

    let stranger = topo.extra_client(other);
    for f in FAMILIES {
        let node = node_addr(&topo, f);
        // The allowed client is refused: the Service has no endpoints, and it is programmed.
        let dst = SocketAddr::new(node, 80);
        assert_eq!(
            tcp_request(&topo.client, dst, ANSWER),
            Outcome::Refused { icmp: None },
            "{f} allowed client TCP {dst}"
        );
        let dst = SocketAddr::new(node, 53);
        assert_eq!(
            udp_request(&topo.client, dst, ANSWER),
            Outcome::Refused {
                icmp: Some(port_unreachable(f))
            },
            "{f} allowed client UDP {dst}"
        );
        for (proto, port) in WEB {
            let dst = SocketAddr::new(node, port);
            assert_eq!(
                request(stranger, proto, dst, SILENCE),
                Outcome::TimedOut,
                "{f} stranger {proto:?} {dst}: outside loadBalancerSourceRanges must be dropped, \
                 not rejected\nnode ruleset:\n{}",
                list_ruleset(&topo.node)
            );
        }
    }
}

// ---- hairpin and the node's own clients ------------------------------------------------------

#[test]
fn hairpin_endpoint_reaches_its_own_service_through_the_node() {
    if !require_root("hairpin_endpoint_reaches_its_own_service_through_the_node") {
        return;
    }
    let topo = Topology::new(1);
    let _servers = start_backends(&topo);
    // Local policy, so the Cluster masquerade cannot be what makes hairpin work.
    let itself = [service("self", "Local", &WEB)];
    let tables = plan_topology(&topo, &itself, &slices(&topo, "self", &WEB, &[(0, NODE)]));
    let backend = &topo.backends[0];

    // Before: the planner's tables without the hairpin pairs. DNAT sends b0's packets back to
    // b0 with its own address as source, and the connection cannot complete.
    program(&topo.node, &without_elements(&tables, HAIRPIN_SET));
    for f in FAMILIES {
        for (proto, port) in WEB {
            let dst = SocketAddr::new(node_addr(&topo, f), port);
            let out = request(backend, proto, dst, SILENCE);
            assert!(
                !matches!(out, Outcome::Answered(_)),
                "{f} {proto:?} {dst}: b0 reached itself without hairpin masquerade: {out:?}"
            );
        }
    }

    program(&topo.node, &tables);
    for f in FAMILIES {
        for (proto, port) in WEB {
            let dst = SocketAddr::new(node_addr(&topo, f), port);
            let what = format!("{f} hairpin {proto:?} {dst}");
            for (i, peer) in answers(&topo, backend, proto, dst, 2, &what) {
                assert_eq!(i, 0, "{what}");
                assert_eq!(
                    peer,
                    node_toward_backend(&topo, f, 0),
                    "{what}: b0 must see the node as its peer"
                );
            }
        }
    }
}

#[test]
fn node_local_client_is_answered_under_local_and_cluster_policy() {
    if !require_root("node_local_client_is_answered_under_local_and_cluster_policy") {
        return;
    }
    let topo = Topology::new(1);
    let _servers = start_backends(&topo);
    let local = [(Proto::Tcp, 80), (Proto::Udp, 53)];
    let cluster = [(Proto::Tcp, 81), (Proto::Udp, 54)];
    for f in FAMILIES {
        for (_, port) in local.iter().chain(&cluster) {
            let dst = SocketAddr::new(node_addr(&topo, f), *port);
            assert_eq!(
                tcp_request(&topo.node, dst, ANSWER),
                Outcome::Refused { icmp: None },
                "before programming, node-local {dst}/tcp must be closed"
            );
        }
    }
    let eps = [(0, NODE)];
    let services = [
        service("local", "Local", &local),
        service("cluster", "Cluster", &cluster),
    ];
    let eps = [
        slices(&topo, "local", &local, &eps),
        slices(&topo, "cluster", &cluster, &eps),
    ];
    let tables = plan_topology(&topo, &services, &eps.concat());

    // Without the host's addresses in `local-addresses`, a node-local client of the Local
    // Service is answered but not masqueraded: b0 sees the node's client-facing address.
    program(&topo.node, &without_elements(&tables, LOCAL_ADDRESSES_SET));
    for f in FAMILIES {
        let node = node_addr(&topo, f);
        for (proto, port) in local {
            let dst = SocketAddr::new(node, port);
            let what = format!("{f} node-local {proto:?} {dst}, no local-addresses");
            for (_, peer) in answers(&topo, &topo.node, proto, dst, 1, &what) {
                assert_eq!(peer, node, "{what}");
            }
        }
    }

    program(&topo.node, &tables);
    for f in FAMILIES {
        let node = node_addr(&topo, f);
        for (proto, port) in local.iter().chain(&cluster) {
            let dst = SocketAddr::new(node, *port);
            let what = format!("{f} node-local {proto:?} {dst}");
            for (i, peer) in answers(&topo, &topo.node, *proto, dst, 2, &what) {
                assert_eq!(
                    peer,
                    node_toward_backend(&topo, f, i),
                    "{what}: a node-local client is masqueraded under both policies"
                );
            }
        }
    }
}

// ---- incremental sync ----------------------------------------------------------------------

#[test]
fn endpoint_changes_through_incremental_sync_move_traffic() {
    if !require_root("endpoint_changes_through_incremental_sync_move_traffic") {
        return;
    }
    let topo = Topology::new(2);
    let _servers = start_backends(&topo);
    let both = [(0, NODE), (1, "node-b")];
    let web = |eps: &[(usize, &str)]| {
        let web = [service("web", "Cluster", &WEB)];
        plan_topology(&topo, &web, &slices(&topo, "web", &WEB, eps))
    };
    // One committer for the whole test: its socket lives in the node namespace, and it keeps
    // what it committed so each later sync sends only the difference.
    let mut committer = topo
        .node
        .run(|| Nft::open().map(Committer::new))
        .expect("netlink socket in the node namespace");
    let full = replace(&mut committer, web(&both)).expect("first replace");

    let t = &topo;
    let masq = |f: IpFamily| move |i: usize| node_toward_backend(t, f, i);
    for f in FAMILIES {
        for (proto, port) in WEB {
            let dst = SocketAddr::new(node_addr(&topo, f), port);
            let what = format!("{f} {proto:?} {dst}, two endpoints");
            assert_spread(&topo, proto, dst, &[0, 1].into(), masq(f), &what);
        }
    }

    // b1 goes away: only b0 answers new connections.
    let stats = sync(&mut committer, web(&[(0, NODE)])).expect("sync to one endpoint");
    assert!(
        stats.messages < full.messages,
        "removing one endpoint sent {} messages, the whole replace {}",
        stats.messages,
        full.messages
    );
    for f in FAMILIES {
        for (proto, port) in WEB {
            let dst = SocketAddr::new(node_addr(&topo, f), port);
            let what = format!("{f} {proto:?} {dst}, b1 removed");
            // With b1 still programmed, 12 picks all landing on b0 has chance 2^-12.
            for (i, _) in answers(&topo, &topo.client, proto, dst, 12, &what) {
                assert_eq!(i, 0, "{what}: b{i} answered after its removal");
            }
        }
    }

    // No endpoint left: reset and port unreachable.
    sync(&mut committer, web(&[])).expect("sync to no endpoint");
    for f in FAMILIES {
        let node = node_addr(&topo, f);
        let dst = SocketAddr::new(node, 80);
        assert_eq!(
            tcp_request(&topo.client, dst, ANSWER),
            Outcome::Refused { icmp: None },
            "{f} TCP {dst}, no endpoints after sync\n{}",
            list_ruleset(&topo.node)
        );
        let dst = SocketAddr::new(node, 53);
        assert_eq!(
            udp_request(&topo.client, dst, ANSWER),
            Outcome::Refused {
                icmp: Some(port_unreachable(f))
            },
            "{f} UDP {dst}, no endpoints after sync"
        );
    }
    // The kernel now holds what a fresh replace of the same plan holds (counters aside).
    let fresh = Netns::new("fresh");
    program(&fresh, &web(&[]));
    for fam in ["ip", "ip6"] {
        let list = |ns: &Netns| ns.sh(&format!("nft -s list table {fam} nodelb"));
        assert_eq!(
            list(&topo.node),
            list(&fresh),
            "{fam}: after incremental syncs the table differs from a fresh replace"
        );
    }

    // Both back: traffic spreads again.
    sync(&mut committer, web(&both)).expect("sync back to two endpoints");
    for f in FAMILIES {
        for (proto, port) in WEB {
            let dst = SocketAddr::new(node_addr(&topo, f), port);
            let what = format!("{f} {proto:?} {dst}, both endpoints back");
            assert_spread(&topo, proto, dst, &[0, 1].into(), masq(f), &what);
        }
    }
}

// ---- NAT order -----------------------------------------------------------------------------

/// A foreign nat table in the node namespace whose `dstnat` prerouting chain DNATs the node's
/// address and port 80 to backend 1, as kube-proxy, a CNI's hostPort or Docker could.
fn add_foreign_dnat(topo: &Topology) {
    let to = |f| SocketAddr::new(backend_addr(topo, f, 1), BACKEND_PORT);
    let script = format!(
        "table ip foreign {{\n\tchain pre {{\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tip daddr {} tcp dport 80 dnat to {}\n\t}}\n}}\n\
         table ip6 foreign {{\n\tchain pre {{\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tip6 daddr {} tcp dport 80 dnat to {}\n\t}}\n}}\n",
        node_addr(topo, IpFamily::V4),
        to(IpFamily::V4),
        node_addr(topo, IpFamily::V6),
        to(IpFamily::V6),
    );
    nft_f(&topo.node, &script).unwrap_or_else(|e| panic!("adding the foreign DNAT: {e}"));
}

fn delete_foreign_dnat(topo: &Topology) {
    nft_f(
        &topo.node,
        "delete table ip foreign\ndelete table ip6 foreign\n",
    )
    .unwrap_or_else(|e| panic!("deleting the foreign DNAT: {e}"));
}

/// Every request from the client to the node's port 80 is answered by backend `want`.
fn assert_answered_by(topo: &Topology, want: usize, what: &str) {
    for f in FAMILIES {
        let dst = SocketAddr::new(node_addr(topo, f), 80);
        let got = answers(
            topo,
            &topo.client,
            Proto::Tcp,
            dst,
            8,
            &format!("{what} {f}"),
        );
        assert!(
            got.iter().all(|(i, _)| *i == want),
            "{what} {f}: answered by {got:?}, want b{want} only\nnode ruleset:\n{}",
            list_ruleset(&topo.node)
        );
    }
}

/// nodelb's dispatch runs at `dstnat - 10`: a foreign `dstnat` chain DNATing the same node
/// address and port never wins, whether it was registered before nodelb's tables, after them,
/// or stays while nodelb replaces its tables.
#[test]
fn a_foreign_dstnat_chain_for_the_same_address_and_port_never_wins() {
    if !require_root("a_foreign_dstnat_chain_for_the_same_address_and_port_never_wins") {
        return;
    }
    let topo = Topology::new(2);
    let _servers = start_backends(&topo);
    let web = [(Proto::Tcp, 80)];
    let services = [service("web", "Cluster", &web)];
    let tables = plan_topology(&topo, &services, &slices(&topo, "web", &web, &[(0, NODE)]));

    // The foreign rule alone works: it sends port 80 to backend 1.
    add_foreign_dnat(&topo);
    assert_answered_by(&topo, 1, "foreign DNAT alone");
    // Registered before nodelb's.
    program(&topo.node, &tables);
    assert_answered_by(&topo, 0, "foreign chain registered first");
    // Registered after nodelb's.
    delete_foreign_dnat(&topo);
    add_foreign_dnat(&topo);
    assert_answered_by(&topo, 0, "foreign chain registered last");
    // nodelb replaces its tables (its chains registered anew, after the foreign one).
    program(&topo.node, &tables);
    assert_answered_by(&topo, 0, "after nodelb's full replace");
    delete_foreign_dnat(&topo);
}

// ---- session affinity ----------------------------------------------------------------------

/// `n` more addresses for the client namespace in family `f` (203.0.113.100 + k,
/// 2001:db8:c::100 + k), each a client of its own for ClientIP affinity.
fn more_client_addresses(topo: &Topology, f: IpFamily, first: u8, n: u8) -> Vec<IpAddr> {
    (first..first + n)
        .map(|k| {
            let (addr, cidr): (IpAddr, String) = match f {
                IpFamily::V4 => {
                    let a = std::net::Ipv4Addr::new(203, 0, 113, 100 + k);
                    (a.into(), format!("{a}/24"))
                }
                IpFamily::V6 => {
                    let a =
                        std::net::Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 0x100 + k as u16);
                    (a.into(), format!("{a}/64"))
                }
            };
            let mut args = vec!["addr", "add", &cidr, "dev", "eth-node"];
            if f == IpFamily::V6 {
                // No duplicate address detection: the address is usable at once.
                args.push("nodad");
            }
            topo.client.ip(&args);
            addr
        })
        .collect()
}

/// Every element the dynamic sets of `tables` hold in the node now.
fn learned(node: &Netns, tables: &[Table]) -> Vec<nodelb_netfilter::Learned> {
    node.run(|| {
        let mut nft = Nft::open().expect("netlink socket");
        let mut out = Vec::new();
        for t in tables {
            let names = t.sets.values().filter(|s| s.is_dynamic());
            let read = nft.read_learned(&TableRef::of(t), names.map(|s| s.name.as_str()));
            out.extend(read.expect("read the dynamic sets").into_values().flatten());
        }
        out
    })
}

/// The backend that answers one TCP connection from `src` to `dst`.
fn tcp_answer_from(topo: &Topology, src: IpAddr, dst: SocketAddr, what: &str) -> usize {
    let out = tcp_request_from(&topo.client, src, dst, ANSWER);
    let (name, _) = answer(&topo.node, &out, what);
    backend_index(&name, topo.backends.len(), what)
}

/// The one backend every answer came from, or a panic naming them all.
fn one_backend(got: &[(usize, IpAddr)], what: &str) -> usize {
    let backends: BTreeSet<usize> = got.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        backends.len(),
        1,
        "{what}: {} connections from one client reached {backends:?}",
        got.len()
    );
    got[0].0
}

const STICKY: [(Proto, u16); 2] = [(Proto::Tcp, 80), (Proto::Udp, 53)];
const BRIEF: [(Proto, u16); 2] = [(Proto::Tcp, 81), (Proto::Udp, 54)];
/// At most this many rounds of "wait out the 2-second timeout, connect again" (they stop once
/// every family and protocol has seen two endpoints). Each round's first pick is a fair one of
/// 4 endpoints, so a working timeout shows one endpoint in every round of a family and
/// protocol with chance 4 * (1/4)^12 = 6e-8, about 2.4e-7 for the four of them.
const TIMEOUT_ROUNDS: usize = 12;

#[test]
fn client_ip_affinity_keeps_a_client_on_one_endpoint_until_its_timeout() {
    if !require_root("client_ip_affinity_keeps_a_client_on_one_endpoint_until_its_timeout") {
        return;
    }
    let topo = Topology::new(4);
    let _servers = start_backends(&topo);
    assert_only_dnat_reaches_backends(&topo, 80);
    let eps = [(0, NODE), (1, "node-b"), (2, "node-c"), (3, "node-d")];
    let all: BTreeSet<usize> = [0, 1, 2, 3].into();
    let services = [
        service("sticky", "Cluster", &STICKY),
        service("brief", "Cluster", &BRIEF),
    ];
    let eps = [
        slices(&topo, "sticky", &STICKY, &eps),
        slices(&topo, "brief", &BRIEF, &eps),
    ]
    .concat();
    // Without affinity, one client's connections spread over every endpoint.
    program(&topo.node, &plan_topology(&topo, &services, &eps));
    let t = &topo;
    for f in FAMILIES {
        let dst = SocketAddr::new(node_addr(t, f), 80);
        let masq = |i| node_toward_backend(t, f, i);
        assert_spread(t, Proto::Tcp, dst, &all, masq, &format!("{f} no affinity"));
    }

    let [sticky, brief] = services;
    let sticky = [sticky.client_ip_affinity(60), brief.client_ip_affinity(2)];
    program(&topo.node, &plan_topology(&topo, &sticky, &eps));
    let tables = [IpFamily::V4, IpFamily::V6].map(|f| Config::default().table_ref(f));
    let mut watcher = topo
        .node
        .run(|| nodelb_netfilter::Watcher::open(tables.to_vec()))
        .expect("watch nodelb's tables");
    for f in FAMILIES {
        // 20 connections (20 UDP sockets) from one client land on one endpoint.
        for (proto, port) in STICKY {
            let dst = SocketAddr::new(node_addr(t, f), port);
            let what = format!("{f} {proto:?} {dst} ClientIP");
            let got = answers(t, &topo.client, proto, dst, 20, &what);
            let i = one_backend(&got, &what);
            assert!(got
                .iter()
                .all(|(_, peer)| *peer == node_toward_backend(t, f, i)));
        }
        // Other clients get picks of their own, each kept: 16 more addresses all landing on
        // the first client's endpoint has chance (1/4)^16 if affinity is per client.
        let dst = SocketAddr::new(node_addr(t, f), 80);
        let mut picked = BTreeSet::new();
        for src in more_client_addresses(t, f, 0, 16) {
            let what = format!("{f} TCP {dst} from {src}");
            let first = tcp_answer_from(t, src, dst, &what);
            for _ in 0..3 {
                assert_eq!(tcp_answer_from(t, src, dst, &what), first, "{what}: moved");
            }
            picked.insert(first);
        }
        assert!(picked.len() > 1, "{f}: every client on b{picked:?}");
    }

    // Once a client has been away for the timeout, it is picked for anew (and kept again).
    let mut firsts: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); FAMILIES.len() * BRIEF.len()];
    for round in 0..TIMEOUT_ROUNDS {
        if firsts.iter().all(|seen| seen.len() > 1) {
            break;
        }
        std::thread::sleep(Duration::from_millis(2_600));
        for (k, (f, (proto, port))) in FAMILIES
            .iter()
            .flat_map(|f| BRIEF.iter().map(move |p| (*f, *p)))
            .enumerate()
        {
            let dst = SocketAddr::new(node_addr(t, f), port);
            let what = format!("{f} {proto:?} {dst} timeout 2s, round {round}");
            let got = answers(t, &topo.client, proto, dst, 2, &what);
            firsts[k].insert(one_backend(&got, &what));
        }
    }
    for (k, seen) in firsts.iter().enumerate() {
        assert!(
            seen.len() > 1,
            "combination {k}: after every timeout the client went back to {seen:?}"
        );
    }
    // Clients written into the sets by packets, and expired by the kernel, are no change to
    // nodelb's tables: nothing to repair.
    let heard = watcher.next(Duration::from_millis(500)).expect("watch");
    assert_eq!(heard, None, "the watch heard traffic as a change");
}

/// Spoofed sources that flood Service A: each sends a SYN to A's TCP port and a datagram to its
/// UDP port, so A's ports see 2 x this many new clients: more than a port's own set holds
/// (65,536), and more than the 262,144 the one set every affinity port of a timeout shared
/// held (nodelb before issue 39).
const FLOOD_SOURCES: u64 = 140_000;

/// The IPv6 clients every dynamic set of `tables` holds in the node now (an IPv6 affinity
/// set's key begins with the client's 16 bytes; an IPv4 one's is shorter).
fn remembered_v6(node: &Netns, tables: &[Table]) -> Vec<Ipv6Addr> {
    let key = |l: &nodelb_netfilter::Learned| <[u8; 16]>::try_from(l.key.get(..16)?).ok();
    learned(node, tables)
        .iter()
        .filter_map(key)
        .map(Ipv6Addr::from)
        .collect()
}

#[test]
fn a_flood_of_new_clients_on_one_affinity_service_leaves_another_its_affinity() {
    if !require_root("a_flood_of_new_clients_on_one_affinity_service_leaves_another_its_affinity") {
        return;
    }
    let topo = Topology::new(4);
    let _servers = start_backends(&topo);
    let eps = [(0, NODE), (1, "node-b"), (2, "node-c"), (3, "node-d")];
    // Same timeout: before issue 39, ports of one timeout shared one set.
    let services = [
        service("flooded", "Cluster", &STICKY).client_ip_affinity(600),
        service("kept", "Cluster", &BRIEF).client_ip_affinity(600),
    ];
    let eps = [
        slices(&topo, "flooded", &STICKY, &eps),
        slices(&topo, "kept", &BRIEF, &eps),
    ]
    .concat();
    let tables = plan_topology(&topo, &services, &eps);
    program(&topo.node, &tables);
    let t = &topo;
    let f = IpFamily::V6;
    let IpAddr::V6(node) = node_addr(t, f) else {
        unreachable!("an IPv6 node address")
    };
    let kept = SocketAddr::new(node.into(), 81);
    let kept_by = |clients: &[IpAddr], what: &str| -> Vec<usize> {
        clients
            .iter()
            .map(|c| tcp_answer_from(t, *c, kept, &format!("{what} {c}")))
            .collect()
    };
    // B's clients from before the flood.
    let old = more_client_addresses(t, f, 0, 8);
    let old_endpoints = kept_by(&old, "B's client before the flood");

    // The flood: every source new, TCP and UDP, all at A.
    let started = std::time::Instant::now();
    topo.client.run(|| {
        let sock = flood::raw_socket().expect("raw socket");
        for k in 0..FLOOD_SOURCES {
            let src = flood::source(k);
            for (kind, port) in [(Spoofed::Syn, 80), (Spoofed::Udp, 53)] {
                flood::send(&sock, &flood::packet(kind, src, node, port), node).expect("send");
            }
        }
    });
    println!(
        "{} spoofed packets from {FLOOD_SOURCES} sources in {:?}",
        2 * FLOOD_SOURCES,
        started.elapsed()
    );
    // The flood reached nodelb's chains: they remembered its sources, as many as they could.
    let remembered = remembered_v6(&topo.node, &tables)
        .iter()
        .filter(|c| c.segments()[..3] == [0x2001, 0xdb8, 0xf])
        .count();
    println!("the flood's sources remembered: {remembered}");
    assert!(
        remembered >= 2 * 65_536,
        "only {remembered} of the flood's clients were remembered: it did not reach the chains"
    );

    // B's clients from before keep their endpoints; new ones are picked for and kept.
    assert_eq!(
        kept_by(&old, "B's client after the flood"),
        old_endpoints,
        "B's clients moved"
    );
    let new = more_client_addresses(t, f, 8, 8);
    let first = kept_by(&new, "B's new client");
    for round in 0..3 {
        assert_eq!(
            kept_by(&new, "B's new client again"),
            first,
            "round {round}: B's new clients were not kept on their endpoints"
        );
    }
    let now = remembered_v6(&topo.node, &tables);
    for c in &new {
        let IpAddr::V6(c) = c else { unreachable!() };
        assert!(
            now.contains(c),
            "B's new client {c} is in no set ({} clients remembered)",
            now.len()
        );
    }
}

/// A planner and a committer kept between syncs, as the agent keeps them.
struct Agent {
    planner: Planner,
    objects: Objects,
    ctx: Context,
    committer: Committer,
}

impl Agent {
    fn start(topo: &Topology, services: &[Svc], slices: &[Slice]) -> Agent {
        let ctx = Context::new(
            topology_node(topo),
            topo.node.addresses(),
            Families { v4: true, v6: true },
            Config::default(),
        );
        let mut agent = Agent {
            planner: Planner::new(),
            objects: Objects::from_lists(
                services.iter().map(Svc::index),
                slices.iter().map(Slice::index),
            ),
            ctx,
            committer: topo
                .node
                .run(|| Nft::open().map(Committer::new))
                .expect("netlink socket in the node namespace"),
        };
        let u = agent.planner.update(&agent.objects, &agent.ctx, None);
        assert!(matches!(u.change, TableChange::Rebuild));
        agent.replace();
        agent
    }

    /// The agent starts again: a planner from nothing, over the tables the last one left;
    /// `seed`: it first takes the endpoint slots the kernel holds, as the agent does.
    fn restart(&mut self, seed: bool) -> Committed {
        self.planner = Planner::new();
        let u = self.planner.update(&self.objects, &self.ctx, None);
        assert!(matches!(u.change, TableChange::Rebuild));
        if seed {
            let tables = FAMILIES.map(|f| (f, self.ctx.config.table_ref(f)));
            seed_slots(self.committer.nft(), &mut self.planner, tables).expect("seed");
        }
        self.replace()
    }

    /// A whole replace of what is planned, as at start and to repair drift.
    fn replace(&mut self) -> Committed {
        let planner = &self.planner;
        let mut build = || planner.tables();
        self.committer
            .commit(Commit::replace(&mut build))
            .expect("whole replace")
    }

    /// `slices` changed: the planner's edit, committed.
    fn slices_changed(&mut self, slices: &[Slice]) -> Vec<(TableRef, Edit)> {
        let mut dirty = BTreeSet::new();
        for s in slices {
            dirty.extend(self.objects.put_slice(std::sync::Arc::new(s.index())));
        }
        let u = self.planner.update(&self.objects, &self.ctx, Some(&dirty));
        let TableChange::Edit(edits) = u.change else {
            panic!("a slice change is an edit")
        };
        self.committer
            .commit(Commit::edit(edits.clone()))
            .expect("incremental sync");
        edits
    }
}

/// Twelve clients per family of the sticky Service on port 80.
fn twelve_clients_per_family(t: &Topology) -> Vec<(IpAddr, SocketAddr)> {
    FAMILIES
        .iter()
        .flat_map(|f| {
            let dst = SocketAddr::new(node_addr(t, *f), 80);
            more_client_addresses(t, *f, 0, 12)
                .into_iter()
                .map(move |c| (c, dst))
        })
        .collect()
}

/// The backend each client's TCP connection reaches.
fn answers_of(t: &Topology, clients: &[(IpAddr, SocketAddr)], what: &str) -> Vec<usize> {
    clients
        .iter()
        .map(|(c, dst)| tcp_answer_from(t, *c, *dst, &format!("{c} {what}")))
        .collect()
}

#[test]
fn client_ip_affinity_keeps_its_clients_over_a_restart_after_endpoints_moved() {
    if !require_root("client_ip_affinity_keeps_its_clients_over_a_restart_after_endpoints_moved") {
        return;
    }
    let topo = Topology::new(3);
    let _servers = start_backends(&topo);
    let t = &topo;
    let sticky = |eps: &[(usize, &str)]| slices(t, "sticky", &STICKY, eps);
    let services = [service("sticky", "Cluster", &STICKY).client_ip_affinity(600)];
    let all = [(0, NODE), (1, "node-b"), (2, "node-c")];
    let mut agent = Agent::start(&topo, &services, &sticky(&all));
    // The first endpoint goes: the last takes its slot, so the kernel holds b2 in slot 0 and
    // b1 in slot 1, where a planner from nothing numbers them b1, b2.
    agent.slices_changed(&sticky(&all[1..]));
    let clients = twelve_clients_per_family(t);
    let kept = answers_of(t, &clients, "first");
    assert!(
        kept.contains(&1) && kept.contains(&2),
        "24 clients all on one endpoint: {kept:?}"
    );
    let on = |what: &str| answers_of(t, &clients, what);

    // The agent starts again and takes the kernel's slots: every client stays.
    let done = agent.restart(true);
    assert!(done.restored >= clients.len(), "restored {}", done.restored);
    assert_eq!(on("after a restart"), kept);

    // Numbering sorted instead, every client moves: the slots swap endpoints.
    agent.restart(false);
    let moved = on("after a restart that numbers sorted");
    for (i, (was, now)) in kept.iter().zip(&moved).enumerate() {
        assert_ne!(
            was, now,
            "{:?} stayed where sorted slots send it elsewhere",
            clients[i]
        );
    }
}

#[test]
fn client_ip_affinity_survives_an_incremental_sync_and_a_full_replace() {
    if !require_root("client_ip_affinity_survives_an_incremental_sync_and_a_full_replace") {
        return;
    }
    let topo = Topology::new(3);
    let _servers = start_backends(&topo);
    let t = &topo;
    let sticky = |eps: &[(usize, &str)]| slices(t, "sticky", &STICKY, eps);
    let services = [service("sticky", "Cluster", &STICKY).client_ip_affinity(60)];
    let mut agent = Agent::start(&topo, &services, &sticky(&[(0, NODE), (1, "node-b")]));

    // Twelve clients per family, each on the endpoint it was first sent to.
    let clients = twelve_clients_per_family(t);
    let kept = answers_of(t, &clients, "first");
    let still_there = |what: &str| {
        for ((c, dst), b) in clients.iter().zip(&kept) {
            let what = format!("{c} {what}");
            assert_eq!(tcp_answer_from(t, *c, *dst, &what), *b, "{what}: moved");
        }
    };
    // What packets wrote is not drift.
    for tr in agent.committer.committed_tables() {
        assert_eq!(
            agent.committer.drift(&tr).unwrap(),
            Some(Drift::None),
            "{tr}"
        );
    }

    // A third endpoint, through the planner's edit: the others' sets stay, so every client
    // stays (were they emptied, 24 clients re-picking among three would all stay with chance
    // (1/3)^24); new clients reach the new endpoint (40 per family all missing it: (2/3)^40,
    // 9e-8).
    let edits = agent.slices_changed(&sticky(&[(0, NODE), (1, "node-b"), (2, "node-c")]));
    assert!(
        edits.iter().all(|(_, e)| e.del_sets.is_empty()),
        "{edits:?}"
    );
    still_there("after the endpoint was added");
    for f in FAMILIES {
        let dst = SocketAddr::new(node_addr(t, f), 80);
        let fresh: BTreeSet<usize> = more_client_addresses(t, f, 12, 40)
            .into_iter()
            .map(|c| tcp_answer_from(t, c, dst, &format!("new client {c}")))
            .collect();
        assert!(
            fresh.contains(&2),
            "{f}: no new client reached b2: {fresh:?}"
        );
    }

    // A whole replace (start, drift repair) carries what the sets learned, each client with
    // the time it had left, not a new timeout.
    std::thread::sleep(Duration::from_secs(2));
    let done = agent.replace();
    assert!(done.restored >= clients.len(), "restored {}", done.restored);
    let expires: Vec<Duration> = learned(&topo.node, &agent.planner.tables())
        .iter()
        .map(|l| l.expires)
        .collect();
    assert!(expires.len() >= clients.len(), "{expires:?}");
    assert!(
        expires.iter().all(|e| *e <= Duration::from_millis(58_500)),
        "restored with a new timeout: {expires:?}"
    );
    still_there("after a whole replace");
    for tr in agent.committer.committed_tables() {
        assert_eq!(
            agent.committer.drift(&tr).unwrap(),
            Some(Drift::None),
            "{tr}"
        );
    }

    // Without the carrying, a replace forgets every client: nft -f of the same tables.
    let script: String = agent.planner.tables().iter().map(render_replace).collect();
    nft_f(&topo.node, &script).expect("nft -f of the planned tables");
    let forgotten = learned(&topo.node, &agent.planner.tables());
    assert!(forgotten.is_empty(), "{forgotten:?}");
}
