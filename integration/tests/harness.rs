//! Self-tests of the namespace harness and traffic helpers. They need root
//! (see `require_root`) and use only the namespaces they create.

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::process::Command;
use std::time::Duration;

use nodelb_integration::netns::{require_root, route, Netns, Topology, TopologyOptions};
use nodelb_integration::traffic::{
    tcp_request, tcp_request_from, tcp_requests, tcp_server, udp_request, udp_server, IcmpError,
    Outcome,
};

const TIMEOUT: Duration = Duration::from_secs(2);

fn netns_list() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

fn answered(name: &str, peer: impl std::fmt::Display) -> Outcome {
    Outcome::Answered(format!("{name} {peer}"))
}

#[test]
fn netns_is_deleted_on_drop() {
    if !require_root("netns_is_deleted_on_drop") {
        return;
    }
    let ns = Netns::new("drop");
    let name = ns.name().to_owned();
    assert!(name.starts_with(&format!("nlb-{}-", std::process::id())));
    assert!(netns_list().contains(&name));
    drop(ns);
    assert!(!netns_list().contains(&name), "{name} still listed");
}

#[test]
fn netns_is_deleted_when_a_test_panics() {
    if !require_root("netns_is_deleted_when_a_test_panics") {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let result = std::panic::catch_unwind(move || {
        let ns = Netns::new("panic");
        tx.send(ns.name().to_owned()).unwrap();
        // A panic inside `run` reaches the caller and unwinds past `ns`.
        ns.run(|| panic!("boom"));
    });
    assert!(result.is_err());
    let name = rx.recv().unwrap();
    assert!(!netns_list().contains(&name), "{name} survived a panic");
}

#[test]
fn netns_basics() {
    if !require_root("netns_basics") {
        return;
    }
    let ns = Netns::new("basics");
    assert!(ns.sh("ip -o link show lo").contains("UP"));
    assert!(ns.sh_ok("exit 3").is_err());
    // A new namespace copies the host's IPv4 settings; the harness sets its own, so every
    // test starts from the same state whatever the host forwards or filters.
    let sysctl = |name: &str| ns.sh(&format!("sysctl -n {name}")).trim().to_string();
    let host = |name: &str| {
        let path = format!("/proc/sys/{}", name.replace('.', "/"));
        std::fs::read_to_string(&path).unwrap().trim().to_string()
    };
    for name in [
        "net.ipv4.ip_forward",
        "net.ipv6.conf.all.forwarding",
        "net.ipv4.conf.all.rp_filter",
        "net.ipv4.conf.default.rp_filter",
    ] {
        assert_eq!(sysctl(name), "0", "{name} in a new namespace");
    }
    let host_before = (
        host("net.ipv4.ip_forward"),
        host("net.ipv6.conf.all.forwarding"),
    );
    ns.enable_forwarding();
    assert_eq!(sysctl("net.ipv4.ip_forward"), "1");
    assert_eq!(sysctl("net.ipv6.conf.all.forwarding"), "1");
    // Inside the namespace only: the host's own settings are what they were.
    assert_eq!(
        (
            host("net.ipv4.ip_forward"),
            host("net.ipv6.conf.all.forwarding")
        ),
        host_before
    );
    // `run` executes inside the namespace; the caller stays outside.
    let inode = |path: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).unwrap().ino()
    };
    let inside = ns.run(|| inode("/proc/thread-self/ns/net"));
    assert_eq!(inside, inode(ns.path().to_str().unwrap()));
    assert_ne!(inside, inode("/proc/thread-self/ns/net"));
}

#[test]
fn route_refuses_default_and_non_documentation_routes() {
    if !require_root("route_refuses_default_and_non_documentation_routes") {
        return;
    }
    let ns = Netns::new("routes");
    let refusal = |prefix: &str, via: &str| {
        let err = std::panic::catch_unwind(AssertUnwindSafe(|| route(&ns, prefix, via)))
            .expect_err(&format!("route {prefix} via {via} was accepted"));
        match err.downcast::<String>() {
            Ok(msg) => *msg,
            Err(err) => err.downcast_ref::<&str>().unwrap_or(&"").to_string(),
        }
    };
    for (prefix, via) in [
        ("default", "192.0.2.1"),
        ("0.0.0.0/0", "192.0.2.1"),
        ("::/0", "2001:db8::1"),
    ] {
        assert!(refusal(prefix, via).contains("default route"));
    }
    for (prefix, via) in [
        ("10.0.0.0/8", "192.0.2.1"),
        ("192.0.0.0/16", "192.0.2.1"),
        ("2001::/16", "2001:db8::1"),
        ("198.51.100.0/24", "10.0.0.1"),
    ] {
        assert!(refusal(prefix, via).contains("documentation"));
    }
    assert!(
        !ns.sh("ip route; ip -6 route").contains("via"),
        "a refused route was installed"
    );
}

#[test]
fn topology_traffic() {
    if !require_root("topology_traffic") {
        return;
    }
    let topo = Topology::new(2);
    let b4 = topo.backend_v4(0);
    let b6 = topo.backend_v6(0);
    let v4 = |port| SocketAddr::new(b4.into(), port);
    let v6 = |port| SocketAddr::new(b6.into(), port);
    let _tcp4 = tcp_server(&topo.backends[0], v4(8080), "b0");
    let _tcp6 = tcp_server(&topo.backends[0], v6(8080), "b0");
    let _udp4 = udp_server(&topo.backends[0], v4(5353), "b0");
    let _udp6 = udp_server(&topo.backends[0], v6(5353), "b0");

    // (a) The client has no route to the backends.
    for dst in [v4(8080), v6(8080)] {
        let out = tcp_request(&topo.client, dst, TIMEOUT);
        assert!(
            matches!(&out, Outcome::Failed(e) if e.contains("ENETUNREACH")),
            "client -> {dst}: {out:?}"
        );
    }
    for dst in [v4(5353), v6(5353)] {
        let out = udp_request(&topo.client, dst, TIMEOUT);
        assert!(
            !matches!(out, Outcome::Answered(_)),
            "client -> {dst}: {out:?}"
        );
    }

    // (b) From the node the backend answers and sees the node's address.
    let node4 = topo.node_v4_toward_backend(0);
    let node6 = topo.node_v6_toward_backend(0);
    assert_eq!(
        tcp_request(&topo.node, v4(8080), TIMEOUT),
        answered("b0", node4)
    );
    assert_eq!(
        tcp_request(&topo.node, v6(8080), TIMEOUT),
        answered("b0", node6)
    );
    assert_eq!(
        udp_request(&topo.node, v4(5353), TIMEOUT),
        answered("b0", node4)
    );
    assert_eq!(
        udp_request(&topo.node, v6(5353), TIMEOUT),
        answered("b0", node6)
    );

    // (c) UDP to a port without a server: ICMP port unreachable.
    assert_eq!(
        udp_request(&topo.node, v4(9), TIMEOUT),
        Outcome::Refused {
            icmp: Some(IcmpError {
                origin: 2,
                icmp_type: 3,
                code: 3
            })
        }
    );
    assert_eq!(
        udp_request(&topo.node, v6(9), TIMEOUT),
        Outcome::Refused {
            icmp: Some(IcmpError {
                origin: 3,
                icmp_type: 1,
                code: 4
            })
        }
    );

    // (d) TCP to a closed port: RST.
    assert_eq!(
        tcp_request(&topo.node, v4(9), TIMEOUT),
        Outcome::Refused { icmp: None }
    );
    assert_eq!(
        tcp_request(&topo.node, v6(9), TIMEOUT),
        Outcome::Refused { icmp: None }
    );

    // Backend 1 is reachable from the node too, and several requests work.
    let b1 = SocketAddr::new(topo.backend_v4(1).into(), 8080);
    let _tcp_b1 = tcp_server(&topo.backends[1], b1, "b1");
    let node_b1 = topo.node_v4_toward_backend(1);
    assert_eq!(
        tcp_requests(&topo.node, b1, 3, TIMEOUT),
        vec![answered("b1", node_b1); 3]
    );
}

#[test]
fn client_routes_and_extra_clients() {
    if !require_root("client_routes_and_extra_clients") {
        return;
    }
    let mut topo = Topology::with_options(TopologyOptions {
        backends: 1,
        client_routes_to_backends: true,
    });
    let x = topo.add_client("client2", "192.0.2.0/24", "2001:db8:d::/64");
    assert_eq!(topo.extra_client_v4(x).to_string(), "192.0.2.2");
    assert_eq!(topo.extra_client_v6(x).to_string(), "2001:db8:d::2");
    assert_eq!(topo.node_v4_toward_extra_client(x).to_string(), "192.0.2.1");

    let tcp4 = SocketAddr::new(topo.backend_v4(0).into(), 80);
    let tcp6 = SocketAddr::new(topo.backend_v6(0).into(), 80);
    let udp6 = SocketAddr::new(topo.backend_v6(0).into(), 53);
    let _s4 = tcp_server(&topo.backends[0], tcp4, "web");
    let _s6 = tcp_server(&topo.backends[0], tcp6, "web");
    let _u6 = udp_server(&topo.backends[0], udp6, "dns");

    // Routed (not NATed) traffic: the backend sees the clients' addresses.
    assert_eq!(
        tcp_request(&topo.client, tcp4, TIMEOUT),
        answered("web", topo.client_v4())
    );
    assert_eq!(
        tcp_request(&topo.client, tcp6, TIMEOUT),
        answered("web", topo.client_v6())
    );
    assert_eq!(
        udp_request(&topo.client, udp6, TIMEOUT),
        answered("dns", topo.client_v6())
    );
    let c2 = topo.extra_client(x);
    assert_eq!(
        tcp_request(c2, tcp4, TIMEOUT),
        answered("web", topo.extra_client_v4(x))
    );
    assert_eq!(
        tcp_request(c2, tcp6, TIMEOUT),
        answered("web", topo.extra_client_v6(x))
    );

    // A client with a second address can choose its source.
    topo.client
        .ip(&["addr", "add", "203.0.113.3/24", "dev", "eth-node"]);
    assert_eq!(
        tcp_request_from(&topo.client, "203.0.113.3".parse().unwrap(), tcp4, TIMEOUT),
        answered("web", "203.0.113.3")
    );
}

#[test]
fn udp_and_tcp_time_out_when_dropped() {
    if !require_root("udp_and_tcp_time_out_when_dropped") {
        return;
    }
    let topo = Topology::new(1);
    // Silently drop everything to the backend inside its own namespace.
    topo.backends[0].sh("nft 'add table inet t; add chain inet t in { type filter hook input priority 0; policy drop; }'");
    let short = Duration::from_millis(300);
    let dst = SocketAddr::new(topo.backend_v4(0).into(), 80);
    assert_eq!(tcp_request(&topo.node, dst, short), Outcome::TimedOut);
    assert_eq!(udp_request(&topo.node, dst, short), Outcome::TimedOut);
}

#[test]
fn element_watch_reports_what_a_transaction_added_to_its_table() {
    use nodelb_integration::element_watch::{Added, ElementWatch, Seen};
    use nodelb_integration::nft::nft_f;
    if !require_root("element_watch_reports_what_a_transaction_added_to_its_table") {
        return;
    }
    let ns = Netns::new("ewatch");
    let watch = ElementWatch::start(&ns, libc::NFPROTO_IPV4 as u8, "nodelb").unwrap();
    // Another table's transaction is not reported.
    nft_f(
        &ns,
        "table ip other { set s { type ipv4_addr; elements = { 192.0.2.1 }; }; }\n",
    )
    .unwrap();
    // One transaction: the table, the map and an element, the shape of nodelb's endpoint map.
    nft_f(
        &ns,
        "table ip nodelb { map endpoints { typeof meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport; }; }\n\
         add element ip nodelb endpoints { tcp . 1024 . 0 : 198.51.100.20 . 8080 }\n",
    )
    .unwrap();
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while seen.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        seen.extend(watch.drain());
    }
    std::thread::sleep(Duration::from_millis(200));
    seen.extend(watch.drain());
    watch.stop().unwrap();
    let [Seen::Transaction(t)] = seen.as_slice() else {
        panic!("expected one transaction, saw {seen:?}");
    };
    // Each field of a concatenation is padded to 4 bytes; ports are big-endian.
    assert_eq!(
        t.added,
        vec![Added {
            set: "endpoints".into(),
            key: vec![6, 0, 0, 0, 0x04, 0x00, 0, 0, 0, 0, 0, 0],
            data: vec![198, 51, 100, 20, 0x1f, 0x90, 0, 0],
        }]
    );
    // The table, the map and the element.
    assert_eq!(t.events, 3, "{t:?}");
    assert_eq!(t.process.as_deref(), Some("nft"), "{t:?}");
}

/// Issue 39: a load test's connection that needed a SYN retransmit (a second of stall) is a
/// failure, [`Outcome::Slow`], not a success hidden by a 3 s deadline.
#[test]
fn a_connection_answered_after_a_syn_retransmit_counts_as_failed_in_a_load() {
    use nodelb_integration::real_cluster::{TcpLoad, SLOW};
    if !require_root("a_connection_answered_after_a_syn_retransmit_counts_as_failed_in_a_load") {
        return;
    }
    let topo = Topology::new(1);
    let dst = SocketAddr::new(topo.backend_v4(0).into(), 8080);
    let _server = tcp_server(&topo.backends[0], dst, "b0");
    let load = TcpLoad::start(&topo.node, vec![dst], Duration::from_millis(50));
    std::thread::sleep(Duration::from_millis(500));
    // The backend's own namespace drops every SYN for 300 ms: the connections that start then
    // are answered after the client's retransmit, about a second later.
    topo.backends[0].sh(
        "nft 'add table inet t; add chain inet t in { type filter hook input priority 0; }; \
         add rule inet t in tcp flags & (syn | ack) == syn drop'",
    );
    std::thread::sleep(Duration::from_millis(300));
    topo.backends[0].sh("nft delete table inet t");
    std::thread::sleep(Duration::from_millis(1500));
    let report = load.stop();
    println!(
        "measured: {} answered in time, failed: {:?}",
        report.answered.values().sum::<usize>(),
        report.failed
    );
    assert!(
        report.answered.values().sum::<usize>() >= 10,
        "the load ran: {report:?}"
    );
    assert!(
        !report.failed.is_empty()
            && report
                .failed
                .iter()
                .all(|(_, _, o)| matches!(o, Outcome::Slow(t, _) if *t > SLOW)),
        "the connections that waited for a retransmit are failures, and only those: {:?}",
        report.failed
    );
}
