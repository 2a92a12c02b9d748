//! The registry functions on a synthetic 3x3 grid.

use crate::common;

use common::{load, Case};
use hcsflow_core::{Array, ConversionPolicy, Conversions, Device, MemoryType, Registry, Stack};

/// `name` with text arguments on the host, its error as text.
fn run(r: &Registry, name: &str, args: &[&str], s: &Stack) -> Result<Stack, String> {
    hcsflow_testkit::call(r, &Conversions::default(), name, args, s, Device::Cpu).map_err(|e| e.to_string())
}

#[test]
fn tile_positions_passes_through_and_assemble_makes_one_plane() {
    let mut r = Registry::new();
    hcsflow_stitch::register(&mut r);
    let dir = tempfile::tempdir().unwrap();
    let d = load(&Case { density: 1000.0, ..Case::new(3, 3, 128, 0.2, 0.01, 21) }, &dir.path().join("p"));
    let out = run(&r, "tile_positions", &["overlap=0.2"], &d.tiles).unwrap();
    assert_eq!(out, d.tiles);
    for blend in ["linear", "none", "max"] {
        let m = run(&r, "assemble", &["overlap=0.2", &format!("blend={blend}")], &d.tiles).unwrap();
        assert_eq!(m.depth(), 1);
        assert_eq!(m.dtype(), d.tiles.dtype());
        let [_, h, w] = m.shape();
        // 128 + 2 steps of ~102.4 px, ± jitter.
        assert!((325..=340).contains(&h) && (325..=340).contains(&w), "{h}x{w}");
    }
    assert!(run(&r, "assemble", &["blend=average"], &d.tiles).unwrap_err().contains("blend"));
    // 9 tiles in rows of 2: a clear error, not a panic.
    assert!(run(&r, "assemble", &["grid_cols=2"], &d.tiles).unwrap_err().contains("grid_cols"));
}

#[test]
fn a_blank_tile_is_named_by_its_site_in_the_note_and_by_number_outside_a_pipeline() {
    let mut r = Registry::new();
    hcsflow_stitch::register(&mut r);
    let dir = tempfile::tempdir().unwrap();
    let mut d = load(&Case { density: 1000.0, ..Case::new(3, 3, 256, 0.12, 0.02, 11) }, &dir.path().join("p"));
    let blank = 4;
    if let Stack::U16(a) = &mut d.tiles {
        a.plane_mut(blank).fill(220);
    }
    // Without metadata: the library's 1-based tile number.
    let lib = hcsflow_stitch::tile_positions(&d.tiles, &d.layout, &hcsflow_stitch::PositionParams::default()).unwrap();
    let message = lib.message.clone().unwrap_or_default();
    assert!(message.ends_with("stage positions: tile 5"), "{message}");

    // In a pipeline the planes carry their sites (here 11..=19, plane order).
    let conv = Conversions::default();
    let args = r.get("tile_positions").unwrap().parse_args(&["overlap=0.12".to_string()]).unwrap();
    let plan = r.plan_call("tile_positions", args, MemoryType::Host, Device::Cpu, &conv, ConversionPolicy::default()).unwrap();
    let planes =
        (0..9u32).map(|k| hcsflow_core::PlaneInfo { site: 11 + k, channel: 1, z_index: 1, timepoint: 1, ..Default::default() }).collect();
    let stack = hcsflow_core::StackInfo { well: "B03".into(), planes, pixel_size_um: None };
    let mut ctx = hcsflow_core::CallContext::new(stack, Default::default());
    r.execute_in(&plan, Array::from(d.tiles.clone()), &conv, &mut ctx).unwrap();
    assert_eq!(ctx.notes().len(), 1, "{:?}", ctx.notes());
    let note = &ctx.notes()[0];
    assert!(note.ends_with("placed at their stage positions: site 15"), "{note}");
}

/// A host kernel's error reaches the caller as its own type, behind the
/// function's name: `source()` is the `StitchError`, and the message is the
/// function's name and that error's message.
#[test]
fn a_stitching_error_keeps_its_type_as_the_source() {
    use hcsflow_core::{CallContext, Cell, FunctionError, StackInfo, Table};
    use hcsflow_stitch::StitchError;
    let mut r = Registry::new();
    hcsflow_stitch::register(&mut r);
    let tiles = Stack::from(ndarray::Array3::<u16>::from_elem((2, 8, 8), 5));
    // Positions 1e10 px apart: a mosaic too large to allocate.
    let mut positions = Table::new(["x_px", "y_px"]);
    positions.push(Some(0), vec![Cell::from(0.0), Cell::from(0.0)]).unwrap();
    positions.push(Some(1), vec![Cell::from(1e10), Cell::from(1e10)]).unwrap();
    let conv = Conversions::default();
    let args = r.get("assemble").unwrap().parse_args(&[]).unwrap();
    let plan = r.plan_call("assemble", args, MemoryType::Host, Device::Cpu, &conv, ConversionPolicy::default()).unwrap();
    let mut ctx = CallContext::new(StackInfo::default(), [(hcsflow_stitch::POSITIONS.to_string(), positions)].into());
    let e = r.execute_in(&plan, Array::from(tiles), &conv, &mut ctx).unwrap_err();
    assert!(matches!(&e, FunctionError::Failed { function, .. } if function == "assemble"), "{e:?}");
    let source = std::error::Error::source(&e).expect("the error keeps its source");
    assert!(matches!(source.downcast_ref::<StitchError>(), Some(StitchError::CanvasTooLarge { .. })), "{source:?}");
    assert_eq!(e.to_string(), format!("assemble: {source}"));
}
