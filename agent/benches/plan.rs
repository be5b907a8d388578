//! How long `plan()` takes for N Services × M endpoints (the pure step of every sync), and
//! how much heap the agent's long-lived state takes: the objects, a planner kept between
//! syncs, and the tables it assembles (the committed model the netfilter committer keeps).
//! Heap is counted by a wrapping global allocator (bytes requested and still live; malloc's
//! own overhead comes on top). The whole agent's peak RSS is measured by the latency bench of
//! `nodelb-integration`.
//! `cargo bench -p nodelb-agent --bench plan`; NODELB_BENCH_SERVICES / NODELB_BENCH_ENDPOINTS.

use nodelb_core::fixtures::{self, Ep, Slice, Svc};
use nodelb_core::objects::index;
use nodelb_core::objects::wire::{EndpointSlice, Service};
use nodelb_core::plan::{config::Config, plan, Context, Input, Objects, Planner, TableChange};
use nodelb_core::vocab::Families;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

mod heap;

use heap::{chunks_text, footprint, mib, peak_from_now};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn port(p: usize) -> u16 {
    u16::try_from(p).expect("NODELB_BENCH_SERVICES stays below 64,512")
}

fn main() {
    let n = env("NODELB_BENCH_SERVICES", 10_000);
    let m = env("NODELB_BENCH_ENDPOINTS", 5);
    let mut services: Vec<Service> = Vec::new();
    let mut slices: Vec<EndpointSlice> = Vec::new();
    for i in 0..n {
        let name = format!("svc-{i}");
        let service = Svc::lb("bench", &name)
            .created("2024-01-01T00:00:00Z")
            .port("http", port(1024 + i), "TCP");
        services.push(service.wire());
        let eps =
            (0..m).map(|e| Ep::at(format!("198.51.100.{}", (i * m + e) % 250 + 2)).node("node-a"));
        let slice = Slice::ipv4("bench", &format!("{name}-1"), &name)
            .port("http", port(8080 + i % 7), "TCP")
            .endpoints(eps);
        slices.push(slice.wire());
    }
    let node = fixtures::node("node-a")
        .address("InternalIP", "203.0.113.1")
        .info();
    let local: BTreeSet<IpAddr> = ["203.0.113.1".parse().unwrap()].into();
    let config = Config::default();
    // As the index keeps them (the file reader and the watches convert each object once).
    let kept_services: Vec<index::Service> = services.iter().cloned().map(Into::into).collect();
    let kept_slices: Vec<index::EndpointSlice> = slices.iter().cloned().map(Into::into).collect();
    let mut times = Vec::new();
    for _ in 0..7 {
        let t0 = Instant::now();
        let p = plan(&Input {
            services: kept_services.iter().collect(),
            slices: kept_slices.iter().collect(),
            node: &node,
            local_addresses: &local,
            families: Families {
                v4: true,
                v6: false,
            },
            config: &config,
            listeners: &Default::default(),
        });
        times.push(t0.elapsed());
        assert_eq!(p.services.len(), n);
        drop(p);
    }
    drop((kept_services, kept_slices));
    times.sort();
    println!(
        "plan (from scratch): {n} Services x {m} endpoints: median {:.1} ms, min {:.1} ms",
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[0].as_secs_f64() * 1e3
    );

    // The agent's path: a planner kept between syncs, one EndpointSlice changed per sync.
    let live0 = heap::live();
    let fp0 = footprint();
    // Stored as the agent's inbox stores them.
    let mut objects = Objects::from_lists(
        services.iter().cloned().map(Into::into),
        slices.iter().cloned().map(Into::into),
    );
    let live_objects = heap::live();
    let fp_objects = footprint();
    let ctx = Context::new(
        node.clone(),
        local.clone(),
        Families {
            v4: true,
            v6: false,
        },
        config.clone(),
    );
    let mut planner = Planner::new();
    let live_ctx = heap::live();
    let fp_ctx = footprint();
    let before_planner = peak_from_now();
    planner.update(&objects, &ctx, None);
    let peak_planner = heap::peak_above(before_planner);
    let live_planner = heap::live();
    let fp_planner = footprint();
    let before_tables = peak_from_now();
    let tables = planner.tables();
    let live_tables = heap::live();
    let fp_tables = footprint();
    let peak_tables = heap::peak_above(before_tables);
    // A full replace's batch, as the committer encodes it (no kernel needed to encode).
    let before_batch = peak_from_now();
    let ops: Vec<_> = tables
        .iter()
        .flat_map(nodelb_netfilter::full_replace)
        .collect();
    let ops_live = heap::live() - before_batch;
    let batch = nodelb_netfilter::Batch::encode(1, &ops).expect("the planner's tables encode");
    let batch_peak = heap::peak_above(before_batch);
    let batch_live = heap::live() - before_batch;
    let (batch_bytes, batch_messages, n_ops) = (batch.len(), batch.message_count(), ops.len());
    drop((batch, ops));
    let elements: usize = tables
        .iter()
        .flat_map(|t| t.sets.values())
        .map(|s| s.elements.len())
        .sum();
    println!(
        "heap: {n} Services x {m} endpoints: objects {:.1} MiB, planner {:.1} MiB ({:.1} MiB at the peak of planning from scratch), tables {:.1} MiB ({elements} elements, {} chains; {:.1} MiB at the peak of assembling them)",
        mib(live_objects - live0),
        mib(live_planner - live_ctx),
        mib(peak_planner),
        mib(live_tables - live_planner),
        tables.iter().map(|t| t.chains.len()).sum::<usize>(),
        mib(peak_tables),
    );
    println!(
        "heap: objects {}; planner {}; tables {}",
        chunks_text(fp0, fp_objects),
        chunks_text(fp_ctx, fp_planner),
        chunks_text(fp_planner, fp_tables),
    );
    println!(
        "heap: a full replace's batch of those tables ({batch_bytes} bytes in {batch_messages} messages, from {n_ops} operations taking {:.1} MiB): {:.1} MiB kept until committed, {:.1} MiB at the peak of encoding",
        mib(ops_live),
        mib(batch_live),
        mib(batch_peak),
    );
    let mut o = Planner::outcomes_only();
    let before_o = heap::live();
    o.update(&objects, &ctx, None);
    println!(
        "heap: an outcomes-only planner (the leader keeps one per class of serving nodes): {:.1} MiB",
        mib(heap::live() - before_o)
    );
    drop(o);
    // The agent's whole syncs: the tables consumed while encoded (what they and the batch
    // hold at once is the agent's peak above its steady state).
    let before_consuming = peak_from_now();
    let batch = nodelb_netfilter::Batch::encode_replace(1, tables, &Default::default(), &mut || {})
        .expect("they encode");
    let consuming_peak = heap::peak_above(before_consuming);
    drop(batch);
    println!(
        "heap: a consuming replace of those tables (Batch::encode_replace): peak {:.1} MiB above the tables (each element freed once encoded; the batch, {:.1} MiB, in pieces of 4 KiB, then 120 KiB)",
        mib(consuming_peak),
        mib(batch_bytes),
    );
    let mut times = Vec::new();
    for k in 0..200 {
        let mut s = slices[(k * 37) % n].clone();
        s.endpoints[0].addresses[0] = format!("198.51.100.{}", 2 + k % 250).into();
        let s = Arc::new(s.into());
        let t0 = Instant::now();
        let dirty = objects.put_slice(s).into_iter().collect();
        let u = planner.update(&objects, &ctx, Some(&dirty));
        times.push(t0.elapsed());
        assert!(matches!(u.change, TableChange::Edit(_)));
    }
    times.sort();
    println!(
        "planner update (one slice changed): {n} Services x {m} endpoints: median {:.3} ms, p99 {:.3} ms",
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[times.len() * 99 / 100].as_secs_f64() * 1e3
    );
}
