//! The registry functions on a synthetic 3x3 grid.

mod common;

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
