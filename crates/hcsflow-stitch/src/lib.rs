//! Stitching of tile grids: sub-pixel tile positions and mosaic assembly.
//!
//! The library API is the product:
//!
//! - [`tile_positions`]`(tiles, layout, params)` → [`TilePositions`]: the
//!   top-left corner of every tile (f64 px), the edge table (pairs, measured
//!   offsets, scores, accepted or why not; [`TilePositions::to_csv`]) and an
//!   explicit flag + message when alignment was impossible and the stage
//!   positions were used ([`TilePositions::fell_back_to_stage`]) — run
//!   reports must show it; OpenHCS falls back silently.
//! - [`assemble`]`(tiles, positions, blend)` → one plane of the input dtype.
//!
//! How positions are computed (why each choice):
//! - **Neighbours** come from the expected rectangles ([`TileLayout`]: grid
//!   cells and stage positions in px), so grids with missing tiles and Opera
//!   Phenix fields placed by stage position need no special case.
//! - **Only the overlap strips** (predicted overlap ± `max_shift`) are
//!   transformed, with real-to-complex FFTs planned once per strip size and
//!   shared by all edges; edges run in parallel (rayon).
//! - **Correlation**: FFT cross-correlation of the band-passed strips
//!   (3×3 mean minus a 17×17 mean: no shading, less pixel noise), of their
//!   periodic components (Moisan) so the strip borders do not correlate at
//!   zero shift. Not whitened phase correlation: whitening weights the
//!   noise-dominated high frequencies like the signal and lost narrow noisy
//!   overlaps in our tests.
//! - **Sub-pixel**: up to three correlation peaks, each refined by
//!   Gauss–Newton on the raw overlap (translation, gain, offset, shading
//!   ramps), the best-matching one kept: 0.005–0.07 px on synthetic plates,
//!   without the cost of an upsampled DFT.
//! - **Rejection** without a thousand registrations: an absolute score floor
//!   (Pearson r of the high-passed overlap) raised, when the data says so, by
//!   the scores of a few random non-overlapping strip pairs; out-of-range and
//!   search-border peaks; edges inconsistent with the global fit.
//! - **Global fit**: weighted least squares of the accepted offsets per
//!   connected group of tiles; each group keeps the mean stage position of its
//!   tiles (stage positions as weak priors), so blank tiles and tiles whose
//!   neighbours are missing still get their stage position, and are listed.
//!
//! Registry functions (see [`register`]): until the pipeline engine carries the
//! positions artifact between steps, the registry's `tile_positions` computes
//! the positions and returns its input unchanged, and `assemble` computes the
//! positions itself from its grid arguments.

mod assemble;
mod fft;
mod layout;
mod pairwise;
mod positions;

pub use assemble::{assemble, canvas_geometry, Blend, Canvas};
pub use layout::{TileInfo, TileLayout};
pub use positions::{tile_positions, Edge, EdgeStatus, PositionParams, TilePositions};

use hcsflow_core::{ArgSpec, Args, Contract, FunctionError, FunctionSpec, Implementation, Registry, Stack};

/// Why stitching could not run. Alignment that fails is *not* an error: it
/// falls back to stage positions and says so in [`TilePositions`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StitchError {
    #[error("no tiles: the stack has no planes")]
    Empty,
    #[error("the stack has {tiles} tiles but the layout/positions describe {layout}")]
    LayoutMismatch { tiles: usize, layout: usize },
    #[error("invalid parameter: {0}")]
    InvalidParameter(String),
    #[error("the mosaic would be {height} x {width} pixels, too large")]
    CanvasTooLarge { height: usize, width: usize },
}

/// Grid layout for registry calls: `grid_cols` columns (0 = square grid),
/// rows filled in raster order, nominal step from `overlap`.
fn grid_layout(name: &str, tiles: &Stack, args: &Args) -> Result<TileLayout, FunctionError> {
    let [n, h, w] = tiles.shape();
    let mut cols = args.int("grid_cols").max(0) as usize;
    if cols == 0 {
        let r = (n as f64).sqrt().round() as usize;
        if r * r != n {
            return Err(FunctionError::failed(name, format!("{n} tiles are not a square grid; set grid_cols")));
        }
        cols = r;
    }
    if cols == 0 || n % cols != 0 {
        return Err(FunctionError::failed(name, format!("{n} tiles do not fill rows of grid_cols = {cols}")));
    }
    Ok(TileLayout::grid((n / cols) as u32, cols as u32, w, h, args.float("overlap")))
}

fn params_from(args: &Args) -> PositionParams {
    let ms = args.float("max_shift_px");
    PositionParams {
        max_shift_px: (ms > 0.0).then_some(ms),
        min_score: args.float("min_score"),
        ..PositionParams::default()
    }
}

fn grid_args() -> Vec<ArgSpec> {
    vec![
        ArgSpec::int("grid_cols", 0, Some(0), Some(10_000), "tiles per grid row, raster order (0 = square grid)"),
        ArgSpec::float("overlap", 0.1, Some(0.0), Some(0.9), "nominal overlap fraction of adjacent tiles"),
        ArgSpec::float("max_shift_px", 0.0, Some(0.0), None, "largest deviation from the nominal offset, px (0 = 5 % of the tile)"),
        ArgSpec::float("min_score", 0.15, Some(-1.0), Some(1.0), "score floor of an overlap (Pearson r of the high-passed aligned strips)"),
    ]
}

/// Registers `tile_positions` and `assemble` (host implementations).
///
/// - `tile_positions` (pure_3d, N → N): computes the positions of the tiles of
///   a grid and returns its input unchanged. The positions go through the
///   library API ([`tile_positions`]) until the pipeline engine carries the
///   `positions` artifact between steps; returning the tiles (rather than an
///   overview) keeps the step transparent so it can be chained before `assemble`.
/// - `assemble` (volumetric_to_slice, N → 1): registers the grid given by its
///   arguments and assembles it with the `blend` mode. A failed alignment
///   still assembles (at the nominal grid); the library API reports it.
pub fn register(registry: &mut Registry) {
    registry.register(
        FunctionSpec {
            name: "tile_positions",
            doc: "Sub-pixel tile positions of a grid (strip FFT correlation, Gauss-Newton refinement, global least squares); returns the tiles unchanged (positions via the library API until artifacts exist).",
            contract: Contract::Pure3d,
            args: grid_args(),
        },
        Implementation::host(|s, args| {
            let layout = grid_layout("tile_positions", s, args)?;
            tile_positions(s, &layout, &params_from(args)).map_err(|e| FunctionError::failed("tile_positions", e.to_string()))?;
            Ok(s.clone())
        }),
    );
    let mut args = grid_args();
    args.insert(0, ArgSpec::choice("blend", "linear", &["linear", "none", "max"], "how overlaps combine: linear ramps, last tile wins, or maximum"));
    registry.register(
        FunctionSpec {
            name: "assemble",
            doc: "Mosaic of a tile grid at registered sub-pixel positions, with linear/none/max blending; one plane of the input dtype.",
            contract: Contract::VolumetricToSlice,
            args,
        },
        Implementation::host(|s, args| {
            let fail = |e: StitchError| FunctionError::failed("assemble", e.to_string());
            let layout = grid_layout("assemble", s, args)?;
            let pos = tile_positions(s, &layout, &params_from(args)).map_err(fail)?;
            let blend: Blend = args.str("blend").parse().map_err(fail)?;
            assemble(s, &pos.positions, blend).map_err(fail)
        }),
    );
}
