//! Timing, CPU time, peak memory and checksums, measured like the peer scripts.

use std::time::Instant;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// One operation's timings (seconds) and memory.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub median_s: f64,
    pub min_s: f64,
    pub max_s: f64,
    pub runs: usize,
    /// Median process CPU time (all threads) per run: under foreign load wall
    /// time inflates while CPU time mostly does not.
    pub cpu_median_s: f64,
    /// Peak resident set of the process so far (VmHWM), MiB.
    pub peak_rss_mib: f64,
    /// 1-minute load average before and after.
    pub loadavg_1m: [f64; 2],
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn process_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } == 0;
    if ok {
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    } else {
        0.0
    }
}

fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok())).unwrap_or(f64::NAN)
}

/// Peak resident set size of this process in MiB ([`hcsflow_io::peak_rss_bytes`]),
/// NaN where unavailable.
pub fn peak_rss_mib() -> f64 {
    hcsflow_io::peak_rss_bytes().map(|b| b as f64 / (1u64 << 20) as f64).unwrap_or(f64::NAN)
}

/// Runs `f` `warmup` times untimed, then `repeats` times timed.
/// Returns the measurement and the last result. Errors stop the measurement.
pub fn measure<T, E>(warmup: usize, repeats: usize, mut f: impl FnMut() -> Result<T, E>) -> Result<(Measurement, Option<T>), E> {
    measure_with_setup(warmup, repeats, || (), |()| f())
}

/// Like [`measure`], but each run's input comes from `setup`, which is not
/// timed (e.g. a copy of the input for a function that consumes it).
pub fn measure_with_setup<I, T, E>(
    warmup: usize,
    repeats: usize,
    mut setup: impl FnMut() -> I,
    mut f: impl FnMut(I) -> Result<T, E>,
) -> Result<(Measurement, Option<T>), E> {
    for _ in 0..warmup {
        f(setup())?;
    }
    let load0 = loadavg();
    let (mut wall, mut cpu) = (Vec::with_capacity(repeats), Vec::with_capacity(repeats));
    let mut last = None;
    for _ in 0..repeats {
        let input = setup();
        let c = process_cpu_seconds();
        let t = Instant::now();
        let out = f(input)?;
        wall.push(t.elapsed().as_secs_f64());
        cpu.push(process_cpu_seconds() - c);
        last = Some(out);
    }
    let min_s = wall.iter().copied().fold(f64::INFINITY, f64::min);
    let max_s = wall.iter().copied().fold(0.0, f64::max);
    Ok((
        Measurement {
            median_s: median(&mut wall),
            min_s: if repeats == 0 { 0.0 } else { min_s },
            max_s,
            runs: repeats,
            cpu_median_s: median(&mut cpu),
            peak_rss_mib: peak_rss_mib(),
            loadavg_1m: [load0, loadavg()],
        },
        last,
    ))
}

/// SHA-256 of raw pixel bytes (C order, little-endian), hex: equal to
/// `hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()` in Python.
pub fn checksum(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
