//! What the operator decides with flags: families, class, reserved ports, namespaces.

use crate::vocab::IpFamily;
use nodelb_netfilter::TableRef;
use std::collections::BTreeSet;
use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;

/// The planner's settings, one field per `nodelb-agent run` flag it depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// `--ipv4` (default true). Read by the caller when it computes [`crate::vocab::Families`]; the
    /// planner itself only looks at `Families`.
    pub ipv4: bool,
    /// `--ipv6` (default false). See `ipv4`.
    pub ipv6: bool,
    /// `--default-class` (default true): handle LoadBalancer Services without a class.
    pub default_class: bool,
    /// `--lb-class` (default `nodelb.io/nodelb`).
    pub lb_class: String,
    /// `--reserved-ports`: Service ports nodelb refuses to take.
    pub reserved_ports: PortSet,
    /// `--allowed-namespaces`: `None` allows every namespace.
    pub allowed_namespaces: Option<BTreeSet<String>>,
    /// Name of the nft table in each family (`nodelb`).
    pub table_name: String,
}

/// The loadBalancerClass nodelb answers to unless `--lb-class` says otherwise.
pub const DEFAULT_LB_CLASS: &str = "nodelb.io/nodelb";
/// The table nodelb owns in each family.
pub const DEFAULT_TABLE_NAME: &str = "nodelb";
/// Ports a node needs for itself: SSH, etcd, the API server, the kubelet and control-plane
/// components, the NodePort range, and the agent's own health and metrics ports.
pub const DEFAULT_RESERVED_PORTS: &str = "22,2379-2380,6443,10250-10259,30000-32767,9254,9255";

impl Default for Config {
    fn default() -> Config {
        Config {
            ipv4: true,
            ipv6: false,
            default_class: true,
            lb_class: DEFAULT_LB_CLASS.to_string(),
            reserved_ports: DEFAULT_RESERVED_PORTS
                .parse()
                .expect("the default reserved ports parse"),
            allowed_namespaces: None,
            table_name: DEFAULT_TABLE_NAME.to_string(),
        }
    }
}

impl Config {
    /// nodelb's table of a family.
    pub fn table_ref(&self, family: IpFamily) -> TableRef {
        TableRef {
            family: family.netfilter(),
            name: self.table_name.clone(),
        }
    }

    /// Whether Services in `namespace` may be nodelb's at all.
    pub fn namespace_allowed(&self, namespace: &str) -> bool {
        self.allowed_namespaces
            .as_ref()
            .is_none_or(|allowed| allowed.contains(namespace))
    }
}

/// A set of TCP/UDP/SCTP port numbers, kept as sorted, merged, inclusive ranges.
///
/// Parsed from `22,2379-2380,6443`; the empty string is the empty set (so `--reserved-ports=`
/// reserves nothing).
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

    pub fn ranges(&self) -> &[RangeInclusive<u16>] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
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

impl FromStr for PortSet {
    type Err = PortSetError;

    fn from_str(s: &str) -> Result<PortSet, PortSetError> {
        if s.trim().is_empty() {
            return Ok(PortSet::default());
        }
        let mut ranges = Vec::new();
        for entry in s.split(',') {
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(PortSetError::EmptyEntry);
            }
            let range = match entry.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (parse_port(entry, a)?, parse_port(entry, b)?);
                    if a > b {
                        return Err(PortSetError::Reversed {
                            entry: entry.to_string(),
                        });
                    }
                    a..=b
                }
                None => {
                    let p = parse_port(entry, entry)?;
                    p..=p
                }
            };
            ranges.push(range);
        }
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

    #[test]
    fn default_reserved_ports_cover_what_the_node_needs() {
        let c = Config::default();
        for p in [
            22, 2379, 2380, 6443, 10250, 10259, 30000, 31000, 32767, 9254, 9255,
        ] {
            assert!(c.reserved_ports.contains(p), "{p} should be reserved");
        }
        for p in [
            21, 23, 80, 443, 2378, 2381, 6444, 10249, 10260, 29999, 32768, 9253, 9256,
        ] {
            assert!(!c.reserved_ports.contains(p), "{p} should be free");
        }
        assert_eq!(
            c.reserved_ports.to_string(),
            "22,2379-2380,6443,9254-9255,10250-10259,30000-32767"
        );
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
    }
}
