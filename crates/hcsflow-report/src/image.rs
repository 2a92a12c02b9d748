//! What the report shows of one image: its quality measures, and thumbnails
//! (downsampled, contrast-stretched, channels composited, PNG-encoded).

use base64::Engine as _;
pub use hcsflow_ops::quality::Quality;

/// A plane as the report reads it: f32 values, row-major, with the largest
/// value its dtype can hold (saturation) when it is an integer dtype.
#[derive(Debug, Clone)]
pub struct Plane {
    pub height: usize,
    pub width: usize,
    pub values: Vec<f32>,
    /// 255 for u8, 65535 for u16; `None` for f32 (no saturation level).
    pub saturation: Option<f32>,
}

/// The quality measures of `plane`: [`hcsflow_ops::quality::quality`], the
/// measures of the `image_quality` function, with the plane's saturation level.
pub fn quality(plane: &Plane) -> Quality {
    hcsflow_ops::quality::quality(&plane.values, plane.height, plane.width, plane.saturation)
}

/// `plane` shrunk by an integer factor so that its longer side is at most
/// `max_side`: each output pixel the mean of a `factor × factor` block (the
/// last row and column of blocks may be partial). Returns (height, width, values).
pub fn downsample(plane: &Plane, max_side: usize) -> (usize, usize, Vec<f32>) {
    let (h, w) = (plane.height, plane.width);
    let factor = h.max(w).div_ceil(max_side.max(1)).max(1);
    let (oh, ow) = (h.div_ceil(factor), w.div_ceil(factor));
    let mut sums = vec![0f32; oh * ow];
    let mut counts = vec![0u32; oh * ow];
    for y in 0..h {
        let row = &plane.values[y * w..(y + 1) * w];
        let out_row = (y / factor) * ow;
        for (x, &v) in row.iter().enumerate() {
            sums[out_row + x / factor] += v;
            counts[out_row + x / factor] += 1;
        }
    }
    let values = sums.iter().zip(&counts).map(|(&s, &c)| if c == 0 { 0.0 } else { s / c as f32 }).collect();
    (oh, ow, values)
}

/// `values` mapped to 0–255 linearly between their 0.5th and 99.5th
/// percentiles (clipped outside); a constant image maps to 0.
pub fn stretch(values: &[f32]) -> Vec<u8> {
    let mut sorted: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return vec![0; values.len()];
    }
    sorted.sort_by(f32::total_cmp);
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    let (lo, hi) = (at(0.005), at(0.995));
    let span = if hi > lo { hi - lo } else { 1.0 };
    values.iter().map(|&v| (((v - lo) / span).clamp(0.0, 1.0) * 255.0).round() as u8).collect()
}

/// The colour of channel `index` (0-based) in a composite: one channel is
/// grey; with more, blue, green, red, magenta, cyan, yellow (the usual
/// DAPI-first order), repeating.
fn channel_colour(index: usize, channels: usize) -> [f32; 3] {
    const COLOURS: [[f32; 3]; 6] = [[0.0, 0.4, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 0.0]];
    if channels == 1 {
        [1.0; 3]
    } else {
        COLOURS[index % COLOURS.len()]
    }
}

/// An RGB composite of stretched channels of one size (`height × width` each,
/// in channel order): each channel tinted (`channel_colour`) and added,
/// clipped at 255. Returns `height × width × 3` bytes.
pub fn composite(channels: &[Vec<u8>], height: usize, width: usize) -> Vec<u8> {
    let mut rgb = vec![0f32; height * width * 3];
    for (c, values) in channels.iter().enumerate() {
        let colour = channel_colour(c, channels.len());
        for (px, &v) in rgb.chunks_exact_mut(3).zip(values) {
            for (dst, k) in px.iter_mut().zip(colour) {
                *dst += f32::from(v) * k;
            }
        }
    }
    rgb.into_iter().map(|v| v.min(255.0).round() as u8).collect()
}

/// `rgb` (`height × width × 3` bytes) as a PNG `data:` URI.
pub fn png_data_uri(rgb: &[u8], height: usize, width: usize) -> Result<String, png::EncodingError> {
    let mut bytes = Vec::new();
    {
        let (w, h) = (u32::try_from(width).unwrap_or(u32::MAX), u32::try_from(height).unwrap_or(u32::MAX));
        let mut encoder = png::Encoder::new(&mut bytes, w, h);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header()?;
        writer.write_image_data(rgb)?;
        writer.finish()?;
    }
    Ok(format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes)))
}

/// Viridis at `t` in [0, 1] (clamped), as `#rrggbb`: nine anchors of
/// matplotlib's viridis (CC0), linearly interpolated.
pub fn viridis(t: f64) -> String {
    const ANCHORS: [[f64; 3]; 9] = [
        [68.0, 1.0, 84.0],
        [71.0, 44.0, 122.0],
        [59.0, 81.0, 139.0],
        [44.0, 113.0, 142.0],
        [33.0, 144.0, 141.0],
        [39.0, 173.0, 129.0],
        [92.0, 200.0, 99.0],
        [170.0, 220.0, 50.0],
        [253.0, 231.0, 37.0],
    ];
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 0.0 };
    let x = t * (ANCHORS.len() - 1) as f64;
    let i = (x.floor() as usize).min(ANCHORS.len() - 2);
    let f = x - i as f64;
    let c: Vec<u8> = (0..3).map(|k| (ANCHORS[i][k] * (1.0 - f) + ANCHORS[i + 1][k] * f).round() as u8).collect();
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

/// Viridis for a whole plane (a flat-field profile), `height × width × 3`
/// bytes, scaled between the plane's minimum and maximum.
pub fn viridis_rgb(values: &[f32]) -> Vec<u8> {
    let (lo, hi) = values.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let span = if hi > lo { f64::from(hi - lo) } else { 1.0 };
    values
        .iter()
        .flat_map(|&v| {
            let hex = viridis(f64::from(v - lo) / span);
            let byte = |k: usize| u8::from_str_radix(&hex[1 + 2 * k..3 + 2 * k], 16).unwrap_or(0);
            [byte(0), byte(1), byte(2)]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plane(h: usize, w: usize, f: impl Fn(usize, usize) -> f32) -> Plane {
        Plane { height: h, width: w, values: (0..h * w).map(|i| f(i / w, i % w)).collect(), saturation: Some(255.0) }
    }

    #[test]
    fn downsampling_averages_blocks_and_keeps_partial_ones() {
        let p = plane(5, 4, |y, x| (y * 4 + x) as f32);
        // Factor ceil(5 / 2) = 3: blocks rows 0..3 and 3..5, columns 0..3 and 3..4.
        let (h, w, v) = downsample(&p, 2);
        assert_eq!((h, w), (2, 2));
        let mean = |ys: std::ops::Range<usize>, xs: std::ops::Range<usize>| {
            let vals: Vec<f32> = ys.flat_map(|y| xs.clone().map(move |x| (y * 4 + x) as f32)).collect();
            vals.iter().sum::<f32>() / vals.len() as f32
        };
        assert_eq!(v, vec![mean(0..3, 0..3), mean(0..3, 3..4), mean(3..5, 0..3), mean(3..5, 3..4)]);
        assert_eq!(downsample(&p, 8).2, p.values, "no larger than the plane: unchanged");
    }

    #[test]
    fn stretching_clips_at_the_percentiles_and_handles_constants() {
        let values: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let s = stretch(&values);
        assert_eq!((s[0], s[5], s[999]), (0, 0, 255));
        assert!(s[500] > 120 && s[500] < 135, "{}", s[500]);
        assert!(stretch(&[3.0; 10]).iter().all(|&v| v == 0));
    }

    #[test]
    fn a_thumbnail_is_a_png_data_uri() {
        let uri = png_data_uri(&[255, 0, 0, 0, 255, 0], 1, 2).unwrap();
        let bytes = base64::engine::general_purpose::STANDARD.decode(uri.trim_start_matches("data:image/png;base64,")).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(viridis(0.0), "#440154");
        assert_eq!(viridis(1.0), "#fde725");
        assert_eq!(composite(&[vec![255], vec![255]], 1, 1), vec![0, 255, 255]);
    }
}
