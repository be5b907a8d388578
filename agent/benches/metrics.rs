//! How much heap one `/metrics` scrape takes at N Services (one port each, IPv4, as in the
//! latency bench of `nodelb-integration`): the scrape's text rendered into one String
//! (`Metrics::render`) or streamed in chunks (`Metrics::stream`, what the agent serves) to a
//! reader that drops each chunk, as the HTTP server does once it has written it. The counters
//! are visited as read, once per metric family, and never collected; what collecting them
//! into a map (`CounterSource::read`, as a scrape did before) costs is printed beside.
//! Heap is counted by a wrapping global allocator (bytes requested and still live; malloc's
//! own overhead comes on top).
//! `cargo bench -p nodelb-agent --bench metrics`; NODELB_BENCH_SERVICES.

use futures::StreamExt;
use nodelb_agent::metrics::{visit_values, CounterSource, Metrics};
use nodelb_core::vocab::IpFamily;
use nodelb_netfilter::CounterValues;
use std::sync::Arc;

mod heap;

use heap::{mib, peak_above, peak_from_now};

/// The counters as the kernel's table holds them: a visit allocates nothing, as the names of a
/// netlink dump are borrowed from its messages.
#[derive(Debug)]
struct Dump(Vec<(IpFamily, CounterValues)>);

impl CounterSource for Dump {
    fn visit(&self, each: &mut dyn FnMut(IpFamily, &str, u64, u64)) {
        visit_values(&self.0, each)
    }
}

fn main() {
    let n: u64 = std::env::var("NODELB_BENCH_SERVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let values: CounterValues = (0..n)
        .map(|i| {
            (
                format!("svc/bench/svc-{i}/http"),
                (1_000 + i * 37, 1_000_000 + i * 4_100),
            )
        })
        .collect();
    let source = Dump(vec![(IpFamily::V4, values)]);

    let base = peak_from_now();
    let read = source.read();
    let read_live = heap::live() - base;
    drop(read);

    let metrics = Arc::new(Metrics::with_counters(Box::new(source)));
    metrics.record_sync(std::time::Duration::from_millis(40), true);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Returns the bytes and chunks streamed.
    let stream = || {
        rt.block_on(async {
            let mut chunks = std::pin::pin!(metrics.clone().stream());
            let (mut len, mut n) = (0, 0);
            while let Some(chunk) = chunks.next().await {
                len += chunk.expect("a whole scrape").len();
                n += 1;
            }
            (len, n)
        })
    };
    // The first starts the blocking thread, which stays for the next.
    stream();

    let base = peak_from_now();
    let text = metrics.render();
    let render_peak = peak_above(base);
    let len = text.len();
    drop(text);

    let base = peak_from_now();
    let (streamed, chunks) = stream();
    let stream_peak = peak_above(base);
    assert_eq!(streamed, len);
    println!(
        "heap: a scrape of {n} Services ({len} bytes of text): the counters collected into a map {:.2} MiB (a scrape keeps none); at the peak: rendered into one String {:.2} MiB, streamed in {chunks} chunks {:.2} MiB",
        mib(read_live),
        mib(render_peak),
        mib(stream_peak),
    );
}
