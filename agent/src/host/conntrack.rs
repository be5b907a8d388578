//! The node's conntrack table: deleting the entries the planner found stale
//! ([`StaleFlows`]), through `nodelb_netfilter::conntrack`. Only entries whose original
//! destination is a served address and port of one of nodelb's UDP or SCTP Service ports are
//! ever picked; the table is never flushed.

use nodelb_core::plan::flows::StaleFlows;
use nodelb_core::vocab::{IpFamily, Protocol};
use nodelb_netfilter::conntrack::{Conntrack, Error, Replies, Selector};
use nodelb_netfilter::{Family, L4Proto};
use std::net::SocketAddr;
use std::time::Duration;

/// What the kernel is asked to delete for each stale flow.
pub fn selectors(stale: &[StaleFlows]) -> Vec<Selector> {
    stale
        .iter()
        .map(|s| match s {
            StaleFlows::Left { port, endpoint } => Selector {
                protocol: port.protocol.l4(),
                destination: SocketAddr::new(port.address, port.port),
                replies: Replies::From(SocketAddr::new(endpoint.addr, endpoint.port)),
            },
            StaleFlows::Opened { port, endpoints } => Selector {
                protocol: port.protocol.l4(),
                destination: SocketAddr::new(port.address, port.port),
                replies: Replies::NoneOf(
                    endpoints
                        .iter()
                        .map(|e| SocketAddr::new(e.addr, e.port))
                        .collect(),
                ),
            },
        })
        .collect()
}

/// What one cleanup did in one family and protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cleaned {
    pub family: IpFamily,
    pub protocol: Protocol,
    /// Entries of the family and protocol read.
    pub dumped: usize,
    pub deleted: usize,
    pub took: Duration,
}

/// Delete the entries of `stale`: one dump per family and protocol, one delete per entry.
pub fn delete_stale(ct: &mut Conntrack, stale: &[StaleFlows]) -> Result<Vec<Cleaned>, Error> {
    let done = ct.delete_selected(&selectors(stale))?;
    Ok(done
        .into_iter()
        .filter_map(|((family, l4), d)| {
            Some(Cleaned {
                family: match family {
                    Family::Ip => IpFamily::V4,
                    Family::Ip6 => IpFamily::V6,
                    Family::Inet => return None,
                },
                protocol: match l4 {
                    L4Proto::Udp => Protocol::Udp,
                    L4Proto::Sctp => Protocol::Sctp,
                    L4Proto::Tcp => Protocol::Tcp,
                    L4Proto::Icmp | L4Proto::Icmpv6 => return None,
                },
                dumped: d.dumped,
                deleted: d.deleted,
                took: d.dump_time + d.delete_time,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodelb_core::plan::endpoints::EndpointAddr;
    use nodelb_core::plan::flows::ServedPort;

    #[test]
    fn a_stale_flow_names_its_served_address_port_and_endpoint() {
        let port = ServedPort {
            protocol: Protocol::Udp,
            address: "203.0.113.1".parse().unwrap(),
            port: 53,
        };
        let ep = |h: u8| EndpointAddr {
            addr: std::net::IpAddr::from([198, 51, 100, h]),
            port: 8053,
        };
        let s = selectors(&[
            StaleFlows::Left {
                port,
                endpoint: ep(2),
            },
            StaleFlows::Opened {
                port,
                endpoints: vec![ep(3)],
            },
        ]);
        assert_eq!(
            s,
            vec![
                Selector {
                    protocol: L4Proto::Udp,
                    destination: "203.0.113.1:53".parse().unwrap(),
                    replies: Replies::From("198.51.100.2:8053".parse().unwrap()),
                },
                Selector {
                    protocol: L4Proto::Udp,
                    destination: "203.0.113.1:53".parse().unwrap(),
                    replies: Replies::NoneOf(vec!["198.51.100.3:8053".parse().unwrap()]),
                },
            ]
        );
    }
}
