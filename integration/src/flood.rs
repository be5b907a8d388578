//! Spoofed new clients: IPv6 TCP SYNs and UDP datagrams from many made-up source addresses,
//! written whole (header included) to a raw socket, the way a flood reaches a node. Each packet
//! is a new connection to conntrack, so nodelb's nat chains see every one.
//!
//! Only IPv6: the documentation prefix 2001:db8::/32 holds as many sources as a test needs,
//! where the IPv4 ones hold 768.

use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The transport a spoofed packet carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spoofed {
    /// A TCP SYN.
    Syn,
    /// A UDP datagram of four bytes.
    Udp,
}

/// The source port every spoofed packet comes from: the source address makes it new.
const SOURCE_PORT: u16 = 40_000;

/// One spoofed packet from `src` to `dst` port `port`, IPv6 header included, checksummed.
pub fn packet(kind: Spoofed, src: Ipv6Addr, dst: Ipv6Addr, port: u16) -> Vec<u8> {
    let (next_header, mut l4) = match kind {
        Spoofed::Syn => {
            let mut t = vec![0u8; 20];
            t[0..2].copy_from_slice(&SOURCE_PORT.to_be_bytes());
            t[2..4].copy_from_slice(&port.to_be_bytes());
            t[4..8].copy_from_slice(&0x1000_0000u32.to_be_bytes());
            t[12] = 5 << 4; // data offset: 5 words, no options
            t[13] = 0x02; // SYN
            t[14..16].copy_from_slice(&65_535u16.to_be_bytes());
            (6u8, t)
        }
        Spoofed::Udp => {
            let mut u = vec![0u8; 12];
            u[0..2].copy_from_slice(&SOURCE_PORT.to_be_bytes());
            u[2..4].copy_from_slice(&port.to_be_bytes());
            u[4..6].copy_from_slice(&12u16.to_be_bytes());
            u[8..12].copy_from_slice(b"ping");
            (17u8, u)
        }
    };
    let sum = checksum(src, dst, next_header, &l4);
    let at = if kind == Spoofed::Syn { 16 } else { 6 };
    l4[at..at + 2].copy_from_slice(&sum.to_be_bytes());
    let mut p = Vec::with_capacity(40 + l4.len());
    p.extend_from_slice(&0x6000_0000u32.to_be_bytes()); // version 6, no class, no flow label
    p.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    p.push(next_header);
    p.push(64); // hop limit
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&l4);
    p
}

/// The transport checksum over the IPv6 pseudo-header and `l4` (whose checksum field is 0).
fn checksum(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, l4: &[u8]) -> u16 {
    let mut words = Vec::with_capacity(40 + l4.len() + 1);
    words.extend_from_slice(&src.octets());
    words.extend_from_slice(&dst.octets());
    words.extend_from_slice(&(l4.len() as u32).to_be_bytes());
    words.extend_from_slice(&[0, 0, 0, next_header]);
    words.extend_from_slice(l4);
    if words.len() % 2 == 1 {
        words.push(0);
    }
    let mut sum: u32 = words
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    match !(sum as u16) {
        // UDP over IPv6 has no "no checksum": an all-zero result is sent as all ones.
        0 => 0xffff,
        c => c,
    }
}

/// A raw IPv6 socket that sends packets whole (IPPROTO_RAW: the header is the caller's).
/// Call it inside the network namespace the packets leave from.
pub fn raw_socket() -> Result<OwnedFd, String> {
    // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET6,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::IPPROTO_RAW,
        )
    };
    if fd < 0 {
        return Err(format!(
            "a raw IPv6 socket: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: fd is a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sends `packet` (built by [`packet`]) to its destination `dst` through `sock`.
pub fn send(sock: &OwnedFd, packet: &[u8], dst: Ipv6Addr) -> Result<(), String> {
    // SAFETY: an all-zero sockaddr_in6 is valid; the fields are set below.
    let mut to: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    to.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    to.sin6_addr.s6_addr = dst.octets();
    loop {
        // SAFETY: packet and to outlive the call; the lengths are theirs.
        let n = unsafe {
            libc::sendto(
                sock.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&to as *const libc::sockaddr_in6).cast(),
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            )
        };
        if n >= 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        // The device queue is full: give it a moment.
        if e.raw_os_error() == Some(libc::ENOBUFS) {
            std::thread::sleep(std::time::Duration::from_micros(200));
            continue;
        }
        return Err(format!("sending a spoofed packet to {dst}: {e}"));
    }
}

/// Source `k` of the flood prefix `2001:db8:f::/48`: a distinct documentation address for
/// each `k` below 2^64.
pub fn source(k: u64) -> Ipv6Addr {
    let w = |s: u32| ((k >> s) & 0xffff) as u16;
    Ipv6Addr::new(0x2001, 0xdb8, 0xf, 0, w(48), w(32), w(16), w(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiver's one's-complement sum over the pseudo-header and a packet comes to all ones
    /// (its complement, zero, shows up here as 0xffff, the form UDP sends).
    #[test]
    fn a_packet_checksums_to_zero_at_the_receiver() {
        let (src, dst) = (source(7), "2001:db8:a::1".parse().unwrap());
        for kind in [Spoofed::Syn, Spoofed::Udp] {
            let p = packet(kind, src, dst, 80);
            let next = p[6];
            assert_eq!(checksum(src, dst, next, &p[40..]), 0xffff, "{kind:?}");
            assert_eq!(u16::from_be_bytes([p[4], p[5]]) as usize, p.len() - 40);
        }
        assert_ne!(source(1), source(1 << 16));
    }
}
