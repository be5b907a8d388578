//! Operations → one libnftnl batch: a contiguous buffer of netlink messages between a batch
//! begin and end, every message asking for an ACK, and a record of which object each
//! sequence number carries so a kernel error can name it.

use crate::model::TableRef;
use crate::model::*;
use crate::ops::Op;
use crate::sys::{self, NlChain, NlElem, NlExpr, NlObj, NlRule, NlSet, NlTable};
use crate::types::{encode_value, Layout};
use crate::udata::{set as ud, Udata};
use nftnl::nftnl_sys as nsys;
use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWOBJ: u16 = 18;
const NFT_MSG_DELOBJ: u16 = 20;

const F_ACK: u16 = libc::NLM_F_ACK as u16;
const F_CREATE: u16 = libc::NLM_F_CREATE as u16;
const F_APPEND: u16 = libc::NLM_F_APPEND as u16;

const NFT_SET_ANONYMOUS: u32 = 0x1;
const NFT_SET_CONSTANT: u32 = 0x2;
const NFT_SET_INTERVAL: u32 = 0x4;
const NFT_SET_MAP: u32 = 0x8;
const NFT_SET_TIMEOUT: u32 = 0x10;
const NFT_SET_EVAL: u32 = 0x20;
const NFT_SET_OBJECT: u32 = 0x40;
/// `NFT_DYNSET_OP_UPDATE`: add the key, or restart its timeout.
const NFT_DYNSET_OP_UPDATE: u32 = 1;
const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;
/// `NF_NAT_RANGE_PROTO_RANDOM_FULLY`: a masquerade's `fully-random`.
const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 0x10;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;

const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

/// Keeps a set-element message comfortably under the 64 KiB netlink attribute limit.
const ELEM_MSG_BUDGET: usize = 48 * 1024;

/// The object a message in a batch creates, deletes or flushes; how errors name their cause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRef {
    pub action: &'static str,
    pub what: String,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.action, self.what)
    }
}

/// Why a model could not be encoded (a value that does not fit its key, say).
#[derive(Debug, thiserror::Error)]
#[error("cannot encode {object}: {reason}")]
pub struct EncodeError {
    pub object: String,
    pub reason: String,
}

/// An encoded batch, ready to send.
pub struct Batch {
    buf: sys::BatchBuf,
    first_seq: u32,
    next_seq: u32,
    /// What each message creates, deletes or flushes, as errors name it ("add chain ip nodelb
    /// x"), one after the other, and where each starts: a `String` per message would cost an
    /// allocation per message at the peak of a full replace.
    descriptions: String,
    starts: Vec<u32>,
    next_set_id: u32,
}

impl Batch {
    pub fn new(first_seq: u32) -> Batch {
        let mut b = Batch {
            buf: sys::BatchBuf::default(),
            first_seq,
            next_seq: first_seq + 1,
            descriptions: String::new(),
            starts: Vec::new(),
            next_set_id: 1,
        };
        sys::append_batch_marker(&mut b.buf, true, first_seq);
        b
    }

    /// Encode operations into a finished batch.
    pub fn encode(first_seq: u32, ops: &[Op<'_>]) -> Result<Batch, EncodeError> {
        let mut b = Batch::new(first_seq);
        for op in ops {
            b.push_op(op)?;
        }
        b.finish();
        Ok(b)
    }

    /// A full replace of `tables` that consumes them: the declarations (table, counters,
    /// chains, sets) are encoded from tables stripped of rules and elements, then each chain's
    /// rules and each set's elements, which are dropped once encoded. The batch grows as the
    /// models shrink, so the two are never held whole at once. Rules and elements come after every declaration, which is
    /// valid: what they refer to is created before them in the same batch. `freed` is called
    /// as parts are dropped (an allocator may return the pages they held before the batch
    /// grows further).
    ///
    /// `learned`: what dynamic sets held before, per table, given back to the sets of the same
    /// name after their elements (a replace would otherwise empty them).
    pub fn encode_replace(
        first_seq: u32,
        mut tables: Vec<Table>,
        learned: &BTreeMap<TableRef, crate::model::LearnedElements>,
        freed: &mut dyn FnMut(),
    ) -> Result<Batch, EncodeError> {
        let mut elements: Vec<(usize, String, BTreeMap<Key, Element>)> = Vec::new();
        let mut rules: Vec<(usize, String, Vec<Rule>)> = Vec::new();
        for (i, t) in tables.iter_mut().enumerate() {
            for (name, set) in t.sets.iter_mut() {
                if !set.elements.is_empty() {
                    elements.push((i, name.clone(), std::mem::take(&mut set.elements)));
                }
            }
            for (name, chain) in t.chains.iter_mut() {
                if !chain.rules.is_empty() {
                    rules.push((i, name.clone(), std::mem::take(&mut chain.rules)));
                }
            }
        }
        let mut b = Batch::new(first_seq);
        // Declarations first (table, counters, chains, sets), then the rules, then the
        // elements, as `full_replace` orders them; what was encoded is dropped on the way
        // (the counter objects once declared: nothing after uses them).
        for t in tables.iter_mut() {
            for op in crate::ops::replace_ops(t) {
                b.push_op(&op)?;
            }
            t.counters = BTreeMap::new();
        }
        freed();
        let mut dropped = 0;
        for (i, chain, rs) in rules {
            let table = TableRef::of(&tables[i]);
            for (index, rule) in rs.iter().enumerate() {
                b.push_op(&Op::AddRule {
                    table: table.clone(),
                    chain: &chain,
                    index,
                    rule,
                })?;
            }
            dropped += rs.len();
            drop(rs);
            // Not after every chain: giving pages back walks the heap.
            if dropped >= 2048 {
                freed();
                dropped = 0;
            }
        }
        for (i, name, elems) in elements {
            let t = &tables[i];
            // Moved in: each element's memory is freed once it is encoded.
            let n = elems.len();
            let items = elems.into_iter().map(|(k, e)| (k, Some(e)));
            b.push_elems(&TableRef::of(t), &t.sets[&name], n, items, true)?;
            freed();
        }
        for t in &tables {
            let Some(sets) = learned.get(&TableRef::of(t)) else {
                continue;
            };
            for (name, elems) in sets {
                if let Some(set) = t.sets.get(name).filter(|s| s.is_dynamic()) {
                    b.push_op(&Op::RestoreElems {
                        table: TableRef::of(t),
                        set,
                        learned: elems,
                    })?;
                }
            }
        }
        drop(tables);
        freed();
        b.finish();
        Ok(b)
    }

    fn finish(&mut self) {
        let seq = self.next_seq;
        sys::append_batch_marker(&mut self.buf, false, seq);
        self.next_seq += 1;
    }

    /// The bytes to send, in pieces (see [`sys::BatchBuf`]).
    pub fn pieces(&self) -> &[Vec<u8>] {
        self.buf.pieces()
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Messages carrying objects (batch markers excluded).
    pub fn message_count(&self) -> usize {
        self.starts.len()
    }

    pub fn first_seq(&self) -> u32 {
        self.first_seq
    }

    /// Sequence numbers of the messages that expect an ACK.
    pub fn acked_seqs(&self) -> std::ops::Range<u32> {
        self.first_seq + 1..self.first_seq + 1 + self.starts.len() as u32
    }

    /// The object a sequence number carries.
    pub fn object(&self, seq: u32) -> Option<&str> {
        let i = seq.checked_sub(self.first_seq + 1)? as usize;
        let start = *self.starts.get(i)? as usize;
        let end = self
            .starts
            .get(i + 1)
            .map_or(self.descriptions.len(), |e| *e as usize);
        Some(&self.descriptions[start..end])
    }

    /// The sequence number one past this batch, for the next one.
    pub fn end_seq(&self) -> u32 {
        self.next_seq
    }

    fn msg(
        &mut self,
        ty: u16,
        family: Family,
        flags: u16,
        payload: sys::Payload<'_>,
        obj: ObjectRef,
    ) {
        let seq = self.next_seq;
        sys::append_msg(
            &mut self.buf,
            ty,
            family.nfproto(),
            flags | F_ACK,
            seq,
            payload,
        );
        self.next_seq += 1;
        self.starts.push(self.descriptions.len() as u32);
        let _ = write!(self.descriptions, "{obj}");
    }

    fn push_op(&mut self, op: &Op<'_>) -> Result<(), EncodeError> {
        match op {
            Op::AddTable(t) => self.push_table(t, true),
            Op::DelTable(t) => self.push_table(t, false),
            Op::AddChain(t, c) => self.push_add_chain(t, c),
            Op::FlushChain(t, name) => {
                let r = NlRule::with(t.family.nfproto(), &t.name, name);
                self.msg(
                    NFT_MSG_DELRULE,
                    t.family,
                    0,
                    sys::Payload::Rule(&r),
                    obj("flush", format!("chain {t} {name}")),
                );
            }
            Op::DelChain(t, name) => {
                let nc = NlChain::with(t.family.nfproto(), &t.name, name);
                self.msg(
                    NFT_MSG_DELCHAIN,
                    t.family,
                    0,
                    sys::Payload::Chain(&nc),
                    obj("delete", format!("chain {t} {name}")),
                );
            }
            Op::AddRule {
                table,
                chain,
                index,
                rule,
            } => self.push_rule(table, chain, *index, rule)?,
            Op::AddSet(t, s) => self.push_add_set(t, s)?,
            Op::DelSet(t, name) => {
                let ns = NlSet::with(t.family.nfproto(), &t.name, name);
                self.msg(
                    NFT_MSG_DELSET,
                    t.family,
                    0,
                    sys::Payload::Set(&ns),
                    obj("delete", format!("set {t} {name}")),
                );
            }
            Op::AddElems { table, set, elems } => {
                let items = elems.iter().map(|(k, e)| (*k, Some(*e)));
                self.push_elems(table, set, elems.len(), items, true)?;
            }
            Op::DelElems { table, set, keys } => {
                let items = keys.iter().map(|k| (*k, None::<&Element>));
                self.push_elems(table, set, keys.len(), items, false)?;
            }
            Op::RestoreElems {
                table,
                set,
                learned,
            } => self.push_learned(table, set, learned),
            Op::AddCounter(t, c) => self.push_add_counter(t, c),
            Op::DelCounter(t, name) => {
                let o = NlObj::counter(t.family.nfproto(), &t.name, name);
                self.msg(
                    NFT_MSG_DELOBJ,
                    t.family,
                    0,
                    sys::Payload::Obj(&o),
                    obj("delete", format!("counter {t} {name}")),
                );
            }
        }
        Ok(())
    }

    fn push_table(&mut self, t: &TableRef, add: bool) {
        let nt = NlTable::with(t.family.nfproto(), &t.name);
        let (ty, flags, verb) = if add {
            (NFT_MSG_NEWTABLE, F_CREATE, "add")
        } else {
            (NFT_MSG_DELTABLE, 0, "delete")
        };
        self.msg(
            ty,
            t.family,
            flags,
            sys::Payload::Table(&nt),
            obj(verb, format!("table {t}")),
        );
    }

    fn push_add_chain(&mut self, t: &TableRef, c: &Chain) {
        let nc = NlChain::with(t.family.nfproto(), &t.name, &c.name);
        if let Some(b) = &c.base {
            let policy = match b.policy {
                Policy::Accept => NF_ACCEPT as u32,
                Policy::Drop => NF_DROP as u32,
            };
            nc.set_base(b.chain_type.keyword(), b.hook.number(), b.priority, policy);
        }
        self.msg(
            NFT_MSG_NEWCHAIN,
            t.family,
            F_CREATE,
            sys::Payload::Chain(&nc),
            obj("add", format!("chain {t} {}", c.name)),
        );
    }

    fn push_add_set(&mut self, t: &TableRef, s: &Set) -> Result<(), EncodeError> {
        let id = self.set_id();
        let ns = encode_set_decl(t, s, id)?;
        let kind = if s.data.is_some() { "map" } else { "set" };
        self.msg(
            NFT_MSG_NEWSET,
            t.family,
            F_CREATE,
            sys::Payload::Set(&ns),
            obj("add", format!("{kind} {t} {}", s.name)),
        );
        Ok(())
    }

    fn push_add_counter(&mut self, t: &TableRef, c: &Counter) {
        let o = NlObj::counter(t.family.nfproto(), &t.name, &c.name);
        o.set_counts(c.packets, c.bytes);
        if let Some(comment) = &c.comment {
            o.userdata(Udata::comment(comment).as_bytes());
        }
        self.msg(
            NFT_MSG_NEWOBJ,
            t.family,
            F_CREATE,
            sys::Payload::Obj(&o),
            obj("add", format!("counter {t} {}", c.name)),
        );
    }

    fn set_id(&mut self) -> u32 {
        let id = self.next_set_id;
        self.next_set_id += 1;
        id
    }

    /// `n` elements of `set` (borrowed, or moved in and dropped once encoded).
    fn push_elems<K: std::borrow::Borrow<Key>, E: std::borrow::Borrow<Element>>(
        &mut self,
        t: &TableRef,
        set: &Set,
        n: usize,
        items: impl Iterator<Item = (K, Option<E>)>,
        add: bool,
    ) -> Result<(), EncodeError> {
        let key_layout = Layout::of(&set.key, t.family);
        let data_layout = match &set.data {
            Some(MapData::Value(ty)) => Some(Layout::of(ty, t.family)),
            _ => None,
        };
        let what = |n: usize| format!("{n} elements of set {t} {}", set.name);
        let action = if add { "add" } else { "delete" };
        // Elements are encoded a message at a time (each message stays under the attribute
        // size limit), so a large set is never staged whole.
        let mut chunk: Vec<EncodedElem> = Vec::new();
        let mut size = 0;
        let flush = |b: &mut Batch, chunk: &mut Vec<EncodedElem>, size: &mut usize| {
            if !chunk.is_empty() {
                b.push_elems_msg(t, &set.name, chunk, action);
            }
            chunk.clear();
            *size = 0;
        };
        let push =
            |b: &mut Batch, el: EncodedElem, chunk: &mut Vec<EncodedElem>, size: &mut usize| {
                if !chunk.is_empty() && *size + el.size() > ELEM_MSG_BUDGET {
                    flush(b, chunk, size);
                }
                *size += el.size();
                chunk.push(el);
            };
        for (k, e) in items {
            let invalid = |reason| EncodeError {
                object: what(n),
                reason,
            };
            let (key, end) = encode_key(k.borrow(), set, &key_layout).map_err(invalid)?;
            let e = e.as_ref().map(|e| e.borrow());
            let mut el = EncodedElem {
                key,
                comment: e.and_then(|e| e.comment.clone()),
                ..Default::default()
            };
            if let Some(e) = e {
                encode_elem_data(&mut el, e, data_layout.as_ref(), set).map_err(invalid)?;
            }
            push(self, el, &mut chunk, &mut size);
            if let Some(end) = end {
                let el = EncodedElem {
                    key: end,
                    flags: NFT_SET_ELEM_INTERVAL_END,
                    ..Default::default()
                };
                push(self, el, &mut chunk, &mut size);
            }
        }
        flush(self, &mut chunk, &mut size);
        Ok(())
    }

    /// Elements a dynamic set learned, each expiring when it would have (never later than the
    /// set's timeout from now: the kernel refuses that). Keys that do not fit the set (it was
    /// declared anew) are left out.
    fn push_learned(&mut self, t: &TableRef, set: &Set, learned: &[crate::model::Learned]) {
        let Some(timeout) = set.timeout else {
            return;
        };
        let len = Layout::of(&set.key, t.family).len();
        let elems: Vec<EncodedElem> = learned
            .iter()
            .filter(|l| l.key.len() == len)
            .map(|l| EncodedElem {
                key: l.key.clone(),
                expiration: Some(l.expires.min(timeout).as_millis() as u64),
                ..Default::default()
            })
            .collect();
        for chunk in chunks(&elems) {
            self.push_elems_msg(t, &set.name, chunk, "restore");
        }
    }

    /// One message of elements of `set`: added (`add`, `restore`) or deleted (`delete`).
    fn push_elems_msg(
        &mut self,
        t: &TableRef,
        set: &str,
        elems: &[EncodedElem],
        action: &'static str,
    ) {
        let (ty, flags) = match action {
            "delete" => (NFT_MSG_DELSETELEM, 0),
            _ => (NFT_MSG_NEWSETELEM, F_CREATE),
        };
        let ns = NlSet::with(t.family.nfproto(), &t.name, set);
        for el in elems {
            ns.add(el.to_nl());
        }
        let what = format!("{} elements of set {t} {set}", elems.len());
        self.msg(
            ty,
            t.family,
            flags,
            sys::Payload::SetElems(&ns),
            obj(action, what),
        );
    }

    fn push_rule(
        &mut self,
        t: &TableRef,
        chain: &str,
        index: usize,
        rule: &Rule,
    ) -> Result<(), EncodeError> {
        let what = || match &rule.comment {
            Some(c) => format!("rule {index} of chain {t} {chain} ({c:?})"),
            None => format!("rule {index} of chain {t} {chain}"),
        };
        let nr = NlRule::with(t.family.nfproto(), &t.name, chain);
        let mut ctx = RuleCtx {
            family: t.family,
            l4: None,
            nf: None,
        };
        for s in &rule.stmts {
            ctx.stmt(self, t, &nr, s).map_err(|reason| EncodeError {
                object: what(),
                reason,
            })?;
        }
        if let Some(c) = &rule.comment {
            nr.set_userdata(Udata::comment(c).as_bytes());
        }
        self.msg(
            NFT_MSG_NEWRULE,
            t.family,
            F_CREATE | F_APPEND,
            sys::Payload::Rule(&nr),
            obj("add", what()),
        );
        Ok(())
    }
}

fn obj(action: &'static str, what: String) -> ObjectRef {
    ObjectRef { action, what }
}

/// Encoded elements cut into runs that each fit one message.
fn chunks(elems: &[EncodedElem]) -> Vec<&[EncodedElem]> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, e) in elems.iter().enumerate() {
        if i > start && size + e.size() > ELEM_MSG_BUDGET {
            out.push(&elems[start..i]);
            (start, size) = (i, 0);
        }
        size += e.size();
    }
    if start < elems.len() {
        out.push(&elems[start..]);
    }
    out
}

#[derive(Default)]
struct EncodedElem {
    key: Vec<u8>,
    flags: u32,
    data: Option<Vec<u8>>,
    verdict: Option<Verdict>,
    /// The counter object a `: counter` map element names.
    counter: Option<String>,
    comment: Option<std::sync::Arc<str>>,
    /// Milliseconds left before the element expires (a learned element carried over).
    expiration: Option<u64>,
}

impl EncodedElem {
    fn size(&self) -> usize {
        64 + self.key.len()
            + self.data.as_ref().map_or(0, |d| d.len())
            + self
                .verdict
                .as_ref()
                .and_then(|v| v.target())
                .map_or(0, |c| c.len() + 8)
            + self.counter.as_ref().map_or(0, |c| c.len() + 8)
            + self.comment.as_ref().map_or(0, |c| c.len() + 8)
    }

    fn to_nl(&self) -> NlElem {
        let mut e = NlElem::new().bytes(nsys::NFTNL_SET_ELEM_KEY, &self.key);
        if self.flags != 0 {
            e = e.u32(nsys::NFTNL_SET_ELEM_FLAGS, self.flags);
        }
        if let Some(d) = &self.data {
            e = e.bytes(nsys::NFTNL_SET_ELEM_DATA, d);
        }
        if let Some(v) = &self.verdict {
            e = e.u32(nsys::NFTNL_SET_ELEM_VERDICT, verdict_code(v) as u32);
            if let Some(c) = v.target() {
                e = e.str(nsys::NFTNL_SET_ELEM_CHAIN, c);
            }
        }
        if let Some(c) = &self.comment {
            e = e.bytes(nsys::NFTNL_SET_ELEM_USERDATA, Udata::comment(c).as_bytes());
        }
        if let Some(c) = &self.counter {
            e = e.str(nsys::NFTNL_SET_ELEM_OBJREF, c);
        }
        if let Some(ms) = self.expiration {
            e = e.u64(nsys::NFTNL_SET_ELEM_EXPIRATION, ms);
        }
        e
    }
}

/// First address of a prefix and the first address after it (`None` past the top).
/// An element's key, and the end of its interval for a prefix.
fn encode_key(k: &Key, set: &Set, layout: &Layout) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
    match k {
        Key::Values(vals) => Ok((layout.encode(vals)?, None)),
        Key::Prefix(addr, len) => {
            if !set.interval {
                return Err(format!(
                    "prefix {addr}/{len} in a set without flags interval"
                ));
            }
            let (start, end) = prefix_bounds(*addr, *len);
            if start.len() != layout.len() {
                return Err(format!("prefix {addr}/{len} does not fit the set's key"));
            }
            Ok((start, end))
        }
    }
}

/// An element's data, checked against the set's declaration.
fn encode_elem_data(
    el: &mut EncodedElem,
    e: &Element,
    layout: Option<&Layout>,
    set: &Set,
) -> Result<(), String> {
    match (&e.data, layout, &set.data) {
        (Some(ElemData::Verdict(v)), _, Some(MapData::Verdict)) => el.verdict = Some(v.clone()),
        (Some(ElemData::Counter(name)), _, Some(MapData::Counter)) => {
            el.counter = Some(name.clone())
        }
        (Some(ElemData::Values(vals)), Some(l), _) => el.data = Some(l.encode(vals)?),
        (None, None, None) => {}
        (d, _, _) => {
            return Err(format!(
                "element data {d:?} does not match the set's declaration"
            ))
        }
    }
    Ok(())
}

fn verdict_code(v: &Verdict) -> i32 {
    match v {
        Verdict::Accept => NF_ACCEPT,
        Verdict::Drop => NF_DROP,
        Verdict::Return => NFT_RETURN,
        Verdict::Jump(_) => NFT_JUMP,
        Verdict::Goto(_) => NFT_GOTO,
    }
}

fn encode_set_decl(t: &TableRef, s: &Set, id: u32) -> Result<NlSet, EncodeError> {
    let err = |reason: String| EncodeError {
        object: format!("set {t} {}", s.name),
        reason,
    };
    let key = Layout::of(&s.key, t.family);
    let ns = NlSet::with(t.family.nfproto(), &t.name, &s.name);
    let mut flags = 0;
    if s.interval {
        flags |= NFT_SET_INTERVAL;
    }
    // `flags dynamic,timeout` and the default timeout. nft gives a set an `update` names a
    // size of 65535 when none is said, and the kernel sizes the set's first hash table from
    // the size (as a 16-bit number): 65535 allocates about 2 MiB up front. Without a size the
    // table starts small and grows, and the kernel caps the set at 65535 once a rule updates
    // it; a size given here (a multiple of 65536 reads as no hint) raises that cap.
    if let Some(timeout) = s.timeout {
        flags |= NFT_SET_TIMEOUT | NFT_SET_EVAL;
        ns.u64(nsys::NFTNL_SET_TIMEOUT, timeout.as_millis() as u64);
    }
    if let Some(size) = s.size {
        ns.u32(nsys::NFTNL_SET_DESC_SIZE, size);
    }
    match s.data {
        Some(MapData::Counter) => flags |= NFT_SET_OBJECT,
        Some(_) => flags |= NFT_SET_MAP,
        None => {}
    }
    ns.u32(nsys::NFTNL_SET_FLAGS, flags);
    ns.u32(nsys::NFTNL_SET_KEY_TYPE, key.datatype());
    ns.u32(nsys::NFTNL_SET_KEY_LEN, key.len() as u32);
    let mut u = Udata::new();
    u.put_u32(ud::KEYBYTEORDER, key.byteorder() as u32);
    match &s.data {
        None => {}
        Some(MapData::Verdict) => {
            ns.u32(nsys::NFTNL_SET_DATA_TYPE, crate::types::dt::VERDICT_DATA);
            ns.u32(nsys::NFTNL_SET_DATA_LEN, 0);
            u.put_u32(ud::DATABYTEORDER, 0);
        }
        Some(MapData::Value(ty)) => {
            let data = Layout::of(ty, t.family);
            ns.u32(nsys::NFTNL_SET_DATA_TYPE, data.datatype());
            ns.u32(nsys::NFTNL_SET_DATA_LEN, data.len() as u32);
            u.put_u32(ud::DATABYTEORDER, data.byteorder() as u32);
        }
        Some(MapData::Counter) => ns.u32(nsys::NFTNL_SET_OBJ_TYPE, sys::OBJECT_COUNTER),
    }
    crate::types::typeof_udata(&mut u, ud::KEY_TYPEOF, &s.key).map_err(err)?;
    match (&s.key, &s.data) {
        (_, Some(MapData::Value(ty))) => {
            crate::types::typeof_udata(&mut u, ud::DATA_TYPEOF, ty).map_err(err)?
        }
        // A map declared with `typeof` records its verdict data as one too (nft cannot list
        // the elements of one that does not).
        (SetType::Typeof(_), Some(MapData::Verdict)) => crate::types::verdict_typeof_udata(&mut u),
        _ => {}
    }
    if matches!(s.data, Some(MapData::Verdict | MapData::Value(_))) {
        u.put_u32(ud::DATA_INTERVAL, 0);
    }
    if let Some(c) = &s.comment {
        u.put_strz(ud::COMMENT, c);
    }
    ns.userdata(u.as_bytes());
    ns.u32(nsys::NFTNL_SET_ID, id);
    Ok(ns)
}

/// What a rule has established so far, so dependencies are emitted once, as nft does.
struct RuleCtx {
    family: Family,
    l4: Option<L4Proto>,
    nf: Option<Family>,
}

impl RuleCtx {
    fn dependency(&mut self, nr: &NlRule, e: Expr) {
        let (l4, nf) = match e {
            Expr::Payload(p) => {
                let d = p.desc();
                (d.l4_dependency, d.nf_dependency)
            }
            _ => (None, None),
        };
        if let Some(fam) = nf {
            if self.family == Family::Inet && self.nf != Some(fam) {
                nr.add(meta_load(MetaKey::NfProto, NFT_REG_1));
                nr.add(cmp(NFT_REG_1, 0, &[fam.nfproto()]));
                self.nf = Some(fam);
            }
        }
        if let Some(p) = l4 {
            if self.l4 != Some(p) {
                nr.add(meta_load(MetaKey::L4Proto, NFT_REG_1));
                nr.add(cmp(NFT_REG_1, 0, &[p.number()]));
                self.l4 = Some(p);
            }
        }
    }

    fn load(&self, e: Expr, reg: u32) -> NlExpr {
        match e {
            Expr::Payload(p) => {
                let d = p.desc();
                NlExpr::new("payload")
                    .u32(nsys::NFTNL_EXPR_PAYLOAD_DREG, reg)
                    .u32(nsys::NFTNL_EXPR_PAYLOAD_BASE, d.base)
                    .u32(nsys::NFTNL_EXPR_PAYLOAD_OFFSET, d.offset)
                    .u32(nsys::NFTNL_EXPR_PAYLOAD_LEN, d.field.len as u32)
            }
            Expr::Meta(k) => meta_load(k, reg),
            Expr::Ct(k) => {
                let mut x = NlExpr::new("ct")
                    .u32(nsys::NFTNL_EXPR_CT_DREG, reg)
                    .u32(nsys::NFTNL_EXPR_CT_KEY, k.number(self.family));
                if k.is_original() {
                    x = x.bytes(nsys::NFTNL_EXPR_CT_DIR, &[0]);
                }
                x
            }
            Expr::Numgen { modulus, offset } => NlExpr::new("numgen")
                .u32(nsys::NFTNL_EXPR_NG_DREG, reg)
                .u32(nsys::NFTNL_EXPR_NG_MODULUS, modulus)
                .u32(nsys::NFTNL_EXPR_NG_TYPE, 1)
                .u32(nsys::NFTNL_EXPR_NG_OFFSET, offset),
        }
    }

    /// Load a (possibly concatenated) key into registers starting at `NFT_REG_1`.
    fn cmp_stmt(
        &mut self,
        nr: &NlRule,
        left: &Expr,
        op: &CmpOp,
        right: &Value,
    ) -> Result<(), String> {
        self.dependency(nr, *left);
        let data = encode_value(left.field(self.family), *right)?;
        nr.add(self.load(*left, NFT_REG_1));
        let op_code = match op {
            CmpOp::Eq => 0,
            CmpOp::Neq => 1,
        };
        nr.add(cmp(NFT_REG_1, op_code, &data));
        if *op == CmpOp::Eq {
            match (left, right) {
                (
                    Expr::Meta(MetaKey::L4Proto)
                    | Expr::Payload(Payload::IpProtocol | Payload::Ip6Nexthdr),
                    Value::Proto(p),
                ) => self.l4 = Some(*p),
                (Expr::Meta(MetaKey::NfProto), Value::NfProto(f)) => self.nf = Some(*f),
                _ => {}
            }
        }
        Ok(())
    }

    /// An anonymous verdict map, declared and filled in messages of its own before the rule.
    fn anon_vmap(
        &mut self,
        b: &mut Batch,
        t: &TableRef,
        nr: &NlRule,
        keys: &[Expr],
        map: &AnonVmap,
    ) -> Result<(), String> {
        let layout = self.load_keys(nr, keys);
        let id = b.set_id();
        let name = "__map%d";
        let ns = NlSet::with(t.family.nfproto(), &t.name, name);
        ns.u32(
            nsys::NFTNL_SET_FLAGS,
            NFT_SET_ANONYMOUS | NFT_SET_CONSTANT | NFT_SET_MAP,
        );
        ns.u32(nsys::NFTNL_SET_KEY_TYPE, layout.datatype());
        ns.u32(nsys::NFTNL_SET_KEY_LEN, layout.len() as u32);
        ns.u32(nsys::NFTNL_SET_DATA_TYPE, crate::types::dt::VERDICT_DATA);
        ns.u32(nsys::NFTNL_SET_DATA_LEN, 0);
        ns.u32(nsys::NFTNL_SET_ID, id);
        ns.u32(nsys::NFTNL_SET_DESC_SIZE, map.elements.len() as u32);
        let mut u = Udata::new();
        u.put_u32(ud::KEYBYTEORDER, layout.byteorder() as u32);
        u.put_u32(ud::DATABYTEORDER, 0);
        ns.userdata(u.as_bytes());
        b.msg(
            NFT_MSG_NEWSET,
            t.family,
            F_CREATE,
            sys::Payload::Set(&ns),
            obj("add", format!("anonymous map in {t}")),
        );
        let elems = NlSet::with(t.family.nfproto(), &t.name, name);
        elems.u32(nsys::NFTNL_SET_ID, id);
        for (k, v) in &map.elements {
            let key = layout.encode(k.iter().copied())?;
            elems.add(
                EncodedElem {
                    key,
                    verdict: Some(v.clone()),
                    ..Default::default()
                }
                .to_nl(),
            );
        }
        b.msg(
            NFT_MSG_NEWSETELEM,
            t.family,
            F_CREATE,
            sys::Payload::SetElems(&elems),
            obj("add", format!("elements of anonymous map in {t}")),
        );
        nr.add(
            NlExpr::new("lookup")
                .u32(nsys::NFTNL_EXPR_LOOKUP_SREG, NFT_REG_1)
                .str(nsys::NFTNL_EXPR_LOOKUP_SET, name)
                .u32(nsys::NFTNL_EXPR_LOOKUP_SET_ID, id)
                .u32(nsys::NFTNL_EXPR_LOOKUP_DREG, NFT_REG_VERDICT),
        );
        Ok(())
    }

    fn nat_map(&mut self, nr: &NlRule, kind: &NatKind, keys: &[Expr], map: &str) {
        self.load_keys(nr, keys);
        nr.add(
            NlExpr::new("lookup")
                .u32(nsys::NFTNL_EXPR_LOOKUP_SREG, NFT_REG_1)
                .str(nsys::NFTNL_EXPR_LOOKUP_SET, map)
                .u32(nsys::NFTNL_EXPR_LOOKUP_DREG, NFT_REG_1),
        );
        let fam = if self.family == Family::Ip6 {
            Family::Ip6
        } else {
            Family::Ip
        };
        let port_reg = if fam == Family::Ip6 { 8 + 4 } else { 8 + 1 };
        nr.add(
            nat(*kind, fam)
                .u32(nsys::NFTNL_EXPR_NAT_REG_ADDR_MIN, NFT_REG_1)
                .u32(nsys::NFTNL_EXPR_NAT_REG_PROTO_MIN, port_reg),
        );
    }

    fn reject(&mut self, nr: &NlRule, r: &Reject) {
        let (ty, code) = match (r, self.family) {
            // NFT_REJECT_ICMP_UNREACH with the family's own port-unreachable code.
            (Reject::PortUnreachable, Family::Ip) => (0, 3),
            (Reject::PortUnreachable, Family::Ip6) => (0, 4),
            // In inet, nft uses the family's own code once the rule has fixed the family,
            // and NFT_REJECT_ICMPX_UNREACH / ICMPX_PORT_UNREACH otherwise.
            (Reject::PortUnreachable, Family::Inet) => match self.nf {
                Some(Family::Ip) => (0, 3),
                Some(Family::Ip6) => (0, 4),
                _ => (2, 1),
            },
            (Reject::TcpReset, _) => {
                if self.l4 != Some(L4Proto::Tcp) {
                    nr.add(meta_load(MetaKey::L4Proto, NFT_REG_1));
                    nr.add(cmp(NFT_REG_1, 0, &[L4Proto::Tcp.number()]));
                    self.l4 = Some(L4Proto::Tcp);
                }
                (1, 0)
            }
        };
        nr.add(
            NlExpr::new("reject")
                .u32(nsys::NFTNL_EXPR_REJECT_TYPE, ty)
                .bytes(nsys::NFTNL_EXPR_REJECT_CODE, &[code]),
        );
    }

    fn load_keys(&mut self, nr: &NlRule, keys: &[Expr]) -> Layout {
        for k in keys {
            self.dependency(nr, *k);
        }
        let layout = Layout::of_exprs(keys, self.family);
        for (k, reg) in keys.iter().zip(layout.registers()) {
            nr.add(self.load(*k, reg));
        }
        layout
    }

    fn stmt(&mut self, b: &mut Batch, t: &TableRef, nr: &NlRule, s: &Stmt) -> Result<(), String> {
        match s {
            Stmt::Cmp { left, op, right } => self.cmp_stmt(nr, left, op, right)?,
            Stmt::Masked { left, mask, value } => {
                nr.add(self.load(*left, NFT_REG_1));
                nr.add(bitwise(*mask, 0));
                nr.add(cmp(NFT_REG_1, 0, &value.to_ne_bytes()));
            }
            Stmt::AnyBits { left, bits } => {
                nr.add(self.load(*left, NFT_REG_1));
                nr.add(bitwise(*bits, 0));
                nr.add(cmp(NFT_REG_1, 1, &0u32.to_ne_bytes()));
            }
            Stmt::Lookup { keys, set, negate } => {
                self.load_keys(nr, keys);
                let mut x = NlExpr::new("lookup")
                    .u32(nsys::NFTNL_EXPR_LOOKUP_SREG, NFT_REG_1)
                    .str(nsys::NFTNL_EXPR_LOOKUP_SET, set);
                if *negate {
                    x = x.u32(nsys::NFTNL_EXPR_LOOKUP_FLAGS, 1);
                }
                nr.add(x);
            }
            Stmt::Vmap { keys, map } => {
                self.load_keys(nr, keys);
                nr.add(
                    NlExpr::new("lookup")
                        .u32(nsys::NFTNL_EXPR_LOOKUP_SREG, NFT_REG_1)
                        .str(nsys::NFTNL_EXPR_LOOKUP_SET, map)
                        .u32(nsys::NFTNL_EXPR_LOOKUP_DREG, NFT_REG_VERDICT),
                );
            }
            Stmt::AnonVmap { keys, map } => self.anon_vmap(b, t, nr, keys, map)?,
            Stmt::Counter { packets, bytes } => nr.add(counter(*packets, *bytes)),
            Stmt::CounterRef(name) => nr.add(counter_ref(name)),
            Stmt::CounterMap { keys, map } => {
                self.load_keys(nr, keys);
                nr.add(
                    NlExpr::new("objref")
                        .u32(nsys::NFTNL_EXPR_OBJREF_SET_SREG, NFT_REG_1)
                        .str(nsys::NFTNL_EXPR_OBJREF_SET_NAME, map),
                );
            }
            Stmt::SetUpdate { keys, set, timeout } => {
                self.load_keys(nr, keys);
                nr.add(set_update(set, *timeout));
            }
            Stmt::Nat { kind, addr, port } => nat_stmt(nr, kind, addr, port),
            Stmt::NatMap { kind, keys, map } => self.nat_map(nr, kind, keys, map),
            Stmt::Masquerade { fully_random } => nr.add(masquerade(*fully_random)),
            Stmt::Reject(r) => self.reject(nr, r),
            Stmt::MarkOr(bits) => mark_or(nr, *bits),
            Stmt::Verdict(v) => nr.add(verdict(v)),
        }
        Ok(())
    }
}

fn counter(packets: u64, bytes: u64) -> NlExpr {
    NlExpr::new("counter")
        .u64(nsys::NFTNL_EXPR_CTR_PACKETS, packets)
        .u64(nsys::NFTNL_EXPR_CTR_BYTES, bytes)
}

fn counter_ref(name: &str) -> NlExpr {
    NlExpr::new("objref")
        .u32(nsys::NFTNL_EXPR_OBJREF_IMM_TYPE, sys::OBJECT_COUNTER)
        .str(nsys::NFTNL_EXPR_OBJREF_IMM_NAME, name)
}

/// Adds the key in register 1 to dynamic set `set`, or refreshes it.
fn set_update(set: &str, timeout: Option<std::time::Duration>) -> NlExpr {
    let mut x = NlExpr::new("dynset")
        .u32(nsys::NFTNL_EXPR_DYNSET_SREG_KEY, NFT_REG_1)
        .u32(nsys::NFTNL_EXPR_DYNSET_OP, NFT_DYNSET_OP_UPDATE)
        .str(nsys::NFTNL_EXPR_DYNSET_SET_NAME, set);
    if let Some(t) = timeout {
        x = x.u64(nsys::NFTNL_EXPR_DYNSET_TIMEOUT, t.as_millis() as u64);
    }
    x
}

fn masquerade(fully_random: bool) -> NlExpr {
    let mut x = NlExpr::new("masq");
    if fully_random {
        x = x.u32(nsys::NFTNL_EXPR_MASQ_FLAGS, NF_NAT_RANGE_PROTO_RANDOM_FULLY);
    }
    x
}

/// `meta mark set mark | bits`.
fn mark_or(nr: &NlRule, bits: u32) {
    nr.add(meta_load(MetaKey::Mark, NFT_REG_1));
    nr.add(bitwise(!bits, bits));
    nr.add(
        NlExpr::new("meta")
            .u32(nsys::NFTNL_EXPR_META_KEY, MetaKey::Mark.number())
            .u32(nsys::NFTNL_EXPR_META_SREG, NFT_REG_1),
    );
}

fn verdict(v: &Verdict) -> NlExpr {
    let mut x = NlExpr::new("immediate")
        .u32(nsys::NFTNL_EXPR_IMM_DREG, NFT_REG_VERDICT)
        .u32(nsys::NFTNL_EXPR_IMM_VERDICT, verdict_code(v) as u32);
    if let Some(c) = v.target() {
        x = x.str(nsys::NFTNL_EXPR_IMM_CHAIN, c);
    }
    x
}

fn nat_stmt(nr: &NlRule, kind: &NatKind, addr: &std::net::IpAddr, port: &Option<u16>) {
    let (fam, bytes) = match addr {
        std::net::IpAddr::V4(a) => (Family::Ip, a.octets().to_vec()),
        std::net::IpAddr::V6(a) => (Family::Ip6, a.octets().to_vec()),
    };
    nr.add(immediate(NFT_REG_1, &bytes));
    let mut x = nat(*kind, fam).u32(nsys::NFTNL_EXPR_NAT_REG_ADDR_MIN, NFT_REG_1);
    if let Some(p) = port {
        nr.add(immediate(NFT_REG_2, &p.to_be_bytes()));
        x = x
            .u32(nsys::NFTNL_EXPR_NAT_REG_PROTO_MIN, NFT_REG_2)
            .u32(nsys::NFTNL_EXPR_NAT_FLAGS, 0x2); // NF_NAT_RANGE_PROTO_SPECIFIED
    }
    nr.add(x);
}

fn meta_load(k: MetaKey, reg: u32) -> NlExpr {
    NlExpr::new("meta")
        .u32(nsys::NFTNL_EXPR_META_KEY, k.number())
        .u32(nsys::NFTNL_EXPR_META_DREG, reg)
}

fn cmp(reg: u32, op: u32, data: &[u8]) -> NlExpr {
    NlExpr::new("cmp")
        .u32(nsys::NFTNL_EXPR_CMP_SREG, reg)
        .u32(nsys::NFTNL_EXPR_CMP_OP, op)
        .bytes(nsys::NFTNL_EXPR_CMP_DATA, data)
}

fn bitwise(mask: u32, xor: u32) -> NlExpr {
    NlExpr::new("bitwise")
        .u32(nsys::NFTNL_EXPR_BITWISE_SREG, NFT_REG_1)
        .u32(nsys::NFTNL_EXPR_BITWISE_DREG, NFT_REG_1)
        .u32(nsys::NFTNL_EXPR_BITWISE_LEN, 4)
        .bytes(nsys::NFTNL_EXPR_BITWISE_MASK, &mask.to_ne_bytes())
        .bytes(nsys::NFTNL_EXPR_BITWISE_XOR, &xor.to_ne_bytes())
}

fn immediate(reg: u32, data: &[u8]) -> NlExpr {
    NlExpr::new("immediate")
        .u32(nsys::NFTNL_EXPR_IMM_DREG, reg)
        .bytes(nsys::NFTNL_EXPR_IMM_DATA, data)
}

fn nat(kind: NatKind, fam: Family) -> NlExpr {
    let ty = match kind {
        NatKind::Snat => 0,
        NatKind::Dnat => 1,
    };
    NlExpr::new("nat")
        .u32(nsys::NFTNL_EXPR_NAT_TYPE, ty)
        .u32(nsys::NFTNL_EXPR_NAT_FAMILY, fam.nfproto() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Chain;

    #[test]
    fn each_message_of_a_batch_is_named_by_its_sequence_number() {
        let t = TableRef {
            family: Family::Ip,
            name: "nodelb".into(),
        };
        let chain = Chain::regular("svc-a");
        let ops = [
            Op::AddTable(t.clone()),
            Op::AddChain(t.clone(), &chain),
            Op::DelChain(t.clone(), "svc-gone".into()),
        ];
        let b = Batch::encode(100, &ops).unwrap();
        assert_eq!(b.message_count(), 3);
        assert_eq!(b.acked_seqs(), 101..104);
        let named: Vec<Option<&str>> = (99..105).map(|s| b.object(s)).collect();
        assert_eq!(
            named,
            [
                None, // before the batch
                None, // the batch's begin marker
                Some("add table ip nodelb"),
                Some("add chain ip nodelb svc-a"),
                Some("delete chain ip nodelb svc-gone"),
                None, // the end marker
            ]
        );
    }
}
