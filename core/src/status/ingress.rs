//! What to write to one Service's `status.loadBalancer.ingress`, if anything: compared with
//! what is stored, and with who owns the field (server-side apply's managedFields).

use super::condition::{Serving, CONDITION_TYPE};
use super::Desired;
use crate::objects::index::{Service, ServingCondition};
use k8s_openapi::api::core::v1::LoadBalancerIngress;
use k8s_openapi::jiff::{self, Timestamp};
use serde_json::{json, Value};
use std::net::IpAddr;

/// nodelb's field manager for status writes.
pub const FIELD_MANAGER: &str = "nodelb";

/// What the writer does for one Service.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// Stored equals desired (or nothing of nodelb's to clear).
    Nothing,
    /// Server-side apply this body (the ingress and the condition) under `FIELD_MANAGER`
    /// (`first`: nothing was published before, so the Event is `EnsuredLoadBalancer`, else
    /// `UpdatedLoadBalancer`; none when only the condition changed).
    Apply {
        body: Value,
        first: bool,
        ingress_changed: bool,
    },
    /// The Service is no longer nodelb's: apply an empty status, so only what nodelb owned
    /// is removed.
    Clear { body: Value },
    /// Another field manager owns the ingress: leave it alone.
    OwnedElsewhere { managers: Vec<String> },
}

/// The ingress entries as stored.
pub fn stored(svc: &Service) -> Vec<LoadBalancerIngress> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().map(LoadBalancerIngress::from).collect())
        .unwrap_or_default()
}

/// The ingress entries nodelb wants: one per address, with `ip_mode` when the API server
/// keeps it.
pub fn entries(ingress: &[IpAddr], ip_mode: Option<&str>) -> Vec<LoadBalancerIngress> {
    ingress
        .iter()
        .map(|ip| LoadBalancerIngress {
            ip: Some(ip.to_string()),
            ip_mode: ip_mode.map(str::to_string),
            ..Default::default()
        })
        .collect()
}

fn body(svc: &Service, status: Value) -> Value {
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let namespace = svc.metadata.namespace.as_deref().unwrap_or_default();
    status_body(name, namespace, status)
}

/// The server-side apply body of a Service's status: what nodelb applies under its field
/// manager (an empty `status` removes every field only nodelb owned).
pub fn status_body(name: &str, namespace: &str, status: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "status": status,
    })
}

/// Decide the write for a Service at `now` (the leader's clock, for the condition's
/// `lastTransitionTime`); `desired` is `None` when nodelb does not handle it. A Service
/// labelled `service.kubernetes.io/service-proxy-name` is another proxy's: nodelb neither
/// writes its status nor clears what it wrote there before (that proxy's load balancer
/// controller owns it now; `clear-status` still removes it on uninstall).
pub fn decide(
    svc: &Service,
    desired: Option<&Desired>,
    ip_mode: Option<&str>,
    now: Timestamp,
) -> Write {
    if svc.metadata.other_proxy {
        return Write::Nothing;
    }
    let managers = &svc.metadata.ingress_owners;
    let stored_condition = svc.status.as_ref().and_then(|s| s.serving.as_deref());
    let ours = managers.iter().any(|m| m == FIELD_MANAGER) || stored_condition.is_some();
    let others: Vec<String> = managers
        .iter()
        .filter(|m| *m != FIELD_MANAGER)
        .map(|m| m.to_string())
        .collect();
    let Some(desired) = desired else {
        return if ours {
            Write::Clear {
                body: body(svc, json!({})),
            }
        } else {
            Write::Nothing
        };
    };
    if !others.is_empty() {
        return Write::OwnedElsewhere { managers: others };
    }
    let want = entries(&desired.ingress, ip_mode);
    let mut current = stored(svc);
    if ip_mode.is_none() {
        // nodelb does not send ipMode here; what the server filled in itself (a 1.29 server
        // with the LoadBalancerIPMode gate on stores `VIP`) is not a difference to write.
        for entry in &mut current {
            entry.ip_mode = None;
        }
    }
    let generation = svc.metadata.generation;
    let condition_same =
        stored_condition.is_some_and(|c| same_condition(c, &desired.serving, generation));
    if want == current && condition_same {
        return Write::Nothing;
    }
    let condition = condition_entry(&desired.serving, generation, stored_condition, now);
    Write::Apply {
        body: body(
            svc,
            json!({
                "loadBalancer": {"ingress": serde_json::to_value(&want).expect("ingress serializes")},
                "conditions": [condition],
            }),
        ),
        first: current.is_empty(),
        ingress_changed: want != current,
    }
}

fn status_word(status: bool) -> &'static str {
    if status {
        "True"
    } else {
        "False"
    }
}

/// Whether the stored condition says what nodelb wants, for this generation.
fn same_condition(stored: &ServingCondition, want: &Serving, generation: Option<i64>) -> bool {
    stored.status.as_deref() == Some(status_word(want.status))
        && stored.reason.as_deref() == Some(want.reason)
        && stored.message == Some(crate::vocab::digest(want.message.as_str()))
        && stored.observed_generation == generation
}

/// The condition to apply: its `lastTransitionTime` is kept while its status stays, else it
/// is `now`.
fn condition_entry(
    want: &Serving,
    generation: Option<i64>,
    stored: Option<&ServingCondition>,
    now: Timestamp,
) -> Value {
    let status = status_word(want.status);
    let since = stored
        .filter(|c| c.status.as_deref() == Some(status))
        .and_then(|c| c.last_transition_time.as_deref().map(str::to_string))
        .unwrap_or_else(|| now.round(jiff::Unit::Second).unwrap_or(now).to_string());
    let mut c = json!({
        "type": CONDITION_TYPE,
        "status": status,
        "reason": want.reason,
        "message": want.message,
        "lastTransitionTime": since,
    });
    if let Some(g) = generation {
        c["observedGeneration"] = json!(g);
    }
    c
}
