//! Network-namespace test harness.
//!
//! Kernel tests build small private networks out of network namespaces joined
//! by veth pairs, then push real traffic through them (see [`crate::traffic`]).
//!
//! Rules this module enforces:
//! - Hosts only ever get documentation addresses (192.0.2.0/24,
//!   198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32); [`link`] and [`route`]
//!   panic on anything else, and [`route`] refuses default routes.
//! - Nothing is configured in the root namespace: veth pairs are created
//!   directly inside the test namespaces (`ip -n A link add ... peer ... netns B`).
//! - Every [`Netns`] is deleted when dropped, including during a panic unwind.
//!
//! Namespace names are `nlb-<pid>-<counter>-<label>`, unique per process and
//! per call, so tests can run in parallel.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::sched::{setns, CloneFlags};

/// Longest interface name the kernel accepts (IFNAMSIZ - 1).
const MAX_IFNAME: usize = 15;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Returns true when this process can run namespace tests: effective uid 0
/// and a working `ip netns`.
///
/// Otherwise, when the environment has `CI=true` this panics (a CI run must
/// not silently skip kernel tests); elsewhere it prints `SKIP <test>: needs
/// root` to stderr and returns false. Use as
/// `if !require_root("my_test") { return; }`.
pub fn require_root(test: &str) -> bool {
    if can_use_namespaces() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root and network namespaces; CI=true makes this a failure");
    }
    eprintln!("SKIP {test}: needs root");
    false
}

/// Effective uid 0 and a working `ip netns`.
fn can_use_namespaces() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    (unsafe { libc::geteuid() }) == 0
        && Command::new("ip")
            .args(["netns", "list"])
            .output()
            .is_ok_and(|o| o.status.success())
}

/// The `main` of a benchmark (`harness = false`) that needs namespaces: without root and
/// `ip netns` it prints a SKIP line and succeeds, or fails under `CI=true`; otherwise it runs
/// `run` and turns an error into a printed FAILED line and a failing exit.
pub fn bench_main(name: &str, run: impl FnOnce() -> Result<(), String>) -> std::process::ExitCode {
    use std::process::ExitCode;
    if !can_use_namespaces() {
        let ci = std::env::var("CI").as_deref() == Ok("true");
        println!(
            "SKIP {name} bench: needs root and `ip netns`{}",
            if ci { " (CI=true: failing)" } else { "" }
        );
        return if ci {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name} bench FAILED: {e}");
            println!("{name} bench FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A network namespace: one the test made ([`Netns::new`]), deleted on drop, or one made by
/// someone else ([`Netns::existing`]), left alone.
#[derive(Debug)]
pub struct Netns {
    name: String,
    owned: bool,
}

impl Netns {
    /// Creates `nlb-<pid>-<counter>-<label>` with `ip netns add`, brings its
    /// loopback up and turns IPv6 DAD off for the namespace
    /// (`accept_dad=0`). Forwarding is off (see [`Netns::enable_forwarding`])
    /// and reverse-path filtering too, whatever the host has: a new namespace
    /// copies the host's IPv4 `conf/all` and `conf/default` settings (a Docker
    /// host or a Kubernetes node forwards), so the namespace sets its own.
    pub fn new(label: &str) -> Netns {
        assert!(
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "namespace label {label:?} must be non-empty and use only [A-Za-z0-9_-]"
        );
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("nlb-{}-{n}-{label}", std::process::id());
        run_ip(&["netns", "add", &name]);
        // From here on Drop cleans up, even if the next step panics.
        let ns = Netns { name, owned: true };
        ns.ip(&["link", "set", "lo", "up"]);
        // No duplicate address detection on interfaces created later: IPv6
        // link-local addresses are usable at once, which the node needs to
        // send neighbour solicitations for forwarded packets.
        ns.sh("sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0");
        ns.sh(
            "sysctl -qw net.ipv4.ip_forward=0 net.ipv6.conf.all.forwarding=0 \
             net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0",
        );
        ns
    }

    /// A namespace `ip netns` already knows by `name` (scripts/cluster.sh's client, say), for
    /// running clients in; never deleted by this handle.
    pub fn existing(name: &str) -> Result<Netns, String> {
        let ns = Netns {
            name: name.to_string(),
            owned: false,
        };
        match ns.path().exists() {
            true => Ok(ns),
            false => Err(format!(
                "no network namespace {name} ({})",
                ns.path().display()
            )),
        }
    }

    /// This process's own namespace, for running clients in where no namespace was given (a
    /// test against a cluster of someone else's). Only [`Netns::run`] and the servers and
    /// clients built on it work with it, not `ip netns exec`.
    pub fn existing_current() -> Netns {
        Netns {
            name: String::new(),
            owned: false,
        }
    }

    /// The namespace name as known to `ip netns`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mount that pins the namespace: `/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        if self.name.is_empty() {
            return PathBuf::from("/proc/self/ns/net");
        }
        Path::new("/run/netns").join(&self.name)
    }

    /// Runs `ip netns exec <name> args...` and returns its output, whatever
    /// the exit status. Panics only if `ip` cannot be started.
    pub fn exec(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run `ip netns exec {}`: {e}", self.name))
    }

    /// `ip netns exec <name> program`, to be given arguments and spawned (see
    /// [`dies_with_thread`]).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Runs `sh -c cmd` inside the namespace; returns stdout, or a message
    /// with the exit status and stderr.
    pub fn sh_ok(&self, cmd: &str) -> Result<String, String> {
        let out = self.exec(&["sh", "-c", cmd]);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "`{cmd}` in netns {} failed ({}): {}",
                self.name,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Like [`Netns::sh_ok`], panicking with stderr on failure.
    pub fn sh(&self, cmd: &str) -> String {
        self.sh_ok(cmd).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs `ip -n <name> args...`, panicking with stderr on failure;
    /// returns stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run_ip(&full)
    }

    /// Every address assigned in this namespace right now (`ip -j addr show`), loopback and
    /// link-local included: what the agent reads with rtnetlink as the host's addresses.
    pub fn addresses(&self) -> std::collections::BTreeSet<IpAddr> {
        let json = self.ip(&["-j", "addr", "show"]);
        let links: serde_json::Value = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("`ip -j addr show` in {}: {e}\n{json}", self.name));
        links
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|link| link["addr_info"].as_array().into_iter().flatten())
            .filter_map(|a| a["local"].as_str()?.parse().ok())
            .collect()
    }

    /// Turns on IPv4 and IPv6 forwarding inside this namespace only.
    pub fn enable_forwarding(&self) {
        self.sh("sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1");
    }

    /// Lifts the kernel's ICMP/ICMPv6 error rate limits inside this
    /// namespace, so tests that provoke many unreachable errors towards the
    /// same peer see every one of them.
    pub fn disable_icmp_ratelimit(&self) {
        self.sh("sysctl -qw net.ipv4.icmp_ratelimit=0 net.ipv6.icmp.ratelimit=0");
    }

    /// Runs `f` on a new OS thread that has joined this namespace, so every
    /// socket `f` creates belongs to it. Waits for the thread and returns its
    /// result; a panic in `f` is resumed on the calling thread.
    pub fn run<F, R>(&self, f: F) -> R
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        // Open the namespace before spawning so a missing namespace is
        // reported here rather than from inside the thread.
        let ns = self.open();
        std::thread::scope(|scope| {
            let worker = std::thread::Builder::new()
                .name(format!("netns-{}", self.name))
                .spawn_scoped(scope, move || {
                    enter(&ns, &self.name);
                    drop(ns);
                    f()
                })
                .expect("cannot spawn a netns thread");
            match worker.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Moves the calling thread into this namespace (for long-lived threads
    /// such as servers). The thread stays there until it exits.
    pub fn enter_current_thread(&self) {
        enter(self.open(), &self.name);
    }

    fn open(&self) -> File {
        File::open(self.path())
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.path().display()))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // Errors are ignored: the namespace may already be gone, and a panic
        // here during unwinding would abort the test binary.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Makes the process `cmd` spawns die with the thread that spawns it
/// (`PR_SET_PDEATHSIG(SIGKILL)`): a server or agent a test starts does not outlive a test
/// process killed before it could clean up.
pub fn dies_with_thread(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd
}

/// Joins the network namespace behind `fd` on the calling thread.
pub(crate) fn enter(fd: impl AsFd, name: &str) {
    setns(fd, CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| panic!("setns into netns {name} failed: {e}"));
}

/// Connects two namespaces with a veth pair: `a_if` in `a`, `b_if` in `b`.
///
/// Addresses are CIDR strings ("192.0.2.1/24", "2001:db8:1::1/64") and must
/// be documentation addresses. IPv6 addresses are added with `nodad` so they
/// are usable at once. Both ends are brought up.
///
/// The pair is created inside `a` with its peer placed directly in `b`, so
/// the root namespace never sees it.
pub fn link(a: &Netns, a_if: &str, a_addrs: &[&str], b: &Netns, b_if: &str, b_addrs: &[&str]) {
    for ifname in [a_if, b_if] {
        assert!(
            !ifname.is_empty() && ifname.len() <= MAX_IFNAME,
            "interface name {ifname:?} must be 1..={MAX_IFNAME} bytes"
        );
    }
    for cidr in a_addrs.iter().chain(b_addrs) {
        let (addr, _) = parse_cidr(cidr);
        assert!(
            is_documentation(addr),
            "{cidr} is not a documentation address"
        );
    }
    a.ip(&[
        "link",
        "add",
        a_if,
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ]);
    for (ns, ifname, addrs) in [(a, a_if, a_addrs), (b, b_if, b_addrs)] {
        for cidr in addrs {
            if cidr.contains(':') {
                ns.ip(&["-6", "addr", "add", cidr, "dev", ifname, "nodad"]);
            } else {
                ns.ip(&["addr", "add", cidr, "dev", ifname]);
            }
        }
        ns.ip(&["link", "set", ifname, "up"]);
    }
}

/// Adds `prefix via via` inside `ns`.
///
/// Only routes to documentation prefixes through documentation gateways are
/// allowed; a default route (`default`, 0.0.0.0/0, ::/0, or any prefix
/// reaching outside the documentation ranges) panics.
pub fn route(ns: &Netns, prefix: &str, via: &str) {
    assert!(
        prefix != "default",
        "test namespaces never get a default route"
    );
    let (net, len) = parse_cidr(prefix);
    assert!(
        len > 0,
        "test namespaces never get a default route ({prefix})"
    );
    let min_len = if net.is_ipv4() { 24 } else { 32 };
    assert!(
        is_documentation(net) && len >= min_len,
        "route to {prefix} leaves the documentation ranges"
    );
    let gw: IpAddr = via
        .parse()
        .unwrap_or_else(|e| panic!("bad gateway {via:?}: {e}"));
    assert!(
        gw.is_ipv4() == net.is_ipv4(),
        "gateway {via} and prefix {prefix} are of different families"
    );
    assert!(
        is_documentation(gw),
        "gateway {via} is not a documentation address"
    );
    let family = if net.is_ipv4() { "-4" } else { "-6" };
    ns.ip(&[family, "route", "add", prefix, "via", via]);
}

/// True for addresses in 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24 or
/// 2001:db8::/32.
pub fn is_documentation(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => matches!(
            a.octets(),
            [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _]
        ),
        IpAddr::V6(a) => a.segments()[..2] == [0x2001, 0x0db8],
    }
}

/// Splits "addr/len" (len defaults to the full width).
fn parse_cidr(cidr: &str) -> (IpAddr, u8) {
    let (addr, len) = cidr.split_once('/').unwrap_or((cidr, ""));
    let addr: IpAddr = addr
        .parse()
        .unwrap_or_else(|e| panic!("bad address in {cidr:?}: {e}"));
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let len = if len.is_empty() {
        max
    } else {
        len.parse()
            .ok()
            .filter(|l| *l <= max)
            .unwrap_or_else(|| panic!("bad prefix length in {cidr:?}"))
    };
    (addr, len)
}

/// Runs `ip args...` and returns stdout, panicking with stderr on failure.
fn run_ip(args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `ip`: {e}"));
    assert!(
        out.status.success(),
        "`ip {}` failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Ready-made client / node / backends topology for dataplane tests.
///
/// Addressing (all documentation ranges):
///
/// | link                 | IPv4                              | IPv6                                       |
/// |----------------------|-----------------------------------|--------------------------------------------|
/// | client - node        | 203.0.113.0/24: node .1, client .2 | 2001:db8:c::/64: node ::1, client ::2     |
/// | node - backend `i`   | 198.51.100.16i/28: node .16i+1, backend .16i+2 | 2001:db8:b:i::/64 (`i` in hex): node ::1, backend ::2 |
/// | node - extra client  | caller's subnet: node host 1, client host 2 | caller's subnet: node ::1, client ::2 |
///
/// At most 16 backends fit in 198.51.100.0/24.
///
/// Interface names: the node has `eth-client`, `eth-b<i>` and `eth-x<i>`
/// (extra client `i`); every other namespace has `eth-node`.
///
/// Routing: the node forwards. Backends route 203.0.113.0/24,
/// 2001:db8:c::/64 and every extra client's subnets via the node, so replies
/// that were not masqueraded get back. Clients only reach the node's own
/// addresses unless [`TopologyOptions::client_routes_to_backends`] is set, in
/// which case they also route 198.51.100.0/24 and 2001:db8:b::/48 via the
/// node. Without it, DNAT on the node is the only way to reach a backend.
///
/// ICMP error rate limits are lifted in every namespace (see
/// [`Netns::disable_icmp_ratelimit`]).
#[derive(Debug)]
pub struct Topology {
    pub client: Netns,
    pub node: Netns,
    pub backends: Vec<Netns>,
    extra_clients: Vec<ExtraClient>,
    options: TopologyOptions,
}

/// Knobs for [`Topology::with_options`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TopologyOptions {
    pub backends: usize,
    /// Give clients routes to the backend prefixes via the node.
    pub client_routes_to_backends: bool,
}

#[derive(Debug)]
struct ExtraClient {
    ns: Netns,
    v4: Ipv4Addr,
    v6: Ipv6Addr,
    node_v4: Ipv4Addr,
    node_v6: Ipv6Addr,
}

const CLIENT_NET_V4: &str = "203.0.113.0/24";
const CLIENT_NET_V6: &str = "2001:db8:c::/64";
const BACKENDS_V4: &str = "198.51.100.0/24";
const BACKENDS_V6: &str = "2001:db8:b::/48";
const MAX_BACKENDS: usize = 16;

impl Topology {
    /// `backends` backends; clients have no routes to them.
    pub fn new(backends: usize) -> Topology {
        Topology::with_options(TopologyOptions {
            backends,
            client_routes_to_backends: false,
        })
    }

    pub fn with_options(options: TopologyOptions) -> Topology {
        assert!(
            options.backends <= MAX_BACKENDS,
            "at most {MAX_BACKENDS} backends fit in {BACKENDS_V4}"
        );
        let client = Netns::new("client");
        let node = Netns::new("node");
        let backends = (0..options.backends)
            .map(|i| Netns::new(&format!("b{i}")))
            .collect();
        let topo = Topology {
            client,
            node,
            backends,
            extra_clients: Vec::new(),
            options,
        };
        topo.node.enable_forwarding();
        topo.node.disable_icmp_ratelimit();
        topo.client.disable_icmp_ratelimit();

        link(
            &topo.client,
            "eth-node",
            &[
                &format!("{}/24", topo.client_v4()),
                &format!("{}/64", topo.client_v6()),
            ],
            &topo.node,
            "eth-client",
            &[
                &format!("{}/24", topo.node_v4()),
                &format!("{}/64", topo.node_v6()),
            ],
        );
        for (i, backend) in topo.backends.iter().enumerate() {
            backend.disable_icmp_ratelimit();
            link(
                backend,
                "eth-node",
                &[
                    &format!("{}/28", topo.backend_v4(i)),
                    &format!("{}/64", topo.backend_v6(i)),
                ],
                &topo.node,
                &format!("eth-b{i}"),
                &[
                    &format!("{}/28", topo.node_v4_toward_backend(i)),
                    &format!("{}/64", topo.node_v6_toward_backend(i)),
                ],
            );
            let via4 = topo.node_v4_toward_backend(i).to_string();
            let via6 = topo.node_v6_toward_backend(i).to_string();
            route(backend, CLIENT_NET_V4, &via4);
            route(backend, CLIENT_NET_V6, &via6);
        }
        if options.client_routes_to_backends {
            route(&topo.client, BACKENDS_V4, &topo.node_v4().to_string());
            route(&topo.client, BACKENDS_V6, &topo.node_v6().to_string());
        }
        topo
    }

    pub fn options(&self) -> TopologyOptions {
        self.options
    }

    /// The node's address facing the client: 203.0.113.1.
    pub fn node_v4(&self) -> Ipv4Addr {
        Ipv4Addr::new(203, 0, 113, 1)
    }

    /// The node's address facing the client: 2001:db8:c::1.
    pub fn node_v6(&self) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 1)
    }

    /// 203.0.113.2.
    pub fn client_v4(&self) -> Ipv4Addr {
        Ipv4Addr::new(203, 0, 113, 2)
    }

    /// 2001:db8:c::2.
    pub fn client_v6(&self) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 2)
    }

    /// 198.51.100.(16i+2).
    pub fn backend_v4(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 51, 100, self.backend_block(i) + 2)
    }

    /// 2001:db8:b:i::2.
    pub fn backend_v6(&self, i: usize) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 0xb, self.backend_subnet6(i), 0, 0, 0, 2)
    }

    /// The node's address on backend `i`'s link, 198.51.100.(16i+1): the
    /// source of packets the node masquerades towards that backend.
    pub fn node_v4_toward_backend(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 51, 100, self.backend_block(i) + 1)
    }

    /// 2001:db8:b:i::1.
    pub fn node_v6_toward_backend(&self, i: usize) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 0xb, self.backend_subnet6(i), 0, 0, 0, 1)
    }

    /// Links one more client namespace to the node and returns its index for
    /// the `extra_client*` accessors.
    ///
    /// `v4_subnet` and `v6_subnet` are documentation prefixes not used
    /// elsewhere, e.g. "192.0.2.0/24" and "2001:db8:d::/64": the node takes
    /// host 1 of each, the new client host 2. Every backend gets return
    /// routes to both subnets via the node; the client gets routes to the
    /// backends only if `client_routes_to_backends` is set.
    pub fn add_client(&mut self, label: &str, v4_subnet: &str, v6_subnet: &str) -> usize {
        let (net4, len4) = match parse_cidr(v4_subnet) {
            (IpAddr::V4(a), len) if len <= 30 => (a, len),
            _ => panic!("{v4_subnet} is not an IPv4 subnet of /30 or wider"),
        };
        let (net6, len6) = match parse_cidr(v6_subnet) {
            (IpAddr::V6(a), len) if len <= 126 => (a, len),
            _ => panic!("{v6_subnet} is not an IPv6 subnet of /126 or wider"),
        };
        let host4 = |n: u32| Ipv4Addr::from(u32::from(net4) + n);
        let host6 = |n: u128| Ipv6Addr::from(u128::from(net6) + n);
        let index = self.extra_clients.len();
        let client = ExtraClient {
            ns: Netns::new(label),
            v4: host4(2),
            v6: host6(2),
            node_v4: host4(1),
            node_v6: host6(1),
        };
        client.ns.disable_icmp_ratelimit();
        link(
            &client.ns,
            "eth-node",
            &[
                &format!("{}/{len4}", client.v4),
                &format!("{}/{len6}", client.v6),
            ],
            &self.node,
            &format!("eth-x{index}"),
            &[
                &format!("{}/{len4}", client.node_v4),
                &format!("{}/{len6}", client.node_v6),
            ],
        );
        for (i, backend) in self.backends.iter().enumerate() {
            route(
                backend,
                v4_subnet,
                &self.node_v4_toward_backend(i).to_string(),
            );
            route(
                backend,
                v6_subnet,
                &self.node_v6_toward_backend(i).to_string(),
            );
        }
        if self.options.client_routes_to_backends {
            route(&client.ns, BACKENDS_V4, &client.node_v4.to_string());
            route(&client.ns, BACKENDS_V6, &client.node_v6.to_string());
        }
        self.extra_clients.push(client);
        index
    }

    /// Number of clients added with [`Topology::add_client`].
    pub fn extra_client_count(&self) -> usize {
        self.extra_clients.len()
    }

    pub fn extra_client(&self, i: usize) -> &Netns {
        &self.extra_client_at(i).ns
    }

    /// Host 2 of the client's IPv4 subnet.
    pub fn extra_client_v4(&self, i: usize) -> Ipv4Addr {
        self.extra_client_at(i).v4
    }

    /// Host 2 of the client's IPv6 subnet.
    pub fn extra_client_v6(&self, i: usize) -> Ipv6Addr {
        self.extra_client_at(i).v6
    }

    /// The node's address facing extra client `i` (host 1 of its subnet).
    pub fn node_v4_toward_extra_client(&self, i: usize) -> Ipv4Addr {
        self.extra_client_at(i).node_v4
    }

    /// The node's address facing extra client `i` (host 1 of its subnet).
    pub fn node_v6_toward_extra_client(&self, i: usize) -> Ipv6Addr {
        self.extra_client_at(i).node_v6
    }

    fn extra_client_at(&self, i: usize) -> &ExtraClient {
        self.extra_clients
            .get(i)
            .unwrap_or_else(|| panic!("no extra client {i}"))
    }

    /// First address of backend `i`'s /28 in 198.51.100.0/24.
    fn backend_block(&self, i: usize) -> u8 {
        self.check_backend(i);
        (i * 16) as u8
    }

    /// Fourth IPv6 segment of backend `i`'s /64 in 2001:db8:b::/48.
    fn backend_subnet6(&self, i: usize) -> u16 {
        self.check_backend(i);
        i as u16
    }

    fn check_backend(&self, i: usize) {
        assert!(
            i < self.backends.len(),
            "backend {i} does not exist (topology has {})",
            self.backends.len()
        );
    }
}
