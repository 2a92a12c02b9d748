//! White top-hat on the GPU: `white_tophat` (`image − opening(image, disk(r))`,
//! skimage's `white_tophat(image, disk(r))`), the host's definition in
//! `hcsflow_ops::tophat`: skimage's disk `dy² + dx² ≤ r²`, out-of-image pixels
//! ignored, erosion then dilation, the subtraction in the input dtype.
//!
//! Erosion (dilation) by the disk is, as on the host, the min (max) over the
//! rows `y + dy`, `|dy| ≤ r`, of a horizontal min over the chord
//! `[x − hw(dy), x + hw(dy)]`, `hw` the host's `chord_half_width`. A chord of
//! `len = 2·hw + 1` pixels is the union of two windows of `2^k ≤ len` pixels
//! (`k = ⌊log2 len⌋`), read from level `k` of a sparse table of each row
//! (level `k`: the min over `[x, x + 2^k)`), windows reaching past the row
//! from its prefix or suffix minima. Levels are built one at a time (level
//! `k` from level `k − 1`) and every row offset whose chord uses level `k`
//! is folded into the result before the next: device memory is six f32-sized
//! planes per plane in flight whatever the radius, work per pixel
//! `2r + 1` lookups plus `⌊log2(2r + 1)⌋` level steps.
//!
//! Pixels are compared as 32-bit order-preserving keys (u8/u16 values; the
//! `total_cmp` key of an f32), where min and max are exact, so the result is
//! the host's: bit for bit for u8/u16; for f32 equal values (an f32 −0 and
//! +0 are one value to the host's `<` and two keys here, so a zero may come
//! out with the other sign) and the same IEEE subtraction. NaN is refused with
//! the host's error; radius above `MAX_RADIUS` too.

use std::sync::Arc;

use cubecl::prelude::*;
use cubecl::server::Handle;
use hcsflow_core::{Array, DType, DeviceBuffer, FunctionError, StackShape};
use hcsflow_ops::tophat::{chord_half_width, WhiteTophatArgs, MAX_RADIUS, WHITE_TOPHAT};

use super::normalize::{geometry, key_of, read_u32, zeros};
use super::{grid, kind_of, lane, lanes_of, wgpu_input, BLOCK};
use crate::array::WgpuArray;
use crate::context::GpuContext;

const NAME: &str = WHITE_TOPHAT.name;

/// Bytes of one key buffer for the planes processed in one pass: planes of a
/// stack go through the kernels in chunks of at most this (at least one plane).
const CHUNK_BYTES: usize = 16 << 20;

/// Key buffers a chunk needs: keys, prefix, suffix, two sparse-table levels, eroded.
const BUFFERS: u64 = 6;

/// Planes per chunk for planes of `pixels` pixels.
fn chunk_planes(pixels: usize, planes: usize) -> usize {
    (CHUNK_BYTES / (pixels.max(1) * 4)).clamp(1, planes.max(1))
}

/// Device scratch of a top-hat on `shape`: six key buffers of one chunk.
pub(super) fn scratch(shape: &StackShape, _dtype: DType) -> u64 {
    let pixels = shape.height * shape.width;
    BUFFERS * (chunk_planes(pixels, shape.depth) * pixels * 4) as u64
}

/// The (min, max) of two keys, as the pass (`erode`: min) takes them.
#[cube]
fn op(a: u32, b: u32, #[comptime] erode: bool) -> u32 {
    let mut r = a;
    if erode {
        if b < a {
            r = b;
        }
    } else if b > a {
        r = b;
    }
    r
}

/// `keys[t]` = key of pixel `t` of the chunk starting at plane `plane0`;
/// `nan[0]` set when an f32 pixel is NaN.
#[cube(launch)]
fn to_keys(
    input: &[u32],
    keys: &mut [u32],
    nan: &mut [Atomic<u32>],
    total: u32,
    plane0: u32,
    pixels: u32,
    plane_words: u32,
    #[comptime] kind: u32,
) {
    let t = ABSOLUTE_POS as u32;
    if t < total {
        let plane = plane0 + t / pixels;
        let p = t % pixels;
        let lanes = lanes_of(kind);
        let raw = lane(input[(plane * plane_words + p / lanes) as usize], p % lanes, kind);
        let mut k = raw;
        if kind == 2 {
            if (raw & 0x7FFF_FFFFu32) > 0x7F80_0000u32 {
                nan[0].fetch_max(1u32);
            }
            k = key_of(raw);
        }
        keys[t as usize] = k;
    }
}

/// Prefix and suffix min (max) of every row where windows read them:
/// `pre[x]` over `[0, x]` for `x < span`, `suf[x]` over `[x, w)` for
/// `x ≥ w − span` (`span = min(w, 2r + 1)`: a window is at most `2r + 1`
/// pixels, so one reaching past the row ends or starts within `span` of its
/// edge). Bounded so, a thread's loops stay below lavapipe's limit of 65,535
/// iterations per invocation whatever the width.
#[cube(launch)]
fn row_scans(src: &[u32], pre: &mut [u32], suf: &mut [u32], rows: u32, w: u32, span: u32, #[comptime] erode: bool) {
    let row = ABSOLUTE_POS as u32;
    if row < rows {
        let base = row * w;
        let mut acc = src[base as usize];
        for x in 0..span {
            acc = op(acc, src[(base + x) as usize], erode);
            pre[(base + x) as usize] = acc;
        }
        acc = src[(base + w - 1u32) as usize];
        for t in 0..span {
            let x = w - 1u32 - t;
            acc = op(acc, src[(base + x) as usize], erode);
            suf[(base + x) as usize] = acc;
        }
    }
}

/// Next sparse-table level: `dst[x] = op(src[x], src[x + half])` where it fits in the row.
#[cube(launch)]
fn next_level(src: &[u32], dst: &mut [u32], total: u32, w: u32, half: u32, #[comptime] erode: bool) {
    let t = ABSOLUTE_POS as u32;
    if t < total {
        let x = t % w;
        let mut v = src[t as usize];
        if x + half < w {
            v = op(v, src[(t + half) as usize], erode);
        }
        dst[t as usize] = v;
    }
}

/// `acc[t] = value`.
#[cube(launch)]
fn fill(acc: &mut [u32], total: u32, value: u32) {
    let t = ABSOLUTE_POS as u32;
    if t < total {
        acc[t as usize] = value;
    }
}

/// The min (max) over `[s, s + len)` of the row at `base` (width `w`), the
/// part inside the row: `level` where the window fits, else the prefix or suffix.
#[cube]
fn window(level: &[u32], pre: &[u32], suf: &[u32], base: u32, s: i32, len: i32, w: i32, identity: u32) -> u32 {
    let e = s + len - 1i32;
    let mut v = identity;
    if s >= 0i32 && e < w {
        v = level[(base + s as u32) as usize];
    } else if s < 0i32 && e < w {
        if e >= 0i32 {
            v = pre[(base + e as u32) as usize];
        }
    } else if s >= 0i32 {
        if s < w {
            v = suf[(base + s as u32) as usize];
        }
    } else {
        v = pre[(base + w as u32 - 1u32) as usize];
    }
    v
}

/// Folds into `acc` the chords of the row offsets `dys[start..end]` (half-widths
/// `hws`), all of which use the current level (windows of `len = 2^k` pixels).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn fold_level(
    level: &[u32],
    pre: &[u32],
    suf: &[u32],
    dys: &[i32],
    hws: &[i32],
    acc: &mut [u32],
    total: u32,
    h: u32,
    w: u32,
    start: u32,
    end: u32,
    len: u32,
    identity: u32,
    #[comptime] erode: bool,
) {
    let t = ABSOLUTE_POS as u32;
    if t < total {
        let pixels = h * w;
        let plane_base = (t / pixels) * pixels;
        let p = t % pixels;
        let y = (p / w) as i32;
        let x = (p % w) as i32;
        let (hi, wi, li) = (h as i32, w as i32, len as i32);
        let mut a = acc[t as usize];
        for j in start..end {
            let yi = y + dys[j as usize];
            if yi >= 0i32 && yi < hi {
                let hw = hws[j as usize];
                let base = plane_base + yi as u32 * w;
                let left = window(level, pre, suf, base, x - hw, li, wi, identity);
                let right = window(level, pre, suf, base, x + hw + 1i32 - li, li, wi, identity);
                a = op(a, op(left, right, erode), erode);
            }
        }
        acc[t as usize] = a;
    }
}

/// `output = input − opened` per lane of the chunk's words (`opened`: keys).
#[cube(launch)]
fn subtract(
    input: &[u32],
    opened: &[u32],
    output: &mut [u32],
    words: u32,
    plane0: u32,
    plane_words: u32,
    pixels: u32,
    #[comptime] kind: u32,
) {
    let t = ABSOLUTE_POS as u32;
    if t < words {
        let plane_local = t / plane_words;
        let word = t % plane_words;
        let i = (plane0 * plane_words + t) as usize;
        let v = input[i];
        let lanes = lanes_of(kind);
        let bits = 32u32 / lanes;
        let mut out = 0u32;
        for j in 0..lanes {
            let p = word * lanes + j;
            if p < pixels {
                let o = opened[(plane_local * pixels + p) as usize];
                if kind == 2 {
                    let mut ob = o ^ 0xFFFF_FFFFu32;
                    if (o & 0x8000_0000u32) != 0u32 {
                        ob = o & 0x7FFF_FFFFu32;
                    }
                    out = u32::reinterpret(f32::reinterpret(v) - f32::reinterpret(ob));
                } else {
                    out |= (lane(v, j, kind) - o) << (j * bits);
                }
            }
        }
        output[i] = out;
    }
}

/// Row offsets grouped by sparse-table level: `(dys, hws, ranges)` with
/// `ranges[k]` the slice of offsets whose chord takes windows of `2^k` pixels.
fn offsets_by_level(r: usize) -> (Vec<i32>, Vec<i32>, Vec<(u32, u32)>) {
    let level_of = |hw: usize| (usize::BITS - 1 - (2 * hw + 1).leading_zeros()) as usize;
    let levels = level_of(r) + 1;
    let (mut dys, mut hws, mut ranges) = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..levels {
        let start = dys.len() as u32;
        for dy in -(r as i64)..=r as i64 {
            let hw = chord_half_width(r, dy.unsigned_abs() as usize);
            if level_of(hw) == k {
                dys.push(dy as i32);
                hws.push(hw as i32);
            }
        }
        ranges.push((start, dys.len() as u32));
    }
    (dys, hws, ranges)
}

/// The buffers of one chunk and the geometry the passes share.
struct Pass<'a> {
    ctx: &'a GpuContext,
    h: usize,
    w: usize,
    radius: usize,
    pre: Handle,
    suf: Handle,
    levels: [Handle; 2],
    dys: Handle,
    hws: Handle,
    ranges: &'a [(u32, u32)],
    n_offsets: usize,
}

impl Pass<'_> {
    /// Erosion (`erode`) or dilation of the `planes` planes in `src` into `dst`.
    fn morph(&self, src: &Handle, dst: &Handle, planes: usize, erode: bool) {
        let total = planes * self.h * self.w;
        let client = self.ctx.client();
        let (count, dim) = (grid(total), CubeDim::new_1d(BLOCK));
        let identity = if erode { u32::MAX } else { 0 };
        let rows = planes * self.h;
        // SAFETY: every plane buffer holds `total` keys; rows are `w` apart and
        // every index is inside its row (x + half < w, windows clipped to [0, w));
        // dys/hws hold n_offsets entries and the ranges stay below it.
        unsafe {
            let buf = |h: &Handle| BufferArg::from_raw_parts(h.clone(), total);
            let (w, span) = (self.w as u32, self.w.min(2 * self.radius + 1) as u32);
            row_scans::launch(client, grid(rows), dim, buf(src), buf(&self.pre), buf(&self.suf), rows as u32, w, span, erode);
            fill::launch(client, count.clone(), dim, buf(dst), total as u32, identity);
            for (k, &(start, end)) in self.ranges.iter().enumerate() {
                let level = if k == 0 {
                    src
                } else {
                    let (from, to) = if k == 1 { (src, &self.levels[0]) } else { (&self.levels[k % 2], &self.levels[(k + 1) % 2]) };
                    let half = 1u32 << (k - 1);
                    next_level::launch(client, count.clone(), dim, buf(from), buf(to), total as u32, self.w as u32, half, erode);
                    to
                };
                if start == end {
                    continue;
                }
                fold_level::launch(
                    client,
                    count.clone(),
                    dim,
                    buf(level),
                    buf(&self.pre),
                    buf(&self.suf),
                    BufferArg::from_raw_parts(self.dys.clone(), self.n_offsets),
                    BufferArg::from_raw_parts(self.hws.clone(), self.n_offsets),
                    buf(dst),
                    total as u32,
                    self.h as u32,
                    self.w as u32,
                    start,
                    end,
                    1u32 << k,
                    identity,
                    erode,
                );
            }
        }
    }
}

pub(super) fn white_tophat(array: Array, args: &WhiteTophatArgs) -> Result<Array, FunctionError> {
    let input = wgpu_input(NAME, &array)?;
    let radius = args.radius.max(0) as usize;
    if radius > MAX_RADIUS {
        return Err(FunctionError::invalid(NAME, format!("radius {radius} is larger than {MAX_RADIUS}")));
    }
    let g = geometry(NAME, input)?;
    let shape = DeviceBuffer::shape(input).to_vec();
    let (h, w) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let dtype = DeviceBuffer::dtype(input);
    let kind = kind_of(dtype);
    let ctx = input.context();
    let client = ctx.client();
    let chunk = chunk_planes(g.pixels, g.planes);
    let words = chunk * g.pixels;
    let keys = zeros(ctx, NAME, words)?;
    let eroded = zeros(ctx, NAME, words)?;
    let (dys, hws, ranges) = offsets_by_level(radius);
    let pass = Pass {
        ctx,
        h,
        w,
        radius,
        pre: zeros(ctx, NAME, words)?,
        suf: zeros(ctx, NAME, words)?,
        levels: [zeros(ctx, NAME, words)?, zeros(ctx, NAME, words)?],
        dys: ctx.upload_bytes(bytemuck::cast_slice(&dys)),
        hws: ctx.upload_bytes(bytemuck::cast_slice(&hws)),
        ranges: &ranges,
        n_offsets: dys.len(),
    };
    let nan = zeros(ctx, NAME, 1)?;
    let out = zeros(ctx, NAME, g.total_words)?;
    let dim = CubeDim::new_1d(BLOCK);
    for plane0 in (0..g.planes).step_by(chunk) {
        let planes = chunk.min(g.planes - plane0);
        let total = planes * g.pixels;
        let chunk_words = planes * g.plane_words;
        // SAFETY: input holds total_words words and the chunk's planes are below
        // g.planes; keys holds chunk · pixels ≥ total keys; nan one counter.
        unsafe {
            to_keys::launch(
                client,
                grid(total),
                dim,
                BufferArg::from_raw_parts(input.handle.clone(), g.total_words),
                BufferArg::from_raw_parts(keys.clone(), words),
                BufferArg::from_raw_parts(nan.clone(), 1),
                total as u32,
                plane0 as u32,
                g.pixels as u32,
                g.plane_words as u32,
                kind,
            );
        }
        pass.morph(&keys, &eroded, planes, true);
        pass.morph(&eroded, &keys, planes, false);
        // SAFETY: output holds total_words words, the chunk's words start at
        // plane0 · plane_words; keys holds the chunk's opened keys.
        unsafe {
            subtract::launch(
                client,
                grid(chunk_words),
                dim,
                BufferArg::from_raw_parts(input.handle.clone(), g.total_words),
                BufferArg::from_raw_parts(keys.clone(), words),
                BufferArg::from_raw_parts(out.clone(), g.total_words),
                chunk_words as u32,
                plane0 as u32,
                g.plane_words as u32,
                g.pixels as u32,
                kind,
            );
        }
    }
    if dtype == DType::F32 && read_u32(ctx, NAME, nan, 1)?[0] != 0 {
        return Err(FunctionError::invalid(NAME, "the image contains NaN; morphology on NaN is undefined"));
    }
    Ok(Array::Device(Arc::new(WgpuArray::from_parts(ctx.clone(), out, shape, dtype))))
}

#[cfg(test)]
mod tests {
    use super::offsets_by_level;

    #[test]
    fn every_row_offset_is_in_exactly_one_level() {
        for r in [0usize, 1, 2, 5, 50, 1000] {
            let (dys, hws, ranges) = offsets_by_level(r);
            assert_eq!(dys.len(), 2 * r + 1);
            let mut sorted = dys.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (-(r as i32)..=r as i32).collect::<Vec<_>>());
            for (k, &(s, e)) in ranges.iter().enumerate() {
                for j in s as usize..e as usize {
                    let len = 2 * hws[j] as usize + 1;
                    assert!(1 << k <= len && len < 2 << k, "r {r} dy {} len {len} level {k}", dys[j]);
                }
            }
        }
    }
}
