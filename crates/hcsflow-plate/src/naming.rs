//! Names of pipeline outputs that follow from a plate's file layout.
//!
//! A pipeline writes one output file per stack under the name of the stack's
//! first input image, relative to the plate folder; these are the two rules
//! for stacks whose name is not simply that.

use std::path::{Component, Path, PathBuf};

use crate::imagexpress::{ImageName, ZSTEP_FOLDER};
use crate::{ImageRecord, MissingImage};

/// The output name of a stack reduced over z, from the name `rel` of its
/// first plane: `rel` without any ImageXpress `ZStep_<z>` folder, so that the
/// result lands in `TimePoint_<t>/` where MetaXpress puts its own projections.
pub fn z_reduced_rel(rel: &Path) -> PathBuf {
    rel.components().filter(|c| !matches!(c, Component::Normal(s) if s.to_string_lossy().starts_with(ZSTEP_FOLDER))).collect()
}

/// The prefix-less ImageXpress name with every component,
/// `A01_s1_w2_z3_t1.tif`: the name of an image that has no file of its own.
fn component_name(well: &str, site: u32, channel: u32, z: u32, t: u32) -> PathBuf {
    let name = ImageName {
        prefix: None,
        well: well.to_string(),
        site: Some(site),
        wave: Some(channel),
        timepoint: Some(t),
        z: Some(z),
        thumb: false,
        guid: None,
    };
    PathBuf::from(format!("{}.tif", name.stem()))
}

impl MissingImage {
    /// The name that stands for this image when the plate names no file for
    /// it (e.g. an empty URL in a Harmony index): `component_name`.
    pub fn placeholder_rel(&self) -> PathBuf {
        component_name(&self.well, self.site, self.channel, self.z_index, self.timepoint)
    }
}

impl ImageRecord {
    /// The name outputs of this image mirror: its file relative to the plate
    /// folder `root` (its file name when it is elsewhere, as a symbolic
    /// link's target may be); for a plane inside a container (a Zarr array),
    /// which has no file of its own, `component_name`: `A01_s1_w2_z3_t1.tif`.
    pub fn rel(&self, root: &Path) -> PathBuf {
        if self.at.is_some() {
            return component_name(&self.well, self.site, self.channel, self.z_index, self.timepoint);
        }
        self.path.strip_prefix(root).map(Path::to_path_buf).unwrap_or_else(|_| self.path.file_name().map(PathBuf::from).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn z_reduction_drops_only_the_zstep_folder() {
        assert_eq!(z_reduced_rel(Path::new("TimePoint_1/ZStep_2/P_A01_s1_w1.tif")), Path::new("TimePoint_1/P_A01_s1_w1.tif"));
        assert_eq!(z_reduced_rel(Path::new("Images/r01c01f01p02-ch1sk1fk1fl1.tiff")), Path::new("Images/r01c01f01p02-ch1sk1fk1fl1.tiff"));
        assert_eq!(z_reduced_rel(Path::new("zstep_2/a.tif")), Path::new("zstep_2/a.tif"));
    }

    #[test]
    fn placeholder_names_every_component() {
        let m = MissingImage {
            well: "B03".into(),
            site: 4,
            channel: 2,
            z_index: 3,
            timepoint: 1,
            path: None,
            reason: "empty URL in the index".into(),
        };
        assert_eq!(m.placeholder_rel(), Path::new("B03_s4_w2_z3_t1.tif"));
    }
}
