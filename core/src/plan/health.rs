//! kube-proxy's health check of `externalTrafficPolicy: Local` Services, as nodelb answers it
//! (`--health-check-node-ports`): on each such Service's `spec.healthCheckNodePort`, how many
//! endpoints this node really serves it with. An outer load balancer that asks sends clients
//! only to nodes that answer 200. Pure: from the planner's outcomes.

use super::diagnosis::{FamilyState, PortResult, ServiceOutcome};
use super::service;
use crate::objects::index::Service;
use crate::vocab::ServiceKey;
use std::collections::BTreeMap;

/// One Service's health check on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    pub service: ServiceKey,
    /// How many ready endpoints this node forwards its new connections to (kube-proxy's
    /// `localEndpoints`): 0 when nodelb does not serve it here at all (a node selector, a
    /// reserved port, a port another Service or a host process holds), serves it without a
    /// local endpoint, or only with terminating ones standing in (as kube-proxy counts ready
    /// local endpoints only: the outer load balancer drains the node while it still forwards).
    pub local_endpoints: usize,
}

impl HealthCheck {
    /// Healthy: it forwards to a local endpoint, and the agent's last sync committed.
    pub fn healthy(&self, agent_healthy: bool) -> bool {
        self.local_endpoints > 0 && agent_healthy
    }

    /// kube-proxy's body, field for field.
    pub fn body(&self, agent_healthy: bool) -> String {
        format!(
            "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}",
            self.service.namespace, self.service.name, self.local_endpoints, agent_healthy
        )
    }
}

/// The health checks to answer, by port: every `Local` Service nodelb handles that has a
/// `healthCheckNodePort`, with what its outcome here says. Two Services never share one
/// (the API server allocates it); should they, the older entry (by key) stays.
pub fn health_checks<'a>(
    services: impl IntoIterator<Item = (&'a ServiceKey, &'a Service)>,
    outcome: impl Fn(&ServiceKey) -> Option<&'a ServiceOutcome>,
    config: &super::config::Config,
) -> BTreeMap<u16, HealthCheck> {
    let mut out = BTreeMap::new();
    for (key, svc) in services {
        let spec = svc.spec.as_ref();
        let local = spec.and_then(|s| s.external_traffic_policy.as_deref()) == Some("Local");
        if !service::is_handled(svc, config) || !local {
            continue;
        }
        let Some(port) = spec
            .and_then(|s| s.health_check_node_port)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0)
        else {
            continue;
        };
        let local_endpoints = outcome(key).map(local_endpoints).unwrap_or(0);
        out.entry(port).or_insert(HealthCheck {
            service: key.clone(),
            local_endpoints,
        });
    }
    out
}

/// The ready endpoints a served `Local` Service forwards to here: the most any of its ports
/// has (every port of a Service has the same local endpoints but for their target ports); 0
/// when it is not served here, drops, or forwards to terminating endpoints only.
fn local_endpoints(outcome: &ServiceOutcome) -> usize {
    let ServiceOutcome::Served { families } = outcome else {
        return 0;
    };
    families
        .iter()
        .filter_map(|f| match &f.state {
            FamilyState::Served { ports, .. } => Some(ports),
            FamilyState::Skipped(_) => None,
        })
        .flatten()
        .map(|p| match p.result {
            PortResult::Forwards {
                endpoints,
                terminating: false,
                ..
            } => endpoints,
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::Svc;
    use crate::plan::config::Config;
    use crate::plan::diagnosis::{FamilyOutcome, NotServed, PortOutcome};
    use crate::plan::topology::Topology;
    use crate::vocab::{IpFamily, Protocol, ServicePortId};

    /// LoadBalancer Service `default/<name>` with `externalTrafficPolicy: policy` and, if
    /// given, `healthCheckNodePort`.
    fn lb(name: &str, policy: &str, health_port: Option<i32>) -> (ServiceKey, Service) {
        let svc = Svc::lb("default", name).spec("externalTrafficPolicy", policy);
        let svc = match health_port {
            Some(port) => svc.spec("healthCheckNodePort", port),
            None => svc,
        };
        (ServiceKey::new("default", name), svc.index())
    }

    fn served(results: &[PortResult]) -> ServiceOutcome {
        let ports = results
            .iter()
            .enumerate()
            .map(|(i, r)| PortOutcome {
                port: ServicePortId {
                    name: None,
                    protocol: Protocol::Tcp,
                    port: 80 + i as u16,
                },
                result: r.clone(),
            })
            .collect();
        ServiceOutcome::Served {
            families: vec![FamilyOutcome {
                family: IpFamily::V4,
                state: FamilyState::Served {
                    addresses: vec!["192.0.2.11".parse().unwrap()],
                    ports,
                },
            }],
        }
    }

    fn forwards(endpoints: usize, terminating: bool) -> PortResult {
        PortResult::Forwards {
            endpoints,
            terminating,
            topology: Topology::None,
        }
    }

    fn checks(
        services: &[(ServiceKey, Service)],
        outcomes: &BTreeMap<ServiceKey, ServiceOutcome>,
    ) -> BTreeMap<u16, HealthCheck> {
        let config = Config {
            default_class: true,
            ..Config::default()
        };
        health_checks(
            services.iter().map(|(k, s)| (k, s)),
            |k| outcomes.get(k),
            &config,
        )
    }

    #[test]
    fn a_local_service_served_here_counts_its_ready_local_endpoints() {
        let services = [lb("web", "Local", Some(31000))];
        let outcomes = [(services[0].0.clone(), served(&[forwards(2, false)]))].into();
        let c = checks(&services, &outcomes);
        let hc = &c[&31000];
        assert_eq!(hc.local_endpoints, 2);
        assert!(hc.healthy(true));
        assert!(
            !hc.healthy(false),
            "a node whose last sync failed is not healthy"
        );
    }

    #[test]
    fn a_node_that_does_not_forward_a_local_service_answers_zero() {
        let services = [
            lb("dropping", "Local", Some(31001)),
            lb("held", "Local", Some(31002)),
            lb("elsewhere", "Local", Some(31003)),
            lb("terminating", "Local", Some(31004)),
            lb("unplanned", "Local", Some(31005)),
        ];
        let holder = ServiceKey::new("default", "older");
        let outcomes = [
            (
                services[0].0.clone(),
                served(&[PortResult::DropsNoLocalEndpoint { elsewhere: 3 }]),
            ),
            (
                services[1].0.clone(),
                served(&[PortResult::Conflict { holder }]),
            ),
            (
                services[2].0.clone(),
                ServiceOutcome::NotServed(NotServed::ExcludedByLabel),
            ),
            (services[3].0.clone(), served(&[forwards(1, true)])),
        ]
        .into();
        let c = checks(&services, &outcomes);
        for port in 31001..=31005 {
            assert_eq!(c[&port].local_endpoints, 0, "port {port}");
            assert!(!c[&port].healthy(true), "port {port}");
        }
    }

    #[test]
    fn a_service_with_one_port_held_still_counts_the_ports_it_forwards() {
        let services = [lb("web", "Local", Some(31000))];
        let holder = ServiceKey::new("default", "older");
        let outcomes = [(
            services[0].0.clone(),
            served(&[PortResult::Conflict { holder }, forwards(3, false)]),
        )]
        .into();
        assert_eq!(checks(&services, &outcomes)[&31000].local_endpoints, 3);
    }

    #[test]
    fn only_local_services_with_a_health_check_port_get_one() {
        let services = [
            lb("cluster", "Cluster", Some(31000)),
            lb("no-port", "Local", None),
            lb("bad-port", "Local", Some(70000)),
            lb("zero", "Local", Some(0)),
        ];
        let outcomes = services
            .iter()
            .map(|(k, _)| (k.clone(), served(&[forwards(1, false)])))
            .collect();
        assert!(checks(&services, &outcomes).is_empty());
    }

    #[test]
    fn the_body_is_kube_proxys() {
        let hc = HealthCheck {
            service: ServiceKey::new("shop", "web"),
            local_endpoints: 2,
        };
        assert_eq!(
            hc.body(true),
            "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
    }
}
