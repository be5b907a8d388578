//! Published addresses: the annotation `nodelb.io/published-addresses`. On a Node it names the
//! addresses clients reach that node at (through a 1:1 NAT in front of it); on a Service, the
//! addresses of a load balancer in front of the nodes. Either way the status publishes them in
//! place of the node addresses of their family, and only in a family the node (for a Service:
//! some node) really serves the Service in, so a status never names an address that nothing
//! behind it serves. The kernel keeps serving the node's own addresses: this is the status
//! only.
//!
//! A family the annotation names no address of keeps the node addresses. An annotation with
//! any entry that is not an IP address, longer than [`MAX_LENGTH`] or naming more than
//! [`MAX_ADDRESSES`] is ignored whole.

use crate::plan::diagnosis::{ObjectKind, ObjectRef, Warning};
pub use crate::plan::service::PUBLISHED_ADDRESSES_ANNOTATION;
use crate::vocab::IpFamily;
use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

/// At most this many addresses (after repeats are dropped).
pub const MAX_ADDRESSES: usize = 16;
/// At most this many bytes of annotation.
pub const MAX_LENGTH: usize = 1024;
/// Bytes of an invalid value quoted in a message.
const QUOTED: usize = 100;

/// An annotation that does not parse, ignored whole.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Invalid {
    /// The value, cut at [`QUOTED`] bytes (on a character boundary, marked with `…`).
    pub value: String,
    pub error: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "annotation {PUBLISHED_ADDRESSES_ANNOTATION} {:?}: {}",
            self.value, self.error
        )
    }
}

/// The annotation's value read: its addresses, numerically sorted (IPv4 first), each once;
/// empty entries are skipped, spaces around an entry trimmed.
pub fn parse(value: &str) -> Result<Vec<IpAddr>, Invalid> {
    let invalid = |error: String| {
        let mut cut = value.len().min(QUOTED);
        while !value.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut quoted = value[..cut].to_string();
        if cut < value.len() {
            quoted.push('…');
        }
        Invalid {
            value: quoted,
            error,
        }
    };
    if value.len() > MAX_LENGTH {
        return Err(invalid(format!(
            "{} bytes long, more than {MAX_LENGTH}",
            value.len()
        )));
    }
    let mut out = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.parse::<IpAddr>() {
            Ok(a) => out.push(a),
            Err(_) => return Err(invalid(format!("{entry:?} is not an IP address"))),
        }
    }
    out.sort();
    out.dedup();
    if out.len() > MAX_ADDRESSES {
        return Err(invalid(format!(
            "names {} addresses, more than {MAX_ADDRESSES}",
            out.len()
        )));
    }
    Ok(out)
}

/// The annotation among `annotations`, read, if it is set.
pub fn annotation(
    annotations: Option<&BTreeMap<String, String>>,
) -> Option<Result<Vec<IpAddr>, Invalid>> {
    annotations?
        .get(PUBLISHED_ADDRESSES_ANNOTATION)
        .map(|v| parse(v))
}

/// A Node's published addresses: none without the annotation, and none (it is ignored) when
/// it is invalid; the node's own agent reports that.
pub fn of_node(node: &Node) -> Vec<IpAddr> {
    match annotation(node.metadata.annotations.as_ref()) {
        Some(Ok(addresses)) => addresses,
        _ => Vec::new(),
    }
}

/// What is wrong with a Node's annotation, if it is set and invalid: its own agent logs it,
/// counts it and tells it in an Event on the Node (the leader ignores it without a word).
pub fn node_warning(node: &Node) -> Option<Warning> {
    let invalid = annotation(node.metadata.annotations.as_ref())?.err()?;
    let name = node.metadata.name.as_deref().unwrap_or_default();
    Some(Warning::new(
        ObjectRef::new(ObjectKind::Node, None, name),
        format!("{invalid}; ignored: the status publishes the node's own addresses"),
    ))
}

/// What is published for `family` where `own` would be (the addresses that serve it, sorted):
/// the addresses of `named` of that family, if it names any and `own` is not empty, else `own`.
pub fn in_place_of(own: Vec<IpAddr>, named: &[IpAddr], family: IpFamily) -> Vec<IpAddr> {
    let of_family: Vec<IpAddr> = named
        .iter()
        .filter(|a| IpFamily::of(a) == family)
        .copied()
        .collect();
    if own.is_empty() || of_family.is_empty() {
        own
    } else {
        of_family
    }
}

/// A Service's ingress with its own annotation's addresses (`named`): each of `families`, in
/// order, with what [`in_place_of`] makes of the addresses `ingress` lists of it.
pub fn for_service(ingress: &[IpAddr], families: &[IpFamily], named: &[IpAddr]) -> Vec<IpAddr> {
    families
        .iter()
        .flat_map(|f| {
            let own = ingress
                .iter()
                .filter(|a| IpFamily::of(a) == *f)
                .copied()
                .collect();
            in_place_of(own, named, *f)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn the_annotation_is_a_trimmed_comma_list_sorted_and_each_once() {
        assert_eq!(
            parse(" 2001:db8::7 ,203.0.113.10,, 203.0.113.9,203.0.113.10 "),
            Ok(ips(&["203.0.113.9", "203.0.113.10", "2001:db8::7"]))
        );
        assert_eq!(parse(""), Ok(vec![]));
    }

    #[test]
    fn an_annotation_with_a_bad_entry_too_long_or_too_many_is_invalid_whole() {
        let bad = parse("203.0.113.9,nonsense").unwrap_err();
        assert_eq!(
            bad.to_string(),
            "annotation nodelb.io/published-addresses \"203.0.113.9,nonsense\": \"nonsense\" is not an IP address"
        );
        // A zone or a prefix is not an address.
        assert!(parse("fe80::1%eth0").is_err());
        assert!(parse("203.0.113.0/24").is_err());
        let many: Vec<String> = (1..=17).map(|i| format!("203.0.113.{i}")).collect();
        assert_eq!(
            parse(&many.join(",")).unwrap_err().error,
            "names 17 addresses, more than 16"
        );
        assert_eq!(parse(&many[..16].join(",")).map(|a| a.len()), Ok(16));
        let long = format!("203.0.113.1{}", " ".repeat(MAX_LENGTH));
        let e = parse(&long).unwrap_err();
        assert_eq!(e.error, "1035 bytes long, more than 1024");
        assert_eq!(e.value.chars().count(), QUOTED + 1);
    }

    #[test]
    fn named_addresses_replace_only_their_family_and_only_where_it_serves() {
        let named = ips(&["198.51.100.1"]);
        let v4 = ips(&["192.0.2.1"]);
        let v6 = ips(&["2001:db8::1"]);
        assert_eq!(in_place_of(v4, &named, IpFamily::V4), named);
        assert_eq!(in_place_of(v6.clone(), &named, IpFamily::V6), v6);
        assert!(in_place_of(vec![], &named, IpFamily::V4).is_empty());
        let ingress = ips(&["2001:db8::1", "192.0.2.1", "192.0.2.2"]);
        assert_eq!(
            for_service(&ingress, &[IpFamily::V6, IpFamily::V4], &named),
            ips(&["2001:db8::1", "198.51.100.1"])
        );
    }
}
