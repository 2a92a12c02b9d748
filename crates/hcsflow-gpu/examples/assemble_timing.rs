//! Times GPU mosaic assembly against the host assembly on the same tiles:
//! a 3 × 3 grid of 2048² u16 tiles, 10 % overlap, fractional positions
//! (a ~33 MPix mosaic), every blend mode. Prints the median of 5 runs of
//! each, the GPU both without and with the transfers, and the largest
//! difference between the two mosaics.
//!
//! `cargo run -p hcsflow-gpu --example assemble_timing [--release]`

use std::time::Instant;

use hcsflow_core::{DType, Device, Stack};
use hcsflow_gpu::{assemble, download, upload_stack, Blend};
use ndarray::Array3;

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let adapters = hcsflow_gpu::discover_adapters();
    let adapter = adapters.first().ok_or("no GPU adapter")?;
    println!("adapter: {adapter}");
    let (n, size, step) = (3usize, 2048usize, 1843.2f64);
    let tiles = Stack::from_f32_array(
        Array3::from_shape_fn((n * n, size, size), |(k, y, x)| ((x * 7 + y * 13 + k * 101) % 60_000) as f32),
        DType::U16,
    );
    let positions: Vec<(f64, f64)> =
        (0..n * n).map(|k| ((k % n) as f64 * step + 0.37 * k as f64, (k / n) as f64 * step + 0.21 * k as f64)).collect();
    let device = Device::Gpu(adapter.index);
    let on_gpu = upload_stack(&tiles, device)?;
    for blend in [Blend::Linear, Blend::None, Blend::Max] {
        let (mut host_t, mut gpu_t, mut full_t) = (Vec::new(), Vec::new(), Vec::new());
        let mut host = None;
        let mut gpu = None;
        for _ in 0..5 {
            let t = Instant::now();
            host = Some(hcsflow_stitch::assemble(&tiles, &positions, blend)?);
            host_t.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let out = assemble(&on_gpu, &positions, blend)?;
            // Reading back one word waits for the kernels.
            let mosaic = download(&out)?;
            gpu_t.push(t.elapsed().as_secs_f64());
            gpu = Some(mosaic);
            let t = Instant::now();
            let up = upload_stack(&tiles, device)?;
            download(&assemble(&up, &positions, blend)?)?;
            full_t.push(t.elapsed().as_secs_f64());
        }
        let (host, gpu) = (host.ok_or("no run")?, gpu.ok_or("no run")?.into_stack().map_err(|_| "not a stack")?);
        let diff = host.to_f32().iter().zip(gpu.to_f32().iter()).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        println!(
            "{:6} mosaic {:?}: host {:.3} s, gpu (+download) {:.3} s, gpu (+upload+download) {:.3} s, max |diff| {diff}",
            blend.name(),
            host.shape(),
            median(host_t),
            median(gpu_t),
            median(full_t)
        );
    }
    Ok(())
}
