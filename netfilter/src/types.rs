//! What each expression and data type is on the wire: lengths, nft datatype ids, byte order,
//! how a value is encoded, and how both are spelled in `nft` syntax. Shared by the encoder and
//! the renderer so the two cannot disagree.

use crate::model::{CtKey, DataType, Expr, Family, L4Proto, MetaKey, Payload, SetType, Value};
use crate::udata::{set as ud, Udata};
use std::fmt::Write;

/// nft's datatype ids (`enum datatypes` in nftables' datatype.h).
pub mod dt {
    pub const INTEGER: u32 = 4;
    pub const NFPROTO: u32 = 2;
    pub const IPADDR: u32 = 7;
    pub const IP6ADDR: u32 = 8;
    pub const INET_PROTOCOL: u32 = 12;
    pub const INET_SERVICE: u32 = 13;
    pub const MARK: u32 = 19;
    pub const CT_STATE: u32 = 26;
    pub const CT_STATUS: u32 = 28;
    /// The kernel's data type for verdict maps (`NFT_DATA_VERDICT`).
    pub const VERDICT_DATA: u32 = 0xffff_ff00;
    pub const CONCAT_BITS: u32 = 6;
}

/// nft's byte-order tags, stored in set userdata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ByteOrder {
    Invalid = 0,
    Host = 1,
    Big = 2,
}

/// Wire facts of one field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub len: usize,
    pub datatype: u32,
    pub byteorder: ByteOrder,
}

const fn field(len: usize, datatype: u32, byteorder: ByteOrder) -> Field {
    Field {
        len,
        datatype,
        byteorder,
    }
}

impl DataType {
    pub fn field(self) -> Field {
        match self {
            DataType::Ipv4Addr => field(4, dt::IPADDR, ByteOrder::Big),
            DataType::Ipv6Addr => field(16, dt::IP6ADDR, ByteOrder::Big),
            DataType::InetProto => field(1, dt::INET_PROTOCOL, ByteOrder::Big),
            DataType::InetService => field(2, dt::INET_SERVICE, ByteOrder::Big),
            DataType::Mark => field(4, dt::MARK, ByteOrder::Host),
        }
    }

    pub fn keyword(self) -> &'static str {
        match self {
            DataType::Ipv4Addr => "ipv4_addr",
            DataType::Ipv6Addr => "ipv6_addr",
            DataType::InetProto => "inet_proto",
            DataType::InetService => "inet_service",
            DataType::Mark => "mark",
        }
    }
}

/// Payload header base (`NFT_PAYLOAD_*_HEADER`).
pub const NETWORK_HEADER: u32 = 1;
pub const TRANSPORT_HEADER: u32 = 2;

/// nft's protocol description ids and header field indexes, used in `typeof` userdata.
mod proto_desc {
    pub const UDP: u32 = 6;
    pub const TCP: u32 = 8;
    pub const SCTP: u32 = 10;
    pub const TH: u32 = 11;
    pub const IP: u32 = 12;
    pub const IP6: u32 = 13;
}

/// nft expression type ids (`enum expr_types`), used in `typeof` userdata.
mod expr_type {
    pub const VERDICT: u32 = 1;
    pub const PAYLOAD: u32 = 7;
    pub const META: u32 = 9;
    pub const CONCAT: u32 = 13;
    pub const NUMGEN: u32 = 23;
}

/// Where a payload field lives and what protocol it depends on.
pub struct PayloadDesc {
    pub base: u32,
    pub offset: u32,
    pub field: Field,
    /// The transport protocol a `meta l4proto` dependency must establish first.
    pub l4_dependency: Option<L4Proto>,
    /// The family an `inet` table must establish first (`meta nfproto`).
    pub nf_dependency: Option<Family>,
    desc_id: u32,
    field_id: u32,
    pub text: &'static str,
}

impl Payload {
    pub fn desc(self) -> PayloadDesc {
        use Payload::*;
        let ip4 = field(4, dt::IPADDR, ByteOrder::Big);
        let ip6 = field(16, dt::IP6ADDR, ByteOrder::Big);
        let proto = field(1, dt::INET_PROTOCOL, ByteOrder::Big);
        let port = field(2, dt::INET_SERVICE, ByteOrder::Big);
        // A network header field of one family; a transport header port.
        let net = |offset, field, nf, desc_id, field_id, text| PayloadDesc {
            base: NETWORK_HEADER,
            offset,
            field,
            l4_dependency: None,
            nf_dependency: Some(nf),
            desc_id,
            field_id,
            text,
        };
        let th = |offset, l4, desc_id, field_id, text| PayloadDesc {
            base: TRANSPORT_HEADER,
            offset,
            field: port,
            l4_dependency: l4,
            nf_dependency: None,
            desc_id,
            field_id,
            text,
        };
        let (ip, ip6_, tcp, udp, sctp) = (
            Family::Ip,
            Family::Ip6,
            Some(L4Proto::Tcp),
            Some(L4Proto::Udp),
            Some(L4Proto::Sctp),
        );
        match self {
            IpSaddr => net(12, ip4, ip, proto_desc::IP, 11, "ip saddr"),
            IpDaddr => net(16, ip4, ip, proto_desc::IP, 12, "ip daddr"),
            IpProtocol => net(9, proto, ip, proto_desc::IP, 9, "ip protocol"),
            Ip6Saddr => net(8, ip6, ip6_, proto_desc::IP6, 8, "ip6 saddr"),
            Ip6Daddr => net(24, ip6, ip6_, proto_desc::IP6, 9, "ip6 daddr"),
            Ip6Nexthdr => net(6, proto, ip6_, proto_desc::IP6, 6, "ip6 nexthdr"),
            TcpSport => th(0, tcp, proto_desc::TCP, 1, "tcp sport"),
            TcpDport => th(2, tcp, proto_desc::TCP, 2, "tcp dport"),
            UdpSport => th(0, udp, proto_desc::UDP, 1, "udp sport"),
            UdpDport => th(2, udp, proto_desc::UDP, 2, "udp dport"),
            SctpSport => th(0, sctp, proto_desc::SCTP, 1, "sctp sport"),
            SctpDport => th(2, sctp, proto_desc::SCTP, 2, "sctp dport"),
            ThSport => th(0, None, proto_desc::TH, 1, "th sport"),
            ThDport => th(2, None, proto_desc::TH, 2, "th dport"),
        }
    }
}

impl MetaKey {
    /// `NFT_META_*`.
    pub fn number(self) -> u32 {
        match self {
            MetaKey::Mark => 3,
            MetaKey::NfProto => 15,
            MetaKey::L4Proto => 16,
        }
    }
}

impl CtKey {
    /// `NFT_CT_*`, which for addresses depends on the family.
    pub fn number(self, family: Family) -> u32 {
        match self {
            CtKey::State => 0,
            CtKey::Status => 2,
            CtKey::Mark => 3,
            CtKey::OriginalProtoDst => 12,
            CtKey::OriginalDaddr if family == Family::Ip6 => 22,
            CtKey::OriginalDaddr => 20,
        }
    }

    pub fn is_original(self) -> bool {
        matches!(self, CtKey::OriginalDaddr | CtKey::OriginalProtoDst)
    }
}

impl Expr {
    /// Wire facts of the value this expression loads, in a table of `family`.
    pub fn field(self, family: Family) -> Field {
        match self {
            Expr::Payload(p) => p.desc().field,
            Expr::Meta(MetaKey::Mark) => field(4, dt::MARK, ByteOrder::Host),
            Expr::Meta(MetaKey::L4Proto) => field(1, dt::INET_PROTOCOL, ByteOrder::Big),
            Expr::Meta(MetaKey::NfProto) => field(1, dt::NFPROTO, ByteOrder::Host),
            Expr::Ct(CtKey::State) => field(4, dt::CT_STATE, ByteOrder::Host),
            Expr::Ct(CtKey::Status) => field(4, dt::CT_STATUS, ByteOrder::Host),
            Expr::Ct(CtKey::Mark) => field(4, dt::MARK, ByteOrder::Host),
            Expr::Ct(CtKey::OriginalDaddr) if family == Family::Ip6 => {
                field(16, dt::IP6ADDR, ByteOrder::Big)
            }
            Expr::Ct(CtKey::OriginalDaddr) => field(4, dt::IPADDR, ByteOrder::Big),
            Expr::Ct(CtKey::OriginalProtoDst) => field(2, dt::INET_SERVICE, ByteOrder::Big),
            Expr::Numgen { .. } => field(4, dt::INTEGER, ByteOrder::Host),
        }
    }

    pub fn text(self, family: Family) -> String {
        match self {
            Expr::Payload(p) => p.desc().text.to_string(),
            Expr::Meta(MetaKey::Mark) => "meta mark".into(),
            Expr::Meta(MetaKey::L4Proto) => "meta l4proto".into(),
            Expr::Meta(MetaKey::NfProto) => "meta nfproto".into(),
            Expr::Ct(CtKey::State) => "ct state".into(),
            Expr::Ct(CtKey::Status) => "ct status".into(),
            Expr::Ct(CtKey::Mark) => "ct mark".into(),
            Expr::Ct(CtKey::OriginalDaddr) if family == Family::Ip6 => {
                "ct original ip6 daddr".into()
            }
            Expr::Ct(CtKey::OriginalDaddr) => "ct original ip daddr".into(),
            Expr::Ct(CtKey::OriginalProtoDst) => "ct original proto-dst".into(),
            Expr::Numgen { modulus, offset: 0 } => format!("numgen random mod {modulus}"),
            Expr::Numgen { modulus, offset } => {
                format!("numgen random mod {modulus} offset {offset}")
            }
        }
    }

    /// The `typeof` userdata nft writes for this expression, or `None` where nft cannot.
    fn typeof_udata(self, u: &mut Udata) -> Result<(), String> {
        match self {
            Expr::Payload(p) => {
                let d = p.desc();
                u.put_u32(ud::TYPEOF_EXPR, expr_type::PAYLOAD);
                u.nest(ud::TYPEOF_DATA, |n| {
                    n.put_u32(0, d.desc_id);
                    n.put_u32(1, d.field_id);
                });
            }
            Expr::Meta(k) => {
                u.put_u32(ud::TYPEOF_EXPR, expr_type::META);
                u.nest(ud::TYPEOF_DATA, |n| {
                    n.put_u32(0, k.number());
                });
            }
            Expr::Numgen { modulus, offset } => {
                u.put_u32(ud::TYPEOF_EXPR, expr_type::NUMGEN);
                u.nest(ud::TYPEOF_DATA, |n| {
                    n.put_u32(0, 1); // NFT_NG_RANDOM
                    n.put_u32(1, modulus);
                    n.put_u32(2, offset);
                });
            }
            Expr::Ct(_) => {
                return Err(format!("typeof {} is not supported", self.text(Family::Ip)))
            }
        }
        Ok(())
    }
}

/// A key or data declaration resolved to wire facts.
#[derive(Clone, Debug)]
pub struct Layout {
    pub fields: Vec<Field>,
}

impl Layout {
    pub fn of(ty: &SetType, family: Family) -> Layout {
        let fields = match ty {
            SetType::Type(dts) => dts.iter().map(|d| d.field()).collect(),
            SetType::Typeof(exprs) => exprs.iter().map(|e| e.field(family)).collect(),
        };
        Layout { fields }
    }

    pub fn of_exprs(exprs: &[Expr], family: Family) -> Layout {
        Layout {
            fields: exprs.iter().map(|e| e.field(family)).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    pub fn is_concat(&self) -> bool {
        self.fields.len() > 1
    }

    /// Length of a key: concatenations pad every field to 32 bits.
    pub fn len(&self) -> usize {
        if self.is_concat() {
            self.fields.iter().map(|f| pad4(f.len)).sum()
        } else {
            self.fields.first().map_or(0, |f| f.len)
        }
    }

    pub fn datatype(&self) -> u32 {
        if self.is_concat() {
            self.fields
                .iter()
                .fold(0, |acc, f| (acc << dt::CONCAT_BITS) | f.datatype)
        } else {
            self.fields.first().map_or(0, |f| f.datatype)
        }
    }

    pub fn byteorder(&self) -> ByteOrder {
        if self.is_concat() {
            ByteOrder::Invalid
        } else {
            self.fields
                .first()
                .map_or(ByteOrder::Invalid, |f| f.byteorder)
        }
    }

    /// Registers for loading each field: the first in `NFT_REG_1`, the rest in the 32-bit
    /// registers that follow it, as nft allocates them.
    pub fn registers(&self) -> Vec<u32> {
        let mut words = 0;
        self.fields
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let reg = if i == 0 { 1 } else { 8 + words };
                words += pad4(f.len) as u32 / 4;
                reg
            })
            .collect()
    }

    /// Encode one value per field.
    pub fn encode<I>(&self, values: I) -> Result<Vec<u8>, String>
    where
        I: IntoIterator<Item = Value>,
        I::IntoIter: ExactSizeIterator,
    {
        let values = values.into_iter();
        if values.len() != self.fields.len() {
            return Err(format!(
                "{} values for a key of {} fields",
                values.len(),
                self.fields.len()
            ));
        }
        let mut out = Vec::with_capacity(self.len());
        for (f, v) in self.fields.iter().zip(values) {
            let bytes = encode_value(*f, v)?;
            out.extend_from_slice(&bytes);
            if self.is_concat() {
                out.resize(out.len() + pad4(f.len) - f.len, 0);
            }
        }
        Ok(out)
    }
}

pub fn pad4(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// Encode a value for a field of the given wire type.
pub fn encode_value(f: Field, v: Value) -> Result<Vec<u8>, String> {
    let bytes = match (f.datatype, v) {
        (dt::IPADDR, Value::Ipv4(a)) => a.octets().to_vec(),
        (dt::IP6ADDR, Value::Ipv6(a)) => a.octets().to_vec(),
        (dt::INET_PROTOCOL, Value::Proto(p)) => vec![p.number()],
        (dt::INET_SERVICE, Value::Port(p)) => p.to_be_bytes().to_vec(),
        (dt::NFPROTO, Value::NfProto(fam)) => vec![fam.nfproto()],
        (dt::MARK | dt::INTEGER | dt::CT_STATE | dt::CT_STATUS, Value::U32(n)) => {
            n.to_ne_bytes().to_vec()
        }
        _ => {
            return Err(format!(
                "value {v:?} does not fit a field of nft datatype {}",
                f.datatype
            ))
        }
    };
    debug_assert_eq!(bytes.len(), f.len);
    Ok(bytes)
}

/// A value in nft syntax, as a field of the given datatype.
pub fn value_text(f: Field, v: Value) -> String {
    match v {
        Value::Ipv4(a) => a.to_string(),
        Value::Ipv6(a) => a.to_string(),
        Value::Proto(p) => p.keyword().to_string(),
        Value::Port(p) => p.to_string(),
        Value::NfProto(Family::Ip) => "ipv4".into(),
        Value::NfProto(Family::Ip6) => "ipv6".into(),
        Value::NfProto(Family::Inet) => "inet".into(),
        Value::U32(n) if f.datatype == dt::INTEGER => n.to_string(),
        Value::U32(n) => format!("0x{n:08x}"),
    }
}

/// `type a . b` / `typeof x . y` text.
pub fn set_type_text(ty: &SetType, family: Family) -> String {
    match ty {
        SetType::Type(dts) => {
            let names: Vec<_> = dts.iter().map(|d| d.keyword()).collect();
            format!("type {}", names.join(" . "))
        }
        SetType::Typeof(exprs) => {
            let names: Vec<_> = exprs.iter().map(|e| e.text(family)).collect();
            format!("typeof {}", names.join(" . "))
        }
    }
}

/// The key or data `typeof` userdata attribute nft writes for a declaration, if any.
pub fn typeof_udata(u: &mut Udata, attr: u8, ty: &SetType) -> Result<(), String> {
    match ty {
        SetType::Type(dts) if dts.len() > 1 => {
            // nft records a concatenation with no sub-expressions for `type a . b`.
            u.nest(attr, |n| {
                n.put_u32(ud::TYPEOF_EXPR, expr_type::CONCAT);
                n.put(ud::TYPEOF_DATA, &[]);
            });
        }
        SetType::Type(_) => {}
        SetType::Typeof(exprs) if exprs.len() == 1 => {
            let mut inner = Udata::new();
            exprs[0].typeof_udata(&mut inner)?;
            u.put(attr, inner.as_bytes());
        }
        SetType::Typeof(exprs) => {
            let mut items = Udata::new();
            for (i, e) in exprs.iter().enumerate() {
                let mut one = Udata::new();
                e.typeof_udata(&mut one)?;
                items.put(i as u8, one.as_bytes());
            }
            u.nest(attr, |n| {
                n.put_u32(ud::TYPEOF_EXPR, expr_type::CONCAT);
                n.put(ud::TYPEOF_DATA, items.as_bytes());
            });
        }
    }
    Ok(())
}

/// The data `typeof` userdata nft writes for `: verdict` in a map declared with `typeof`: a
/// verdict expression, with no data of its own.
pub fn verdict_typeof_udata(u: &mut Udata) {
    u.nest(ud::DATA_TYPEOF, |n| {
        n.put_u32(ud::TYPEOF_EXPR, expr_type::VERDICT);
        n.put(ud::TYPEOF_DATA, &[]);
    });
}

/// Names of the bits set in a `ct state` / `ct status` value.
pub fn ct_bits_text(key: CtKey, bits: u32) -> String {
    let names: &[(u32, &str)] = match key {
        CtKey::State => &[
            (1, "invalid"),
            (2, "established"),
            (4, "related"),
            (8, "new"),
            (64, "untracked"),
        ],
        _ => &[
            (1, "expected"),
            (2, "seen-reply"),
            (4, "assured"),
            (8, "confirmed"),
            (16, "snat"),
            (32, "dnat"),
            (512, "dying"),
        ],
    };
    let mut out = String::new();
    let mut rest = bits;
    for (bit, name) in names {
        if bits & bit != 0 {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(name);
            rest &= !bit;
        }
    }
    if rest != 0 {
        if !out.is_empty() {
            out.push(',');
        }
        let _ = write!(out, "0x{rest:x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DataType::*, MetaKey, Payload};

    fn typeof_bytes(ty: &SetType) -> Vec<u8> {
        let mut u = Udata::new();
        typeof_udata(&mut u, ud::KEY_TYPEOF, ty).unwrap();
        u.as_bytes().to_vec()
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // Reference bytes captured from `nft --debug=mnl` 1.0.6 for the same declarations.
    #[test]
    fn typeof_concat_with_numgen_matches_nft() {
        let ty = SetType::Typeof(vec![
            Expr::Meta(MetaKey::L4Proto),
            Expr::Payload(Payload::ThDport),
            Expr::random(5),
        ]);
        assert_eq!(
            typeof_bytes(&ty),
            hex("034a00040d0000000142000e00040900000001060004100000000114000407000000010c00040b000000010402000000021a0004170000000112000401000000010405000000020400000000")
        );
    }

    #[test]
    fn typeof_single_payload_matches_nft() {
        let ty = SetType::Typeof(vec![Expr::Payload(Payload::IpSaddr)]);
        assert_eq!(
            typeof_bytes(&ty),
            hex("0314000407000000010c00040c00000001040b000000")
        );
    }

    // From `nft --debug=mnl` 1.0.6 for `typeof meta l4proto . th dport . numgen random mod 1
    // : verdict`: the data's attribute after the key's.
    #[test]
    fn typeof_verdict_data_matches_nft() {
        let mut u = Udata::new();
        verdict_typeof_udata(&mut u);
        assert_eq!(u.as_bytes(), hex("04080004010000000100"));
    }

    #[test]
    fn type_concat_records_empty_concat_like_nft() {
        let ty = SetType::Type(vec![Ipv4Addr, InetProto]);
        assert_eq!(typeof_bytes(&ty), hex("030800040d0000000100"));
    }

    #[test]
    fn concat_layout_pads_and_numbers_registers_like_nft() {
        let l = Layout::of(
            &SetType::Type(vec![Ipv4Addr, InetProto, InetService]),
            Family::Ip,
        );
        assert_eq!(l.len(), 12);
        assert_eq!(l.datatype(), 0x730d);
        assert_eq!(l.registers(), vec![1, 9, 10]);
        let l6 = Layout::of(&SetType::Type(vec![Ipv6Addr, InetService]), Family::Ip6);
        assert_eq!(l6.registers(), vec![1, 12]);
        assert_eq!(l6.len(), 20);
    }

    #[test]
    fn ct_bits_text_names_each_bit() {
        assert_eq!(ct_bits_text(CtKey::State, 6), "established,related");
        assert_eq!(ct_bits_text(CtKey::Status, 32), "dnat");
    }
}
