//! The process's peak memory.

/// Peak resident set size of this process (Linux `VmHWM` in
/// `/proc/self/status`), in bytes; `None` where the system does not say.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(target_os = "linux")]
    fn peak_rss_grows_with_touched_memory() {
        let before = super::peak_rss_bytes().expect("VmHWM on Linux");
        assert!(before > 0);
        // Touch 64 MiB more than the peak so far: the peak must rise.
        let big = vec![1u8; (before as usize) + (64 << 20)];
        std::hint::black_box(&big);
        let after = super::peak_rss_bytes().expect("VmHWM on Linux");
        assert!(after >= before + (32 << 20), "{before} -> {after}");
    }
}
