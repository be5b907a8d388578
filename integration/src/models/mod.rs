//! Models shared by the differential tests, the dataplane tests and the benchmarks: the
//! kitchen sinks, tables built by hand to exercise the encoder and the tracer (`sink`), and
//! the benchmark's Services and slices and the tables the planner builds of them (`bench`).

mod bench;
mod sink;

pub use bench::*;
pub use sink::{inet_sink, kitchen_sink};

use nodelb_netfilter::{DataType, Expr, Family, Payload};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Addresses and field spellings for one family.
#[derive(Clone, Copy, Debug)]
pub struct Fam {
    pub family: Family,
}

impl Fam {
    pub const V4: Fam = Fam { family: Family::Ip };
    pub const V6: Fam = Fam {
        family: Family::Ip6,
    };

    pub fn saddr(self) -> Expr {
        Expr::Payload(if self.v6() {
            Payload::Ip6Saddr
        } else {
            Payload::IpSaddr
        })
    }
    pub fn daddr(self) -> Expr {
        Expr::Payload(if self.v6() {
            Payload::Ip6Daddr
        } else {
            Payload::IpDaddr
        })
    }
    pub fn proto(self) -> Expr {
        Expr::Payload(if self.v6() {
            Payload::Ip6Nexthdr
        } else {
            Payload::IpProtocol
        })
    }
    pub fn addr_type(self) -> DataType {
        if self.v6() {
            DataType::Ipv6Addr
        } else {
            DataType::Ipv4Addr
        }
    }
    pub fn v6(self) -> bool {
        self.family == Family::Ip6
    }
    /// A documentation address: `net` picks 192.0.2/198.51.100/203.0.113 (v4) or
    /// 2001:db8:<net>:: (v6), `host` the last part.
    pub fn addr(self, net: u8, host: u16) -> IpAddr {
        if self.v6() {
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, net as u16, 0, 0, 0, 0, host))
        } else {
            let (a, b, c) = match net {
                0 => (192, 0, 2),
                1 => (198, 51, 100),
                _ => (203, 0, 113),
            };
            IpAddr::V4(Ipv4Addr::new(a, b, c, host as u8))
        }
    }
    pub fn prefix_len(self) -> u8 {
        if self.v6() {
            64
        } else {
            24
        }
    }
}
