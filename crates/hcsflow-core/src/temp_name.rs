//! The names of hcsflow's own temporary files, in one place.
//!
//! Every writer of hcsflow writes a hidden temporary next to its target and
//! renames it into place, so a killed process can leave one behind. Three
//! writers, three patterns (`NAME` is the target's file name, `PID` the
//! writer's process id, `N` a per-process counter; all numbers decimal):
//!
//! - `.NAME.PID.tmp` — the pipeline's tables and manifest (`hcsflow-pipeline`);
//! - `.NAME.PID-N.tmp` — TIFF files (`hcsflow-tiff`);
//! - `.NAME.tmp-PID-N` — OME-Zarr chunks and metadata (`hcsflow-zarr`).
//!
//! [`is_temp_name`] is the one predicate that recognises them, for whoever
//! removes stale temporaries. It matches these patterns exactly and nothing
//! else, so a user's `.notes.tmp` or `.draft.tmp-old` is never taken for one.

/// `true` if `name` (a file name, not a path) is one of hcsflow's temporary
/// file names (see the [module documentation](self)).
pub fn is_temp_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('.') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let pid_n = |s: &str| s.split_once('-').is_some_and(|(a, b)| digits(a) && digits(b));
    if let Some(body) = rest.strip_suffix(".tmp") {
        // `.NAME.PID.tmp` or `.NAME.PID-N.tmp`
        return body.rsplit_once('.').is_some_and(|(target, id)| !target.is_empty() && (digits(id) || pid_n(id)));
    }
    // `.NAME.tmp-PID-N`
    rest.rsplit_once(".tmp-").is_some_and(|(target, id)| !target.is_empty() && pid_n(id))
}

#[cfg(test)]
mod tests {
    use super::is_temp_name;

    #[test]
    fn hcsflow_temporaries_are_recognised() {
        for name in [
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
            "A01.tif",
            ".hcsflow.lock",
            "run_manifest.json",
            "",
            ".",
        ] {
            assert!(!is_temp_name(name), "{name}");
        }
    }
}
