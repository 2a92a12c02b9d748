//! Focus stacking on the GPU, mirroring `hcsflow_ops::focus` operation for
//! operation: separable Gaussian (vertical pass reading the packed input, then
//! horizontal), 5-point Laplacian magnitude or Gaussian-difference weights,
//! running argmax over planes (first plane wins ties), then gather / weighted mean.
//!
//! Planes are processed one at a time (scratch: a few f32 planes), so only the
//! input stack must fit in one binding. The blur repeats the host's operation
//! order (`hcsflow_ops::convolve`: centre tap, then symmetric pairs summed before
//! weighting); WGSL/SPIR-V leave it to the driver whether `a * b + c` is fused,
//! so blurred values can differ from the host by an ulp per tap; the chosen plane
//! then differs only where two planes' measures tie to rounding (the tests check
//! exactly that).

use std::sync::Arc;

use cubecl::prelude::*;
use hcsflow_core::{Array, DType, DeviceBuffer, FunctionError};
use hcsflow_ops::focus::{focus_kernel, FocusMethod, FocusStackArgs, FOCUS_STACK, MAX_PLANES};

use super::{grid, kind_of, wgpu_input, BLOCK};
use crate::array::{words_for, WgpuArray};

const NAME: &str = FOCUS_STACK.name;

/// scipy "reflect" index of `i − r` for `0 ≤ i`, `n ≥ 1` (no negatives: shifted by periods).
#[cube]
fn reflect_shifted(i: u32, r: u32, n: u32) -> u32 {
    let period = 2 * n;
    let t = i + period * (r / period + 1) - r;
    let m = t % period;
    let mut out = m;
    if m >= n {
        out = period - 1 - m;
    }
    out
}

/// Pixel `p` of plane `z` as f32; `kind`: 0 = u8 (4 per word), 1 = u16 (2 per word), 2 = f32 bits.
#[allow(unused_assignments)]
#[cube]
pub(super) fn load_pixel(input: &[u32], z: u32, plane_words: u32, p: u32, #[comptime] kind: u32) -> f32 {
    let base = (z * plane_words) as usize;
    let mut v = 0.0f32;
    if kind == 0 {
        let word = input[base + (p / 4) as usize];
        v = f32::cast_from((word >> ((p % 4) * 8)) & 0xFFu32);
    } else if kind == 1 {
        let word = input[base + (p / 2) as usize];
        v = f32::cast_from((word >> ((p % 2) * 16)) & 0xFFFFu32);
    } else {
        v = f32::reinterpret(input[base + p as usize]);
    }
    v
}

/// Vertical Gaussian pass of plane `z` into `tmp` (one value per pixel).
#[cube(launch)]
fn vblur(input: &[u32], tmp: &mut [f32], weights: &[f32], z: u32, h: u32, w: u32, plane_words: u32, radius: u32, #[comptime] kind: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < h * w {
        let y = i / w;
        let x = i % w;
        // Same order as hcsflow_ops::convolve (symmetric taps folded):
        // w[r]·c, then += w[r+k]·(v[y−k] + v[y+k]) for k = 1..=r.
        let mut acc = weights[radius as usize] * load_pixel(input, z, plane_words, y * w + x, kind);
        for k in 1..radius + 1 {
            let ya = reflect_shifted(y + radius - k, radius, h);
            let yb = reflect_shifted(y + radius + k, radius, h);
            let a = load_pixel(input, z, plane_words, ya * w + x, kind);
            let b = load_pixel(input, z, plane_words, yb * w + x, kind);
            acc += weights[(radius + k) as usize] * (a + b);
        }
        tmp[i as usize] = acc;
    }
}

/// Horizontal Gaussian pass.
#[cube(launch)]
fn hblur(tmp: &[f32], blur: &mut [f32], weights: &[f32], h: u32, w: u32, radius: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < h * w {
        let y = i / w;
        let x = i % w;
        let mut acc = weights[radius as usize] * tmp[i as usize];
        for k in 1..radius + 1 {
            let xa = reflect_shifted(x + radius - k, radius, w);
            let xb = reflect_shifted(x + radius + k, radius, w);
            acc += weights[(radius + k) as usize] * (tmp[(y * w + xa) as usize] + tmp[(y * w + xb) as usize]);
        }
        blur[i as usize] = acc;
    }
}

/// |5-point Laplacian| of the blurred plane `z`; running max and argmax.
#[cube(launch)]
fn update_log(blur: &[f32], best: &mut [f32], depth: &mut [u32], z: u32, h: u32, w: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < h * w {
        let y = i / w;
        let x = i % w;
        let mut yu = y;
        if y > 0 {
            yu = y - 1;
        }
        let mut yd = y;
        if y + 1 < h {
            yd = y + 1;
        }
        let mut xl = x;
        if x > 0 {
            xl = x - 1;
        }
        let mut xr = x;
        if x + 1 < w {
            xr = x + 1;
        }
        let c = blur[i as usize];
        let up = blur[(yu * w + x) as usize];
        let dn = blur[(yd * w + x) as usize];
        let l = blur[(y * w + xl) as usize];
        let r = blur[(y * w + xr) as usize];
        let lap = ((up + dn) - (c + c)) + ((l + r) - (c + c));
        let mut m = lap;
        if lap < 0.0f32 {
            m = 0.0f32 - lap;
        }
        if z == 0 {
            best[i as usize] = m;
            depth[i as usize] = 0u32;
        } else if m > best[i as usize] {
            best[i as usize] = m;
            depth[i as usize] = z;
        }
    }
}

/// Gaussian-difference weight of plane `z`; running weighted sums, plain sum, argmax.
#[cube(launch)]
fn update_weighted(
    input: &[u32],
    blur: &[f32],
    best: &mut [f32],
    depth: &mut [u32],
    num: &mut [f32],
    den: &mut [f32],
    sum: &mut [f32],
    z: u32,
    pixels: u32,
    plane_words: u32,
    #[comptime] kind: u32,
) {
    let i = ABSOLUTE_POS as u32;
    if i < pixels {
        let v = load_pixel(input, z, plane_words, i, kind);
        let d = v - blur[i as usize];
        let mut wt = d;
        if d < 0.0f32 {
            wt = 0.0f32 - d;
        }
        let j = i as usize;
        if z == 0 {
            num[j] = 0.0f32 + wt * v;
            den[j] = 0.0f32 + wt;
            sum[j] = 0.0f32 + v;
            best[j] = wt;
            depth[j] = 0u32;
        } else {
            num[j] += wt * v;
            den[j] += wt;
            sum[j] += v;
            if wt > best[j] {
                best[j] = wt;
                depth[j] = z;
            }
        }
    }
}

#[cube(launch)]
fn finish_weighted(num: &[f32], den: &[f32], sum: &[f32], out: &mut [f32], pixels: u32, planes: u32) {
    let i = ABSOLUTE_POS;
    if i < pixels as usize {
        if den[i] > 0.0f32 {
            out[i] = num[i] / den[i];
        } else {
            out[i] = sum[i] / f32::cast_from(planes);
        }
    }
}

/// Gathers `input[depth[p]][p]` into packed output words; also packs the depth as u16.
// CubeCL kernels take the plain arithmetic, not div_ceil.
#[allow(clippy::manual_div_ceil)]
#[cube(launch)]
fn gather(input: &[u32], depth: &[u32], out: &mut [u32], depth_out: &mut [u32], pixels: u32, plane_words: u32, #[comptime] kind: u32) {
    let wi = ABSOLUTE_POS as u32;
    let out_words = plane_words;
    if wi < out_words {
        let mut per = 1u32;
        let mut bits = 32u32;
        if kind == 0 {
            per = 4u32;
            bits = 8u32;
        } else if kind == 1 {
            per = 2u32;
            bits = 16u32;
        }
        let mut word = 0u32;
        for k in 0..per {
            let p = wi * per + k;
            if p < pixels {
                let z = depth[p as usize];
                let src = input[(z * plane_words + p / per) as usize];
                let mut v = src;
                if kind != 2 {
                    let mask = (1u32 << bits) - 1u32;
                    v = (src >> ((p % per) * bits)) & mask;
                }
                word |= v << (k * bits);
            }
        }
        out[wi as usize] = word;
    }
    // depth as packed u16: two pixels per word
    let depth_words = (pixels + 1) / 2;
    if wi < depth_words {
        let p0 = wi * 2;
        let mut dw = depth[p0 as usize];
        if p0 + 1 < pixels {
            dw |= depth[(p0 + 1) as usize] << 16u32;
        }
        depth_out[wi as usize] = dw;
    }
}

fn too_large(what: &str) -> FunctionError {
    FunctionError::too_large(NAME, format!("{what} too large for GPU indexing"))
}

/// Focus-stacks a wgpu stack: `(image, depth)`, both one-plane wgpu arrays
/// (`image`: input dtype for `log`, f32 for `weighted`; `depth`: u16 plane index).
/// Same contract and validation as `hcsflow_ops::focus::focus_stack`.
pub fn focus_stack_wgpu(input: &WgpuArray, sigma: f64, method: FocusMethod) -> Result<(WgpuArray, WgpuArray), FunctionError> {
    let shape = input.shape().to_vec();
    if shape.len() != 3 {
        return Err(FunctionError::NotAStack { function: NAME.into(), shape });
    }
    let (n, h, w) = (shape[0], shape[1], shape[2]);
    if n == 0 {
        return Err(FunctionError::invalid(NAME, "the stack has no planes"));
    }
    if n > MAX_PLANES {
        return Err(FunctionError::invalid(NAME, format!("{n} planes; at most {MAX_PLANES} supported")));
    }
    if !(sigma.is_finite() && sigma > 0.0 && sigma <= hcsflow_ops::focus::MAX_SIGMA) {
        return Err(FunctionError::invalid(NAME, format!("sigma {sigma} must be in (0, {}]", hcsflow_ops::focus::MAX_SIGMA)));
    }
    let dtype = input.dtype();
    let kind = kind_of(dtype);
    let pixels = h * w;
    let px = u32::try_from(pixels).map_err(|_| too_large("plane"))?;
    let hu = u32::try_from(h).map_err(|_| too_large("height"))?;
    let wu = u32::try_from(w).map_err(|_| too_large("width"))?;
    let words = input.plane_words();
    let words_u = u32::try_from(words).map_err(|_| too_large("plane"))?;
    u32::try_from(n * words).map_err(|_| too_large("stack"))?;
    let ctx = input.context().clone();
    let client = ctx.client();
    let g = focus_kernel(sigma);
    let radius = (g.len() / 2) as u32;
    let weights = ctx.upload_bytes(bytemuck::cast_slice(&g));
    let plane_f32 = pixels.max(1) * 4;
    let tmp = client.empty(plane_f32);
    let blur = client.empty(plane_f32);
    let best = client.empty(plane_f32);
    let depth = client.empty(plane_f32);
    let dim = CubeDim::new_1d(BLOCK);
    let count = grid(pixels);
    let in_len = n * words;
    let (num, den, sum) = match method {
        FocusMethod::Weighted => (Some(client.empty(plane_f32)), Some(client.empty(plane_f32)), Some(client.empty(plane_f32))),
        FocusMethod::Log => (None, None, None),
    };
    // SAFETY (every launch below): each buffer holds at least the length passed
    // with it: input n × words words, weights g.len(), scratch planes `pixels` values.
    for z in 0..n as u32 {
        unsafe {
            vblur::launch(
                client,
                count.clone(),
                dim,
                BufferArg::from_raw_parts(input.handle.clone(), in_len),
                BufferArg::from_raw_parts(tmp.clone(), pixels),
                BufferArg::from_raw_parts(weights.clone(), g.len()),
                z,
                hu,
                wu,
                words_u,
                radius,
                kind,
            );
            hblur::launch(
                client,
                count.clone(),
                dim,
                BufferArg::from_raw_parts(tmp.clone(), pixels),
                BufferArg::from_raw_parts(blur.clone(), pixels),
                BufferArg::from_raw_parts(weights.clone(), g.len()),
                hu,
                wu,
                radius,
            );
            match (&num, &den, &sum) {
                (Some(num), Some(den), Some(sum)) => update_weighted::launch(
                    client,
                    count.clone(),
                    dim,
                    BufferArg::from_raw_parts(input.handle.clone(), in_len),
                    BufferArg::from_raw_parts(blur.clone(), pixels),
                    BufferArg::from_raw_parts(best.clone(), pixels),
                    BufferArg::from_raw_parts(depth.clone(), pixels),
                    BufferArg::from_raw_parts(num.clone(), pixels),
                    BufferArg::from_raw_parts(den.clone(), pixels),
                    BufferArg::from_raw_parts(sum.clone(), pixels),
                    z,
                    px,
                    words_u,
                    kind,
                ),
                _ => update_log::launch(
                    client,
                    count.clone(),
                    dim,
                    BufferArg::from_raw_parts(blur.clone(), pixels),
                    BufferArg::from_raw_parts(best.clone(), pixels),
                    BufferArg::from_raw_parts(depth.clone(), pixels),
                    z,
                    hu,
                    wu,
                ),
            }
        }
    }
    let out_shape = vec![1, h, w];
    let depth_words = words_for(DType::U16, pixels);
    let depth_out = client.empty(depth_words.max(1) * 4);
    let gather_words = words.max(depth_words);
    // SAFETY: as above; `out` holds `words` words, `depth_out` `depth_words` words,
    // and the gather kernel writes each only below its own length.
    let image = unsafe {
        let out = client.empty(words.max(1) * 4);
        gather::launch(
            client,
            grid(gather_words),
            dim,
            BufferArg::from_raw_parts(input.handle.clone(), in_len),
            BufferArg::from_raw_parts(depth.clone(), pixels),
            BufferArg::from_raw_parts(out.clone(), words),
            BufferArg::from_raw_parts(depth_out.clone(), depth_words),
            px,
            words_u,
            kind,
        );
        match (&num, &den, &sum) {
            (Some(num), Some(den), Some(sum)) => {
                let f = client.empty(plane_f32);
                finish_weighted::launch(
                    client,
                    count.clone(),
                    dim,
                    BufferArg::from_raw_parts(num.clone(), pixels),
                    BufferArg::from_raw_parts(den.clone(), pixels),
                    BufferArg::from_raw_parts(sum.clone(), pixels),
                    BufferArg::from_raw_parts(f.clone(), pixels),
                    px,
                    n as u32,
                );
                WgpuArray::from_parts(ctx.clone(), f, out_shape.clone(), DType::F32)
            }
            _ => WgpuArray::from_parts(ctx.clone(), out, out_shape.clone(), dtype),
        }
    };
    let depth_map = WgpuArray::from_parts(ctx.clone(), depth_out, out_shape, DType::U16);
    Ok((image, depth_map))
}

pub(super) fn focus_stack(array: Array, args: &FocusStackArgs) -> Result<Array, FunctionError> {
    let input = wgpu_input(NAME, &array)?;
    let (image, _depth) = focus_stack_wgpu(input, args.sigma, args.focus_method()?)?;
    Ok(Array::Device(Arc::new(image)))
}
