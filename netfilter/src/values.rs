//! [`Values`]: the fields of one set element's key or data, stored without a heap allocation
//! when they fit in 22 bytes (every key and data nodelb programs, except an IPv6 hairpin pair).
//!
//! A table of many Services holds several elements per Service; as a `Vec<Value>` each key
//! cost a vector plus a heap block, more than the element's slot in its set.

use crate::scalar::{Family, L4Proto, Value};
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Bytes of inline room: a tag byte per field, then the field's bytes.
const INLINE: usize = 22;

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    /// `len` fields packed as (tag, bytes) in `bytes`; the rest of `bytes` is zero.
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    Heap(Box<[Value]>),
}

/// The values of a concatenated key or data item, one per field.
#[derive(Clone)]
pub struct Values(Repr);

// In the order of `Value`'s variants, and never zero (the bytes after the last field), so two
// packed lists compare byte by byte as the value lists do.
const IPV4: u8 = 1;
const IPV6: u8 = 2;
const PROTO: u8 = 3;
const PORT: u8 = 4;
const U32: u8 = 5;
const NFPROTO: u8 = 6;

const PROTOS: [L4Proto; 5] = [
    L4Proto::Tcp,
    L4Proto::Udp,
    L4Proto::Sctp,
    L4Proto::Icmp,
    L4Proto::Icmpv6,
];
const FAMILIES: [Family; 3] = [Family::Ip, Family::Ip6, Family::Inet];

/// A protocol's place in [`PROTOS`] (a match, so a new protocol cannot be forgotten here).
fn proto_index(p: L4Proto) -> u8 {
    match p {
        L4Proto::Tcp => 0,
        L4Proto::Udp => 1,
        L4Proto::Sctp => 2,
        L4Proto::Icmp => 3,
        L4Proto::Icmpv6 => 4,
    }
}

/// A family's place in [`FAMILIES`].
fn family_index(f: Family) -> u8 {
    match f {
        Family::Ip => 0,
        Family::Ip6 => 1,
        Family::Inet => 2,
    }
}

/// Bytes a value takes packed, its tag included.
fn packed_len(v: Value) -> usize {
    1 + match v {
        Value::Ipv4(_) | Value::U32(_) => 4,
        Value::Ipv6(_) => 16,
        Value::Proto(_) | Value::NfProto(_) => 1,
        Value::Port(_) => 2,
    }
}

fn pack(v: Value, out: &mut [u8]) {
    let (tag, rest) = out.split_first_mut().expect("room for the tag");
    match v {
        Value::Ipv4(a) => {
            *tag = IPV4;
            rest[..4].copy_from_slice(&a.octets());
        }
        Value::Ipv6(a) => {
            *tag = IPV6;
            rest[..16].copy_from_slice(&a.octets());
        }
        Value::Proto(p) => {
            *tag = PROTO;
            rest[0] = proto_index(p);
        }
        Value::Port(p) => {
            *tag = PORT;
            rest[..2].copy_from_slice(&p.to_be_bytes());
        }
        Value::U32(n) => {
            *tag = U32;
            rest[..4].copy_from_slice(&n.to_be_bytes());
        }
        Value::NfProto(f) => {
            *tag = NFPROTO;
            rest[0] = family_index(f);
        }
    }
}

/// The value packed at the start of `b`.
fn unpack(b: &[u8]) -> Value {
    let rest = &b[1..];
    let four = || -> [u8; 4] { rest[..4].try_into().expect("four bytes") };
    match b[0] {
        IPV4 => Value::Ipv4(Ipv4Addr::from(four())),
        IPV6 => {
            let o: [u8; 16] = rest[..16].try_into().expect("sixteen bytes");
            Value::Ipv6(Ipv6Addr::from(o))
        }
        PROTO => Value::Proto(PROTOS[rest[0] as usize]),
        PORT => Value::Port(u16::from_be_bytes([rest[0], rest[1]])),
        U32 => Value::U32(u32::from_be_bytes(four())),
        NFPROTO => Value::NfProto(FAMILIES[rest[0] as usize]),
        t => unreachable!("packed value tag {t}"),
    }
}

impl Values {
    pub fn new(values: &[Value]) -> Values {
        let size: usize = values.iter().map(|v| packed_len(*v)).sum();
        if size > INLINE {
            return Values(Repr::Heap(values.into()));
        }
        let mut bytes = [0u8; INLINE];
        let mut at = 0;
        for v in values {
            pack(*v, &mut bytes[at..]);
            at += packed_len(*v);
        }
        Values(Repr::Inline {
            len: values.len() as u8,
            bytes,
        })
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Inline { len, .. } => *len as usize,
            Repr::Heap(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> Iter<'_> {
        match &self.0 {
            Repr::Inline { len, bytes } => Iter::Inline {
                left: *len as usize,
                bytes,
            },
            Repr::Heap(v) => Iter::Heap(v.iter()),
        }
    }

    pub fn to_vec(&self) -> Vec<Value> {
        self.iter().collect()
    }
}

/// The values of a [`Values`], in field order.
pub enum Iter<'a> {
    Inline { left: usize, bytes: &'a [u8] },
    Heap(std::slice::Iter<'a, Value>),
}

impl Iterator for Iter<'_> {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        match self {
            Iter::Inline { left, bytes } => {
                if *left == 0 {
                    return None;
                }
                let v = unpack(bytes);
                *bytes = &bytes[packed_len(v)..];
                *left -= 1;
                Some(v)
            }
            Iter::Heap(it) => it.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = match self {
            Iter::Inline { left, .. } => *left,
            Iter::Heap(it) => it.len(),
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a Values {
    type Item = Value;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl From<&[Value]> for Values {
    fn from(v: &[Value]) -> Values {
        Values::new(v)
    }
}

impl From<Vec<Value>> for Values {
    fn from(v: Vec<Value>) -> Values {
        Values::new(&v)
    }
}

impl<const N: usize> From<[Value; N]> for Values {
    fn from(v: [Value; N]) -> Values {
        Values::new(&v)
    }
}

impl FromIterator<Value> for Values {
    fn from_iter<I: IntoIterator<Item = Value>>(iter: I) -> Values {
        let v: Vec<Value> = iter.into_iter().collect();
        Values::new(&v)
    }
}

// Equality and hashing compare the representation, which is canonical (inline whenever the
// values fit, unused bytes zero); order is that of the value sequences, as `Vec<Value>` had.
impl PartialEq for Values {
    fn eq(&self, other: &Values) -> bool {
        self.0 == other.0
    }
}

impl Eq for Values {}

impl Hash for Values {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

impl PartialOrd for Values {
    fn partial_cmp(&self, other: &Values) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Values {
    fn cmp(&self, other: &Values) -> Ordering {
        match (&self.0, &other.0) {
            // Tags follow the variants' order, each variant packs big-endian at a fixed width,
            // and the byte after a list's last field is zero, below any tag.
            (Repr::Inline { bytes: a, .. }, Repr::Inline { bytes: b, .. }) => a.cmp(b),
            _ => self.iter().cmp(other.iter()),
        }
    }
}

impl PartialEq<[Value]> for Values {
    fn eq(&self, other: &[Value]) -> bool {
        self.iter().eq(other.iter().copied())
    }
}

impl fmt::Debug for Values {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Vec<Value>> {
        let v4 = Value::Ipv4(Ipv4Addr::new(203, 0, 113, 10));
        let v4b = Value::Ipv4(Ipv4Addr::new(198, 51, 100, 7));
        let v6 = Value::Ipv6("2001:db8::1".parse().unwrap());
        let v6b = Value::Ipv6("2001:db8::2:1".parse().unwrap());
        let mut out = vec![vec![]];
        for p in PROTOS {
            out.push(vec![v4, Value::Proto(p), Value::Port(443)]);
        }
        for f in FAMILIES {
            out.push(vec![Value::NfProto(f)]);
        }
        out.extend([
            vec![Value::Port(80)],
            vec![Value::Port(65535)],
            vec![v4],
            vec![v4, Value::Proto(L4Proto::Tcp)],
            vec![Value::Ipv4(Ipv4Addr::UNSPECIFIED)],
            vec![Value::Ipv4(Ipv4Addr::UNSPECIFIED), Value::U32(0)],
            vec![v4, Value::Proto(L4Proto::Tcp), Value::Port(80)],
            vec![v6, Value::Proto(L4Proto::Udp), Value::Port(53)],
            vec![
                Value::Proto(L4Proto::Sctp),
                Value::Port(9),
                Value::U32(u32::MAX),
            ],
            vec![v4b, Value::Port(8080)],
            vec![v6, Value::Port(8080)],
            vec![v4, v4b],
            vec![v6, v6b],
            vec![v6b, v6],
            vec![Value::U32(7), Value::U32(0), Value::U32(1), Value::U32(2)],
        ]);
        out
    }

    #[test]
    fn values_come_back_as_given_inline_or_not() {
        for s in samples() {
            let v = Values::new(&s);
            assert_eq!(v.to_vec(), s);
            assert_eq!(v.len(), s.len());
            assert_eq!(v.iter().len(), s.len());
            assert_eq!(v, *s.as_slice());
        }
        // What nodelb programs fits inline; an IPv6 pair does not.
        let fits = |s: &[Value]| matches!(Values::new(s).0, Repr::Inline { .. });
        let v6 = Value::Ipv6("2001:db8::1".parse().unwrap());
        assert!(fits(&[v6, Value::Proto(L4Proto::Tcp), Value::Port(443)]));
        assert!(fits(&[v6, Value::Port(443)]));
        assert!(!fits(&[v6, v6]));
    }

    #[test]
    fn order_and_equality_are_those_of_the_value_lists() {
        let all = samples();
        for a in &all {
            for b in &all {
                let (va, vb) = (Values::new(a), Values::new(b));
                assert_eq!(va.cmp(&vb), a.cmp(b), "{a:?} vs {b:?}");
                assert_eq!(va == vb, a == b, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn protocol_and_family_indexes_match_their_tables() {
        for (i, p) in PROTOS.iter().enumerate() {
            assert_eq!(proto_index(*p) as usize, i, "{p:?}");
        }
        for (i, f) in FAMILIES.iter().enumerate() {
            assert_eq!(family_index(*f) as usize, i, "{f:?}");
        }
    }

    #[test]
    fn an_element_key_is_no_larger_than_a_vector() {
        assert_eq!(std::mem::size_of::<Values>(), 24);
    }
}
