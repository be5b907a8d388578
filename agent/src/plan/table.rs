//! Where a Service becomes chains, sets and map elements: one family's `nodelb` table.
//!
//! Shape (DESIGN.md, "Netfilter shape"):
//! - `map services` (`addr . inet_proto . inet_service : verdict`) is the dispatch: nat
//!   `prerouting` and `output` look up `daddr . l4proto . th dport` in it, so a packet's cost does
//!   not grow with the number of Services. Each element jumps (`goto`) to the Service port's chain
//!   `svc-<namespace>/<name>-<proto>-<port>`.
//! - A Service port's chain drops clients outside `loadBalancerSourceRanges` (counted), then
//!   either counts and DNATs through `numgen random mod N` and the global `map endpoints`
//!   (`l4proto . th dport . index : daddr . th dport`), or, for `Local` without a local endpoint,
//!   counts and drops.
//! - Services without any endpoint are in `set no-endpoints`, rejected in filter `input` and
//!   `filter-output` (TCP reset, ICMP port unreachable): reject is not allowed in prerouting.
//! - Masquerade in nat `postrouting`, decided from conntrack's original destination (no packet
//!   mark): every client of a `Cluster` Service (`set masq-services`), and under both policies
//!   clients on the node itself (`set local-addresses`) and hairpin connections, an endpoint
//!   reaching its own Service (`set hairpin` of `endpoint . endpoint`).
//! - filter `forward` accepts DNATed traffic of nodelb's Services (`set lb-services`).
//!
//! Every rule and element carries the comment `namespace/name:port`.

use super::endpoints::Endpoint;
use super::service::{Cidr, Protocol, ServiceKey, ServicePortId, TrafficPolicy};
use super::IpFamily;
use nodelb_netfilter::{
    ct_status, Chain, ChainType, CtKey, DataType, ElemData, Expr, Hook, Key, L4Proto, MapData,
    MetaKey, NatKind, Payload, Policy, Reject, Rule, Set, SetType, Stmt, Table, Value, Verdict,
};
use std::collections::BTreeSet;
use std::net::IpAddr;

/// Priority of nodelb's nat chains: kube-proxy's and Docker's DNAT sit at -100 too.
pub const NAT_PRIORITY: i32 = -100;
/// Priority of nodelb's filter chains.
pub const FILTER_PRIORITY: i32 = 0;
/// Priority of the masquerade chain (srcnat).
pub const SRCNAT_PRIORITY: i32 = 100;

pub const SERVICES_MAP: &str = "services";
pub const ENDPOINTS_MAP: &str = "endpoints";
pub const MASQ_SET: &str = "masq-services";
pub const LB_SET: &str = "lb-services";
pub const NO_ENDPOINTS_SET: &str = "no-endpoints";
pub const LOCAL_ADDRESSES_SET: &str = "local-addresses";
pub const HAIRPIN_SET: &str = "hairpin";

/// What one Service port does on this node and family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Forward(Vec<Endpoint>),
    Drop,
    Reject,
}

/// One Service port to program in one family's table.
#[derive(Clone, Debug)]
pub struct PortProgram<'a> {
    pub service: &'a ServiceKey,
    pub port: &'a ServicePortId,
    pub policy: TrafficPolicy,
    /// The node's addresses of this family that serve it.
    pub addresses: &'a [IpAddr],
    /// `None`: every source; `Some`: only these prefixes (of any family; others are ignored).
    pub source_ranges: Option<&'a [Cidr]>,
    pub action: Action,
}

/// `namespace/name:port`, the comment on everything a Service port owns.
pub fn comment(service: &ServiceKey, port: &ServicePortId) -> String {
    format!("{service}:{}", port.label())
}

/// The chain of one Service port.
pub fn service_chain(service: &ServiceKey, port: &ServicePortId) -> String {
    format!(
        "svc-{}/{}-{}-{}",
        service.namespace,
        service.name,
        port.protocol.keyword(),
        port.port
    )
}

/// The source-range set of one Service.
pub fn source_set(service: &ServiceKey) -> String {
    format!("src-{}/{}", service.namespace, service.name)
}

struct Fam(IpFamily);

impl Fam {
    fn addr_type(&self) -> DataType {
        match self.0 {
            IpFamily::V4 => DataType::Ipv4Addr,
            IpFamily::V6 => DataType::Ipv6Addr,
        }
    }
    fn saddr(&self) -> Expr {
        Expr::Payload(match self.0 {
            IpFamily::V4 => Payload::IpSaddr,
            IpFamily::V6 => Payload::Ip6Saddr,
        })
    }
    fn daddr(&self) -> Expr {
        Expr::Payload(match self.0 {
            IpFamily::V4 => Payload::IpDaddr,
            IpFamily::V6 => Payload::Ip6Daddr,
        })
    }
    fn service_key_type(&self) -> SetType {
        SetType::Type(vec![
            self.addr_type(),
            DataType::InetProto,
            DataType::InetService,
        ])
    }
}

const L4: Expr = Expr::Meta(MetaKey::L4Proto);
const TH_DPORT: Expr = Expr::Payload(Payload::ThDport);
const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

fn value(ip: IpAddr) -> Value {
    Value::from(ip)
}

fn service_key(addr: IpAddr, port: &ServicePortId) -> Key {
    Key::Values(vec![
        value(addr),
        Value::Proto(port.protocol.l4()),
        Value::Port(port.port),
    ])
}

/// Build one family's table. `local_addresses` are every address assigned on the host (other
/// families are ignored). Ports must not collide on (protocol, port): conflicts are decided
/// before this.
pub fn build(
    family: IpFamily,
    name: &str,
    local_addresses: &BTreeSet<IpAddr>,
    ports: &[PortProgram<'_>],
) -> Table {
    let f = Fam(family);
    let mut t = Table::new(family.netfilter(), name);

    let mut dispatch = Set::map(SERVICES_MAP, f.service_key_type(), MapData::Verdict)
        .with_comment("node address . protocol . port: the Service port's chain");
    let mut endpoints = Set::map(
        ENDPOINTS_MAP,
        SetType::Typeof(vec![L4, TH_DPORT, Expr::Numgen { modulus: 1 }]),
        MapData::Value(SetType::Typeof(vec![f.daddr(), TH_DPORT])),
    )
    .with_comment("protocol . port . random index: endpoint");
    let mut masq = Set::new(MASQ_SET, f.service_key_type())
        .with_comment("Cluster policy: clients are masqueraded");
    let mut lb = Set::new(LB_SET, f.service_key_type()).with_comment("dispatched Service ports");
    let mut no_endpoints = Set::new(NO_ENDPOINTS_SET, f.service_key_type())
        .with_comment("Service ports without endpoints: rejected");
    let mut local = Set::new(LOCAL_ADDRESSES_SET, SetType::Type(vec![f.addr_type()]))
        .with_comment("addresses of this host: its own clients are masqueraded");
    let mut hairpin = Set::new(
        HAIRPIN_SET,
        SetType::Type(vec![f.addr_type(), f.addr_type()]),
    )
    .with_comment("endpoint . endpoint: hairpin connections are masqueraded");

    for a in local_addresses.iter().filter(|a| IpFamily::of(a) == family) {
        local.insert(
            Key::Values(vec![value(*a)]),
            None,
            Some("host address".into()),
        );
    }

    for p in ports {
        let note = comment(p.service, p.port);
        let target = match &p.action {
            Action::Reject => {
                for a in p.addresses {
                    no_endpoints.insert(service_key(*a, p.port), None, Some(note.clone()));
                }
                continue;
            }
            Action::Drop => service_port_chain(&mut t, &f, p, &note, None),
            Action::Forward(eps) => {
                for (i, e) in eps.iter().enumerate() {
                    endpoints.insert(
                        Key::Values(vec![
                            Value::Proto(p.port.protocol.l4()),
                            Value::Port(p.port.port),
                            Value::U32(i as u32),
                        ]),
                        Some(ElemData::Values(vec![value(e.addr), Value::Port(e.port)])),
                        Some(note.clone()),
                    );
                    let pair = Key::Values(vec![value(e.addr), value(e.addr)]);
                    if !hairpin.elements.contains_key(&pair) {
                        hairpin.insert(pair, None, Some(note.clone()));
                    }
                }
                service_port_chain(&mut t, &f, p, &note, Some(eps.len()))
            }
        };
        for a in p.addresses {
            let key = service_key(*a, p.port);
            dispatch.insert(
                key.clone(),
                Some(ElemData::Verdict(Verdict::Goto(target.clone()))),
                Some(note.clone()),
            );
            lb.insert(key.clone(), None, Some(note.clone()));
            if p.policy == TrafficPolicy::Cluster {
                masq.insert(key, None, Some(note.clone()));
            }
        }
    }
    for s in [dispatch, endpoints, masq, lb, no_endpoints, local, hairpin] {
        t.add_set(s);
    }
    base_chains(&mut t, &f);
    t
}

/// The chain of one Service port: source ranges, then DNAT to one of `n` endpoints, or drop
/// when `n` is `None`. Returns its name.
fn service_port_chain(
    t: &mut Table,
    f: &Fam,
    p: &PortProgram<'_>,
    note: &str,
    n: Option<usize>,
) -> String {
    let name = service_chain(p.service, p.port);
    let mut chain = Chain::regular(&name);
    if let Some(ranges) = p.source_ranges {
        let set_name = source_set(p.service);
        if !t.sets.contains_key(&set_name) {
            let mut set = Set::new(&set_name, SetType::Type(vec![f.addr_type()]))
                .interval()
                .with_comment(format!("{}: loadBalancerSourceRanges", p.service));
            for c in ranges.iter().filter(|c| c.family() == f.0) {
                set.insert(
                    Key::Prefix(c.addr, c.len),
                    None,
                    Some(p.service.to_string()),
                );
            }
            t.add_set(set);
        }
        chain.push(
            Rule::new(vec![
                Stmt::Lookup {
                    keys: vec![f.saddr()],
                    set: set_name,
                    negate: true,
                },
                Stmt::counter(),
                Stmt::Verdict(Verdict::Drop),
            ])
            .with_comment(format!("{note}: source not in loadBalancerSourceRanges")),
        );
    }
    match n {
        Some(n) => chain.push(
            Rule::new(vec![
                Stmt::counter(),
                Stmt::NatMap {
                    kind: NatKind::Dnat,
                    keys: vec![L4, TH_DPORT, Expr::Numgen { modulus: n as u32 }],
                    map: ENDPOINTS_MAP.into(),
                },
            ])
            .with_comment(note),
        ),
        None => chain.push(
            Rule::new(vec![Stmt::counter(), Stmt::Verdict(Verdict::Drop)])
                .with_comment(format!("{note}: Local policy, no endpoint on this node")),
        ),
    }
    t.add_chain(chain);
    name
}

fn base_chains(t: &mut Table, f: &Fam) {
    let dispatch = || {
        Rule::new(vec![Stmt::Vmap {
            keys: vec![f.daddr(), L4, TH_DPORT],
            map: SERVICES_MAP.into(),
        }])
        .with_comment("dispatch to Service ports")
    };
    t.add_chain(
        Chain::base(
            "prerouting",
            ChainType::Nat,
            Hook::Prerouting,
            NAT_PRIORITY,
            Policy::Accept,
        )
        .rule(dispatch()),
    );
    t.add_chain(
        Chain::base(
            "output",
            ChainType::Nat,
            Hook::Output,
            NAT_PRIORITY,
            Policy::Accept,
        )
        .rule(dispatch()),
    );

    let original = |set: &str| Stmt::Lookup {
        keys: vec![
            Expr::Ct(CtKey::OriginalDaddr),
            L4,
            Expr::Ct(CtKey::OriginalProtoDst),
        ],
        set: set.into(),
        negate: false,
    };
    let dnat = || Stmt::AnyBits {
        left: Expr::Ct(CtKey::Status),
        bits: ct_status::DNAT,
    };
    let proto = |p: Protocol| Stmt::cmp(L4, Value::Proto(p.l4()));

    let mut post = Chain::base(
        "postrouting",
        ChainType::Nat,
        Hook::Postrouting,
        SRCNAT_PRIORITY,
        Policy::Accept,
    );
    // `ct original proto-dst` needs the protocol matched first, so one rule per protocol.
    for p in PROTOCOLS {
        post.push(
            Rule::new(vec![proto(p), dnat(), original(MASQ_SET), Stmt::Masquerade])
                .with_comment("Cluster policy: masquerade clients"),
        );
    }
    for p in PROTOCOLS {
        post.push(
            Rule::new(vec![
                proto(p),
                dnat(),
                Stmt::Lookup {
                    keys: vec![f.saddr()],
                    set: LOCAL_ADDRESSES_SET.into(),
                    negate: false,
                },
                original(LB_SET),
                Stmt::Masquerade,
            ])
            .with_comment("clients on this node: masquerade"),
        );
    }
    for p in PROTOCOLS {
        post.push(
            Rule::new(vec![
                proto(p),
                dnat(),
                Stmt::Lookup {
                    keys: vec![f.saddr(), f.daddr()],
                    set: HAIRPIN_SET.into(),
                    negate: false,
                },
                original(LB_SET),
                Stmt::Masquerade,
            ])
            .with_comment("hairpin: masquerade"),
        );
    }
    t.add_chain(post);

    let mut forward = Chain::base(
        "forward",
        ChainType::Filter,
        Hook::Forward,
        FILTER_PRIORITY,
        Policy::Accept,
    );
    for p in PROTOCOLS {
        forward.push(
            Rule::new(vec![
                proto(p),
                dnat(),
                original(LB_SET),
                Stmt::Verdict(Verdict::Accept),
            ])
            .with_comment("forward DNATed Service traffic"),
        );
    }
    t.add_chain(forward);

    let rejects = || {
        let lookup = || Stmt::Lookup {
            keys: vec![f.daddr(), L4, TH_DPORT],
            set: NO_ENDPOINTS_SET.into(),
            negate: false,
        };
        vec![
            Rule::new(vec![
                Stmt::cmp(L4, Value::Proto(L4Proto::Tcp)),
                lookup(),
                Stmt::Reject(Reject::TcpReset),
            ])
            .with_comment("no endpoints: TCP reset"),
            Rule::new(vec![lookup(), Stmt::Reject(Reject::PortUnreachable)])
                .with_comment("no endpoints: port unreachable"),
        ]
    };
    let mut input = Chain::base(
        "input",
        ChainType::Filter,
        Hook::Input,
        FILTER_PRIORITY,
        Policy::Accept,
    );
    input.rules = rejects();
    t.add_chain(input);
    let mut out = Chain::base(
        "filter-output",
        ChainType::Filter,
        Hook::Output,
        FILTER_PRIORITY,
        Policy::Accept,
    );
    out.rules = rejects();
    t.add_chain(out);
}
