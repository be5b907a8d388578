//! The packet a trace starts from: its addresses, protocol and ports, where it comes from,
//! and what conntrack already knows of its connection.

use crate::model::{ct_state, ct_status, Family, L4Proto};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The source port a packet gets when the test does not say: an ephemeral one.
pub const DEFAULT_SOURCE_PORT: u16 = 40000;

/// Where the packet is in its connection's life (`ct state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CtState {
    /// The connection's first packet: the nat chains decide its NAT.
    New,
    /// A later packet of a connection in its original direction. Its NAT was decided by the
    /// first packet; nat chains do not run for it.
    Established,
    /// A packet related to an existing connection (an ICMP error about it, say); like an
    /// established one, the nat chains do not run for it.
    Related,
}

impl CtState {
    /// The `ct state` bit.
    pub fn bit(self) -> u32 {
        match self {
            CtState::New => ct_state::NEW,
            CtState::Established => ct_state::ESTABLISHED,
            CtState::Related => ct_state::RELATED,
        }
    }
}

/// One packet to trace: as it enters the host (from a link, or from a local socket).
///
/// Build with [`Packet::tcp`], [`Packet::udp`] or [`Packet::sctp`] and the modifiers:
/// `Packet::tcp("203.0.113.9", "192.0.2.1", 443).established()`. A packet is a new
/// connection's first packet arriving from a link unless a modifier says otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: L4Proto,
    pub sport: u16,
    pub dport: u16,
    pub state: CtState,
    /// Sent by a socket on this host (starts at `output`), not arriving from a link (starts at
    /// `prerouting`).
    pub from_host: bool,
    /// For an established or related packet: the endpoint its connection was DNATed to,
    /// which conntrack applies where the nat chains would run (`ct status dnat`, and `ct
    /// original` is the packet's own destination).
    pub dnatted_to: Option<SocketAddr>,
    /// `meta mark` as the packet arrives.
    pub mark: u32,
    /// `ct mark` of its connection.
    pub ct_mark: u32,
}

/// An address for a [`Packet`]: an [`IpAddr`], [`Ipv4Addr`], [`Ipv6Addr`] or a literal.
pub trait Address {
    /// # Panics
    /// A literal that is not an address: packets are written by tests, and a typo there is
    /// the test's bug.
    fn address(self) -> IpAddr;
}

impl Address for IpAddr {
    fn address(self) -> IpAddr {
        self
    }
}

impl Address for Ipv4Addr {
    fn address(self) -> IpAddr {
        self.into()
    }
}

impl Address for Ipv6Addr {
    fn address(self) -> IpAddr {
        self.into()
    }
}

impl Address for &str {
    fn address(self) -> IpAddr {
        self.parse()
            .unwrap_or_else(|e| panic!("{self:?} is not an IP address: {e}"))
    }
}

impl Packet {
    /// A new connection's first packet of `proto` from `src` to `dst` port `dport`.
    ///
    /// # Panics
    /// `src` and `dst` of different families.
    pub fn new(proto: L4Proto, src: impl Address, dst: impl Address, dport: u16) -> Packet {
        let (src, dst) = (src.address(), dst.address());
        assert_eq!(
            src.is_ipv4(),
            dst.is_ipv4(),
            "a packet from {src} to {dst} mixes address families"
        );
        Packet {
            src,
            dst,
            proto,
            sport: DEFAULT_SOURCE_PORT,
            dport,
            state: CtState::New,
            from_host: false,
            dnatted_to: None,
            mark: 0,
            ct_mark: 0,
        }
    }

    pub fn tcp(src: impl Address, dst: impl Address, dport: u16) -> Packet {
        Packet::new(L4Proto::Tcp, src, dst, dport)
    }

    pub fn udp(src: impl Address, dst: impl Address, dport: u16) -> Packet {
        Packet::new(L4Proto::Udp, src, dst, dport)
    }

    pub fn sctp(src: impl Address, dst: impl Address, dport: u16) -> Packet {
        Packet::new(L4Proto::Sctp, src, dst, dport)
    }

    pub fn sport(mut self, port: u16) -> Packet {
        self.sport = port;
        self
    }

    /// A later packet of the connection (see [`CtState::Established`]).
    pub fn established(mut self) -> Packet {
        self.state = CtState::Established;
        self
    }

    /// A packet related to an existing connection (see [`CtState::Related`]).
    pub fn related(mut self) -> Packet {
        self.state = CtState::Related;
        self
    }

    /// The packet's connection was DNATed to `endpoint` by its first packet.
    ///
    /// # Panics
    /// On a new connection's packet: its NAT is for the tables to decide.
    pub fn dnatted_to(mut self, endpoint: impl Into<SocketAddr>) -> Packet {
        assert_ne!(
            self.state,
            CtState::New,
            "a new connection's NAT is the tables' to decide: say .established() first"
        );
        self.dnatted_to = Some(endpoint.into());
        self
    }

    /// Sent by a socket on this host.
    pub fn from_host(mut self) -> Packet {
        self.from_host = true;
        self
    }

    pub fn mark(mut self, mark: u32) -> Packet {
        self.mark = mark;
        self
    }

    pub fn ct_mark(mut self, mark: u32) -> Packet {
        self.ct_mark = mark;
        self
    }

    /// `ip` or `ip6`.
    pub fn family(&self) -> Family {
        match self.src {
            IpAddr::V4(_) => Family::Ip,
            IpAddr::V6(_) => Family::Ip6,
        }
    }

    /// `ct status` of the packet's connection as the packet arrives: nothing yet for a new
    /// one; confirmed and answered for one that exists, DNATed if it was.
    pub(crate) fn ct_status(&self) -> u32 {
        let known = match self.state {
            CtState::New => 0,
            CtState::Established | CtState::Related => {
                ct_status::CONFIRMED | ct_status::SEEN_REPLY | ct_status::ASSURED
            }
        };
        match self.dnatted_to {
            Some(_) => known | ct_status::DNAT,
            None => known,
        }
    }
}

impl std::fmt::Display for Packet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let src = SocketAddr::new(self.src, self.sport);
        let dst = SocketAddr::new(self.dst, self.dport);
        write!(f, "{} {src} -> {dst}", self.proto.keyword())?;
        let state = match self.state {
            CtState::New => "new",
            CtState::Established => "established",
            CtState::Related => "related",
        };
        write!(f, " ({state}")?;
        if let Some(to) = self.dnatted_to {
            write!(f, ", DNATed to {to}")?;
        }
        if self.from_host {
            f.write_str(", from this host")?;
        }
        if self.mark != 0 {
            write!(f, ", mark 0x{:x}", self.mark)?;
        }
        f.write_str(")")
    }
}
