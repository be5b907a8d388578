//! Owned handles over libnftnl objects (through `nftnl-sys`): the only module with `unsafe`
//! object construction. Each handle frees its object on drop; a rule owns the expressions
//! added to it, a set owns its elements, as libnftnl documents.

use nftnl::nftnl_sys as sys;
use std::ffi::{c_void, CString};
use std::os::raw::c_char;
use std::ptr::NonNull;

fn cstr(s: &str) -> CString {
    // Names come from the model; nft rejects NUL bytes in names and comments anyway.
    CString::new(s.replace('\0', "")).expect("no NUL after replace")
}

macro_rules! handle {
    ($name:ident, $raw:ty, $alloc:ident, $free:ident) => {
        pub struct $name(NonNull<$raw>);

        impl $name {
            pub fn new() -> $name {
                let p = unsafe { sys::$alloc() };
                $name(NonNull::new(p).expect(concat!(stringify!($alloc), " out of memory")))
            }

            pub fn as_ptr(&self) -> *mut $raw {
                self.0.as_ptr()
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                unsafe { sys::$free(self.0.as_ptr()) }
            }
        }
    };
}

handle!(
    NlTable,
    sys::nftnl_table,
    nftnl_table_alloc,
    nftnl_table_free
);
handle!(
    NlChain,
    sys::nftnl_chain,
    nftnl_chain_alloc,
    nftnl_chain_free
);
handle!(NlRule, sys::nftnl_rule, nftnl_rule_alloc, nftnl_rule_free);
handle!(NlSet, sys::nftnl_set, nftnl_set_alloc, nftnl_set_free);
handle!(NlObj, sys::nftnl_obj, nftnl_obj_alloc, nftnl_obj_free);

/// `NFT_OBJECT_COUNTER`.
pub const OBJECT_COUNTER: u32 = 1;

impl NlObj {
    /// A counter object of a table (for deletion, name and type are enough).
    pub fn counter(family: u8, table: &str, name: &str) -> NlObj {
        let o = NlObj::new();
        let (t, n) = (cstr(table), cstr(name));
        unsafe {
            sys::nftnl_obj_set_u32(o.as_ptr(), sys::NFTNL_OBJ_FAMILY as u16, family as u32);
            sys::nftnl_obj_set_str(o.as_ptr(), sys::NFTNL_OBJ_TABLE as u16, t.as_ptr());
            sys::nftnl_obj_set_str(o.as_ptr(), sys::NFTNL_OBJ_NAME as u16, n.as_ptr());
            sys::nftnl_obj_set_u32(o.as_ptr(), sys::NFTNL_OBJ_TYPE as u16, OBJECT_COUNTER);
        }
        o
    }

    /// The values a counter starts from.
    pub fn set_counts(&self, packets: u64, bytes: u64) {
        unsafe {
            sys::nftnl_obj_set_u64(self.as_ptr(), sys::NFTNL_OBJ_CTR_PKTS as u16, packets);
            sys::nftnl_obj_set_u64(self.as_ptr(), sys::NFTNL_OBJ_CTR_BYTES as u16, bytes);
        }
    }

    pub fn userdata(&self, data: &[u8]) {
        unsafe {
            sys::nftnl_obj_set_data(
                self.as_ptr(),
                sys::NFTNL_OBJ_USERDATA as u16,
                data.as_ptr() as *const c_void,
                data.len() as u32,
            );
        }
    }
}

impl NlTable {
    pub fn with(family: u8, name: &str) -> NlTable {
        let t = NlTable::new();
        let n = cstr(name);
        unsafe {
            sys::nftnl_table_set_u32(t.as_ptr(), sys::NFTNL_TABLE_FAMILY as u16, family as u32);
            sys::nftnl_table_set_str(t.as_ptr(), sys::NFTNL_TABLE_NAME as u16, n.as_ptr());
        }
        t
    }
}

impl NlChain {
    pub fn with(family: u8, table: &str, name: &str) -> NlChain {
        let c = NlChain::new();
        let (t, n) = (cstr(table), cstr(name));
        unsafe {
            sys::nftnl_chain_set_u32(c.as_ptr(), sys::NFTNL_CHAIN_FAMILY as u16, family as u32);
            sys::nftnl_chain_set_str(c.as_ptr(), sys::NFTNL_CHAIN_TABLE as u16, t.as_ptr());
            sys::nftnl_chain_set_str(c.as_ptr(), sys::NFTNL_CHAIN_NAME as u16, n.as_ptr());
        }
        c
    }

    pub fn set_base(&self, chain_type: &str, hook: u32, priority: i32, policy: u32) {
        let ty = cstr(chain_type);
        unsafe {
            sys::nftnl_chain_set_str(self.as_ptr(), sys::NFTNL_CHAIN_TYPE as u16, ty.as_ptr());
            sys::nftnl_chain_set_u32(self.as_ptr(), sys::NFTNL_CHAIN_HOOKNUM as u16, hook);
            sys::nftnl_chain_set_s32(self.as_ptr(), sys::NFTNL_CHAIN_PRIO as u16, priority);
            sys::nftnl_chain_set_u32(self.as_ptr(), sys::NFTNL_CHAIN_POLICY as u16, policy);
        }
    }
}

impl NlRule {
    pub fn with(family: u8, table: &str, chain: &str) -> NlRule {
        let r = NlRule::new();
        let (t, c) = (cstr(table), cstr(chain));
        unsafe {
            sys::nftnl_rule_set_u32(r.as_ptr(), sys::NFTNL_RULE_FAMILY as u16, family as u32);
            sys::nftnl_rule_set_str(r.as_ptr(), sys::NFTNL_RULE_TABLE as u16, t.as_ptr());
            sys::nftnl_rule_set_str(r.as_ptr(), sys::NFTNL_RULE_CHAIN as u16, c.as_ptr());
        }
        r
    }

    pub fn set_userdata(&self, data: &[u8]) {
        unsafe {
            sys::nftnl_rule_set_data(
                self.as_ptr(),
                sys::NFTNL_RULE_USERDATA as u16,
                data.as_ptr() as *const c_void,
                data.len() as u32,
            );
        }
    }

    /// Append an expression; the rule takes ownership.
    pub fn add(&self, e: NlExpr) {
        unsafe { sys::nftnl_rule_add_expr(self.as_ptr(), e.into_raw()) }
    }
}

/// One expression under construction. Owned until added to a rule.
pub struct NlExpr(NonNull<sys::nftnl_expr>);

impl NlExpr {
    pub fn new(kind: &str) -> NlExpr {
        let k = cstr(kind);
        let p = unsafe { sys::nftnl_expr_alloc(k.as_ptr()) };
        NlExpr(NonNull::new(p).unwrap_or_else(|| panic!("libnftnl has no expression {kind:?}")))
    }

    pub fn u32(self, attr: u32, v: u32) -> NlExpr {
        unsafe { sys::nftnl_expr_set_u32(self.0.as_ptr(), attr as u16, v) };
        self
    }

    pub fn u64(self, attr: u32, v: u64) -> NlExpr {
        unsafe { sys::nftnl_expr_set_u64(self.0.as_ptr(), attr as u16, v) };
        self
    }

    pub fn bytes(self, attr: u32, v: &[u8]) -> NlExpr {
        unsafe {
            sys::nftnl_expr_set(
                self.0.as_ptr(),
                attr as u16,
                v.as_ptr() as *const c_void,
                v.len() as u32,
            )
        };
        self
    }

    pub fn str(self, attr: u32, v: &str) -> NlExpr {
        let s = cstr(v);
        unsafe { sys::nftnl_expr_set_str(self.0.as_ptr(), attr as u16, s.as_ptr()) };
        self
    }

    fn into_raw(self) -> *mut sys::nftnl_expr {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }
}

impl Drop for NlExpr {
    fn drop(&mut self) {
        unsafe { sys::nftnl_expr_free(self.0.as_ptr()) }
    }
}

impl NlSet {
    pub fn with(family: u8, table: &str, name: &str) -> NlSet {
        let s = NlSet::new();
        let (t, n) = (cstr(table), cstr(name));
        unsafe {
            sys::nftnl_set_set_u32(s.as_ptr(), sys::NFTNL_SET_FAMILY as u16, family as u32);
            sys::nftnl_set_set_str(s.as_ptr(), sys::NFTNL_SET_TABLE as u16, t.as_ptr());
            sys::nftnl_set_set_str(s.as_ptr(), sys::NFTNL_SET_NAME as u16, n.as_ptr());
        }
        s
    }

    pub fn u32(&self, attr: u32, v: u32) {
        unsafe { sys::nftnl_set_set_u32(self.as_ptr(), attr as u16, v) }
    }

    pub fn u64(&self, attr: u32, v: u64) {
        unsafe { sys::nftnl_set_set_u64(self.as_ptr(), attr as u16, v) }
    }

    pub fn userdata(&self, data: &[u8]) {
        unsafe {
            sys::nftnl_set_set_data(
                self.as_ptr(),
                sys::NFTNL_SET_USERDATA as u16,
                data.as_ptr() as *const c_void,
                data.len() as u32,
            );
        }
    }

    /// Add an element; the set takes ownership.
    pub fn add(&self, e: NlElem) {
        unsafe { sys::nftnl_set_elem_add(self.as_ptr(), e.into_raw()) }
    }
}

pub struct NlElem(NonNull<sys::nftnl_set_elem>);

impl NlElem {
    pub fn new() -> NlElem {
        let p = unsafe { sys::nftnl_set_elem_alloc() };
        NlElem(NonNull::new(p).expect("nftnl_set_elem_alloc out of memory"))
    }

    pub fn bytes(self, attr: u32, v: &[u8]) -> NlElem {
        unsafe {
            sys::nftnl_set_elem_set(
                self.0.as_ptr(),
                attr as u16,
                v.as_ptr() as *const c_void,
                v.len() as u32,
            );
        }
        self
    }

    pub fn u32(self, attr: u32, v: u32) -> NlElem {
        unsafe { sys::nftnl_set_elem_set_u32(self.0.as_ptr(), attr as u16, v) };
        self
    }

    pub fn u64(self, attr: u32, v: u64) -> NlElem {
        unsafe { sys::nftnl_set_elem_set_u64(self.0.as_ptr(), attr as u16, v) };
        self
    }

    pub fn str(self, attr: u32, v: &str) -> NlElem {
        let s = cstr(v);
        unsafe { sys::nftnl_set_elem_set_str(self.0.as_ptr(), attr as u16, s.as_ptr()) };
        self
    }

    fn into_raw(self) -> *mut sys::nftnl_set_elem {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }
}

impl Drop for NlElem {
    fn drop(&mut self) {
        unsafe { sys::nftnl_set_elem_free(self.0.as_ptr()) }
    }
}

/// The payload builders libnftnl offers for each object.
pub enum Payload<'a> {
    Table(&'a NlTable),
    Chain(&'a NlChain),
    Rule(&'a NlRule),
    Set(&'a NlSet),
    SetElems(&'a NlSet),
    Obj(&'a NlObj),
}

/// Largest message libnftnl may write (a set element message can be just over 64 KiB).
pub fn max_msg_size() -> usize {
    nftnl::nft_nlmsg_maxsize() as usize
}

thread_local! {
    /// Where libnftnl writes each message before it is copied into the batch, so a batch of
    /// many small messages costs their size, not 64 KiB each.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; max_msg_size()]);
}

/// A batch's bytes, in pieces sent together (`sendmsg` with one iovec per piece, which the
/// kernel reads as one datagram, so a message may span two pieces): the batch's heap costs
/// what it holds, where one vector grown by doubling would cost up to twice that while it
/// grows, both blocks counted. What a full replace frees while encoding (each element once
/// encoded) is scattered among live allocations in small runs, which the first pieces are
/// sized for, so the batch reuses them; larger pieces still land on fresh memory. The figures
/// behind this (heap, RSS, the runs' sizes) are in docs/benchmarks.md, "Figures behind
/// decisions in the code". The kernel takes at most 1,024 iovecs: 640 small pieces leave 384
/// of 120 KiB (a 47 MiB batch) before a batch is sent from one copy.
#[derive(Default)]
pub struct BatchBuf {
    pieces: Vec<Vec<u8>>,
}

impl BatchBuf {
    /// Under glibc's mmap threshold as the agent sets it (128 KiB).
    const PIECE: usize = 120 * 1024;
    /// The first pieces, sized for the free runs a full replace leaves (see above).
    const SMALL_PIECE: usize = 4 * 1024;
    const SMALL_PIECES: usize = 640;

    fn next_piece(&self) -> usize {
        if self.pieces.len() < Self::SMALL_PIECES {
            Self::SMALL_PIECE
        } else {
            Self::PIECE
        }
    }

    /// Append `bytes`, filling the last piece before starting another.
    fn extend(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let full = self.pieces.last().is_none_or(|p| p.len() == p.capacity());
            if full {
                self.pieces.push(Vec::with_capacity(self.next_piece()));
            }
            let piece = self.pieces.last_mut().expect("a piece was just pushed");
            let n = bytes.len().min(piece.capacity() - piece.len());
            piece.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
    }

    pub fn len(&self) -> usize {
        self.pieces.iter().map(Vec::len).sum()
    }

    pub fn pieces(&self) -> &[Vec<u8>] {
        &self.pieces
    }
}

/// Append one netlink message to `buf`: header (`nftnl_nlmsg_build_hdr`) and payload.
pub fn append_msg(
    buf: &mut BatchBuf,
    msg_type: u16,
    family: u8,
    flags: u16,
    seq: u32,
    payload: Payload<'_>,
) {
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        unsafe {
            let at = scratch.as_mut_ptr() as *mut c_char;
            let nlh = sys::nftnl_nlmsg_build_hdr(at, msg_type, family as u16, flags, seq);
            match payload {
                Payload::Table(t) => sys::nftnl_table_nlmsg_build_payload(nlh, t.as_ptr()),
                Payload::Chain(c) => sys::nftnl_chain_nlmsg_build_payload(nlh, c.as_ptr()),
                Payload::Rule(r) => sys::nftnl_rule_nlmsg_build_payload(nlh, r.as_ptr()),
                Payload::Set(s) => sys::nftnl_set_nlmsg_build_payload(nlh, s.as_ptr()),
                Payload::SetElems(s) => sys::nftnl_set_elems_nlmsg_build_payload(nlh, s.as_ptr()),
                Payload::Obj(o) => sys::nftnl_obj_nlmsg_build_payload(nlh, o.as_ptr()),
            }
            let len = (*nlh).nlmsg_len as usize;
            let padded = align4(len);
            assert!(
                padded <= scratch.len(),
                "libnftnl wrote a {len}-byte message"
            );
            scratch[len..padded].fill(0);
            buf.extend(&scratch[..padded]);
        }
    })
}

/// Append a batch begin or end marker.
pub fn append_batch_marker(buf: &mut BatchBuf, begin: bool, seq: u32) {
    let mut marker = [0u8; 64];
    unsafe {
        let at = marker.as_mut_ptr() as *mut c_char;
        let nlh = if begin {
            sys::nftnl_batch_begin(at, seq)
        } else {
            sys::nftnl_batch_end(at, seq)
        };
        let len = (*nlh).nlmsg_len as usize;
        buf.extend(&marker[..align4(len)]);
    }
}

fn align4(n: usize) -> usize {
    n.div_ceil(4) * 4
}

#[cfg(test)]
mod batch_buf_tests {
    use super::BatchBuf;

    #[test]
    fn bytes_fill_each_piece_and_span_into_the_next() {
        let mut b = BatchBuf::default();
        let msg: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        // Past the small pieces (640 x 4 KiB) into the large ones.
        let n = 70;
        for _ in 0..n {
            b.extend(&msg);
        }
        assert_eq!(b.len(), n * msg.len());
        let pieces = b.pieces();
        let sizes: Vec<usize> = pieces.iter().map(|p| p.capacity()).collect();
        assert!(sizes[..BatchBuf::SMALL_PIECES]
            .iter()
            .all(|&c| c == BatchBuf::SMALL_PIECE));
        assert!(sizes[BatchBuf::SMALL_PIECES..]
            .iter()
            .all(|&c| c == BatchBuf::PIECE));
        assert!(pieces.len() > BatchBuf::SMALL_PIECES + 1);
        // Every piece but the last is full: a message that does not fit goes on in the next.
        assert!(pieces[..pieces.len() - 1]
            .iter()
            .all(|p| p.len() == p.capacity()));
        assert_eq!(pieces.concat(), msg.repeat(n));
    }
}
