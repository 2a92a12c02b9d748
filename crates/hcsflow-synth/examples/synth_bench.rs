//! Times `generate` on the benchmark plate: 96 wells × 3×3 sites × 2 channels, 1024².
//!
//! `cargo run --release -p hcsflow-synth --example synth_bench -- OUT [SIZE] [FORMAT] [PLATE]`
//! OUT must not exist (or be a previous synthetic plate, which is replaced).

use std::path::PathBuf;
use std::time::Instant;

use hcsflow_synth::{generate, SynthConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(args.next().ok_or("usage: synth_bench OUT [SIZE] [FORMAT] [PLATE]")?);
    let size: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1024);
    let format = args.next().map(|s| s.parse()).transpose()?.unwrap_or(hcsflow_plate::Format::ImageXpress);
    let plate_size: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(96);
    let cfg = SynthConfig {
        format,
        wells: Vec::new(),
        plate_size,
        grid_rows: 3,
        grid_cols: 3,
        channels: 2,
        size,
        overwrite: true,
        ..SynthConfig::default()
    };
    let t0 = Instant::now();
    let s = generate(&cfg, &out)?;
    let gen = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let plate = hcsflow_plate::open_plate(&out, None)?;
    println!(
        "{}: {} images ({} wells x {} sites x 2 channels, {size}x{size} u16), {:.2} GB written, {} nuclei in {gen:.2} s on {} threads; open_plate {:.2} s ({} images)",
        s.format,
        s.images_written,
        s.wells.len(),
        s.sites,
        s.bytes_written as f64 / 1e9,
        s.nuclei,
        rayon::current_num_threads(),
        t1.elapsed().as_secs_f64(),
        plate.images.len()
    );
    Ok(())
}
