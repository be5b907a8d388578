//! The reviewed list of every API request `nodelb-agent` can make, as RBAC sees it: what
//! `manifests/base/rbac.yaml` must grant, no more and no less
//! (`integration/tests/manifests.rs` checks the manifests against it; the e2e tests check that
//! every request of the agent in kube-apiserver's audit log is on it).
//!
//! Adding a request to the agent means adding a row here, with the code that makes it, and the
//! rule to the manifests: a reviewer sees the new privilege in one place.

/// Where a grant applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Every namespace, or a cluster-scoped resource: a `ClusterRole` rule.
    Cluster,
    /// Only the agent's own namespace (`$POD_NAMESPACE`, `nodelb-system`): a `Role` rule there.
    AgentNamespace,
    /// Only `kube-node-lease`, the kubelets' node Leases: a `Role` rule there.
    KubeletLeases,
}

/// The namespace of [`Scope::KubeletLeases`].
pub const KUBELET_LEASE_NAMESPACE: &str = "kube-node-lease";

/// One kind of request: an RBAC verb on a resource of an API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AgentRequest {
    /// RBAC verb as kube-apiserver's audit log spells it: `get`, `list`, `watch`, `create`,
    /// `update`, `patch`, `delete`.
    pub verb: &'static str,
    /// API group; `""` is the core group.
    pub group: &'static str,
    /// Resource, or `resource/subresource`.
    pub resource: &'static str,
    pub scope: Scope,
    /// The agent code that makes the request (and whether it has landed yet).
    pub made_by: &'static str,
}

impl AgentRequest {
    /// Whether this row covers a request, given the namespace it went to (`""` for a
    /// cluster-scoped or all-namespaces request) and the agent's namespace.
    pub fn covers(
        &self,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: &str,
        agent_namespace: &str,
    ) -> bool {
        self.verb == verb
            && self.group == group
            && self.resource == resource
            && match self.scope {
                Scope::Cluster => true,
                Scope::AgentNamespace => namespace == agent_namespace,
                Scope::KubeletLeases => namespace == KUBELET_LEASE_NAMESPACE,
            }
    }
}

const fn req(
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    scope: Scope,
    made_by: &'static str,
) -> AgentRequest {
    AgentRequest {
        verb,
        group,
        resource,
        scope,
        made_by,
    }
}

use Scope::{AgentNamespace, Cluster, KubeletLeases};

const WATCH_SERVICES: &str =
    "agent/src/kube/watches.rs: Caches::start, watcher over Api::<Service>::all \
     (every agent; the status leader reads the same objects)";
const WATCH_SLICES: &str =
    "agent/src/kube/watches.rs: Caches::start, watcher over Api::<EndpointSlice>::all";
const WATCH_NODES: &str =
    "agent/src/kube/watches.rs: Caches::start, reflector over Api::<Node>::all with \
     field selector metadata.name=<node>; the status leader watches all Nodes \
     (agent/src/kube/status_writer.rs); with --servicelb-compat, watch_enablelb watches the \
     metadata of the Nodes labelled svccontroller.k3s.cattle.io/enablelb (label selector)";
const EVENTS_CREATE: &str = "agent/src/kube/events.rs: new_event, created by \
     NodeEvents::update (Node Events, namespace default) and by the status writer's publish \
     (Service Events from the status leader); each Event is created once, never patched";
const STATUS_APPLY: &str = "agent/src/kube/status_writer.rs: server-side apply of \
     services/status under field manager nodelb";
const LEASES: &str = "agent/src/kube/heartbeat.rs: heartbeat Leases nodelb-node-<node> (get, \
     create, update to write or renew; the leader lists and watches them all); \
     agent/src/kube/election.rs: every agent lists and watches the Lease nodelb-status (field \
     selector metadata.name) and creates or updates it to lead";

const PODS: &str = "agent/src/kube/heartbeat.rs: runs_in_pod gets the agent's own Pod at \
     start (every 2 s until a kubelet runs it, at most 30 s); the status leader lists and \
     watches the Pods of its namespace for their Ready condition \
     (agent/src/kube/status_writer.rs)";
const KUBELET_LEASES: &str = "agent/src/kube/status_writer.rs: the status leader lists and \
     watches the kubelets' node Leases in kube-node-lease (node liveness, read only)";

const SCRAPE_REVIEWS: &str = "agent/src/run/scrape_auth.rs: review, for a scrape of /metrics \
     off loopback: a TokenReview of the bearer token, then a SubjectAccessReview of get on \
     /metrics for its user (each verdict kept 60 s, unknown tokens at most 5 a second)";

static EXPECTATIONS: [AgentRequest; 21] = [
    req("get", "", "pods", AgentNamespace, PODS),
    req("list", "", "pods", AgentNamespace, PODS),
    req("watch", "", "pods", AgentNamespace, PODS),
    req(
        "list",
        "coordination.k8s.io",
        "leases",
        KubeletLeases,
        KUBELET_LEASES,
    ),
    req(
        "watch",
        "coordination.k8s.io",
        "leases",
        KubeletLeases,
        KUBELET_LEASES,
    ),
    req("list", "", "services", Cluster, WATCH_SERVICES),
    req("watch", "", "services", Cluster, WATCH_SERVICES),
    req("patch", "", "services/status", Cluster, STATUS_APPLY),
    req(
        "list",
        "discovery.k8s.io",
        "endpointslices",
        Cluster,
        WATCH_SLICES,
    ),
    req(
        "watch",
        "discovery.k8s.io",
        "endpointslices",
        Cluster,
        WATCH_SLICES,
    ),
    req("list", "", "nodes", Cluster, WATCH_NODES),
    req("watch", "", "nodes", Cluster, WATCH_NODES),
    req("create", "events.k8s.io", "events", Cluster, EVENTS_CREATE),
    req(
        "get",
        "coordination.k8s.io",
        "leases",
        AgentNamespace,
        LEASES,
    ),
    req(
        "list",
        "coordination.k8s.io",
        "leases",
        AgentNamespace,
        LEASES,
    ),
    req(
        "watch",
        "coordination.k8s.io",
        "leases",
        AgentNamespace,
        LEASES,
    ),
    req(
        "create",
        "coordination.k8s.io",
        "leases",
        AgentNamespace,
        LEASES,
    ),
    req(
        "update",
        "coordination.k8s.io",
        "leases",
        AgentNamespace,
        LEASES,
    ),
    req(
        "patch",
        "coordination.k8s.io",
        "leases",
        AgentNamespace,
        LEASES,
    ),
    req(
        "create",
        "authentication.k8s.io",
        "tokenreviews",
        Cluster,
        SCRAPE_REVIEWS,
    ),
    req(
        "create",
        "authorization.k8s.io",
        "subjectaccessreviews",
        Cluster,
        SCRAPE_REVIEWS,
    ),
];

/// Every request the agent can make, reviewed: the RBAC in `manifests/` grants exactly these.
pub fn rbac_expectations() -> Vec<AgentRequest> {
    EXPECTATIONS.to_vec()
}

/// Whether some row of [`rbac_expectations`] covers a request (see [`AgentRequest::covers`]).
pub fn is_expected(
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &str,
    agent_namespace: &str,
) -> bool {
    rbac_expectations()
        .iter()
        .any(|r| r.covers(verb, group, resource, namespace, agent_namespace))
}
