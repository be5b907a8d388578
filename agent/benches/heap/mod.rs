//! The benches' heap count: the system allocator wrapped so that it counts the bytes live (as
//! requested; malloc's own overhead comes on top), their peak, and the allocations live with
//! the bytes glibc's malloc takes for them. A bench includes it with `mod heap;` and reads the
//! counts around what it measures.

// Each bench reads the counts it needs.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Allocations live, and the bytes glibc's malloc takes for them (a chunk is the request plus
/// an 8-byte header, rounded up to 16, at least 32; large requests are mapped pages).
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static CHUNKS: AtomicUsize = AtomicUsize::new(0);

fn chunk(size: usize) -> usize {
    if size >= 128 * 1024 {
        (size + 8).div_ceil(4096) * 4096
    } else {
        ((size + 8).div_ceil(16) * 16).max(32)
    }
}

fn count(add: usize) {
    let now = LIVE.fetch_add(add, Ordering::Relaxed) + add;
    PEAK.fetch_max(now, Ordering::Relaxed);
    ALLOCS.fetch_add(1, Ordering::Relaxed);
    CHUNKS.fetch_add(chunk(add), Ordering::Relaxed);
}

fn uncount(size: usize) {
    LIVE.fetch_sub(size, Ordering::Relaxed);
    ALLOCS.fetch_sub(1, Ordering::Relaxed);
    CHUNKS.fetch_sub(chunk(size), Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size());
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        uncount(l.size());
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count(new);
        uncount(l.size());
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Bytes live now.
pub fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Reset the peak to what is live now; returns that.
pub fn peak_from_now() -> usize {
    let now = live();
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// The peak above `base` since [`peak_from_now`] returned it.
pub fn peak_above(base: usize) -> usize {
    PEAK.load(Ordering::Relaxed) - base
}

/// Allocations and malloc chunk bytes live now.
pub fn footprint() -> (usize, usize) {
    (
        ALLOCS.load(Ordering::Relaxed),
        CHUNKS.load(Ordering::Relaxed),
    )
}

/// "N allocations, X MiB as malloc chunks" between two footprints.
pub fn chunks_text(from: (usize, usize), to: (usize, usize)) -> String {
    format!(
        "{} allocations, {:.1} MiB as malloc chunks",
        to.0 - from.0,
        mib(to.1 - from.1)
    )
}

pub fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
