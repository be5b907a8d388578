//! Reading netlink messages and nf_tables attributes, and writing the few small requests
//! nodelb sends that carry no libnftnl object (dumps, generation, conntrack requests). Plain
//! byte parsing.

pub const NFNL_SUBSYS_CTNETLINK: u16 = 1;
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;
const NFGENMSG_LEN: usize = 4;

use std::borrow::Cow;

/// One netlink message.
#[derive(Debug, Clone, Copy)]
pub struct Msg<'a> {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    pub pid: u32,
    /// Everything after the netlink header.
    pub body: &'a [u8],
}

impl<'a> Msg<'a> {
    /// For nf_tables messages: the message kind (`NFT_MSG_*`).
    pub fn nft_kind(&self) -> Option<u16> {
        (self.ty >> 8 == NFNL_SUBSYS_NFTABLES).then_some(self.ty & 0xff)
    }

    /// The family from the nfgenmsg header.
    pub fn family(&self) -> u8 {
        self.body.first().copied().unwrap_or(0)
    }

    /// The attributes after the nfgenmsg header.
    pub fn attrs(&self) -> Attrs<'a> {
        Attrs(self.body.get(NFGENMSG_LEN..).unwrap_or(&[]))
    }

    /// For `NLMSG_ERROR`: the error code (0 is an ACK), the sequence number of the message it
    /// answers, and the extended-ACK text if the kernel gave one.
    pub fn error(&self) -> Option<(i32, u32, Option<String>)> {
        if self.ty != NLMSG_ERROR || self.body.len() < 4 + NLMSG_HDRLEN {
            return None;
        }
        let code = i32::from_ne_bytes(self.body[0..4].try_into().ok()?);
        let orig_len = u32::from_ne_bytes(self.body[4..8].try_into().ok()?) as usize;
        let orig_seq = u32::from_ne_bytes(self.body[12..16].try_into().ok()?);
        // With NETLINK_CAP_ACK the original message is cut to its header; extended ACK
        // attributes follow whatever was echoed.
        let echoed = if self.flags & 0x100 != 0 {
            NLMSG_HDRLEN
        } else {
            orig_len.max(NLMSG_HDRLEN)
        };
        let mut text = None;
        if self.flags & 0x200 != 0 {
            if let Some(tlvs) = self.body.get(4 + align4(echoed)..) {
                for (ty, v) in Attrs(tlvs) {
                    if ty == 1 {
                        // NLMSGERR_ATTR_MSG
                        text = Some(
                            String::from_utf8_lossy(v.strip_suffix(&[0]).unwrap_or(v)).into_owned(),
                        );
                    }
                }
            }
        }
        Some((code, orig_seq, text))
    }
}

/// Iterate over the messages in a received buffer.
pub fn messages(buf: &[u8]) -> impl Iterator<Item = Msg<'_>> {
    let mut off = 0;
    std::iter::from_fn(move || {
        if off + NLMSG_HDRLEN > buf.len() {
            return None;
        }
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().ok()?) as usize;
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            return None;
        }
        let m = Msg {
            ty: u16::from_ne_bytes(buf[off + 4..off + 6].try_into().ok()?),
            flags: u16::from_ne_bytes(buf[off + 6..off + 8].try_into().ok()?),
            seq: u32::from_ne_bytes(buf[off + 8..off + 12].try_into().ok()?),
            pid: u32::from_ne_bytes(buf[off + 12..off + 16].try_into().ok()?),
            body: &buf[off + NLMSG_HDRLEN..off + len],
        };
        off += align4(len);
        Some(m)
    })
}

/// Netlink attributes (type without the nested/byte-order flags, value).
#[derive(Clone, Copy)]
pub struct Attrs<'a>(pub &'a [u8]);

impl<'a> Iterator for Attrs<'a> {
    type Item = (u16, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([self.0[0], self.0[1]]) as usize;
        let ty = u16::from_ne_bytes([self.0[2], self.0[3]]) & 0x3fff;
        if len < 4 || len > self.0.len() {
            return None;
        }
        let v = &self.0[4..len];
        self.0 = self.0.get(align4(len)..).unwrap_or(&[]);
        Some((ty, v))
    }
}

impl<'a> Attrs<'a> {
    pub fn get(self, ty: u16) -> Option<&'a [u8]> {
        self.into_iter().find(|(t, _)| *t == ty).map(|(_, v)| v)
    }

    pub fn get_str(self, ty: u16) -> Option<String> {
        self.get_str_ref(ty).map(Cow::into_owned)
    }

    /// A string attribute without its NUL, borrowed from the message when it is UTF-8.
    pub fn get_str_ref(self, ty: u16) -> Option<Cow<'a, str>> {
        self.get(ty)
            .map(|v| String::from_utf8_lossy(v.strip_suffix(&[0]).unwrap_or(v)))
    }

    /// Big-endian u32, as nf_tables sends integers.
    pub fn get_be32(self, ty: u16) -> Option<u32> {
        self.get(ty)
            .and_then(|v| v.try_into().ok())
            .map(u32::from_be_bytes)
    }

    /// Big-endian u64 (counter values).
    pub fn get_be64(self, ty: u16) -> Option<u64> {
        self.get(ty)
            .and_then(|v| v.try_into().ok())
            .map(u64::from_be_bytes)
    }
}

const NLA_F_NESTED: u16 = 0x8000;

pub fn align4(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// A request: netlink header, nfgenmsg, attributes.
pub struct Request {
    buf: Vec<u8>,
}

impl Request {
    /// An nf_tables request (`NFT_MSG_*`).
    pub fn new(nft_kind: u16, flags: u16, family: u8, seq: u32) -> Request {
        Request::of(NFNL_SUBSYS_NFTABLES, nft_kind, flags, family, seq)
    }

    /// A request of a netfilter netlink subsystem (`NFNL_SUBSYS_*`) and its message kind.
    pub fn of(subsys: u16, kind: u16, flags: u16, family: u8, seq: u32) -> Request {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&((subsys << 8) | kind).to_ne_bytes());
        buf.extend_from_slice(&(flags | libc::NLM_F_REQUEST as u16).to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&[family, 0, 0, 0]); // nfgenmsg: family, version 0, res_id 0
        Request { buf }
    }

    pub fn attr_str(mut self, ty: u16, s: &str) -> Request {
        let len = 4 + s.len() + 1;
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    /// A big-endian u32 attribute, as nf_tables takes integers.
    pub fn attr_be32(mut self, ty: u16, v: u32) -> Request {
        self.buf.extend_from_slice(&8u16.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }

    /// An attribute of raw bytes (addresses, in network order).
    pub fn attr_bytes(mut self, ty: u16, v: &[u8]) -> Request {
        self.buf
            .extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(v);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    pub fn attr_u8(self, ty: u16, v: u8) -> Request {
        self.attr_bytes(ty, &[v])
    }

    /// A big-endian u16 attribute (ports, conntrack zones).
    pub fn attr_be16(self, ty: u16, v: u16) -> Request {
        self.attr_bytes(ty, &v.to_be_bytes())
    }

    /// A host-order u32 attribute (`NLA_U32` flags).
    pub fn attr_u32(self, ty: u16, v: u32) -> Request {
        self.attr_bytes(ty, &v.to_ne_bytes())
    }

    /// A nested attribute (`NLA_F_NESTED`) holding what `inner` adds.
    pub fn nested(mut self, ty: u16, inner: impl FnOnce(Request) -> Request) -> Request {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        let mut r = inner(self);
        let len = (r.buf.len() - start) as u16;
        r.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        r
    }

    pub fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips_through_the_parser() {
        let req = Request::new(7, libc::NLM_F_DUMP as u16, 2, 42)
            .attr_str(1, "nodelb")
            .finish();
        let msgs: Vec<_> = messages(&req).collect();
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].nft_kind(), Some(7));
        assert_eq!(msgs[0].seq, 42);
        assert_eq!(msgs[0].family(), 2);
        assert_eq!(msgs[0].attrs().get_str(1).as_deref(), Some("nodelb"));
    }

    #[test]
    fn nested_attributes_round_trip() {
        let req = Request::of(NFNL_SUBSYS_CTNETLINK, 2, 0, 2, 7)
            .nested(1, |r| r.attr_u8(1, 17).attr_be16(2, 5353))
            .attr_u32(3, 9)
            .finish();
        let m = messages(&req).next().expect("one message");
        assert_eq!(m.ty, (NFNL_SUBSYS_CTNETLINK << 8) | 2);
        let inner = Attrs(m.attrs().get(1).expect("the nest"));
        assert_eq!(inner.get(1), Some(&[17u8][..]));
        assert_eq!(inner.get(2), Some(&5353u16.to_be_bytes()[..]));
        assert_eq!(m.attrs().get(3), Some(&9u32.to_ne_bytes()[..]));
    }
}
