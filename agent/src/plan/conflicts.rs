//! Port conflicts on this node: two Services served here on the same (family, protocol, port).
//! The oldest (creationTimestamp, then namespace/name) wins; the other gets no rules for it.

use super::endpoints::Selection;
use super::service::{ServiceKey, ServicePortId};
use super::IpFamily;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// A Service port that would be programmed on this node for one family.
#[derive(Clone, Debug)]
pub struct Wanted<'a> {
    pub service: &'a ServiceKey,
    pub created: Option<&'a Time>,
    pub family: IpFamily,
    pub port: &'a ServicePortId,
    pub addresses: &'a [IpAddr],
    pub selection: Selection,
}

/// A `Wanted` with the decision: `winner` is `None` when it keeps the port, else the Service
/// that holds it.
#[derive(Clone, Debug)]
pub struct Decided<'a> {
    pub wanted: Wanted<'a>,
    pub winner: Option<ServiceKey>,
}

/// Age order: older first; a Service without a creationTimestamp (only in files) counts as
/// newest; ties by namespace/name.
fn age_key<'a>(w: &Wanted<'a>) -> (bool, Option<&'a Time>, &'a ServiceKey) {
    (w.created.is_none(), w.created, w.service)
}

/// Decide every conflict. Order of the result follows the input.
pub fn decide(wanted: Vec<Wanted<'_>>) -> Vec<Decided<'_>> {
    let mut holder: BTreeMap<(IpFamily, super::service::Protocol, u16), usize> = BTreeMap::new();
    for (i, w) in wanted.iter().enumerate() {
        let slot = (w.family, w.port.protocol, w.port.port);
        match holder.get(&slot) {
            Some(&j) if age_key(&wanted[j]) <= age_key(w) => {}
            _ => {
                holder.insert(slot, i);
            }
        }
    }
    let winners: Vec<Option<ServiceKey>> = wanted
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let j = holder[&(w.family, w.port.protocol, w.port.port)];
            (j != i).then(|| wanted[j].service.clone())
        })
        .collect();
    wanted
        .into_iter()
        .zip(winners)
        .map(|(wanted, winner)| Decided { wanted, winner })
        .collect()
}
