//! The API double against a real kube-rs client and kube-runtime watcher:
//! what the agent depends on must behave as on kube-apiserver. No root
//! needed: every server listens on 127.0.0.1.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{
    Api, DeleteParams, ListParams, PartialObjectMeta, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, Config};
use nodelb_integration::apiserver::{kubeconfig, ApiServer, ApiServerConfig};
use serde_json::{json, Value};
use tokio::time::timeout;

const ADMIN: &str = "admin-token";
const AGENT: &str = "agent-token";
const AGENT_USER: &str = "system:serviceaccount:nodelb-system:nodelb";
/// Upper bound for anything a test waits on.
const WAIT: Duration = Duration::from_secs(10);

fn manifests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

fn config() -> ApiServerConfig {
    ApiServerConfig {
        rbac_dir: Some(manifests()),
        tokens: vec![
            (ADMIN.into(), "admin".into(), vec!["system:masters".into()]),
            (AGENT.into(), AGENT_USER.into(), vec![]),
        ],
        ..ApiServerConfig::default()
    }
}

/// A double serving on 127.0.0.1, with the `nodelb-system` namespace.
async fn start(cfg: ApiServerConfig) -> (ApiServer, SocketAddr) {
    let api = ApiServer::new(cfg).expect("double starts");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    api.spawn(listener);
    api.create(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "nodelb-system"}}))
        .unwrap();
    (api, addr)
}

/// A kube-rs client built the way the agent builds one: from a kubeconfig.
async fn client(addr: SocketAddr, token: &str) -> Client {
    let text = kubeconfig::render(&format!("http://{addr}"), token).unwrap();
    let kc = Kubeconfig::from_yaml(&text).unwrap();
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

fn service(name: &str, labels: Value) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .unwrap()
}

fn names<'a>(items: impl IntoIterator<Item = &'a Service>) -> Vec<String> {
    items
        .into_iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect()
}

/// The API error code and reason of a failed call.
fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_get_list_with_selectors_and_pagination() {
    let (_api, addr) = start(config()).await;
    let svcs: Api<Service> = Api::namespaced(client(addr, ADMIN).await, "default");
    let pp = PostParams::default();
    for (name, labels) in [
        ("e", json!({"app": "web", "tier": "a"})),
        ("b", json!({"app": "web", "tier": "b"})),
        ("d", json!({"app": "db", "tier": "a", "canary": "yes"})),
        ("a", json!({"app": "web"})),
        ("c", json!({"app": "db"})),
    ] {
        let created = svcs.create(&pp, &service(name, labels)).await.unwrap();
        assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
        assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    }
    let got = svcs.get("d").await.unwrap();
    assert_eq!(got.metadata.generation, Some(1));
    assert_eq!(api_error(svcs.get("zz").await), (404, "NotFound".into()));
    assert_eq!(
        api_error(svcs.create(&pp, &service("a", json!({}))).await),
        (409, "AlreadyExists".into())
    );

    let sel = |s: &str| ListParams::default().labels(s);
    let list = |lp: ListParams| {
        let svcs = svcs.clone();
        async move { names(&svcs.list(&lp).await.unwrap().items) }
    };
    assert_eq!(list(sel("app=web")).await, ["a", "b", "e"]);
    assert_eq!(list(sel("app!=web")).await, ["c", "d"]);
    assert_eq!(list(sel("tier in (a,b),app==web")).await, ["b", "e"]);
    assert_eq!(list(sel("tier notin (a)")).await, ["a", "b", "c"]);
    assert_eq!(list(sel("canary")).await, ["d"]);
    assert_eq!(list(sel("!tier")).await, ["a", "c"]);
    assert_eq!(
        list(ListParams::default().fields("metadata.name=c")).await,
        ["c"]
    );

    // limit=2 over 5 objects: three pages, one list resourceVersion.
    let mut lp = ListParams::default().limit(2);
    let mut pages = Vec::new();
    loop {
        let page = svcs.list(&lp).await.unwrap();
        pages.push((names(&page.items), page.metadata.resource_version.clone()));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    let all: Vec<String> = pages.iter().flat_map(|p| p.0.clone()).collect();
    assert_eq!(all, ["a", "b", "c", "d", "e"]);
    assert_eq!(pages.len(), 3);
    assert!(pages.iter().all(|p| p.1 == pages[0].1));

    // Metadata-only lists (kube-rs `list_metadata`, `metadata_watcher`).
    let meta = svcs.list_metadata(&sel("app=db")).await.unwrap();
    let meta_names: Vec<String> = meta
        .items
        .iter()
        .map(|m| m.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(meta_names, ["c", "d"]);
    assert_eq!(
        meta.items[1].metadata.labels.as_ref().unwrap()["canary"],
        "yes"
    );

    // Cluster-wide list sees the same objects.
    let everywhere: Api<Service> = Api::all(client(addr, ADMIN).await);
    assert_eq!(
        everywhere
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        5
    );
}

/// Collects watcher events until `done` says so.
async fn watch_until<S, F>(stream: &mut S, mut done: F) -> Vec<String>
where
    S: futures::Stream<Item = Result<watcher::Event<Service>, watcher::Error>> + Unpin,
    F: FnMut(&[String]) -> bool,
{
    let mut seen = Vec::new();
    timeout(WAIT, async {
        while let Some(ev) = stream.next().await {
            let label = |s: &Service| {
                let gen = s
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("gen").cloned())
                    .unwrap_or_default();
                format!("{}{}", s.metadata.name.clone().unwrap(), gen)
            };
            seen.push(match ev {
                Ok(watcher::Event::Init) => "Init".into(),
                Ok(watcher::Event::InitApply(s)) => format!("InitApply {}", label(&s)),
                Ok(watcher::Event::InitDone) => "InitDone".into(),
                Ok(watcher::Event::Apply(s)) => format!("Apply {}", label(&s)),
                Ok(watcher::Event::Delete(s)) => format!("Delete {}", label(&s)),
                Err(watcher::Error::WatchError(s)) => format!("WatchError {} {}", s.code, s.reason),
                Err(e) => format!("Err {e}"),
            });
            if done(&seen) {
                return;
            }
        }
        panic!("watcher stream ended: {seen:?}");
    })
    .await
    .unwrap_or_else(|_| panic!("timed out; saw {seen:?}"));
    seen
}

#[tokio::test]
async fn watcher_sees_create_modify_delete_in_order() {
    let (_api, addr) = start(config()).await;
    let c = client(addr, ADMIN).await;
    let svcs: Api<Service> = Api::namespaced(c.clone(), "default");
    svcs.create(&PostParams::default(), &service("old", json!({})))
        .await
        .unwrap();
    let mut stream = watcher(Api::<Service>::all(c.clone()), watcher::Config::default()).boxed();
    let init = watch_until(&mut stream, |s| s.last().is_some_and(|l| l == "InitDone")).await;
    assert_eq!(init, ["Init", "InitApply old", "InitDone"]);

    svcs.create(&PostParams::default(), &service("a", json!({"gen": "1"})))
        .await
        .unwrap();
    svcs.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"gen": "2"}}})),
    )
    .await
    .unwrap();
    svcs.delete("a", &DeleteParams::default()).await.unwrap();
    let events = watch_until(&mut stream, |s| s.len() == 3).await;
    assert_eq!(events, ["Apply a1", "Apply a2", "Delete a2"]);

    // The same through a metadata-only watcher.
    let meta_api: Api<PartialObjectMeta<Service>> = Api::namespaced(c.clone(), "default");
    let mut meta = watcher(meta_api, watcher::Config::default()).boxed();
    let first = timeout(WAIT, async {
        loop {
            if let Some(Ok(watcher::Event::InitApply(m))) = meta.next().await {
                return m;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("old"));
    assert_eq!(
        first.types.as_ref().map(|t| t.kind.as_str()),
        Some("PartialObjectMetadata")
    );
}

#[tokio::test]
async fn too_old_resource_version_gets_410_and_watcher_relists() {
    let (api, addr) = start(ApiServerConfig {
        history: 5,
        ..config()
    })
    .await;
    let c = client(addr, ADMIN).await;
    let leases: Api<Lease> = Api::namespaced(c.clone(), "default");
    let lease = |n: usize| -> Lease {
        serde_json::from_value(json!({"metadata": {"name": format!("l{n}")}, "spec": {}})).unwrap()
    };

    // A raw watch from resourceVersion 1, long compacted: one ERROR event.
    for n in 0..10 {
        leases
            .create(&PostParams::default(), &lease(n))
            .await
            .unwrap();
    }
    let mut raw = leases
        .watch(&WatchParams::default().timeout(5), "1")
        .await
        .unwrap()
        .boxed();
    match timeout(WAIT, raw.try_next()).await.unwrap().unwrap() {
        Some(WatchEvent::Error(e)) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }

    // A watcher whose watch ends (timeout 1 s) while the history moves on
    // past its resourceVersion must get 410 and relist.
    let svcs: Api<Service> = Api::namespaced(c.clone(), "default");
    let mut stream = watcher(
        svcs.clone(),
        watcher::Config::default().timeout(1).disable_bookmarks(),
    )
    .boxed();
    watch_until(&mut stream, |s| s.last().is_some_and(|l| l == "InitDone")).await;
    svcs.create(&PostParams::default(), &service("a", json!({})))
        .await
        .unwrap();
    watch_until(&mut stream, |s| s.last().is_some_and(|l| l == "Apply a")).await;
    // Ten lease writes evict a's event from the five-event history; the
    // watcher's next watch (from a's resourceVersion) is too old.
    for n in 10..20 {
        leases
            .create(&PostParams::default(), &lease(n))
            .await
            .unwrap();
    }
    let relisted = watch_until(&mut stream, |s| s.last().is_some_and(|l| l == "InitDone")).await;
    assert_eq!(
        relisted,
        ["WatchError 410 Expired", "Init", "InitApply a", "InitDone"]
    );
    let lists = api
        .audit()
        .iter()
        .filter(|r| r.verb == "list" && r.uri.starts_with("/api/v1/namespaces/default/services"))
        .count();
    assert!(lists >= 2, "watcher relisted ({lists} lists)");
}

#[tokio::test]
async fn stale_resource_version_put_conflicts() {
    let (_api, addr) = start(config()).await;
    let svcs: Api<Service> = Api::namespaced(client(addr, ADMIN).await, "default");
    let original = svcs
        .create(&PostParams::default(), &service("a", json!({})))
        .await
        .unwrap();
    let mut newer = original.clone();
    newer.metadata.labels = Some([("x".to_string(), "1".to_string())].into());
    let stored = svcs
        .replace("a", &PostParams::default(), &newer)
        .await
        .unwrap();
    assert_ne!(
        stored.metadata.resource_version,
        original.metadata.resource_version
    );
    let mut stale = original.clone();
    stale.metadata.labels = Some([("x".to_string(), "2".to_string())].into());
    assert_eq!(
        api_error(svcs.replace("a", &PostParams::default(), &stale).await),
        (409, "Conflict".into())
    );
    let now = svcs.get("a").await.unwrap();
    assert_eq!(now.metadata.labels.unwrap()["x"], "1");
}

#[tokio::test]
async fn status_subresource_is_isolated() {
    let (_api, addr) = start(config()).await;
    let svcs: Api<Service> = Api::namespaced(client(addr, ADMIN).await, "default");
    let mut created = service("a", json!({}));
    created.status =
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.99"}]}}))
            .unwrap();
    let created = svcs.create(&PostParams::default(), &created).await.unwrap();
    assert_eq!(
        serde_json::to_value(&created.status).unwrap(),
        json!({"loadBalancer": {}}),
        "create resets a Service's status"
    );

    // A status write changes only .status.
    let mut body = created.clone();
    body.status =
        serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}))
            .unwrap();
    body.spec.as_mut().unwrap().type_ = Some("NodePort".into());
    let after = svcs
        .replace_status("a", &PostParams::default(), &body)
        .await
        .unwrap();
    assert_eq!(
        after.spec.as_ref().unwrap().type_.as_deref(),
        Some("LoadBalancer")
    );
    let ingress = |s: &Service| {
        serde_json::to_value(&s.status.as_ref().unwrap().load_balancer).unwrap()["ingress"][0]["ip"]
            .clone()
    };
    assert_eq!(ingress(&after), "192.0.2.10");

    // A main-resource write ignores .status.
    let after2 = svcs
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"},
                "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.99"}]}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        after2.spec.as_ref().unwrap().type_.as_deref(),
        Some("ClusterIP")
    );
    assert_eq!(ingress(&after2), "192.0.2.10");

    // Nodes keep the status they are created with (the kubelet's way).
    let nodes: Api<Node> = Api::all(client(addr, ADMIN).await);
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"}]}}))
    .unwrap();
    let node = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(
        node.status.unwrap().addresses.unwrap()[0].address,
        "192.0.2.1"
    );
}

#[tokio::test]
async fn merge_strategic_and_json_patches() {
    let (_api, addr) = start(config()).await;
    let svcs: Api<Service> = Api::namespaced(client(addr, ADMIN).await, "default");
    svcs.create(
        &PostParams::default(),
        &service("a", json!({"keep": "1", "drop": "1"})),
    )
    .await
    .unwrap();
    let pp = PatchParams::default();
    let merged = svcs
        .patch(
            "a",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"drop": null, "new": "2"}}})),
        )
        .await
        .unwrap();
    let labels = merged.metadata.labels.clone().unwrap();
    assert_eq!(labels.keys().cloned().collect::<Vec<_>>(), ["keep", "new"]);

    let strategic = svcs
        .patch(
            "a",
            &pp,
            &Patch::Strategic(json!({"metadata": {"annotations": {"nodelb.io/x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(strategic.metadata.annotations.unwrap()["nodelb.io/x"], "y");

    let jp: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/keep", "value": "1"},
        {"op": "add", "path": "/spec/ports/-", "value": {"port": 443, "protocol": "TCP"}},
        {"op": "replace", "path": "/metadata/labels/keep", "value": "3"}
    ]))
    .unwrap();
    let patched = svcs.patch("a", &pp, &Patch::<()>::Json(jp)).await.unwrap();
    let ports: Vec<i32> = patched
        .spec
        .unwrap()
        .ports
        .unwrap()
        .iter()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [80, 443]);
    assert_eq!(patched.metadata.labels.unwrap()["keep"], "3");
    assert_eq!(
        patched.metadata.generation,
        Some(2),
        "spec change bumps generation"
    );

    let failing: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/keep", "value": "1"}
    ]))
    .unwrap();
    assert_eq!(
        api_error(svcs.patch("a", &pp, &Patch::<()>::Json(failing)).await).0,
        422
    );
    assert_eq!(
        api_error(
            svcs.patch("missing", &pp, &Patch::Merge(json!({"metadata": {}})))
                .await
        ),
        (404, "NotFound".into())
    );
}

#[tokio::test]
async fn apply_records_managed_fields() {
    let (_api, addr) = start(ApiServerConfig {
        drop_fields: vec!["status.loadBalancer.ingress[].ipMode".into()],
        version_minor: 29,
        ..config()
    })
    .await;
    let c = client(addr, ADMIN).await;
    assert_eq!(c.apiserver_version().await.unwrap().minor, "29");
    let svcs: Api<Service> = Api::namespaced(c, "default");

    // Apply creates a missing object.
    let created = svcs
        .patch(
            "a",
            &PatchParams::apply("tests"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "a"}, "spec": {"type": "LoadBalancer"}})),
        )
        .await
        .unwrap();
    let mf = created.metadata.managed_fields.unwrap();
    assert_eq!(mf[0].manager.as_deref(), Some("tests"));
    assert_eq!(mf[0].operation.as_deref(), Some("Apply"));

    let status = |ip: &str| {
        Patch::Apply(json!({"apiVersion": "v1", "kind": "Service",
            "status": {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "Proxy"}]}}}))
    };
    let applied = svcs
        .patch_status(
            "a",
            &PatchParams::apply("nodelb").force(),
            &status("192.0.2.1"),
        )
        .await
        .unwrap();
    let value = serde_json::to_value(&applied).unwrap();
    assert_eq!(
        value["status"]["loadBalancer"]["ingress"],
        json!([{"ip": "192.0.2.1"}]),
        "ipMode dropped as by a 1.29 server"
    );
    let entry = value["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "nodelb")
        .expect("nodelb entry")
        .clone();
    assert_eq!(entry["operation"], "Apply");
    assert_eq!(entry["subresource"], "status");
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:status": {"f:loadBalancer": {"f:ingress": {}}}})
    );

    // Another manager changing nodelb's field conflicts unless forced.
    let other = PatchParams::apply("intruder");
    assert_eq!(
        api_error(svcs.patch_status("a", &other, &status("192.0.2.2")).await),
        (409, "Conflict".into())
    );
    let forced = svcs
        .patch_status("a", &other.clone().force(), &status("192.0.2.2"))
        .await
        .unwrap();
    let managers: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap()
        .iter()
        .filter_map(|e| e.manager.clone())
        .collect();
    assert_eq!(managers, ["tests", "intruder"]);

    // Apply without a field manager is refused, as on kube-apiserver.
    let raw = svcs
        .patch("a", &PatchParams::default(), &status("192.0.2.3"))
        .await;
    assert_eq!(api_error(raw).0, 400);
}

#[tokio::test]
async fn rbac_from_manifests_limits_the_agent() {
    let (api, addr) = start(config()).await;
    let admin = client(addr, ADMIN).await;
    let agent = client(addr, AGENT).await;
    Api::<Service>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &service("a", json!({})))
        .await
        .unwrap();
    Api::<Node>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap(),
        )
        .await
        .unwrap();

    // Allowed: what the ClusterRole lists.
    let all_svcs: Api<Service> = Api::all(agent.clone());
    assert_eq!(
        all_svcs
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let svcs: Api<Service> = Api::namespaced(agent.clone(), "default");
    svcs.patch_status(
        "a",
        &PatchParams::apply("nodelb").force(),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "Service",
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}})),
    )
    .await
    .unwrap();
    Api::<EndpointSlice>::all(agent.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(agent.clone());
    // The agent's own Node: a list (then watch) by field selector, never a get.
    assert_eq!(
        nodes
            .list(&ListParams::default().fields("metadata.name=n1"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // Denied: everything else.
    assert_eq!(api_error(svcs.get("a").await), (403, "Forbidden".into()));
    assert_eq!(api_error(nodes.get("n1").await), (403, "Forbidden".into()));
    let current = Api::<Service>::namespaced(admin.clone(), "default")
        .get("a")
        .await
        .unwrap();
    assert_eq!(
        api_error(svcs.replace("a", &PostParams::default(), &current).await),
        (403, "Forbidden".into())
    );
    assert_eq!(
        api_error(nodes.delete("n1", &DeleteParams::default()).await),
        (403, "Forbidden".into())
    );

    // Leases only in nodelb-system.
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "nodelb-status"}, "spec": {}})).unwrap();
    Api::<Lease>::namespaced(agent.clone(), "nodelb-system")
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
    assert_eq!(
        api_error(
            Api::<Lease>::namespaced(agent.clone(), "default")
                .create(&PostParams::default(), &lease)
                .await
        ),
        (403, "Forbidden".into())
    );

    // No token, or an unknown one: 401.
    let stranger = client(addr, "who-knows").await;
    assert_eq!(
        api_error(
            Api::<Service>::all(stranger)
                .list(&ListParams::default())
                .await
        ),
        (401, "Unauthorized".into())
    );
    let denied = api
        .audit()
        .iter()
        .filter(|r| r.user == AGENT_USER && r.code == 403)
        .count();
    assert_eq!(
        denied, 5,
        "get svc, get node, update svc, delete node, create lease in default"
    );
}

#[tokio::test]
async fn audit_records_user_source_and_object() {
    let dir = std::env::temp_dir().join(format!("nodelb-api-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("audit.jsonl");
    let (api, addr) = start(ApiServerConfig {
        audit_file: Some(file.clone()),
        ..config()
    })
    .await;
    let agent = client(addr, AGENT).await;
    let leases: Api<Lease> = Api::namespaced(agent, "nodelb-system");
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "nodelb-node-n1"}, "spec": {}}))
            .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    leases.get("nodelb-node-n1").await.unwrap();
    let _ = leases
        .delete("nodelb-node-n1", &DeleteParams::default())
        .await;

    let records = api.audit();
    assert_eq!(records.len(), 3, "{records:#?}");
    let verbs: Vec<(&str, u16)> = records.iter().map(|r| (r.verb.as_str(), r.code)).collect();
    assert_eq!(verbs, [("create", 201), ("get", 200), ("delete", 403)]);
    for r in &records {
        assert_eq!(r.user, AGENT_USER);
        assert!(r.source.ip().is_loopback() && r.source.port() != 0);
        assert_ne!(
            r.source.port(),
            addr.port(),
            "client side of the connection"
        );
    }
    let created = records[0].object.as_ref().unwrap();
    assert_eq!(
        (
            created.resource.as_str(),
            created.namespace.as_str(),
            created.name.as_str()
        ),
        (
            "leases.coordination.k8s.io",
            "nodelb-system",
            "nodelb-node-n1"
        )
    );
    assert!(records[1].object.is_none(), "reads carry no object");
    assert_eq!(
        records[0].uri,
        "/apis/coordination.k8s.io/v1/namespaces/nodelb-system/leases?"
    );

    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[2]["code"], 403);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn watch_selectors_bookmarks_and_timeout() {
    let (_api, addr) = start(ApiServerConfig {
        bookmark_interval: Duration::from_millis(200),
        ..config()
    })
    .await;
    let svcs: Api<Service> = Api::namespaced(client(addr, ADMIN).await, "default");
    let start_rv = svcs
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let wp = WatchParams::default().labels("app=web").timeout(2); // bookmarks on by default
    let mut stream = svcs.watch(&wp, &start_rv).await.unwrap().boxed();
    let pp = PostParams::default();
    svcs.create(&pp, &service("a", json!({"app": "web"})))
        .await
        .unwrap();
    svcs.create(&pp, &service("b", json!({"app": "db"})))
        .await
        .unwrap();
    let relabel = |app: &str| Patch::Merge(json!({"metadata": {"labels": {"app": app}}}));
    svcs.patch("a", &PatchParams::default(), &relabel("db"))
        .await
        .unwrap();
    svcs.patch("b", &PatchParams::default(), &relabel("web"))
        .await
        .unwrap();

    let mut seen = Vec::new();
    let mut bookmarks = 0;
    let started = std::time::Instant::now();
    while let Some(ev) = timeout(WAIT, stream.try_next()).await.unwrap().unwrap() {
        match ev {
            WatchEvent::Added(s) => seen.push(format!("ADDED {}", s.metadata.name.unwrap())),
            WatchEvent::Modified(s) => seen.push(format!("MODIFIED {}", s.metadata.name.unwrap())),
            WatchEvent::Deleted(s) => seen.push(format!("DELETED {}", s.metadata.name.unwrap())),
            WatchEvent::Bookmark(b) => {
                assert!(b.metadata.resource_version.parse::<u64>().unwrap() > 0);
                bookmarks += 1;
            }
            WatchEvent::Error(e) => panic!("unexpected error event {e:?}"),
        }
    }
    let lasted = started.elapsed();
    assert_eq!(seen, ["ADDED a", "DELETED a", "ADDED b"]);
    assert!(bookmarks >= 2, "{bookmarks} bookmarks in {lasted:?}");
    assert!(
        lasted >= Duration::from_millis(1500) && lasted < Duration::from_secs(5),
        "timeoutSeconds=2 ended the stream after {lasted:?}"
    );
}

#[tokio::test]
async fn binary_serves_with_written_kubeconfig() {
    let dir = std::env::temp_dir().join(format!("nodelb-api-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig_path = dir.join("kubeconfig");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let server = format!("http://127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodelb-api-double"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--rbac-dir", manifests().to_str().unwrap()])
        .args(["--token", &format!("{AGENT}={AGENT_USER}")])
        .args(["--token", "adm=admin:system:masters"])
        .args(["--version-minor", "30"])
        .args(["--kubeconfig-out", kubeconfig_path.to_str().unwrap()])
        .args(["--kubeconfig-token", AGENT, "--kubeconfig-server", &server])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let text = timeout(WAIT, async {
        loop {
            if let Ok(t) = std::fs::read_to_string(&kubeconfig_path) {
                if !t.is_empty() {
                    return t;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("binary wrote its kubeconfig");
    let kc = Kubeconfig::from_yaml(&text).unwrap();
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    let c = Client::try_from(cfg).unwrap();
    assert_eq!(c.apiserver_version().await.unwrap().git_version, "v1.30.0");
    let svcs: Api<Service> = Api::all(c.clone());
    assert!(svcs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
    assert_eq!(
        api_error(
            Api::<Node>::all(c)
                .delete("n1", &DeleteParams::default())
                .await
        ),
        (403, "Forbidden".into())
    );
    child.kill().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
