//! Validation kube-apiserver would do, applied only when
//! `ApiServerConfig::validate` is on; off, the store keeps objects a real
//! server would reject, so tests can feed the agent bad input. Not the whole
//! of kube's validation: names, and the Service, EndpointSlice and Lease
//! fields nodelb reads.

use std::net::IpAddr;

use serde_json::Value;

use super::resources::ResourceDef;

/// Reasons the object is invalid, as `field: problem`; empty when valid.
pub fn validate(res: &ResourceDef, object: &Value) -> Vec<String> {
    let mut causes = Vec::new();
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !is_dns_subdomain(name) {
        causes.push(format!(
            "metadata.name: Invalid value: {name:?}: must be a lowercase RFC 1123 subdomain"
        ));
    }
    match res.kind {
        "Service" => service(object, &mut causes),
        "EndpointSlice" => endpoint_slice(object, &mut causes),
        "Lease" => lease(object, &mut causes),
        _ => {}
    }
    causes
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn items<'a>(v: &'a Value, pointer: &str) -> impl Iterator<Item = (usize, &'a Value)> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
}

fn check_port(v: &Value, field: &str, causes: &mut Vec<String>) {
    match v.as_u64() {
        Some(1..=65535) => {}
        _ => causes.push(format!(
            "{field}: Invalid value: {v}: must be between 1 and 65535, inclusive"
        )),
    }
}

fn check_protocol(v: Option<&Value>, field: &str, causes: &mut Vec<String>) {
    match v.and_then(Value::as_str) {
        None | Some("TCP" | "UDP" | "SCTP") => {}
        Some(p) => causes.push(format!(
            "{field}: Unsupported value: {p:?}: supported values: \"SCTP\", \"TCP\", \"UDP\""
        )),
    }
}

fn check_ip(v: Option<&Value>, field: &str, causes: &mut Vec<String>) {
    if let Some(s) = v.and_then(Value::as_str) {
        if s.parse::<IpAddr>().is_err() {
            causes.push(format!(
                "{field}: Invalid value: {s:?}: must be a valid IP address"
            ));
        }
    }
}

fn service(svc: &Value, causes: &mut Vec<String>) {
    for (i, p) in items(svc, "/spec/ports") {
        check_port(&p["port"], &format!("spec.ports[{i}].port"), causes);
        check_protocol(
            p.get("protocol"),
            &format!("spec.ports[{i}].protocol"),
            causes,
        );
    }
    for (i, ing) in items(svc, "/status/loadBalancer/ingress") {
        let field = format!("status.loadBalancer.ingress[{i}]");
        check_ip(ing.get("ip"), &format!("{field}.ip"), causes);
        match ing.get("ipMode").and_then(Value::as_str) {
            None | Some("VIP" | "Proxy") => {}
            Some(m) => causes.push(format!(
                "{field}.ipMode: Unsupported value: {m:?}: supported values: \"Proxy\", \"VIP\""
            )),
        }
        if ing.get("ip").is_none() && ing.get("ipMode").is_some() {
            causes.push(format!(
                "{field}.ipMode: Forbidden: may not be specified when `ip` is not"
            ));
        }
    }
    for (i, range) in items(svc, "/spec/loadBalancerSourceRanges") {
        let ok = range
            .as_str()
            .and_then(|r| r.split_once('/'))
            .is_some_and(|(ip, len)| ip.parse::<IpAddr>().is_ok() && len.parse::<u8>().is_ok());
        if !ok {
            causes.push(format!(
                "spec.loadBalancerSourceRanges[{i}]: Invalid value: {range}: must be a CIDR"
            ));
        }
    }
}

fn endpoint_slice(slice: &Value, causes: &mut Vec<String>) {
    let family = slice.get("addressType").and_then(Value::as_str);
    if !matches!(family, Some("IPv4" | "IPv6" | "FQDN")) {
        causes.push(format!(
            "addressType: Unsupported value: {family:?}: supported values: \"FQDN\", \"IPv4\", \"IPv6\""
        ));
    }
    for (i, p) in items(slice, "/ports") {
        if let Some(port) = p.get("port") {
            check_port(port, &format!("ports[{i}].port"), causes);
        }
        check_protocol(p.get("protocol"), &format!("ports[{i}].protocol"), causes);
    }
    if matches!(family, Some("IPv4" | "IPv6")) {
        for (i, ep) in items(slice, "/endpoints") {
            for (j, a) in items(ep, "/addresses") {
                check_ip(Some(a), &format!("endpoints[{i}].addresses[{j}]"), causes);
            }
        }
    }
}

fn lease(lease: &Value, causes: &mut Vec<String>) {
    if let Some(d) = lease.pointer("/spec/leaseDurationSeconds") {
        if d.as_i64().is_none_or(|d| d <= 0) {
            causes.push(format!(
                "spec.leaseDurationSeconds: Invalid value: {d}: must be greater than 0"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::by_kind;
    use serde_json::json;

    #[test]
    fn service_with_port_zero_and_bad_ip_is_invalid() {
        let svc = json!({"metadata": {"name": "a"},
            "spec": {"ports": [{"port": 0, "protocol": "ICMP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "not-an-ip"}]}}});
        let causes = validate(by_kind("v1", "Service").unwrap(), &svc);
        assert_eq!(causes.len(), 3, "{causes:?}");
    }

    #[test]
    fn good_objects_pass() {
        let svc = json!({"metadata": {"name": "a"},
            "spec": {"ports": [{"port": 80, "protocol": "TCP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ipMode": "Proxy"}]}}});
        assert!(validate(by_kind("v1", "Service").unwrap(), &svc).is_empty());
        let slice = json!({"metadata": {"name": "a-1"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["198.51.100.7"]}], "ports": [{"port": 8080}]});
        assert!(validate(
            by_kind("discovery.k8s.io/v1", "EndpointSlice").unwrap(),
            &slice
        )
        .is_empty());
    }

    #[test]
    fn uppercase_name_is_invalid() {
        let v = json!({"metadata": {"name": "Bad"}});
        assert_eq!(validate(by_kind("v1", "Node").unwrap(), &v).len(), 1);
    }
}
