//! The command line: subcommands and flags, spelled as the README's tables spell them (every
//! flag of `run` is there: `integration/tests/docs.rs`), and the planner [`Config`] they
//! describe.

use crate::run::logging::LogFormat;
use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use nodelb_core::plan::addresses::{self, AddressFilter};
use nodelb_core::plan::cidr::Cidr;
use nodelb_core::plan::config::{Config, DEFAULT_LB_CLASS};
use nodelb_core::plan::node::AddressKind;
use nodelb_core::plan::reserved::ReservedPorts;
use nodelb_core::plan::servicelb::ServiceLb;
use nodelb_core::vocab::Protocol;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Node-local Kubernetes LoadBalancer agent: answers Services of `type: LoadBalancer` on the
/// node's own addresses by programming nftables (tables `ip nodelb` and `ip6 nodelb`).
#[derive(Debug, Parser)]
#[command(name = "nodelb-agent", version = crate::VERSION)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent: watch Services, EndpointSlices and this Node, and keep this node's
    /// nftables tables in step with them. Rules are left in place on exit.
    Run(Box<RunArgs>),
    /// Print the nft script (`nft -f` syntax) the agent would apply for the objects in FILEs.
    Render(FileArgs),
    /// Plan for the objects in FILEs and program the tables once; print one line of stats.
    Apply(FileArgs),
    /// Delete nodelb's tables (`ip nodelb`, `ip6 nodelb`), nothing else.
    Cleanup(CleanupArgs),
    /// Remove every Service status field owned by field manager `nodelb` (the ingress and
    /// nodelb's conditions), leaving other managers' fields; for uninstalling, once no agent
    /// runs. Exits non-zero if a Service could not be cleared.
    ClearStatus(ClearStatusArgs),
    /// Preflight: kernel features, families, sysctls, privileges, foreign forward policies.
    /// Exits non-zero and says what to fix when the node cannot run nodelb.
    Check(CheckArgs),
}

/// `clear-status`: which cluster, and the agents it waits for.
#[derive(Debug, Clone, Args)]
pub struct ClearStatusArgs {
    /// kubeconfig file. Default: `$KUBECONFIG`, else `~/.kube/config`, else the in-cluster
    /// service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace of the Lease `nodelb-status`. The status is cleared once that Lease has not
    /// changed for its lease duration (no leader is left to write it again), or at once when
    /// it does not exist.
    #[arg(long, default_value = "nodelb-system", value_name = "NS")]
    pub lease_namespace: String,

    /// How long to wait for the Lease to go quiet (and for `--wait-for-cleanup`) before
    /// giving up.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m",
          value_name = "DURATION")]
    pub wait: Duration,

    /// First stop the agents: delete this DaemonSet (in `--lease-namespace`), so its agents
    /// stop and the leader releases its Lease. For the chart's uninstall hook, which may
    /// delete the DaemonSet but not change it (Helm deletes the rest of the release after).
    #[arg(long, value_name = "DAEMONSET")]
    pub stop_agents: Option<String>,

    /// Last, wait until every pod of this DaemonSet (in `--lease-namespace`) is ready: the
    /// cleanup DaemonSet, whose pods become ready once `nodelb-agent cleanup` has deleted
    /// nodelb's tables on their node.
    #[arg(long, value_name = "DAEMONSET")]
    pub wait_for_cleanup: Option<String>,
}

/// `cleanup`: what it waits for first.
#[derive(Debug, Clone, Args)]
pub struct CleanupArgs {
    /// First wait until nothing answers on this address (the agent's `--health-addr` on this
    /// node, e.g. `127.0.0.1:9254`): a running agent would put its tables back.
    #[arg(long, value_name = "ADDR")]
    pub after_agent_stops: Option<SocketAddr>,

    /// How long to wait for the agent to stop before giving up.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m",
          value_name = "DURATION")]
    pub wait: Duration,
}

/// Families and which Services nodelb takes: shared by `run`, `render`, `apply`.
#[derive(Debug, Clone, Args)]
pub struct PlannerArgs {
    /// Program IPv4 (table `ip nodelb`). `--ipv4=false` turns it off.
    #[arg(long, action = ArgAction::Set, default_value_t = true, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub ipv4: bool,

    /// Program IPv6 (table `ip6 nodelb`). Off unless `--ipv6` or `--ipv6=true`.
    #[arg(long, action = ArgAction::Set, default_value_t = false, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub ipv6: bool,

    /// Also handle LoadBalancer Services that set no `spec.loadBalancerClass`.
    /// `--default-class=false` handles only Services of class `--lb-class`.
    #[arg(long, action = ArgAction::Set, default_value_t = true, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub default_class: bool,

    /// The `spec.loadBalancerClass` nodelb answers to.
    #[arg(long, default_value = DEFAULT_LB_CLASS, value_name = "CLASS")]
    pub lb_class: String,

    /// Ports (and ranges) no Service may take on this node, comma separated, replacing the
    /// default list: `22` for TCP, UDP and SCTP, `8472/udp` or `179/tcp` for one protocol.
    /// Default: the README's table of reserved ports, plus the TCP ports of `--health-addr`
    /// and `--metrics-addr`. An empty value (`--reserved-ports=`) reserves nothing.
    #[arg(long, value_parser = parse_reserved_ports, value_name = "PORTS")]
    pub reserved_ports: Option<ReservedPorts>,

    /// Only Services in these namespaces (comma separated) may be nodelb's. Default: all.
    #[arg(long, value_delimiter = ',', value_name = "NS,...")]
    pub allowed_namespaces: Option<Vec<String>>,

    /// The kinds of node address (`InternalIP`, `ExternalIP`, comma separated) that serve a
    /// Service without the annotation `nodelb.io/address-types`.
    #[arg(long, value_parser = parse_address_types, default_value = "InternalIP,ExternalIP",
          value_name = "TYPES")]
    pub address_types: BTreeSet<AddressKind>,

    /// The prefixes (comma separated) a node address must lie in to serve a Service without
    /// the annotation `nodelb.io/address-cidrs`. Default (or empty): any address.
    #[arg(long, value_parser = parse_address_cidrs, value_name = "CIDR,...")]
    pub address_cidrs: Option<CidrList>,
}

/// `--address-cidrs`: a list of prefixes, one flag value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrList(pub Vec<Cidr>);

fn parse_address_types(s: &str) -> Result<BTreeSet<AddressKind>, String> {
    addresses::parse_types(s)
}

fn parse_address_cidrs(s: &str) -> Result<CidrList, String> {
    addresses::parse_cidrs(s).map(CidrList)
}

/// `render` and `apply`: objects from files, this node from flags.
#[derive(Debug, Clone, Args)]
pub struct FileArgs {
    /// YAML or JSON file of Services and EndpointSlices (and optionally Nodes): multi-document
    /// or `kind: List`. Repeatable; `-` reads standard input.
    #[arg(short = 'f', long = "filename", required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// This node's name. A Node of that name in the files gives labels and addresses too.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: String,

    /// An address of this node, one per flag (repeatable). Each is taken both as a Node
    /// InternalIP and as assigned on the host, so it is served.
    #[arg(long = "node-address", value_name = "IP")]
    pub node_addresses: Vec<IpAddr>,

    /// This node's labels, `k=v,...` (added to those of a Node in the files).
    #[arg(long, value_parser = parse_labels, value_name = "K=V,...")]
    pub node_labels: Option<Labels>,

    #[command(flatten)]
    pub planner: PlannerArgs,
}

/// `check`: which families to check.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// Check IPv4.
    #[arg(long, action = ArgAction::Set, default_value_t = true, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub ipv4: bool,

    /// Check IPv6 too.
    #[arg(long, action = ArgAction::Set, default_value_t = false, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub ipv6: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IpMode {
    #[value(name = "Proxy")]
    Proxy,
    #[value(name = "VIP")]
    Vip,
}

/// The default period of a full resync when nothing changed.
pub const DEFAULT_RESYNC_INTERVAL: &str = "5m";

/// `run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// kubeconfig file. Default: `$KUBECONFIG`, else `~/.kube/config`, else the in-cluster
    /// service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// This node's name (the Node object the agent watches and reports Events on).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: String,

    /// The agent's pod name: the `reportingInstance` of its Events.
    #[arg(long, env = "POD_NAME", value_name = "NAME")]
    pub pod_name: Option<String>,

    /// The agent's namespace: where its Leases live.
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
    pub pod_namespace: Option<String>,

    #[command(flatten)]
    pub planner: PlannerArgs,

    /// Turn on forwarding (`net.ipv4.ip_forward`, `net.ipv6.conf.all.forwarding`) for the
    /// enabled families at start. Without it a family that does not forward is not programmed.
    /// Setting IPv6 forwarding stops router advertisements from being accepted unless
    /// `accept_ra` is 2; the agent warns when that applies.
    #[arg(long, action = ArgAction::Set, default_value_t = false, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub set_sysctls: bool,

    /// Packet mark bit (0-31). Accepted for compatibility and not used: nodelb decides
    /// masquerading from conntrack state (`ct status dnat` and the original destination), so
    /// it never sets or tests a mark.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=31), value_name = "BIT")]
    pub masquerade_bit: Option<u8>,

    /// `ipMode` written in `status.loadBalancer.ingress` (Kubernetes 1.30+), by the status
    /// writer.
    #[arg(long, value_enum, default_value = "Proxy", value_name = "MODE")]
    pub ip_mode: IpMode,

    /// Answer kube-proxy's health check of each `externalTrafficPolicy: Local` Service on its
    /// `healthCheckNodePort` (200 where this node forwards it to a ready local endpoint, 503
    /// otherwise). Only where kube-proxy does not run: it binds the same ports.
    #[arg(long, action = ArgAction::Set, default_value_t = false, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub health_check_node_ports: bool,

    /// Honour k3s ServiceLB's node labels and pools, for a drop-in replacement: once any Node
    /// is labelled `svccontroller.k3s.cattle.io/enablelb`, only Nodes labelled
    /// `svccontroller.k3s.cattle.io/enablelb=true` serve, and a Service labelled
    /// `svccontroller.k3s.cattle.io/lbpool=<pool>` only on those whose label of that name is
    /// `<pool>` (docs/migration.md).
    #[arg(long, action = ArgAction::Set, default_value_t = false, num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub servicelb_compat: bool,

    /// The longest a change waits for the changes that follow it: a change syncs at once when
    /// the last sync ended at least this long ago, else this long after it ended, with what
    /// arrived meanwhile (humantime: 10ms, 1s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10ms",
          value_name = "DURATION")]
    pub sync_debounce: Duration,

    /// Sync this often even when nothing changed (catches host changes nothing announces).
    #[arg(long, value_parser = humantime::parse_duration, default_value = DEFAULT_RESYNC_INTERVAL,
          value_name = "DURATION")]
    pub resync_interval: Duration,

    /// A node serves while its heartbeat Lease is younger than this.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s",
          value_name = "DURATION")]
    pub node_lease_duration: Duration,

    /// Readiness fails once a change a watch delivered has waited this long for its commit
    /// (the sync loop or the kernel is stuck, or every sync fails).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s",
          value_name = "DURATION")]
    pub max_change_wait: Duration,

    /// Readiness fails once a watch of the agent's inputs (Services, EndpointSlices, its Node)
    /// has had no stream open this long: the agent does not hear the API server. A dead
    /// connection is closed by TCP keep-alive within about 10 s first. Such a watch lists
    /// again, and readiness waits until that list is committed.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s",
          value_name = "DURATION")]
    pub max_view_age: Duration,

    /// Readiness fails once a request to the kernel actor (a commit, a verify, its ping every
    /// 2 s) has waited this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s",
          value_name = "DURATION")]
    pub max_kernel_wait: Duration,

    /// Status leader election: how long a leader's Lease `nodelb-status` is valid.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s",
          value_name = "DURATION")]
    pub lease_duration: Duration,

    /// Status leader election: the leader gives up if it cannot renew within this.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s",
          value_name = "DURATION")]
    pub renew_deadline: Duration,

    /// Status leader election: how often candidates retry.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s",
          value_name = "DURATION")]
    pub retry_period: Duration,

    /// Address of `/healthz` and `/readyz`, plain HTTP without authentication: loopback by
    /// default, where the kubelet's probes reach it (with `host: 127.0.0.1`) and a client of a
    /// Service does not.
    #[arg(long, default_value = "127.0.0.1:9254", value_name = "ADDR:PORT")]
    pub health_addr: SocketAddr,

    /// Address of `/metrics` (Prometheus text). On a loopback address plain HTTP; on any other
    /// HTTPS (a certificate made at start), answering only a bearer token the API server
    /// authenticates and allows to `get` the non-resource URL `/metrics` (the ClusterRole
    /// `nodelb-metrics-reader`); anyone else gets 401 or 403.
    #[arg(long, default_value = "0.0.0.0:9255", value_name = "ADDR:PORT")]
    pub metrics_addr: SocketAddr,

    /// Log format on standard error. `RUST_LOG` sets the level (default `info`).
    #[arg(long, value_enum, default_value = "text", value_name = "FORMAT")]
    pub log_format: LogFormat,
}

/// Node labels from `--node-labels k=v,...`.
pub type Labels = BTreeMap<String, String>;

fn parse_reserved_ports(s: &str) -> Result<ReservedPorts, String> {
    s.parse::<ReservedPorts>().map_err(|e| {
        format!("{e} (expected ports and ranges, each for every protocol or one, like 22,2379-2380/tcp,8472/udp)")
    })
}

fn parse_labels(s: &str) -> Result<Labels, String> {
    let mut out = Labels::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?}: expected key=value"))?;
        if k.trim().is_empty() {
            return Err(format!("{item:?}: empty label key"));
        }
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

impl PlannerArgs {
    /// The planner's [`Config`]. `own_ports` are the agent's health and metrics ports, reserved
    /// along with the defaults unless `--reserved-ports` replaces the list.
    pub fn config(&self, own_ports: &[u16]) -> Config {
        let reserved_ports = match &self.reserved_ports {
            Some(p) => p.clone(),
            None => ReservedPorts::defaults().with(Protocol::Tcp, own_ports.iter().copied()),
        };
        Config {
            ipv4: self.ipv4,
            ipv6: self.ipv6,
            default_class: self.default_class,
            lb_class: self.lb_class.clone(),
            reserved_ports,
            allowed_namespaces: self.allowed_namespaces.as_ref().map(|ns| {
                ns.iter()
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect::<BTreeSet<_>>()
            }),
            addresses: AddressFilter {
                types: self.address_types.clone(),
                cidrs: self
                    .address_cidrs
                    .as_ref()
                    .map(|c| c.0.clone())
                    .unwrap_or_default(),
            },
            ..Config::default()
        }
    }
}

impl RunArgs {
    pub fn config(&self) -> Config {
        Config {
            servicelb: ServiceLb::from_flag(self.servicelb_compat),
            ..self
                .planner
                .config(&[self.health_addr.port(), self.metrics_addr.port()])
        }
    }

    /// What `run` runs with: the flags resolved, defaults filled in.
    pub fn settings(&self) -> crate::run::Settings {
        crate::run::Settings {
            kubeconfig: self.kubeconfig.clone(),
            node_name: self.node_name.clone(),
            pod_name: self
                .pod_name
                .clone()
                .unwrap_or_else(|| format!("nodelb-agent-{}", self.node_name)),
            pod_name_given: self.pod_name.is_some(),
            namespace: self
                .pod_namespace
                .clone()
                .unwrap_or_else(|| "nodelb-system".to_string()),
            config: self.config(),
            set_sysctls: self.set_sysctls,
            masquerade_bit: self.masquerade_bit.is_some(),
            ip_mode: match self.ip_mode {
                IpMode::Proxy => "Proxy".into(),
                IpMode::Vip => "VIP".into(),
            },
            sync_debounce: self.sync_debounce,
            resync_interval: self.resync_interval,
            node_lease_duration: self.node_lease_duration,
            health_check_node_ports: self.health_check_node_ports,
            election: nodelb_core::status::election::Params {
                lease_duration: self.lease_duration,
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            },
            readiness: nodelb_core::readiness::Bounds {
                change: self.max_change_wait,
                view: self.max_view_age,
                kernel: self.max_kernel_wait,
            },
            health_addr: self.health_addr,
            metrics_addr: self.metrics_addr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("nodelb-agent").chain(args.iter().copied()))
    }

    fn run(args: &[&str]) -> RunArgs {
        let mut all = vec!["run", "--node-name", "n1"];
        all.extend_from_slice(args);
        match parse(&all).unwrap().command {
            Command::Run(r) => *r,
            c => panic!("not run: {c:?}"),
        }
    }

    #[test]
    fn run_defaults_are_the_designs() {
        let r = run(&[]);
        assert!(r.planner.ipv4);
        assert!(!r.planner.ipv6);
        assert!(r.planner.default_class);
        assert_eq!(r.planner.lb_class, "nodelb.io/nodelb");
        assert!(!r.set_sysctls);
        assert_eq!(r.masquerade_bit, None);
        assert_eq!(r.ip_mode, IpMode::Proxy);
        assert_eq!(r.sync_debounce, Duration::from_millis(10));
        assert_eq!(r.resync_interval, Duration::from_secs(300));
        assert_eq!(r.node_lease_duration, Duration::from_secs(15));
        assert_eq!(r.lease_duration, Duration::from_secs(15));
        assert_eq!(r.renew_deadline, Duration::from_secs(10));
        assert_eq!(r.retry_period, Duration::from_secs(2));
        assert_eq!(r.health_addr, "127.0.0.1:9254".parse().unwrap());
        assert_eq!(r.metrics_addr, "0.0.0.0:9255".parse().unwrap());
        assert_eq!(r.log_format, LogFormat::Text);
        assert_eq!(r.kubeconfig, None);
        let c = r.config();
        assert_eq!(c, Config::default());
        assert!(c.reserved_ports.contains(Protocol::Tcp, 9254));
        assert!(c.reserved_ports.contains(Protocol::Udp, 8472));
    }

    #[test]
    fn own_ports_join_the_default_reserved_list_but_not_an_explicit_one() {
        let r = run(&[
            "--health-addr",
            "[::]:8081",
            "--metrics-addr=127.0.0.1:8082",
        ]);
        let ports = r.config().reserved_ports;
        let tcp = |p| ports.contains(Protocol::Tcp, p);
        assert!(tcp(8081) && tcp(8082) && tcp(22) && !tcp(9254));
        assert!(
            !ports.contains(Protocol::Udp, 8081),
            "the agent's ports are TCP"
        );
        let r = run(&["--health-addr", "[::]:8081", "--reserved-ports", "22,80"]);
        assert_eq!(r.config().reserved_ports.to_string(), "22,80");
        let r = run(&["--health-addr", "127.0.0.1:0"]);
        assert!(
            !r.config().reserved_ports.contains(Protocol::Tcp, 0),
            "port 0 is not a port to reserve"
        );
        let r = run(&["--reserved-ports="]);
        assert!(r.config().reserved_ports.is_empty());
    }

    #[test]
    fn boolean_flags_take_three_forms() {
        assert!(run(&["--ipv6"]).planner.ipv6);
        assert!(run(&["--ipv6=true"]).planner.ipv6);
        assert!(!run(&["--ipv6=false"]).planner.ipv6);
        assert!(!run(&["--ipv4=false"]).planner.ipv4);
        assert!(!run(&["--default-class=false"]).planner.default_class);
        assert!(run(&["--set-sysctls"]).set_sysctls);
        assert_eq!(run(&[]).config().servicelb, ServiceLb::Ignored);
        assert_eq!(
            run(&["--servicelb-compat"]).config().servicelb,
            ServiceLb::Unlabelled,
            "on, until a Node labelled enablelb is seen"
        );
        assert!(!run(&["--servicelb-compat=false"])
            .config()
            .servicelb
            .enabled());
        // A separate value is not the flag's value: `--ipv6 false` leaves `false` as a stray
        // argument, which is an error, never silently "true".
        assert!(parse(&["run", "--node-name", "n", "--ipv6", "false"]).is_err());
        assert!(parse(&["run", "--node-name", "n", "--ipv6=yes"]).is_err());
    }

    #[test]
    fn bad_reserved_ports_say_what_is_wrong() {
        let e = parse(&["run", "--node-name", "n", "--reserved-ports", "22,ssh"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
        let text = e.to_string();
        assert!(text.contains("--reserved-ports"), "{text}");
        assert!(text.contains("\"ssh\" is not a port number"), "{text}");
        let e = parse(&["run", "--node-name", "n", "--reserved-ports", "90-80"]).unwrap_err();
        assert!(e.to_string().contains("range starts after it ends"), "{e}");
    }

    #[test]
    fn address_flags_are_the_default_filter_and_bad_values_say_what_is_wrong() {
        let r = run(&[]);
        assert_eq!(r.config().addresses, AddressFilter::default());
        let r = run(&[
            "--address-types",
            "ExternalIP",
            "--address-cidrs",
            "203.0.113.0/24,2001:db8::/32",
        ]);
        assert_eq!(r.config().addresses.types, [AddressKind::ExternalIP].into());
        assert_eq!(
            r.config().addresses.to_string(),
            "ExternalIP in 203.0.113.0/24,2001:db8::/32"
        );
        let r = run(&["--address-cidrs="]);
        assert_eq!(r.config().addresses, AddressFilter::default());
        let e = parse(&["run", "--node-name", "n", "--address-types", "Hostname"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
        assert!(
            e.to_string()
                .contains("\"Hostname\" is not InternalIP or ExternalIP"),
            "{e}"
        );
        let e = parse(&["run", "--node-name", "n", "--address-types="]).unwrap_err();
        assert!(e.to_string().contains("names no address type"), "{e}");
        let e = parse(&[
            "run",
            "--node-name",
            "n",
            "--address-cidrs",
            "203.0.113.0/24,x",
        ])
        .unwrap_err();
        assert!(e.to_string().contains("\"x\" is not a CIDR"), "{e}");
    }

    #[test]
    fn lists_durations_and_enums_parse() {
        let r = run(&[
            "--allowed-namespaces",
            "a,b",
            "--sync-debounce",
            "250ms",
            "--resync-interval=1h",
            "--ip-mode",
            "VIP",
            "--log-format",
            "json",
            "--masquerade-bit",
            "31",
        ]);
        assert_eq!(
            r.config().allowed_namespaces,
            Some(BTreeSet::from(["a".to_string(), "b".to_string()]))
        );
        assert_eq!(r.sync_debounce, Duration::from_millis(250));
        assert_eq!(r.resync_interval, Duration::from_secs(3600));
        assert_eq!(r.ip_mode, IpMode::Vip);
        assert_eq!(r.log_format, LogFormat::Json);
        assert_eq!(r.masquerade_bit, Some(31));
        assert!(parse(&["run", "--node-name", "n", "--masquerade-bit", "32"]).is_err());
        assert!(parse(&["run", "--node-name", "n", "--ip-mode", "proxy"]).is_err());
    }

    #[test]
    fn render_takes_files_addresses_and_labels() {
        let cli = parse(&[
            "render",
            "-f",
            "a.yaml",
            "-f",
            "b.json",
            "--node-name",
            "n1",
            "--node-address",
            "192.0.2.1",
            "--node-address",
            "2001:db8::1",
            "--node-labels",
            "zone=a,role=edge",
            "--ipv6",
        ])
        .unwrap();
        let Command::Render(f) = cli.command else {
            panic!("not render")
        };
        assert_eq!(f.files.len(), 2);
        assert_eq!(f.node_addresses.len(), 2);
        assert_eq!(f.node_labels.unwrap()["zone"], "a");
        assert!(f.planner.ipv6 && f.planner.ipv4);
        assert!(parse(&[
            "render",
            "-f",
            "x",
            "--node-name",
            "n",
            "--node-address",
            "nope"
        ])
        .is_err());
        assert!(parse(&[
            "render",
            "-f",
            "x",
            "--node-name",
            "n",
            "--node-labels",
            "novalue"
        ])
        .is_err());
    }

    #[test]
    fn missing_node_name_is_a_usage_error() {
        // NODE_NAME may be set in the environment running the tests; only check when it is not.
        if std::env::var_os("NODE_NAME").is_none() {
            let e = parse(&["run"]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::MissingRequiredArgument);
            assert_eq!(e.exit_code(), 2);
        }
    }

    #[test]
    fn every_flag_has_help() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                if arg.get_id() == "help" || arg.get_id() == "version" {
                    continue;
                }
                assert!(
                    arg.get_help().is_some(),
                    "{} --{} has no help",
                    sub.get_name(),
                    arg.get_id()
                );
            }
        }
    }
}
