//! The incremental planner against planning from scratch: after every change in a long
//! random sequence, the edit it returns, applied to the previous tables, must give exactly the
//! planner's own tables, and those the tables `plan()` computes anew but for which slot of the
//! endpoint map each endpoint holds (see `slots`); the outcomes must be the same; and the conntrack entries
//! it makes stale are those a rebuild from the same planner makes stale.

use super::config::Config;
use super::*;
use crate::fixtures::{node, Ep, Slice, Svc};
use crate::objects::wire::{EndpointSlice, Service};
use crate::vocab::ServiceKey;
use nodelb_netfilter::{Chain, Edit, Element, Key, L4Proto, Stmt, Table, Value};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;

/// A small deterministic generator (no dependency, same sequence every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn service(i: u64, rng: &mut Lcg) -> Service {
    let policy = if rng.next(2) == 0 { "Cluster" } else { "Local" };
    let port = 80 + rng.next(4); // few ports: many conflicts
    let proto = ["TCP", "UDP"][rng.next(2) as usize];
    let fams = [vec!["IPv4"], vec!["IPv6"], vec!["IPv4", "IPv6"]][rng.next(3) as usize].clone();
    let q = 90 + rng.next(2);
    let ranges = rng.next(3) == 0;
    let port = if rng.next(10) == 0 { 22 } else { port }; // reserved
    let mut s = Svc::lb("ns", &format!("s{i}"))
        .spec("externalTrafficPolicy", policy)
        .spec("ipFamilies", fams)
        .port("p", port as u16, proto)
        .port("q", q as u16, "TCP");
    if ranges {
        s = s.spec(
            "loadBalancerSourceRanges",
            json!(["192.0.2.0/24", "2001:db8:c::/64"]),
        );
    }
    if rng.next(3) == 0 {
        s = s.spec(
            "trafficDistribution",
            ["PreferClose", "PreferSameNode"][rng.next(2) as usize],
        );
    }
    if rng.next(3) == 0 {
        // ClientIP affinity, its timeout changing now and then (its clients move to another
        // timeout's set and chains).
        s = s.client_ip_affinity([10, 60][rng.next(2) as usize]);
    }
    s.created(&format!("2024-01-{:02}T00:00:00Z", 1 + rng.next(3)))
        .wire()
}

/// An endpoint with the topology hints the EndpointSlice controller writes for the slice's
/// `style` (0: none, 1: zones, 2: zones and nodes), now and then missing or malformed.
fn hinted(ep: Ep, style: u64, node: &str, rng: &mut Lcg) -> Ep {
    let zone = ["zone-a", "zone-b"][rng.next(2) as usize];
    match (style, rng.next(8)) {
        (0, _) | (_, 0) => ep,
        (_, 1) => ep.hints(json!({"forZones": [{}]})),
        (1, _) => ep.for_zones(&[zone]),
        _ => ep.for_zones(&[zone]).for_nodes(&[node]),
    }
}

fn slice(i: u64, name: &str, family: &str, rng: &mut Lcg) -> EndpointSlice {
    let n = rng.next(4);
    let style = rng.next(3);
    let eps: Vec<Ep> = (0..n)
        .map(|_| {
            // Few hosts: the same address in two slices of a Service, or twice in one.
            let host = 10 + rng.next(6);
            let addr = if family == "IPv4" {
                format!("198.51.100.{host}")
            } else {
                format!("2001:db8:b::{host:x}")
            };
            let node = ["node-a", "node-b"][rng.next(2) as usize];
            // Ready, serving-and-terminating, or neither.
            let ready = rng.next(4) != 0;
            let serving = ready || rng.next(2) == 0;
            let ep = Ep::at(addr)
                .node(node)
                .ready(ready)
                .serving(serving)
                .terminating(rng.next(2) == 0);
            hinted(ep, style, node, rng)
        })
        .collect();
    Slice::of("ns", name, &format!("s{i}"), family)
        .port("p", 8080, "TCP")
        .port("p", 8081, "UDP")
        .port("q", 9090, "TCP")
        .endpoints(eps)
        .wire()
}

#[test]
fn incremental_updates_equal_planning_from_scratch() {
    let node = node("node-a")
        .label(topology::ZONE_LABEL, "zone-a")
        .address("InternalIP", "203.0.113.1")
        .address("InternalIP", "2001:db8::1")
        .info();
    let local: BTreeSet<IpAddr> = node.addresses.iter().map(|a| a.1).collect();
    let config = Config::default();
    let families = Families { v4: true, v6: true };
    let bare = Context::new(node.clone(), local.clone(), families, config.clone());
    let mut ctx = bare.clone();

    let mut rng = Lcg(7);
    let mut objects = Objects::default();
    let mut services: Vec<Option<Service>> = Vec::new();
    let mut slices: Vec<EndpointSlice> = Vec::new();
    // Which of `slices` are in `objects` now.
    let mut live: Vec<bool> = Vec::new();
    for i in 0..12 {
        let s = service(i, &mut rng);
        objects.put_service(Arc::new(s.clone().into()));
        services.push(Some(s));
        for (k, fam) in ["IPv4", "IPv6"].iter().enumerate() {
            let sl = slice(i, &format!("s{i}-{k}"), fam, &mut rng);
            objects.put_slice(Arc::new(sl.clone().into()));
            slices.push(sl);
            live.push(true);
        }
    }
    let mut planner = Planner::new();
    assert!(matches!(
        planner
            .update(&objects, &ctx, Some(&BTreeSet::new()))
            .change,
        TableChange::Rebuild
    ));
    let mut tables = planner.tables();

    let mut edits_seen = 0;
    let mut counter_edits = 0;
    let mut listener_changes = 0;
    // Endpoints that left, ports that opened.
    let mut stale_seen = (0, 0);
    // Affinity sets created, deleted, and declared anew (both in one edit).
    let (mut sets_added, mut sets_deleted, mut affinity_chains) = (0, 0, 0);
    // Ports narrowed to this node's or zone's endpoints, and ports whose hints were ignored.
    let (mut narrowed, mut ignored) = (0, 0);
    // Tables whose endpoints were not in sorted slots.
    let mut unsorted = 0;
    for step in 0..1200 {
        let mut dirty = BTreeSet::new();
        for _ in 0..1 + rng.next(3) {
            let i = rng.next(services.len() as u64);
            match rng.next(7) {
                6 => {
                    // A host listener starts or stops (on the wildcard, a node address, or
                    // loopback, which takes nothing).
                    let address = ["0.0.0.0", "::", "203.0.113.1", "2001:db8::1", "127.0.0.1"]
                        [rng.next(5) as usize];
                    let l = crate::vocab::Listener {
                        protocol: [crate::vocab::Protocol::Tcp, crate::vocab::Protocol::Udp]
                            [rng.next(2) as usize],
                        address: address.parse().unwrap(),
                        port: 80 + rng.next(12) as u16,
                        process: Some(format!("p{}", rng.next(2))),
                    };
                    // At most two at a time, or most ports would be held most of the time.
                    let mut sockets = ctx.listeners.sockets.clone();
                    if !sockets.remove(&l) {
                        if sockets.len() >= 2 {
                            sockets.pop_first();
                        }
                        sockets.insert(l);
                    }
                    ctx = bare
                        .clone()
                        .with_listeners(listeners::HostListeners::new(sockets));
                    listener_changes += 1;
                }
                0 => {
                    // The Service changes or goes away and comes back.
                    let s = if rng.next(4) == 0 {
                        None
                    } else {
                        Some(service(i, &mut rng))
                    };
                    match &s {
                        Some(s) => dirty.extend(objects.put_service(Arc::new(s.clone().into()))),
                        None => {
                            if let Some(old) = &services[i as usize] {
                                dirty.extend(objects.delete_service(&old.clone().into()));
                            }
                        }
                    }
                    services[i as usize] = s;
                }
                5 => {
                    // Only the session affinity changes: its timeout, or affinity on or off.
                    let Some(mut s) = services[i as usize].clone() else {
                        continue;
                    };
                    let spec = s.spec.as_mut().unwrap();
                    let off = rng.next(4) == 0;
                    spec.session_affinity = Some(if off { "None" } else { "ClientIP" }.into());
                    let timeout = [10, 60][rng.next(2) as usize];
                    spec.session_affinity_config = serde_json::from_value(
                        serde_json::json!({"clientIP": {"timeoutSeconds": timeout}}),
                    )
                    .unwrap();
                    dirty.extend(objects.put_service(Arc::new(s.clone().into())));
                    services[i as usize] = Some(s);
                }
                1 => {
                    // A slice is deleted.
                    let j = rng.next(slices.len() as u64) as usize;
                    dirty.extend(objects.delete_slice(&slices[j].clone().into()));
                    live[j] = false;
                }
                2 => {
                    // A slice moves to another Service.
                    let j = rng.next(slices.len() as u64) as usize;
                    let mut sl = slices[j].clone();
                    sl.metadata.labels.as_mut().unwrap().insert(
                        "kubernetes.io/service-name".into(),
                        format!("s{}", rng.next(services.len() as u64)),
                    );
                    dirty.extend(objects.put_slice(Arc::new(sl.clone().into())));
                    slices[j] = sl;
                    live[j] = true;
                }
                _ => {
                    // Endpoints change.
                    let j = rng.next(slices.len() as u64) as usize;
                    let owner = slices[j].metadata.labels.as_ref().unwrap()
                        ["kubernetes.io/service-name"][1..]
                        .parse::<u64>()
                        .unwrap();
                    let name = slices[j].metadata.name.clone().unwrap();
                    let fam = slices[j].address_type.clone();
                    let sl = slice(owner, &name, &fam, &mut rng);
                    dirty.extend(objects.put_slice(Arc::new(sl.clone().into())));
                    slices[j] = sl;
                    live[j] = true;
                }
            }
        }
        let mut rebuilt = planner.clone();
        let update = planner.update(&objects, &ctx, Some(&dirty));
        let rebuild = rebuilt.update(&objects, &ctx, None);
        assert_eq!(
            update.flows.stale(),
            rebuild.flows.stale(),
            "step {step}: incremental and rebuilt plans make different flows stale"
        );
        assert_eq!(planner.flows(), rebuilt.flows(), "step {step}");
        for s in update.flows.stale() {
            match s {
                flows::StaleFlows::Left { .. } => stale_seen.0 += 1,
                flows::StaleFlows::Opened { .. } => stale_seen.1 += 1,
            }
        }
        let TableChange::Edit(edits) = update.change else {
            panic!("step {step}: an unchanged context must not rebuild")
        };
        for (tr, edit) in edits {
            edits_seen += 1;
            let t = tables
                .iter_mut()
                .find(|t| t.family == tr.family)
                .expect("edited table exists");
            if let Err(e) = edit.ops(t) {
                panic!("step {step}: edit does not fit the previous table: {e}\n{edit:#?}");
            }
            // A counter is only created when new and only deleted when gone: one that lives
            // on is never re-created, which would reset it.
            for c in &edit.add_counters {
                assert!(
                    !t.counters.contains_key(&c.name),
                    "step {step}: {} re-created",
                    c.name
                );
            }
            counter_edits += edit.add_counters.len() + edit.del_counters.len();
            // A port's `aff-<hash>` set; chains that remember clients in one (a port's own).
            let affinity = |n: &str| n.starts_with("aff-");
            sets_added += edit.add_sets.iter().filter(|s| affinity(&s.name)).count();
            sets_deleted += edit.del_sets.iter().filter(|s| affinity(s)).count();
            let remembers = |c: &&Chain| {
                let update = |s: &Stmt| matches!(s, Stmt::SetUpdate { .. });
                c.rules.iter().any(|r| r.stmts.iter().any(update))
            };
            affinity_chains += edit.put_chains.iter().filter(remembers).count();
            edit.apply(t);
        }

        let live_services: Vec<index::Service> =
            services.iter().flatten().cloned().map(Into::into).collect();
        let current: Vec<index::EndpointSlice> = slices
            .iter()
            .zip(&live)
            .filter(|(_, live)| **live)
            .map(|(s, _)| s.clone().into())
            .collect();
        assert_eq!(current.len(), objects.slice_count(), "step {step}");
        let fresh = plan(&Input {
            services: live_services.iter().collect(),
            slices: current.iter().collect(),
            node: &node,
            local_addresses: &local,
            families,
            config: &config,
            listeners: &ctx.listeners,
        });
        // The edits build the planner's own tables exactly; a fresh plan numbers endpoints
        // sorted where the updates kept them in their slots, and is the same otherwise.
        assert!(
            tables == planner.tables(),
            "step {step}: edits and planner differ"
        );
        for (a, b) in tables.iter().zip(&fresh.tables) {
            let renumbered = renumbered_sorted(a.clone());
            if renumbered != *a {
                unsorted += 1;
            }
            if renumbered != *b {
                panic!(
                    "step {step}: incremental table differs from a fresh plan\n--- incremental\n{}\n--- fresh\n{}",
                    nodelb_netfilter::render_table(a),
                    nodelb_netfilter::render_table(b)
                );
            }
        }
        let outcomes: std::collections::BTreeMap<ServiceKey, diagnosis::ServiceOutcome> = planner
            .outcomes()
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        assert_eq!(outcomes, fresh.services, "step {step}");
        for o in outcomes.values() {
            for f in o.programmed_families() {
                for p in o.ports(f).unwrap_or_default() {
                    match p.result {
                        diagnosis::PortResult::Forwards {
                            topology: topology::Topology::SameNode | topology::Topology::SameZone,
                            ..
                        } => narrowed += 1,
                        diagnosis::PortResult::Forwards {
                            topology: topology::Topology::Ignored(_),
                            ..
                        } => ignored += 1,
                        _ => {}
                    }
                }
            }
        }
    }
    assert!(
        narrowed > 200 && ignored > 500,
        "the sequence planned {narrowed} ports narrowed by topology, {ignored} ignoring hints"
    );
    assert!(
        unsorted > 50,
        "the sequence kept endpoints out of sorted order in {unsorted} tables"
    );
    assert!(
        edits_seen > 300,
        "the sequence exercised {edits_seen} edits"
    );
    assert!(
        counter_edits > 100,
        "the sequence created or deleted {counter_edits} counters"
    );
    assert!(
        listener_changes > 100,
        "the sequence started or stopped {listener_changes} listeners"
    );
    assert!(
        stale_seen.0 > 50 && stale_seen.1 > 50,
        "the sequence made {stale_seen:?} flows stale (left, opened)"
    );
    assert!(
        sets_added > 20 && sets_deleted > 20 && affinity_chains > 100,
        "the sequence added {sets_added} and deleted {sets_deleted} affinity sets, and \
         put {affinity_chains} chains that remember clients"
    );
}

/// `table` with every Service port's endpoints numbered in sorted order, as a planner from
/// nothing numbers them: what the planner's tests compare a table planned through updates
/// with a fresh plan as.
fn renumbered_sorted(mut table: Table) -> Table {
    let Some(map) = table.sets.get_mut(super::table::ENDPOINTS_MAP) else {
        return table;
    };
    let mut ports: std::collections::BTreeMap<Vec<Value>, Vec<Element>> = Default::default();
    for (key, e) in std::mem::take(&mut map.elements) {
        let mut port: Vec<Value> = match &key {
            Key::Values(v) => v.iter().collect(),
            Key::Prefix(..) => Vec::new(),
        };
        port.pop();
        ports.entry(port).or_default().push(e);
    }
    for (port, mut endpoints) in ports {
        endpoints.sort_by(|a, b| a.data.cmp(&b.data));
        for (i, e) in endpoints.into_iter().enumerate() {
            let key: nodelb_netfilter::values::Values =
                port.iter().copied().chain([Value::U32(i as u32)]).collect();
            map.elements.insert(Key::Values(key), e);
        }
    }
    table
}

/// `node-a` with 203.0.113.1, IPv4 only.
fn ipv4_node() -> Context {
    let node = node("node-a").address("InternalIP", "203.0.113.1").info();
    let local: BTreeSet<IpAddr> = node.addresses.iter().map(|a| a.1).collect();
    let families = Families {
        v4: true,
        v6: false,
    };
    Context::new(node, local, families, Config::default())
}

/// A slice of Service `service` in namespace `ns` with one endpoint, 198.51.100.10:8080/TCP.
fn one_endpoint_slice(name: &str, service: &str) -> Slice {
    Slice::ipv4("ns", name, service)
        .raw_port(json!({"port": 8080, "protocol": "TCP"}))
        .endpoint("198.51.100.10")
}

#[test]
fn one_endpoint_change_replans_one_service() {
    let ctx = ipv4_node();
    let mut objects = Objects::default();
    for i in 0..200u16 {
        let s = Svc::lb("ns", &format!("s{i}"))
            .created("2024-01-01T00:00:00Z")
            .bare_port(1000 + i);
        objects.put_service(Arc::new(s.index()));
    }
    let mut planner = Planner::new();
    planner.update(&objects, &ctx, None);
    let sl = one_endpoint_slice("s7-1", "s7");
    let dirty: BTreeSet<ServiceKey> = objects
        .put_slice(Arc::new(sl.index()))
        .into_iter()
        .collect();
    let u = planner.update(&objects, &ctx, Some(&dirty));
    assert_eq!(u.replanned, 1);
    assert_eq!(u.changed, dirty);
    let TableChange::Edit(edits) = u.change else {
        panic!("expected an edit")
    };
    assert_eq!(edits.len(), 1);
    let e = &edits[0].1;
    // Reject → forward: out of no-endpoints, into the dispatch, lb and masquerade sets, the
    // endpoint map and the hairpin set; the shared chain for one endpoint, which no Service
    // used before, and which its dispatch element goes to.
    let mut chains: Vec<&str> = e.put_chains.iter().map(|c| c.name.as_str()).collect();
    chains.sort();
    assert_eq!(chains, vec!["endpoints-1"]);
    assert!(
        e.add_counters.is_empty() && !e.elements.contains_key("svc-counters"),
        "the port keeps its counter: {e:?}"
    );
    assert_eq!(e.elements["no-endpoints"].del.len(), 1);
    for set in [
        "services",
        "lb-services",
        "masq-services",
        "endpoints",
        "hairpin",
    ] {
        assert_eq!(e.elements[set].add.len(), 1, "{set}");
    }
}

/// One Service whose one slice `ns/s-1` (target port 8080, endpoints 198.51.100.<host>)
/// changes step by step on `ipv4_node`, each step's edit applied to the table as committed.
struct OneSlice {
    ctx: Context,
    objects: Objects,
    planner: Planner,
    table: nodelb_netfilter::Table,
}

impl OneSlice {
    fn slice(hosts: &[u8]) -> Slice {
        Slice::ipv4("ns", "s-1", "s")
            .raw_port(json!({"port": 8080, "protocol": "TCP"}))
            .endpoints(hosts.iter().map(|h| Ep::at(format!("198.51.100.{h}"))))
    }

    fn new(service: Svc, hosts: &[u8]) -> OneSlice {
        let ctx = ipv4_node();
        let mut objects = Objects::default();
        objects.put_service(Arc::new(service.index()));
        objects.put_slice(Arc::new(Self::slice(hosts).index()));
        let mut planner = Planner::new();
        planner.update(&objects, &ctx, None);
        let table = planner.tables().remove(0);
        OneSlice {
            ctx,
            objects,
            planner,
            table,
        }
    }

    /// The slice now lists `hosts`: the edit, which must fit the table and make the
    /// planner's own.
    fn step(&mut self, hosts: &[u8]) -> nodelb_netfilter::Edit {
        let dirty: BTreeSet<ServiceKey> = self
            .objects
            .put_slice(Arc::new(Self::slice(hosts).index()))
            .into_iter()
            .collect();
        let update = self.planner.update(&self.objects, &self.ctx, Some(&dirty));
        let TableChange::Edit(mut edits) = update.change else {
            panic!("expected an edit")
        };
        let (_, edit) = edits.remove(0);
        edit.ops(&self.table).expect("the edit fits the table");
        edit.clone().apply(&mut self.table);
        assert!(
            self.table == self.planner.tables()[0],
            "{hosts:?}: edits and planner differ"
        );
        edit
    }
}

#[test]
fn an_endpoint_added_to_or_removed_from_an_affinity_service_keeps_the_others_slots() {
    let mut one = OneSlice::new(
        Svc::lb("ns", "s")
            .created("2024-01-01T00:00:00Z")
            .bare_port(80)
            .spec("sessionAffinity", "ClientIP"),
        &[10, 11],
    );
    let mut step = |hosts: &[u8]| one.step(hosts);
    let slot = |i: u32| {
        Key::Values(vec![Value::Proto(L4Proto::Tcp), Value::Port(80), Value::U32(i)].into())
    };
    let endpoint = |e: &Edit, i: u32| {
        let (add, del) = (&e.elements["endpoints"].add, &e.elements["endpoints"].del);
        (
            add.iter().any(|(k, _)| *k == slot(i)),
            del.contains(&slot(i)),
        )
    };
    let names = |v: &[Chain]| v.iter().map(|c| c.name.clone()).collect::<Vec<_>>();

    // A third endpoint takes slot 2: the clients of slots 0 and 1 (kept in the port's set by
    // slot) stay where they are. The port's chain is replaced to pick among three, with the
    // shared chains of slot 2 and of three endpoints (its fallback); the set stays.
    let e = step(&[10, 11, 12]);
    assert_eq!(
        (endpoint(&e, 0), endpoint(&e, 1), endpoint(&e, 2)),
        ((false, false), (false, false), (true, false)),
        "{e:?}"
    );
    assert!(e.add_sets.is_empty() && e.del_sets.is_empty(), "{e:?}");
    assert_eq!(
        names(&e.put_chains),
        ["svc-ns/s-tcp-80", "endpoints-3", "slot-2"]
    );
    assert_eq!(e.del_chains, ["endpoints-2"]);

    // The first one goes: the last takes its slot (its clients are picked for anew, and the
    // first one's clients go to it); the middle one's slot and clients stay.
    let e = step(&[11, 12]);
    assert_eq!(
        (endpoint(&e, 0), endpoint(&e, 1), endpoint(&e, 2)),
        ((true, true), (false, false), (false, true)),
        "{e:?}"
    );
    assert!(e.add_sets.is_empty() && e.del_sets.is_empty(), "{e:?}");
    assert_eq!(names(&e.put_chains), ["svc-ns/s-tcp-80", "endpoints-2"]);
    assert_eq!(e.del_chains, ["endpoints-3", "slot-2"]);
    let set = one.table.sets.values().find(|s| s.name.starts_with("aff-"));
    assert!(set.is_some_and(|s| s.is_dynamic()), "{:?}", one.table.sets);
}

#[test]
fn an_endpoint_that_comes_or_goes_rewrites_at_most_two_endpoint_elements() {
    let mut one = OneSlice::new(
        Svc::lb("ns", "s")
            .created("2024-01-01T00:00:00Z")
            .bare_port(80),
        &[10, 11, 12, 13, 14, 15, 16, 17],
    );
    let mut step = |hosts: &[u8]| {
        let endpoints = &one.step(hosts).elements["endpoints"];
        (endpoints.del.len(), endpoints.add.len())
    };
    // The third of eight goes: the last takes its index, and index 7 goes.
    assert_eq!(step(&[10, 11, 13, 14, 15, 16, 17]), (2, 1));
    // Another comes: it takes the next index, nothing else moves.
    assert_eq!(step(&[10, 11, 13, 14, 15, 16, 17, 20]), (0, 1));
    // One goes and one comes at once: one index changes endpoint.
    assert_eq!(step(&[10, 13, 14, 15, 16, 17, 20, 21]), (1, 1));
    // The one in the last index (20) goes: only that index.
    assert_eq!(step(&[10, 13, 14, 15, 16, 17, 21]), (1, 0));
    // A planner from nothing numbers them sorted; the kept slots hold the same endpoints.
    let mut fresh = Planner::new();
    fresh.update(&one.objects, &one.ctx, None);
    let planned = fresh.tables().remove(0);
    assert_ne!(
        one.table, planned,
        "the slots should have left sorted order"
    );
    assert_eq!(renumbered_sorted(one.table), planned);
}

#[test]
fn a_planner_follows_status_writes_but_no_other_change() {
    let ctx = ipv4_node();
    let svc =
        |name: &str, port: u16, status: Option<&str>| -> Arc<crate::objects::index::Service> {
            let s = Svc::lb("ns", name)
                .meta("resourceVersion", "1")
                .created("2024-01-01T00:00:00Z")
                .bare_port(port);
            let s = match status {
                Some(ip) => s
                    .meta("resourceVersion", "2")
                    .status(json!({"loadBalancer": {"ingress": [{"ip": ip}]}})),
                None => s,
            };
            Arc::new(s.index())
        };
    let mut objects = Objects::default();
    let first = svc("a", 1000, None);
    let replaced = Arc::downgrade(&first);
    objects.put_service(first);
    objects.put_service(svc("b", 1001, None));
    let mut planner = Planner::new();
    planner.update(&objects, &ctx, None);

    // The leader's status write comes back: the planner keeps the new version, and nothing
    // holds the one it replaced.
    objects.put_service(svc("a", 1000, Some("203.0.113.1")));
    assert!(
        replaced.upgrade().is_some(),
        "the planner holds what it planned"
    );
    assert!(planner.follow(&objects));
    assert!(
        replaced.upgrade().is_none(),
        "the replaced version is freed"
    );

    // A change the planner reads is not followed: the next update plans it, as from scratch.
    let before = objects.clone();
    objects.put_service(svc("b", 1002, Some("203.0.113.1")));
    assert!(!planner.follow(&objects));
    let sl = one_endpoint_slice("a-1", "a");
    let mut slices = objects.clone();
    slices.put_slice(Arc::new(sl.index()));
    assert!(!slices.plans_like(&before), "a new slice is planned");
    assert!(!planner.follow(&slices));
    let dirty: BTreeSet<ServiceKey> =
        [ServiceKey::new("ns", "a"), ServiceKey::new("ns", "b")].into();
    planner.update(&slices, &ctx, Some(&dirty));
    let mut fresh = Planner::new();
    fresh.update(&slices, &ctx, None);
    assert_eq!(planner.tables(), fresh.tables());
    assert!(planner.outcomes().eq(fresh.outcomes()));
}
