//! Call context: per-plane calls see their plane's metadata and artifact rows;
//! what they produce is merged in plane order; declared artifacts are enforced.

use std::collections::BTreeMap;

use hcsflow_core::{
    ArtifactDecl, Artifacts, CallContext, Cell, Contract, ConversionPolicy, Conversions, Device, FunctionSpec, Implementation, MemoryType,
    PlaneInfo, Registry, Stack, StackInfo, Table,
};
use ndarray::Array3;

fn decl(name: &'static str) -> ArtifactDecl {
    ArtifactDecl::table(name, "test")
}

/// `count` (pure 2D): one `counts` row per plane = plane sum plus the consumed
/// `offsets` value of that plane, and the plane's site; a note per plane.
fn registry() -> Registry {
    let mut r = Registry::new();
    r.register_with_artifacts(
        FunctionSpec { name: "count", doc: "test", contract: Contract::Pure2d, args: vec![] },
        Artifacts { produces: vec![decl("counts")], consumes: vec![ArtifactDecl { optional: true, ..decl("offsets") }] },
        Implementation::host(|s, _, ctx| {
            assert_eq!(s.depth(), 1);
            let sum: f64 = s.to_f32().iter().map(|&v| f64::from(v)).sum();
            let offset = ctx.inputs.get("offsets").and_then(|t| t.plane_value(0, "offset")).unwrap_or(0.0);
            let site = ctx.stack.planes.first().map(|p| p.site);
            let mut t = Table::new(["sum", "site"]);
            t.push(Some(0), vec![Cell::from(sum + offset), Cell::from(site)])
                .map_err(|e| hcsflow_core::FunctionError::failed("count", e.to_string()))?;
            ctx.produce("counts", t);
            ctx.note(format!("plane of site {site:?}"));
            Ok(s.clone())
        }),
    );
    r.register_with_artifacts(
        FunctionSpec { name: "forgets", doc: "declares but does not produce", contract: Contract::Pure3d, args: vec![] },
        Artifacts { produces: vec![decl("counts")], consumes: vec![] },
        Implementation::host(|s, _, _| Ok(s.clone())),
    );
    r.register(
        FunctionSpec { name: "sneaky", doc: "produces an undeclared artifact", contract: Contract::Pure3d, args: vec![] },
        Implementation::host(|s, _, ctx| {
            ctx.produce("extra", Table::new(["a"]));
            Ok(s.clone())
        }),
    );
    r
}

fn stack() -> Stack {
    // Plane z holds the value z + 1 everywhere (2 × 2): sums 4, 8, 12.
    Stack::from(Array3::<u16>::from_shape_fn((3, 2, 2), |(z, _, _)| z as u16 + 1))
}

fn plan(r: &Registry, name: &str) -> hcsflow_core::CallPlan {
    let args = r.get(name).unwrap().validate_args(vec![]).unwrap();
    r.plan_call(name, args, MemoryType::Host, Device::Cpu, &Conversions::default(), ConversionPolicy::default()).unwrap()
}

#[test]
fn per_plane_calls_see_their_plane_and_their_rows_and_results_merge_in_order() {
    let r = registry();
    let planes = (1..=3).map(|site| PlaneInfo { site, channel: 1, ..Default::default() }).collect();
    let mut offsets = Table::new(["offset"]);
    // Rows given out of order, for planes 2 and 0 only.
    offsets.push(Some(2), vec![Cell::Float(100.0)]).unwrap();
    offsets.push(Some(0), vec![Cell::Int(10)]).unwrap();
    let mut ctx = CallContext::new(
        StackInfo { well: "B03".into(), planes, pixel_size_um: Some(0.65) },
        BTreeMap::from([("offsets".to_string(), offsets)]),
    );
    let out = r.execute_in(&plan(&r, "count"), stack().into(), &Conversions::default(), &mut ctx).unwrap();
    assert_eq!(out.shape(), &[3, 2, 2]);
    let (outputs, notes) = ctx.take_results();
    assert_eq!(outputs.len(), 1);
    let (name, table) = &outputs[0];
    assert_eq!(name, "counts");
    assert_eq!(table.columns, vec!["sum", "site"]);
    let rows: Vec<(Option<usize>, Vec<Cell>)> = table.rows.iter().map(|r| (r.plane, r.cells.clone())).collect();
    assert_eq!(
        rows,
        vec![
            (Some(0), vec![Cell::Float(14.0), Cell::Int(1)]),
            (Some(1), vec![Cell::Float(8.0), Cell::Int(2)]),
            (Some(2), vec![Cell::Float(112.0), Cell::Int(3)]),
        ]
    );
    assert_eq!(notes, vec!["plane of site Some(1)", "plane of site Some(2)", "plane of site Some(3)"]);
}

#[test]
fn without_context_metadata_is_absent_and_artifacts_are_dropped() {
    let r = registry();
    let out = r.execute(&plan(&r, "count"), stack().into(), &Conversions::default()).unwrap();
    assert_eq!(out.shape(), &[3, 2, 2]);
}

#[test]
fn declared_artifacts_are_enforced() {
    let r = registry();
    let e = r.execute(&plan(&r, "forgets"), stack().into(), &Conversions::default()).unwrap_err().to_string();
    assert!(e.contains("forgets") && e.contains("did not produce its artifact 'counts'"), "{e}");
    let e = r.execute(&plan(&r, "sneaky"), stack().into(), &Conversions::default()).unwrap_err().to_string();
    assert!(e.contains("undeclared artifact 'extra'"), "{e}");
}

#[test]
fn tables_check_row_length_and_write_csv_cells() {
    let mut t = Table::new(["a", "b"]);
    assert!(t.push(None, vec![Cell::Int(1)]).is_err());
    t.push(None, vec![Cell::Text("x,\"y\"".into()), Cell::Empty]).unwrap();
    let cells: Vec<String> = t.rows[0].cells.iter().map(ToString::to_string).collect();
    assert_eq!(cells, vec!["\"x,\"\"y\"\"\"", ""]);
    let mut u = Table::new(["a", "c"]);
    u.push(Some(0), vec![Cell::Int(1), Cell::Int(2)]).unwrap();
    assert!(t.append(u, 0).unwrap_err().contains("columns differ"));
}
