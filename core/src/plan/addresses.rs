//! Which of the node's addresses serve a Service: its `nodelb.io/address-types` and
//! `nodelb.io/address-cidrs` annotations, each replacing the default the flags
//! `--address-types` and `--address-cidrs` give ([`super::config::Config::addresses`]). The
//! annotations are named in `service.rs`, beside the node selector's.

use super::cidr::Cidr;
use super::node::{AddressKind, NodeInfo};
use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

/// Annotation: the kinds of node address (`InternalIP`, `ExternalIP`, comma separated) that
/// serve the Service (see this module).
pub const ADDRESS_TYPES_ANNOTATION: &str = "nodelb.io/address-types";
/// Annotation: the prefixes (comma separated) a node address must lie in to serve the Service;
/// empty: any.
pub const ADDRESS_CIDRS_ANNOTATION: &str = "nodelb.io/address-cidrs";

/// Which node addresses may serve a Service: of one of `types`, and inside one of `cidrs`
/// (any address when `cidrs` is empty).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AddressFilter {
    /// Never empty.
    pub types: BTreeSet<AddressKind>,
    /// Sorted, each once; empty: no CIDR filter.
    pub cidrs: Vec<Cidr>,
}

impl Default for AddressFilter {
    /// Both kinds, no CIDR filter: every node address serves.
    fn default() -> AddressFilter {
        AddressFilter {
            types: [AddressKind::InternalIP, AddressKind::ExternalIP].into(),
            cidrs: Vec::new(),
        }
    }
}

/// A comma list of address kinds, at least one: `InternalIP,ExternalIP`.
pub fn parse_types(s: &str) -> Result<BTreeSet<AddressKind>, String> {
    let mut types = BTreeSet::new();
    for t in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        match AddressKind::parse(t) {
            Some(k) => types.insert(k),
            None => return Err(format!("{t:?} is not InternalIP or ExternalIP")),
        };
    }
    if types.is_empty() {
        return Err("names no address type (InternalIP, ExternalIP)".to_string());
    }
    Ok(types)
}

/// A comma list of CIDRs, possibly empty (no CIDR filter): `203.0.113.0/24,2001:db8::/32`.
pub fn parse_cidrs(s: &str) -> Result<Vec<Cidr>, String> {
    let mut cidrs = BTreeSet::new();
    for c in s.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        match Cidr::parse(c) {
            Some(c) => cidrs.insert(c),
            None => return Err(format!("{c:?} is not a CIDR")),
        };
    }
    Ok(cidrs.into_iter().collect())
}

/// An annotation of a Service's that does not parse: the Service is served nowhere (as with
/// an invalid `nodelb.io/node-selector`), rather than on addresses it did not ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidAddresses {
    pub annotation: &'static str,
    pub value: String,
    pub error: String,
}

impl fmt::Display for InvalidAddresses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "annotation {} {:?}: {}",
            self.annotation, self.value, self.error
        )
    }
}

impl AddressFilter {
    /// A Service's filter, from its annotations (`types`, `cidrs`: their values, if set), each
    /// replacing its part of `default`. Every annotation that does not parse is an error.
    pub fn of_service(
        types: Option<&str>,
        cidrs: Option<&str>,
        default: &AddressFilter,
    ) -> Result<AddressFilter, Vec<InvalidAddresses>> {
        let mut errors = Vec::new();
        let mut filter = default.clone();
        let mut check = |annotation, value: &str, e: String| {
            errors.push(InvalidAddresses {
                annotation,
                value: value.to_string(),
                error: e,
            })
        };
        if let Some(v) = types {
            match parse_types(v) {
                Ok(t) => filter.types = t,
                Err(e) => check(ADDRESS_TYPES_ANNOTATION, v, e),
            }
        }
        if let Some(v) = cidrs {
            match parse_cidrs(v) {
                Ok(c) => filter.cidrs = c,
                Err(e) => check(ADDRESS_CIDRS_ANNOTATION, v, e),
            }
        }
        match errors.is_empty() {
            true => Ok(filter),
            false => Err(errors),
        }
    }

    /// Whether an address listed as `kind` may serve.
    pub fn admits(&self, kind: AddressKind, address: &IpAddr) -> bool {
        self.types.contains(&kind) && self.in_cidrs(address)
    }

    /// Whether `address` lies in one of the CIDRs (or there is no CIDR filter).
    pub fn in_cidrs(&self, address: &IpAddr) -> bool {
        let host = Cidr {
            addr: *address,
            len: match address {
                IpAddr::V4(_) => 32,
                IpAddr::V6(_) => 128,
            },
        };
        self.cidrs.is_empty() || self.cidrs.iter().any(|c| c.contains(&host))
    }

    /// Of `served` (node addresses on the host, of one family, sorted), those this filter
    /// admits under one of the kinds the node lists them as.
    pub fn select(&self, node: &NodeInfo, served: &[IpAddr]) -> Vec<IpAddr> {
        served
            .iter()
            .filter(|a| {
                node.addresses
                    .iter()
                    .any(|(k, b)| b == *a && self.admits(*k, a))
            })
            .copied()
            .collect()
    }
}

impl fmt::Display for AddressFilter {
    /// `InternalIP,ExternalIP` or `ExternalIP in 203.0.113.0/24,2001:db8::/32`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let types: Vec<String> = self.types.iter().map(|t| t.to_string()).collect();
        f.write_str(&types.join(","))?;
        if !self.cidrs.is_empty() {
            let cidrs: Vec<String> = self.cidrs.iter().map(|c| c.to_string()).collect();
            write!(f, " in {}", cidrs.join(","))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_cidrs_parse_as_comma_lists() {
        assert_eq!(
            parse_types(" ExternalIP , InternalIP,ExternalIP").unwrap(),
            [AddressKind::InternalIP, AddressKind::ExternalIP].into()
        );
        assert!(parse_types("Hostname")
            .unwrap_err()
            .contains("\"Hostname\""));
        assert!(
            parse_types("externalip").is_err(),
            "case matters, as in Node"
        );
        assert!(parse_types(" , ").is_err());
        assert_eq!(
            parse_cidrs("203.0.113.7/24, 2001:db8::/32").unwrap(),
            vec![
                Cidr::parse("203.0.113.0/24").unwrap(),
                Cidr::parse("2001:db8::/32").unwrap()
            ]
        );
        assert_eq!(parse_cidrs("").unwrap(), Vec::new());
        assert!(parse_cidrs("203.0.113.0/24,10.0.0.0/33")
            .unwrap_err()
            .contains("\"10.0.0.0/33\""));
    }

    #[test]
    fn an_annotation_replaces_its_part_of_the_default_only() {
        let default = AddressFilter {
            types: [AddressKind::InternalIP].into(),
            cidrs: parse_cidrs("198.51.100.0/24").unwrap(),
        };
        let f = AddressFilter::of_service(Some("ExternalIP"), None, &default).unwrap();
        assert_eq!(f.types, [AddressKind::ExternalIP].into());
        assert_eq!(f.cidrs, default.cidrs);
        let f = AddressFilter::of_service(None, Some(""), &default).unwrap();
        assert_eq!((f.types, f.cidrs), (default.types.clone(), Vec::new()));
        let errors = AddressFilter::of_service(Some("Public"), Some("x"), &default).unwrap_err();
        assert_eq!(errors.len(), 2);
        assert_eq!(
            errors[0].to_string(),
            "annotation nodelb.io/address-types \"Public\": \"Public\" is not InternalIP or ExternalIP"
        );
    }

    #[test]
    fn an_address_serves_when_its_kind_and_a_cidr_admit_it() {
        let node = NodeInfo {
            name: "n".into(),
            labels: Default::default(),
            addresses: vec![
                (AddressKind::InternalIP, "192.0.2.1".parse().unwrap()),
                (AddressKind::ExternalIP, "203.0.113.1".parse().unwrap()),
                (AddressKind::ExternalIP, "198.51.100.1".parse().unwrap()),
            ],
        };
        let served: Vec<IpAddr> = ["192.0.2.1", "198.51.100.1", "203.0.113.1"]
            .map(|a| a.parse().unwrap())
            .into();
        let f = |t: &str, c: &str| {
            AddressFilter::of_service(Some(t), Some(c), &AddressFilter::default()).unwrap()
        };
        let pick = |f: AddressFilter| -> Vec<String> {
            f.select(&node, &served)
                .iter()
                .map(|a| a.to_string())
                .collect()
        };
        assert_eq!(pick(AddressFilter::default()).len(), 3);
        assert_eq!(pick(f("ExternalIP", "")), ["198.51.100.1", "203.0.113.1"]);
        assert_eq!(pick(f("InternalIP", "")), ["192.0.2.1"]);
        assert_eq!(
            pick(f("InternalIP,ExternalIP", "203.0.113.0/24")),
            ["203.0.113.1"]
        );
        assert!(pick(f("InternalIP", "203.0.113.0/24")).is_empty());
        assert!(pick(f("ExternalIP", "2001:db8::/32")).is_empty());
    }
}
