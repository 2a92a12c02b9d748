//! Read/write timings for a 2048 x 2048 u16 plane written by us.
//!
//! `cargo run --release -p hcsflow-tiff --example bench_read [REPS]`
//!
//! Prints the median over REPS (default 20) of: reading the uncompressed
//! file (from the page cache after the first read), reading the Deflate
//! file, and writing each. The file lives in the system temp directory.

use std::time::Instant;

use hcsflow_core::Stack;
use hcsflow_tiff::{read_stack, write_stack, Compression, WriteOptions};
use ndarray::Array3;

fn median_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm-up: page cache, allocator
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reps: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(20).max(1);
    // A micrograph-like plane: smooth background, spots, a little noise.
    let mut state = 0x1234_5678_u32;
    let plane = Array3::from_shape_fn((1, 2048, 2048), |(_, y, x)| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let spot = if (x % 97 < 4) && (y % 89 < 4) { 20_000.0 } else { 0.0 };
        let bg = 1_000.0 + 300.0 * ((x as f32 / 150.0).sin() + (y as f32 / 170.0).cos());
        (bg + spot + (state % 64) as f32) as u16
    });
    let stack = Stack::from(plane);
    let dir = std::env::temp_dir().join(format!("hcsflow-tiff-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    for (name, compression) in [("uncompressed", Compression::None), ("deflate", Compression::Deflate)] {
        let path = dir.join(format!("{name}.tif"));
        let options = WriteOptions { compression, ..Default::default() };
        let write = median_ms(reps, || write_stack(&path, &stack, &options).expect("write"));
        let size = std::fs::metadata(&path)?.len();
        let mut check = None;
        let read = median_ms(reps, || check = Some(read_stack(&path).expect("read")));
        assert!(check.as_ref() == Some(&stack), "read back differs");
        println!(
            "2048x2048 u16 {name:>12}: read {read:7.3} ms   write {write:7.3} ms   ({:.1} MB on disk, median of {reps})",
            size as f64 / 1e6
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
