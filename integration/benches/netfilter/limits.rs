//! [4] Endpoints at Kubernetes' limits (150,000 endpoints in a cluster, 5,000 behind one
//! Service), planned by the agent's planner and committed by its `Committer`, as the agent
//! does it:
//! - 10,000 Services × 15 endpoints: a full install into a fresh namespace, and one endpoint
//!   of one Service moved to another address;
//! - one Service with 5,000 endpoints in 50 EndpointSlices of 100 (each slice on a target port
//!   of its own, so 100 documentation addresses make 5,000 distinct endpoints): a full
//!   install, one endpoint moved to another address, and one endpoint removed and added back
//!   (the Service's endpoint count goes 5,000 → 4,999 → 5,000, which moves its dispatch
//!   element from one `endpoints-N` chain to another and changes the modulus of its pick).
//!
//! Each change is timed from the slice's put into the objects to the last ACK (planner update,
//! encode, commit), and the kernel is then checked against the planner's table. Goals (issue
//! 30): install under 600 ms, one change in the 5,000-endpoint Service under 5 ms.
//! `NODELB_BENCH_LIMITS=0` skips this part, `big` runs only the 5,000-endpoint Service.

use super::{check_kernel, error_chain, Report, Res};
use nodelb_core::fixtures::{Ep, Slice, Svc};
use nodelb_integration::bench::{goal, wait_quiet};
use nodelb_integration::commit::{planned_slice_syncs, replace};
use nodelb_integration::models::{
    bench_endpoints, bench_objects, bench_service, bench_slice, planner_for,
};
use nodelb_integration::netns::Netns;
use nodelb_netfilter::{Committer, Nft};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

const GOAL_INSTALL_MS: f64 = 600.0;
const GOAL_CHANGE_MS: f64 = 5.0;
const WIDE: (usize, usize) = (10_000, 15);
/// The wide shape's Service whose endpoint moves.
const MOVED_SERVICE: usize = 42;
const BIG_SLICES: usize = 50;
const PER_SLICE: usize = 100;
/// The addresses a moved endpoint alternates between.
const VARIANTS: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(192, 0, 2, 201)),
    IpAddr::V4(Ipv4Addr::new(192, 0, 2, 202)),
];

/// A series of slice changes to time, and what it is called in the report.
struct Change {
    name: &'static str,
    what: &'static str,
    slices: Vec<Slice>,
}

/// Runs the part (`wide`: the 10,000 x 15 shape too), adds its rows to `report`, and returns
/// its goal lines.
pub fn run(report: &mut Report, iterations: usize, wide_too: bool) -> Res<Vec<String>> {
    let mut goals = Vec::new();
    if wide_too {
        wide(report, iterations, &mut goals)?;
    }
    big(report, iterations, &mut goals)?;
    Ok(goals)
}

/// 10,000 Services x 15 endpoints.
fn wide(report: &mut Report, iterations: usize, goals: &mut Vec<String>) -> Res<()> {
    let (n, eps) = WIDE;
    println!();
    println!("[4] endpoints at the limits: {n} Services x {eps} endpoints");
    let (services, slices): (Vec<Svc>, Vec<Slice>) = bench_objects(n, eps).into_iter().unzip();
    let moved = |v: usize| {
        let mut addresses = bench_endpoints(MOVED_SERVICE, eps);
        addresses[0] = VARIANTS[v % 2];
        bench_slice(MOVED_SERVICE, &addresses)
    };
    let changes = [Change {
        name: "move",
        what: "one endpoint moved to another address",
        slices: (0..iterations).map(moved).collect(),
    }];
    let (install, _) = shape(
        report,
        "limits_10000x15",
        (&services, &slices),
        iterations,
        &changes,
    )?;
    goals.push(format!(
        "  {} full install {n}x{eps} ({} endpoints) < {GOAL_INSTALL_MS:.0} ms: {install:.1} ms",
        goal(install < GOAL_INSTALL_MS),
        n * eps,
    ));
    Ok(())
}

/// One Service with 5,000 endpoints in 50 slices.
fn big(report: &mut Report, iterations: usize, goals: &mut Vec<String>) -> Res<()> {
    let total = BIG_SLICES * PER_SLICE;
    println!();
    println!("[4] endpoints at the limits: 1 Service x {total} endpoints in {BIG_SLICES} slices");
    let big: Vec<Slice> = (0..BIG_SLICES)
        .map(|s| big_slice(s, &big_addresses()))
        .collect();
    let last = BIG_SLICES - 1;
    let moved = |v: usize| {
        let mut addresses = big_addresses();
        addresses[0] = VARIANTS[v % 2];
        big_slice(last, &addresses)
    };
    let counted = |v: usize| {
        let addresses = big_addresses();
        big_slice(last, &addresses[v % 2..])
    };
    // An odd `v` removes the slice's first endpoint, an even one puts it back: the series starts
    // at 1, with a removal.
    let changes = [
        Change {
            name: "move",
            what: "one endpoint moved to another address",
            slices: (0..iterations).map(moved).collect(),
        },
        Change {
            name: "count",
            what: "one endpoint removed or added back (5,000 <-> 4,999)",
            slices: (1..=iterations.max(2)).map(counted).collect(),
        },
    ];
    let (install, changed) = shape(
        report,
        "limits_1x5000",
        (&[bench_service(0)], &big),
        iterations,
        &changes,
    )?;
    goals.push(format!(
        "  {} full install 1x{total} < {GOAL_INSTALL_MS:.0} ms: {install:.1} ms",
        goal(install < GOAL_INSTALL_MS),
    ));
    for (c, ms) in changes.iter().zip(changed) {
        goals.push(format!(
            "  {} 1x{total}: {}, planner update + encode + commit < {GOAL_CHANGE_MS:.0} ms: {ms:.3} ms",
            goal(ms < GOAL_CHANGE_MS),
            c.what,
        ));
    }
    Ok(())
}

/// The 100 addresses of each of the big Service's slices: 198.51.100.2-101.
fn big_addresses() -> Vec<IpAddr> {
    (0..PER_SLICE)
        .map(|h| IpAddr::V4(Ipv4Addr::new(198, 51, 100, 2 + h as u8)))
        .collect()
}

/// Slice `s` of Service 0 (`bench/svc-0-<s+1>`): port `http` → 10000 + s, an endpoint at each
/// of `addresses`.
fn big_slice(s: usize, addresses: &[IpAddr]) -> Slice {
    let target = u16::try_from(10_000 + s).expect("a port");
    Slice::ipv4("bench", &format!("svc-0-{}", s + 1), "svc-0")
        .port("http", target, "TCP")
        .endpoints(addresses.iter().map(Ep::at))
}

/// Install the planned table `iterations` times into fresh namespaces, then time each series
/// of `changes` in one namespace of its own. Returns the install's median and each series'.
fn shape(
    report: &mut Report,
    prefix: &str,
    (services, slices): (&[Svc], &[Slice]),
    iterations: usize,
    changes: &[Change],
) -> Res<(f64, Vec<f64>)> {
    let (planner, _, _) = planner_for(services, slices);
    let table = planner.tables().remove(0);
    drop(planner);
    println!(
        "  planned: {} chains, {} endpoint elements",
        table.chains.len(),
        table.sets.get("endpoints").map_or(0, |s| s.elements.len())
    );
    let (mut wall, mut enc, mut com) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..iterations {
        wait_quiet()?;
        let ns = Netns::new("bench-limits");
        let s = ns.run(|| -> Res<_> {
            let mut c = Committer::new(Nft::open().map_err(|e| format!("Nft::open: {e}"))?);
            replace(&mut c, vec![table.clone()])
                .map_err(|e| format!("install: {}", error_chain(&e)))
        })?;
        check_kernel(&ns, &table, "limits install", false)?;
        println!(
            "  install #{i}: encode {:8.2} ms  commit {:8.2} ms  ({} messages)",
            s.encode.as_secs_f64() * 1e3,
            s.commit.as_secs_f64() * 1e3,
            s.messages
        );
        wall.push(s.encode + s.commit);
        enc.push(s.encode);
        com.push(s.commit);
    }
    let install = report.add(
        &format!("{prefix}_install_total"),
        "install encode+commit",
        &wall,
    );
    report.add(
        &format!("{prefix}_install_encode"),
        "  of which encode",
        &enc,
    );
    report.add(
        &format!("{prefix}_install_commit"),
        "  of which commit",
        &com,
    );
    let mut medians = Vec::new();
    for c in changes {
        let (mut planner, mut objects, ctx) = planner_for(services, slices);
        let ns = Netns::new("bench-limits-sync");
        let puts: Vec<_> = c.slices.iter().map(|s| Arc::new(s.index())).collect();
        let syncs = planned_slice_syncs(&ns, &mut planner, &mut objects, &ctx, &puts)?;
        check_kernel(&ns, &planner.tables()[0], "limits change", false)?;
        let commits: Vec<Duration> = syncs.commit;
        let s = report.add(&format!("{prefix}_{}_wall", c.name), c.what, &syncs.wall);
        report.add(
            &format!("{prefix}_{}_commit", c.name),
            "  of which commit",
            &commits,
        );
        println!(
            "  {}: median {:.3} ms, max {:.3} ms, batches of {:?} messages",
            c.what, s.median, s.max, syncs.messages
        );
        medians.push(s.median);
    }
    let names: Vec<String> = report
        .rows
        .iter()
        .map(|r| r.0.clone())
        .filter(|n| n.starts_with(prefix))
        .collect();
    report.print_table(
        prefix,
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    Ok((install.median, medians))
}
