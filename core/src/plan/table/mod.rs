//! Where a Service becomes chains, sets and map elements: one family's `nodelb` table.
//!
//! Shape (docs/design.md, "The netfilter shape"):
//! - `map services` (`addr . inet_proto . inet_service : verdict`) is the dispatch: nat
//!   `prerouting` and `output` look up `daddr . l4proto . th dport` in it, so a packet's cost does
//!   not grow with the number of Services. A plain Service port's element (no source ranges, no
//!   affinity, endpoints to forward to) goes (`goto`) straight to the shared chain `endpoints-N`
//!   for its endpoint count N, which DNATs through `numgen random mod N` and the global `map
//!   endpoints` (`l4proto . th dport . index : daddr . th dport`; an endpoint keeps its index
//!   while it stays, see `plan::slots`). A chain per Service port
//!   would cost the full install a large part of its kernel time (the `install_shapes` bench
//!   of `nodelb-integration`, docs/benchmarks.md), for a new-connection count no metric
//!   reads: the per-Service counters below count its traffic.
//! - The other Service ports' elements go to the port's own chain
//!   `svc-<namespace>/<name>-<proto>-<port>`, which drops clients outside
//!   `loadBalancerSourceRanges` (counted), then either counts and goes to `endpoints-N`, or, for
//!   `Local` without a local endpoint, sends clients on the node itself to the endpoints
//!   elsewhere (as kube-proxy does) and counts and drops the rest. Only the `endpoints-N` chains
//!   refer to the endpoint map: the kernel walks a whole map each time a new chain binds to it,
//!   so a DNAT rule per Service port would make a commit's cost grow with Services times
//!   endpoints, where a few shared chains bind it a few times.
//! - `sessionAffinity: ClientIP`: the port's endpoints are `map endpoints`' elements as for
//!   any port; its own chain keeps a client on the slot its own set `aff-<hash>` (`client .
//!   slot`, `flags dynamic,timeout`) holds for it, or picks a slot and remembers it
//!   (`part::affinity_rules`), and goes to the shared chain `slot-<I>` that DNATs to slot I.
//!   A set per port, so one Service's flood of new clients fills only its own; the cost is
//!   the kernel's walk of the table's sets by name for each rule that names one, which grows
//!   with the square of the affinity ports (13x the plain install at 1,000 of them,
//!   docs/benchmarks.md). A client is kept by its endpoint's slot, which the endpoint keeps
//!   while it stays (`plan::slots`).
//! - Services without any endpoint are in `set no-endpoints`, whose new connections (`ct state
//!   new`: never a reply to the node's own connection from that port) are rejected in filter
//!   `input` and `filter-output` (TCP reset, ICMP port unreachable): reject is not allowed in
//!   prerouting.
//! - Masquerade (`fully-random`, as kube-proxy's) in nat `postrouting`, decided from
//!   conntrack's original destination (no packet mark): every client of a `Cluster` Service (`set masq-services`), and under both policies
//!   clients on the node itself (`set local-addresses`) and hairpin connections, an endpoint
//!   reaching its own Service (`set hairpin` of `endpoint . endpoint`).
//! - filter `forward` accepts DNATed traffic of nodelb's Services (`set lb-services`).
//! - Counting: each Service port has a counter object `svc/<namespace>/<name>/<port>` and, for
//!   each of its dispatch keys, an element in `map svc-counters` (`addr . inet_proto .
//!   inet_service : counter`). Filter `forward`, `input` and `filter-output` count every packet
//!   of a DNATed connection, both directions, into the counter its original destination names
//!   (`ct original daddr . l4proto . ct original proto-dst`); a packet crosses one of the three
//!   hooks, so it is counted once. Sources outside `loadBalancerSourceRanges` are dropped into
//!   `drops/<namespace>/<name>/<port>`. Counter names are nft identifiers (nft's grammar takes
//!   no quoted name in a declaration, and no `:`); the `svc/` and `drops/` prefixes keep a
//!   namespace that starts with a digit legal.
//!
//! Every rule and element carries the comment `namespace/name:port`.
//!
//! A table is assembled from a skeleton (declarations, base chains, host addresses) and one
//! [`Part`] per Service; between two syncs only the Parts of changed Services are compared.

//!
//! Its rooms: `naming` (every chain, set and counter name and comment, and reading a counter
//! name back), `part` (what one Service port adds to a table), `skeleton` (the declarations,
//! base chains and fixed rules every table has), `diff` (the edit between two Parts, and the
//! elements Services share); here, what they share and the assembly of a whole table.

mod diff;
mod naming;
mod part;
mod skeleton;

pub use diff::*;
pub use naming::*;
pub use part::*;
pub use skeleton::*;

use super::cidr::Cidr;
use super::endpoints::EndpointAddr;
use super::service::{ClientIpAffinity, TrafficPolicy};
use crate::packed::Packed;
use crate::vocab::IpFamily;
use crate::vocab::{Protocol, ServiceKey, ServicePortId};
use nodelb_netfilter::{
    ct_state, ct_status, Chain, ChainType, Counter, CtKey, DataType, Edit, ElemData, ElemEdit,
    Element, Expr, Hook, Key, L4Proto, MapData, MetaKey, NatKind, Payload, Policy, Reject, Rule,
    Set, SetType, Stmt, Table, Value, Verdict,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// Priority of nodelb's dispatch (nat `prerouting` and `output`): `dstnat - 10`, before every
/// other DNAT at `dstnat` (-100: kube-proxy, CNI hostPort/portmap, Docker), so for the addresses
/// and ports nodelb publishes, nodelb's DNAT is the one that applies, whatever registered its
/// chain first.
pub const DISPATCH_PRIORITY: i32 = -110;
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
pub const COUNTERS_MAP: &str = "svc-counters";

/// The IPv4 or IPv6 header, for the table of its family: the address type and the fields
/// rules match on.
pub(super) struct IpHeader(IpFamily);

impl IpHeader {
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

pub(super) const L4: Expr = Expr::Meta(MetaKey::L4Proto);
pub(super) const TH_DPORT: Expr = Expr::Payload(Payload::ThDport);
pub(super) const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

pub(super) fn value(ip: IpAddr) -> Value {
    Value::from(ip)
}

pub(super) fn service_key(addr: IpAddr, port: &ServicePortId) -> Key {
    Key::Values(
        vec![
            value(addr),
            Value::Proto(port.protocol.l4()),
            Value::Port(port.port),
        ]
        .into(),
    )
}

pub(super) fn element(data: Option<ElemData>, comment: &Arc<str>) -> Element {
    Element {
        data,
        comment: Some(comment.clone()),
    }
}

/// Who uses each hairpin address, by the comment of each user, sorted; the element's comment
/// is the first user's, so it does not depend on the order Services were added. (Usually one
/// user: a vector, where a set would allocate room for eleven per address.)
pub type HairpinUsers = BTreeMap<IpAddr, Vec<Arc<str>>>;

pub(super) fn hairpin_key(addr: IpAddr) -> Key {
    Key::Values(vec![value(addr), value(addr)].into())
}

/// A table being filled: the skeleton, then every Service's Part (moved in, not copied),
/// then the shared chains and the hairpin elements.
///
/// The shared sets' elements and the counters arrive one Service at a time, in no order of
/// their keys; inserted so, a map's nodes end about half full (see `packed`). They are
/// gathered in [`Packed`] maps instead, whose nodes are full.
pub struct Assembly {
    table: Table,
    /// By set: the skeleton's sets, the shared ones every Service's elements go in.
    elements: BTreeMap<String, Packed<Key, Element>>,
    counters: Packed<String, Counter>,
    shared_chains: BTreeSet<SharedChain>,
}

impl Assembly {
    pub fn new(mut skeleton: Table) -> Assembly {
        let elements = skeleton
            .sets
            .iter_mut()
            .map(|(name, set)| {
                (
                    name.clone(),
                    Packed::from(std::mem::take(&mut set.elements)),
                )
            })
            .collect();
        let counters = Packed::from(std::mem::take(&mut skeleton.counters));
        Assembly {
            table: skeleton,
            elements,
            counters,
            shared_chains: BTreeSet::new(),
        }
    }

    pub fn add(&mut self, part: Part) {
        let t = &mut self.table;
        self.shared_chains.extend(part.shared_chains);
        for ((set, key), e) in part.elements {
            if let Some(s) = self.elements.get_mut(set) {
                s.insert(key, e);
            }
        }
        for (name, c) in part.chains.0 {
            t.chains.insert(name, c);
        }
        for (name, s) in part.sets.0 {
            t.sets.insert(name, s);
        }
        for (name, c) in part.counters.0 {
            self.counters.insert(name, c);
        }
    }

    pub fn finish(mut self, hairpin: &HairpinUsers) -> Table {
        for c in std::mem::take(&mut self.shared_chains) {
            self.table.add_chain(c.chain());
        }
        if let Some(s) = self.elements.get_mut(HAIRPIN_SET) {
            for (addr, users) in hairpin {
                if let Some(first) = users.first() {
                    let e = Element {
                        data: None,
                        comment: Some(first.clone()),
                    };
                    s.insert(hairpin_key(*addr), e);
                }
            }
        }
        for (name, elements) in std::mem::take(&mut self.elements) {
            if let Some(s) = self.table.sets.get_mut(&name) {
                s.elements = elements.finish();
            }
        }
        self.table.counters = self.counters.finish();
        self.table
    }
}

/// The packet's protocol is `p`.
pub(super) fn l4_is(p: Protocol) -> Stmt {
    Stmt::cmp(L4, Value::Proto(p.l4()))
}
