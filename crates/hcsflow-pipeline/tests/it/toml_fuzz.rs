//! A bounded, deterministic fuzz of the pipeline file: seeded mutations of
//! `examples/*.toml` and `tests/corpus/*.toml` (byte flips, truncation, key
//! swaps, huge / negative / NaN / infinite numbers, deep nesting, swapped
//! functions with extreme arguments), each parsed with [`PipelineSpec::parse`]
//! and compiled against a small synthetic plate. Every mutant must give a plan
//! or an error, never a panic. The mutant count is fixed (no clock), sized so
//! the test takes seconds.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use hcsflow::builtin;
use hcsflow_core::registry::ArgKind;
use hcsflow_core::{ConversionPolicy, Device};
use hcsflow_pipeline::{compile, CompileConfig, PipelineSpec};
use hcsflow_plate::open_plate;
use hcsflow_synth::{generate, SynthConfig};
use hcsflow_testkit::Rng;

/// Mutants per seed file.
const MUTANTS_PER_SEED: usize = 500;

/// Values that stress number handling: extremes, signs, NaN, infinities,
/// strings and tables where numbers are expected.
const WILD_VALUES: &[&str] = &[
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551616",
    "-1",
    "0",
    "1e308",
    "-1e308",
    "1e-320",
    "nan",
    "-nan",
    "inf",
    "-inf",
    "0x7fffffffffffffff",
    "1048576",
    "4",
    "\"\"",
    "\"../../x\"",
    "[]",
    "[0, 0]",
    "[1, 2, 3]",
    "{}",
    "true",
];

fn seeds() -> Vec<(PathBuf, String)> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in [manifest.join("../../examples"), manifest.join("tests/corpus")] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
            .collect();
        found.sort();
        files.extend(found);
    }
    files.into_iter().map(|p| (p.clone(), std::fs::read_to_string(&p).expect("read seed"))).collect()
}

/// Replaces the value after the `=` of one random `key = value` line.
fn replace_value(rng: &mut Rng, text: &str, value: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let candidates: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains('=') && !lines[i].starts_with('#')).collect();
    if candidates.is_empty() {
        return text.to_string();
    }
    let i = *rng.pick(&candidates);
    let line = &lines[i];
    // Inside an inline table, replace one `k = v` pair's value; else the line's value.
    let eqs: Vec<usize> = line.match_indices(" = ").map(|(j, _)| j).collect();
    let at = eqs.get(rng.below(eqs.len())).copied().unwrap_or_else(|| line.find('=').unwrap_or(0));
    let start = at + line[at..].find('=').unwrap_or(0) + 1;
    let rest = &line[start..];
    let end = rest.find([',', '}']).map(|e| start + e).unwrap_or(line.len());
    lines[i] = format!("{} {value}{}", &line[..start], &line[end..]);
    lines.join("\n")
}

fn mutate(rng: &mut Rng, text: &str, functions: &[(String, Vec<String>)]) -> String {
    let bytes = text.as_bytes();
    match rng.below(8) {
        // Byte flips.
        0 => {
            let mut b = bytes.to_vec();
            for _ in 0..1 + rng.below(4) {
                if !b.is_empty() {
                    let i = rng.below(b.len());
                    b[i] ^= 1 << rng.below(8);
                }
            }
            String::from_utf8_lossy(&b).into_owned()
        }
        // Truncation.
        1 => String::from_utf8_lossy(&bytes[..rng.below(bytes.len() + 1)]).into_owned(),
        // Key swap between two lines.
        2 => {
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            let keyed: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].contains(" = ")).collect();
            if keyed.len() >= 2 {
                let (a, b) = (*rng.pick(&keyed), *rng.pick(&keyed));
                let split = |l: &str| l.split_once(" = ").map(|(k, v)| (k.to_string(), v.to_string()));
                if let (Some((ka, va)), Some((kb, vb))) = (split(&lines[a]), split(&lines[b])) {
                    lines[a] = format!("{kb} = {va}");
                    lines[b] = format!("{ka} = {vb}");
                }
            }
            lines.join("\n")
        }
        // A wild value.
        3 => {
            let v = *rng.pick(WILD_VALUES);
            replace_value(rng, text, v)
        }
        // Deep nesting, of arrays or inline tables, around or instead of a value.
        4 => {
            let depth = 1 + rng.below(200);
            let v = if rng.below(2) == 0 {
                format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
            } else {
                format!("{}1{}", "{ a = ".repeat(depth), " }".repeat(depth))
            };
            replace_value(rng, text, &v)
        }
        // Duplicate or drop a line.
        5 => {
            let mut lines: Vec<&str> = text.lines().collect();
            if !lines.is_empty() {
                let i = rng.below(lines.len());
                if rng.below(2) == 0 {
                    lines.insert(i, lines[i]);
                } else {
                    lines.remove(i);
                }
            }
            lines.join("\n")
        }
        // A registered function with one of its arguments set to a wild value:
        // reaches every function's argument validation and shape check.
        _ => {
            let (name, args) = rng.pick(functions);
            let arg = if args.is_empty() { String::new() } else { format!("{} = {}", rng.pick(args), rng.pick(WILD_VALUES)) };
            let call = format!("{{ name = \"{name}\", args = {{ {arg} }} }}");
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            let funcs: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].starts_with("func =")).collect();
            if funcs.is_empty() {
                return format!("{text}\n[[steps]]\nname = \"fz\"\nfunc = {call}\n");
            }
            let i = *rng.pick(&funcs);
            lines[i] = format!("func = {call}");
            lines.join("\n")
        }
    }
}

#[test]
fn mutated_pipeline_files_never_panic_parse_or_compile() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("plate");
    let cfg = SynthConfig {
        size: 32,
        z_planes: 2,
        channels: 2,
        grid_rows: 2,
        grid_cols: 2,
        wells: vec!["A01".into()],
        nuclei_density: 10.0,
        ..SynthConfig::default()
    };
    generate(&cfg, &root).expect("generate");
    let plate = open_plate(&root, None).expect("open plate");
    let (registry, conversions) = builtin();
    let functions: Vec<(String, Vec<String>)> = registry
        .functions()
        .map(|f| {
            let args = f.all_args().iter().filter(|a| !matches!(a.kind, ArgKind::Bool)).map(|a| a.name.to_string()).collect();
            (f.spec.name.to_string(), args)
        })
        .collect();
    let config = CompileConfig {
        device: Device::Cpu,
        device_reason: "test".into(),
        policy: ConversionPolicy::default(),
        out: dir.path().join("out"),
        missing: Default::default(),
        require_gpu: false,
    };
    let seeds = seeds();
    assert!(seeds.len() >= 4, "{} seed files", seeds.len());
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let (mut compiled, mut refused, mut panics) = (0usize, 0usize, Vec::new());
    for (path, text) in &seeds {
        for k in 0..MUTANTS_PER_SEED {
            // Some mutants mutate again, to reach combinations.
            let mut mutant = mutate(&mut rng, text, &functions);
            if k % 3 == 0 {
                mutant = mutate(&mut rng, &mutant, &functions);
            }
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                let spec = PipelineSpec::parse(&mutant, "fuzz.toml")?;
                compile(&plate, &spec, &registry, &conversions, &config).map(|_| ())
            }));
            match outcome {
                Ok(Ok(())) => compiled += 1,
                Ok(Err(_)) => refused += 1,
                Err(_) => panics.push(format!("--- mutant {k} of {}:\n{mutant}", path.display())),
            }
        }
    }
    eprintln!("{} mutants: {compiled} compiled, {refused} refused, {} panicked", compiled + refused + panics.len(), panics.len());
    assert!(panics.is_empty(), "{} mutants panicked:\n{}", panics.len(), panics.join("\n"));
    // The mutations reach both outcomes (the fuzz is not all parse errors).
    assert!(compiled > 0 && refused > 0, "compiled {compiled}, refused {refused}");
}
