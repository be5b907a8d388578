//! The scalars every other module speaks of: an address family, a layer 4 protocol and a
//! constant value. At the bottom of the crate: the model and the packed element values both
//! import them, neither the other.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Address family of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    Ip,
    Ip6,
    /// Only used where a test needs `meta nfproto`; nodelb itself programs `ip` and `ip6`.
    Inet,
}

impl Family {
    pub fn keyword(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
            Family::Inet => "inet",
        }
    }

    /// The NFPROTO_* value.
    pub fn nfproto(self) -> u8 {
        match self {
            Family::Ip => libc::NFPROTO_IPV4 as u8,
            Family::Ip6 => libc::NFPROTO_IPV6 as u8,
            Family::Inet => libc::NFPROTO_INET as u8,
        }
    }

    pub fn from_nfproto(v: u8) -> Option<Family> {
        match v as i32 {
            libc::NFPROTO_IPV4 => Some(Family::Ip),
            libc::NFPROTO_IPV6 => Some(Family::Ip6),
            libc::NFPROTO_INET => Some(Family::Inet),
            _ => None,
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.keyword())
    }
}

/// Layer 4 protocols nodelb knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum L4Proto {
    Tcp,
    Udp,
    Sctp,
    Icmp,
    Icmpv6,
}

impl L4Proto {
    pub fn number(self) -> u8 {
        match self {
            L4Proto::Tcp => 6,
            L4Proto::Udp => 17,
            L4Proto::Sctp => 132,
            L4Proto::Icmp => 1,
            L4Proto::Icmpv6 => 58,
        }
    }

    pub fn keyword(self) -> &'static str {
        match self {
            L4Proto::Tcp => "tcp",
            L4Proto::Udp => "udp",
            L4Proto::Sctp => "sctp",
            L4Proto::Icmp => "icmp",
            L4Proto::Icmpv6 => "ipv6-icmp",
        }
    }
}

/// A constant compared with, or stored in, a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    Ipv4(Ipv4Addr),
    Ipv6(Ipv6Addr),
    Proto(L4Proto),
    Port(u16),
    /// A 32-bit host-order integer: marks, numgen results, ct state/status bits.
    U32(u32),
    /// `meta nfproto` values.
    NfProto(Family),
}

impl From<IpAddr> for Value {
    fn from(ip: IpAddr) -> Value {
        match ip {
            IpAddr::V4(a) => Value::Ipv4(a),
            IpAddr::V6(a) => Value::Ipv6(a),
        }
    }
}
