//! Flag groups shared by several commands: one definition each, so every
//! command that takes them accepts the same flags with the same meaning.

use std::path::PathBuf;

use clap::Args;
use hcsflow::core::{BadDevice, DeviceRequest};
use hcsflow::pipeline::NgffVersion;
use hcsflow::DeviceOptions;

use crate::{CliError, Exit};

/// Where functions run (`run`, `demo`, `apply`).
#[derive(Args)]
pub struct DeviceArgs {
    /// auto | cpu | gpu | gpu:N | gpu:N,M,… (wells spread over several adapters).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Allow a software GPU adapter (lavapipe/llvmpipe), for tests and CI.
    #[arg(long)]
    allow_software_gpu: bool,
    /// Allow copies through host memory between two GPU libraries that cannot share memory.
    #[arg(long)]
    allow_host_round_trip: bool,
}

impl DeviceArgs {
    /// The engine's device options; a bad `--device` is a usage error (exit 2).
    pub fn options(&self) -> Result<DeviceOptions, CliError> {
        let request: DeviceRequest = self.device.parse().map_err(|e: BadDevice| CliError::new(Exit::Usage, e))?;
        Ok(DeviceOptions { request, allow_software_gpu: self.allow_software_gpu, allow_host_round_trip: self.allow_host_round_trip })
    }
}

/// Output flags of every command that executes a pipeline (`run`, `demo`).
#[derive(Args)]
pub struct OutputArgs {
    /// OME-Zarr output (`materialize = ["zarr"]`): NGFF 0.5 on Zarr v3, or 0.4 on
    /// Zarr v2 for readers that predate Zarr v3 (zarr-python 2, older Fiji/MoBIE).
    #[arg(long, default_value = "0.5")]
    zarr_format: String,
    /// Write a Chrome/Perfetto trace (chrome://tracing, ui.perfetto.dev): spans per
    /// well, step, read, stack, function call, conversion and write.
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

impl OutputArgs {
    /// The NGFF version asked for; an unknown one is a usage error (exit 2).
    pub fn zarr_format(&self) -> Result<NgffVersion, CliError> {
        self.zarr_format.parse::<NgffVersion>().map_err(|e| CliError::new(Exit::Usage, e))
    }
}
