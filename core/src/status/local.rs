//! The endpoints of `externalTrafficPolicy: Local` Services by node: the one thing that tells
//! apart the nodes of a class (see [`super::classes`]). For each such Service and each of its
//! (family, port), what a node running some of its endpoints gets there, and what every other
//! node gets: the planner's own endpoint selection (`endpoints::select`), made for those few
//! nodes only.

use crate::objects::index::{EndpointSlice, Service};
use crate::plan::diagnosis::PortResult;
use crate::plan::endpoints::{self, Candidates};
use crate::plan::service::{self, TrafficPolicy};
use crate::plan::settled::port_action;
use crate::plan::topology::Place;
use crate::plan::Objects;
use crate::vocab::{IpFamily, Protocol, ServiceKey, ServicePortId, Str};
use std::collections::{BTreeMap, BTreeSet};

/// A Service port in one family.
pub type PortKey = (IpFamily, Protocol, u16);

/// One `Local` Service's ports as each node sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalEndpoints {
    /// Every (family, port) of the Service.
    ports: Vec<PortKey>,
    /// What a node running none of its endpoints gets, port by port (in `ports` order).
    elsewhere: Vec<PortResult>,
    /// The nodes running some of its endpoints (ready or terminating), and what each gets.
    on: BTreeMap<Str, Vec<PortResult>>,
}

impl LocalEndpoints {
    /// `None` unless the Service's policy is `Local`. Problems found on the way are not
    /// reported here: the planners find the same ones.
    pub fn of(key: &ServiceKey, svc: &Service, slices: &[&EndpointSlice]) -> Option<Self> {
        let mut ignored = Vec::new();
        let lb = service::read(svc, key.clone(), &mut ignored);
        if lb.policy != TrafficPolicy::Local {
            return None;
        }
        let mut ports: Vec<(&ServicePortId, IpFamily, Candidates)> = Vec::new();
        let mut on: BTreeMap<Str, Vec<PortResult>> = BTreeMap::new();
        for family in &lb.families {
            for port in &lb.ports {
                let c = endpoints::candidates(slices, port, *family, &mut ignored);
                for node in c.serving_nodes() {
                    on.entry(node.into()).or_default();
                }
                ports.push((port, *family, c));
            }
        }
        // `Local` policy: no topology, so no zone.
        let result = |port: &ServicePortId, c: &Candidates, node: Option<&str>| {
            let here = node.map(|node| Place { node, zone: None });
            let selection = endpoints::select(c, lb.policy, here, None, key, port, &mut Vec::new());
            port_action(&selection).0
        };
        let mut elsewhere = Vec::with_capacity(ports.len());
        for (port, _, c) in &ports {
            elsewhere.push(result(port, c, None));
            for (node, results) in on.iter_mut() {
                results.push(result(port, c, Some(node)));
            }
        }
        Some(LocalEndpoints {
            ports: ports
                .iter()
                .map(|(p, f, _)| (*f, p.protocol, p.port))
                .collect(),
            elsewhere,
            on,
        })
    }

    /// The nodes running some of its endpoints.
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.on.keys().map(|n| n.as_str())
    }

    /// What `node` (`None`: a node running none of its endpoints) gets for one port; `None`
    /// when that is not one of its ports.
    pub fn result(&self, node: Option<&str>, port: PortKey) -> Option<&PortResult> {
        let i = self.ports.iter().position(|p| *p == port)?;
        let results = node.and_then(|n| self.on.get(n)).unwrap_or(&self.elsewhere);
        results.get(i)
    }
}

/// [`LocalEndpoints`] of every `Local` Service nodelb handles.
#[derive(Debug, Default)]
pub struct LocalIndex {
    services: BTreeMap<ServiceKey, LocalEndpoints>,
}

impl LocalIndex {
    /// Bring the index up to date with `objects`: the `dirty` Services, or (`None`) all.
    pub fn update(
        &mut self,
        objects: &Objects,
        dirty: Option<&BTreeSet<ServiceKey>>,
        handled: impl Fn(&Service) -> bool,
    ) {
        if dirty.is_none() {
            self.services.clear();
        }
        let keys = objects.keys_to_update(dirty);
        for key in keys {
            let entry = objects
                .service(&key)
                .filter(|svc| handled(svc))
                .and_then(|svc| LocalEndpoints::of(&key, svc, &objects.slices_of(&key)));
            match entry {
                Some(e) => self.services.insert(key, e),
                None => self.services.remove(&key),
            };
        }
    }

    pub fn get(&self, key: &ServiceKey) -> Option<&LocalEndpoints> {
        self.services.get(key)
    }
}
