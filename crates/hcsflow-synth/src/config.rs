//! Every option of the synthetic plate generator.

use hcsflow_core::DType;
use hcsflow_plate::Format;
use serde::{Deserialize, Serialize};

/// How ImageXpress image names carry a GUID suffix (real exports do all three).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GuidStyle {
    /// `Plate_A01_s1_w1.tif`
    #[default]
    None,
    /// `Plate_A01_s1_w107447158-AC76-4844-8431-E6A954BD1174.tif` (BBBC021 style)
    Bare,
    /// `Plate_A01_s1_w1_[07447158-AC76-4844-8431-E6A954BD1174].tif`
    Bracketed,
}

/// Where ImageXpress images go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IxLayout {
    /// `TimePoint_<t>/` (plus `ZStep_<z>/` for z-stacks): what MetaXpress writes.
    #[default]
    TimePoint,
    /// All images directly in the plate folder (only for one time point, one plane).
    Flat,
}

/// The configuration of one synthetic plate. `Default` is a small,
/// two-well, 3×3-site, 2-channel, 256² plate; the CLI overrides fields.
///
/// Determinism: the same config (including `seed`) always produces the same
/// files, independent of the number of threads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SynthConfig {
    pub format: Format,
    /// Plate/measurement name; the ImageXpress file prefix (may contain `_`).
    pub plate_name: String,
    /// 96, 384 or 1536.
    pub plate_size: u32,
    /// Wells to acquire (`A01`, `AF48`); empty = every well of the plate.
    pub wells: Vec<String>,
    /// Site grid rows × columns.
    pub grid_rows: u32,
    pub grid_cols: u32,
    /// Raster cells (1-based, over the full grid) that are not acquired
    /// (ImageXpress `SiteSelection` FALSE; Phenix field absent).
    pub skip_sites: Vec<u32>,
    /// Tile overlap as a fraction of the tile size (0.1 = 10 %).
    pub overlap: f64,
    /// Maximum per-tile deviation of the true tile position from the nominal
    /// stage position, in pixels (uniform in ±jitter_px, fractional).
    pub jitter_px: f64,
    /// When true, the stage positions in the metadata are the true (jittered)
    /// positions; when false (default) they are the nominal grid positions, and
    /// the jitter is what a registration step has to find.
    pub stage_reports_truth: bool,
    pub channels: u32,
    /// Channel names; missing entries get defaults (DAPI, GFP, Cy3, Cy5, …).
    pub channel_names: Vec<String>,
    pub z_planes: u32,
    /// Plane of best focus, 1-based, fractional allowed; `None` = middle plane.
    pub z_focus: Option<f64>,
    pub z_step_um: f64,
    /// Defocus blur sigma added per plane of distance from focus, in pixels.
    pub defocus_px_per_plane: f64,
    /// Blur sigma of the optics at best focus, in pixels (the in-focus PSF, a
    /// Gaussian): every plane is blurred by `√(focus_blur² + defocus²)`. 0
    /// (default) draws the in-focus plane exactly as the truth; above 0 the
    /// truth images are sharper than any acquired plane, which is what a
    /// deconvolution step can be measured against.
    pub focus_blur_px: f64,
    pub timepoints: u32,
    /// Tile width and height in pixels.
    pub size: u32,
    pub pixel_size_um: f64,
    pub seed: u64,
    /// Only `u16` is supported (what the instruments write).
    pub dtype: DType,
    /// Mean number of nuclei per 10⁶ px² of well area.
    pub nuclei_density: f64,
    /// Nucleus radius range in pixels.
    pub nucleus_radius_px: (f64, f64),
    /// Smallest distance between two nucleus centres as a fraction of the sum
    /// of their radii. 1 draws a monolayer: nuclei may touch but never overlap,
    /// so every nucleus of the truth is a separate object in the image. 0 (the
    /// default) places nuclei independently: some overlap so much (centres
    /// closer than half their radii's sum, about 7 % of them at the default
    /// density) that no segmentation can tell them apart; the dense textures
    /// of the stitching tests rely on it. Nuclei are drawn as with 0 and, in
    /// drawing order, a nucleus too close to one already kept is dropped, so the
    /// kept nuclei are identical and the density is lower than `nuclei_density`.
    pub nucleus_min_separation: f64,
    /// Background signal (photo-electrons) before the flat-field.
    pub background: f64,
    /// Camera dark offset added after the flat-field.
    pub dark_offset: f64,
    /// Gaussian read noise sigma.
    pub read_noise: f64,
    /// Vignetting: the flat-field falls from 1 at its centre to about 1 − strength in the corners.
    pub flatfield_strength: f64,
    /// Also write the noise-free well-frame signal per well and channel
    /// (`ground_truth/truth_<well>_ch<c>.tif`, f32).
    pub truth_images: bool,
    // --- edge cases ---
    /// Number of planes to leave out (chosen by the seed). ImageXpress: no file.
    /// Phenix: alternately an empty URL and a URL whose file was not written.
    pub missing_planes: u32,
    /// ImageXpress: also write `_thumb` thumbnails (readers must skip them).
    pub thumbnails: bool,
    pub guid_style: GuidStyle,
    /// ImageXpress: `.TIF` instead of `.tif`.
    pub upper_case_tif: bool,
    pub ix_layout: IxLayout,
    /// ImageXpress z-stacks: also write the max projection beside `ZStep_<z>/`.
    pub z_projection: bool,
    /// ImageXpress: write the HTD `Description` with Windows-1252 bytes (µ, –).
    pub cp1252_description: bool,
    /// Phenix index file name: `Index.idx.xml`, `Index.ref.xml` or `Index.xml`.
    pub phenix_index_name: String,
    /// Phenix: HarmonyV6 namespace instead of V5.
    pub harmony_v6: bool,
    /// Write into an existing non-empty folder; only allowed when it is a
    /// previous synthetic plate (it has `ground_truth/synth_config.json`), which
    /// is then removed first.
    pub overwrite: bool,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            format: Format::ImageXpress,
            plate_name: "Synth_Plate_1".into(),
            plate_size: 96,
            wells: vec!["A01".into(), "B02".into()],
            grid_rows: 3,
            grid_cols: 3,
            skip_sites: Vec::new(),
            overlap: 0.1,
            jitter_px: 2.0,
            stage_reports_truth: false,
            channels: 2,
            channel_names: Vec::new(),
            z_planes: 1,
            z_focus: None,
            z_step_um: 2.0,
            defocus_px_per_plane: 1.5,
            focus_blur_px: 0.0,
            timepoints: 1,
            size: 256,
            pixel_size_um: 0.65,
            seed: 0,
            dtype: DType::U16,
            nuclei_density: 250.0,
            nucleus_radius_px: (6.0, 11.0),
            nucleus_min_separation: 0.0,
            background: 120.0,
            dark_offset: 100.0,
            read_noise: 3.0,
            flatfield_strength: 0.3,
            truth_images: false,
            missing_planes: 0,
            thumbnails: false,
            guid_style: GuidStyle::None,
            upper_case_tif: false,
            ix_layout: IxLayout::TimePoint,
            z_projection: false,
            cp1252_description: true,
            phenix_index_name: "Index.idx.xml".into(),
            harmony_v6: false,
            overwrite: false,
        }
    }
}

const DEFAULT_CHANNELS: [&str; 9] = ["DAPI", "GFP", "Cy3", "Cy5", "TxRed", "BF", "Alexa750", "CFP", "YFP"];
const EMISSION_NM: [u32; 9] = [461, 525, 570, 670, 615, 0, 780, 475, 530];

impl SynthConfig {
    /// The name of channel `c` (1-based).
    pub fn channel_name(&self, c: u32) -> String {
        let i = (c as usize).saturating_sub(1);
        self.channel_names
            .get(i)
            .cloned()
            .unwrap_or_else(|| DEFAULT_CHANNELS.get(i).map(|s| s.to_string()).unwrap_or(format!("Channel{c}")))
    }

    /// Emission wavelength written into the metadata for channel `c`.
    pub fn emission_nm(&self, c: u32) -> u32 {
        EMISSION_NM.get((c as usize).saturating_sub(1)).copied().unwrap_or(600)
    }

    /// The focus plane (1-based, fractional).
    pub fn focus_plane(&self) -> f64 {
        self.z_focus.unwrap_or((f64::from(self.z_planes) + 1.0) / 2.0)
    }

    /// The blur sigma of plane `z` (1-based), in pixels: the in-focus blur and
    /// the defocus at that distance from focus, added in quadrature (a
    /// Gaussian blurred by a Gaussian is a Gaussian).
    pub fn blur_at(&self, z: u32) -> f64 {
        self.focus_blur_px.hypot(self.defocus_px_per_plane * (f64::from(z) - self.focus_plane()).abs())
    }
}
