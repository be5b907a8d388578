//! The benchmarks' ruleset: `n` LoadBalancer Services with `eps` endpoints each, as fixture
//! objects, and the table and the planner the agent's planner makes of them on one node.

use nodelb_core::fixtures::{node, Ep, Slice, Svc};
use nodelb_core::plan::{self, Context, Objects, Planner};
use nodelb_netfilter::{ElemData, Key, L4Proto, Table, Value};
use std::net::{IpAddr, Ipv4Addr};

/// The node address of [`bench_table`] and of the node the benches plan [`bench_objects`] for.
pub const BENCH_NODE_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1));

/// Benchmark Service `i`: `bench/svc-<i>`, LoadBalancer, TCP port `1024 + i` named `http`.
pub fn bench_service(i: usize) -> Svc {
    let port = u16::try_from(1024 + i).expect("at most 64,511 benchmark Services");
    Svc::lb("bench", &format!("svc-{i}"))
        .created("2024-01-01T00:00:00Z")
        .port("http", port, "TCP")
}

/// The addresses of Service `i`'s `eps` endpoints: they cycle through 198.51.100.2-251.
pub fn bench_endpoints(i: usize, eps: usize) -> Vec<IpAddr> {
    (0..eps)
        .map(|e| {
            let host = ((i * eps + e) % 250 + 2) as u8;
            IpAddr::V4(Ipv4Addr::new(198, 51, 100, host))
        })
        .collect()
}

/// Service `i`'s one EndpointSlice `bench/svc-<i>-1`: port `http` → 8080, an endpoint at each
/// of `addresses`.
pub fn bench_slice(i: usize, addresses: &[IpAddr]) -> Slice {
    Slice::ipv4("bench", &format!("svc-{i}-1"), &format!("svc-{i}"))
        .port("http", 8080, "TCP")
        .endpoints(addresses.iter().map(Ep::at))
}

/// `n` benchmark Services, each with its slice of `eps` endpoints.
pub fn bench_objects(n: usize, eps: usize) -> Vec<(Svc, Slice)> {
    bench_objects_with(n, eps, false)
}

/// [`bench_objects`], every Service with `sessionAffinity: ClientIP` (the default timeout)
/// when `affinity`.
pub fn bench_objects_with(n: usize, eps: usize, affinity: bool) -> Vec<(Svc, Slice)> {
    (0..n)
        .map(|i| {
            let service = match affinity {
                true => bench_service(i).spec("sessionAffinity", "ClientIP"),
                false => bench_service(i),
            };
            (service, bench_slice(i, &bench_endpoints(i, eps)))
        })
        .collect()
}

/// The benchmark's table: the `ip nodelb` table the agent's planner builds for `n` LoadBalancer
/// Services (`bench/svc-<i>`, TCP port `1024 + i`) with `eps` ready endpoints each, on a node
/// whose address is 203.0.113.1 — the shape nodelb really programs (dispatch map, endpoint
/// map, per-Service chains and counters). Reserved ports are switched off so every port counts.
pub fn bench_table(n: usize, eps: usize) -> Table {
    let (planner, _, _) = bench_planner(n, eps, false);
    planner.tables().into_iter().next().expect("the ip table")
}

/// The agent's planner after planning [`bench_objects_with`] from nothing, with the objects
/// and the context it planned them in (the node of [`bench_table`]), for benchmarks that
/// change the objects and commit the planner's edits as the agent does.
pub fn bench_planner(n: usize, eps: usize, affinity: bool) -> (Planner, Objects, Context) {
    let (services, slices): (Vec<_>, Vec<_>) =
        bench_objects_with(n, eps, affinity).into_iter().unzip();
    planner_for(&services, &slices)
}

/// The agent's planner after planning `services` and `slices` from nothing on the node of
/// [`bench_table`], with the objects and the context it planned them in.
pub fn planner_for(services: &[Svc], slices: &[Slice]) -> (Planner, Objects, Context) {
    let services: Vec<_> = services.iter().map(Svc::index).collect();
    let slices: Vec<_> = slices.iter().map(Slice::index).collect();
    let node = node("bench-node")
        .address("InternalIP", BENCH_NODE_ADDRESS)
        .info();
    let config = plan::config::Config {
        reserved_ports: plan::reserved::ReservedPorts::default(),
        ..plan::config::Config::default()
    };
    let families = nodelb_core::vocab::Families {
        v4: true,
        v6: false,
    };
    let ctx = Context::new(node, [BENCH_NODE_ADDRESS].into(), families, config);
    let objects = Objects::from_lists(services, slices);
    let mut planner = Planner::new();
    planner.update(&objects, &ctx, None);
    (planner, objects, ctx)
}

/// In a `bench_table`, move endpoint 0 of Service `i` to another target port: the smallest
/// change there is, used by the incremental test and the benchmark.
pub fn move_bench_endpoint(t: &mut Table, i: usize, to_port: u16) {
    let eps = t.set_mut("endpoints").expect("endpoints map");
    let key = Key::Values(
        vec![
            Value::Proto(L4Proto::Tcp),
            Value::Port(1024 + i as u16),
            Value::U32(0),
        ]
        .into(),
    );
    let e = eps
        .elements
        .get_mut(&key)
        .expect("endpoint 0 of the Service");
    let Some(ElemData::Values(vals)) = &mut e.data else {
        panic!("endpoint data is not a value list")
    };
    let mut v = vals.to_vec();
    v[1] = Value::Port(to_port);
    *vals = v.into();
}
