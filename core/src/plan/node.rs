//! This node as the planner sees it: name, labels, and the addresses its Node object lists.

use super::diagnosis::{ObjectKind, ObjectRef, Warning};
use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Kinds of Node address nodelb serves on. `Hostname` and the DNS kinds are not addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddressKind {
    InternalIP,
    ExternalIP,
}

impl AddressKind {
    pub fn parse(kind: &str) -> Option<AddressKind> {
        match kind {
            "InternalIP" => Some(AddressKind::InternalIP),
            "ExternalIP" => Some(AddressKind::ExternalIP),
            _ => None,
        }
    }
}

impl std::fmt::Display for AddressKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddressKind::InternalIP => "InternalIP",
            AddressKind::ExternalIP => "ExternalIP",
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// `status.addresses` of kind InternalIP or ExternalIP, in the Node's order.
    pub addresses: Vec<(AddressKind, IpAddr)>,
}

impl NodeInfo {
    /// The parts of a Node the planner needs. Addresses of other kinds are left out, and so are
    /// addresses that do not parse (see [`NodeInfo::from_node_checked`] to hear about those).
    pub fn from_node(node: &Node) -> NodeInfo {
        NodeInfo::from_node_checked(node).0
    }

    /// Like [`NodeInfo::from_node`], with a warning per InternalIP/ExternalIP that does not parse.
    pub fn from_node_checked(node: &Node) -> (NodeInfo, Vec<Warning>) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let mut warnings = Vec::new();
        let mut addresses = Vec::new();
        let listed = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_deref())
            .unwrap_or_default();
        for a in listed {
            let Some(kind) = AddressKind::parse(&a.type_) else {
                continue;
            };
            match a.address.trim().parse::<IpAddr>() {
                Ok(ip) => addresses.push((kind, ip)),
                Err(_) => warnings.push(Warning::new(
                    ObjectRef::new(ObjectKind::Node, None, &name),
                    format!("{} address {:?} is not an IP address", a.type_, a.address),
                )),
            }
        }
        let info = NodeInfo {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            name,
            addresses,
        };
        (info, warnings)
    }
}
