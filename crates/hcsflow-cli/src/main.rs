//! `hcsflow`: the command-line front of the engine. A thin layer: argument
//! parsing, logging, human errors and exit codes; the work is in the library crates.

// First: its print macros are used by every module below.
#[macro_use]
mod console;
mod apply;
mod bench;
mod demo;
mod doctor;
mod flags;
mod functions;
mod inspect;
mod progress;
mod report;
mod run;
mod signals;
mod slurm;
mod synth;

use std::process::ExitCode;

/// mimalloc keeps freed memory for reuse. A step's output stack is a fresh
/// allocation of hundreds of MiB per call; glibc maps every block above
/// 32 MiB on its own and unmaps it on free, so each call page-faulted its
/// output in again — for BaSiC's correction of 100 × 1024² tiles that was
/// two thirds of the call (0.3 s of 0.43 s; 0.1 s with memory reused).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (the 16th option of `mi_option_e` in its mimalloc.h, v2
/// and v3; `libmimalloc-sys` 0.1.49 names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Tells mimalloc never to return freed memory to the OS (its default: after 10 ms). N2V2's
/// layers allocate and free activations of tens of MiB, milliseconds apart: returned and faulted
/// in again, their pages were cleared by the kernel on every layer (a seventh of a prediction).
/// Kept, a Mega Flex run took 144 s instead of 161 s (N2V2 prediction 67 s instead of 80 s), its
/// peak RSS 1018 MiB instead of 914. The process's footprint stays at its high-water mark, which
/// the peak RSS already is.
fn keep_freed_memory() {
    // SAFETY: sets an option of the allocator (an integer in its option table); valid at any
    // time, also after the first allocation.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

use clap::{Parser, Subcommand};

/// Exit codes (also in the README):
/// 0 success; 1 failure while running (I/O, a function failed);
/// 2 usage or validation error found before any pixel is read
/// (bad arguments, unknown function, bad device string);
/// 3 the requested device is not available;
/// 130 a run stopped by a signal (SIGINT, SIGTERM, SIGHUP) after finishing
/// its wells in flight, with wells left to do (`--resume` finishes them).
/// A second signal ends the process at once with 128 + its number.
/// A closed stdout (`| head`) ends a command quietly with 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Failure = 1,
    Usage = 2,
    DeviceUnavailable = 3,
    Interrupted = 130,
}

/// An error with the exit code it maps to.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub error: anyhow::Error,
}

impl CliError {
    pub fn new(exit: Exit, error: impl Into<anyhow::Error>) -> Self {
        CliError { exit, error: error.into() }
    }
}

/// The engine's errors carry their class: usage (2), failure (1), device
/// unavailable (3).
impl From<hcsflow::Error> for CliError {
    fn from(error: hcsflow::Error) -> Self {
        let exit = match error.kind() {
            hcsflow::ErrorKind::Usage => Exit::Usage,
            hcsflow::ErrorKind::Failure => Exit::Failure,
            hcsflow::ErrorKind::DeviceUnavailable => Exit::DeviceUnavailable,
        };
        CliError::new(exit, error)
    }
}

impl From<anyhow::Error> for CliError {
    fn from(error: anyhow::Error) -> Self {
        CliError { exit: Exit::Failure, error }
    }
}

pub type CliResult = Result<(), CliError>;

#[derive(Parser)]
#[command(name = "hcsflow", version, about = "High-content-screening image processing: fast, reproducible, GPU-first.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Report CPU, SIMD, memory, GPU adapters, CUDA driver and the default device (and why).
    Doctor(doctor::DoctorArgs),
    /// List registered functions: memory types, contract, arguments with defaults and docs.
    Functions(functions::FunctionsArgs),
    /// Run one function on a single- or multi-page TIFF and write the result as TIFF.
    Apply(apply::ApplyArgs),
    /// Generate a synthetic ImageXpress or Opera Phenix plate with ground truth.
    Synth(synth::SynthArgs),
    /// Describe a plate: format, wells, sites, channels, z, timepoints, grid, pixel size, missing images.
    Inspect(inspect::InspectArgs),
    /// Benchmarks: time functions on the peer benchmarks' .npy inputs (see scripts/bench-vs-peers.sh).
    Bench(bench::BenchArgs),
    /// Run a pipeline (TOML) on a plate: outputs, summary CSV and run manifest under OUT.
    Run(run::RunArgs),
    /// Generate a small synthetic plate and run the demo pipeline on it end to end.
    Demo(demo::DemoArgs),
    /// (Re)write the QC report of a run's output folder: OUT/report.html and OUT/hcsflow_mqc.json.
    Report(report::ReportArgs),
    /// Run a plate's shards on a Slurm cluster: submit the jobs, or read where they stand.
    Slurm(slurm::SlurmArgs),
}

/// Logs to stderr (`RUST_LOG`, default warn; write errors ignored, see [`console`]) and, with `--trace FILE`, every
/// info-level span (well, step, read, stack, call, conversion, write) to a
/// Chrome/Perfetto trace. The guard flushes the trace when dropped at the end of `main`.
fn init_tracing(trace: Option<&std::path::Path>) -> Result<Option<tracing_chrome::FlushGuard>, CliError> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let logs = tracing_subscriber::fmt::layer().with_writer(|| console::Stderr).with_filter(filter);
    let (chrome, guard) = match trace {
        Some(path) => {
            let file = std::fs::File::create(path)
                .map_err(|e| CliError::new(Exit::Usage, anyhow::anyhow!("cannot create the trace file {}: {e}", path.display())))?;
            let (layer, guard) = tracing_chrome::ChromeLayerBuilder::new().writer(file).include_args(true).build();
            (Some(layer.with_filter(tracing_subscriber::filter::LevelFilter::INFO)), Some(guard))
        }
        None => (None, None),
    };
    tracing_subscriber::registry().with(logs).with(chrome).init();
    Ok(guard)
}

/// Mesa's implicit Vulkan layer `VK_LAYER_MESA_device_select` connects to
/// Wayland to find a "default" GPU whenever adapters are enumerated, and on a
/// headless machine (HPC nodes, CI) that prints "XDG_RUNTIME_DIR is invalid or
/// not set" twice. hcsflow chooses its adapter itself and reports why, so the
/// layer is disabled through the switch its manifest declares
/// (`NODEVICE_SELECT=1`), unless the user set that variable. Runs first in
/// `main`, while the process has one thread.
fn quiet_vulkan_device_select() {
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    quiet_vulkan_device_select();
    let cli = Cli::parse();
    let trace = match &cli.command {
        Command::Run(a) => a.output.trace.clone(),
        Command::Demo(a) => a.output.trace.clone(),
        _ => None,
    };
    let _trace_guard = match init_tracing(trace.as_deref()) {
        Ok(g) => g,
        Err(e) => return report(e),
    };
    let result = match cli.command {
        Command::Doctor(a) => doctor::run(a),
        Command::Functions(a) => functions::run(a),
        Command::Apply(a) => apply::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Run(a) => run::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Report(a) => report::run(a),
        Command::Slurm(a) => slurm::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report(e),
    }
}

/// Prints an error and gives its exit code; a closed stdout is not an error
/// (the reader had what it wanted): exit 0, no message.
fn report(e: CliError) -> ExitCode {
    if e.error.is::<console::StdoutClosed>() {
        return ExitCode::SUCCESS;
    }
    errln!("error: {}", one_line(&e.error));
    ExitCode::from(e.exit as u8)
}

/// An error and its causes on one line, `outer: cause: cause`, as anyhow's
/// `{:#}` prints them, except that a cause is left out when the text so far
/// already ends with it: many errors show their source in their own message
/// (`{path}: {source}`), and the user should read the reason once.
fn one_line(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let cause = cause.to_string();
        if text.ends_with(&cause) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&cause);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_cause_already_in_its_parents_message_is_said_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let tiff = hcsflow::tiff::TiffError::Io { path: "/p/a.tif".into(), source: io };
        let e = anyhow::Error::new(tiff).context("reading /p/a.tif");
        let text = one_line(&e);
        assert_eq!(text.matches("entity not found").count(), 1, "{text}");
        assert!(text.starts_with("reading /p/a.tif: /p/a.tif: "), "{text}");
        // Causes that add something are all kept, in order.
        let e = anyhow::anyhow!("the disk").context("writing OUT").context("well A01");
        assert_eq!(one_line(&e), "well A01: writing OUT: the disk");
    }
}
