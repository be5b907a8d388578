//! An address prefix, as `loadBalancerSourceRanges`, `nodelb.io/address-cidrs` and
//! `--address-cidrs` give it.

use crate::vocab::IpFamily;
use std::fmt;
use std::net::IpAddr;

/// An address prefix, host bits cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: IpAddr,
    pub len: u8,
}

impl Cidr {
    /// `192.0.2.0/24` or `2001:db8::/32`; host bits are cleared.
    pub fn parse(s: &str) -> Option<Cidr> {
        let (a, l) = s.trim().split_once('/')?;
        let addr: IpAddr = a.parse().ok()?;
        let len: u8 = l.parse().ok()?;
        let addr = match addr {
            IpAddr::V4(a) if len <= 32 => {
                let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) if len <= 128 => {
                let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
            _ => return None,
        };
        Some(Cidr { addr, len })
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.addr)
    }

    /// Whether `other` lies inside this prefix.
    pub fn contains(&self, other: &Cidr) -> bool {
        if self.family() != other.family() || other.len < self.len {
            return false;
        }
        Cidr::parse(&format!("{}/{}", other.addr, self.len)).is_some_and(|c| c.addr == self.addr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}
