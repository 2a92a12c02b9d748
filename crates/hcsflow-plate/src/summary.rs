//! The human-readable plate summary printed by `hcsflow inspect`.

use std::collections::BTreeSet;
use std::fmt::Write;

use crate::Plate;

/// How many missing images / warnings are listed before "… and N more".
const LIST_LIMIT: usize = 20;

/// A multi-line summary of `plate`: format, wells, sites, channels with names,
/// z, timepoints, grid, pixel size, image size/dtype, counts, missing images and
/// warnings. Long lists are cut after 20 entries with a count of the rest.
pub fn summary_text(plate: &Plate) -> String {
    let m = &plate.metadata;
    let mut s = String::new();
    let opt = |v: Option<String>| v.unwrap_or_else(|| "unknown".to_string());
    let _ = writeln!(s, "Plate:       {}", plate.root.display());
    let _ = writeln!(s, "Format:      {}", plate.format);
    let _ = writeln!(s, "Descriptor:  {}", plate.descriptor.display());
    if !m.name.is_empty() {
        let _ = writeln!(s, "Name:        {}", m.name);
    }
    if let Some(d) = m.description.as_deref().filter(|d| !d.is_empty()) {
        let _ = writeln!(s, "Description: {d}");
    }
    let _ = writeln!(s, "Plate size:  {} rows x {} columns", m.plate_rows, m.plate_columns);
    let wells = plate.wells();
    let _ = writeln!(
        s,
        "Wells:       {} with images, {} acquired{}",
        wells.len(),
        m.acquired_wells.len(),
        if wells.is_empty() { String::new() } else { format!(" ({})", abbreviate(&wells)) }
    );
    let sites: BTreeSet<u32> = plate.images.iter().chain(&plate.projections).map(|i| i.site).collect();
    let _ = writeln!(s, "Sites:       {} (grid {} rows x {} columns)", sites.len(), m.grid_rows, m.grid_cols);
    let channels = plate.channels();
    let names: Vec<String> = channels
        .iter()
        .map(|c| match m.channel_names.get(c) {
            Some(n) => format!("{c}={n}"),
            None => c.to_string(),
        })
        .collect();
    let _ = writeln!(s, "Channels:    {} ({})", channels.len(), names.join(", "));
    let _ = writeln!(s, "Z planes:    {}", m.z_planes);
    let _ = writeln!(s, "Timepoints:  {}", m.timepoints);
    let _ = writeln!(s, "Pixel size:  {}", opt(m.pixel_size_um.map(|p| format!("{p} µm"))));
    let _ = writeln!(
        s,
        "Image:       {} x {} px, {}{}",
        opt(m.image_width.map(|v| v.to_string())),
        opt(m.image_height.map(|v| v.to_string())),
        opt(m.dtype.map(|d| d.to_string())),
        m.bit_depth.map(|b| format!(" ({b}-bit)")).unwrap_or_default()
    );
    let _ = writeln!(s, "Stage pos.:  {} site positions", m.stage_positions.len());
    let _ = writeln!(s, "Images:      {}", plate.images.len());
    if !plate.projections.is_empty() {
        let _ = writeln!(s, "Projections: {}", plate.projections.len());
    }
    let _ = writeln!(s, "Missing:     {}", plate.missing.len());
    for miss in plate.missing.iter().take(LIST_LIMIT) {
        let _ = writeln!(
            s,
            "  {} site {} channel {} z {} t {}: {}{}",
            miss.well,
            miss.site,
            miss.channel,
            miss.z_index,
            miss.timepoint,
            miss.reason,
            miss.path.as_ref().map(|p| format!(" ({})", p.display())).unwrap_or_default()
        );
    }
    if plate.missing.len() > LIST_LIMIT {
        let _ = writeln!(s, "  … and {} more", plate.missing.len() - LIST_LIMIT);
    }
    let _ = writeln!(s, "Warnings:    {}", plate.warnings.len());
    for w in plate.warnings.iter().take(LIST_LIMIT) {
        let _ = writeln!(s, "  {w}");
    }
    if plate.warnings.len() > LIST_LIMIT {
        let _ = writeln!(s, "  … and {} more", plate.warnings.len() - LIST_LIMIT);
    }
    s
}

fn abbreviate(wells: &[String]) -> String {
    if wells.len() <= 8 {
        wells.join(", ")
    } else {
        format!("{}, …, {}", wells[..4].join(", "), wells[wells.len() - 2..].join(", "))
    }
}
