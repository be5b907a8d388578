//! `nodelb-agent clear-status`, for uninstalling: every Service whose status has fields owned by
//! field manager `nodelb` gets an empty server-side apply under that manager, which removes
//! what only nodelb owned (the ingress, nodelb's conditions) and leaves other managers' fields.
//! It first waits until no leader is left to write the status again: until the Lease
//! `nodelb-status` has not changed for its lease duration, as seen on this process's clock.
//! Its writes are paced as the leader's are (10,000 Services in about 100 s). For an uninstall
//! hook (the chart's), it can first stop the agents and last wait for the cleanup DaemonSet.

use super::rate_limit::RateLimiter;
use super::status_writer::{BURST, REQUESTS_PER_SECOND};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ListParams, Patch, PatchParams};
use nodelb_core::status::ingress::{self, FIELD_MANAGER};
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

/// The status Lease's name (see `kube::lease`).
const STATUS_LEASE: &str = "nodelb-status";
/// How often the Lease is read while waiting.
const POLL: Duration = Duration::from_secs(1);

/// Services listed per request: the list is read a page at a time.
const PAGE: u32 = 500;

/// What `clear-status` did.
#[derive(Debug, Default)]
pub struct Cleared {
    /// `namespace/name` of each Service whose nodelb-owned status fields were removed.
    pub cleared: Vec<String>,
    /// `namespace/name` and the server's answer for each Service that could not be cleared.
    pub failed: Vec<(String, String)>,
}

impl fmt::Display for Cleared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cleared.is_empty() && self.failed.is_empty() {
            return f.write_str("no Service has status fields owned by nodelb");
        }
        write!(
            f,
            "cleared nodelb's status fields on {} Services",
            self.cleared.len()
        )?;
        for s in &self.cleared {
            write!(f, "\ncleared {s}")?;
        }
        for (s, e) in &self.failed {
            write!(f, "\nfailed {s}: {e}")?;
        }
        Ok(())
    }
}

/// Whether field manager `nodelb` owns fields of the Service's status.
pub fn owns_status(svc: &Service) -> bool {
    svc.metadata.managed_fields.iter().flatten().any(|m| {
        m.manager.as_deref() == Some(FIELD_MANAGER)
            && m.subresource.as_deref() == Some("status")
            && m.fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:status"))
                .is_some_and(|s| s.as_object().is_some_and(|o| !o.is_empty()))
    })
}

/// Clear the status fields nodelb owns on every Service of the cluster.
pub async fn clear_all(client: kube::Client) -> Result<Cleared, kube::Error> {
    let all: Api<Service> = Api::all(client.clone());
    let mut done = Cleared::default();
    // Paced as the leader's writes are: each is sent to every node's Service watchers.
    let pace = RateLimiter::new(REQUESTS_PER_SECOND, BURST);
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = all.list(&params).await?;
        for svc in page.items.iter().filter(|s| owns_status(s)) {
            let (Some(ns), Some(name)) = (&svc.metadata.namespace, &svc.metadata.name) else {
                continue;
            };
            let api: Api<Service> = Api::namespaced(client.clone(), ns);
            let body = ingress::status_body(name, ns, serde_json::json!({}));
            let id = format!("{ns}/{name}");
            pace.wait().await;
            match api
                .patch_status(
                    name,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Apply(body),
                )
                .await
            {
                Ok(_) => done.cleared.push(id),
                Err(e) => done.failed.push((id, e.to_string())),
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(done),
        }
    }
}

/// Waits until the Lease `nodelb-status` in `namespace` has not changed (same
/// resourceVersion) for its lease duration plus a poll, on this process's monotonic clock (no
/// agent renews or takes it: none is left to write status), or is absent; at most `wait`.
pub async fn wait_for_quiet_lease(
    client: &kube::Client,
    namespace: &str,
    wait: Duration,
) -> anyhow::Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + wait;
    let mut last: Option<(Option<String>, Instant)> = None;
    loop {
        let Some(lease) = api.get_opt(STATUS_LEASE).await? else {
            return Ok(());
        };
        let version = lease.metadata.resource_version.clone();
        let quiet_for = lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .map_or(Duration::from_secs(15), |s| {
                Duration::from_secs(s.max(1) as u64)
            })
            + POLL;
        let now = Instant::now();
        match &last {
            Some((v, since)) if *v == version => {
                if now.duration_since(*since) >= quiet_for {
                    return Ok(());
                }
            }
            _ => {
                if last.is_some() {
                    println!("the Lease {namespace}/{STATUS_LEASE} changed: an agent still runs; waiting");
                }
                last = Some((version, now));
            }
        }
        if now >= deadline {
            anyhow::bail!(
                "the Lease {namespace}/{STATUS_LEASE} still changes after {wait:?}: an agent still runs; stop the agents first (manifests/cleanup/ schedules their DaemonSet on no node)"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Deletes the agent DaemonSet `name` (its pods go with it, in the background), so every
/// agent stops; the leader releases its Lease on SIGTERM. A DaemonSet already gone (an
/// uninstall run again) is no error. Deleting needs less than changing it: a right to patch the
/// privileged DaemonSet would be a right to run anything on every node.
pub async fn stop_agents(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let params = kube::api::DeleteParams::background();
    match api.delete(name, &params).await {
        Ok(_) => println!("DaemonSet {namespace}/{name} deleted: its agents stop"),
        Err(kube::Error::Api(e)) if e.code == 404 => {
            println!("DaemonSet {namespace}/{name} is gone already: no agent of it runs")
        }
        Err(e) => {
            anyhow::bail!("cannot stop the agents: deleting DaemonSet {namespace}/{name}: {e}")
        }
    }
    Ok(())
}

/// Waits until the DaemonSet `name` has observed its latest spec and every pod it schedules is
/// updated and ready; at most `wait`.
pub async fn wait_for_daemonset_ready(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    wait: Duration,
) -> anyhow::Result<()> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + wait;
    loop {
        let ds = api.get(name).await?;
        let status = ds.status.unwrap_or_default();
        let observed = status.observed_generation >= ds.metadata.generation;
        let want = status.desired_number_scheduled;
        let ready = status.number_ready;
        if observed && ready == want && status.updated_number_scheduled == Some(want) {
            println!("DaemonSet {namespace}/{name}: {ready} of {want} pods ready");
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!(
                "DaemonSet {namespace}/{name}: {ready} of {want} pods ready after {wait:?}; see `kubectl -n {namespace} describe ds/{name}` and its pods' logs"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}
