//! The agent's Prometheus metrics (`/metrics`), all prefixed `nodelb_`.
//!
//! Per-Service packet, byte and source-range drop counters are read from the kernel's counter
//! objects on each scrape (one `NFT_MSG_GETOBJ` dump per table), not on each sync: a scrape
//! every 15-60 s costs a dump of at most two objects per Service port, while syncs come with
//! every endpoint change and would still leave the values stale between them. Labels come
//! from the counters' names, so the values need no state from the sync loop.
//!
//! A scrape is streamed: the text goes to the response in chunks of about [`CHUNK`] bytes as
//! it is encoded, so a scrape of 10,000 Services never holds its whole text (megabytes).

use futures::Stream;
use nodelb_core::plan::config::Config;
use nodelb_core::plan::table::{parse_counter_name, CounterKind};
use nodelb_core::plan::topology::Ignored;
use nodelb_core::vocab::{Families, IpFamily};
use nodelb_netfilter::{CounterValues, Nft};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or `error`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InvalidLabels {
    /// `Service`, `EndpointSlice` or `Node`.
    pub kind: String,
    /// `decode`: the object does not deserialize; `plan`: the planner found a problem in it.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabel {
    /// `pods` (the agents' Pods' Ready condition) or `kubelet-leases` (the kubelets' node
    /// Leases).
    pub signal: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// `ok`, `error`, `conflict` (another manager got there), `cleared`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FlowLabels {
    /// `IPv4` or `IPv6`.
    pub family: &'static str,
    /// `UDP` or `SCTP`.
    pub protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    /// `services`, `endpointslices` or `nodes`.
    pub resource: &'static str,
}

/// One Service port in one family.
/// Borrowed from the counter names read, so a scrape of 10,000 Services copies no label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct ServicePortLabels<'a> {
    pub namespace: &'a str,
    pub service: &'a str,
    /// The port's name, else its number.
    pub port: &'a str,
    /// `IPv4` or `IPv6`.
    pub family: &'static str,
}

// (The derive does not take a lifetime.)
impl EncodeLabelSet for ServicePortLabels<'_> {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder,
    ) -> Result<(), std::fmt::Error> {
        [
            ("namespace", self.namespace),
            ("service", self.service),
            ("port", self.port),
            ("family", self.family),
        ]
        .encode(encoder)
    }
}

/// Where the per-Service counters come from on each scrape.
pub trait CounterSource: Send + Sync + std::fmt::Debug + 'static {
    /// Each counter as read (family, name, packets, bytes), straight from the source: a
    /// scrape visits them once per metric family and keeps none.
    fn visit(&self, each: &mut dyn FnMut(IpFamily, &str, u64, u64));

    /// Every counter, name → (packets, bytes) per family read.
    fn read(&self) -> Vec<(IpFamily, CounterValues)> {
        let mut out: Vec<(IpFamily, CounterValues)> = Vec::new();
        self.visit(&mut |family, name, packets, bytes| {
            if out.last().is_none_or(|(f, _)| *f != family) {
                out.push((family, CounterValues::new()));
            }
            let (_, values) = out.last_mut().expect("pushed above");
            values.insert(name.to_string(), (packets, bytes));
        });
        out
    }
}

/// Visit counter values already read, as [`CounterSource::visit`] does.
pub fn visit_values(
    read: &[(IpFamily, CounterValues)],
    each: &mut dyn FnMut(IpFamily, &str, u64, u64),
) {
    for (family, values) in read {
        for (name, (packets, bytes)) in values {
            each(*family, name, *packets, *bytes);
        }
    }
}

/// The kernel: nodelb's table of each enabled family, read over a fresh netlink socket.
#[derive(Debug)]
pub struct KernelCounters {
    pub config: Config,
    pub families: Families,
}

impl CounterSource for KernelCounters {
    fn visit(&self, each: &mut dyn FnMut(IpFamily, &str, u64, u64)) {
        let mut nft = match Nft::open() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read Service counters");
                return;
            }
        };
        for f in self.families.iter() {
            let tr = self.config.table_ref(f);
            if let Err(e) =
                nft.each_counter(&tr, |name, packets, bytes| each(f, name, packets, bytes))
            {
                tracing::warn!(table = %tr, error = %e, "cannot read Service counters");
            }
        }
    }
}

/// Encodes the kernel's counters as `nodelb_service_packets_total`,
/// `nodelb_service_bytes_total` and `nodelb_source_range_drops_total`.
#[derive(Debug)]
struct ServiceCounters(Box<dyn CounterSource>);

/// The metric families read from the kernel's counters, in the order of [`KERNEL_COUNTERS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sampled {
    /// A Service port's traffic counter: its packets.
    Packets,
    /// A Service port's traffic counter: its bytes.
    Bytes,
    /// A Service's source-range drop counter: its packets.
    Drops,
}

const SAMPLED: [Sampled; 3] = [Sampled::Packets, Sampled::Bytes, Sampled::Drops];

/// The sample of metric family `of` a counter gives, its labels borrowed from its name; none
/// for a name nodelb does not make or a counter of another family.
fn sample<'a>(
    family: IpFamily,
    name: &'a str,
    (packets, bytes): (u64, u64),
    of: Sampled,
) -> Option<(ServicePortLabels<'a>, u64)> {
    let (kind, namespace, service, port) = parse_counter_name(name)?;
    let value = match (of, kind) {
        (Sampled::Packets, CounterKind::Traffic) => packets,
        (Sampled::Bytes, CounterKind::Traffic) => bytes,
        (Sampled::Drops, CounterKind::SourceRangeDrops) => packets,
        _ => return None,
    };
    let labels = ServicePortLabels {
        namespace,
        service,
        port,
        family: family.label(),
    };
    Some((labels, value))
}

/// The samples of one metric family from counter values, in the order read.
fn samples(
    read: &[(IpFamily, CounterValues)],
    of: Sampled,
) -> impl Iterator<Item = (ServicePortLabels<'_>, u64)> {
    read.iter().flat_map(move |(family, values)| {
        values
            .iter()
            .filter_map(move |(name, &values)| sample(*family, name, values, of))
    })
}

/// The three metric families from counter values; names nodelb does not make are skipped.
pub fn service_counter_samples(
    read: &[(IpFamily, CounterValues)],
) -> [Vec<(ServicePortLabels<'_>, u64)>; 3] {
    SAMPLED.map(|of| samples(read, of).collect())
}

/// The counters read from the kernel on each scrape: name (before `_total`) and help.
pub const KERNEL_COUNTERS: [(&str, &str); 3] = [
    (
        "service_packets",
        "Packets of a Service port's connections, both directions, counted in the kernel",
    ),
    (
        "service_bytes",
        "Bytes of a Service port's connections, both directions, counted in the kernel",
    ),
    (
        "source_range_drops",
        "Packets from sources outside loadBalancerSourceRanges, dropped",
    ),
];

impl Collector for ServiceCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Each family straight from the source, which is read once per family: no list of
        // the counters, nor of the samples.
        for ((name, help), of) in KERNEL_COUNTERS.iter().zip(SAMPLED) {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            let mut result = Ok(());
            self.0.visit(&mut |f, name, packets, bytes| {
                if result.is_err() {
                    return;
                }
                if let Some((labels, v)) = sample(f, name, (packets, bytes), of) {
                    result = family
                        .encode_family(&labels)
                        .and_then(|m| ConstCounter::new(v).encode(m));
                }
            });
            result?;
        }
        Ok(())
    }
}

pub struct Metrics {
    /// The agent's own metrics. Encoding one holds its lock, which the sync loop and the
    /// leader take to update it, so a scrape encodes them into memory (a few KiB) before
    /// it sends anything.
    registry: Registry,
    /// The kernel's per-Service counters (nothing, without a source): most of a scrape's text,
    /// encoded straight into the response.
    service_counters: Registry,
    pub sync_duration: Histogram,
    /// From the first watch event a sync takes to its commit.
    pub event_to_kernel: Histogram,
    pub syncs: Family<ResultLabel, Counter>,
    pub sync_objects: Gauge,
    pub sync_bytes: Gauge,
    pub services_programmed: Gauge,
    pub endpoints_programmed: Gauge,
    /// Service ports whose topology hints this node ignores, by reason.
    pub topology_hints_ignored: Family<ReasonLabel, Gauge>,
    pub drift_repairs: Counter,
    /// Periodic resyncs by result: `unchanged` (nothing sent) or `repaired`.
    pub resyncs: Family<ResultLabel, Counter>,
    pub invalid_objects: Family<InvalidLabels, Counter>,
    pub watch_errors: Family<ResourceLabel, Counter>,
    pub leader: Gauge,
    pub lease_transitions: Gauge,
    pub heartbeat_age: Family<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The leader: 1 while it can read a liveness signal, 0 while its RBAC does not let it.
    pub liveness_readable: Family<SignalLabel, Gauge>,
    pub status_writes: Family<WriteLabel, Counter>,
    pub heartbeats: Family<ResultLabel, Counter>,
    /// Reads of the host's listening sockets, by result.
    pub listener_reads: Family<ResultLabel, Counter>,
    /// Service ports host listeners hold on this node.
    pub blocked_ports: Gauge,
    /// Conntrack entries of nodelb's UDP and SCTP Service ports deleted as stale.
    pub conntrack_deleted: Family<FlowLabels, Counter>,
    /// Conntrack cleanups after a commit, `ok` or `error`.
    pub conntrack_cleanups: Family<ResultLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// Metrics without per-Service counters.
    pub fn new() -> Metrics {
        Metrics::build(None)
    }

    /// Metrics whose scrapes read per-Service counters from `source`.
    pub fn with_counters(source: Box<dyn CounterSource>) -> Metrics {
        Metrics::build(Some(source))
    }

    fn build(counters: Option<Box<dyn CounterSource>>) -> Metrics {
        let mut r = Registry::with_prefix("nodelb");
        let (leader, lease_transitions, heartbeat_age, status_writes, heartbeats) =
            status_metrics(&mut r);
        let (sync_duration, event_to_kernel) = latency_metrics(&mut r);
        let (syncs, sync_objects, sync_bytes) = sync_metrics(&mut r);
        let (services_programmed, endpoints_programmed, topology_hints_ignored) =
            programmed_metrics(&mut r);
        let (drift_repairs, resyncs) = repair_metrics(&mut r);
        let (listener_reads, blocked_ports) = listener_metrics(&mut r);
        let (invalid_objects, watch_errors) = input_metrics(&mut r);
        let (conntrack_deleted, conntrack_cleanups) = conntrack_metrics(&mut r);
        let liveness_readable = register(
            &mut r,
            "liveness_signal_readable",
            "The status leader: 1 while it can list and watch a liveness signal (pods: the agents' Pods; kubelet-leases: the kubelets' node Leases), 0 while it cannot (its RBAC)",
            Family::<SignalLabel, Gauge>::default(),
        );
        build_info(&mut r);
        Metrics {
            registry: r,
            service_counters: service_counters(counters),
            sync_duration,
            event_to_kernel,
            syncs,
            sync_objects,
            sync_bytes,
            services_programmed,
            endpoints_programmed,
            topology_hints_ignored,
            drift_repairs,
            resyncs,
            invalid_objects,
            watch_errors,
            leader,
            lease_transitions,
            heartbeat_age,
            liveness_readable,
            status_writes,
            heartbeats,
            listener_reads,
            blocked_ports,
            conntrack_deleted,
            conntrack_cleanups,
        }
    }

    pub fn record_sync(&self, took: Duration, ok: bool) {
        self.sync_duration.observe(took.as_secs_f64());
        let result = if ok { "ok" } else { "error" };
        self.syncs.get_or_create(&ResultLabel { result }).inc();
    }

    /// The Service ports whose topology hints are ignored, by reason in
    /// [`Ignored::ALL`] order (every reason is set, zero included).
    pub fn set_hints_ignored(&self, counts: &[usize; Ignored::ALL.len()]) {
        for (why, n) in Ignored::ALL.iter().zip(counts) {
            self.topology_hints_ignored
                .get_or_create(&ReasonLabel {
                    reason: why.label(),
                })
                .set(*n as i64);
        }
    }

    pub fn invalid(&self, kind: impl ToString, reason: &'static str) {
        self.invalid_objects
            .get_or_create(&InvalidLabels {
                kind: kind.to_string(),
                reason,
            })
            .inc();
    }

    pub fn watch_error(&self, resource: &'static str) {
        self.watch_errors
            .get_or_create(&ResourceLabel { resource })
            .inc();
    }

    /// The text exposition (OpenMetrics text, which Prometheus scrapes).
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.encode(&mut out)
            .expect("writing to a String cannot fail");
        out
    }

    /// The text of [`Metrics::render`] into `out`: the agent's own metrics (through memory,
    /// so that none of their locks is held while `out` blocks), the kernel's counters, `# EOF`.
    /// Stops at the first error of `out`.
    pub fn encode(&self, out: &mut impl fmt::Write) -> fmt::Result {
        let mut own = String::new();
        encode_registry(&mut own, &self.registry)?;
        out.write_str(&own)?;
        drop(own);
        encode_registry(out, &self.service_counters)?;
        encode_eof(out)
    }

    /// The text of [`Metrics::render`] as a stream of chunks for an HTTP response, encoded on
    /// a blocking thread (a scrape reads the kernel's counters over netlink) at most a few
    /// chunks ahead of the reader. Dropping the stream (the client went away) stops the
    /// encoding at its next chunk. A scrape that cannot be encoded whole ends in an error, so
    /// that the client sees a broken response rather than a short one.
    pub fn stream(self: Arc<Self>) -> impl Stream<Item = Result<String, ScrapeError>> + Send {
        let (tx, rx) = mpsc::channel(2);
        let encoder = tokio::task::spawn_blocking(move || {
            let mut out = ChunkWriter::new(tx);
            self.encode(&mut out)?;
            out.finish()
        });
        futures::stream::unfold(Some((rx, encoder)), |state| async move {
            let (mut rx, encoder) = state?;
            if let Some(chunk) = rx.recv().await {
                return Some((Ok(chunk), Some((rx, encoder))));
            }
            // The encoder is done, and its sender with it: whole, or not.
            let e = match encoder.await {
                Ok(Ok(())) => return None,
                Ok(Err(e)) => ScrapeError::Encode(e),
                Err(e) => ScrapeError::Encoder(e),
            };
            tracing::warn!(error = %e, "metrics scrape failed");
            Some((Err(e), None))
        })
    }
}

/// Why a streamed scrape ended before its end.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("encoding the metrics")]
    Encode(#[source] fmt::Error),
    #[error("the metrics encoder panicked or was cancelled")]
    Encoder(#[source] tokio::task::JoinError),
}

/// Text goes to a streamed scrape in chunks of about this many bytes.
pub const CHUNK: usize = 64 * 1024;

/// A [`fmt::Write`] that hands its text on in chunks of about [`CHUNK`] bytes through a
/// bounded channel, waiting while the channel is full; so it must not run on an async worker.
/// Once the receiver is gone every write fails, which stops the encoding that writes.
struct ChunkWriter {
    buf: String,
    tx: mpsc::Sender<String>,
}

impl ChunkWriter {
    fn new(tx: mpsc::Sender<String>) -> ChunkWriter {
        ChunkWriter {
            buf: String::with_capacity(CHUNK),
            tx,
        }
    }

    fn send(&mut self) -> fmt::Result {
        let chunk = std::mem::take(&mut self.buf);
        self.tx.blocking_send(chunk).map_err(|_| fmt::Error)?;
        // The next buffer only once this one is in the channel.
        self.buf.reserve(CHUNK);
        Ok(())
    }

    /// Send what is left.
    fn finish(self) -> fmt::Result {
        if self.buf.is_empty() {
            return Ok(());
        }
        self.tx.blocking_send(self.buf).map_err(|_| fmt::Error)
    }
}

impl fmt::Write for ChunkWriter {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Send before the buffer would grow; a piece longer than a chunk goes in one.
        if !self.buf.is_empty() && self.buf.len() + s.len() > CHUNK {
            self.send()?;
        }
        self.buf.push_str(s);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(())
    }
}

/// The Content-Type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How long syncs take, and how long a change waits in the agent until it is in the kernel.
fn latency_metrics(r: &mut Registry) -> (Histogram, Histogram) {
    // 1 ms .. ~16 s.
    let sync_duration = register(
        r,
        "sync_duration_seconds",
        "Time of one sync: plan, encode and commit",
        Histogram::new(exponential_buckets(0.001, 2.0, 15)),
    );
    // 0.5 ms .. ~16 s.
    let event_to_kernel = register(
        r,
        "event_to_kernel_seconds",
        "From the agent's receipt of the first Service or EndpointSlice change a sync takes to its commit in the kernel",
        Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
    );
    (sync_duration, event_to_kernel)
}

/// Syncs by result, and the objects and bytes of the last committed one.
fn sync_metrics(r: &mut Registry) -> (Family<ResultLabel, Counter>, Gauge, Gauge) {
    let syncs = register(
        r,
        "syncs",
        "Syncs by result",
        Family::<ResultLabel, Counter>::default(),
    );
    let sync_objects = register(
        r,
        "sync_objects",
        "Objects (table, chains, rules, sets, elements) in the tables of the last committed sync",
        Gauge::default(),
    );
    let sync_bytes = register(
        r,
        "sync_bytes",
        "Bytes of the netlink batch of the last committed sync",
        Gauge::default(),
    );
    (syncs, sync_objects, sync_bytes)
}

/// What this node programs: Services, endpoints, and the ports whose hints it ignores.
fn programmed_metrics(r: &mut Registry) -> (Gauge, Gauge, Family<ReasonLabel, Gauge>) {
    let services = register(
        r,
        "services_programmed",
        "Services with rules on this node",
        Gauge::default(),
    );
    let endpoints = register(
        r,
        "endpoints_programmed",
        "Endpoints behind programmed Service ports, summed over families and ports",
        Gauge::default(),
    );
    let hints_ignored = register(
        r,
        "topology_hints_ignored",
        "Service ports (per family) whose endpoints' topology hints this node ignores (every endpoint is used), by reason",
        Family::<ReasonLabel, Gauge>::default(),
    );
    (services, endpoints, hints_ignored)
}

/// Problems in the input: invalid objects and watch errors.
fn input_metrics(
    r: &mut Registry,
) -> (
    Family<InvalidLabels, Counter>,
    Family<ResourceLabel, Counter>,
) {
    let invalid = register(
        r,
        "invalid_objects",
        "Problems found in input objects, one per new problem",
        Family::<InvalidLabels, Counter>::default(),
    );
    let watch_errors = register(
        r,
        "watch_errors",
        "Errors of the Kubernetes watches",
        Family::<ResourceLabel, Counter>::default(),
    );
    (invalid, watch_errors)
}

/// Conntrack cleanups: entries deleted, and cleanups by result.
/// The labels of `nodelb_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

/// `nodelb_build_info{version, commit} 1`: which build is running.
fn build_info(r: &mut Registry) {
    r.register(
        "build",
        "The agent's version and the git commit it was built from",
        Info::new(BuildLabels {
            version: crate::PACKAGE_VERSION,
            commit: crate::GIT_COMMIT,
        }),
    );
}

fn conntrack_metrics(
    r: &mut Registry,
) -> (Family<FlowLabels, Counter>, Family<ResultLabel, Counter>) {
    let deleted = register(
        r,
        "conntrack_entries_deleted",
        "Conntrack entries of nodelb's UDP and SCTP Service ports deleted because their endpoint no longer serves the port, or made before the port had its endpoints",
        Family::<FlowLabels, Counter>::default(),
    );
    let cleanups = register(
        r,
        "conntrack_cleanups",
        "Deletions of stale conntrack entries after a commit, by result (an error is retried after the next commit)",
        Family::<ResultLabel, Counter>::default(),
    );
    (deleted, cleanups)
}

/// Drift: full replaces that repaired it, and the periodic resyncs that look for it.
fn repair_metrics(r: &mut Registry) -> (Counter, Family<ResultLabel, Counter>) {
    let drift_repairs = register(
        r,
        "drift_repairs",
        "Full replaces because another process changed nodelb's tables",
        Counter::default(),
    );
    let resyncs = register(
        r,
        "resyncs",
        "Periodic resyncs: unchanged (the tables read back as committed; nothing sent) or repaired (drift found; the tables replaced)",
        Family::<ResultLabel, Counter>::default(),
    );
    (drift_repairs, resyncs)
}

/// The host's listeners: reads, and the Service ports they hold.
fn listener_metrics(r: &mut Registry) -> (Family<ResultLabel, Counter>, Gauge) {
    let reads = register(
        r,
        "listener_reads",
        "Reads of the host's listening sockets (sock_diag), by result: ok or error (the last set read stays in use)",
        Family::<ResultLabel, Counter>::default(),
    );
    let blocked = register(
        r,
        "blocked_ports",
        "Service ports (family, protocol, port) a process listening on this node holds: no Service gets them here",
        Gauge::default(),
    );
    (reads, blocked)
}

/// The kernel's per-Service counters, read from `source` at each scrape (an empty registry
/// without one).
fn service_counters(source: Option<Box<dyn CounterSource>>) -> Registry {
    let mut r = Registry::with_prefix("nodelb");
    if let Some(source) = source {
        r.register_collector(Box::new(ServiceCounters(source)));
    }
    r
}

/// The status side's metrics: election, heartbeats, status writes.
#[allow(clippy::type_complexity)]
fn status_metrics(
    r: &mut Registry,
) -> (
    Gauge,
    Gauge,
    Family<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    Family<WriteLabel, Counter>,
    Family<ResultLabel, Counter>,
) {
    let leader = register(
        r,
        "leader",
        "1 while this agent holds the Lease nodelb-status and writes Service status",
        Gauge::default(),
    );
    let lease_transitions = register(
        r,
        "lease_transitions",
        "leaseTransitions of the Lease nodelb-status as last seen",
        Gauge::default(),
    );
    let heartbeat_age = register(
        r,
        "heartbeat_age_seconds",
        "Age of the liveness signal the leader judges each node by (its kubelet's node Lease for an agent in a Pod, else its heartbeat Lease): time since it last saw the renewal change, on its own clock",
        Family::<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>>::default(),
    );
    let status_writes = register(
        r,
        "status_writes",
        "Service status writes by the leader, by result",
        Family::<WriteLabel, Counter>::default(),
    );
    let heartbeats = register(
        r,
        "heartbeats",
        "Renewals of this node's heartbeat Lease, by result",
        Family::<ResultLabel, Counter>::default(),
    );
    (
        leader,
        lease_transitions,
        heartbeat_age,
        status_writes,
        heartbeats,
    )
}

/// Register `metric` under `name` and hand it back to keep.
fn register<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_metric_with_its_name_and_labels() {
        let m = Metrics::new();
        m.record_sync(Duration::from_millis(3), true);
        m.record_sync(Duration::from_millis(3), false);
        m.sync_objects.set(42);
        m.sync_bytes.set(4096);
        m.services_programmed.set(2);
        m.endpoints_programmed.set(5);
        m.drift_repairs.inc();
        m.invalid("Service", "plan");
        m.watch_error("endpointslices");
        m.leader.set(1);
        m.lease_transitions.set(3);
        m.heartbeat_age
            .get_or_create(&NodeLabel {
                node: "node-a".into(),
            })
            .set(1.5);
        m.status_writes
            .get_or_create(&WriteLabel { result: "ok" })
            .inc();
        m.heartbeats
            .get_or_create(&ResultLabel { result: "ok" })
            .inc();
        let text = m.render();
        for line in [
            "# TYPE nodelb_sync_duration_seconds histogram",
            "nodelb_sync_duration_seconds_count 2",
            "nodelb_syncs_total{result=\"ok\"} 1",
            "nodelb_syncs_total{result=\"error\"} 1",
            "nodelb_sync_objects 42",
            "nodelb_sync_bytes 4096",
            "nodelb_services_programmed 2",
            "nodelb_endpoints_programmed 5",
            "nodelb_drift_repairs_total 1",
            "nodelb_invalid_objects_total{kind=\"Service\",reason=\"plan\"} 1",
            "nodelb_watch_errors_total{resource=\"endpointslices\"} 1",
            "nodelb_leader 1",
            "nodelb_lease_transitions 3",
            "nodelb_heartbeat_age_seconds{node=\"node-a\"} 1.5",
            "nodelb_status_writes_total{result=\"ok\"} 1",
            "nodelb_heartbeats_total{result=\"ok\"} 1",
            "# EOF",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(
            text.contains("nodelb_sync_duration_seconds_bucket{le=\"0.004\"} 2"),
            "{text}"
        );
    }

    #[derive(Debug)]
    struct Fixed(Vec<(IpFamily, CounterValues)>);

    impl CounterSource for Fixed {
        fn visit(&self, each: &mut dyn FnMut(IpFamily, &str, u64, u64)) {
            visit_values(&self.0, each)
        }
    }

    #[test]
    fn service_counters_are_exported_per_port_and_family_from_counter_names() {
        let v4: CounterValues = [
            ("svc/default/web/http".to_string(), (10, 1500)),
            ("drops/default/web/http".to_string(), (3, 180)),
            ("svc/1team/dns/53".to_string(), (2, 120)),
            ("someone-elses".to_string(), (99, 99)),
        ]
        .into();
        let v6: CounterValues = [("svc/default/web/http".to_string(), (4, 400))].into();
        let m = Metrics::with_counters(Box::new(Fixed(vec![
            (IpFamily::V4, v4),
            (IpFamily::V6, v6),
        ])));
        let text = m.render();
        for line in [
            "# TYPE nodelb_service_packets counter",
            "nodelb_service_packets_total{namespace=\"default\",service=\"web\",port=\"http\",family=\"IPv4\"} 10",
            "nodelb_service_bytes_total{namespace=\"default\",service=\"web\",port=\"http\",family=\"IPv4\"} 1500",
            "nodelb_service_packets_total{namespace=\"default\",service=\"web\",port=\"http\",family=\"IPv6\"} 4",
            "nodelb_service_packets_total{namespace=\"1team\",service=\"dns\",port=\"53\",family=\"IPv4\"} 2",
            "nodelb_source_range_drops_total{namespace=\"default\",service=\"web\",port=\"http\",family=\"IPv4\"} 3",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(
            !text.contains("someone-elses") && !text.contains(" 99"),
            "{text}"
        );
    }

    /// `n` Service ports with traffic counters in IPv4 and IPv6, and drops for every tenth.
    fn many_services(n: u64) -> Metrics {
        let mut v4 = CounterValues::new();
        let mut v6 = CounterValues::new();
        for i in 0..n {
            let ns = format!("team-{}", i % 50);
            v4.insert(format!("svc/{ns}/svc-{i}/http"), (i, 1500 * i));
            v6.insert(format!("svc/{ns}/svc-{i}/http"), (2 * i, 900 * i));
            if i % 10 == 0 {
                v4.insert(format!("drops/{ns}/svc-{i}/http"), (7 * i, 0));
            }
        }
        let m = Metrics::with_counters(Box::new(Fixed(vec![
            (IpFamily::V4, v4),
            (IpFamily::V6, v6),
        ])));
        m.record_sync(Duration::from_millis(3), true);
        m.heartbeat_age
            .get_or_create(&NodeLabel {
                node: "node-a".into(),
            })
            .set(1.5);
        m
    }

    #[tokio::test]
    async fn a_streamed_scrape_is_the_rendered_text_in_chunks() {
        use futures::StreamExt;
        let m = Arc::new(many_services(10_000));
        let chunks: Vec<String> = m
            .clone()
            .stream()
            .map(|c| c.expect("a whole scrape"))
            .collect()
            .await;
        let text = m.render();
        assert!(
            chunks.len() > 20 && chunks.iter().all(|c| c.len() <= CHUNK),
            "{} chunks of {:?} bytes",
            chunks.len(),
            chunks.iter().map(String::len).collect::<Vec<_>>()
        );
        let streamed = chunks.concat();
        // (Not assert_eq!: a difference would print megabytes.)
        let same = streamed.len() == text.len() && streamed == text;
        let first_difference = streamed.bytes().zip(text.bytes()).position(|(a, b)| a != b);
        assert!(
            same,
            "streamed {} bytes, rendered {}; first difference at {first_difference:?}",
            streamed.len(),
            text.len()
        );
        assert!(text.ends_with("\n# EOF\n"));
        assert!(text.contains(
            "nodelb_service_bytes_total{namespace=\"team-49\",service=\"svc-9999\",port=\"http\",family=\"IPv6\"} 8999100\n"
        ));
    }

    #[test]
    fn a_chunk_writer_stops_the_encoding_once_its_reader_is_gone() {
        let m = many_services(10_000);
        let (tx, mut rx) = mpsc::channel(2);
        let (done_tx, done) = std::sync::mpsc::channel();
        let encoder = std::thread::spawn(move || {
            let mut out = ChunkWriter::new(tx);
            let encoded = m.encode(&mut out);
            done_tx.send(()).unwrap();
            encoded
        });
        assert!(rx.blocking_recv().is_some());
        // The client hangs up after the first chunk.
        drop(rx);
        // The encoder waits for room in the channel, at most until then; not forever.
        done.recv_timeout(Duration::from_secs(30))
            .expect("the encoder stopped");
        assert_eq!(encoder.join().expect("no panic"), Err(fmt::Error));
    }

    #[tokio::test]
    async fn dropping_a_streamed_scrape_releases_its_encoder() {
        use futures::StreamExt;
        let m = Arc::new(many_services(10_000));
        let mut chunks = m.clone().stream().boxed();
        assert!(chunks.next().await.expect("a chunk").is_ok());
        drop(chunks);
        // The encoder holds its own reference until it stops.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while Arc::strong_count(&m) > 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "the encoder still runs"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // And the next scrape is whole.
        let chunks: Vec<_> = m.clone().stream().collect().await;
        assert!(chunks.iter().all(Result::is_ok));
    }
}
