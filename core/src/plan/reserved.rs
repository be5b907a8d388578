//! Reserved ports: the (protocol, port)s no Service may take on a node address, because the
//! node, its network or the agent itself uses them there. Many of them belong to kernel
//! sockets (VXLAN, Geneve, WireGuard) that no listener lookup would show, so they are refused
//! by this list, whatever listens.

use crate::vocab::Protocol;
use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

/// The default `--reserved-ports`, an entry a user of the ports (the README's table is checked
/// against it): the ports, in `--reserved-ports` syntax, and who uses them on a node address.
/// The agent's own health and metrics ports are added to it (see `cli`).
#[rustfmt::skip]
pub const DEFAULT_RESERVATIONS: &[(&str, &str)] = &[
    ("22/tcp", "SSH"),
    ("179/tcp", "BGP (Calico, MetalLB, kube-router, Cilium)"),
    ("2379-2381/tcp", "etcd: clients, peers, metrics"),
    ("4240/tcp", "Cilium health checks"),
    ("4244/tcp", "Cilium Hubble"),
    ("4789/udp", "VXLAN, IANA port (Calico, Antrea)"),
    ("5473/tcp", "Calico Typha"),
    ("6081/udp", "Geneve (Cilium, Antrea, OVN-Kubernetes)"),
    ("6443/tcp", "Kubernetes API server"),
    ("7946", "memberlist (MetalLB speakers)"),
    ("8472/udp", "VXLAN, Linux port (Flannel, k3s, Cilium)"),
    ("9345/tcp", "RKE2 supervisor"),
    ("10248-10259/tcp", "kubelet, kube-proxy health (10256) and metrics (10249), controller-manager, scheduler"),
    ("30000-32767", "NodePorts (keep equal to the API server's --service-node-port-range)"),
    ("51820-51821/udp", "WireGuard (Calico, Flannel, k3s)"),
    ("51871/udp", "WireGuard (Cilium)"),
];

/// Ports no Service may take, per protocol.
///
/// Parsed from `22,179/tcp,8472/udp,30000-32767`: a port or range, with `/tcp`, `/udp` or
/// `/sctp` for one protocol, without for all three. The empty string is the empty set (so
/// `--reserved-ports=` reserves nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReservedPorts {
    /// Indexed like [`PROTOCOLS`].
    by_protocol: [PortSet; 3],
}

/// The agent's own health and metrics ports with the default `--health-addr` and
/// `--metrics-addr`.
pub const DEFAULT_OWN_PORTS: [u16; 2] = [9254, 9255];

const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

fn index(p: Protocol) -> usize {
    PROTOCOLS
        .iter()
        .position(|q| *q == p)
        .expect("every protocol is listed")
}

impl ReservedPorts {
    /// [`DEFAULT_RESERVATIONS`].
    pub fn defaults() -> ReservedPorts {
        let list: Vec<&str> = DEFAULT_RESERVATIONS.iter().map(|(p, _)| *p).collect();
        list.join(",")
            .parse()
            .expect("the default reserved ports parse")
    }

    fn set(&self, protocol: Protocol) -> &PortSet {
        &self.by_protocol[index(protocol)]
    }

    fn set_mut(&mut self, protocol: Protocol) -> &mut PortSet {
        &mut self.by_protocol[index(protocol)]
    }

    pub fn contains(&self, protocol: Protocol, port: u16) -> bool {
        self.set(protocol).contains(port)
    }

    /// These ports reserved too, for `protocol` (port 0 is no port and is left out).
    pub fn with(mut self, protocol: Protocol, ports: impl IntoIterator<Item = u16>) -> Self {
        let set = self.set_mut(protocol);
        let added = ports.into_iter().filter(|p| *p != 0).map(|p| p..=p);
        *set = PortSet::new(set.0.iter().cloned().chain(added));
        self
    }

    pub fn is_empty(&self) -> bool {
        PROTOCOLS.iter().all(|p| self.set(*p).is_empty())
    }

    /// The protocols reserving `port`, as a bit per entry of [`PROTOCOLS`].
    fn mask(&self, port: u16) -> u8 {
        PROTOCOLS
            .iter()
            .enumerate()
            .filter(|(_, p)| self.contains(**p, port))
            .fold(0, |m, (i, _)| m | 1 << i)
    }
}

impl FromStr for ReservedPorts {
    type Err = PortSetError;

    fn from_str(s: &str) -> Result<ReservedPorts, PortSetError> {
        let mut ranges: [Vec<RangeInclusive<u16>>; 3] = Default::default();
        for entry in entries(s)? {
            let (ports, protocols) = match entry.split_once('/') {
                Some((ports, proto)) => (ports, vec![parse_protocol(entry, proto)?]),
                None => (entry, PROTOCOLS.to_vec()),
            };
            let range = parse_range(entry, ports)?;
            for p in protocols {
                ranges[index(p)].push(range.clone());
            }
        }
        Ok(ReservedPorts {
            by_protocol: ranges.map(PortSet::new),
        })
    }
}

/// In port order, runs of ports reserved for the same protocols: a run reserved for all three
/// without a protocol, otherwise once per protocol (`22,179/tcp,4789/udp`).
impl fmt::Display for ReservedPorts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all = (1u8 << PROTOCOLS.len()) - 1;
        let mut items = Vec::new();
        let mut run: Option<(u16, u16, u8)> = None;
        for port in 1..=u16::MAX {
            let mask = self.mask(port);
            match run {
                Some((start, _, m)) if m == mask => run = Some((start, port, m)),
                _ => {
                    items.extend(run.take());
                    if mask != 0 {
                        run = Some((port, port, mask));
                    }
                }
            }
        }
        items.extend(run);
        let mut first = true;
        for (start, end, mask) in items {
            let range = PortSet(vec![start..=end]);
            let suffixes: Vec<String> = if mask == all {
                vec![String::new()]
            } else {
                PROTOCOLS
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, p)| format!("/{}", p.keyword()))
                    .collect()
            };
            for suffix in suffixes {
                if !first {
                    f.write_str(",")?;
                }
                first = false;
                write!(f, "{range}{suffix}")?;
            }
        }
        Ok(())
    }
}

/// A set of port numbers, kept as sorted, merged, inclusive ranges.
///
/// Parsed from `22,2379-2380,6443`; the empty string is the empty set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortSet(Vec<RangeInclusive<u16>>);

/// Why a port list did not parse; `entry` is the comma-separated item at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PortSetError {
    #[error("empty entry in port list (two commas in a row, or a trailing comma?)")]
    EmptyEntry,
    #[error("{entry:?}: {text:?} is not a port number (1-65535)")]
    NotAPort { entry: String, text: String },
    #[error("{entry:?}: range starts after it ends")]
    Reversed { entry: String },
    #[error("{entry:?}: {text:?} is not a protocol (tcp, udp or sctp)")]
    NotAProtocol { entry: String, text: String },
}

impl PortSet {
    pub fn new(ranges: impl IntoIterator<Item = RangeInclusive<u16>>) -> PortSet {
        let mut ranges: Vec<RangeInclusive<u16>> =
            ranges.into_iter().filter(|r| !r.is_empty()).collect();
        ranges.sort_by_key(|r| (*r.start(), *r.end()));
        let mut merged: Vec<RangeInclusive<u16>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if u32::from(*r.start()) <= u32::from(*last.end()) + 1 => {
                    if r.end() > last.end() {
                        *last = *last.start()..=*r.end();
                    }
                }
                _ => merged.push(r),
            }
        }
        PortSet(merged)
    }

    pub fn contains(&self, port: u16) -> bool {
        self.0
            .binary_search_by(|r| {
                if *r.end() < port {
                    std::cmp::Ordering::Less
                } else if *r.start() > port {
                    std::cmp::Ordering::Greater
                } else {
                    std::cmp::Ordering::Equal
                }
            })
            .is_ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The comma-separated entries of a list, trimmed; none for a blank list.
fn entries(s: &str) -> Result<Vec<&str>, PortSetError> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(str::trim)
        .map(|e| match e {
            "" => Err(PortSetError::EmptyEntry),
            e => Ok(e),
        })
        .collect()
}

fn parse_port(entry: &str, text: &str) -> Result<u16, PortSetError> {
    let text = text.trim();
    match text.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(PortSetError::NotAPort {
            entry: entry.to_string(),
            text: text.to_string(),
        }),
    }
}

/// `80` or `80-90` of `entry`.
fn parse_range(entry: &str, text: &str) -> Result<RangeInclusive<u16>, PortSetError> {
    match text.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (parse_port(entry, a)?, parse_port(entry, b)?);
            if a > b {
                return Err(PortSetError::Reversed {
                    entry: entry.to_string(),
                });
            }
            Ok(a..=b)
        }
        None => parse_port(entry, text).map(|p| p..=p),
    }
}

fn parse_protocol(entry: &str, text: &str) -> Result<Protocol, PortSetError> {
    let text = text.trim();
    PROTOCOLS
        .into_iter()
        .find(|p| p.keyword().eq_ignore_ascii_case(text))
        .ok_or_else(|| PortSetError::NotAProtocol {
            entry: entry.to_string(),
            text: text.to_string(),
        })
}

impl FromStr for PortSet {
    type Err = PortSetError;

    fn from_str(s: &str) -> Result<PortSet, PortSetError> {
        let ranges = entries(s)?
            .into_iter()
            .map(|e| parse_range(e, e))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PortSet::new(ranges))
    }
}

impl fmt::Display for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if r.start() == r.end() {
                write!(f, "{}", r.start())?;
            } else {
                write!(f, "{}-{}", r.start(), r.end())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::plan::config::Config;
    use Protocol::{Sctp, Tcp, Udp};

    #[test]
    fn default_reserved_ports_cover_what_the_node_and_its_network_use() {
        let r = Config::default().reserved_ports;
        #[rustfmt::skip]
        let reserved = [
            (Tcp, 22), (Tcp, 179), (Tcp, 2379), (Tcp, 2381), (Tcp, 4240), (Tcp, 4244),
            (Udp, 4789), (Tcp, 5473), (Udp, 6081), (Tcp, 6443), (Tcp, 7946), (Udp, 7946),
            (Udp, 8472), (Tcp, 9254), (Tcp, 9255), (Tcp, 9345), (Tcp, 10249), (Tcp, 10250),
            (Tcp, 10256), (Tcp, 10259), (Tcp, 30000), (Udp, 31000), (Sctp, 32767),
            (Udp, 51820), (Udp, 51821), (Udp, 51871),
        ];
        for (proto, port) in reserved {
            assert!(r.contains(proto, port), "{port}/{proto} should be reserved");
        }
        #[rustfmt::skip]
        let free = [
            (Tcp, 21), (Tcp, 80), (Udp, 53), (Tcp, 443), (Udp, 179), (Tcp, 8472), (Tcp, 4789),
            (Udp, 22), (Tcp, 2382), (Tcp, 6444), (Tcp, 10260), (Udp, 10250), (Tcp, 29999),
            (Tcp, 32768), (Udp, 9254), (Tcp, 51820), (Udp, 51822),
        ];
        for (proto, port) in free {
            assert!(!r.contains(proto, port), "{port}/{proto} should be free");
        }
        assert_eq!(
            r.to_string(),
            "22/tcp,179/tcp,2379-2381/tcp,4240/tcp,4244/tcp,4789/udp,5473/tcp,6081/udp,\
             6443/tcp,7946,8472/udp,9254-9255/tcp,9345/tcp,10248-10259/tcp,30000-32767,\
             51820-51821/udp,51871/udp"
        );
    }

    #[test]
    fn a_port_without_a_protocol_is_reserved_for_all_three() {
        let r: ReservedPorts = "22, 8472/udp,179/TCP,9000/sctp,80-90/tcp,85"
            .parse()
            .unwrap();
        assert!(r.contains(Tcp, 22) && r.contains(Udp, 22) && r.contains(Sctp, 22));
        assert!(r.contains(Udp, 8472) && !r.contains(Tcp, 8472));
        assert!(r.contains(Tcp, 179) && !r.contains(Udp, 179));
        assert!(r.contains(Sctp, 9000) && !r.contains(Tcp, 9000));
        assert!(r.contains(Tcp, 90) && !r.contains(Udp, 84) && r.contains(Udp, 85));
        assert_eq!(
            r.to_string(),
            "22,80-84/tcp,85,86-90/tcp,179/tcp,8472/udp,9000/sctp"
        );
        assert_eq!(r.to_string().parse::<ReservedPorts>(), Ok(r));
        assert!("".parse::<ReservedPorts>().unwrap().is_empty());
    }

    #[test]
    fn own_ports_are_reserved_for_tcp_and_port_0_is_none() {
        let r = ReservedPorts::default().with(Tcp, [8081, 0]);
        assert!(r.contains(Tcp, 8081) && !r.contains(Udp, 8081) && !r.contains(Tcp, 0));
        assert_eq!(r.to_string(), "8081/tcp");
    }

    #[test]
    fn port_lists_parse_merge_and_print() {
        let s: PortSet = " 80 , 81-90,85-100, 8080,65535".parse().unwrap();
        assert_eq!(s.to_string(), "80-100,8080,65535");
        assert!(s.contains(80) && s.contains(100) && s.contains(65535));
        assert!(!s.contains(79) && !s.contains(101) && !s.contains(1));
        assert!("".parse::<PortSet>().unwrap().is_empty());
    }

    #[test]
    fn bad_port_lists_say_which_entry() {
        assert_eq!("22,,80".parse::<PortSet>(), Err(PortSetError::EmptyEntry));
        assert_eq!("22,".parse::<PortSet>(), Err(PortSetError::EmptyEntry));
        assert_eq!(
            "22,0".parse::<PortSet>(),
            Err(PortSetError::NotAPort {
                entry: "0".into(),
                text: "0".into()
            })
        );
        assert_eq!(
            "70000".parse::<PortSet>().unwrap_err().to_string(),
            "\"70000\": \"70000\" is not a port number (1-65535)"
        );
        assert!(matches!(
            "ssh".parse::<PortSet>(),
            Err(PortSetError::NotAPort { .. })
        ));
        assert!(matches!(
            "10-1".parse::<PortSet>(),
            Err(PortSetError::Reversed { .. })
        ));
        assert!(matches!(
            "1-2-3".parse::<PortSet>(),
            Err(PortSetError::NotAPort { .. })
        ));
        assert_eq!(
            "22,8472/icmp"
                .parse::<ReservedPorts>()
                .unwrap_err()
                .to_string(),
            "\"8472/icmp\": \"icmp\" is not a protocol (tcp, udp or sctp)"
        );
        assert!(matches!(
            "ssh/tcp".parse::<ReservedPorts>(),
            Err(PortSetError::NotAPort { .. })
        ));
        assert_eq!(
            "22/".parse::<ReservedPorts>(),
            Err(PortSetError::NotAProtocol {
                entry: "22/".into(),
                text: "".into()
            })
        );
    }
}
