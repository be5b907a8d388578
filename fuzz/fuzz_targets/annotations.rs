//! The annotation parsers on arbitrary text: address types and CIDRs (`nodelb.io/address-types`,
//! `nodelb.io/address-cidrs`, with what a filter does with them), published addresses
//! (`nodelb.io/published-addresses`) and the node selector (`nodelb.io/node-selector`, matched
//! against labels). Each either parses or says why; none panics or loops.
#![no_main]

use nodelb_core::plan::addresses::{parse_cidrs, parse_types, AddressFilter};
use nodelb_core::plan::node::{AddressKind, NodeInfo};
use nodelb_core::plan::selector::Selector;
use nodelb_core::status::published;
use std::collections::BTreeMap;
use std::net::IpAddr;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // One input, cut in two at the first NUL: the types and the CIDRs of one Service.
    let (types, cidrs) = text.split_once('\0').unwrap_or((&text, &text));
    let _ = parse_types(types);
    let _ = parse_cidrs(cidrs);
    let node = NodeInfo {
        name: "node-a".into(),
        addresses: vec![
            (AddressKind::InternalIP, "192.0.2.11".parse().unwrap()),
            (AddressKind::ExternalIP, "2001:db8::11".parse().unwrap()),
        ],
        ..NodeInfo::default()
    };
    let served: Vec<IpAddr> = node.addresses.iter().map(|(_, a)| *a).collect();
    if let Ok(filter) =
        AddressFilter::of_service(Some(types), Some(cidrs), &AddressFilter::default())
    {
        for (kind, address) in &node.addresses {
            let _ = filter.admits(*kind, address);
        }
        let chosen = filter.select(&node, &served);
        assert!(
            chosen.iter().all(|a| served.contains(a)),
            "{chosen:?} outside {served:?}"
        );
    }
    if let Ok(addresses) = published::parse(&text) {
        assert!(
            !addresses.is_empty()
                || text.trim().is_empty()
                || text.split(',').all(|p| p.trim().is_empty())
        );
    }
    if let Ok(selector) = Selector::parse(&text) {
        let labels = BTreeMap::from([
            ("topology.kubernetes.io/zone".to_string(), "a".to_string()),
            ("node-role".to_string(), "edge".to_string()),
        ]);
        let _ = selector.matches(&labels);
        let _ = selector.matches(&BTreeMap::new());
    }
});
