//! Services, EndpointSlices and Nodes as JSON (a list of objects) through what the agent does
//! with them: read as the watches read them (`objects::wire`), kept in the index, planned for
//! node `node-a`, assembled into tables and rendered as the nft script `nodelb-agent render`
//! prints. Whatever the objects, nothing panics, and `nft -c` accepts every script that is
//! new to this run (the fuzzer runs in a network namespace of its own: scripts/fuzz.sh).
#![no_main]

use k8s_openapi::api::core::v1::Node;
use nodelb_core::objects::{index, wire};
use nodelb_core::plan::config::Config;
use nodelb_core::plan::node::{AddressKind, NodeInfo};
use nodelb_core::plan::{self, Input};
use serde_json::Value;
use std::collections::{BTreeSet, HashSet};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// Hashes of the scripts `nft -c` already accepted (bounded: past it, all are checked again).
static CHECKED: Mutex<Option<HashSet<u64>>> = Mutex::new(None);
const CHECKED_MAX: usize = 100_000;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let mut services: Vec<index::Service> = Vec::new();
    let mut slices: Vec<index::EndpointSlice> = Vec::new();
    let mut nodes: Vec<Node> = Vec::new();
    for item in items {
        match item.get("kind").and_then(Value::as_str) {
            Some("Service") => {
                if let Ok(s) = serde_json::from_value::<wire::Service>(item) {
                    services.push(s.into());
                }
            }
            Some("EndpointSlice") => {
                if let Ok(s) = serde_json::from_value::<wire::EndpointSlice>(item) {
                    slices.push(s.into());
                }
            }
            Some("Node") => {
                if let Ok(n) = serde_json::from_value::<Node>(item) {
                    nodes.push(n);
                }
            }
            _ => {}
        }
    }
    let mut node = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some("node-a"))
        .map(|n| NodeInfo::from_node_checked(n).0)
        .unwrap_or_else(|| NodeInfo {
            name: "node-a".into(),
            ..NodeInfo::default()
        });
    for ip in ["192.0.2.11", "2001:db8::11"] {
        let ip = ip.parse().unwrap();
        if !node.addresses.iter().any(|(_, a)| *a == ip) {
            node.addresses.push((AddressKind::InternalIP, ip));
        }
    }
    let local: BTreeSet<_> = node.addresses.iter().map(|(_, a)| *a).collect();
    let config = Config {
        ipv6: true,
        ..Config::default()
    };
    let planned = plan::plan(&Input {
        services: services.iter().collect(),
        slices: slices.iter().collect(),
        node: &node,
        local_addresses: &local,
        families: config.families(),
        config: &config,
        listeners: &Default::default(),
    });
    if planned.services.is_empty() {
        return;
    }
    let script = planned
        .tables
        .iter()
        .map(nodelb_netfilter::render_replace)
        .collect::<Vec<_>>()
        .join("\n");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    script.hash(&mut h);
    let hash = h.finish();
    {
        let mut checked = CHECKED.lock().unwrap();
        let checked = checked.get_or_insert_with(HashSet::new);
        if checked.len() >= CHECKED_MAX {
            checked.clear();
        }
        if !checked.insert(hash) {
            return;
        }
    }
    nft_check(&script);
});

/// `nft -c -f -` of the script: nftables parses it and the kernel validates it, without
/// committing. Panics (a finding) when either rejects it.
fn nft_check(script: &str) {
    let mut child = Command::new("nft")
        .args(["-c", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nft (Debian's nftables) on PATH");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft -c rejects the rendered script: {}\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
}
