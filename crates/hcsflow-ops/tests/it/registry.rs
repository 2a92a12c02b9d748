//! The registered host functions through the registry, as pipelines call them.
//! Per-plane (pure_2d) functions receive whole stacks and some overwrite their
//! input in place; these tests check that the registry result of a multi-plane
//! stack equals the function applied to each plane on its own, and that the
//! whole-stack functions equal their by-reference Rust API.

use crate::common;

use common::{assert_exact, cells_stack, run_registered};
use hcsflow_core::{DType, Stack};
use hcsflow_ops::equalize::stack_equalize_histogram;
use hcsflow_ops::normalize::{percentile_normalize, PercentileNormalize};

const PER_PLANE: &[(&str, &[&str])] = &[
    ("gaussian_blur", &["sigma=1.5"]),
    ("sharpen", &["radius=2", "amount=0.7"]),
    ("median_filter", &["size=5"]),
    ("sobel", &[]),
    ("clahe", &["kernel_size=8"]),
    ("percentile_normalize", &["low_percentile=2", "high_percentile=97"]),
];

#[test]
fn per_plane_functions_treat_each_plane_alone() {
    for dtype in DType::ALL {
        // Planes with different content, so a whole-stack computation would differ.
        let s = cells_stack(dtype, [3, 40, 37], 7);
        for &(name, args) in PER_PLANE {
            let whole = run_registered(name, args, &s);
            let planes: Vec<Stack> = (0..3).map(|z| run_registered(name, args, &s.plane(z))).collect();
            let expected = Stack::concat(&planes).unwrap();
            assert_eq!(whole.shape(), s.shape(), "{name} {dtype}");
            assert_eq!(whole.dtype(), expected.dtype(), "{name} {dtype}");
            let expected_values = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&expected.shape()), common::values(&expected)).unwrap();
            assert_exact(&whole, &expected_values, &format!("{name} {dtype} on 3 planes vs plane by plane"));
        }
    }
}

#[test]
fn whole_stack_functions_match_their_rust_api() {
    for dtype in DType::ALL {
        let s = cells_stack(dtype, [3, 40, 37], 8);
        let p = PercentileNormalize { low_percentile: 2.0, high_percentile: 97.0, ..Default::default() };
        let checks = [
            (
                "stack_percentile_normalize",
                run_registered("stack_percentile_normalize", &["low_percentile=2", "high_percentile=97"], &s),
                percentile_normalize(&s, &p).unwrap(),
            ),
            ("stack_equalize_histogram", run_registered("stack_equalize_histogram", &[], &s), stack_equalize_histogram(&s, 256).unwrap()),
        ];
        for (name, ours, direct) in checks {
            let direct_values = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&direct.shape()), common::values(&direct)).unwrap();
            assert_eq!(ours.dtype(), direct.dtype(), "{name} {dtype}");
            assert_exact(&ours, &direct_values, &format!("{name} {dtype}"));
        }
    }
}
