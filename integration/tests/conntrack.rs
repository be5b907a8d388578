//! Conntrack cleanup with real traffic: the planner (with memory, as the sync loop runs it)
//! plans each change, its tables go to the node namespace through the committer, and its stale
//! flows are deleted through the agent's own cleanup (`host::conntrack::delete_stale`) in the
//! node namespace; clients keep their source port, as DNS resolvers, syslog or WireGuard do.
//!
//! Each test first shows the kernel's behaviour without the cleanup (the flow stays where
//! conntrack put it), so it fails if the cleanup deletes nothing; then that after the cleanup
//! the flow reaches what the rules say, while the endpoint that left still answers.
//!
//! UDP over IPv4 and IPv6; SCTP over IPv4 through raw sockets (this kernel tracks and NATs
//! SCTP but has no SCTP sockets); TCP, whose entries nodelb never deletes.
//!
//! Run as root: `cargo test -p nodelb-integration --test conntrack`.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nodelb_agent::host::conntrack::{delete_stale, Cleaned};
use nodelb_core::fixtures::{Ep, Slice, Svc};
use nodelb_core::plan::config::Config;
use nodelb_core::plan::flows::FlowChange;
use nodelb_core::plan::node::{AddressKind, NodeInfo};
use nodelb_core::plan::{Context, Objects, Planner, TableChange};
use nodelb_core::vocab::{Families, IpFamily, Protocol, ServiceKey};
use nodelb_integration::commit::replace;
use nodelb_integration::e2e::wait_for;
use nodelb_integration::netns::{require_root, Topology};
use nodelb_integration::sctp::{self, sctp_backend, SctpBackend, SctpClient, SctpEvent};
use nodelb_integration::traffic::{
    tcp_echo_server, udp_request, udp_server, Heard, Outcome, Server, TcpSession, UdpFlow,
};
use nodelb_netfilter::conntrack::{Conntrack, Entry};
use nodelb_netfilter::{Commit, Committer, Family, L4Proto, Nft};

const NODE: &str = "node-a";
/// The port every backend server listens on (the slices' target port).
const BACKEND_PORT: u16 = 8053;
/// How often a flow's client sends.
const INTERVAL: Duration = Duration::from_millis(100);
/// Long enough for a flow to have been answered several times.
const A_WHILE: Duration = Duration::from_secs(1);
/// Bound for waiting on what must happen.
const DEADLINE: Duration = Duration::from_secs(5);
const ANSWER: Duration = Duration::from_secs(2);

/// The topology's node, planned and programmed as the agent's sync loop does it.
struct Node {
    topo: Topology,
    objects: Objects,
    ctx: Context,
    planner: Planner,
    committer: Committer,
}

impl Node {
    /// A node with `backends` backends, nothing programmed yet.
    fn new(backends: usize) -> Node {
        let topo = Topology::new(backends);
        let node = NodeInfo {
            name: NODE.into(),
            labels: [("kubernetes.io/hostname".to_string(), NODE.to_string())].into(),
            addresses: vec![
                (AddressKind::InternalIP, topo.node_v4().into()),
                (AddressKind::InternalIP, topo.node_v6().into()),
            ],
        };
        let local = topo.node.addresses();
        let ctx = Context::new(
            node,
            local,
            Families { v4: true, v6: true },
            Config::default(),
        );
        let committer = topo
            .node
            .run(|| Committer::new(Nft::open().expect("a netfilter socket in the node")));
        Node {
            topo,
            objects: Objects::default(),
            ctx,
            planner: Planner::new(),
            committer,
        }
    }

    /// Puts `services` and `slices`, plans, commits; returns the flows the update made stale
    /// (not yet deleted).
    fn apply(&mut self, services: &[Svc], slices: &[Slice]) -> FlowChange {
        let mut dirty: BTreeSet<ServiceKey> = BTreeSet::new();
        for s in services {
            dirty.extend(self.objects.put_service(Arc::new(s.index())));
        }
        for s in slices {
            dirty.extend(self.objects.put_slice(Arc::new(s.index())));
        }
        let update = self.planner.update(&self.objects, &self.ctx, Some(&dirty));
        match update.change {
            TableChange::Rebuild => {
                replace(&mut self.committer, self.planner.tables()).expect("replace");
            }
            TableChange::Edit(edits) => {
                self.committer
                    .commit(Commit::edit(edits))
                    .unwrap_or_else(|e| panic!("commit: {e:?}"));
            }
        }
        update.flows
    }

    /// Deletes the stale flows of `change` in the node namespace, as the agent does after a
    /// commit.
    fn clean(&self, change: &FlowChange) -> Vec<Cleaned> {
        let stale = change.stale();
        self.topo.node.run(move || {
            let mut ct = Conntrack::open().expect("a ctnetlink socket in the node");
            delete_stale(&mut ct, &stale).expect("conntrack cleanup")
        })
    }

    /// The node's conntrack entries of one family and protocol.
    fn entries(&self, family: Family, protocol: L4Proto) -> Vec<Entry> {
        self.topo.node.run(move || {
            Conntrack::open()
                .expect("a ctnetlink socket in the node")
                .dump(family, protocol)
                .expect("conntrack dump")
        })
    }

    fn node_addr(&self, f: IpFamily) -> IpAddr {
        match f {
            IpFamily::V4 => self.topo.node_v4().into(),
            IpFamily::V6 => self.topo.node_v6().into(),
        }
    }

    fn client_addr(&self, f: IpFamily) -> IpAddr {
        match f {
            IpFamily::V4 => self.topo.client_v4().into(),
            IpFamily::V6 => self.topo.client_v6().into(),
        }
    }

    fn backend_addr(&self, f: IpFamily, i: usize) -> IpAddr {
        match f {
            IpFamily::V4 => self.topo.backend_v4(i).into(),
            IpFamily::V6 => self.topo.backend_v6(i).into(),
        }
    }

    /// Deleted entries per (family, protocol) of a cleanup.
    fn deleted(cleaned: &[Cleaned], f: IpFamily, p: Protocol) -> usize {
        cleaned
            .iter()
            .filter(|c| c.family == f && c.protocol == p)
            .map(|c| c.deleted)
            .sum()
    }
}

/// A dual-stack LoadBalancer Service `default/<name>` with one port `p` of `protocol`.
fn service(name: &str, protocol: &str, port: u16) -> Svc {
    Svc::lb("default", name)
        .created("2024-01-01T00:00:00Z")
        .dual_stack()
        .port("p", port, protocol)
}

/// The IPv4 and IPv6 slices of `default/<name>`: port `p` → `BACKEND_PORT` on these backends.
fn slices(n: &Node, name: &str, protocol: &str, backends: &[usize]) -> Vec<Slice> {
    [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .map(|f| {
            let endpoints = backends
                .iter()
                .map(|i| Ep::at(n.backend_addr(f, *i)).node(NODE));
            Slice::of("default", &format!("{name}-{f}"), name, &f.to_string())
                .port("p", BACKEND_PORT, protocol)
                .endpoints(endpoints)
        })
        .collect()
}

/// UDP servers `b<i>` on every backend, both families.
fn udp_backends(n: &Node) -> Vec<Server> {
    let mut out = Vec::new();
    for (i, ns) in n.topo.backends.iter().enumerate() {
        for f in [IpFamily::V4, IpFamily::V6] {
            let addr = SocketAddr::new(n.backend_addr(f, i), BACKEND_PORT);
            out.push(udp_server(ns, addr, &format!("b{i}")));
        }
    }
    out
}

/// The server name of a reply "<name> <peer>".
fn name_of(reply: &str) -> &str {
    reply.split_whitespace().next().unwrap_or_default()
}

/// Waits until `flow` has heard a reply from `backend` after `since`; returns when.
fn wait_reply_from(flow: &UdpFlow, backend: &str, since: Instant, what: &str) -> Instant {
    wait_for(&format!("{what}: a reply from {backend}"), DEADLINE, || {
        let replies = flow.replies_since(since);
        match replies.iter().find(|(_, r)| name_of(r) == backend) {
            Some((t, _)) => Ok(*t),
            None => Err(format!(
                "heard {:?}",
                replies.iter().rev().take(5).collect::<Vec<_>>()
            )),
        }
    })
}

/// The names of the servers that replied to `flow` in `[from, to)`.
fn repliers(flow: &UdpFlow, from: Instant, to: Instant) -> Vec<String> {
    flow.replies_since(from)
        .into_iter()
        .filter(|(t, _)| *t < to)
        .map(|(_, r)| name_of(&r).to_string())
        .collect()
}

/// The backend's own server, asked directly from the node (which routes to it).
fn still_answers(n: &Node, f: IpFamily, i: usize) {
    let dst = SocketAddr::new(n.backend_addr(f, i), BACKEND_PORT);
    match udp_request(&n.topo.node, dst, ANSWER) {
        Outcome::Answered(r) if name_of(&r) == format!("b{i}") => {}
        other => panic!("b{i} must still answer at {dst}: {other:?}"),
    }
}

#[test]
fn a_udp_client_keeping_its_port_reaches_the_other_endpoint_once_the_removed_ones_entries_go() {
    if !require_root(
        "a_udp_client_keeping_its_port_reaches_the_other_endpoint_once_the_removed_ones_entries_go",
    ) {
        return;
    }
    let mut n = Node::new(2);
    let _servers = udp_backends(&n);
    // `dns` on UDP 53 and `other` on UDP 54, both on b0.
    let start = n.apply(
        &[service("dns", "UDP", 53), service("other", "UDP", 54)],
        &[
            slices(&n, "dns", "UDP", &[0]),
            slices(&n, "other", "UDP", &[0]),
        ]
        .concat(),
    );
    assert!(
        n.clean(&start).iter().all(|c| c.deleted == 0),
        "nothing to delete yet"
    );

    // Per family, a client on a fixed port to `dns`, and from the same port to `other`.
    let flows: Vec<(IpFamily, UdpFlow, UdpFlow)> = [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .map(|f| {
            let src = SocketAddr::new(n.client_addr(f), 40053);
            let dns = UdpFlow::start(
                &n.topo.client,
                src,
                SocketAddr::new(n.node_addr(f), 53),
                INTERVAL,
            );
            let other = UdpFlow::start(
                &n.topo.client,
                src,
                SocketAddr::new(n.node_addr(f), 54),
                INTERVAL,
            );
            (f, dns, other)
        })
        .collect();
    let t0 = Instant::now();
    for (f, dns, other) in &flows {
        wait_reply_from(dns, "b0", t0, &format!("{f} dns before"));
        wait_reply_from(other, "b0", t0, &format!("{f} other before"));
    }
    let other_ids: Vec<Option<u32>> = n
        .entries(Family::Ip, L4Proto::Udp)
        .iter()
        .filter(|e| e.original.dst.port() == 54)
        .map(|e| e.id)
        .collect();
    assert_eq!(other_ids.len(), 1, "one entry for `other`'s flow");

    // b0 leaves `dns` (b1 replaces it): the rules change, but conntrack keeps the flow on b0.
    let change = n.apply(&[], &slices(&n, "dns", "UDP", &[1]));
    let committed = Instant::now();
    std::thread::sleep(A_WHILE);
    for (f, dns, _) in &flows {
        let heard = repliers(dns, committed, Instant::now());
        assert!(
            heard.len() >= 5 && heard.iter().all(|r| r == "b0"),
            "{f}: without the cleanup the flow stays on the endpoint that left: {heard:?}"
        );
    }

    // The cleanup deletes exactly the flow's entry in each family.
    let cleaned_at = Instant::now();
    let cleaned = n.clean(&change);
    let done = Instant::now();
    println!(
        "measured: cleanup (socket, dump and delete, both families) {:.1} ms: {cleaned:?}",
        done.duration_since(cleaned_at).as_secs_f64() * 1e3
    );
    for f in [IpFamily::V4, IpFamily::V6] {
        assert_eq!(
            Node::deleted(&cleaned, f, Protocol::Udp),
            1,
            "{f}: {cleaned:?}"
        );
    }
    for (f, dns, other) in &flows {
        let switched = wait_reply_from(dns, "b1", cleaned_at, &format!("{f} dns after"));
        println!(
            "measured: {f}: first reply from b1 {:.0} ms after the cleanup",
            switched.duration_since(cleaned_at).as_secs_f64() * 1e3
        );
        std::thread::sleep(A_WHILE);
        // At most one reply from b0 was on its way when the cleanup ended.
        let after = repliers(dns, done, Instant::now());
        let b0 = after.iter().filter(|r| *r == "b0").count();
        assert!(
            b0 <= 1 && after.len() >= 5,
            "{f}: after the cleanup: {after:?}"
        );
        assert!(after.iter().skip(b0).all(|r| r == "b1"), "{f}: {after:?}");
        // `other` still goes to b0, on the same client port: its entry was not touched.
        let kept = repliers(other, done, Instant::now());
        assert!(
            kept.len() >= 5 && kept.iter().all(|r| r == "b0"),
            "{f}: other: {kept:?}"
        );
        // The endpoint that left is alive and answers: only the entries moved the flow.
        still_answers(&n, *f, 0);
    }
    let other_after: Vec<Option<u32>> = n
        .entries(Family::Ip, L4Proto::Udp)
        .iter()
        .filter(|e| e.original.dst.port() == 54)
        .map(|e| e.id)
        .collect();
    assert_eq!(other_after, other_ids, "`other`'s entry is the same one");
}

#[test]
fn a_udp_port_that_gets_endpoints_deletes_the_entries_made_before() {
    if !require_root("a_udp_port_that_gets_endpoints_deletes_the_entries_made_before") {
        return;
    }
    let mut n = Node::new(1);
    let _servers = udp_backends(&n);
    n.apply(&[], &[]);
    let dst = SocketAddr::new(n.node_addr(IpFamily::V4), 55);
    let flow = UdpFlow::start(
        &n.topo.client,
        SocketAddr::new(n.client_addr(IpFamily::V4), 40055),
        dst,
        INTERVAL,
    );
    // Nothing on the node's port 55: refused, and conntrack notes the flow, not DNATed.
    let refused = |since: Instant| {
        flow.heard()
            .iter()
            .filter(|(t, h)| *t >= since && *h == Heard::Refused)
            .count()
    };
    std::thread::sleep(A_WHILE);
    assert!(refused(Instant::now() - A_WHILE) >= 5, "{:?}", flow.heard());

    // The Service appears without endpoints (nodelb rejects), then gets one. A flow that
    // starts while nodelb rejects leaves no entry: the reject comes before conntrack confirms.
    let rejecting = n.apply(
        &[service("late", "UDP", 55)],
        &slices(&n, "late", "UDP", &[]),
    );
    assert!(rejecting.stale().is_empty(), "{rejecting:?}");
    let rejected = UdpFlow::start(
        &n.topo.client,
        SocketAddr::new(n.client_addr(IpFamily::V4), 40056),
        dst,
        INTERVAL,
    );
    std::thread::sleep(A_WHILE);
    let heard = rejected.heard();
    assert!(
        heard.len() >= 5 && heard.iter().all(|(_, h)| *h == Heard::Refused),
        "{heard:?}"
    );
    let entries = n.entries(Family::Ip, L4Proto::Udp);
    assert!(
        entries.iter().all(|e| e.original.src.port() != 40056)
            && entries.iter().any(|e| e.original.src.port() == 40055),
        "{entries:?}"
    );
    drop(rejected);
    let change = n.apply(&[], &slices(&n, "late", "UDP", &[0]));
    let committed = Instant::now();
    std::thread::sleep(A_WHILE);
    assert!(
        repliers(&flow, committed, Instant::now()).is_empty() && refused(committed) >= 5,
        "without the cleanup the flow keeps its entry of before: {:?}",
        flow.heard().iter().rev().take(5).collect::<Vec<_>>()
    );

    let cleaned_at = Instant::now();
    let cleaned = n.clean(&change);
    assert_eq!(
        Node::deleted(&cleaned, IpFamily::V4, Protocol::Udp),
        1,
        "{cleaned:?}"
    );
    let reached = wait_reply_from(&flow, "b0", cleaned_at, "after the cleanup");
    println!(
        "measured: first reply from b0 {:.0} ms after the cleanup",
        reached.duration_since(cleaned_at).as_secs_f64() * 1e3
    );
}

#[test]
fn an_established_tcp_connection_to_a_removed_endpoint_is_not_cut() {
    if !require_root("an_established_tcp_connection_to_a_removed_endpoint_is_not_cut") {
        return;
    }
    let mut n = Node::new(2);
    let mut servers = Vec::new();
    for (i, ns) in n.topo.backends.iter().enumerate() {
        let addr = SocketAddr::new(n.backend_addr(IpFamily::V4, i), BACKEND_PORT);
        servers.push(tcp_echo_server(ns, addr, &format!("b{i}")));
    }
    n.apply(
        &[service("web", "TCP", 80)],
        &slices(&n, "web", "TCP", &[0]),
    );
    let dst = SocketAddr::new(n.node_addr(IpFamily::V4), 80);
    let mut session = TcpSession::connect(&n.topo.client, dst, ANSWER).expect("connect");
    assert_eq!(name_of(&session.ask().expect("first answer")), "b0");

    // b0 leaves; whatever the cleanup is handed, TCP is not in it.
    let change = n.apply(&[], &slices(&n, "web", "TCP", &[1]));
    assert!(change.stale().is_empty(), "{change:?}");
    let cleaned = n.clean(&change);
    assert!(cleaned.is_empty(), "{cleaned:?}");
    for k in 0..10 {
        let a = session
            .ask()
            .unwrap_or_else(|e| panic!("the connection to b0 was cut at exchange {k}: {e}"));
        assert_eq!(name_of(&a), "b0");
        std::thread::sleep(INTERVAL);
    }
    // A new connection takes the endpoint of now.
    let mut fresh = TcpSession::connect(&n.topo.client, dst, ANSWER).expect("connect again");
    assert_eq!(name_of(&fresh.ask().expect("answer")), "b1");
}

/// Waits until `client` has a HEARTBEAT-ACK from `backend` after `since`; returns when.
fn wait_ack_from(client: &SctpClient, backend: &str, since: Instant, what: &str) -> Instant {
    wait_for(
        &format!("{what}: a HEARTBEAT-ACK from {backend}"),
        DEADLINE,
        || match client
            .acks_since(since)
            .into_iter()
            .find(|(_, b)| b == backend)
        {
            Some((t, _)) => Ok(t),
            None => Err(format!(
                "heard {:?}",
                client.events().iter().rev().take(5).collect::<Vec<_>>()
            )),
        },
    )
}

/// SCTP, as UDP: an association that keeps its source port stays on the endpoint it reached
/// until its entry goes. Then its next HEARTBEAT makes a new entry (a "secondary path" to
/// conntrack) to the other endpoint, which does not know the association: its ABORT does not
/// come back (conntrack holds a new entry made by a HEARTBEAT in its HEARTBEAT_SENT state,
/// which takes no ABORT), so the client's heartbeats go unanswered, it gives the association
/// up, and its new one from the same port is with the other endpoint. This kernel
/// tracks and NATs SCTP but has no SCTP sockets, so both ends are raw sockets sending real
/// SCTP packets (`nodelb_integration::sctp`).
#[test]
fn an_sctp_association_keeping_its_port_reaches_the_other_endpoint_once_the_removed_ones_entries_go(
) {
    if !require_root("an_sctp_association_keeping_its_port_reaches_the_other_endpoint_once_the_removed_ones_entries_go") {
        return;
    }
    println!(
        "SCTP sockets in this kernel: {}; the test's SCTP peers are raw sockets",
        sctp::kernel_has_sctp_sockets()
    );
    let mut n = Node::new(2);
    let backends: Vec<SctpBackend> = (0..2)
        .map(|i| {
            sctp_backend(
                &n.topo.backends[i],
                n.topo.backend_v4(i),
                BACKEND_PORT,
                &format!("b{i}"),
            )
        })
        .collect();
    n.apply(
        &[service("assoc", "SCTP", 9132)],
        &slices(&n, "assoc", "SCTP", &[0]),
    );
    let client = SctpClient::start(
        &n.topo.client,
        SocketAddrV4::new(n.topo.client_v4(), 40132),
        SocketAddrV4::new(n.topo.node_v4(), 9132),
        INTERVAL,
    );
    wait_ack_from(
        &client,
        "b0",
        Instant::now() - A_WHILE,
        "the association with b0",
    );

    // b0 leaves: the association's entry keeps it on b0.
    let change = n.apply(&[], &slices(&n, "assoc", "SCTP", &[1]));
    let committed = Instant::now();
    std::thread::sleep(A_WHILE);
    let acks = client.acks_since(committed);
    assert!(
        acks.len() >= 5 && acks.iter().all(|(_, b)| b == "b0"),
        "without the cleanup the association stays on the endpoint that left: {acks:?}"
    );

    let cleaned = n.clean(&change);
    let done = Instant::now();
    assert_eq!(
        Node::deleted(&cleaned, IpFamily::V4, Protocol::Sctp),
        1,
        "{cleaned:?}"
    );
    let switched = wait_ack_from(&client, "b1", done, "the association with b1");
    println!(
        "measured: SCTP association up with b1, first HEARTBEAT-ACK {:.0} ms after the cleanup",
        switched.duration_since(done).as_secs_f64() * 1e3
    );
    let events: Vec<SctpEvent> = client
        .events()
        .into_iter()
        .filter(|(t, _)| *t >= done)
        .map(|(_, e)| e)
        .collect();
    assert!(
        events.contains(&SctpEvent::Failed) && events.contains(&SctpEvent::Up("b1".into())),
        "the old association fails, and the client's next one, from the same port, is with b1: {events:?}"
    );
    // b0 heard nothing of the client since (its packets went to b1).
    let b0_heard = backends[0]
        .received
        .lock()
        .expect("b0's log")
        .iter()
        .filter(|(t, _, _)| *t >= done)
        .count();
    assert!(b0_heard <= 1, "b0 still heard the client {b0_heard} times");
    std::thread::sleep(A_WHILE);
    let after = client.acks_since(switched);
    assert!(
        after.len() >= 5 && after.iter().all(|(_, b)| b == "b1"),
        "{after:?}"
    );
    // b0 still answers SCTP, asked directly from the node.
    let direct = SctpClient::start(
        &n.topo.node,
        SocketAddrV4::new(n.topo.node_v4_toward_backend(0), 40133),
        SocketAddrV4::new(n.topo.backend_v4(0), BACKEND_PORT),
        INTERVAL,
    );
    wait_ack_from(&direct, "b0", Instant::now(), "b0 asked directly");
    drop(backends);
}
