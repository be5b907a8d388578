//! The TLV "userdata" format that `nft` stores next to rules, sets and elements (comments, and
//! the `typeof` and byte-order hints `nft list` needs to print a set the way it was declared).
//!
//! Each attribute is `type: u8, len: u8, value`; nests are attributes whose value is more
//! attributes. Integers are host-endian, strings NUL-terminated, as libnftnl's `nftnl_udata_*`.

#[derive(Default, Debug, Clone)]
pub struct Udata {
    buf: Vec<u8>,
}

/// Rule, chain, table and element comments all use type 0.
pub const COMMENT: u8 = 0;

/// Set userdata types (`NFTNL_UDATA_SET_*`).
pub mod set {
    pub const KEYBYTEORDER: u8 = 0;
    pub const DATABYTEORDER: u8 = 1;
    pub const KEY_TYPEOF: u8 = 3;
    pub const DATA_TYPEOF: u8 = 4;
    pub const DATA_INTERVAL: u8 = 6;
    pub const COMMENT: u8 = 7;
    /// Inside a typeof attribute: the expression type, then its data.
    pub const TYPEOF_EXPR: u8 = 0;
    pub const TYPEOF_DATA: u8 = 1;
}

impl Udata {
    pub fn new() -> Udata {
        Udata::default()
    }

    pub fn put_u32(&mut self, ty: u8, v: u32) -> &mut Self {
        self.put(ty, &v.to_ne_bytes())
    }

    pub fn put_strz(&mut self, ty: u8, s: &str) -> &mut Self {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.put(ty, &v)
    }

    pub fn put(&mut self, ty: u8, value: &[u8]) -> &mut Self {
        // Comments are limited to 128 bytes by nft; anything longer than a u8 cannot be encoded.
        let len = u8::try_from(value.len()).expect("userdata attribute longer than 255 bytes");
        self.buf.push(ty);
        self.buf.push(len);
        self.buf.extend_from_slice(value);
        self
    }

    /// A nested attribute whose value is built by `f`.
    pub fn nest(&mut self, ty: u8, f: impl FnOnce(&mut Udata)) -> &mut Self {
        let mut inner = Udata::new();
        f(&mut inner);
        self.put(ty, &inner.buf)
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// A comment attribute, as rules and elements carry it.
    pub fn comment(comment: &str) -> Udata {
        let mut u = Udata::new();
        u.put_strz(COMMENT, comment);
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comment_is_type_len_string_nul() {
        assert_eq!(Udata::comment("x").as_bytes(), &[0, 2, b'x', 0]);
    }

    #[test]
    fn nest_wraps_inner_attributes() {
        let mut u = Udata::new();
        u.nest(3, |n| {
            n.put_u32(0, 13);
        });
        assert_eq!(u.as_bytes(), &[3, 6, 0, 4, 13, 0, 0, 0]);
    }
}
