//! The encoder against the reference: the same model applied through nodelb's netlink batch
//! in one namespace and through `nft -f` of its rendered text in another must list the same.

use nodelb_integration::models::{inet_sink, kitchen_sink, Fam};
use nodelb_integration::netns::{require_root, Netns};
use nodelb_integration::nft::{list_table, nft_check, nft_replace, nodelb_replace};
use nodelb_netfilter::{render_replace, Table};

fn assert_same_listing(t: &Table) -> String {
    let ours = Netns::new("diff-ours");
    let theirs = Netns::new("diff-nft");
    let script = render_replace(t);
    nft_check(&theirs, &script)
        .unwrap_or_else(|e| panic!("nft -c rejects the rendered text:\n{e}\n{script}"));
    nodelb_replace(&ours, std::slice::from_ref(t))
        .unwrap_or_else(|e| panic!("nodelb batch failed: {e:#}"));
    nft_replace(&theirs, t).unwrap_or_else(|e| panic!("nft -f failed:\n{e}\n{script}"));
    let fam = t.family.keyword();
    let a = list_table(&ours, fam, &t.name).expect("list nodelb's table");
    let b = list_table(&theirs, fam, &t.name).expect("list nft's table");
    if a != b {
        let diff: Vec<String> = a
            .lines()
            .zip(b.lines())
            .filter(|(x, y)| x != y)
            .map(|(x, y)| format!("nodelb: {x}\n   nft: {y}"))
            .collect();
        panic!(
            "listings differ:\n{}\n--- nodelb ---\n{a}\n--- nft ---\n{b}",
            diff.join("\n")
        );
    }
    // The listing really holds the model, not two empty tables.
    assert!(a.lines().count() > 10, "suspiciously short listing:\n{a}");
    a
}

/// The kitchen sinks' dynamic sets and the rules that fill and read them are in the listing.
fn assert_dynamic_sets_listed(listing: &str) {
    let ip = if listing.contains("table ip6") {
        "ip6"
    } else {
        "ip"
    };
    let addr = if ip == "ip6" {
        "ipv6_addr"
    } else {
        "ipv4_addr"
    };
    for want in [
        format!("set clients {{\n\t\ttype {addr}\n\t\tsize 65535\n\t\tflags dynamic,timeout\n\t\ttimeout 3h\n\t\tcomment \"default/web:http\""),
        format!("set clients-brief {{\n\t\ttypeof {ip} saddr\n\t\tsize 65535\n\t\tflags dynamic,timeout\n\t\ttimeout 2s500ms\n"),
        format!("{ip} saddr @clients counter packets 0 bytes 0 goto svc-b comment \"default/web:http\""),
        format!("update @clients {{ {ip} saddr timeout 3h }} comment \"default/web:http\""),
        format!("update @clients-brief {{ {ip} saddr }}\n"),
        "typeof meta l4proto . th dport . numgen random mod 1 : verdict".into(),
        "tcp . 80 . 1 comment \"default/web:http\" : goto sticky".into(),
        "meta l4proto . th dport . numgen random mod 2 vmap @pick".into(),
        "numgen random mod 3 0 counter packets 0 bytes 0 goto svc-a\n".into(),
    ] {
        assert!(listing.contains(&want), "{want:?} missing from\n{listing}");
    }
}

/// The kitchen sinks' named counters, their seeded values and their counter map are in the
/// listing (not just equal by being absent from both).
fn assert_counters_listed(listing: &str) {
    for want in [
        "counter svc/default/web/http {",
        "packets 42 bytes 4200",
        "counter drops/default/web/http {",
        "type ipv4_addr . inet_proto . inet_service : counter",
        ": \"svc/default/web/http\"",
        "counter name \"drops/default/web/http\" drop",
        "ct original proto-dst map @svc-counters",
    ] {
        let want = if listing.contains("table ip6") {
            want.replace("ipv4_addr", "ipv6_addr")
        } else {
            want.to_string()
        };
        assert!(listing.contains(&want), "{want:?} missing from\n{listing}");
    }
}

/// Both masquerades of the kitchen sinks are in the listing, the fully-random one with its flag.
fn assert_masquerades_listed(listing: &str) {
    for want in [
        "ct status dnat masquerade\n",
        "meta mark & 0x00004000 == 0x00004000 masquerade fully-random\n",
    ] {
        assert!(listing.contains(want), "{want:?} missing from\n{listing}");
    }
}

#[test]
fn ipv4_kitchen_sink_lists_identically() {
    if !require_root("ipv4_kitchen_sink_lists_identically") {
        return;
    }
    let listing = assert_same_listing(&kitchen_sink(Fam::V4, "nodelb"));
    assert_counters_listed(&listing);
    assert_masquerades_listed(&listing);
    assert_dynamic_sets_listed(&listing);
}

#[test]
fn ipv6_kitchen_sink_lists_identically() {
    if !require_root("ipv6_kitchen_sink_lists_identically") {
        return;
    }
    let listing = assert_same_listing(&kitchen_sink(Fam::V6, "nodelb"));
    assert_counters_listed(&listing);
    assert_masquerades_listed(&listing);
    assert_dynamic_sets_listed(&listing);
}

#[test]
fn inet_only_expressions_list_identically() {
    if !require_root("inet_only_expressions_list_identically") {
        return;
    }
    assert_same_listing(&inet_sink("nodelb"));
}

/// The planner's tables (both families) for one Service of each shape: a Cluster TCP port
/// with two endpoints, a Local UDP port behind source ranges with one endpoint here, and an
/// SCTP port without endpoints, on a node with two addresses per family.
#[test]
fn load_balancer_shape_lists_identically_v4_and_v6() {
    use nodelb_core::fixtures::{node, Ep, Slice, Svc};
    use nodelb_integration::planning::plan_built;
    if !require_root("load_balancer_shape_lists_identically_v4_and_v6") {
        return;
    }
    let families = [Fam::V4, Fam::V6];
    let services = [
        Svc::lb("default", "web").port("http", 80, "TCP"),
        Svc::lb("default", "dns")
            .port("dns", 53, "UDP")
            .spec("externalTrafficPolicy", "Local")
            .spec(
                "loadBalancerSourceRanges",
                families.map(|f| format!("{}/{}", f.addr(2, 0), f.prefix_len())),
            ),
        Svc::lb("default", "empty").port("x", 9, "SCTP"),
    ]
    .map(|s| s.created("2024-01-01T00:00:00Z").dual_stack());
    let mut slices = Vec::new();
    for (f, family) in families.iter().zip(["IPv4", "IPv6"]) {
        let slice = |name: &str| Slice::of("default", &format!("{name}-{family}"), name, family);
        let web = [f.addr(1, 2), f.addr(1, 3)].map(|a| Ep::at(a).node("node-a"));
        slices.push(slice("web").port("http", 8080, "TCP").endpoints(web));
        let dns = Ep::at(f.addr(1, 2)).node("node-a");
        slices.push(slice("dns").port("dns", 5353, "UDP").endpoint(dns));
    }
    let addresses = families.map(|f| [f.addr(2, 1), f.addr(0, 1)]).concat();
    let node = addresses
        .iter()
        .fold(node("node-a"), |n, a| n.address("InternalIP", a))
        .info();
    let plan = plan_built(&services, &slices, &node, &addresses.into_iter().collect());
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    assert_eq!(plan.tables.len(), 2);
    for t in &plan.tables {
        assert_same_listing(t);
    }
}
