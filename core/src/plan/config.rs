//! What the operator decides with flags: families, class, reserved ports, namespaces, which
//! node addresses serve a Service by default, ServiceLB compatibility.

use super::addresses::AddressFilter;
use super::reserved::{self, ReservedPorts};
use super::servicelb::ServiceLb;
use crate::vocab::{Families, IpFamily, Protocol};
use nodelb_netfilter::TableRef;
use std::collections::BTreeSet;

/// The planner's settings, one field per `nodelb-agent run` flag it depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `--ipv4` (default true). Read by the caller when it computes [`crate::vocab::Families`]; the
    /// planner itself only looks at `Families`.
    pub ipv4: bool,
    /// `--ipv6` (default false). See `ipv4`.
    pub ipv6: bool,
    /// `--default-class` (default true): handle LoadBalancer Services without a class.
    pub default_class: bool,
    /// `--lb-class` (default `nodelb.io/nodelb`).
    pub lb_class: String,
    /// `--reserved-ports`: Service ports nodelb refuses to take.
    pub reserved_ports: ReservedPorts,
    /// `--allowed-namespaces`: `None` allows every namespace.
    pub allowed_namespaces: Option<BTreeSet<String>>,
    /// `--address-types` and `--address-cidrs`: which node addresses serve a Service without
    /// the annotations `nodelb.io/address-types` and `nodelb.io/address-cidrs` (default: both
    /// kinds, any address).
    pub addresses: AddressFilter,
    /// Name of the nft table in each family (`nodelb`).
    pub table_name: String,
    /// `--servicelb-compat` (default off): honour k3s ServiceLB's node labels and pools. The
    /// one setting that is not the flag alone: whether some Node carries ServiceLB's
    /// `enablelb` label is cluster state, filled in by the agent and the leader from the Nodes
    /// they watch ([`ServiceLb::seeing`]); a change of it replans every Service.
    pub servicelb: ServiceLb,
}

/// The loadBalancerClass nodelb answers to unless `--lb-class` says otherwise.
pub const DEFAULT_LB_CLASS: &str = "nodelb.io/nodelb";
/// The table nodelb owns in each family.
pub const DEFAULT_TABLE_NAME: &str = "nodelb";

impl Default for Config {
    fn default() -> Config {
        Config {
            ipv4: true,
            ipv6: false,
            default_class: true,
            lb_class: DEFAULT_LB_CLASS.to_string(),
            reserved_ports: ReservedPorts::defaults()
                .with(Protocol::Tcp, reserved::DEFAULT_OWN_PORTS),
            allowed_namespaces: None,
            addresses: AddressFilter::default(),
            table_name: DEFAULT_TABLE_NAME.to_string(),
            servicelb: ServiceLb::Ignored,
        }
    }
}

impl Config {
    /// The families `--ipv4` and `--ipv6` enable (whether they can be programmed is the
    /// host's to say).
    pub fn families(&self) -> Families {
        Families {
            v4: self.ipv4,
            v6: self.ipv6,
        }
    }

    /// nodelb's table of a family.
    pub fn table_ref(&self, family: IpFamily) -> TableRef {
        TableRef {
            family: family.netfilter(),
            name: self.table_name.clone(),
        }
    }

    /// Whether Services in `namespace` may be nodelb's at all.
    pub fn namespace_allowed(&self, namespace: &str) -> bool {
        self.allowed_namespaces
            .as_ref()
            .is_none_or(|allowed| allowed.contains(namespace))
    }
}
