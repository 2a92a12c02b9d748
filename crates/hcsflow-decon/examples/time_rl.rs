//! Times Richardson–Lucy on a `.npy` stack with a PSF TIFF:
//! `cargo run --release -p hcsflow-decon --example time_rl -- IN.npy PSF.tif [same|circular] [iterations] [accelerate|plain] [auto|fft|separable]`.
//! Prints the plan, the OTF time and the median of 3 runs.

use std::path::Path;
use std::time::Instant;

use hcsflow_decon::{Boundary, Method, Plan, Psf, RlParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: time_rl IN.npy PSF.tif [same|circular] [iterations] [accelerate|plain] [auto|fft|separable]".into());
    }
    let image = hcsflow_bench::read_npy(Path::new(&args[1]))?.to_f32();
    let psf = Psf::from_tiff(Path::new(&args[2]))?;
    let boundary = if args.get(3).map(String::as_str) == Some("circular") { Boundary::Circular } else { Boundary::Same };
    let iterations = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(10);
    let acceleration = args.get(5).is_some_and(|s| s == "accelerate");
    let method = match args.get(6).map(String::as_str) {
        Some("fft") => Method::Fft,
        Some("separable") => Method::Separable,
        _ => Method::Auto,
    };
    let params = RlParams { iterations, boundary, acceleration, epsilon: 1e-12, method };
    let (nz, ny, nx) = image.dim();
    let t = Instant::now();
    let plan = Plan::new([nz, ny, nx], &psf, &params)?;
    println!("{}\nplan + OTF: {:.3} s", plan.describe(), t.elapsed().as_secs_f64());
    let mut times = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let out = plan.run(image.view())?;
        times.push(t.elapsed().as_secs_f64());
        std::hint::black_box(out);
    }
    times.sort_by(f64::total_cmp);
    println!("run: median {:.3} s (min {:.3}, max {:.3})", times[1], times[0], times[2]);
    Ok(())
}
