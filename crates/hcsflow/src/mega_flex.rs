//! The "Mega Flex" pipeline (`examples/mega_flex.toml`, `hcsflow demo
//! --pipeline mega-flex`): BaSiC flat-field, N2V2 denoising, 3D
//! Richardson–Lucy, z-flattening, enhancement, channel composite, tile
//! positions, assembly and nuclei, and its quality measured step by step
//! against the truth of a synthetic plate ([`quality_against_truth`]).
//!
//! Every measure compares a step's output and its input with the truth
//! `hcsflow-synth` writes in `PLATE/ground_truth/`, so "the step improved its
//! input" is a number, not an impression:
//!
//! | step | measure | input | output |
//! |---|---|---|---|
//! | `flatfield` | mean relative error of the flat-field (both at mean 1) | no correction (uniform) | BaSiC's fit |
//! | `denoised` | PSNR of the in-focus plane vs the clean in-focus plane (the truth blurred by the optics, `clean_*.tif`) (dB) | the corrected plane | the denoised plane |
//! | `deconvolved` | sharpness ([`sharpness`]: the variance of the Laplacian of the plane smoothed by a Gaussian of σ 1 px, over its mean squared; the truth's as the target) and PSNR vs the unblurred truth (`truth_*.tif`) of the tile's max-Z, [`DECONVOLUTION_MARGIN_PX`] in from its border | max-Z of the denoised stack | max-Z of the deconvolved stack |
//! | `positions` | RMS tile position error (px, the well's mean offset removed) | stage positions | registered positions |
//! | `nuclei` | nuclei counted (the truth: nuclei in the tiles' area) | — | segmented nuclei |
//!
//! PSNR: `10·log10(range² / MSE)` with `range` the truth window's max − min,
//! after the least-squares affine match `a·x + b` of the image to the truth
//! (the corrected images are in the flat-field's units, not the truth's).
//! The truth window of a tile is the truth image sampled bilinearly at the
//! tile's true (fractional) position.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hcsflow_io::{write_atomic, Durability};
use hcsflow_pipeline::{Manifest, PipelineError, PipelineSpec};
use hcsflow_synth::SynthConfig;

/// The Mega Flex pipeline's text, the file `examples/mega_flex.toml` (embedded).
pub const MEGA_FLEX_PIPELINE: &str = include_str!("../../../examples/mega_flex.toml");

/// Where the Mega Flex pipeline comes from, as its errors and front ends name it.
pub const MEGA_FLEX_PIPELINE_ORIGIN: &str = "examples/mega_flex.toml (built in)";

pub use hcsflow_report::truth::{Better, QualityRow, QUALITY_CSV_NAME, QUALITY_JSON_NAME};

/// The Mega Flex pipeline, parsed. An error here is a bug of this build.
pub fn mega_flex_pipeline() -> Result<PipelineSpec, PipelineError> {
    PipelineSpec::parse(MEGA_FLEX_PIPELINE, MEGA_FLEX_PIPELINE_ORIGIN)
}

/// The synthetic plate the Mega Flex demo runs on: `wells` of 3×3 tiles of
/// `size`², 2 channels, `z_planes` planes (at least 5: the pipeline's PSF
/// spans 5 planes), the default shading and jitter, and the clean truth
/// images. Unlike the default plate: a low-light acquisition (read noise 40
/// counts, so denoising has something to remove: about 27 dB PSNR in DAPI,
/// 21 dB in GFP, against the clean in-focus plane), nuclei that never
/// overlap (every nucleus of the truth is countable) at a higher density,
/// 15 % tile overlap, so that the overlaps
/// of small tiles hold enough nuclei to register, and optics that blur the
/// in-focus plane by σ 2.5 px (the PSF the example's deconvolution assumes),
/// so that deconvolution has something to restore.
pub fn mega_flex_synth_config(wells: Vec<String>, size: u32, z_planes: u32) -> SynthConfig {
    SynthConfig {
        wells,
        size,
        z_planes,
        grid_rows: 3,
        grid_cols: 3,
        overlap: 0.15,
        channels: 2,
        read_noise: 40.0,
        nuclei_density: 600.0,
        nucleus_min_separation: 1.0,
        focus_blur_px: 2.5,
        truth_images: true,
        ..SynthConfig::default()
    }
}

/// Why the quality table could not be computed: names the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum QualityError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Tiff { path: PathBuf, source: hcsflow_tiff::TiffError },
    #[error("{path}: {problem}")]
    Invalid { path: PathBuf, problem: String },
    #[error("{0} holds no run_manifest.json: not the output folder of an hcsflow run")]
    NotARun(PathBuf),
    #[error(transparent)]
    Manifest(#[from] PipelineError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> QualityError + '_ {
    move |source| QualityError::Io { path: path.to_path_buf(), source }
}

fn invalid(path: &Path, problem: impl Into<String>) -> QualityError {
    QualityError::Invalid { path: path.to_path_buf(), problem: problem.into() }
}

/// The planes of a TIFF as f32, with their height and width.
fn read_planes(path: &Path) -> Result<(Vec<Vec<f32>>, usize, usize), QualityError> {
    let stack = hcsflow_tiff::read_stack(path).map_err(|source| QualityError::Tiff { path: path.to_path_buf(), source })?;
    let [_, h, w] = stack.shape();
    let a = stack.to_f32();
    Ok((a.outer_iter().map(|p| p.iter().copied().collect()).collect(), h, w))
}

/// The first plane of a TIFF.
fn read_plane(path: &Path) -> Result<(Vec<f32>, usize, usize), QualityError> {
    let (mut planes, h, w) = read_planes(path)?;
    if planes.is_empty() {
        return Err(invalid(path, "the TIFF has no plane"));
    }
    Ok((planes.swap_remove(0), h, w))
}

/// A CSV file as rows of (column → text).
struct Csv {
    path: PathBuf,
    rows: Vec<BTreeMap<String, String>>,
}

impl Csv {
    fn read(path: &Path) -> Result<Csv, QualityError> {
        let text = std::fs::read_to_string(path).map_err(io(path))?;
        let mut lines = hcsflow_report::tables::parse_csv(&text).into_iter();
        let header = lines.next().ok_or_else(|| invalid(path, "empty CSV (no header)"))?;
        let rows = lines.map(|l| header.iter().cloned().zip(l).collect()).collect();
        Ok(Csv { path: path.to_path_buf(), rows })
    }

    fn text<'a>(&self, row: &'a BTreeMap<String, String>, column: &str) -> Result<&'a str, QualityError> {
        row.get(column).map(String::as_str).ok_or_else(|| invalid(&self.path, format!("a row has no column '{column}'")))
    }

    fn number<T: std::str::FromStr>(&self, row: &BTreeMap<String, String>, column: &str) -> Result<T, QualityError> {
        let text = self.text(row, column)?;
        text.parse().map_err(|_| invalid(&self.path, format!("column '{column}': '{text}' is not a number")))
    }
}

/// The truth of one synthetic plate, from `PLATE/ground_truth/`.
struct Truth {
    dir: PathBuf,
    config: SynthConfig,
    /// 1-based plane of best focus (fractional).
    z_focus: f64,
    /// (well, site) → true top-left corner (x, y), pixels in the well frame.
    tiles: BTreeMap<(String, u32), (f64, f64)>,
}

impl Truth {
    fn read(plate: &Path) -> Result<Truth, QualityError> {
        let dir = plate.join("ground_truth");
        let config_path = dir.join("synth_config.json");
        let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
        let config: SynthConfig = serde_json::from_str(&text).map_err(|e| invalid(&config_path, e.to_string()))?;
        if !config.truth_images {
            return Err(invalid(
                &config_path,
                "the plate has no truth images: generate it with truth_images (hcsflow synth --truth-images)",
            ));
        }
        let tiles_csv = Csv::read(&dir.join("tile_positions.csv"))?;
        let mut tiles = BTreeMap::new();
        for row in &tiles_csv.rows {
            let key = (tiles_csv.text(row, "well")?.to_string(), tiles_csv.number(row, "site")?);
            tiles.insert(key, (tiles_csv.number(row, "x_px")?, tiles_csv.number(row, "y_px")?));
        }
        let z_focus = config.focus_plane();
        Ok(Truth { dir, config, z_focus, tiles })
    }

    fn image(&self, reference: Reference, well: &str, channel: u32) -> Result<Image, QualityError> {
        // Without an in-focus blur the clean image is the truth (plates
        // written before `clean_` images existed have only the truth).
        let prefix = match reference {
            Reference::Clean if self.config.focus_blur_px > 0.0 => "clean",
            _ => "truth",
        };
        let (pixels, height, width) = read_plane(&self.dir.join(format!("{prefix}_{well}_ch{channel}.tif")))?;
        Ok(Image { pixels, height, width })
    }
}

/// Which image of the truth a step is measured against.
#[derive(Debug, Clone, Copy)]
enum Reference {
    /// The signal as drawn, unblurred (`truth_*.tif`): what deconvolution restores.
    Truth,
    /// The noise-free in-focus plane, blurred by the optics (`clean_*.tif`):
    /// what a denoiser can at best return.
    Clean,
}

/// A row-major f32 plane.
struct Image {
    pixels: Vec<f32>,
    height: usize,
    width: usize,
}

impl Image {
    /// The `height × width` window whose top-left corner is at the
    /// fractional (x0, y0), sampled bilinearly (clamped at the border).
    fn window(&self, x0: f64, y0: f64, height: usize, width: usize) -> Vec<f32> {
        let at = |y: usize, x: usize| f64::from(self.pixels[y.min(self.height - 1) * self.width + x.min(self.width - 1)]);
        let mut out = Vec::with_capacity(height * width);
        for j in 0..height {
            let y = (y0 + j as f64).max(0.0);
            let (yi, fy) = (y.floor() as usize, y - y.floor());
            for i in 0..width {
                let x = (x0 + i as f64).max(0.0);
                let (xi, fx) = (x.floor() as usize, x - x.floor());
                let top = at(yi, xi) * (1.0 - fx) + at(yi, xi + 1) * fx;
                let bottom = at(yi + 1, xi) * (1.0 - fx) + at(yi + 1, xi + 1) * fx;
                out.push((top * (1.0 - fy) + bottom * fy) as f32);
            }
        }
        out
    }
}

/// PSNR (dB) of `image` against `truth` after the least-squares affine match
/// `a·image + b` of the image to the truth; the peak is the truth's range.
pub fn psnr_affine(image: &[f32], truth: &[f32]) -> f64 {
    let n = image.len().min(truth.len()).max(1) as f64;
    let mean = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let (mx, my) = (mean(image), mean(truth));
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (&x, &y) in image.iter().zip(truth) {
        let (dx, dy) = (f64::from(x) - mx, f64::from(y) - my);
        sxy += dx * dy;
        sxx += dx * dx;
    }
    let a = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let b = my - a * mx;
    let mse = image.iter().zip(truth).map(|(&x, &y)| (a * f64::from(x) + b - f64::from(y)).powi(2)).sum::<f64>() / n;
    let (lo, hi) = truth.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(f64::from(v)), hi.max(f64::from(v))));
    let range = (hi - lo).max(f64::MIN_POSITIVE);
    if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (range * range / mse).log10()
    }
}

/// Mean relative error (fraction) of `flat` against `truth`, both divided
/// by their mean first (a flat-field's scale is arbitrary).
pub fn flatfield_error(flat: &[f32], truth: &[f32]) -> f64 {
    let mean = |v: &[f32]| v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len().max(1) as f64;
    let (mf, mt) = (mean(flat), mean(truth));
    let n = flat.len().min(truth.len()).max(1) as f64;
    flat.iter().zip(truth).map(|(&f, &t)| (f64::from(f) / mf - f64::from(t) / mt).abs() / (f64::from(t) / mt)).sum::<f64>() / n
}

/// The per-pixel maximum over planes (numpy `max(axis=0)`).
fn max_z(planes: &[Vec<f32>]) -> Vec<f32> {
    let mut out = planes.first().cloned().unwrap_or_default();
    for p in planes.iter().skip(1) {
        for (o, &v) in out.iter_mut().zip(p) {
            *o = o.max(v);
        }
    }
    out
}

/// Scale (σ, pixels) of the Gaussian the deconvolution's sharpness measure
/// smooths with before its Laplacian, so that it measures structure, not
/// pixel noise (see [`sharpness`]).
pub const SHARPNESS_SIGMA_PX: f64 = 1.0;

/// The sharpness of a `height × width` plane, `margin` pixels in from its
/// border: the variance of the Laplacian of the plane smoothed by a Gaussian
/// of σ [`SHARPNESS_SIGMA_PX`] (scipy's `reflect` boundary, truncate 4), over
/// its mean squared ([`hcsflow_ops::quality::quality`]'s focus measure of the
/// smoothed plane's interior), so that a scale factor does not change it.
///
/// Why smoothed: the Laplacian of single pixels is a high-pass filter, and on
/// a denoised plane its variance is dominated by the noise the denoiser left,
/// not by the edges of the objects. On the demo plate, the unsmoothed measure
/// scores GFP's denoised input sharper than the truth itself (0.00035 against
/// 0.00025), and it falls when deconvolution sharpens the nuclei, because
/// Richardson–Lucy's early iterations smooth that noise while they restore
/// the edges. At σ 0.75–3 px, the measure orders blurred input, deconvolved
/// output and truth the same way on both channels.
pub fn sharpness(plane: &[f32], height: usize, width: usize, margin: usize) -> f64 {
    use hcsflow_ops::convolve::{correlate_separable, Boundary, Kernel1d};
    let gaussian = Kernel1d::gaussian(SHARPNESS_SIGMA_PX, 4.0);
    let smoothed = correlate_separable(plane, height, width, &gaussian, &gaussian, Boundary::Reflect);
    let (inside, h, w) = interior(&smoothed, height, width, margin);
    hcsflow_ops::quality::quality(&inside, h, w, None).focus
}

/// Pixels this far from a tile's border are left out of the deconvolution's
/// measures: Richardson–Lucy with scikit-image's zero boundary brightens the
/// border (the model sees no light coming from outside the tile), an artefact
/// of the tile's edge, not of the deconvolution of its interior.
pub const DECONVOLUTION_MARGIN_PX: usize = 16;

/// The interior of a `height × width` plane, `margin` pixels in from each
/// side, with its height and width (the whole plane if too small).
fn interior(plane: &[f32], height: usize, width: usize, margin: usize) -> (Vec<f32>, usize, usize) {
    if height <= 2 * margin + 2 || width <= 2 * margin + 2 {
        return (plane.to_vec(), height, width);
    }
    let (h, w) = (height - 2 * margin, width - 2 * margin);
    let out = (margin..margin + h).flat_map(|y| plane[y * width + margin..y * width + margin + w].iter().copied()).collect();
    (out, h, w)
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// A tile of a channel: (well, site, channel).
type TileKey = (String, u32, u32);

/// The measured tiles of a step: tile → the TIFF of each z (in z order).
type StepTiles = BTreeMap<TileKey, BTreeMap<u32, PathBuf>>;

fn step_tiles(manifest: &Manifest, out: &Path, step: &str) -> StepTiles {
    let mut tiles = StepTiles::new();
    for (well, record) in &manifest.wells {
        for o in record.outputs.iter().filter(|o| o.step == step) {
            tiles.entry((well.clone(), o.key[0], o.key[1])).or_default().insert(o.key[2], out.join(&o.path));
        }
    }
    tiles
}

/// The quality of the Mega Flex run in `out` on the synthetic `plate`, step
/// by step against the plate's truth (see the module documentation). Steps
/// the run did not write (a pipeline without them) get no rows.
pub fn quality_against_truth(plate: &Path, out: &Path) -> Result<Vec<QualityRow>, QualityError> {
    let truth = Truth::read(plate)?;
    let manifest = Manifest::read(out)?.ok_or_else(|| QualityError::NotARun(out.to_path_buf()))?;
    let mut rows = Vec::new();
    flatfield_rows(&truth, &manifest, out, &mut rows)?;
    let corrected = step_tiles(&manifest, out, "corrected");
    let denoised = step_tiles(&manifest, out, "denoised");
    let deconvolved = step_tiles(&manifest, out, "deconvolved");
    for channel in 1..=truth.config.channels {
        denoise_rows(&truth, channel, &corrected, &denoised, &mut rows)?;
        deconvolution_rows(&truth, channel, &denoised, &deconvolved, &mut rows)?;
    }
    position_rows(&truth, out, &mut rows)?;
    nuclei_rows(&truth, out, &mut rows)?;
    Ok(rows)
}

fn flatfield_rows(truth: &Truth, manifest: &Manifest, out: &Path, rows: &mut Vec<QualityRow>) -> Result<(), QualityError> {
    let Some(step) = manifest.plate_steps.get("flatfield") else { return Ok(()) };
    let (true_flat, _, _) = read_plane(&truth.dir.join("flatfield.tif"))?;
    let uniform = vec![1.0f32; true_flat.len()];
    for o in &step.outputs {
        let path = out.join(&o.path);
        let (flat, _, _) = read_plane(&path)?;
        if flat.len() != true_flat.len() {
            return Err(invalid(&path, format!("flat-field of {} pixels, the truth has {}", flat.len(), true_flat.len())));
        }
        rows.push(QualityRow {
            step: "flatfield".into(),
            channel: Some(o.scope[1]),
            well: None,
            measure: "flat-field mean relative error".into(),
            unit: "%".into(),
            better: Better::Lower,
            input: Some(100.0 * flatfield_error(&uniform, &true_flat)),
            output: 100.0 * flatfield_error(&flat, &true_flat),
            truth: None,
            samples: 1,
        });
    }
    Ok(())
}

/// The `reference` window of each tile of `tiles` in `channel`, with the tile's key.
fn truth_windows<'a>(
    truth: &Truth,
    reference: Reference,
    channel: u32,
    tiles: &'a StepTiles,
    height: usize,
    width: usize,
) -> Result<Vec<(&'a TileKey, Vec<f32>)>, QualityError> {
    let mut images: BTreeMap<String, Image> = BTreeMap::new();
    let mut out = Vec::new();
    for key in tiles.keys().filter(|k| k.2 == channel) {
        let (well, site, _) = key;
        let Some(&(x, y)) = truth.tiles.get(&(well.clone(), *site)) else {
            return Err(invalid(&truth.dir.join("tile_positions.csv"), format!("no true position of well {well} site {site}")));
        };
        let image = match images.entry(well.clone()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(truth.image(reference, well, channel)?),
        };
        out.push((key, image.window(x, y, height, width)));
    }
    Ok(out)
}

/// The plane of best focus of a tile's stack (0-based index into its z order).
fn focus_index(truth: &Truth, planes: usize) -> usize {
    ((truth.z_focus.round() as usize).max(1) - 1).min(planes.saturating_sub(1))
}

fn denoise_rows(
    truth: &Truth,
    channel: u32,
    input: &StepTiles,
    output: &StepTiles,
    rows: &mut Vec<QualityRow>,
) -> Result<(), QualityError> {
    let Some((first_key, first)) = output.iter().find(|(k, _)| k.2 == channel) else { return Ok(()) };
    let Some(first_path) = first.values().next() else { return Ok(()) };
    let (_, height, width) = read_plane(first_path)?;
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for (key, window) in truth_windows(truth, Reference::Clean, channel, output, height, width)? {
        let Some(inputs) = input.get(key) else {
            return Err(invalid(first_path, format!("no corrected tile for {key:?} (first denoised tile {first_key:?})")));
        };
        let z = focus_index(truth, output[key].len());
        let (Some(in_path), Some(out_path)) = (inputs.values().nth(z), output[key].values().nth(z)) else { continue };
        before.push(psnr_affine(&read_plane(in_path)?.0, &window));
        after.push(psnr_affine(&read_plane(out_path)?.0, &window));
    }
    rows.push(QualityRow {
        step: "denoised".into(),
        channel: Some(channel),
        well: None,
        measure: "PSNR of the in-focus plane vs the clean in-focus plane".into(),
        unit: "dB".into(),
        better: Better::Higher,
        input: Some(mean(&before)),
        output: mean(&after),
        truth: None,
        samples: after.len(),
    });
    Ok(())
}

fn deconvolution_rows(
    truth: &Truth,
    channel: u32,
    input: &StepTiles,
    output: &StepTiles,
    rows: &mut Vec<QualityRow>,
) -> Result<(), QualityError> {
    let Some(first) = output.iter().find(|(k, _)| k.2 == channel).and_then(|(_, z)| z.values().next()) else { return Ok(()) };
    let (_, height, width) = read_plane(first)?;
    let (mut psnr_in, mut psnr_out, mut focus_in, mut focus_out, mut focus_truth) = (vec![], vec![], vec![], vec![], vec![]);
    for (key, window) in truth_windows(truth, Reference::Truth, channel, output, height, width)? {
        let stack = |tiles: &StepTiles| -> Result<Vec<f32>, QualityError> {
            let paths = tiles.get(key).ok_or_else(|| invalid(first, format!("no denoised tile for {key:?}")))?;
            let planes = paths.values().map(|p| read_plane(p).map(|r| r.0)).collect::<Result<Vec<_>, _>>()?;
            Ok(max_z(&planes))
        };
        let m = DECONVOLUTION_MARGIN_PX;
        let (before, after) = (stack(input)?, stack(output)?);
        focus_in.push(sharpness(&before, height, width, m));
        focus_out.push(sharpness(&after, height, width, m));
        focus_truth.push(sharpness(&window, height, width, m));
        let inside = |plane: &[f32]| interior(plane, height, width, m).0;
        let window = inside(&window);
        psnr_in.push(psnr_affine(&inside(&before), &window));
        psnr_out.push(psnr_affine(&inside(&after), &window));
    }
    let row = |measure: &str, unit: &str, better: Better, input: &[f64], output: &[f64], truth: Option<f64>| QualityRow {
        step: "deconvolved".into(),
        channel: Some(channel),
        well: None,
        measure: measure.into(),
        unit: unit.into(),
        better,
        input: Some(mean(input)),
        output: mean(output),
        truth,
        samples: output.len(),
    };
    rows.push(row(
        "sharpness of the max-Z tile (Laplacian of Gaussian σ 1 px: variance / mean²)",
        "",
        Better::Closer,
        &focus_in,
        &focus_out,
        Some(mean(&focus_truth)),
    ));
    rows.push(row("PSNR of the max-Z tile vs the unblurred truth", "dB", Better::Higher, &psnr_in, &psnr_out, None));
    Ok(())
}

fn position_rows(truth: &Truth, out: &Path, rows: &mut Vec<QualityRow>) -> Result<(), QualityError> {
    let path = out.join("positions/positions.csv");
    if !path.exists() {
        return Ok(());
    }
    let csv = Csv::read(&path)?;
    // well → (true, registered, stage) top-left corners per tile
    let mut wells: BTreeMap<String, Vec<[(f64, f64); 3]>> = BTreeMap::new();
    for row in &csv.rows {
        let well = csv.text(row, "well")?.to_string();
        let site: u32 = csv.number(row, "site")?;
        let Some(&t) = truth.tiles.get(&(well.clone(), site)) else {
            return Err(invalid(&path, format!("well {well} site {site} has no true position")));
        };
        let registered = (csv.number(row, "x_px")?, csv.number(row, "y_px")?);
        let stage = (csv.number(row, "stage_x_px")?, csv.number(row, "stage_y_px")?);
        wells.entry(well).or_default().push([t, registered, stage]);
    }
    for (well, tiles) in &wells {
        let rms = |which: usize| {
            // positions are in different frames: compare after removing the mean offset
            let n = tiles.len() as f64;
            let (ox, oy) = tiles.iter().fold((0.0, 0.0), |(x, y), t| (x + (t[which].0 - t[0].0) / n, y + (t[which].1 - t[0].1) / n));
            (tiles.iter().map(|t| (t[which].0 - t[0].0 - ox).powi(2) + (t[which].1 - t[0].1 - oy).powi(2)).sum::<f64>() / n).sqrt()
        };
        rows.push(QualityRow {
            step: "positions".into(),
            channel: None,
            well: Some(well.clone()),
            measure: "RMS tile position error vs the true positions".into(),
            unit: "px".into(),
            better: Better::Lower,
            input: Some(rms(2)),
            output: rms(1),
            truth: None,
            samples: tiles.len(),
        });
    }
    Ok(())
}

fn nuclei_rows(truth: &Truth, out: &Path, rows: &mut Vec<QualityRow>) -> Result<(), QualityError> {
    let path = out.join("nuclei/objects.csv");
    if !path.exists() {
        return Ok(());
    }
    let objects = Csv::read(&path)?;
    let mut counted: BTreeMap<String, usize> = BTreeMap::new();
    for row in &objects.rows {
        *counted.entry(objects.text(row, "well")?.to_string()).or_default() += 1;
    }
    // The true nuclei of a well are those with DAPI signal whose centre lies
    // in the area its tiles cover.
    let nuclei_path = truth.dir.join("nuclei.csv");
    let nuclei = Csv::read(&nuclei_path)?;
    let size = f64::from(truth.config.size);
    for (well, &count) in &counted {
        let corners: Vec<(f64, f64)> = truth.tiles.iter().filter(|((w, _), _)| w == well).map(|(_, &c)| c).collect();
        if corners.is_empty() {
            return Err(invalid(&truth.dir.join("tile_positions.csv"), format!("no tiles of well {well}")));
        }
        let inside = |x: f64, y: f64| corners.iter().any(|&(cx, cy)| x >= cx && x < cx + size && y >= cy && y < cy + size);
        let mut expected = 0usize;
        for row in nuclei.rows.iter() {
            if nuclei.text(row, "well")? != well {
                continue;
            }
            let amplitude: f64 = nuclei.number(row, "amplitude_ch1")?;
            if amplitude > 0.0 && inside(nuclei.number(row, "x_px")?, nuclei.number(row, "y_px")?) {
                expected += 1;
            }
        }
        rows.push(QualityRow {
            step: "nuclei".into(),
            channel: Some(1),
            well: Some(well.clone()),
            measure: "nuclei counted (truth: nuclei in the tiles)".into(),
            unit: "".into(),
            better: Better::Closer,
            input: None,
            output: count as f64,
            truth: Some(expected as f64),
            samples: 1,
        });
    }
    Ok(())
}

/// Writes the table as `OUT/quality_vs_truth.csv` and `.json`, each whole or
/// not at all (a temporary renamed over the name); returns both paths.
pub fn write_quality(out: &Path, rows: &[QualityRow]) -> Result<Vec<PathBuf>, QualityError> {
    let csv_path = out.join(QUALITY_CSV_NAME);
    let mut csv = String::from("step,channel,well,measure,unit,better,input,output,truth,improved,samples\n");
    let opt = |v: Option<f64>| v.map(|v| format!("{v:.6}")).unwrap_or_default();
    for r in rows {
        csv.push_str(&format!(
            "{},{},{},\"{}\",{},{},{},{:.6},{},{},{}\n",
            r.step,
            r.channel.map(|c| c.to_string()).unwrap_or_default(),
            r.well.clone().unwrap_or_default(),
            r.measure,
            r.unit,
            r.better.as_str(),
            opt(r.input),
            r.output,
            opt(r.truth),
            r.improved().map(|b| b.to_string()).unwrap_or_default(),
            r.samples
        ));
    }
    write_atomic(&csv_path, csv.as_bytes(), Durability::Process).map_err(io(&csv_path))?;
    let json_path = out.join(QUALITY_JSON_NAME);
    let json = serde_json::to_vec_pretty(rows).map_err(|e| invalid(&json_path, e.to_string()))?;
    write_atomic(&json_path, &json, Durability::Process).map_err(io(&json_path))?;
    Ok(vec![csv_path, json_path])
}

/// The table as aligned text, one line per row (what the demo prints).
pub fn quality_text(rows: &[QualityRow]) -> String {
    let measure = |r: &QualityRow| if r.unit.is_empty() { r.measure.clone() } else { format!("{} ({})", r.measure, r.unit) };
    let width = rows.iter().map(|r| measure(r).chars().count()).max().unwrap_or(0).max("measure".len());
    let line = |cells: [&str; 7]| {
        let [step, ch, well, measure, input, output, truth] = cells;
        format!("{step:<12} {ch:<4} {well:<5} {measure:<width$} {input:>10} {output:>10} {truth:>10}\n")
    };
    let num = |v: Option<f64>| v.map_or_else(|| "—".to_string(), hcsflow_report::truth::significant);
    let mut text = line(["step", "ch", "well", "measure", "input", "output", "truth"]);
    for r in rows {
        let (channel, well) = (r.channel.map(|c| c.to_string()).unwrap_or_default(), r.well.clone().unwrap_or_default());
        text.push_str(&line([&r.step, &channel, &well, &measure(r), &num(r.input), &num(Some(r.output)), &num(r.truth)]));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use hcsflow_ops::convolve::{correlate_separable, Boundary, Kernel1d};

    /// Bright disks of radius 5 on a dim background, every 24 px, their edges softened by a
    /// Gaussian of σ 1 px (nuclei, not coins).
    fn nuclei(n: usize) -> Vec<f32> {
        let soft = Kernel1d::gaussian(1.0, 4.0);
        correlate_separable(&disks(n), n, n, &soft, &soft, Boundary::Reflect)
    }

    fn disks(n: usize) -> Vec<f32> {
        let mut plane = vec![100.0f32; n * n];
        for (i, v) in plane.iter_mut().enumerate() {
            let (y, x) = ((i / n) % 24, (i % n) % 24);
            let (dy, dx) = (y as f32 - 12.0, x as f32 - 12.0);
            if dy * dy + dx * dx <= 25.0 {
                *v = 1000.0;
            }
        }
        plane
    }

    #[test]
    fn sharpness_ranks_blur_and_not_pixel_noise() {
        let n = 128;
        let sharp = nuclei(n);
        let optics = Kernel1d::gaussian(2.5, 4.0);
        let blurred = correlate_separable(&sharp, n, n, &optics, &optics, Boundary::Reflect);
        // Uniform noise of std 30 (a fixed sequence): what a denoiser leaves.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let noisy: Vec<f32> = blurred
            .iter()
            .map(|&v| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                v + ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 30.0 * 12f32.sqrt()
            })
            .collect();
        let m = DECONVOLUTION_MARGIN_PX;
        let (s_sharp, s_blurred, s_noisy) = (sharpness(&sharp, n, n, m), sharpness(&blurred, n, n, m), sharpness(&noisy, n, n, m));
        assert!(s_blurred < 0.5 * s_sharp, "blur lowers it: {s_blurred} vs {s_sharp}");
        // Noise raises it by 29 % here, far from the sharp plane's.
        assert!(s_noisy < 0.5 * s_sharp && s_noisy < 1.4 * s_blurred, "noise: {s_noisy} vs {s_blurred} (sharp {s_sharp})");
        // The Laplacian of single pixels scores the same noisy, blurred plane 3.6× sharper than
        // the sharp one: why the measure smooths first.
        let raw = |p: &[f32]| hcsflow_ops::quality::quality(&interior(p, n, n, m).0, n - 2 * m, n - 2 * m, None).focus;
        assert!(raw(&noisy) > 2.0 * raw(&sharp), "{} vs {}", raw(&noisy), raw(&sharp));
        // A scale factor changes nothing.
        let brighter: Vec<f32> = blurred.iter().map(|v| 3.0 * v).collect();
        assert!((sharpness(&brighter, n, n, m) / s_blurred - 1.0).abs() < 1e-5);
    }
}
