//! The names of hcsflow's own temporary files.
//!
//! Every hcsflow writer writes a hidden temporary beside its target and
//! renames it into place ([`write_atomic`](crate::write_atomic)), so a killed
//! process can leave one behind. Their names are `.NAME.hcsflow-PID-N.tmp`:
//! `NAME` is the target's file name (its first 100 bytes), `PID` the writer's
//! process id and `N` a per-process counter, both decimal.
//!
//! Earlier versions had one scheme per writer; their leftovers are recognised
//! too, so a run of this version sweeps what a killed older one left:
//!
//! - `.NAME.PID.tmp` — the pipeline's tables and manifest;
//! - `.NAME.PID-N.tmp` — TIFF files;
//! - `.NAME.tmp-PID-N` — OME-Zarr chunks and metadata.
//!
//! [`is_temp_name`] matches these patterns exactly and nothing else, so a
//! user's `.notes.tmp` or `.draft.tmp-old` is never taken for one.

use std::sync::atomic::{AtomicU64, Ordering};

/// The longest prefix of the target's name kept in a temporary's name, in
/// bytes: with the suffix the name stays far below the 255-byte limit of
/// common file systems.
const NAME_BYTES: usize = 100;

/// The marker between the target's name and the writer's numbers.
const MARK: &str = ".hcsflow-";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh temporary file name for a target named `target` (a file name,
/// not a path): `.NAME.hcsflow-PID-N.tmp`, unique within this process.
pub fn temp_name(target: &str) -> String {
    let mut end = target.len().min(NAME_BYTES);
    while !target.is_char_boundary(end) {
        end -= 1;
    }
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(".{}{MARK}{}-{n}.tmp", &target[..end], std::process::id())
}

/// `true` if `name` (a file name, not a path) is one of hcsflow's temporary
/// file names, of this version or an earlier one (see the
/// module documentation).
pub fn is_temp_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('.') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let pid_n = |s: &str| s.split_once('-').is_some_and(|(a, b)| digits(a) && digits(b));
    if let Some(body) = rest.strip_suffix(".tmp") {
        // `.NAME.hcsflow-PID-N.tmp`
        if body.rsplit_once(MARK).is_some_and(|(target, id)| !target.is_empty() && pid_n(id)) {
            return true;
        }
        // `.NAME.PID.tmp` or `.NAME.PID-N.tmp`
        return body.rsplit_once('.').is_some_and(|(target, id)| !target.is_empty() && (digits(id) || pid_n(id)));
    }
    // `.NAME.tmp-PID-N`
    rest.rsplit_once(".tmp-").is_some_and(|(target, id)| !target.is_empty() && pid_n(id))
}

#[cfg(test)]
mod tests {
    use super::{is_temp_name, temp_name};

    #[test]
    fn hcsflow_temporaries_are_recognised() {
        for name in [
            // This version's scheme.
            ".run_manifest.json.hcsflow-1234-0.tmp",
            ".A01.tif.hcsflow-7-123456.tmp",
            ".0.hcsflow-4242-7.tmp",
            // Earlier versions' schemes.
            ".run_manifest.json.1234.tmp",
            ".A01.csv.7.tmp",
            ".Synth_Plate_1_A01_s1_w1.tif.1234-0.tmp",
            ".x.tif.99-123456.tmp",
            ".0.tmp-4242-7",
            ".zarr.json.tmp-1-2",
        ] {
            assert!(is_temp_name(name), "{name}");
        }
    }

    #[test]
    fn other_names_are_not() {
        for name in [
            ".notes.tmp",
            "notes.1234.tmp",
            ".1234.tmp",
            ".a.12x.tmp",
            ".a.1234-.tmp",
            ".a.-5.tmp",
            ".a.1-2-3.tmp",
            ".draft.tmp-old",
            ".a.tmp-1",
            ".a.tmp-1-2x",
            ".tmp-1-2",
            ".hcsflow-1-2.tmp",
            ".a.hcsflow-1.tmp",
            ".a.hcsflow-1-2x.tmp",
            ".a.hcsflow-1-2",
            "a.hcsflow-1-2.tmp",
            "A01.tif",
            ".hcsflow.lock",
            "run_manifest.json",
            "",
            ".",
        ] {
            assert!(!is_temp_name(name), "{name}");
        }
    }

    #[test]
    fn fresh_names_are_recognised_distinct_and_short() {
        let a = temp_name("A01.tif");
        let b = temp_name("A01.tif");
        assert_ne!(a, b);
        assert!(a.starts_with(".A01.tif.hcsflow-"), "{a}");
        assert!(is_temp_name(&a) && is_temp_name(&b), "{a} {b}");
        // A long name, cut inside a multi-byte character: still valid UTF-8, bounded.
        let long = format!("{}é{}", "x".repeat(99), "y".repeat(300));
        let t = temp_name(&long);
        assert!(t.len() < 140 && t.starts_with(&format!(".{}.hcsflow-", "x".repeat(99))), "{t}");
        assert!(is_temp_name(&t), "{t}");
    }
}
