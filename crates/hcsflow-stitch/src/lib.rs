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
//! Registry functions (see [`register`]): `tile_positions` produces the
//! `positions` and `edges` artifacts; `assemble` consumes `positions` when an
//! earlier pipeline step produced them (e.g. on a composite) and registers the
//! tiles itself otherwise. Both lay tiles out from the plate metadata the
//! pipeline injects (stage positions, site grid, pixel size) when it has it.

mod assemble;
mod fft;
mod layout;
mod pairwise;
mod positions;

pub use assemble::{assemble, canvas_geometry, placements, Blend, Canvas, Placement};
pub use layout::{TileInfo, TileLayout};
pub use positions::{tile_positions, Edge, EdgeStatus, PositionParams, TilePositions};

use hcsflow_core::{ArtifactDecl, CallContext, Cell, Contract, FunctionDecl, FunctionError, Registry, Stack, StackInfo, Table};

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

/// The expected layout of the tiles of a registry call, from the metadata the
/// pipeline injects when it has it, else from the arguments:
/// 1. every plane has a stage position and the plate a pixel size → stage
///    positions (grid cells, when known, only label the tiles);
/// 2. every plane has a grid cell → nominal grid from `overlap`;
/// 3. otherwise `grid_cols` columns (0 = square grid) in raster order, nominal
///    step from `overlap` (what `hcsflow apply` on a multi-page TIFF uses).
fn call_layout(
    name: &str,
    tiles: &Stack,
    args: &TilePositionsArgs,
    stack: &StackInfo,
) -> Result<(TileLayout, &'static str), FunctionError> {
    let [n, h, w] = tiles.shape();
    let cells = stack.grid_cells(n);
    if let (Some(stage), Some(px)) = (stack.stage_positions_um(n), stack.pixel_size_um) {
        let cells = cells.unwrap_or_else(|| (0..n as u32).map(|i| (0, i)).collect());
        let layout = TileLayout::from_stage_um(&cells, &stage, px).map_err(|e| FunctionError::failed(name, e))?;
        return Ok((layout, "stage positions from the plate metadata"));
    }
    if let Some(cells) = cells {
        return Ok((TileLayout::from_cells(&cells, w, h, args.overlap), "the plate's site grid and the overlap argument"));
    }
    let mut cols = args.grid_cols.max(0) as usize;
    if cols == 0 {
        let r = (n as f64).sqrt().round() as usize;
        if r * r != n {
            return Err(FunctionError::invalid(name, format!("{n} tiles are not a square grid; set grid_cols")));
        }
        cols = r;
    }
    if cols == 0 || n % cols != 0 {
        return Err(FunctionError::invalid(name, format!("{n} tiles do not fill rows of grid_cols = {cols}")));
    }
    Ok((TileLayout::grid((n / cols) as u32, cols as u32, w, h, args.overlap), "the grid_cols and overlap arguments"))
}

hcsflow_core::function_args! {
    /// The arguments of [`TILE_POSITIONS`] (and the grid arguments of [`ASSEMBLE`]).
    pub struct TilePositionsArgs {
        grid_cols: i64 = int(0, Some(0), Some(10_000), "without plate metadata: tiles per grid row, raster order (0 = square grid)"),
        overlap: f64 = float(0.1, Some(0.0), Some(0.9), "without stage positions: nominal overlap fraction of adjacent tiles"),
        max_shift_px: f64 = float(0.0, Some(0.0), None, "largest deviation from the nominal offset, px (0 = 5 % of the tile)"),
        min_score: f64 = float(0.15, Some(-1.0), Some(1.0), "score floor of an overlap (Pearson r of the high-passed aligned strips)"),
    }
}

impl TilePositionsArgs {
    /// The registration parameters these arguments set.
    pub fn position_params(&self) -> PositionParams {
        let ms = self.max_shift_px;
        PositionParams { max_shift_px: (ms > 0.0).then_some(ms), min_score: self.min_score, ..PositionParams::default() }
    }
}

hcsflow_core::function_args! {
    /// The arguments of [`ASSEMBLE`]: the blend, then those of [`TILE_POSITIONS`]
    /// (used when no `positions` artifact exists).
    pub struct AssembleArgs {
        blend: String = choice("linear", &["linear", "none", "max"], "how overlaps combine: linear ramps, last tile wins, or maximum"),
        ..grid: TilePositionsArgs
    }
}

impl AssembleArgs {
    /// The blend argument as a [`Blend`].
    pub fn blend_mode(&self) -> Result<Blend, FunctionError> {
        self.blend.parse().map_err(|e: StitchError| FunctionError::invalid("assemble", e.to_string()))
    }
}

/// The artifact `tile_positions` produces and `assemble` consumes.
pub const POSITIONS: &str = "positions";
/// The edge table `tile_positions` produces.
pub const EDGES: &str = "edges";

pub static TILE_POSITIONS: FunctionDecl<TilePositionsArgs> = FunctionDecl::new(
    "tile_positions",
    Contract::Pure3d,
    "Sub-pixel tile positions of a grid (strip FFT correlation, Gauss-Newton refinement, global least squares); returns the tiles unchanged, positions and edges as artifacts.",
)
.with_produces(&[
    ArtifactDecl::table(POSITIONS, "per tile: grid_row, grid_col, x_px, y_px (registered top-left), stage_x_px, stage_y_px, stage_only"),
    ArtifactDecl::table(EDGES, "per overlap: tile_a, tile_b (1-based planes), site_a, site_b, predicted and measured dx, dy (px), score, status, residual (px)"),
]);

pub static ASSEMBLE: FunctionDecl<AssembleArgs> = FunctionDecl::new(
    "assemble",
    Contract::VolumetricToSlice,
    "Mosaic of a tile grid at the positions of an earlier tile_positions step (else registered here), with linear/none/max blending; one plane of the input dtype.",
)
.with_consumes(&[ArtifactDecl {
    name: POSITIONS,
    doc: "tile positions (x_px, y_px per tile); without it, assemble registers the tiles itself",
    optional: true,
    ..ArtifactDecl::table(POSITIONS, "")
}]);

/// Columns of the `positions` artifact: one row per tile (plane).
const POSITION_COLUMNS: [&str; 6] = ["grid_row", "grid_col", "x_px", "y_px", "stage_x_px", "stage_y_px"];

/// Registered positions and their edges as artifact tables, plus what the
/// run report must say (a fallback to stage positions is never silent).
fn position_tables(layout: &TileLayout, pos: &TilePositions, stack: &StackInfo) -> Result<(Table, Table), FunctionError> {
    let fail = |e: hcsflow_core::artifact::RowLengthError| FunctionError::failed("tile_positions", e);
    let mut positions = Table::new(POSITION_COLUMNS.iter().copied().chain(["stage_only"]));
    for (i, (t, &(x, y))) in layout.tiles.iter().zip(&pos.positions).enumerate() {
        positions
            .push(
                Some(i),
                vec![
                    Cell::from(t.row),
                    Cell::from(t.col),
                    Cell::from(x),
                    Cell::from(y),
                    Cell::from(t.stage_x_px),
                    Cell::from(t.stage_y_px),
                    Cell::from(pos.stage_only.contains(&i)),
                ],
            )
            .map_err(fail)?;
    }
    // Tiles are named by plane (1-based) and, with plate metadata, by site.
    let site = |i: usize| Cell::from(stack.planes.get(i).map(|p| p.site));
    let finite = |v: f64| if v.is_finite() { Cell::from(v) } else { Cell::Empty };
    let mut edges = Table::new([
        "tile_a",
        "tile_b",
        "site_a",
        "site_b",
        "predicted_dx",
        "predicted_dy",
        "measured_dx",
        "measured_dy",
        "score",
        "status",
        "residual",
    ]);
    for e in &pos.edges {
        edges
            .push(
                None,
                vec![
                    Cell::from(e.a + 1),
                    Cell::from(e.b + 1),
                    site(e.a),
                    site(e.b),
                    Cell::from(e.predicted.0),
                    Cell::from(e.predicted.1),
                    finite(e.measured.0),
                    finite(e.measured.1),
                    finite(e.score),
                    Cell::from(e.status.to_string()),
                    finite(e.residual),
                ],
            )
            .map_err(fail)?;
    }
    Ok((positions, edges))
}

/// Registers `tile_positions` and `assemble` (host implementations).
///
/// - `tile_positions` (pure_3d, N → N): registers the tiles of a grid laid out
///   by the injected plate metadata (stage positions, site grid) or the grid
///   arguments, produces the `positions` artifact (one row per tile: grid cell,
///   registered and stage top-left corner in px) and the `edges` table, and
///   returns its input unchanged so it can run on a composite while later
///   steps stitch the raw channels. A fallback to stage positions is a note
///   in the run report.
/// - `assemble` (volumetric_to_slice, N → 1): places the tiles at the positions
///   of the `positions` artifact when an earlier step produced it (rows matched
///   to tiles by site), else registers the grid itself; blends with `blend`.
pub fn register(registry: &mut Registry) {
    registry.add(TILE_POSITIONS.host(|s, args, ctx| {
        let (layout, source) = call_layout("tile_positions", s, args, &ctx.stack)?;
        let pos = tile_positions(s, &layout, &args.position_params()).map_err(|e| FunctionError::failed("tile_positions", e))?;
        if let Some(message) = pos.describe(|k| tile_label(&ctx.stack, k)) {
            ctx.note(format!("tile_positions (layout from {source}): {message}"));
        }
        let (positions, edges) = position_tables(&layout, &pos, &ctx.stack)?;
        ctx.produce(POSITIONS, positions);
        ctx.produce(EDGES, edges);
        Ok(s.clone())
    }));
    registry.add(ASSEMBLE.host(|s, args, ctx| {
        let blend = args.blend_mode()?;
        let positions = match ctx.inputs.get(POSITIONS) {
            Some(table) => positions_from_table(table, s.depth(), &ctx.stack)?,
            None => register_for_assembly(s, &args.grid, ctx)?,
        };
        assemble(s, &positions, blend).map_err(|e| FunctionError::failed("assemble", e))
    }));
}

/// What `assemble` does without a `positions` artifact (every implementation
/// of it): registers `tiles` laid out from the call's plate metadata or its grid
/// arguments (those of `tile_positions`), and notes a fallback in the context.
pub fn register_for_assembly(tiles: &Stack, args: &TilePositionsArgs, ctx: &mut CallContext) -> Result<Vec<(f64, f64)>, FunctionError> {
    let (layout, source) = call_layout("assemble", tiles, args, &ctx.stack)?;
    let pos = tile_positions(tiles, &layout, &args.position_params()).map_err(|e| FunctionError::failed("assemble", e))?;
    if let Some(message) = pos.describe(|k| tile_label(&ctx.stack, k)) {
        ctx.note(format!("assemble (layout from {source}): {message}"));
    }
    Ok(pos.positions)
}

/// How a run report names tile `k` (0-based plane) of a call: its site when
/// the pipeline injected plate metadata, else its 1-based plane.
fn tile_label(stack: &StackInfo, k: usize) -> String {
    stack.planes.get(k).map_or(format!("plane {}", k + 1), |p| format!("site {}", p.site))
}

/// The `(x, y)` of every plane from a `positions` table re-indexed to the
/// stack's planes; an error names the planes (sites) without a position.
pub fn positions_from_table(table: &Table, n: usize, stack: &StackInfo) -> Result<Vec<(f64, f64)>, FunctionError> {
    let mut out = Vec::with_capacity(n);
    let mut missing = Vec::new();
    for i in 0..n {
        match (table.plane_value(i, "x_px"), table.plane_value(i, "y_px")) {
            (Some(x), Some(y)) => out.push((x, y)),
            _ => missing.push(tile_label(stack, i)),
        }
    }
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(FunctionError::invalid("assemble", format!("the positions artifact has no position for {}", missing.join(", "))))
    }
}
