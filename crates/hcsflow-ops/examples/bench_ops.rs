//! Times hcsflow-ops functions at the sizes of docs/performance.md and prints
//! the median in ms, with the ratio against a peer run of the same session.
//!
//! ```text
//! python3 /work/shared/bench/bench_skimage.py --only zproj,percentile,equalize,gaussian,unsharp,clahe,composite --json-out /tmp/peer.json
//! cargo run --release -p hcsflow-ops --example bench_ops -- --peer /tmp/peer.json [--only NAME,..] [--repeats N]
//! ```
//! Inputs: the peer's cached arrays (`$PEERBENCH_DATA` or `<tmp>/peerbench-data`,
//! `cells_2048x2048_s0.npy`, `zstack_30x2048x2048_s0.npy`) when present, so
//! both sides process the same pixels; otherwise a synthetic stand-in.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use hcsflow_core::{ConversionPolicy, Conversions, Device, MemoryType, Registry, Stack};
use ndarray::Array3;

/// The CLI's allocator (see hcsflow-cli's main.rs): glibc unmaps large freed
/// buffers, and the page faults of their next use would be timed here but not there.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Case {
    name: &'static str,
    /// The peer op in bench_skimage.py measuring the same thing.
    peer: &'static str,
    function: &'static str,
    args: &'static [&'static str],
    input: Input,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Input {
    Image,
    ZStack,
    /// The image and two shifted copies (rolled 7 rows, 11 columns), as the peer's composite.
    ThreeChannels,
    /// The watershed's planes made from the image as bench/peers/bench_objects.py makes
    /// them (−EDT of the nuclei mask, seeds at the smoothed EDT's maxima, the mask), with
    /// our functions: close to the peer's input, not identical (maxima in a square).
    WatershedPlanes,
}

const CASES: &[Case] = &[
    Case { name: "max_projection 30x2048²", peer: "zproj_max_numpy_30x2048", function: "max_projection", args: &[], input: Input::ZStack },
    Case { name: "min_projection 30x2048²", peer: "zproj_max_numpy_30x2048", function: "min_projection", args: &[], input: Input::ZStack },
    Case {
        name: "mean_projection 30x2048²",
        peer: "zproj_mean_numpy_30x2048",
        function: "mean_projection",
        args: &[],
        input: Input::ZStack,
    },
    Case {
        name: "sum_projection 30x2048²", peer: "zproj_mean_numpy_30x2048", function: "sum_projection", args: &[], input: Input::ZStack
    },
    Case { name: "std_projection 30x2048²", peer: "zproj_std_numpy_30x2048", function: "std_projection", args: &[], input: Input::ZStack },
    Case {
        name: "percentile_normalize 2048²",
        peer: "percentile_norm_1_99_2048",
        function: "percentile_normalize",
        args: &[],
        input: Input::Image,
    },
    Case {
        name: "stack_percentile_normalize 30x2048²",
        peer: "stack_percentile_norm_1_99_30x2048",
        function: "stack_percentile_normalize",
        args: &[],
        input: Input::ZStack,
    },
    Case {
        name: "stack_equalize_histogram 2048²",
        peer: "skimage_equalize_hist_65536_2048",
        function: "stack_equalize_histogram",
        args: &[],
        input: Input::Image,
    },
    Case {
        name: "stack_equalize_histogram 30x2048²",
        peer: "numpy_bincount_equalize_65536_30x2048",
        function: "stack_equalize_histogram",
        args: &[],
        input: Input::ZStack,
    },
    Case { name: "clahe 2048²", peer: "skimage_clahe_default_2048", function: "clahe", args: &[], input: Input::Image },
    Case {
        name: "gaussian_blur σ2 2048² (vs skimage)",
        peer: "skimage_gaussian_s2_2048",
        function: "gaussian_blur",
        args: &["sigma=2"],
        input: Input::Image,
    },
    Case {
        name: "gaussian_blur σ2 2048² (vs scipy f32)",
        peer: "scipy_gaussian_s2_f32_2048",
        function: "gaussian_blur",
        args: &["sigma=2"],
        input: Input::Image,
    },
    Case { name: "sharpen r1 a1 2048²", peer: "skimage_unsharp_r1_a1_2048", function: "sharpen", args: &[], input: Input::Image },
    Case { name: "median_filter 3x3 2048²", peer: "-", function: "median_filter", args: &["size=3"], input: Input::Image },
    Case { name: "median_filter 5x5 2048²", peer: "-", function: "median_filter", args: &["size=5"], input: Input::Image },
    Case { name: "sobel 2048²", peer: "-", function: "sobel", args: &[], input: Input::Image },
    Case { name: "bin 2x2 mean 2048²", peer: "-", function: "bin", args: &["factor=2"], input: Input::Image },
    Case {
        name: "crop 1024² of 2048²",
        peer: "-",
        function: "crop",
        args: &["y=512", "x=512", "height=1024", "width=1024"],
        input: Input::Image,
    },
    Case {
        name: "composite 3 channels 2048²",
        peer: "composite_3ch_weighted_2048",
        function: "composite",
        args: &["weights=0.5,0.3,0.2"],
        input: Input::ThreeChannels,
    },
    Case {
        name: "watershed 2048²",
        peer: "skimage_watershed_2048",
        function: "watershed",
        args: &["connectivity=8"],
        input: Input::WatershedPlanes,
    },
    Case {
        name: "segment_nuclei 2048²",
        peer: "skimage_nuclei_segmentation_2048",
        function: "segment_nuclei",
        args: &[],
        input: Input::Image,
    },
];

fn data_dir() -> PathBuf {
    std::env::var_os("PEERBENCH_DATA").map(PathBuf::from).unwrap_or_else(|| std::env::temp_dir().join("peerbench-data"))
}

/// Reads a C-order little-endian uint16 .npy file (the peer's cache).
fn read_npy_u16(path: &Path) -> Option<Array3<u16>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.get(..6)? != b"\x93NUMPY" {
        return None;
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (u32::from_le_bytes(bytes[8..12].try_into().ok()?) as usize, 12),
    };
    let header = std::str::from_utf8(bytes.get(start..start + hlen)?).ok()?;
    if !header.contains("'<u2'") || header.contains("'fortran_order': True") {
        return None;
    }
    let shape_text = header.split("'shape': (").nth(1)?.split(')').next()?;
    let dims: Vec<usize> = shape_text.split(',').filter_map(|t| t.trim().parse().ok()).collect();
    let shape = match dims[..] {
        [h, w] => (1, h, w),
        [z, h, w] => (z, h, w),
        _ => return None,
    };
    let data: Vec<u16> = bytes.get(start + hlen..)?.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    Array3::from_shape_vec(shape, data).ok()
}

/// Stand-in when the peer's cache is absent: smooth blobs plus noise.
fn synthetic(shape: (usize, usize, usize)) -> Array3<u16> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    Array3::from_shape_fn(shape, |(z, y, x)| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let blob = ((y as f32 * 0.05 + z as f32 * 0.1).sin() * (x as f32 * 0.043).cos()).max(0.0);
        (300.0 + 6000.0 * blob * blob + (s % 64) as f32) as u16
    })
}

fn load(input: Input) -> (Stack, &'static str) {
    if input == Input::ThreeChannels {
        let (img, source) = load(Input::Image);
        let Stack::U16(a) = img else { unreachable!("u16 image") };
        let plane = a.view().index_axis_move(ndarray::Axis(0), 0);
        let (h, w) = plane.dim();
        let c = Array3::from_shape_fn((3, h, w), |(z, y, x)| match z {
            0 => plane[[y, x]],
            1 => plane[[(y + h - 7 % h) % h, x]],
            _ => plane[[y, (x + w - 11 % w) % w]],
        });
        return (Stack::from(c), source);
    }
    if input == Input::WatershedPlanes {
        let (img, source) = load(Input::Image);
        return (watershed_planes(&img), source);
    }
    let (file, shape) = match input {
        Input::Image => ("cells_2048x2048_s0.npy", (1, 2048, 2048)),
        Input::ZStack => ("zstack_30x2048x2048_s0.npy", (30, 2048, 2048)),
        Input::ThreeChannels | Input::WatershedPlanes => unreachable!("handled above"),
    };
    match read_npy_u16(&data_dir().join(file)) {
        Some(a) => (Stack::from(a), "peer cache"),
        None => (Stack::from(synthetic(shape)), "synthetic"),
    }
}

/// [`Input::WatershedPlanes`] of a one-plane stack: [−EDT, seeds, mask] as f32.
fn watershed_planes(img: &Stack) -> Stack {
    use hcsflow_ops::convolve::{correlate_separable, Boundary, Kernel1d};
    use hcsflow_ops::segment::{distance_transform_edt, fill_holes, maxima_markers};
    use hcsflow_ops::threshold::{threshold_value, ThresholdMethod};
    let Stack::U16(a) = img else { unreachable!("u16 image") };
    let [_, h, w] = img.shape();
    let smooth = |v: &[f32], sigma: f64| {
        let k = Kernel1d::gaussian(sigma, 4.0);
        correlate_separable(v, h, w, &k, &k, Boundary::Reflect)
    };
    let plane: Vec<f32> = a.plane(0).iter().map(|&v| f32::from(v)).collect();
    let smoothed = smooth(&plane, 1.5);
    let t = threshold_value(&smoothed, ThresholdMethod::Otsu).expect("otsu");
    let mask = fill_holes(&smoothed.iter().map(|&v| f64::from(v) > t).collect::<Vec<_>>(), h, w);
    let dist = distance_transform_edt(&mask, h, w, (1.0, 1.0));
    let peaks: Vec<f32> = smooth(&dist, 1.0).iter().zip(&mask).map(|(&d, &m)| if m { d } else { 0.0 }).collect();
    let seeds = maxima_markers(&peaks, h, w, 4);
    let planes: [Vec<f32>; 3] = [
        dist.iter().map(|&d| -d).collect(),
        seeds.labels.iter().map(|&l| l as f32).collect(),
        mask.iter().map(|&m| f32::from(u8::from(m))).collect(),
    ];
    Stack::from(Array3::from_shape_vec((3, h, w), planes.concat()).expect("3 planes"))
}

fn peer_medians(path: &Path) -> HashMap<String, f64> {
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("cannot read {}", path.display());
        return HashMap::new();
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { return HashMap::new() };
    v["results"]
        .as_array()
        .map(|rs| rs.iter().filter_map(|r| Some((r["op"].as_str()?.to_string(), r["median_s"].as_f64()? * 1e3))).collect())
        .unwrap_or_default()
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let opt = |name: &str| argv.iter().position(|a| a == name).and_then(|i| argv.get(i + 1)).cloned();
    let peer = opt("--peer").map(|p| peer_medians(Path::new(&p))).unwrap_or_default();
    let only: Vec<String> = opt("--only").map(|s| s.split(',').map(str::to_string).collect()).unwrap_or_default();
    let repeats: usize = opt("--repeats").and_then(|s| s.parse().ok()).unwrap_or(7);

    let mut registry = Registry::new();
    hcsflow_ops::register(&mut registry);
    let conversions = Conversions::default();
    let mut inputs: HashMap<Input, (Stack, &str)> = HashMap::new();

    println!("threads: {}", rayon::current_num_threads());
    println!("| function | input | median ms | peer | peer ms | speed-up |");
    println!("|---|---|---|---|---|---|");
    for case in CASES {
        if !only.is_empty() && !only.iter().any(|o| case.name.contains(o.as_str())) {
            continue;
        }
        let (stack, source) = inputs.entry(case.input).or_insert_with(|| load(case.input)).clone();
        let f = registry.get(case.function).expect("registered");
        let texts: Vec<String> = case.args.iter().map(|s| s.to_string()).collect();
        let args = f.parse_args(&texts).expect("valid bench arguments");
        let plan = registry
            .plan_call(case.function, args, MemoryType::Host, Device::Cpu, &conversions, ConversionPolicy::default())
            .expect("plan");
        let mut times = Vec::with_capacity(repeats);
        for i in 0..=repeats {
            let input = stack.clone();
            let t = Instant::now();
            let out = registry.run_to_host(&plan, input, &conversions, ConversionPolicy::default(), &mut Default::default()).expect("run");
            let ms = t.elapsed().as_secs_f64() * 1e3;
            drop(out);
            if i > 0 {
                times.push(ms); // the first run warms caches and page tables
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let (peer_ms, ratio) = match peer.get(case.peer) {
            Some(&p) => (format!("{p:.1}"), format!("{:.1}x", p / median)),
            None => ("-".into(), "-".into()),
        };
        println!("| {} | {source} | {median:.1} | {} | {peer_ms} | {ratio} |", case.name, case.peer);
    }
}
