//! The one set of test builders: objects as the API shows them, for the core's own tests and,
//! with the `test-fixtures` feature, for the agent's and the integration tests'.

use serde_json::json;

/// A Service as `kubectl get -o json` shows it after `kubectl apply`, a cloud controller's
/// condition, and two load balancers' status writes.
pub fn service_json() -> serde_json::Value {
    let fields = |f: serde_json::Value| {
        json!({"fieldsType": "FieldsV1", "fieldsV1": f,
                                                "apiVersion": "v1", "time": "2026-01-01T00:00:00Z"})
    };
    let mut kubectl = fields(json!({"f:metadata": {"f:annotations": {".": {},
        "f:kubectl.kubernetes.io/last-applied-configuration": {}, "f:nodelb.io/node-selector": {}},
        "f:labels": {".": {}, "f:app": {}}},
        "f:spec": {"f:ports": {".": {}, "k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:name": {},
        "f:port": {}, "f:protocol": {}, "f:targetPort": {}}}, "f:selector": {}, "f:type": {}}}));
    kubectl["manager"] = json!("kubectl-client-side-apply");
    kubectl["operation"] = json!("Update");
    let mut conditions = fields(json!({"f:status": {"f:conditions": {".": {}}}}));
    conditions["manager"] = json!("cloud-controller");
    conditions["operation"] = json!("Update");
    conditions["subresource"] = json!("status");
    let mut ours = fields(json!({"f:status": {"f:loadBalancer": {"f:ingress": {}}}}));
    ours["manager"] = json!("nodelb");
    ours["operation"] = json!("Apply");
    ours["subresource"] = json!("status");
    let mut theirs = fields(
        json!({"f:status": {"f:loadBalancer": {"f:ingress": {".": {},
        "k:{\"ip\":\"192.0.2.1\"}": {".": {}, "f:ip": {}, "f:ipMode": {}}}}}}),
    );
    theirs["manager"] = json!("metallb-controller");
    theirs["operation"] = json!("Update");
    theirs["subresource"] = json!("status");
    // Owns the load balancer status but not its ingress.
    let mut near = fields(json!({"f:status": {"f:loadBalancer": {".": {}}}}));
    near["manager"] = json!("near-miss");
    near["operation"] = json!("Update");
    near["subresource"] = json!("status");
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": "6c1f8d3e-0000-4000-8000-000000000001",
            "resourceVersion": "4711",
            "generation": 3,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "web"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration":
                    "{\"apiVersion\":\"v1\",\"kind\":\"Service\",\"metadata\":{}}",
                "meta.helm.sh/release-name": "shop",
                "nodelb.io/node-selector": "pool=edge",
            },
            "finalizers": ["service.kubernetes.io/load-balancer-cleanup"],
            "managedFields": [kubectl, conditions, ours, theirs, near],
        },
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": "nodelb.io/lb",
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10", "fd00::10"],
            "ipFamilies": ["IPv4", "IPv6"],
            "ipFamilyPolicy": "PreferDualStack",
            "externalTrafficPolicy": "Local",
            "healthCheckNodePort": 31000,
            "internalTrafficPolicy": "Cluster",
            "loadBalancerSourceRanges": ["192.0.2.0/24", "not-a-cidr"],
            "allocateLoadBalancerNodePorts": true,
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
            "trafficDistribution": "PreferClose",
            "selector": {"app": "web"},
            "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080,
                 "nodePort": 30080, "appProtocol": "http"},
                {"name": "odd", "port": 81, "protocol": "ICMP", "targetPort": "metrics"},
            ],
        },
        "status": {
            "conditions": [{"type": "LoadBalancerReady", "status": "True", "reason": "Ok",
                            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ipMode": "VIP"}]},
        },
    })
}

/// A five-endpoint slice as the EndpointSlice controller writes it.
pub fn slice_json() -> serde_json::Value {
    let endpoints: Vec<_> = (1..=5)
        .map(|i| {
            json!({
                "addresses": [format!("198.51.100.{i}")],
                "conditions": {"ready": i != 5, "serving": true, "terminating": i == 5},
                "nodeName": format!("node-{i}"),
                "hostname": format!("web-{i}"),
                "zone": "zone-a",
                "hints": {"forZones": [{"name": "zone-a"}], "forNodes": [{"name": format!("node-{i}")}]},
                "deprecatedTopology": {"topology.kubernetes.io/zone": "zone-a"},
                "targetRef": {"kind": "Pod", "namespace": "shop", "name": format!("web-{i}"),
                              "uid": format!("6c1f8d3e-0000-4000-8000-00000000010{i}")},
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "web-x7k2p",
            "generateName": "web-",
            "namespace": "shop",
            "uid": "6c1f8d3e-0000-4000-8000-000000000002",
            "resourceVersion": "4712",
            "generation": 9,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "web", "kubernetes.io/service-name": "web",
                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web",
                                 "uid": "6c1f8d3e-0000-4000-8000-000000000001",
                                 "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "apiVersion": "discovery.k8s.io/v1", "time": "2026-01-01T00:00:00Z",
                               "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:addressType": {}, "f:endpoints": {}, "f:ports": {}}}],
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"}],
        "endpoints": endpoints,
    })
}
