//! Write throughput of one well: 9 fields of 2048 × 2048 u16 (one channel,
//! one plane), 3 pyramid levels, NGFF 0.5.
//!
//! `cargo run --release -p hcsflow-zarr --example bench_write [FIELDS] [REPS]`
//!
//! For zstd levels 1 and 3 and no compression, prints the median over REPS (default 3)
//! of the time to write the well and finish the plate, as MB/s of level-0
//! pixels, with fields written one after another (one thread) and from all
//! rayon threads at once (how the pipeline engine writes wells), plus the size
//! on disk. The image is a smooth background with cells and noise, so zstd
//! sees realistic redundancy. Plates go to the system temp directory.

use std::path::Path;
use std::time::Instant;

use hcsflow_core::{DType, Stack};
use hcsflow_zarr::{FieldExtent, FieldShape, NgffVersion, PlateSpec, PlateWriter, ZarrCompression};
use ndarray::Array3;
use rayon::prelude::*;

const N: usize = 2048;

/// Background gradient + Gaussian-ish blobs + deterministic noise, u16.
fn field_image(field: usize) -> Stack {
    let mut state = 0x1234_5678_9abc_def0u64 ^ field as u64;
    let mut noise = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % 64) as f32
    };
    let centers: Vec<(f32, f32)> = (0..60).map(|i| (((i * 331 + field * 97) % N) as f32, ((i * 577 + field * 13) % N) as f32)).collect();
    let a = Array3::from_shape_fn((1, N, N), |(_, y, x)| {
        let (yf, xf) = (y as f32, x as f32);
        let mut v = 400.0 + 0.1 * yf + 0.05 * xf;
        for &(cy, cx) in &centers {
            let d2 = (yf - cy).powi(2) + (xf - cx).powi(2);
            if d2 < 900.0 {
                v += 3000.0 * (1.0 - d2 / 900.0);
            }
        }
        v + noise()
    });
    Stack::from(a.mapv(|v| v as u16))
}

fn dir_size(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let fields: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(9);
    let reps: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(3).max(1);
    let images: Vec<Stack> = (0..fields).map(field_image).collect();
    let mb = (fields * N * N * 2) as f64 / 1e6;
    println!(
        "one well: {fields} fields x {N}x{N} u16 = {mb:.1} MB level 0, 3 pyramid levels, NGFF 0.5; {} rayon threads",
        rayon::current_num_threads()
    );
    let tmp = tempfile::tempdir()?;
    for compression in [ZarrCompression::Zstd(1), ZarrCompression::Zstd(3), ZarrCompression::None] {
        for parallel in [false, true] {
            let mut times = Vec::new();
            let mut size = 0;
            for rep in 0..reps {
                let root = tmp.path().join(format!("{compression:?}-{parallel}-{rep}.zarr"));
                let spec = PlateSpec {
                    name: "bench".into(),
                    rows: vec!["A".into()],
                    columns: vec!["1".into()],
                    wells: vec!["A01".into()],
                    fields_per_well: fields,
                    channel_names: vec!["DAPI".into()],
                    pixel_size_um: Some((0.65, 0.65)),
                    z_step_um: None,
                    dtype: DType::U16,
                    shape: FieldShape { t: 1, c: 1, z: 1, y: N, x: N },
                    pyramid_levels: 3,
                    version: NgffVersion::V05,
                    compression,
                    extent: FieldExtent::Fixed,
                    field_positions_um: Vec::new(),
                };
                let start = Instant::now();
                let writer = PlateWriter::create(&root, spec)?;
                if parallel {
                    images.par_iter().enumerate().try_for_each(|(f, img)| writer.write_plane("A01", f, 0, 0, 0, img))?;
                } else {
                    for (f, img) in images.iter().enumerate() {
                        writer.write_plane("A01", f, 0, 0, 0, img)?;
                    }
                }
                writer.finish()?;
                times.push(start.elapsed().as_secs_f64());
                size = dir_size(&root);
                std::fs::remove_dir_all(&root)?;
            }
            times.sort_by(f64::total_cmp);
            let t = times[times.len() / 2];
            println!(
                "{:<8} {:<10} {:>7.1} ms  {:>7.1} MB/s  on disk {:>6.1} MB (all levels)",
                match compression {
                    ZarrCompression::None => "none".to_string(),
                    ZarrCompression::Zstd(l) => format!("zstd({l})"),
                },
                if parallel { "parallel" } else { "sequential" },
                t * 1e3,
                mb / t,
                size as f64 / 1e6
            );
        }
    }
    Ok(())
}
