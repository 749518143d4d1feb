//! The process settings `tfpipe train` makes before training, for the
//! examples that time training steps (`cnn_step`, `op_times`) to run as it
//! does.

/// What `tfpipe train` does first (`keep_large_buffers` in
/// src/cli/common.rs): buffers under 64 MB come from malloc's heap rather
/// than fresh mappings that every step would fault in again.
pub fn keep_large_buffers() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called first thing
    // in main, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
    }
}

/// What `tfpipe train` does too (`set_compute_threads` in
/// src/cli/common.rs): candle's own elementwise pool, whose threads wait by
/// spinning, gets only the caller, unless `CANDLE_NUM_THREADS` is set. With
/// it on, its spinning thread took 7% of the CPU of a 64x64x3 step here.
pub fn candle_pool_off() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: no other thread exists yet (first thing in main).
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
}
