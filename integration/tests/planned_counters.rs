//! Per-Service counters against real traffic: the planner's tables programmed with nodelb's
//! netlink batch in a node namespace, TCP and UDP from a client namespace (and from the node
//! itself) to a backend, over IPv4 and IPv6; then the kernel's counter objects read back the
//! way the agent reads them for `/metrics`.
//!
//! Proves: every connection to a Service port is counted in both directions (forward, and
//! input/output for node-local clients); a full replace resets counters unless they are
//! carried over, and with carrying (what the agent does at start, after drift and failures)
//! they do not go back; an incremental sync never touches them; a blocked source counts into
//! the Service port's drop counter and nothing else does.
//!
//! Run as root: `cargo test -p nodelb-integration --test planned_counters`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use nodelb_agent::metrics::{service_counter_samples, CounterSource, KernelCounters};
use nodelb_core::fixtures::Svc;
use nodelb_core::plan::config::Config;
use nodelb_core::vocab::{Families, IpFamily};
use nodelb_integration::commit::{replace, replace_carrying, sync};
use nodelb_integration::netns::{require_root, Netns, Topology};
use nodelb_integration::planning::*;
use nodelb_integration::traffic::{tcp_request, tcp_server, udp_request, udp_server, Outcome};
use nodelb_netfilter::{Committer, CounterValues, Nft, Table};

const ANSWER: Duration = Duration::from_secs(2);
const SILENCE: Duration = Duration::from_secs(1);
/// Requests per family and protocol.
const N: u64 = 5;
/// `default/web`'s ports.
const WEB: [(Proto, u16); 2] = [(Proto::Tcp, 80), (Proto::Udp, 53)];

/// Backend 0's address: the one endpoint.
fn backend(topo: &Topology, f: IpFamily) -> IpAddr {
    backend_addr(topo, f, 0)
}

/// The planner's tables for `web` (dual-stack `default/web` with ports `tcp-80` and `udp-53`)
/// with one endpoint, backend 0, on this node.
fn planned(topo: &Topology, web: Svc) -> Vec<Table> {
    let endpoints = slices(topo, "web", &WEB, &[(0, TOPOLOGY_NODE)]);
    plan_topology(topo, &[web], &endpoints)
}

/// The node's counters per family, as the agent reads them for `/metrics`.
fn read(node: &Netns) -> Vec<(IpFamily, CounterValues)> {
    node.run(|| {
        KernelCounters {
            config: Config::default(),
            families: Families { v4: true, v6: true },
        }
        .read()
    })
}

/// `(packets, bytes)` of one counter in one family.
fn counter(read: &[(IpFamily, CounterValues)], f: IpFamily, name: &str) -> (u64, u64) {
    let values = &read.iter().find(|(g, _)| *g == f).expect("family read").1;
    *values
        .get(name)
        .unwrap_or_else(|| panic!("{f}: no counter {name} in {values:?}"))
}

fn request_each(topo: &Topology, from: &Netns, n: u64) {
    for f in FAMILIES {
        for k in 0..n {
            let tcp = tcp_request(from, SocketAddr::new(node_addr(topo, f), 80), ANSWER);
            assert!(matches!(tcp, Outcome::Answered(_)), "{f} tcp {k}: {tcp:?}");
            let udp = udp_request(from, SocketAddr::new(node_addr(topo, f), 53), ANSWER);
            assert!(matches!(udp, Outcome::Answered(_)), "{f} udp {k}: {udp:?}");
        }
    }
}

const TCP: &str = "svc/default/web/tcp-80";
const UDP: &str = "svc/default/web/udp-53";

#[test]
fn service_counters_count_every_packet_and_survive_a_full_replace() {
    if !require_root("service_counters_count_every_packet_and_survive_a_full_replace") {
        return;
    }
    let topo = Topology::new(1);
    let mut _servers = Vec::new();
    for f in FAMILIES {
        let addr = SocketAddr::new(backend(&topo, f), BACKEND_PORT);
        _servers.push(tcp_server(&topo.backends[0], addr, "b0"));
        _servers.push(udp_server(&topo.backends[0], addr, "b0"));
    }
    let tables = planned(&topo, service("web", "Cluster", &WEB));
    topo.node
        .run(|| replace(&mut Committer::new(Nft::open().unwrap()), tables.clone()).unwrap());
    let zero = read(&topo.node);
    for f in FAMILIES {
        assert_eq!(counter(&zero, f, TCP), (0, 0), "{f}: nothing sent yet");
    }

    // Remote client, through filter forward: every connection counted both ways.
    request_each(&topo, &topo.client, N);
    let after = read(&topo.node);
    for f in FAMILIES {
        let (tp, tb) = counter(&after, f, TCP);
        let (up, ub) = counter(&after, f, UDP);
        // TCP: at least SYN, SYN-ACK, request and answer per connection; UDP: request and
        // answer. Packets of both directions, so the reply direction is counted too.
        assert!(tp >= 4 * N, "{f}: {tp} TCP packets after {N} connections");
        assert!(up >= 2 * N, "{f}: {up} UDP packets after {N} requests");
        assert!(tb > tp * 40 && ub > up * 20, "{f}: bytes {tb} / {ub}");
    }

    // A node-local client crosses filter output and input instead of forward.
    request_each(&topo, &topo.node, 1);
    let local = read(&topo.node);
    for f in FAMILIES {
        assert!(
            counter(&local, f, TCP).0 >= counter(&after, f, TCP).0 + 4,
            "{f}: node-local connection not counted"
        );
        assert!(counter(&local, f, UDP).0 >= counter(&after, f, UDP).0 + 2);
    }

    // The agent's metrics read the same counters.
    let [packets, bytes, drops] = service_counter_samples(&local);
    assert_eq!(packets.len(), 4, "two ports, two families: {packets:?}");
    assert_eq!(bytes.len(), 4);
    assert!(drops.is_empty(), "no source ranges, no drop counters");
    let v4_tcp = packets
        .iter()
        .find(|(l, _)| l.port == "tcp-80" && l.family == "IPv4")
        .expect("IPv4 tcp-80 sample");
    assert_eq!((v4_tcp.0.namespace, v4_tcp.0.service), ("default", "web"));
    assert_eq!(v4_tcp.1, counter(&local, IpFamily::V4, TCP).0);

    // The kernel holds what the agent committed with carried values; the planner's tables
    // (zero values) synced over them send nothing and reset nothing; a restart's full replace
    // carries them over; without carrying it would reset them.
    let replanned = tables.clone();
    let (synced, carried, reset) = topo.node.run(|| {
        let mut c = Committer::new(Nft::open().unwrap());
        replace(&mut c, tables_with(&local, &tables)).unwrap();
        let stats = sync(&mut c, replanned.clone()).unwrap();
        assert_eq!(stats.messages, 0, "counter values are not a change");
        let synced = counters_now(&mut c);

        let mut restart = Committer::new(Nft::open().unwrap());
        let whole = replace_carrying(&mut restart, replanned.clone()).unwrap();
        assert_eq!(whole.carried, 4);
        let carried = counters_now(&mut restart);

        replace(&mut restart, replanned.clone()).unwrap();
        let reset = counters_now(&mut restart);
        (synced, carried, reset)
    });
    for f in FAMILIES {
        for name in [TCP, UDP] {
            let before = counter(&local, f, name);
            assert!(
                counter(&synced, f, name) >= before,
                "{f} {name}: sync reset it"
            );
            assert!(
                counter(&carried, f, name) >= before,
                "{f} {name}: went back over a carried full replace"
            );
            assert_eq!(
                counter(&reset, f, name),
                (0, 0),
                "{f} {name}: control: an uncarried replace resets"
            );
        }
    }
}

/// The tables, their counters started from `values` (what was counted so far).
fn tables_with(values: &[(IpFamily, CounterValues)], tables: &[Table]) -> Vec<Table> {
    tables
        .iter()
        .map(|t| {
            let mut t = t.clone();
            let f = if t.family == IpFamily::V4.netfilter() {
                IpFamily::V4
            } else {
                IpFamily::V6
            };
            if let Some((_, v)) = values.iter().find(|(g, _)| *g == f) {
                t.seed_counters(v);
            }
            t
        })
        .collect()
}

fn counters_now(c: &mut Committer) -> Vec<(IpFamily, CounterValues)> {
    FAMILIES
        .iter()
        .map(|f| {
            let tr = Config::default().table_ref(*f);
            (*f, c.nft().read_counters(&tr).unwrap())
        })
        .collect()
}

#[test]
fn a_blocked_source_counts_into_the_drop_counter_only() {
    if !require_root("a_blocked_source_counts_into_the_drop_counter_only") {
        return;
    }
    let (topo, other) = topology_with_stranger(1);
    let mut _servers = Vec::new();
    for f in FAMILIES {
        let addr = SocketAddr::new(backend(&topo, f), BACKEND_PORT);
        _servers.push(tcp_server(&topo.backends[0], addr, "b0"));
        _servers.push(udp_server(&topo.backends[0], addr, "b0"));
    }
    // Only the first client's subnets.
    let web = service("web", "Cluster", &WEB).spec("loadBalancerSourceRanges", CLIENT_RANGES);
    let tables = planned(&topo, web);
    topo.node
        .run(|| replace(&mut Committer::new(Nft::open().unwrap()), tables.clone()).unwrap());

    // The allowed client is answered and counted as traffic, never as a drop.
    request_each(&topo, &topo.client, 2);
    let allowed = read(&topo.node);
    for f in FAMILIES {
        assert_eq!(counter(&allowed, f, "drops/default/web/tcp-80"), (0, 0));
        assert!(counter(&allowed, f, TCP).0 >= 8, "{f}");
    }

    let stranger = topo.extra_client(other);
    for f in FAMILIES {
        for _ in 0..N {
            let dst = SocketAddr::new(node_addr(&topo, f), 53);
            assert_eq!(udp_request(stranger, dst, SILENCE), Outcome::TimedOut);
        }
    }
    let blocked = read(&topo.node);
    for f in FAMILIES {
        let (p, b) = counter(&blocked, f, "drops/default/web/udp-53");
        assert!(
            p >= N && b > 0,
            "{f}: {p} packets dropped after {N} requests"
        );
        assert_eq!(counter(&blocked, f, "drops/default/web/tcp-80"), (0, 0));
        assert_eq!(
            counter(&blocked, f, UDP),
            counter(&allowed, f, UDP),
            "{f}: dropped packets are not Service traffic"
        );
    }
    let [_, _, drops] = service_counter_samples(&blocked);
    assert!(drops
        .iter()
        .any(|(l, v)| l.port == "udp-53" && l.family == "IPv6" && *v >= N));
}
