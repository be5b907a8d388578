//! Dataplane tests: the load-balancer tables nodelb programs (`models::lb_table`, applied through
//! nodelb's own netlink batch) carry real TCP and UDP packets, IPv4 and IPv6, from client
//! namespaces through a node namespace to backend namespaces.
//!
//! Every assertion is on what arrived: which backend answered, which source address it saw, or
//! which error came back. Clients have no route to the backends (the default `Topology`), so a
//! backend can only answer through the node's DNAT; each test also shows the "before" state so
//! it fails if the rule under test does nothing.
//!
//! Run as root: `cargo test -p nodelb-integration --test dataplane`.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use nodelb_integration::models::{lb_table, Fam, LbService};
use nodelb_integration::netns::{require_root, route, Netns, Topology};
use nodelb_integration::nft::{list_ruleset, nodelb_replace};
use nodelb_integration::traffic::{
    tcp_request, tcp_server, udp_request, udp_server, IcmpError, Outcome, Server,
};
use nodelb_netfilter::{L4Proto, Table};

/// Deadline for a request that is expected to be answered (or refused).
const ANSWER: Duration = Duration::from_secs(2);
/// Deadline for a request that is expected to get nothing back.
const SILENCE: Duration = Duration::from_secs(1);
/// The port every backend server listens on.
const BACKEND_PORT: u16 = 8080;
/// Tries allowed for numgen to pick every one of three backends; the chance that a fair pick
/// misses one of them is 3 * (2/3)^64, about 2e-11.
const SPREAD_TRIES: usize = 64;

// ---- addresses per family ----------------------------------------------------------------

fn node_addr(topo: &Topology, f: Fam) -> IpAddr {
    if f.v6() {
        topo.node_v6().into()
    } else {
        topo.node_v4().into()
    }
}

fn client_addr(topo: &Topology, f: Fam) -> IpAddr {
    if f.v6() {
        topo.client_v6().into()
    } else {
        topo.client_v4().into()
    }
}

fn backend_addr(topo: &Topology, f: Fam, i: usize) -> IpAddr {
    if f.v6() {
        topo.backend_v6(i).into()
    } else {
        topo.backend_v4(i).into()
    }
}

fn node_toward_backend(topo: &Topology, f: Fam, i: usize) -> IpAddr {
    if f.v6() {
        topo.node_v6_toward_backend(i).into()
    } else {
        topo.node_v4_toward_backend(i).into()
    }
}

fn extra_client_addr(topo: &Topology, f: Fam, i: usize) -> IpAddr {
    if f.v6() {
        topo.extra_client_v6(i).into()
    } else {
        topo.extra_client_v4(i).into()
    }
}

fn port_unreachable(f: Fam) -> IcmpError {
    if f.v6() {
        IcmpError::V6_PORT_UNREACHABLE
    } else {
        IcmpError::V4_PORT_UNREACHABLE
    }
}

fn fam_name(f: Fam) -> &'static str {
    if f.v6() {
        "ipv6"
    } else {
        "ipv4"
    }
}

/// The /32 or /128 holding exactly `addr`.
fn host_prefix(addr: IpAddr) -> (IpAddr, u8) {
    (addr, if addr.is_ipv4() { 32 } else { 128 })
}

// ---- setup -------------------------------------------------------------------------------

/// A TCP and a UDP server named `b<i>` on every backend's `BACKEND_PORT`, for family `f`.
fn start_backends(topo: &Topology, f: Fam) -> Vec<Server> {
    let mut servers = Vec::new();
    for (i, ns) in topo.backends.iter().enumerate() {
        let addr = SocketAddr::new(backend_addr(topo, f, i), BACKEND_PORT);
        let name = format!("b{i}");
        servers.push(tcp_server(ns, addr, &name));
        servers.push(udp_server(ns, addr, &name));
    }
    servers
}

/// Every backend of `topo` on `BACKEND_PORT`, in family `f`.
fn all_backends(topo: &Topology, f: Fam) -> Vec<(IpAddr, u16)> {
    (0..topo.backends.len())
        .map(|i| (backend_addr(topo, f, i), BACKEND_PORT))
        .collect()
}

/// TCP 80 and UDP 53 masqueraded, TCP 81 and UDP 54 not, all to every backend.
fn masq_and_keep_services(topo: &Topology, f: Fam) -> [LbService; 4] {
    let eps = || all_backends(topo, f);
    [
        service("default/masq:tcp", L4Proto::Tcp, 80, eps(), true),
        service("default/keep:tcp", L4Proto::Tcp, 81, eps(), false),
        service("default/masq:udp", L4Proto::Udp, 53, eps(), true),
        service("default/keep:udp", L4Proto::Udp, 54, eps(), false),
    ]
}

fn service(
    key: &str,
    proto: L4Proto,
    port: u16,
    endpoints: Vec<(IpAddr, u16)>,
    masquerade: bool,
) -> LbService {
    LbService {
        key: key.into(),
        proto,
        port,
        endpoints,
        masquerade,
        source_ranges: Vec::new(),
    }
}

/// Replaces the node's nodelb tables through nodelb's netlink batch.
fn program(node: &Netns, tables: &[Table]) {
    if let Err(e) = nodelb_replace(node, tables) {
        panic!("nodelb_replace in {}: {e} ({e:?})", node.name());
    }
}

// ---- traffic -----------------------------------------------------------------------------

fn request(ns: &Netns, proto: L4Proto, dst: SocketAddr, timeout: Duration) -> Outcome {
    match proto {
        L4Proto::Tcp => tcp_request(ns, dst, timeout),
        L4Proto::Udp => udp_request(ns, dst, timeout),
        other => panic!("no test client for {other:?}"),
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

/// Sends `n` requests and returns, per request, the answering backend and the peer it saw.
fn answers(
    topo: &Topology,
    from: &Netns,
    proto: L4Proto,
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

/// Before any table is programmed, nothing on the node answers `port` and the client cannot
/// reach a backend directly: whatever answers later does so through nodelb's DNAT.
fn assert_only_dnat_reaches_backends(topo: &Topology, f: Fam, port: u16) {
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

// ---- 1. numgen spreads over every endpoint -------------------------------------------------

fn numgen_spreads_over_every_backend(f: Fam) {
    let topo = Topology::new(3);
    let _servers = start_backends(&topo, f);
    assert_only_dnat_reaches_backends(&topo, f, 80);

    let services = [
        service(
            "default/web:http",
            L4Proto::Tcp,
            80,
            all_backends(&topo, f),
            false,
        ),
        service(
            "default/dns:dns",
            L4Proto::Udp,
            53,
            all_backends(&topo, f),
            false,
        ),
    ];
    let node = node_addr(&topo, f);
    program(&topo.node, &[lb_table(f, "nodelb", &[node], &services)]);

    let client = client_addr(&topo, f);
    for (proto, port) in [(L4Proto::Tcp, 80), (L4Proto::Udp, 53)] {
        let dst = SocketAddr::new(node, port);
        let mut seen = BTreeSet::new();
        let mut tries = 0;
        // Every request is a new connection or a new UDP socket (new source port), so a new
        // conntrack entry and a new numgen pick.
        while seen.len() < topo.backends.len() && tries < SPREAD_TRIES {
            let what = format!("{} {proto:?} {dst}, try {tries}", fam_name(f));
            let out = request(&topo.client, proto, dst, ANSWER);
            let (name, peer) = answer(&topo.node, &out, &what);
            seen.insert(backend_index(&name, topo.backends.len(), &what));
            assert_eq!(
                peer, client,
                "{what}: not masqueraded, the backend must see the client"
            );
            tries += 1;
        }
        assert_eq!(
            seen.len(),
            topo.backends.len(),
            "{} {proto:?} {dst}: only backends {seen:?} answered in {tries} tries",
            fam_name(f)
        );
    }
}

#[test]
fn numgen_dnat_spreads_tcp_and_udp_over_every_backend_v4() {
    if !require_root("numgen_dnat_spreads_tcp_and_udp_over_every_backend_v4") {
        return;
    }
    numgen_spreads_over_every_backend(Fam::V4);
}

#[test]
fn numgen_dnat_spreads_tcp_and_udp_over_every_backend_v6() {
    if !require_root("numgen_dnat_spreads_tcp_and_udp_over_every_backend_v6") {
        return;
    }
    numgen_spreads_over_every_backend(Fam::V6);
}

// ---- 2. masquerade ---------------------------------------------------------------------------

#[test]
fn masquerade_shows_node_address_and_no_masquerade_keeps_client_address() {
    if !require_root("masquerade_shows_node_address_and_no_masquerade_keeps_client_address") {
        return;
    }
    let topo = Topology::new(3);
    let mut tables = Vec::new();
    let mut servers = Vec::new();
    for f in [Fam::V4, Fam::V6] {
        servers.extend(start_backends(&topo, f));
        assert_only_dnat_reaches_backends(&topo, f, 80);
        let services = masq_and_keep_services(&topo, f);
        tables.push(lb_table(f, "nodelb", &[node_addr(&topo, f)], &services));
    }
    program(&topo.node, &tables);

    for f in [Fam::V4, Fam::V6] {
        let node = node_addr(&topo, f);
        let client = client_addr(&topo, f);
        for (proto, masq_port, keep_port) in [(L4Proto::Tcp, 80, 81), (L4Proto::Udp, 53, 54)] {
            let dst = SocketAddr::new(node, masq_port);
            let what = format!("{} {proto:?} {dst} (masquerade)", fam_name(f));
            for (i, peer) in answers(&topo, &topo.client, proto, dst, 6, &what) {
                // Masquerade takes the address of the interface towards the chosen backend.
                assert_eq!(
                    peer,
                    node_toward_backend(&topo, f, i),
                    "{what}: backend b{i} saw the wrong source"
                );
            }
            let dst = SocketAddr::new(node, keep_port);
            let what = format!("{} {proto:?} {dst} (no masquerade)", fam_name(f));
            for (i, peer) in answers(&topo, &topo.client, proto, dst, 6, &what) {
                assert_eq!(peer, client, "{what}: backend b{i} saw the wrong source");
            }
        }
    }
}

// ---- 3. loadBalancerSourceRanges -------------------------------------------------------------

#[test]
fn source_range_drops_disallowed_client_and_passes_allowed_one() {
    if !require_root("source_range_drops_disallowed_client_and_passes_allowed_one") {
        return;
    }
    let mut topo = Topology::new(2);
    let other = topo.add_client("other", "192.0.2.0/24", "2001:db8:d::/64");
    // Both clients talk to the same node address (the one facing the first client), so the
    // source address is the only difference between them.
    route(
        topo.extra_client(other),
        "203.0.113.0/24",
        &topo.node_v4_toward_extra_client(other).to_string(),
    );
    route(
        topo.extra_client(other),
        "2001:db8:c::/64",
        &topo.node_v6_toward_extra_client(other).to_string(),
    );

    let mut tables = Vec::new();
    let mut servers = Vec::new();
    for f in [Fam::V4, Fam::V6] {
        servers.extend(start_backends(&topo, f));
        let allowed = vec![host_prefix(client_addr(&topo, f))];
        let mut restricted_tcp = service(
            "default/restricted:tcp",
            L4Proto::Tcp,
            80,
            all_backends(&topo, f),
            false,
        );
        restricted_tcp.source_ranges = allowed.clone();
        let mut restricted_udp = service(
            "default/restricted:udp",
            L4Proto::Udp,
            53,
            all_backends(&topo, f),
            false,
        );
        restricted_udp.source_ranges = allowed;
        // Control: the same backends without a source range, so the disallowed client is shown
        // to have a working path to them.
        let open_tcp = service(
            "default/open:tcp",
            L4Proto::Tcp,
            81,
            all_backends(&topo, f),
            false,
        );
        let services = [restricted_tcp, restricted_udp, open_tcp];
        tables.push(lb_table(f, "nodelb", &[node_addr(&topo, f)], &services));
    }
    program(&topo.node, &tables);

    let stranger = topo.extra_client(other);
    for f in [Fam::V4, Fam::V6] {
        let node = node_addr(&topo, f);
        let client = client_addr(&topo, f);
        let stranger_addr = extra_client_addr(&topo, f, other);

        let open = SocketAddr::new(node, 81);
        let what = format!("{} disallowed client -> unrestricted {open}", fam_name(f));
        for (i, peer) in answers(&topo, stranger, L4Proto::Tcp, open, 2, &what) {
            assert_eq!(
                peer, stranger_addr,
                "{what}: backend b{i} saw the wrong source"
            );
        }

        for (proto, port) in [(L4Proto::Tcp, 80), (L4Proto::Udp, 53)] {
            let dst = SocketAddr::new(node, port);
            let what = format!("{} allowed client {proto:?} {dst}", fam_name(f));
            for (i, peer) in answers(&topo, &topo.client, proto, dst, 3, &what) {
                assert_eq!(peer, client, "{what}: backend b{i} saw the wrong source");
            }
            // Dropped, not rejected: the stranger hears nothing at all.
            let out = request(stranger, proto, dst, SILENCE);
            assert_eq!(
                out,
                Outcome::TimedOut,
                "{} disallowed client {proto:?} {dst}\nnode ruleset:\n{}",
                fam_name(f),
                list_ruleset(&topo.node)
            );
        }
    }
}

// ---- 4. Services without endpoints are rejected ----------------------------------------------

#[test]
fn service_without_endpoints_refuses_tcp_with_reset_and_udp_with_icmp_port_unreachable() {
    if !require_root(
        "service_without_endpoints_refuses_tcp_with_reset_and_udp_with_icmp_port_unreachable",
    ) {
        return;
    }
    let topo = Topology::new(1);
    const PORT: u16 = 80;

    // Real listeners on the node itself: without nodelb's reject the client would be answered,
    // so a refusal below cannot be the kernel's "nothing listens here".
    let mut servers = Vec::new();
    for f in [Fam::V4, Fam::V6] {
        let addr = SocketAddr::new(node_addr(&topo, f), PORT);
        servers.push(tcp_server(&topo.node, addr, "node"));
        servers.push(udp_server(&topo.node, addr, "node"));
    }
    for f in [Fam::V4, Fam::V6] {
        let dst = SocketAddr::new(node_addr(&topo, f), PORT);
        let client = client_addr(&topo, f);
        for proto in [L4Proto::Tcp, L4Proto::Udp] {
            assert_eq!(
                request(&topo.client, proto, dst, ANSWER),
                Outcome::Answered(format!("node {client}")),
                "{} {proto:?} {dst} before programming",
                fam_name(f)
            );
        }
        assert_eq!(
            tcp_request(&topo.node, dst, ANSWER),
            Outcome::Answered(format!("node {}", node_addr(&topo, f))),
            "{} node-local TCP {dst} before programming",
            fam_name(f)
        );
    }

    let tables: Vec<Table> = [Fam::V4, Fam::V6]
        .into_iter()
        .map(|f| {
            let services = [
                service("default/empty:tcp", L4Proto::Tcp, PORT, Vec::new(), true),
                service("default/empty:udp", L4Proto::Udp, PORT, Vec::new(), true),
            ];
            lb_table(f, "nodelb", &[node_addr(&topo, f)], &services)
        })
        .collect();
    program(&topo.node, &tables);

    for f in [Fam::V4, Fam::V6] {
        let dst = SocketAddr::new(node_addr(&topo, f), PORT);
        let name = fam_name(f);
        let ruleset = || list_ruleset(&topo.node);
        let out = tcp_request(&topo.client, dst, ANSWER);
        assert_eq!(
            out,
            Outcome::Refused { icmp: None },
            "{name} TCP {dst}: expected a reset\nnode ruleset:\n{}",
            ruleset()
        );
        let out = udp_request(&topo.client, dst, ANSWER);
        assert_eq!(
            out,
            Outcome::Refused {
                icmp: Some(port_unreachable(f))
            },
            "{name} UDP {dst}: expected ICMP port unreachable\nnode ruleset:\n{}",
            ruleset()
        );
        // A client on the node itself: its packets pass the filter output hook (and, over
        // loopback, the input hook as well).
        let out = tcp_request(&topo.node, dst, ANSWER);
        assert_eq!(
            out,
            Outcome::Refused { icmp: None },
            "{name} node-local TCP {dst}: expected a reset\nnode ruleset:\n{}",
            ruleset()
        );
    }

    // The same tables with the input chain emptied (still applied through nodelb): the client
    // is answered by the node's own servers again, so it was the input chain that refused it,
    // and a node-local client is still refused, by the filter-output chain alone.
    let tables: Vec<Table> = tables
        .into_iter()
        .map(|mut t| {
            t.chain_mut("input")
                .expect("lb_table has an input chain")
                .rules
                .clear();
            t
        })
        .collect();
    program(&topo.node, &tables);
    for f in [Fam::V4, Fam::V6] {
        let dst = SocketAddr::new(node_addr(&topo, f), PORT);
        let name = fam_name(f);
        let client = client_addr(&topo, f);
        for proto in [L4Proto::Tcp, L4Proto::Udp] {
            assert_eq!(
                request(&topo.client, proto, dst, ANSWER),
                Outcome::Answered(format!("node {client}")),
                "{name} {proto:?} {dst} without the input chain's rejects"
            );
        }
        let out = tcp_request(&topo.node, dst, ANSWER);
        assert_eq!(
            out,
            Outcome::Refused { icmp: None },
            "{name} node-local TCP {dst}, output chain only: expected a reset\nnode ruleset:\n{}",
            list_ruleset(&topo.node)
        );
        // A local UDP sender learns of the output hook's reject from sendmsg itself: the
        // kernel turns the drop of a locally generated datagram into EPERM.
        let out = udp_request(&topo.node, dst, ANSWER);
        assert!(
            matches!(&out, Outcome::Failed(e) if e.starts_with("EPERM")),
            "{name} node-local UDP {dst}, output chain only: expected EPERM, got {out:?}\nnode ruleset:\n{}",
            list_ruleset(&topo.node)
        );
    }
    drop(servers);
}

// ---- 5. node-local clients -------------------------------------------------------------------

#[test]
fn node_local_client_reaches_service_through_output_hook() {
    if !require_root("node_local_client_reaches_service_through_output_hook") {
        return;
    }
    let topo = Topology::new(2);
    let mut tables = Vec::new();
    let mut servers = Vec::new();
    for f in [Fam::V4, Fam::V6] {
        servers.extend(start_backends(&topo, f));
        let node = node_addr(&topo, f);
        // Nothing on the node listens on the Service ports.
        for port in [80, 81] {
            let dst = SocketAddr::new(node, port);
            assert_eq!(
                tcp_request(&topo.node, dst, ANSWER),
                Outcome::Refused { icmp: None },
                "before programming, node-local {dst}/tcp must be closed"
            );
        }
        let services = masq_and_keep_services(&topo, f);
        tables.push(lb_table(f, "nodelb", &[node], &services));
    }
    program(&topo.node, &tables);

    for f in [Fam::V4, Fam::V6] {
        let node = node_addr(&topo, f);
        for (proto, masq_port, keep_port) in [(L4Proto::Tcp, 80, 81), (L4Proto::Udp, 53, 54)] {
            let dst = SocketAddr::new(node, masq_port);
            let what = format!("{} node-local {proto:?} {dst} (masquerade)", fam_name(f));
            for (i, peer) in answers(&topo, &topo.node, proto, dst, 4, &what) {
                assert_eq!(
                    peer,
                    node_toward_backend(&topo, f, i),
                    "{what}: backend b{i} saw the wrong source"
                );
            }
            // Without masquerade the socket keeps the source it chose for the original
            // destination: the node's client-facing address.
            let dst = SocketAddr::new(node, keep_port);
            let what = format!("{} node-local {proto:?} {dst} (no masquerade)", fam_name(f));
            for (i, peer) in answers(&topo, &topo.node, proto, dst, 4, &what) {
                assert_eq!(peer, node, "{what}: backend b{i} saw the wrong source");
            }
        }
    }
}
