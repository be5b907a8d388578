//! The status computed class by class against the oracle, the per-node computation it replaced
//! (`oracle.rs`): on randomized clusters (nodes with varied labels, families, addresses,
//! published addresses and heartbeats; Services with node selectors, both policies, ServiceLB
//! pools with and without `--servicelb-compat` and nodes labelled for ServiceLB or not, several
//! families and ports that conflict, address types and CIDRs, published addresses; ready,
//! terminating and missing endpoints on various nodes; host listeners on ports Services use and
//! on ports none does, by various processes), and after each change in a random sequence, the
//! desired status (ingress, problems, condition) must be the same.

use super::heartbeat::{BlockedPorts, Heartbeat};
use super::*;
use crate::fixtures::{heartbeat, node, Ep, Slice, Svc, NOW};
use crate::plan::addresses::parse_cidrs;
use crate::plan::conflicts::Slot;
use crate::plan::servicelb::{ServiceLb, ENABLELB_LABEL, LBPOOL_LABEL};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ZONES: [&str; 3] = ["a", "b", "c"];

/// One randomized cluster, as the leader would see it.
struct Cluster {
    rng: StdRng,
    /// Node names; some of the Services' endpoints run on nodes not in the cluster.
    names: Vec<String>,
    objects: Objects,
    nodes: Vec<Node>,
    beats: BTreeMap<String, Heartbeat>,
    ages: BTreeMap<String, Duration>,
    cfg: StatusConfig,
}

impl Cluster {
    fn new(seed: u64) -> Cluster {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = rng.random_range(1..9);
        // Not in index order, so name order and creation order differ.
        let names: Vec<String> = (0..n)
            .map(|i| format!("node-{}", (i * 7 + seed as usize) % 10))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut planner = Config::default();
        if rng.random_bool(0.1) {
            planner.allowed_namespaces = Some(["ns".to_string()].into());
        }
        // Now and then flags that narrow every Service's addresses by default.
        if rng.random_bool(0.1) {
            planner.addresses.types = [AddressKind::ExternalIP].into();
        }
        if rng.random_bool(0.1) {
            planner.addresses.cidrs = parse_cidrs("203.0.113.8/29").unwrap();
        }
        planner.servicelb = ServiceLb::from_flag(rng.random_bool(0.3));
        let mut c = Cluster {
            rng,
            names,
            objects: Objects::default(),
            nodes: Vec::new(),
            beats: BTreeMap::new(),
            ages: BTreeMap::new(),
            cfg: StatusConfig {
                planner,
                node_lease_duration: Duration::from_secs(15),
                liveness: None,
            },
        };
        for i in 0..c.names.len() {
            c.node(i);
        }
        for i in 0..c.rng.random_range(1..12) {
            c.service(i);
        }
        c
    }

    /// Node `i` anew: its labels, addresses and heartbeat.
    fn node(&mut self, i: usize) {
        let name = self.names[i].clone();
        let rng = &mut self.rng;
        let mut labels = vec![("kubernetes.io/hostname", name.as_str())];
        if rng.random_bool(0.8) {
            labels.push(("zone", ZONES[rng.random_range(0..3)]));
        }
        // The zone topology hints name: it decides which endpoints a node uses, never whether
        // it serves, so the status by class must not depend on it.
        if rng.random_bool(0.7) {
            labels.push(("topology.kubernetes.io/zone", ZONES[rng.random_range(0..3)]));
        }
        if rng.random_bool(0.15) {
            labels.push((service::EXCLUDE_LABEL, ""));
        }
        // ServiceLB's labels: under --servicelb-compat, one node labelled enablelb (even
        // `false`) leaves every node not labelled `true` out, and pools pick among the rest.
        if rng.random_bool(0.25) {
            labels.push((
                ENABLELB_LABEL,
                ["true", "true", "false"][rng.random_range(0..3)],
            ));
        }
        if rng.random_bool(0.4) {
            labels.push((LBPOOL_LABEL, ["a", "b"][rng.random_range(0..2)]));
        }
        let mut n = labels.iter().fold(node(&name), |n, (k, v)| n.label(k, v));
        let (v4, v6) = (
            format!("203.0.113.{}", 10 + i),
            format!("2001:db8::{:x}", 10 + i),
        );
        let ext = format!("198.51.100.{}", 10 + i);
        n = match rng.random_range(0..4) {
            0 => n.address("InternalIP", v4),
            1 => n.address("InternalIP", v6),
            2 => n.address("InternalIP", v4).address("InternalIP", v6),
            _ => {
                n = n.address("InternalIP", v4).address("ExternalIP", ext);
                // Two nodes may share an address: published once.
                match rng.random_bool(0.3) {
                    true => n.address("ExternalIP", "198.51.100.200"),
                    false => n,
                }
            }
        };
        // Published addresses behind a NAT: one family, both, one shared with another node,
        // or an annotation that does not parse (ignored).
        if rng.random_bool(0.3) {
            let published = [
                format!("192.0.2.{}", 10 + i),
                format!("192.0.2.{},2001:db8:f::{:x}", 10 + i, 10 + i),
                "192.0.2.200".to_string(),
                "192.0.2.1,nonsense".to_string(),
            ];
            let p = &published[rng.random_range(0..published.len())];
            n = n.annotation("nodelb.io/published-addresses", p);
        }
        // Now and then a node the cluster autoscaler is removing, or one being deleted: it
        // serves nothing, and every condition names it.
        n = match rng.random_range(0..20) {
            0 => n.taint(super::classes::TO_BE_DELETED_TAINT, "NoSchedule"),
            1 => n.deleting(NOW),
            _ => n,
        };
        let n = n.k8s();
        match self
            .nodes
            .iter_mut()
            .find(|n| n.metadata.name.as_ref() == Some(&name))
        {
            Some(old) => *old = n,
            None => self.nodes.push(n),
        }
        self.beats.remove(&name);
        self.ages.remove(&name);
        if rng.random_bool(0.1) {
            return; // no heartbeat at all
        }
        let families = ["IPv4", "IPv6", "IPv4,IPv6", "IPv4,IPv6", ""][rng.random_range(0..5)];
        let beat = heartbeat(&name)
            .families(families)
            .blocked(&blocked(rng).format());
        // Now and then an agent whose syncs keep failing: the node serves nothing.
        let beat = match rng.random_bool(0.08) {
            true => beat.unhealthy("committing: Operation not permitted"),
            false => beat,
        };
        self.beats.insert(name.clone(), beat.heartbeat());
        let age = if rng.random_bool(0.15) { 20 } else { 1 };
        self.ages.insert(name, Duration::from_secs(age));
    }

    /// Only the ports host listeners hold on node `i` change (its heartbeat says so).
    fn listeners(&mut self, i: usize) {
        let blocked = blocked(&mut self.rng);
        if let Some(beat) = self.beats.get_mut(&self.names[i]) {
            beat.blocked = blocked;
        }
    }

    /// Service `s{i}` anew, and its slices.
    fn service(&mut self, i: usize) {
        let rng = &mut self.rng;
        let policy = ["Cluster", "Local"][rng.random_range(0..2)];
        let families = [
            vec!["IPv4"],
            vec!["IPv6"],
            vec!["IPv4", "IPv6"],
            vec!["IPv6", "IPv4"],
        ][rng.random_range(0..4)]
        .clone();
        let protocol = ["TCP", "UDP"][rng.random_range(0..2)];
        // Few ports: many conflicts.
        let p: i32 = 80 + rng.random_range(0..3);
        let q: Option<i32> = rng.random_bool(0.4).then(|| 90 + rng.random_range(0..2));
        let p = if rng.random_bool(0.05) { 22 } else { p }; // reserved
        let protocol = if rng.random_bool(0.05) {
            "ICMP"
        } else {
            protocol
        }; // invalid
        let class = rng.random_bool(0.05);
        let ns = ["ns", "other"][usize::from(rng.random_bool(0.2))];
        let created = format!("2024-01-{:02}T00:00:00Z", 1 + rng.random_range(0..4));
        let mut svc = Svc::lb(ns, &format!("s{i}"))
            .created(&created)
            .spec("externalTrafficPolicy", policy)
            .spec("ipFamilies", families)
            .port("p", port(p), protocol);
        if let Some(q) = q {
            svc = svc.port("q", port(q), "TCP");
        }
        if class {
            svc = svc.spec("loadBalancerClass", "example.com/other");
        }
        if rng.random_bool(0.4) {
            let host = format!("kubernetes.io/hostname={}", self.names[0]);
            let selectors = [
                "zone=a",
                "zone in (a,b)",
                "zone!=c",
                "zone",
                "!zone",
                host.as_str(),
                "zone=(", // invalid: served nowhere
            ];
            let sel = selectors[rng.random_range(0..selectors.len())];
            svc = svc.annotation("nodelb.io/node-selector", sel);
        }
        // Address types and CIDRs (nested ones, of both families, and invalid ones), which
        // the nodes' addresses below fall in or out of.
        if rng.random_bool(0.3) {
            let types = [
                "ExternalIP",
                "InternalIP",
                "InternalIP,ExternalIP",
                "Public",
            ];
            let t = types[rng.random_range(0..types.len())];
            svc = svc.annotation("nodelb.io/address-types", t);
        }
        if rng.random_bool(0.3) {
            let cidrs = [
                "203.0.113.0/24",
                "203.0.113.8/29",
                "203.0.113.16/28,2001:db8::/64",
                "198.51.100.0/25",
                "2001:db8::10/126",
                "",
                "203.0.113.0/33",
            ];
            let c = cidrs[rng.random_range(0..cidrs.len())];
            svc = svc.annotation("nodelb.io/address-cidrs", c);
        }
        if rng.random_bool(0.3) {
            svc = svc.label(LBPOOL_LABEL, ["a", "b", ""][rng.random_range(0..3)]);
        }
        if rng.random_bool(0.15) {
            let published = ["198.51.100.250", "2001:db8:f::250", "198.51.100.250,/24"];
            let p = published[rng.random_range(0..published.len())];
            svc = svc.annotation("nodelb.io/published-addresses", p);
        }
        self.objects.put_service(Arc::new(svc.index()));
        for (k, family) in ["IPv4", "IPv6"].into_iter().enumerate() {
            if self.rng.random_bool(0.8) {
                let s = self.slice(ns, i, k, family);
                self.objects.put_slice(Arc::new(s.index()));
            }
        }
    }

    fn slice(&mut self, ns: &str, i: usize, k: usize, family: &str) -> Slice {
        let rng = &mut self.rng;
        let eps: Vec<Ep> = (0..rng.random_range(0..4))
            .map(|_| {
                let host = 10 + rng.random_range(0..6);
                let addr = match family {
                    "IPv4" => format!("192.0.2.{host}"),
                    _ => format!("2001:db8:b::{host:x}"),
                };
                let ep = Ep::at(addr)
                    .ready(rng.random_range(0..3) != 0)
                    .serving(rng.random_bool(0.8))
                    .terminating(rng.random_bool(0.5));
                let ep = match rng.random_range(0..10) {
                    0 => ep,                   // no node
                    1 => ep.node("node-gone"), // not in the cluster
                    _ => ep.node(&self.names[rng.random_range(0..self.names.len())]),
                };
                // Topology hints, as the EndpointSlice controller writes them, now and then.
                let zone = ZONES[rng.random_range(0..3)];
                let for_node = &self.names[rng.random_range(0..self.names.len())];
                match rng.random_range(0..4) {
                    0 => ep,
                    1 => ep.for_zones(&[zone]),
                    _ => ep.for_zones(&[zone]).for_nodes(&[for_node]),
                }
            })
            .collect();
        Slice::of(ns, &format!("s{i}-{k}"), &format!("s{i}"), family)
            .port("p", 8080, "TCP")
            .port("p", 8081, "UDP")
            .port("q", 9090, "TCP")
            .endpoints(eps)
    }

    /// One random change: a Service, its slices, a node's labels, addresses or heartbeat.
    fn change(&mut self) {
        let services = self.objects.service_count();
        match self.rng.random_range(0..5) {
            0 | 1 => {
                let i = self.rng.random_range(0..services + 1);
                self.service(i);
            }
            2 => {
                let i = self.rng.random_range(0..services.max(1));
                let found = self
                    .objects
                    .services()
                    .find(|(k, _)| *k.name == *format!("s{i}"))
                    .map(|(_, s)| s.clone());
                if let Some(svc) = found {
                    self.objects.delete_service(&svc);
                }
            }
            3 => {
                let i = self.rng.random_range(0..self.names.len());
                self.node(i);
            }
            _ => {
                let i = self.rng.random_range(0..self.names.len());
                self.listeners(i);
            }
        }
    }

    fn oracle(&self) -> BTreeMap<ServiceKey, Desired> {
        oracle::desired(
            &self.objects,
            &self.nodes,
            &self.beats,
            &self.ages,
            &self.cfg,
        )
    }

    fn compute(&self, status: &mut Status) -> BTreeSet<ServiceKey> {
        status.compute(
            &self.objects,
            &self.nodes,
            &self.beats,
            &self.ages,
            &self.cfg,
        )
    }
}

fn port(p: i32) -> u16 {
    u16::try_from(p).expect("a port")
}

/// The ports a heartbeat says host listeners hold: often none; else a few, on ports the
/// random Services use (TCP and UDP 80 to 82, TCP 90 and 91) and on ports none does, by a
/// process the node named or not; rarely a list cut short (every port counts as held).
fn blocked(rng: &mut StdRng) -> BlockedPorts {
    let mut b = BlockedPorts {
        incomplete: rng.random_bool(0.03),
        ..BlockedPorts::default()
    };
    if rng.random_bool(0.6) {
        return b;
    }
    for _ in 0..rng.random_range(1..4) {
        let family = [IpFamily::V4, IpFamily::V6][rng.random_range(0..2)];
        let protocol = [Protocol::Tcp, Protocol::Udp][rng.random_range(0..2)];
        let port = [80, 81, 82, 90, 91, 53, 7000, 7001][rng.random_range(0..8)];
        let process = [Some("socat"), Some("dnsd"), None][rng.random_range(0..3)];
        let slot: Slot = (family, protocol, port);
        b.ports.insert(slot, process.map(String::from));
    }
    b
}

/// The first Service whose desired status differs, both ways, for the failure message.
fn first_difference(
    got: &BTreeMap<ServiceKey, Desired>,
    want: &BTreeMap<ServiceKey, Desired>,
) -> String {
    let keys: BTreeSet<&ServiceKey> = got.keys().chain(want.keys()).collect();
    for k in keys {
        if got.get(k) != want.get(k) {
            return format!(
                "{k}:\n  by class: {:?}\n  per node: {:?}",
                got.get(k),
                want.get(k)
            );
        }
    }
    String::new()
}

#[test]
fn the_status_by_class_equals_the_per_node_status_on_random_clusters() {
    let mut compared = 0;
    let mut local_served = 0;
    let mut conflicts = 0;
    let mut in_use = 0;
    let mut in_use_served_elsewhere = 0;
    let mut narrowed = 0;
    let mut none_admitted = 0;
    let mut invalid_addresses = 0;
    let mut servicelb_left_out = 0;
    for seed in 0..300 {
        let mut c = Cluster::new(seed);
        let mut status = Status::default();
        for step in 0..12 {
            if step > 0 {
                c.change();
            }
            let before = status.desired().clone();
            let changed = c.compute(&mut status);
            let want = c.oracle();
            assert!(
                status.desired() == &want,
                "seed {seed}, step {step}: {}",
                first_difference(status.desired(), &want)
            );
            // What changed is reported as changed.
            for (k, d) in &want {
                if before.get(k) != Some(d) {
                    assert!(
                        changed.contains(k),
                        "seed {seed}, step {step}: {k} not reported"
                    );
                }
            }
            compared += want.len();
            for (k, d) in &want {
                let annotated = c
                    .objects
                    .service(k)
                    .and_then(|s| s.metadata.annotations.as_ref())
                    .is_some_and(|a| a.keys().any(|k| k.starts_with("nodelb.io/address-")));
                narrowed += usize::from(annotated && !d.ingress.is_empty());
                none_admitted += usize::from(d.serving.message.contains("address types and CIDRs"));
                invalid_addresses += usize::from(d.problems.iter().any(|p| {
                    p.reason() == "InvalidInput" && p.note().contains("nodelb.io/address-")
                }));
            }
            local_served += want
                .iter()
                .filter(|(k, d)| {
                    !d.ingress.is_empty()
                        && c.objects.service(k).is_some_and(|s| {
                            s.spec.as_ref().unwrap().external_traffic_policy.as_deref()
                                == Some("Local")
                        })
                })
                .count();
            conflicts += want
                .values()
                .filter(|d| d.problems.iter().any(|p| p.reason() == "PortConflict"))
                .count();
            let held: Vec<&Desired> = want
                .values()
                .filter(|d| d.problems.iter().any(|p| p.reason() == "PortInUseOnNode"))
                .collect();
            in_use += held.len();
            in_use_served_elsewhere += held
                .iter()
                .filter(|d| d.serving.status && d.serving.message.contains("in use on the node"))
                .count();
            servicelb_left_out += want
                .values()
                .filter(|d| d.serving.message.contains("--servicelb-compat"))
                .count();
        }
    }
    // The clusters exercise what they are meant to.
    assert!(compared > 10_000, "{compared}");
    // Fewer than each generator alone gives: address filters and ServiceLB pools leave Services out.
    assert!(local_served > 300, "{local_served}");
    assert!(conflicts > 500, "{conflicts}");
    assert!(in_use > 500, "{in_use}");
    assert!(
        in_use_served_elsewhere > 100,
        "{in_use_served_elsewhere} served elsewhere, a listener named in the condition"
    );
    assert!(narrowed > 500, "{narrowed}");
    assert!(none_admitted > 200, "{none_admitted}");
    assert!(invalid_addresses > 200, "{invalid_addresses}");
    assert!(
        servicelb_left_out > 500,
        "{servicelb_left_out} conditions name a node ServiceLB's labels leave out"
    );
}

impl Cluster {
    /// `n` nodes, `node-0`…, in zones a, b, c in turn, each with a hostname label, one IPv4
    /// address and a fresh heartbeat; no Service.
    fn zones(n: usize) -> Cluster {
        let mut c = Cluster::new(0);
        c.names = (0..n).map(|i| format!("node-{i}")).collect();
        c.objects = Objects::default();
        c.nodes.clear();
        c.beats.clear();
        c.ages.clear();
        for (i, name) in c.names.iter().enumerate() {
            let n = node(name)
                .address("InternalIP", format!("203.0.113.{}", 10 + i))
                .label("kubernetes.io/hostname", name)
                .label("zone", ZONES[i % 3]);
            c.nodes.push(n.k8s());
            let beat = heartbeat(name).families("IPv4").heartbeat();
            c.beats.insert(name.clone(), beat);
            c.ages.insert(name.clone(), Duration::from_secs(1));
        }
        c
    }

    fn put(&mut self, name: &str, port: u16, selector: Option<&str>) -> Service {
        let mut s = Svc::lb("ns", name)
            .created("2024-01-01T00:00:00Z")
            .bare_port(port);
        if let Some(sel) = selector {
            s = s.annotation("nodelb.io/node-selector", sel);
        }
        let s = s.index();
        self.objects.put_service(Arc::new(s.clone()));
        s
    }
}

#[test]
fn nodes_apart_only_in_labels_no_selector_reads_share_a_planner() {
    let mut c = Cluster::zones(9);
    c.put("web", 80, None);
    let mut status = Status::default();
    c.compute(&mut status);
    assert_eq!(status.classes.classes.len(), 1, "no label is read");
    assert_eq!(status.desired(), &c.oracle());

    // A selector on the zone: one class per zone, not per node.
    let zoned = c.put("zoned", 81, Some("zone in (a,b)"));
    c.compute(&mut status);
    assert_eq!(status.classes.classes.len(), 3);
    assert_eq!(status.desired(), &c.oracle());
    assert_eq!(
        status.desired()[&ServiceKey::new("ns", "zoned")]
            .ingress
            .len(),
        6
    );

    // Gone again: back to one class.
    c.objects.delete_service(&zoned);
    c.compute(&mut status);
    assert_eq!(status.classes.classes.len(), 1);
    assert_eq!(status.desired(), &c.oracle());
}

#[test]
fn services_that_publish_the_same_addresses_share_one_list() {
    let mut c = Cluster::zones(4);
    c.put("a", 80, None);
    c.put("b", 81, None);
    let mut status = Status::default();
    c.compute(&mut status);
    let d = status.desired();
    let (a, b) = (
        &d[&ServiceKey::new("ns", "a")].ingress,
        &d[&ServiceKey::new("ns", "b")].ingress,
    );
    assert_eq!(a.len(), 4);
    assert!(Arc::ptr_eq(a, b), "one list, not a copy per Service");
}

#[test]
fn nodes_apart_only_in_listeners_on_ports_no_service_uses_share_a_planner() {
    let mut c = Cluster::zones(9);
    c.put("web", 80, None);
    // Each node runs daemons of its own, on ports no Service asks for.
    for (i, beat) in c.beats.values_mut().enumerate() {
        let port = 7000 + i as u16;
        beat.blocked = BlockedPorts::parse(&format!(
            "IPv4/TCP/{port}=daemon-{i},IPv6/UDP/{port}=daemon-{i}"
        ));
    }
    let mut status = Status::default();
    c.compute(&mut status);
    assert_eq!(status.classes(), 1, "no Service uses those ports");
    assert_eq!(status.desired(), &c.oracle());
    assert_eq!(
        status.desired()[&ServiceKey::new("ns", "web")]
            .ingress
            .len(),
        9
    );

    // A daemon on node-4 takes the Service's port: node-4 alone is apart.
    let web_port = (IpFamily::V4, Protocol::Tcp, 80);
    let held_by = |c: &mut Cluster, process: &str| {
        let beat = c.beats.get_mut("node-4").unwrap();
        beat.blocked.ports.insert(web_port, Some(process.into()));
    };
    held_by(&mut c, "socat");
    assert!(!c.compute(&mut status).is_empty());
    assert_eq!(status.classes(), 2);
    assert_eq!(status.desired(), &c.oracle());
    let web = &status.desired()[&ServiceKey::new("ns", "web")];
    assert_eq!(web.ingress.len(), 8);
    assert_eq!(
        web.problems,
        vec![Problem::PortInUseOnNode {
            protocol: Protocol::Tcp,
            port: 80,
            nodes: vec![("node-4".into(), Some("socat".into()))],
        }]
    );
    // Another process on that port: the same class, the status names the new one.
    held_by(&mut c, "nginx");
    assert!(!c.compute(&mut status).is_empty(), "the Event names nginx");
    assert_eq!(status.classes(), 2);
    assert_eq!(status.desired(), &c.oracle());

    // A Service on node-3's daemon's port: node-3 is apart too, for that Service's sake.
    c.put("on-7003", 7003, None);
    c.compute(&mut status);
    assert_eq!(status.classes(), 3);
    assert_eq!(status.desired(), &c.oracle());

    // A daemon on a port no Service uses stops, another starts: nothing to decide again.
    let beat = c.beats.get_mut("node-5").unwrap();
    beat.blocked = BlockedPorts::parse("IPv4/TCP/9999=daemon-new");
    assert!(c.compute(&mut status).is_empty());
    assert_eq!(status.classes(), 3);
    assert_eq!(status.desired(), &c.oracle());
}
