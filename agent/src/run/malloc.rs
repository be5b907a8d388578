//! glibc malloc settings for the long-running agent. Its heap is tens of thousands of small,
//! long-lived objects (the cluster's Services and slices, the committed tables) with large
//! short-lived allocations between them (list pages, netlink batches, full-table assemblies,
//! metric scrapes). With glibc's defaults each thread that allocates gets its own arena, and
//! the mmap threshold grows after each large free, so later large buffers land inside the heap
//! and leave it fragmented: the resident set grows well past the live heap (the latency bench
//! of `nodelb-integration` prints the agent's peak RSS).

/// One arena: a full replace frees the committed tables on one thread and assembles new ones
/// on whichever worker runs the sync next, and with an arena per thread the freed memory was
/// not reused, raising the peak. The agent allocates little in parallel, so the shared lock
/// does not show in the latency bench's sync times. Buffers of 128 KiB and more are always
/// mapped on their own, so freeing them returns the memory at once.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024);
    }
}

/// Give free pages back to the kernel (after a full replace, which frees a whole table).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim is thread-safe and only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}
