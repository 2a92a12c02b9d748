//! Writing a synthetic plate: the images (and thumbnails, projections) in
//! the vendor's layout, the vendor descriptor and the ground-truth files. The
//! vendor names and metadata text come from `hcsflow-plate`, next to the
//! readers they must satisfy.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

use hcsflow_core::Stack;
use hcsflow_plate::imagexpress::{self, GuidSuffix, ImageName};
use hcsflow_plate::phenix::{self, PhenixName};
use hcsflow_plate::Format;
use hcsflow_tiff::{write_stack, WriteOptions};
use ndarray::Array3;
use rayon::prelude::*;

use crate::layout::{tile_spec, Job, Layout, Planes, Truth};
use crate::render::{self, TileSpec};
use crate::rng::{derive, Rng};
use crate::{io, write_file, GuidStyle, IxLayout, SynthConfig, SynthError, TileTruth};

/// Everything the writers need: the layout, the truth and the planes.
pub(crate) struct PlateWriter<'a> {
    pub layout: &'a Layout<'a>,
    pub truth: &'a Truth,
    pub planes: &'a Planes,
    /// Channel names, channel 1 first.
    pub channel_names: Vec<String>,
}

/// What [`PlateWriter::write_images`] wrote.
pub(crate) struct ImagesWritten {
    pub images: usize,
    pub thumbnails: usize,
    pub bytes: u64,
}

/// `pixels` as a one-plane stack of `height × width`; a length that does not
/// match is [`SynthError::PlaneSize`] (a wrong image is never written).
fn one_plane<T>(what: &'static str, height: usize, width: usize, pixels: Vec<T>) -> Result<Array3<T>, SynthError> {
    let got = pixels.len();
    Array3::from_shape_vec((1, height, width), pixels).map_err(|_| SynthError::PlaneSize { what, height, width, got })
}

impl PlateWriter<'_> {
    fn cfg(&self) -> &SynthConfig {
        self.layout.cfg
    }

    fn channel_name(&self, channel: u32) -> &str {
        &self.channel_names[(channel - 1) as usize]
    }

    /// The ImageXpress file extension.
    fn ext(&self) -> &'static str {
        if self.cfg().upper_case_tif {
            "TIF"
        } else {
            "tif"
        }
    }

    /// The GUID of plane `j`, for the use `tag` (image or thumbnail).
    fn guid(&self, j: usize, tag: u64) -> String {
        Rng::new(derive(self.cfg().seed, &[tag, j as u64])).guid()
    }

    /// The ImageXpress file stem of `job`: plate prefix, well, site and wave
    /// (those two only when the plate has more than one).
    fn ix_stem(&self, job: &Job) -> String {
        let l = self.layout;
        ImageName {
            prefix: Some(l.cfg.plate_name.clone()),
            well: l.wells[job.well].0.clone(),
            site: l.sites_on().then_some(l.cells[job.cell].site),
            wave: (l.cfg.channels > 1).then_some(job.channel),
            timepoint: None,
            z: None,
            thumb: false,
            guid: None,
        }
        .stem()
    }

    /// The ImageXpress folder of the images of time point `t` and z plane `z`
    /// (`None`: the projections).
    fn ix_dir(&self, t: u32, z: Option<u32>) -> PathBuf {
        let cfg = self.cfg();
        let out = self.layout.out;
        match (cfg.ix_layout, z) {
            (IxLayout::Flat, _) => out.to_path_buf(),
            (IxLayout::TimePoint, Some(z)) if cfg.z_planes > 1 => out.join(imagexpress::plane_folder(t, Some(z))),
            (IxLayout::TimePoint, _) => out.join(imagexpress::plane_folder(t, None)),
        }
    }

    /// The Phenix file name of `job`.
    fn phenix_name(&self, job: &Job) -> String {
        let (_, row, col) = self.layout.wells[job.well];
        let field = self.layout.cells[job.cell].field_id;
        PhenixName { row, col, field, plane: job.z, channel: job.channel, sk: job.t, fk: 1, fl: 1 }.file_name()
    }

    fn spec(&self, job: &Job, seed_tag: u64) -> TileSpec<'_> {
        tile_spec(self.layout, self.truth, job, seed_tag)
    }

    fn tile(&self, job: &Job) -> &TileTruth {
        &self.truth.tiles[job.well * self.layout.cells.len() + job.cell]
    }

    /// Creates the image folders and `ground_truth/`.
    pub fn create_folders(&self) -> Result<(), SynthError> {
        let cfg = self.cfg();
        let out = self.layout.out;
        let mut dirs = BTreeSet::new();
        match cfg.format {
            // validate() refuses the formats synth does not write.
            Format::ImageXpress | Format::Hcsflow | Format::OmeZarr | Format::OmeTiff => {
                for t in 1..=cfg.timepoints {
                    for z in 1..=cfg.z_planes {
                        dirs.insert(self.ix_dir(t, Some(z)));
                    }
                }
            }
            Format::OperaPhenix => {
                dirs.insert(out.join("Images"));
            }
        }
        dirs.insert(out.join("ground_truth"));
        for d in &dirs {
            std::fs::create_dir_all(d).map_err(io(d))?;
        }
        Ok(())
    }

    /// The path and TIFF options of the image of plane `j`.
    fn image_target(&self, j: usize, job: &Job) -> (PathBuf, WriteOptions) {
        let cfg = self.cfg();
        let px = cfg.pixel_size_um;
        match cfg.format {
            // validate() refuses the formats synth does not write.
            Format::ImageXpress | Format::Hcsflow | Format::OmeZarr | Format::OmeTiff => {
                let tile = self.tile(job);
                let guid = self.guid(j, 5);
                let suffix = match cfg.guid_style {
                    GuidStyle::None => GuidSuffix::None,
                    GuidStyle::Bare => GuidSuffix::Bare(&guid),
                    GuidStyle::Bracketed => GuidSuffix::Bracketed(&guid),
                };
                let name = imagexpress::image_file_name(&self.ix_stem(job), suffix, self.ext());
                let desc = imagexpress::metaseries_xml(&imagexpress::MetaSeries {
                    pixel_size_um: px,
                    stage_x_um: tile.stage_x_um,
                    stage_y_um: tile.stage_y_um,
                    z_um: f64::from(job.z - 1) * cfg.z_step_um,
                    wavelength_nm: cfg.emission_nm(job.channel),
                    channel_name: self.channel_name(job.channel),
                    stage_label: format!("{} : Site_{}", tile.well, tile.site),
                    width: cfg.size,
                    height: cfg.size,
                });
                let opts = WriteOptions { description: Some(desc), pixel_size_um: Some(px), ..WriteOptions::default() };
                (self.ix_dir(job.t, Some(job.z)).join(name), opts)
            }
            Format::OperaPhenix => {
                let harmony = phenix::tiff_tag_xml(self.channel_name(job.channel));
                let opts = WriteOptions { pixel_size_um: Some(px), extra_ascii_tags: vec![(65500, harmony)], ..WriteOptions::default() };
                (self.layout.out.join("Images").join(self.phenix_name(job)), opts)
            }
        }
    }

    /// Renders and writes every plane not left out (and, for ImageXpress
    /// with `thumbnails`, the thumbnail of every first z plane), in parallel.
    pub fn write_images(&self) -> Result<ImagesWritten, SynthError> {
        let cfg = self.cfg();
        let size = cfg.size as usize;
        let planes = self.planes;
        let thumbnails = cfg.format == Format::ImageXpress && cfg.thumbnails;
        // Each worker reuses its scratch signal buffer.
        let results: Vec<Result<u64, SynthError>> = planes
            .jobs
            .par_iter()
            .enumerate()
            .filter(|(j, _)| !planes.missing_set.contains(j))
            .map_init(Vec::<f32>::new, |sig, (j, job)| {
                let mut pixels = vec![0u16; size * size];
                render::render_tile_into(&self.truth.indexes[job.well], &self.spec(job, 4), sig, &mut pixels);
                let stack = Stack::from(one_plane("image", size, size, pixels)?);
                let (path, opts) = self.image_target(j, job);
                write_stack(&path, &stack, &opts)?;
                let mut bytes = (size * size * 2) as u64;
                if thumbnails && job.z == 1 {
                    let thumb = downsample(&stack, 8);
                    let name = imagexpress::thumbnail_file_name(&self.ix_stem(job), &self.guid(j, 6), self.ext());
                    write_stack(&self.ix_dir(job.t, Some(job.z)).join(name), &thumb, &WriteOptions::default())?;
                    bytes += thumb.nbytes() as u64;
                }
                Ok(bytes)
            })
            .collect();
        let mut bytes = 0;
        for r in results {
            bytes += r?;
        }
        let images = planes.jobs.len() - planes.missing_set.len();
        let thumbnails = if thumbnails {
            planes.jobs.iter().enumerate().filter(|(j, job)| job.z == 1 && !planes.missing_set.contains(j)).count()
        } else {
            0
        };
        Ok(ImagesWritten { images, thumbnails, bytes })
    }

    /// ImageXpress z projections (with `z_projection` and more than one
    /// plane): the maximum over z of the very planes written, in
    /// `TimePoint_<t>/`. Returns how many were written.
    pub fn write_projections(&self) -> Result<usize, SynthError> {
        let cfg = self.cfg();
        if !(cfg.format == Format::ImageXpress && cfg.z_projection && cfg.z_planes > 1) {
            return Ok(0);
        }
        let size = cfg.size as usize;
        let firsts: Vec<&Job> = self.planes.jobs.iter().filter(|j| j.z == 1).collect();
        let res: Vec<Result<(), SynthError>> = firsts
            .par_iter()
            .map(|job| {
                let mut acc = vec![0u16; size * size];
                for z in 1..=cfg.z_planes {
                    let j = Job { z, ..**job };
                    let v = render::render_tile(&self.truth.indexes[job.well], &self.spec(&j, 4));
                    for (a, b) in acc.iter_mut().zip(v) {
                        *a = (*a).max(b);
                    }
                }
                let stack = Stack::from(one_plane("z projection", size, size, acc)?);
                let path = self.ix_dir(job.t, None).join(imagexpress::image_file_name(&self.ix_stem(job), GuidSuffix::None, self.ext()));
                write_stack(&path, &stack, &WriteOptions { pixel_size_um: Some(cfg.pixel_size_um), ..WriteOptions::default() })?;
                Ok(())
            })
            .collect();
        for r in res {
            r?;
        }
        Ok(firsts.len())
    }

    /// Writes the `.HTD` (ImageXpress) or the index XML (Phenix).
    pub fn write_descriptor(&self) -> Result<(), SynthError> {
        match self.cfg().format {
            // validate() refuses the formats synth does not write.
            Format::ImageXpress | Format::Hcsflow | Format::OmeZarr | Format::OmeTiff => self.write_htd(),
            Format::OperaPhenix => self.write_index(),
        }
    }

    fn write_htd(&self) -> Result<(), SynthError> {
        let l = self.layout;
        let cfg = l.cfg;
        let px = cfg.pixel_size_um;
        let well_rc: Vec<(u32, u32)> = l.wells.iter().map(|w| (w.1, w.2)).collect();
        let description_bytes = if cfg.cp1252_description {
            // "Synthetic plate – 0.65 µm/px" in Windows-1252: en dash 0x96, micro 0xB5
            let mut d = b"Synthetic plate \x96 ".to_vec();
            d.extend_from_slice(format!("{px} ").as_bytes());
            d.extend_from_slice(b"\xB5m/px");
            d
        } else {
            format!("Synthetic plate - {px} um/px").into_bytes()
        };
        let bytes = imagexpress::htd_bytes(&imagexpress::HtdSpec {
            description_bytes,
            timepoints: cfg.timepoints,
            z_steps: cfg.z_planes,
            z_projection: cfg.z_projection && cfg.z_planes > 1,
            plate_rows: l.plate_rows,
            plate_cols: l.plate_cols,
            wells: &well_rc,
            grid_rows: cfg.grid_rows,
            grid_cols: cfg.grid_cols,
            site_selected: &l.present,
            sites_on: l.sites_on(),
            wave_names: &self.channel_names,
            guid: Rng::new(derive(cfg.seed, &[7])).guid(),
        });
        write_file(&l.out.join(imagexpress::htd_file_name(&cfg.plate_name)), &bytes)
    }

    fn write_index(&self) -> Result<(), SynthError> {
        let l = self.layout;
        let cfg = l.cfg;
        let px = cfg.pixel_size_um;
        let well_rc: Vec<(u32, u32)> = l.wells.iter().map(|w| (w.1, w.2)).collect();
        let entries: Vec<phenix::IndexImage> = self
            .planes
            .jobs
            .iter()
            .enumerate()
            .map(|(j, job)| {
                let tile = self.tile(job);
                phenix::IndexImage {
                    url: if self.planes.empty_url.contains(&j) { String::new() } else { self.phenix_name(job) },
                    row: l.wells[job.well].1,
                    col: l.wells[job.well].2,
                    field: l.cells[job.cell].field_id,
                    plane: job.z,
                    timepoint: job.t - 1,
                    channel: job.channel,
                    channel_name: self.channel_name(job.channel),
                    resolution_m: px * 1e-6,
                    size: cfg.size,
                    pos_x_m: tile.stage_x_um * 1e-6,
                    // stage Y grows upward: image-oriented y is its negative
                    pos_y_m: -tile.stage_y_um * 1e-6,
                    pos_z_m: f64::from(job.z - 1) * cfg.z_step_um * 1e-6,
                    emission_nm: cfg.emission_nm(job.channel),
                    time_offset_s: f64::from(job.t - 1) * 600.0,
                }
            })
            .collect();
        let xml = phenix::harmony_index(&cfg.plate_name, cfg.harmony_v6, l.plate_rows, l.plate_cols, &well_rc, &entries);
        let mut bytes = b"\xEF\xBB\xBF".to_vec();
        bytes.extend_from_slice(xml.as_bytes());
        write_file(&l.out.join("Images").join(&cfg.phenix_index_name), &bytes)
    }

    /// Writes `ground_truth/`: tile positions, nuclei, missing planes, focus,
    /// flat-field, truth images (with `truth_images`) and the configuration.
    /// Returns the number of nuclei.
    pub fn write_ground_truth(&self) -> Result<usize, SynthError> {
        let l = self.layout;
        let cfg = l.cfg;
        let gt = l.out.join("ground_truth");
        write_file(&gt.join("tile_positions.csv"), tile_positions_csv(&self.truth.tiles).as_bytes())?;
        let (ncsv, nuclei) = self.nuclei_csv();
        write_file(&gt.join("nuclei.csv"), ncsv.as_bytes())?;
        let mut mcsv = String::from("well,site,channel,z_index,timepoint,kind\n");
        for m in &self.planes.missing {
            let _ = writeln!(mcsv, "{},{},{},{},{},{}", m.well, m.site, m.channel, m.z_index, m.timepoint, m.kind);
        }
        write_file(&gt.join("missing.csv"), mcsv.as_bytes())?;
        let focus = serde_json::json!({
            "z_focus": cfg.focus_plane(),
            "z_planes": cfg.z_planes,
            "z_step_um": cfg.z_step_um,
            "defocus_sigma_px_per_plane": cfg.defocus_px_per_plane,
            "focus_blur_sigma_px": cfg.focus_blur_px,
            "note": "blur sigma at plane z = sqrt(focus_blur_sigma_px^2 + (defocus_sigma_px_per_plane * |z - z_focus|)^2) (planes 1-based)"
        });
        write_file(&gt.join("focus.json"), focus.to_string().as_bytes())?;
        let size = cfg.size as usize;
        let ff = Stack::from(one_plane("flat-field", size, size, self.truth.flat.clone())?);
        write_stack(&gt.join("flatfield.tif"), &ff, &WriteOptions::default())?;
        if cfg.truth_images {
            self.write_truth_images()?;
        }
        let cfg_json = serde_json::to_string_pretty(cfg).map_err(|e| SynthError::InvalidConfig(e.to_string()))?;
        write_file(&gt.join("synth_config.json"), cfg_json.as_bytes())?;
        Ok(nuclei)
    }

    /// `nuclei.csv` and the number of nuclei in it.
    fn nuclei_csv(&self) -> (String, usize) {
        let l = self.layout;
        let mut ncsv = String::from("well,nucleus,x_px,y_px,x_um,y_um,radius_px");
        for c in 1..=l.cfg.channels {
            let _ = write!(ncsv, ",sigma_px_ch{c},amplitude_ch{c}");
        }
        ncsv.push('\n');
        let mut nuclei = 0;
        for (w, idx) in l.wells.iter().zip(&self.truth.indexes) {
            for (i, n) in idx.nuclei.iter().enumerate() {
                let (xu, yu) = l.stage(w, n.x, n.y);
                let _ = write!(ncsv, "{},{},{},{},{},{},{}", w.0, i + 1, n.x, n.y, xu, yu, n.radius);
                for c in 0..l.cfg.channels as usize {
                    let _ = write!(ncsv, ",{},{}", n.sigma[c], n.amplitude[c]);
                }
                ncsv.push('\n');
                nuclei += 1;
            }
        }
        (ncsv, nuclei)
    }

    /// `truth_<well>_ch<c>.tif`: the noise-free, unblurred signal of every
    /// well frame and channel; with an in-focus blur (`focus_blur_px` > 0),
    /// `clean_<well>_ch<c>.tif`: the same blurred by it, as the in-focus
    /// plane is formed.
    fn write_truth_images(&self) -> Result<(), SynthError> {
        let l = self.layout;
        let cfg = l.cfg;
        let gt = l.out.join("ground_truth");
        let (fw, fh) = (l.frame_w.ceil() as usize, l.frame_h.ceil() as usize);
        // Without an in-focus blur the clean image would be the truth again.
        let references: &[(&str, f64)] =
            if cfg.focus_blur_px > 0.0 { &[("truth", 0.0), ("clean", cfg.focus_blur_px)] } else { &[("truth", 0.0)] };
        let res: Vec<Result<(), SynthError>> = (0..l.wells.len())
            .flat_map(|wi| (1..=cfg.channels).flat_map(move |c| references.iter().map(move |&k| (wi, c, k))))
            .collect::<Vec<_>>()
            .par_iter()
            .map(|&(wi, c, (kind, blur))| {
                let spec = TileSpec {
                    x0: 0.0,
                    y0: 0.0,
                    width: fw,
                    height: fh,
                    channel: (c - 1) as usize,
                    defocus: blur,
                    background: cfg.background,
                    dark_offset: 0.0,
                    read_noise: 0.0,
                    flatfield: &[],
                    seed: 0,
                };
                let sig = render::render_signal(&self.truth.indexes[wi], &spec);
                let stack = Stack::from(one_plane("truth image", fh, fw, sig)?);
                let path = gt.join(format!("{kind}_{}_ch{c}.tif", l.wells[wi].0));
                write_stack(&path, &stack, &WriteOptions { pixel_size_um: Some(cfg.pixel_size_um), ..WriteOptions::default() })?;
                Ok(())
            })
            .collect();
        for r in res {
            r?;
        }
        Ok(())
    }
}

/// `tile_positions.csv`.
fn tile_positions_csv(tiles: &[TileTruth]) -> String {
    let mut csv = String::from(
        "well,site,field_id,grid_row,grid_col,x_px,y_px,nominal_x_px,nominal_y_px,stage_x_um,stage_y_um,true_stage_x_um,true_stage_y_um\n",
    );
    for t in tiles {
        let _ = writeln!(
            csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
            t.well,
            t.site,
            t.field_id,
            t.grid_row,
            t.grid_col,
            t.x_px,
            t.y_px,
            t.nominal_x_px,
            t.nominal_y_px,
            t.stage_x_um,
            t.stage_y_um,
            t.true_stage_x_um,
            t.true_stage_y_um
        );
    }
    csv
}

/// Block-mean downsampling by `f` (thumbnails).
fn downsample(s: &Stack, f: usize) -> Stack {
    let a = match s {
        Stack::U16(a) => a,
        _ => return s.clone(),
    };
    let (_, h, w) = a.dim();
    let (th, tw) = ((h / f).max(1), (w / f).max(1));
    let mut out = Array3::<u16>::zeros((1, th, tw));
    for y in 0..th {
        for x in 0..tw {
            let mut sum = 0u64;
            let mut n = 0u64;
            for yy in y * f..((y + 1) * f).min(h) {
                for xx in x * f..((x + 1) * f).min(w) {
                    sum += u64::from(a[[0, yy, xx]]);
                    n += 1;
                }
            }
            out[[0, y, x]] = (sum / n.max(1)) as u16;
        }
    }
    Stack::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plane_of_the_wrong_size_is_an_error_not_an_image() {
        assert_eq!(one_plane("image", 2, 3, vec![7u16; 6]).map(|a| a.dim()).ok(), Some((1, 2, 3)));
        match one_plane("flat-field", 4, 4, vec![0f32; 15]) {
            Err(SynthError::PlaneSize { what: "flat-field", height: 4, width: 4, got: 15 }) => {}
            other => panic!("expected PlaneSize, got {other:?}"),
        }
    }
}
