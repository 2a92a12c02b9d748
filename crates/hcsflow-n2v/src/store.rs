//! A trained model as a directory: `model.bpk` (burn's burnpack record of the weights and batch
//! norm statistics) and `n2v.json` (format, settings, normalisation).

use std::path::Path;

use burn::module::Module;
use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use crate::config::N2vConfig;
use crate::model::UNet;
use crate::{Denoiser, N2vError, Normalization};

/// Name of the weights file in a model directory.
pub const WEIGHTS_FILE: &str = "model.bpk";
/// Name of the description file in a model directory.
pub const META_FILE: &str = "n2v.json";
/// The `format` a description file must carry.
pub const FORMAT: &str = "hcsflow-n2v2/1";

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta {
    format: String,
    config: N2vConfig,
    normalization: Normalization,
}

impl Denoiser {
    /// Saves the model into directory `dir` (created if missing; the two files are replaced).
    pub fn save(&self, dir: &Path) -> Result<(), N2vError> {
        std::fs::create_dir_all(dir).map_err(|source| N2vError::Io { path: dir.to_path_buf(), source })?;
        let meta = Meta { format: FORMAT.into(), config: self.config.clone(), normalization: self.norm };
        let meta_path = dir.join(META_FILE);
        let json = serde_json::to_string_pretty(&meta).map_err(|e| N2vError::Model { path: meta_path.clone(), reason: e.to_string() })?;
        std::fs::write(&meta_path, json).map_err(|source| N2vError::Io { path: meta_path, source })?;
        let weights = dir.join(WEIGHTS_FILE);
        self.model.clone().save_file(&weights).map_err(|e| N2vError::Model { path: weights, reason: e.to_string() })
    }

    /// Loads a model saved by [`Denoiser::save`] onto `device`; it predicts exactly as the saved
    /// one did on the same backend.
    pub fn load(dir: &Path, device: &Device) -> Result<Self, N2vError> {
        let meta_path = dir.join(META_FILE);
        let text = std::fs::read_to_string(&meta_path).map_err(|source| N2vError::Io { path: meta_path.clone(), source })?;
        let bad = |reason: String| N2vError::Model { path: meta_path.clone(), reason };
        let meta: Meta = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if meta.format != FORMAT {
            return Err(bad(format!("format is {:?}, expected {FORMAT:?}", meta.format)));
        }
        meta.config.validate()?;
        let n = meta.normalization;
        if !(n.mean.is_finite() && n.std.is_finite() && n.std > 0.0) {
            return Err(bad(format!("bad normalization: mean {}, std {}", n.mean, n.std)));
        }
        let weights = dir.join(WEIGHTS_FILE);
        let model = UNet::new(meta.config.features, meta.config.seed, device)
            .try_load_file(&weights)
            .map_err(|e| N2vError::Model { path: weights, reason: e.to_string() })?;
        Ok(Denoiser::new(model, n, meta.config, device.clone()))
    }
}
