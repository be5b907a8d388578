//! Transactions against the kernel: atomic failure, incremental syncs, foreign state left
//! alone, reading back, and watching for other writers.

use nodelb_core::fixtures::{node, Ep, Slice, Svc};
use nodelb_integration::commit::{replace, replace_carrying, sync};
use nodelb_integration::models::{bench_table, kitchen_sink, move_bench_endpoint, Fam};
use nodelb_integration::netns::{require_root, Netns};
use nodelb_integration::nft::{list_ruleset, list_table, nft_f, nodelb_replace};
use nodelb_integration::planning::plan_built;
use nodelb_netfilter::*;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// The node's one address.
const NODE: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1));

/// The planner's IPv4 table for Services `default/s<port>`, each `(port, endpoints,
/// masquerade)`: TCP `port` named `p` with that many endpoints on this node (198.51.100.10
/// up), masqueraded under Cluster policy, not under Local.
fn planned(services: &[(u16, u16, bool)]) -> Table {
    let (mut svcs, mut slices) = (Vec::new(), Vec::new());
    for (port, eps, masquerade) in services {
        let name = format!("s{port}");
        let policy = if *masquerade { "Cluster" } else { "Local" };
        svcs.push(
            Svc::lb("default", &name)
                .created("2024-01-01T00:00:00Z")
                .port("p", *port, "TCP")
                .spec("externalTrafficPolicy", policy),
        );
        let eps = (0..*eps).map(|i| Ep::at(Fam::V4.addr(1, 10 + i)).node("node-a"));
        slices.push(
            Slice::ipv4("default", &format!("{name}-1"), &name)
                .port("p", 8080, "TCP")
                .endpoints(eps),
        );
    }
    let node = node("node-a").address("InternalIP", NODE).info();
    let plan = plan_built(&svcs, &slices, &node, &[NODE].into());
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    let ip = plan.tables.into_iter().find(|t| t.family == Family::Ip);
    ip.expect("the ip table")
}

#[test]
fn failing_batch_leaves_previous_ruleset_byte_identical_and_names_the_rule() {
    if !require_root("failing_batch_leaves_previous_ruleset_byte_identical_and_names_the_rule") {
        return;
    }
    let ns = Netns::new("atomic");
    let good = kitchen_sink(Fam::V4, "nodelb");
    nodelb_replace(&ns, std::slice::from_ref(&good)).expect("install");
    let before = list_ruleset(&ns);

    // A replacement whose last rule jumps to a chain that does not exist: the kernel refuses
    // it only after table, chains, sets, elements and most rules were already in the batch.
    let mut bad = kitchen_sink(Fam::V4, "nodelb");
    bad.chain_mut("forward").unwrap().push(
        Rule::new(vec![Stmt::Verdict(Verdict::Jump("nowhere".into()))]).with_comment("the bad one"),
    );
    let ops = full_replace(&bad);
    let err = ns
        .run(|| Nft::open().unwrap().apply(&ops))
        .expect_err("the kernel must refuse");
    let msg = err.to_string();
    assert!(
        msg.contains("chain ip nodelb forward") && msg.contains("the bad one"),
        "error names the rule: {msg}"
    );
    assert_eq!(err.errno(), Some(libc::ENOENT), "{err:?}");
    assert_eq!(
        list_ruleset(&ns),
        before,
        "a failed batch must change nothing"
    );

    // The Committer validates before sending and keeps what it had committed.
    let mut c = ns.run(|| Committer::new(Nft::open().unwrap()));
    let e = replace(&mut c, vec![bad.clone()]).expect_err("validation refuses it");
    assert!(e.to_string().contains("missing chain nowhere"), "{e}");
    assert_eq!(list_ruleset(&ns), before);
}

#[test]
fn one_endpoint_change_sends_the_same_batch_at_100_and_10000_services() {
    if !require_root("one_endpoint_change_sends_the_same_batch_at_100_and_10000_services") {
        return;
    }
    let mut sizes = Vec::new();
    for n in [100usize, 10_000] {
        let ns = Netns::new("incr");
        let base = bench_table(n, 5);
        let stats = ns.run(|| {
            let mut c = Committer::new(Nft::open().unwrap());
            sync(&mut c, vec![base.clone()]).expect("first sync installs the table");
            let mut changed = base.clone();
            move_bench_endpoint(&mut changed, 42, 9999);
            sync(&mut c, vec![changed]).expect("incremental sync")
        });
        let map = ns.sh("nft list map ip nodelb endpoints");
        // nft 1.0.6 prints the key's `meta l4proto` by name over this machine's kernel and as
        // a number over 6.1's (Debian bookworm's, seen on x86_64 and arm64): the same element.
        let listed = ["tcp", "6"].iter().any(|p| {
            map.contains(&format!(
                "{p} . 1066 . 0 comment \"bench/svc-42:http\" : 198.51.100."
            ))
        });
        assert!(
            listed && map.contains(". 9999"),
            "at {n} Services the kernel holds the moved endpoint; the map's head and svc-42's \
             elements:\n{}",
            map.lines()
                .take(4)
                .chain(map.lines().filter(|l| l.contains("svc-42:")))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let moved = map
            .lines()
            .filter_map(|l| l.rsplit_once(" : "))
            .filter(|(_, data)| data.trim_end_matches([',', ' ', '}']).ends_with(" . 9999"))
            .count();
        assert_eq!(moved, 1, "exactly one endpoint moved");
        assert!(
            stats.messages <= 3,
            "one delete and one add of an element: {stats:?}"
        );
        sizes.push((n, stats.bytes, stats.messages));
    }
    assert_eq!(
        sizes[0].1, sizes[1].1,
        "batch size must not grow with the ruleset: {sizes:?}"
    );
    assert_eq!(sizes[0].2, sizes[1].2, "{sizes:?}");
}

#[test]
fn sync_sends_only_the_difference_and_the_kernel_follows() {
    if !require_root("sync_sends_only_the_difference_and_the_kernel_follows") {
        return;
    }
    let ns = Netns::new("sync");
    let a = planned(&[(80, 2, true), (81, 3, false)]);
    // b: endpoint counts change (chain endpoints-2 goes away, endpoints-4 comes), masquerade
    // flips, a Service is added.
    let b = planned(&[(80, 4, false), (81, 3, true), (82, 1, true)]);
    let mut c = ns.run(|| Committer::new(Nft::open().unwrap()));
    sync(&mut c, vec![a.clone()]).unwrap();
    let full = ns.run(|| Batch::encode(1, &full_replace(&b)).unwrap().len());
    let stats = ns.run(|| sync(&mut c, vec![b.clone()])).unwrap();
    assert!(
        stats.bytes < full / 2,
        "incremental batch {} bytes vs full {full}",
        stats.bytes
    );

    // The kernel now lists exactly what a fresh install of b lists.
    let fresh = Netns::new("sync-fresh");
    nodelb_replace(&fresh, std::slice::from_ref(&b)).unwrap();
    // Chains list in creation order, so compare the blocks as a set.
    assert_eq!(
        normalized(&list_table(&ns, "ip", "nodelb").unwrap()),
        normalized(&list_table(&fresh, "ip", "nodelb").unwrap())
    );
    assert!(
        c.stale_chains(&TableRef::of(&b)).is_empty(),
        "endpoints-2 was deleted after being flushed"
    );
}

/// A listing's chain and set blocks, sorted: the kernel lists chains in creation order.
fn normalized(listing: &str) -> Vec<String> {
    let mut blocks: Vec<String> = listing
        .split("\n\n")
        .map(|b| b.trim_matches(['\n', '}']).to_string())
        .collect();
    blocks.sort();
    blocks
}

#[test]
fn busy_stale_chain_does_not_fail_the_sync_and_is_deleted_later() {
    if !require_root("busy_stale_chain_does_not_fail_the_sync_and_is_deleted_later") {
        return;
    }
    let ns = Netns::new("stale");
    let mut a = Table::new(Family::Ip, "nodelb");
    a.add_chain(Chain::regular("keep"));
    a.add_chain(Chain::regular("old").rule(Rule::new(vec![Stmt::counter()])));
    let mut b = a.clone();
    b.chains.remove("old");
    let tr = TableRef::of(&a);
    let mut c = ns.run(|| Committer::new(Nft::open().unwrap()));
    sync(&mut c, vec![a.clone()]).unwrap();
    // Someone else makes `old` busy: a jump to it from a chain the diff does not touch.
    nft_f(&ns, "add rule ip nodelb keep jump old").unwrap();
    ns.run(|| sync(&mut c, vec![b.clone()]))
        .expect("a busy stale chain must not fail the sync");
    assert_eq!(c.stale_chains(&tr), vec!["old".to_string()]);
    let listing = list_table(&ns, "ip", "nodelb").unwrap();
    assert!(
        listing.contains("chain old {\n\t}"),
        "old was flushed:\n{listing}"
    );
    // Once it is free, the next sync deletes it.
    nft_f(&ns, "flush chain ip nodelb keep").unwrap();
    ns.run(|| sync(&mut c, vec![b.clone()])).unwrap();
    assert!(c.stale_chains(&tr).is_empty());
    assert!(!list_table(&ns, "ip", "nodelb")
        .unwrap()
        .contains("chain old"));
}

const FOREIGN: &str = "table ip foreign {
	set blocked {
		type ipv4_addr
		elements = { 192.0.2.99 }
	}
	chain forward {
		type filter hook forward priority 0; policy drop;
		ct state established accept
		ip saddr @blocked drop
	}
	chain prerouting {
		type nat hook prerouting priority -150; policy accept;
		tcp dport 2222 dnat to 198.51.100.5:22
	}
}
table inet other {
	chain input {
		type filter hook input priority -5; policy accept;
		meta l4proto udp counter accept
	}
	chain output {
		type filter hook output priority 5; policy accept;
	}
}
";

#[test]
fn foreign_tables_and_base_chains_are_untouched_by_every_operation() {
    if !require_root("foreign_tables_and_base_chains_are_untouched_by_every_operation") {
        return;
    }
    let ns = Netns::new("foreign");
    nft_f(&ns, FOREIGN).unwrap();
    let foreign = || {
        format!(
            "{}{}",
            list_table(&ns, "ip", "foreign").unwrap(),
            list_table(&ns, "inet", "other").unwrap()
        )
    };
    let before = foreign();
    let t1 = kitchen_sink(Fam::V4, "nodelb");
    let t6 = kitchen_sink(Fam::V6, "nodelb");
    let mut c = ns.run(|| Committer::new(Nft::open().unwrap()));
    sync(&mut c, vec![t1.clone(), t6.clone()]).unwrap();
    assert_eq!(foreign(), before, "after install");
    let mut t1b = t1.clone();
    t1b.chains.remove("input");
    t1b.set_mut("ports").unwrap().elements.clear();
    sync(&mut c, vec![t1b.clone(), t6.clone()]).unwrap();
    assert_eq!(foreign(), before, "after incremental sync");
    replace(&mut c, vec![t1b.clone()]).unwrap();
    assert_eq!(foreign(), before, "after full replace");
    let delete = |c: &mut Committer, t: &Table| {
        ns.run(|| c.commit(Commit::edit(Vec::new()).absent([TableRef::of(t)])))
    };
    delete(&mut c, &t1b).unwrap();
    delete(&mut c, &t6).unwrap();
    assert_eq!(foreign(), before, "after deleting nodelb's tables");
    assert_eq!(list_ruleset(&ns), before, "only foreign tables remain");
    // Deleting tables that are already gone is not an error and still touches nothing else.
    delete(&mut c, &t1b).unwrap();
    assert_eq!(foreign(), before);
}

#[test]
fn readback_counts_match_the_model_and_detect_foreign_changes() {
    if !require_root("readback_counts_match_the_model_and_detect_foreign_changes") {
        return;
    }
    let ns = Netns::new("readback");
    let t = kitchen_sink(Fam::V4, "nodelb");
    let tr = TableRef::of(&t);
    ns.run(|| {
        let mut c = Committer::new(Nft::open().unwrap());
        assert_eq!(c.nft().drift(&t, &[]).unwrap(), Drift::Missing);
        let g0 = c.nft().generation().unwrap();
        replace(&mut c, vec![t.clone()]).unwrap();
        let g1 = c.nft().generation().unwrap();
        assert_ne!(g0, g1, "a commit bumps the generation");
        let summary = c.nft().read_table(&tr).unwrap().expect("table exists");
        assert_eq!(summary, TableSummary::expected(&t));
        assert_eq!(
            summary.sets["allowed"], 4,
            "two prefixes, a start and an end each"
        );
        assert_eq!(summary.chains["forward"], t.chains["forward"].rules.len());
        assert_eq!(c.nft().drift(&t, &[]).unwrap(), Drift::None);
    });
    nft_f(&ns, "add rule ip nodelb forward accept").unwrap();
    nft_f(&ns, "add element ip nodelb ports { 8443 }").unwrap();
    let drift = ns.run(|| Nft::open().unwrap().drift(&t, &[]).unwrap());
    assert_eq!(
        drift,
        Drift::Changed(vec![
            format!(
                "chain forward has {} rules, expected {}",
                t.chains["forward"].rules.len() + 1,
                t.chains["forward"].rules.len()
            ),
            "set ports has 3 elements, expected 2".into(),
        ])
    );
    nft_f(&ns, "delete table ip nodelb").unwrap();
    assert_eq!(
        ns.run(|| Nft::open().unwrap().drift(&t, &[]).unwrap()),
        Drift::Missing
    );
}

/// The resync's read-back runs over a socket of its own while the committer keeps going: what
/// it read matches the committer's models until either side changes; a commit after the read
/// makes it differ (the loop then reads again), and so does a foreign rule.
#[test]
fn a_read_back_beside_the_committer_tells_its_commits_and_drift_apart() {
    if !require_root("a_read_back_beside_the_committer_tells_its_commits_and_drift_apart") {
        return;
    }
    use nodelb_agent::run::verify::{difference, read};
    let ns = Netns::new("resync");
    let t = kitchen_sink(Fam::V4, "nodelb");
    let tr = TableRef::of(&t);
    let mut c = ns.run(|| Committer::new(Nft::open().unwrap()));
    ns.run(|| replace(&mut c, vec![t.clone()])).unwrap();
    let read_now = || ns.run(|| read(&mut Nft::open().unwrap(), vec![tr.clone()]));
    let before = read_now();
    assert_eq!(difference(&c, &before), None);

    // The committer adds an element after the read: the read no longer matches its models.
    let mut more = t.clone();
    let ports = more
        .sets
        .get_mut("ports")
        .expect("kitchen_sink has a set of ports");
    ports.insert(Key::Values(vec![Value::Port(8443)].into()), None, None);
    ns.run(|| sync(&mut c, vec![more])).unwrap();
    let stale = difference(&c, &before).expect("the read is older than the commit");
    assert!(
        stale.contains("set ports has 2 elements, expected 3"),
        "{stale}"
    );
    assert_eq!(difference(&c, &read_now()), None, "a new read matches");

    // Drift: a rule nodelb did not commit.
    nft_f(&ns, "add rule ip nodelb forward accept").unwrap();
    let drift = difference(&c, &read_now()).expect("a foreign rule is drift");
    assert!(drift.contains("chain forward has"), "{drift}");
    nft_f(&ns, "delete table ip nodelb").unwrap();
    assert!(difference(&c, &read_now()).is_some_and(|d| d.contains("Missing")));
}

/// A [`Watcher`] of `watched` on a thread in `ns`, its events sent to `events`.
struct WatchThread {
    events: std::sync::mpsc::Receiver<WatchEvent>,
    pause: WatchPause,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<()>,
}

impl WatchThread {
    fn start(ns: &Netns, watched: TableRef) -> WatchThread {
        let (tx, events) = std::sync::mpsc::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let ns_for_thread = ns.name().to_string();
        let handle = std::thread::spawn(move || {
            let f = std::fs::File::open(format!("/run/netns/{ns_for_thread}")).unwrap();
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let mut w = Watcher::open(vec![watched]).unwrap();
            ready_tx.send(w.pause_handle().unwrap()).unwrap();
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(ev) = w.next(Duration::from_millis(100)).unwrap() {
                    tx.send(ev).unwrap();
                }
            }
        });
        let pause = ready_rx.recv().unwrap();
        WatchThread {
            events,
            pause,
            stop,
            handle,
        }
    }

    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap();
    }
}

#[test]
fn watcher_reports_foreign_changes_to_nodelb_tables_only() {
    if !require_root("watcher_reports_foreign_changes_to_nodelb_tables_only") {
        return;
    }
    let ns = Netns::new("watch");
    let t = kitchen_sink(Fam::V4, "nodelb");
    let tr = TableRef::of(&t);
    let w = WatchThread::start(&ns, tr.clone());
    let rx = &w.events;
    // Our own commits are not reported.
    let mut c = ns.run(|| Committer::new(Nft::open().unwrap()));
    replace(&mut c, vec![t.clone()]).unwrap();
    let mut t2 = t.clone();
    t2.set_mut("ports").unwrap().elements.clear();
    sync(&mut c, vec![t2.clone()]).unwrap();
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "own commits are not drift"
    );
    // Changes to other tables are not reported.
    nft_f(
        &ns,
        "add table ip someone-else\nadd chain ip someone-else c",
    )
    .unwrap();
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "foreign tables are not ours to watch"
    );
    // A change to nodelb's table by another process is reported within a second.
    nft_f(
        &ns,
        "delete rule ip nodelb forward handle 1\nadd rule ip nodelb forward drop",
    )
    .ok();
    nft_f(&ns, "flush chain ip nodelb input").unwrap();
    let ev = rx
        .recv_timeout(Duration::from_secs(1))
        .expect("drift reported within a second");
    w.stop();
    match ev {
        WatchEvent::Foreign(fc) => {
            assert_eq!(fc.tables, vec![tr]);
            assert_eq!(fc.process.as_deref(), Some("nft"), "{fc:?}");
            assert!(
                fc.events.iter().any(|e| e.contains("rule ip nodelb")),
                "{fc:?}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_paused_watcher_hears_nothing_until_it_listens_again() {
    if !require_root("a_paused_watcher_hears_nothing_until_it_listens_again") {
        return;
    }
    let ns = Netns::new("watch-pause");
    let t = kitchen_sink(Fam::V4, "nodelb");
    let tr = TableRef::of(&t);
    nodelb_replace(&ns, std::slice::from_ref(&t)).unwrap();
    let w = WatchThread::start(&ns, tr.clone());
    {
        let _paused = w.pause.pause().unwrap();
        nft_f(&ns, "flush chain ip nodelb input").unwrap();
        assert!(
            w.events.recv_timeout(Duration::from_millis(500)).is_err(),
            "paused: nothing heard"
        );
    }
    nft_f(&ns, "flush chain ip nodelb forward").unwrap();
    let ev = w
        .events
        .recv_timeout(Duration::from_secs(1))
        .expect("listening again: drift reported within a second");
    w.stop();
    match ev {
        WatchEvent::Foreign(fc) => assert_eq!(fc.tables, vec![tr]),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn counters_are_read_back_never_reset_by_a_sync_and_carried_over_a_replace() {
    if !require_root("counters_are_read_back_never_reset_by_a_sync_and_carried_over_a_replace") {
        return;
    }
    let ns = Netns::new("counters");
    // The kitchen sink's `svc/default/web/http` starts from 42 packets, 4200 bytes.
    let seeded = kitchen_sink(Fam::V4, "nodelb");
    let tr = TableRef::of(&seeded);
    let mut zeroed = seeded.clone();
    zeroed.seed_counters(
        &zeroed
            .counters
            .keys()
            .map(|n| (n.clone(), (0, 0)))
            .collect(),
    );
    let web = "svc/default/web/http".to_string();
    ns.run(|| {
        let mut c = Committer::new(Nft::open().unwrap());
        assert!(
            c.nft().read_counters(&tr).unwrap().is_empty(),
            "no table yet"
        );
        replace(&mut c, vec![seeded.clone()]).unwrap();
        let read = c.nft().read_counters(&tr).unwrap();
        assert_eq!(read[&web], (42, 4200));
        assert_eq!(read["drops/default/web/http"], (0, 0));
        assert_eq!(read.len(), seeded.counters.len());

        // A sync of the same model with zero values sends nothing and resets nothing.
        let stats = sync(&mut c, vec![zeroed.clone()]).unwrap();
        assert_eq!(stats.messages, 0, "counter values are not a change");
        assert_eq!(c.nft().read_counters(&tr).unwrap()[&web], (42, 4200));

        // A full replace of zeroed counters resets them: that is what carrying prevents.
        let carried = replace_carrying(&mut c, vec![zeroed.clone()]).unwrap();
        assert_eq!(carried.carried, 2);
        assert_eq!(c.nft().read_counters(&tr).unwrap()[&web], (42, 4200));
        replace(&mut c, vec![zeroed.clone()]).unwrap();
        assert_eq!(c.nft().read_counters(&tr).unwrap()[&web], (0, 0));

        // A fresh committer (an agent restart) replaces whole through `sync`: it carries.
        replace(&mut c, vec![seeded.clone()]).unwrap();
        let mut fresh = Committer::new(Nft::open().unwrap());
        sync(&mut fresh, vec![zeroed.clone()]).unwrap();
        assert_eq!(fresh.nft().read_counters(&tr).unwrap()[&web], (42, 4200));
        assert_eq!(fresh.nft().drift(&zeroed, &[]).unwrap(), Drift::None);
    });
    // Someone else's counter in nodelb's table is drift.
    nft_f(&ns, "add counter ip nodelb alien").unwrap();
    assert_eq!(
        ns.run(|| Nft::open().unwrap().drift(&zeroed, &[]).unwrap()),
        Drift::Changed(vec!["counter alien is not nodelb's".into()])
    );
}

#[test]
fn a_consuming_replace_installs_what_a_replace_installs() {
    if !require_root("a_consuming_replace_installs_what_a_replace_installs") {
        return;
    }
    // Every kind of object, elements of several sets (a verdict map, a counter map, an
    // interval set) among them.
    let t = kitchen_sink(Fam::V4, "nodelb");
    let tr = TableRef::of(&t);
    let consumed = Netns::new("consume");
    let mut c = consumed.run(|| Committer::new(Nft::open().unwrap()));
    // The tables are consumed while encoded; built once more afterwards, nothing is given
    // back yet.
    let mut builds = [vec![t.clone()], Vec::new()].into_iter();
    let mut build = || builds.next().unwrap_or_default();
    consumed
        .run(|| c.commit(Commit::replace(&mut build).freed(&mut || {})))
        .expect("consuming replace");
    assert!(
        c.committed(&tr).is_none(),
        "the committer holds no model until it is given back"
    );
    let plain = Netns::new("consume-ref");
    nodelb_replace(&plain, std::slice::from_ref(&t)).unwrap();
    assert_eq!(
        normalized(&list_table(&consumed, "ip", "nodelb").unwrap()),
        normalized(&list_table(&plain, "ip", "nodelb").unwrap())
    );
    // Given back (by a replace that builds it again), the model is the baseline for reading
    // back and for syncs.
    consumed.run(|| replace(&mut c, vec![t.clone()])).unwrap();
    assert_eq!(consumed.run(|| c.drift(&tr)).unwrap(), Some(Drift::None));
    let stats = consumed.run(|| sync(&mut c, vec![t.clone()])).unwrap();
    assert_eq!(stats.messages, 0, "nothing differs from the adopted model");
}

/// The kernel actor in a namespace of its own (its thread, and the threads it reads back on,
/// are started there): the first commit replaces the tables whole and the next edits them; a
/// verify of the tables as committed reports no drift, a chain another process adds is
/// reported as drift, and the commit asked to repair it replaces the tables whole, after which
/// a verify finds them as committed again.
#[test]
fn the_kernel_actor_commits_edits_verifies_and_repairs_drift() {
    if !require_root("the_kernel_actor_commits_edits_verifies_and_repairs_drift") {
        return;
    }
    use nodelb_agent::run::kernel::{Commit, Kernel, Verified};
    use nodelb_agent::run::Trigger;
    use nodelb_core::plan::config::Config;
    use nodelb_core::plan::{Context, Objects, Planner};
    use nodelb_core::vocab::Families;

    let ns = Netns::new("actor");
    let families = Families {
        v4: true,
        v6: false,
    };
    let info = node("node-a").address("InternalIP", NODE).info();
    let ctx = Context::new(info, [NODE].into(), families, Config::default());
    let mut objects = Objects::default();
    let mut planner = Planner::new();
    let mut plan = |endpoint: &str, planner: &mut Planner| {
        let svc = Svc::lb("default", "web")
            .created("2024-01-01T00:00:00Z")
            .spec("ipFamilyPolicy", "SingleStack")
            .spec("ipFamilies", serde_json::json!(["IPv4"]))
            .port("http", 8080, "TCP");
        let slice = Slice::ipv4("default", "web-1", "web")
            .port("http", 8443, "TCP")
            .endpoint(Ep::at(endpoint));
        let mut dirty = std::collections::BTreeSet::new();
        dirty.extend(objects.put_service(std::sync::Arc::new(svc.index())));
        dirty.extend(objects.put_slice(std::sync::Arc::new(slice.index())));
        planner.update(&objects, &ctx, Some(&dirty)).change
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (tell, mut told) = tokio::sync::mpsc::unbounded_channel();
    let kernel = ns
        .run(|| Kernel::spawn(Config::default(), None, tell, Default::default()))
        .expect("the kernel actor's thread");
    let commit = |change, drift, planner: &mut Planner| {
        let c = Commit {
            change,
            families,
            drift,
            planner: std::mem::take(planner),
            flows: Default::default(),
        };
        let (back, done) = rt.block_on(kernel.commit(c));
        *planner = back;
        done.result.expect("the commit")
    };
    let mut verified = |kernel: &Kernel| -> Verified {
        kernel.verify();
        // The timer needs the runtime: made inside it.
        let told =
            rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), told.recv()).await });
        match told {
            Ok(Some(Trigger::Verified(v))) => v,
            other => panic!("expected a verdict, got {other:?}"),
        }
    };

    let change = plan("198.51.100.2", &mut planner);
    assert!(commit(change, false, &mut planner).whole, "no model yet");
    let change = plan("198.51.100.3", &mut planner);
    let sent = commit(change, false, &mut planner);
    assert!(!sent.whole && sent.stats.messages > 0, "an edit: {sent:?}");
    assert!(ns.sh("nft list table ip nodelb").contains("198.51.100.3"));
    assert_eq!(verified(&kernel).drift, None, "as committed");

    nft_f(&ns, "add chain ip nodelb intruder").unwrap();
    let drift = verified(&kernel).drift.expect("a foreign chain is drift");
    assert!(drift.contains("chain intruder is not nodelb's"), "{drift}");

    let nothing = nodelb_core::plan::TableChange::Edit(Vec::new());
    assert!(
        commit(nothing, true, &mut planner).whole,
        "drift is repaired whole"
    );
    let table = ns.sh("nft list table ip nodelb");
    assert!(
        !table.contains("intruder") && table.contains("198.51.100.3"),
        "{table}"
    );
    assert_eq!(verified(&kernel).drift, None, "repaired");
}
