//! Connected-component labelling of binary images (nonzero = foreground).
//!
//! Same partition as `scipy.ndimage.label(mask, structure)` and
//! `skimage.measure.label(mask, connectivity)` on a binary mask (4-connectivity =
//! `connectivity=1`, 8 = `connectivity=2`); labels are numbered 1.. in raster order
//! of each component's first pixel, which is also what both references do (tests
//! compare canonically anyway). Note skimage labels *equal-valued* regions of a
//! multi-valued image; here every nonzero value is one class.
//!
//! Two raster passes with union–find (path halving), linear time.

use hcsflow_core::{with_pixels, Contract, FunctionDecl, FunctionError, Pixel, Registry, Stack, StackArray};
use serde::Serialize;

/// Pixel neighbourhood.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Connectivity {
    /// Edge neighbours (skimage `connectivity=1`).
    Four,
    /// Edge and corner neighbours (skimage `connectivity=2`, the default).
    Eight,
}

impl Connectivity {
    pub fn from_int(c: i64) -> Option<Connectivity> {
        match c {
            4 => Some(Connectivity::Four),
            8 => Some(Connectivity::Eight),
            _ => None,
        }
    }
}

/// A label image: 0 = background, 1..=count objects, row-major `height × width`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    pub height: usize,
    pub width: usize,
    pub labels: Vec<u32>,
    pub count: u32,
}

/// The root of `i` in the union–find forest `parent` (halving the path).
pub(crate) fn find(parent: &mut [u32], mut i: u32) -> u32 {
    while parent[i as usize] != i {
        let g = parent[parent[i as usize] as usize];
        parent[i as usize] = g;
        i = g;
    }
    i
}

/// Joins the sets of `a` and `b`; the smaller root becomes the root.
pub(crate) fn union(parent: &mut [u32], a: u32, b: u32) {
    let (ra, rb) = (find(parent, a), find(parent, b));
    if ra != rb {
        // keep the smaller provisional label as root (the earlier one in raster order)
        let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
        parent[hi as usize] = lo;
    }
}

/// Labels the `true` pixels of `mask` (`height × width`, row-major).
pub fn label_mask(mask: &[bool], height: usize, width: usize, connectivity: Connectivity) -> Labels {
    let (h, w) = (height, width);
    let mut prov = vec![0u32; h * w];
    let mut parent: Vec<u32> = vec![0];
    for y in 0..h {
        for x in 0..w {
            let i = y * w + x;
            if !mask[i] {
                continue;
            }
            let mut neigh = [0u32; 4];
            let mut k = 0;
            if x > 0 && prov[i - 1] != 0 {
                neigh[k] = prov[i - 1];
                k += 1;
            }
            if y > 0 {
                let up = i - w;
                if prov[up] != 0 {
                    neigh[k] = prov[up];
                    k += 1;
                }
                if connectivity == Connectivity::Eight {
                    if x > 0 && prov[up - 1] != 0 {
                        neigh[k] = prov[up - 1];
                        k += 1;
                    }
                    if x + 1 < w && prov[up + 1] != 0 {
                        neigh[k] = prov[up + 1];
                        k += 1;
                    }
                }
            }
            if k == 0 {
                let l = parent.len() as u32;
                parent.push(l);
                prov[i] = l;
            } else {
                let l = neigh[..k].iter().copied().min().unwrap_or(neigh[0]);
                prov[i] = l;
                for &n in &neigh[..k] {
                    union(&mut parent, l, n);
                }
            }
        }
    }
    // Final labels in raster order of first appearance of each root.
    let mut final_of = vec![0u32; parent.len()];
    let mut count = 0u32;
    for p in prov.iter_mut() {
        if *p == 0 {
            continue;
        }
        let r = find(&mut parent, *p);
        if final_of[r as usize] == 0 {
            count += 1;
            final_of[r as usize] = count;
        }
        *p = final_of[r as usize];
    }
    Labels { height: h, width: w, labels: prov, count }
}

/// Labels the nonzero pixels of a plane.
pub fn label_plane<T: Pixel>(plane: &[T], height: usize, width: usize, connectivity: Connectivity) -> Labels {
    let zero = T::default();
    let mask: Vec<bool> = plane.iter().map(|&v| v != zero).collect();
    label_mask(&mask, height, width, connectivity)
}

impl Labels {
    /// As a u16 image; errors when there are more than 65,535 objects.
    pub fn to_u16(&self, function: &str) -> Result<Vec<u16>, FunctionError> {
        if self.count > u16::MAX as u32 {
            return Err(FunctionError::invalid(function, format!("{} objects do not fit a u16 label image (at most 65535)", self.count)));
        }
        Ok(self.labels.iter().map(|&l| l as u16).collect())
    }
}

/// Labels every plane (nonzero = foreground) into a u16 label stack (`pure_2d`).
pub fn label_stack(stack: &Stack, connectivity: Connectivity) -> Result<Stack, FunctionError> {
    let [n, h, w] = stack.shape();
    let mut labels = StackArray::<u16>::zeros([n, h, w]);
    with_pixels!(Stack, stack, a, T => {
        for (plane, dst) in a.planes().zip(labels.planes_mut()) {
            dst.copy_from_slice(&label_plane(plane, h, w, connectivity).to_u16("label")?);
        }
    });
    Ok(Stack::from(labels))
}

hcsflow_core::function_args! {
    /// The arguments of [`LABEL`].
    pub struct LabelArgs {
        connectivity: String = choice("8", &["4", "8"], "4: edge neighbours; 8: edge and corner neighbours"),
    }
}

pub static LABEL: FunctionDecl<LabelArgs> = FunctionDecl::new(
    "label",
    Contract::Pure2d,
    "Connected components of the nonzero pixels (scipy.ndimage.label / skimage.measure.label on a mask), u16 labels in raster order.",
)
.with_label_output();

pub(crate) fn register(registry: &mut Registry) {
    registry.add(LABEL.host(|s, a, _| {
        let c = Connectivity::from_int(a.connectivity.parse().unwrap_or(8)).unwrap_or(Connectivity::Eight);
        label_stack(s, c)
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u_shape_merges_and_diagonals_depend_on_connectivity() {
        #[rustfmt::skip]
        let m = [
            1, 0, 1, 0,
            1, 0, 1, 0,
            1, 1, 1, 0,
            0, 0, 0, 1,
        ];
        let mask: Vec<bool> = m.iter().map(|&v| v == 1).collect();
        let l8 = label_mask(&mask, 4, 4, Connectivity::Eight);
        assert_eq!(l8.count, 1);
        let l4 = label_mask(&mask, 4, 4, Connectivity::Four);
        assert_eq!(l4.count, 2);
        assert_eq!(l4.labels[0], 1);
        assert_eq!(l4.labels[15], 2);
    }
}
