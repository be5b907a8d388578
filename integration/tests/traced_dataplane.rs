//! The tracer against the kernel (rung 3 of the ladder checking rung 1's tool): tables are
//! programmed into a node namespace through nodelb's own netlink batch, and for each probe (a
//! sender, a protocol, a destination) the tracer's every predicted way is turned into what the
//! sender would see: which backend answers and which source it sees, a reset, an ICMP port
//! unreachable, EPERM, or silence. Real requests are then sent until every predicted sight
//! was seen (at least twice, at most 64 times, enough for numgen to show each of up to four
//! endpoints but with chance 4 * (3/4)^64, 4e-8, of missing one). Every sight must have been
//! predicted and every prediction seen; after each request the tracer learns what the kernel
//! did (what its dynamic sets now hold), so ClientIP affinity is traced as it stands.
//!
//! The tables: the planner's (Cluster and Local policy, Local with endpoints only elsewhere,
//! no endpoints, source ranges with and without endpoints, ClientIP affinity, hairpin, the
//! node's own clients, masquerade), a smaller set of them (the load-balancer model: one Service
//! port of each kind), and the planner's reject for new connections only with and without its
//! `ct state new`.
//! Topologies and YAML as `planned_dataplane.rs`'s (`nodelb_integration::planning`).
//!
//! Run as root: `cargo test -p nodelb-integration --test traced_dataplane -- --nocapture`
//! (each test prints how many cases it compared).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use nodelb_core::plan::table::{HAIRPIN_SET, LOCAL_ADDRESSES_SET};
use nodelb_core::vocab::IpFamily;
use nodelb_integration::netns::{require_root, Netns, Topology};
use nodelb_integration::nft::{list_ruleset, nodelb_replace};
use nodelb_integration::planning::*;
use nodelb_integration::traffic::{
    tcp_request, tcp_server, udp_request, udp_server, IcmpError, Outcome, Server,
};
use nodelb_netfilter::trace::{self, Fate, Packet, Snat, Tracer};
use nodelb_netfilter::Table;

/// Deadline for a request predicted to be answered or refused.
const ANSWER: Duration = Duration::from_secs(2);
/// Deadline for a request predicted to get nothing back.
const SILENCE: Duration = Duration::from_secs(1);
const MIN_TRIES: usize = 2;
const MAX_TRIES: usize = 64;
/// A port no Service uses: the node's own server answers it.
const PLAIN: u16 = 9;

/// What a sender sees of one request.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    /// A server's reply: its name (`b<i>`, or `node` on the node itself) and the peer it saw.
    Answered {
        by: String,
        peer: IpAddr,
    },
    /// TCP: ECONNREFUSED (a reset, or an ICMP error).
    Refused,
    /// UDP: an ICMP port unreachable.
    PortUnreachable,
    /// A UDP sender on the node whose datagram its own output rejected.
    NotPermitted,
    Silence,
    Other(String),
}

/// One kind of request: who sends what to where.
struct Probe<'a> {
    what: String,
    from: &'a Netns,
    from_host: bool,
    src: IpAddr,
    proto: Proto,
    dst: SocketAddr,
}

impl Probe<'_> {
    fn packet(&self) -> Packet {
        let p = Packet::new(self.proto.l4(), self.src, self.dst.ip(), self.dst.port());
        match self.from_host {
            true => p.from_host(),
            false => p,
        }
    }

    fn send(&self, timeout: Duration) -> Seen {
        let out = match self.proto {
            Proto::Tcp => tcp_request(self.from, self.dst, timeout),
            Proto::Udp => udp_request(self.from, self.dst, timeout),
        };
        seen(out)
    }
}

fn seen(out: Outcome) -> Seen {
    let unreachable = [
        IcmpError::V4_PORT_UNREACHABLE,
        IcmpError::V6_PORT_UNREACHABLE,
    ];
    match out {
        Outcome::Answered(line) => match line.split_once(' ') {
            Some((by, peer)) => match peer.parse() {
                Ok(peer) => Seen::Answered {
                    by: by.to_string(),
                    peer,
                },
                Err(_) => Seen::Other(line),
            },
            None => Seen::Other(line),
        },
        Outcome::Refused { icmp: None } => Seen::Refused,
        Outcome::Refused { icmp: Some(e) } if unreachable.contains(&e) => Seen::PortUnreachable,
        Outcome::TimedOut => Seen::Silence,
        Outcome::Failed(e) if e.starts_with("EPERM") => Seen::NotPermitted,
        other => Seen::Other(format!("{other:?}")),
    }
}

/// The topology, and the tracer over what its node holds.
struct Lab<'t> {
    topo: &'t Topology,
    tracer: Tracer<'t>,
    cases: usize,
    requests: usize,
    failures: Vec<String>,
}

impl<'t> Lab<'t> {
    fn new(topo: &'t Topology, tables: &'t [Table]) -> Lab<'t> {
        Lab::tracing(topo, tables, tables)
    }

    /// Programs `programmed` and traces `traced` (the same tables, but for a control).
    fn tracing(topo: &'t Topology, programmed: &[Table], traced: &'t [Table]) -> Lab<'t> {
        if let Err(e) = nodelb_replace(&topo.node, programmed) {
            panic!("nodelb_replace in {}: {e} ({e:?})", topo.node.name());
        }
        Lab {
            topo,
            tracer: Tracer::new(traced).host(topo.node.addresses()),
            cases: 0,
            requests: 0,
            failures: Vec::new(),
        }
    }

    fn family(&self, p: &Probe) -> IpFamily {
        IpFamily::of(&p.src)
    }

    /// What the sender of `p` sees when the packet goes the way `o` says.
    fn expect(&self, p: &Probe, o: &trace::Outcome) -> Seen {
        let f = self.family(p);
        match (o.fate, o.dnat) {
            (Fate::Dropped, _) => Seen::Silence,
            (Fate::Rejected(_), _) if p.proto == Proto::Tcp => Seen::Refused,
            (Fate::Rejected(_), _) if p.from_host => Seen::NotPermitted,
            (Fate::Rejected(_), _) => Seen::PortUnreachable,
            (Fate::Accepted, Some(to)) => {
                let Some(i) = (0..self.topo.backends.len())
                    .find(|i| SocketAddr::new(backend_addr(self.topo, f, *i), BACKEND_PORT) == to)
                else {
                    return Seen::Other(format!("DNAT to {to}, which is no backend"));
                };
                let peer = match o.snat {
                    None => p.src,
                    Some(Snat::Masquerade { .. }) => node_toward_backend(self.topo, f, i),
                    Some(Snat::To(addr, _)) => addr,
                };
                Seen::Answered {
                    by: format!("b{i}"),
                    peer,
                }
            }
            (Fate::Accepted, None) if o.delivered_to_host() => Seen::Answered {
                by: "node".into(),
                peer: p.src,
            },
            (Fate::Accepted, None) => Seen::Other("forwarded untranslated".into()),
        }
    }

    /// The tracer's prediction for `p`, as sights, with the way that leads to each.
    fn predict(&self, p: &Probe) -> Result<BTreeMap<Seen, trace::Outcome>, String> {
        let packet = p.packet();
        let out = self
            .tracer
            .trace(&packet)
            .map_err(|e| format!("{}: tracing {packet}: {e}", p.what))?;
        Ok(out.iter().map(|o| (self.expect(p, o), o.clone())).collect())
    }

    /// Sends `p` until every predicted sight was seen; notes any disagreement.
    fn check(&mut self, p: Probe) {
        self.cases += 1;
        let mut observed = BTreeSet::new();
        for tries in 0.. {
            let predicted = match self.predict(&p) {
                Ok(predicted) => predicted,
                Err(e) => return self.failures.push(e),
            };
            let all_seen = predicted.keys().all(|s| observed.contains(s));
            if tries >= MIN_TRIES && all_seen {
                return;
            }
            if tries == MAX_TRIES {
                let want: Vec<&Seen> = predicted.keys().collect();
                return self.failures.push(format!(
                    "{}: predicted {want:?}, saw only {observed:?} in {tries} requests",
                    p.what
                ));
            }
            let silent = predicted.keys().all(|s| *s == Seen::Silence);
            let got = p.send(if silent { SILENCE } else { ANSWER });
            self.requests += 1;
            let Some(way) = predicted.get(&got) else {
                let ways: Vec<String> = predicted.values().map(|o| o.to_string()).collect();
                return self.failures.push(format!(
                    "{}: saw {got:?}; the tracer predicted\n  {}",
                    p.what,
                    ways.join("\n  ")
                ));
            };
            self.tracer.learn(way);
            observed.insert(got);
        }
    }

    /// Panics with every disagreement, or prints how many cases agreed.
    fn finish(self, name: &str) {
        if !self.failures.is_empty() {
            panic!(
                "{name}: the tracer and the kernel disagree on {} of {} cases:\n{}\nnode ruleset:\n{}",
                self.failures.len(),
                self.cases,
                self.failures.join("\n"),
                list_ruleset(&self.topo.node)
            );
        }
        assert!(self.cases > 0, "{name}: no case compared");
        println!(
            "{name}: tracer and kernel agree on {} cases ({} requests)",
            self.cases, self.requests
        );
    }
}

/// TCP and UDP servers named `b<i>` on every backend's `BACKEND_PORT`, and `node` servers on
/// the node's client-facing addresses at `node_ports` (so a packet the tables let through to
/// the node is answered, not refused by a closed port: a refusal is the tables').
fn start_servers(topo: &Topology, node_ports: &[(Proto, u16)]) -> Vec<Server> {
    let mut servers = Vec::new();
    for f in FAMILIES {
        for (i, ns) in topo.backends.iter().enumerate() {
            let addr = SocketAddr::new(backend_addr(topo, f, i), BACKEND_PORT);
            servers.push(tcp_server(ns, addr, &format!("b{i}")));
            servers.push(udp_server(ns, addr, &format!("b{i}")));
        }
        for (proto, port) in node_ports {
            let addr = SocketAddr::new(node_addr(topo, f), *port);
            servers.push(match proto {
                Proto::Tcp => tcp_server(&topo.node, addr, "node"),
                Proto::Udp => udp_server(&topo.node, addr, "node"),
            });
        }
    }
    servers
}

/// A probe from `from` (whose address in family `f` is `src`) to the node's port.
fn probe<'a>(
    what: &str,
    from: &'a Netns,
    src: IpAddr,
    (proto, port): (Proto, u16),
    topo: &Topology,
) -> Probe<'a> {
    let dst = SocketAddr::new(node_addr(topo, IpFamily::of(&src)), port);
    Probe {
        what: format!("{what}: {proto:?} {src} -> {dst}"),
        from,
        from_host: from.name() == topo.node.name(),
        src,
        proto,
        dst,
    }
}

const WEB: [(Proto, u16); 2] = [(Proto::Tcp, 80), (Proto::Udp, 53)];
const LOCAL: [(Proto, u16); 2] = [(Proto::Tcp, 81), (Proto::Udp, 54)];
const REMOTE: [(Proto, u16); 2] = [(Proto::Tcp, 82), (Proto::Udp, 55)];
const EMPTY: [(Proto, u16); 2] = [(Proto::Tcp, 83), (Proto::Udp, 56)];
const RANGED: [(Proto, u16); 2] = [(Proto::Tcp, 84), (Proto::Udp, 57)];
const RANGED_EMPTY: [(Proto, u16); 2] = [(Proto::Tcp, 85), (Proto::Udp, 58)];
const STICKY: [(Proto, u16); 2] = [(Proto::Tcp, 86), (Proto::Udp, 59)];
const SELF: [(Proto, u16); 2] = [(Proto::Tcp, 87), (Proto::Udp, 60)];
const UNUSED: [(Proto, u16); 2] = [(Proto::Tcp, PLAIN), (Proto::Udp, PLAIN)];

/// Every Service of the planner test, planned for the topology (four backends).
fn planner_tables(topo: &Topology) -> Vec<Table> {
    let n = TOPOLOGY_NODE;
    let services = [
        service("web", "Cluster", &WEB),
        service("local", "Local", &LOCAL),
        service("remote", "Local", &REMOTE),
        service("empty", "Cluster", &EMPTY),
        service("ranged", "Local", &RANGED).spec("loadBalancerSourceRanges", CLIENT_RANGES),
        service("ranged-empty", "Cluster", &RANGED_EMPTY)
            .spec("loadBalancerSourceRanges", CLIENT_RANGES),
        service("sticky", "Cluster", &STICKY).client_ip_affinity(60),
        service("self", "Local", &SELF),
    ];
    let endpoints = [
        slices(topo, "web", &WEB, &[(0, n), (1, "node-b"), (2, "node-c")]),
        slices(topo, "local", &LOCAL, &[(0, n), (1, n), (3, "node-b")]),
        slices(topo, "remote", &REMOTE, &[(2, "node-b"), (3, "node-c")]),
        slices(topo, "empty", &EMPTY, &[]),
        slices(topo, "ranged", &RANGED, &[(0, n)]),
        slices(topo, "ranged-empty", &RANGED_EMPTY, &[]),
        slices(
            topo,
            "sticky",
            &STICKY,
            &[(0, n), (1, "node-b"), (2, "node-c"), (3, "node-d")],
        ),
        slices(topo, "self", &SELF, &[(0, n)]),
    ];
    plan_topology(topo, &services, &endpoints.concat())
}

#[test]
fn the_tracer_agrees_with_the_kernel_on_the_planners_tables() {
    if !require_root("the_tracer_agrees_with_the_kernel_on_the_planners_tables") {
        return;
    }
    let (topo, other) = topology_with_stranger(4);
    let every_port: Vec<(Proto, u16)> = [
        WEB,
        LOCAL,
        REMOTE,
        EMPTY,
        RANGED,
        RANGED_EMPTY,
        STICKY,
        SELF,
        UNUSED,
    ]
    .concat();
    let _servers = start_servers(&topo, &every_port);
    let tables = planner_tables(&topo);
    let mut lab = Lab::new(&topo, &tables);
    let t = &topo;
    let stranger = topo.extra_client(other);
    for f in FAMILIES {
        let (client, node, b0) = (client_addr(t, f), node_addr(t, f), backend_addr(t, f, 0));
        let by_client = [
            WEB,
            LOCAL,
            REMOTE,
            EMPTY,
            RANGED,
            RANGED_EMPTY,
            STICKY,
            UNUSED,
        ];
        for port in by_client.concat() {
            lab.check(probe("client", &t.client, client, port, t));
        }
        let stranger_addr = extra_client_addr(t, f, other);
        for port in [WEB, RANGED, RANGED_EMPTY].concat() {
            lab.check(probe("stranger", stranger, stranger_addr, port, t));
        }
        for port in [WEB, SELF].concat() {
            lab.check(probe("hairpin from b0", &t.backends[0], b0, port, t));
        }
        for port in [WEB, LOCAL, REMOTE, EMPTY].concat() {
            lab.check(probe("the node itself", &t.node, node, port, t));
        }
    }
    lab.finish("planner's tables");
    control_fails_where_the_traced_tables_differ(&topo, &tables);
}

/// The comparison can fail: traced without the hairpin and host-address elements the kernel
/// holds, the tracer is wrong about every hairpin connection to a Local Service and every
/// connection of the node's own to a Local one (masqueraded, or not dropped), and each of
/// those cases must be found to disagree.
fn control_fails_where_the_traced_tables_differ(topo: &Topology, programmed: &[Table]) {
    let mut blind = programmed.to_vec();
    for t in &mut blind {
        for set in [HAIRPIN_SET, LOCAL_ADDRESSES_SET] {
            t.set_mut(set).expect("a planned set").elements.clear();
        }
    }
    let mut lab = Lab::tracing(topo, programmed, &blind);
    let t = topo;
    for f in FAMILIES {
        for port in SELF {
            let b0 = backend_addr(t, f, 0);
            lab.check(probe("control, hairpin", &t.backends[0], b0, port, t));
        }
        for port in [LOCAL, REMOTE].concat() {
            let node = node_addr(t, f);
            lab.check(probe("control, the node itself", &t.node, node, port, t));
        }
    }
    assert_eq!(
        lab.failures.len(),
        lab.cases,
        "control: a tracer blind to the hairpin and host addresses agreed with the kernel on some of\n{}",
        lab.failures.join("\n")
    );
    println!(
        "control: {} cases traced over other tables all disagree",
        lab.cases
    );
}

#[test]
fn the_tracer_agrees_with_the_kernel_on_the_load_balancer_model() {
    if !require_root("the_tracer_agrees_with_the_kernel_on_the_load_balancer_model") {
        return;
    }
    let (topo, other) = topology_with_stranger(3);
    let ports = [
        (Proto::Tcp, 80),
        (Proto::Udp, 53),
        (Proto::Tcp, 83),
        (Proto::Udp, 56),
    ];
    let _servers = start_servers(&topo, &ports);
    let t = &topo;
    let n = TOPOLOGY_NODE;
    // The masqueraded Cluster TCP port with three endpoints, the Local UDP port (not
    // masqueraded) behind source ranges with its endpoint here, and a TCP and a UDP port
    // without endpoints.
    let services = [
        service("web", "Cluster", &ports[..1]),
        service("dns", "Local", &ports[1..2]).spec("loadBalancerSourceRanges", CLIENT_RANGES),
        service("empty", "Cluster", &ports[2..]),
    ];
    let endpoints = [
        slices(
            t,
            "web",
            &ports[..1],
            &[(0, n), (1, "node-b"), (2, "node-c")],
        ),
        slices(t, "dns", &ports[1..2], &[(0, n)]),
    ];
    let tables = plan_topology(t, &services, &endpoints.concat());
    let mut lab = Lab::new(&topo, &tables);
    let stranger = topo.extra_client(other);
    for f in FAMILIES {
        for port in ports {
            lab.check(probe("client", &t.client, client_addr(t, f), port, t));
            lab.check(probe("the node itself", &t.node, node_addr(t, f), port, t));
        }
        let stranger_addr = extra_client_addr(t, f, other);
        for port in [(Proto::Tcp, 80), (Proto::Udp, 53)] {
            lab.check(probe("stranger", stranger, stranger_addr, port, t));
        }
    }
    lab.finish("load-balancer model");
}

/// The node's own connection from a port that is a Service port without endpoints (its
/// ephemeral range pinned to it): the tracer predicts the exchange when it lets the node's
/// packet out untranslated and the reply (an established packet to that port) in; the kernel
/// answers or stays silent. With the planner's reject (new connections only) and without its
/// `ct state new`.
#[test]
fn the_tracer_agrees_with_the_kernel_on_replies_to_the_nodes_own_connections() {
    if !require_root("the_tracer_agrees_with_the_kernel_on_replies_to_the_nodes_own_connections") {
        return;
    }
    const PINNED: u16 = 40080;
    let topo = Topology::new(1);
    topo.node.sh(&format!(
        "sysctl -qw net.ipv4.ip_local_port_range='{PINNED} {PINNED}'"
    ));
    let pinned = [(Proto::Tcp, PINNED), (Proto::Udp, PINNED)];
    let idle = [service("idle", "Cluster", &pinned)];
    let planned = plan_topology(&topo, &idle, &slices(&topo, "idle", &pinned, &[]));
    let variants = [
        ("new connections only", planned.clone(), 9000),
        ("every packet", rejects_on_every_packet(&planned), 9001),
    ];
    let mut servers = Vec::new();
    for f in FAMILIES {
        for (_, _, port) in &variants {
            let addr = SocketAddr::new(client_addr(&topo, f), *port);
            servers.push(tcp_server(&topo.client, addr, "client"));
            servers.push(udp_server(&topo.client, addr, "client"));
        }
    }
    for (variant, tables, port) in &variants {
        let mut lab = Lab::new(&topo, tables);
        for f in FAMILIES {
            let (node, client) = (node_addr(&topo, f), client_addr(&topo, f));
            for proto in [Proto::Tcp, Proto::Udp] {
                let what = format!("{variant}: {proto:?} {node}:{PINNED} -> {client}:{port}");
                let out = Packet::new(proto.l4(), node, client, *port)
                    .sport(PINNED)
                    .from_host();
                let reply = Packet::new(proto.l4(), client, node, PINNED)
                    .sport(*port)
                    .established();
                let through = |p: &Packet| lab.tracer.trace(p).map_err(|e| format!("{p}: {e}"));
                let want = match (through(&out), through(&reply)) {
                    (Ok(o), Ok(r))
                        if o.accepted()
                            && o.endpoints().is_empty()
                            && !o.sometimes_masqueraded()
                            && r.delivered_to_host() =>
                    {
                        Seen::Answered {
                            by: "client".into(),
                            peer: node,
                        }
                    }
                    (Ok(_), Ok(_)) => Seen::Silence,
                    (Err(e), _) | (_, Err(e)) => {
                        lab.failures.push(format!("{what}: {e}"));
                        continue;
                    }
                };
                let timeout = if want == Seen::Silence {
                    SILENCE
                } else {
                    ANSWER
                };
                let dst = SocketAddr::new(client, *port);
                let got = match proto {
                    Proto::Tcp => seen(tcp_request(&topo.node, dst, timeout)),
                    Proto::Udp => seen(udp_request(&topo.node, dst, timeout)),
                };
                lab.cases += 1;
                lab.requests += 1;
                if got != want {
                    lab.failures.push(format!(
                        "{what}: saw {got:?}, the tracer predicted {want:?}"
                    ));
                }
            }
        }
        lab.finish(&format!(
            "replies to the node's own connections, reject on {variant}"
        ));
    }
    drop(servers);
}
