//! The netlink read-back parser on arbitrary bytes: every message of the buffer read as each
//! of the reader's dumps reads it (tables, base chains, counters, set flags, elements, errors).
//! It must return, whatever the bytes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    std::hint::black_box(nodelb_netfilter::readback::read_any(data));
});
