//! Host arrays: the 3D [`Stack`] every function sees, and the n-dimensional
//! [`HostArray`] used where the dimensionality is not yet validated.

use std::ops::{Index, IndexMut};
use std::sync::Arc;

use ndarray::{Array3, ArrayD, ArrayView3, ArrayViewMut3, Axis, IxDyn, ShapeError};

use crate::dtype::{DType, DTypeConversion, DTypePolicy};

/// A pixel type a stack can hold. Implemented for `u8`, `u16` and `f32`.
pub trait Pixel: Copy + Default + PartialOrd + Send + Sync + bytemuck::Pod + std::fmt::Debug + 'static {
    const DTYPE: DType;
    /// Exact for every u8/u16 value.
    fn to_f32(self) -> f32;
    /// Round to nearest (ties to even) and saturate; NaN becomes 0. Identity for f32.
    fn from_f32_clip(v: f32) -> Self;
    /// The largest representable value (`f32::MAX` for floats).
    fn max_value() -> Self;
    /// The smallest representable value (`f32::MIN` for floats).
    fn min_value() -> Self;
    /// Wraps a typed 3D array in the [`Stack`] variant of this pixel type
    /// (in standard layout: see [`StackArray`]).
    fn wrap_stack(a: Array3<Self>) -> Stack {
        Self::wrap_stack_array(StackArray::from(a))
    }
    /// Wraps a [`StackArray`] in the [`Stack`] variant of this pixel type.
    fn wrap_stack_array(a: StackArray<Self>) -> Stack;
    /// The typed array of a stack of this pixel type (`None` for another dtype).
    fn unwrap_stack(s: Stack) -> Option<Array3<Self>>;
    /// [`Pixel::unwrap_stack`], borrowed.
    fn stack_array(s: &Stack) -> Option<&StackArray<Self>>;
    /// Wraps a typed n-d array in the [`HostArray`] variant of this pixel type.
    fn wrap_host(a: ArrayD<Self>) -> HostArray;
}

macro_rules! int_pixel {
    ($t:ty, $v:ident) => {
        impl Pixel for $t {
            const DTYPE: DType = DType::$v;
            fn wrap_stack_array(a: StackArray<Self>) -> Stack {
                Stack::$v(a)
            }
            fn unwrap_stack(s: Stack) -> Option<Array3<Self>> {
                if let Stack::$v(a) = s {
                    Some(a.into_array())
                } else {
                    None
                }
            }
            fn stack_array(s: &Stack) -> Option<&StackArray<Self>> {
                if let Stack::$v(a) = s {
                    Some(a)
                } else {
                    None
                }
            }
            fn wrap_host(a: ArrayD<Self>) -> HostArray {
                HostArray::$v(a)
            }
            #[inline]
            fn to_f32(self) -> f32 {
                self as f32
            }
            #[inline]
            fn from_f32_clip(v: f32) -> Self {
                // `v.round_ties_even() as $t`: round to nearest (ties to even), then
                // saturate, NaN → 0. Spelled out because that form is a library call
                // per pixel without SSE4.1 (the default x86-64 target), about 2 ns:
                // clamp first (NaN fails both tests), then adding 2²³ rounds to an
                // integer, ties to even, which sits in the low mantissa bits. This
                // vectorises.
                const TWO_23: f32 = 8_388_608.0;
                let max = <$t>::MAX as f32;
                let c = if v > max {
                    max
                } else if v >= 0.0 {
                    v
                } else {
                    0.0
                };
                ((c + TWO_23).to_bits() - TWO_23.to_bits()) as $t
            }
            fn max_value() -> Self {
                <$t>::MAX
            }
            fn min_value() -> Self {
                <$t>::MIN
            }
        }
    };
}
int_pixel!(u8, U8);
int_pixel!(u16, U16);

impl Pixel for f32 {
    const DTYPE: DType = DType::F32;
    fn wrap_stack_array(a: StackArray<Self>) -> Stack {
        Stack::F32(a)
    }
    fn unwrap_stack(s: Stack) -> Option<Array3<Self>> {
        if let Stack::F32(a) = s {
            Some(a.into_array())
        } else {
            None
        }
    }
    fn stack_array(s: &Stack) -> Option<&StackArray<Self>> {
        if let Stack::F32(a) = s {
            Some(a)
        } else {
            None
        }
    }
    fn wrap_host(a: ArrayD<Self>) -> HostArray {
        HostArray::F32(a)
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline]
    fn from_f32_clip(v: f32) -> Self {
        v
    }
    fn max_value() -> Self {
        f32::MAX
    }
    fn min_value() -> Self {
        f32::MIN
    }
}

/// Runs `$body` with `$a` bound to the typed array inside a dtype enum, `$T`
/// naming its pixel type. One place for the three-way dtype dispatch.
#[macro_export]
macro_rules! with_pixels {
    ($enum:ident, $value:expr, $a:ident, $T:ident => $body:expr) => {
        match $value {
            $enum::U8($a) => {
                #[allow(dead_code)]
                type $T = u8;
                $body
            }
            $enum::U16($a) => {
                #[allow(dead_code)]
                type $T = u16;
                $body
            }
            $enum::F32($a) => {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }
        }
    };
}

/// A 3D image stack `[Z, Y, X]` in host memory.
///
/// "Z" is whatever the step's variable components made the stack axis:
/// z-planes, channels, sites or timepoints. The pixels are always in standard
/// (C) layout, so they can be handed to files and GPU buffers without copies
/// and each plane is one slice ([`StackArray::plane`]): the variants hold a
/// [`StackArray`], which cannot be built in another layout. Build a stack
/// with [`Stack::from`] (any layout; copied into standard layout if needed)
/// or [`Stack::from_vec`].
#[derive(Debug, Clone, PartialEq)]
pub enum Stack {
    U8(StackArray<u8>),
    U16(StackArray<u16>),
    F32(StackArray<f32>),
}

impl<T: Pixel> From<Array3<T>> for Stack {
    fn from(a: Array3<T>) -> Self {
        T::wrap_stack(a)
    }
}

impl<T: Pixel> From<StackArray<T>> for Stack {
    fn from(a: StackArray<T>) -> Self {
        T::wrap_stack_array(a)
    }
}

/// Pixels another library owns (a numpy array given to the engine), shared
/// without a copy: the implementor keeps them alive and unchanged for as
/// long as it lives.
///
/// A stack never writes them: a write to a stack holding shared pixels
/// first copies them into a buffer of its own ([`StackArray::pixels_mut`]).
pub trait SharedPixels<T>: Send + Sync {
    /// The pixels, in standard order.
    fn pixels(&self) -> &[T];
}

/// Where a [`StackArray`]'s pixels are.
#[derive(Clone)]
enum Pixels<T> {
    /// A buffer of the engine's.
    Owned(Vec<T>),
    /// Another library's buffer, shared ([`SharedPixels`]).
    Shared(Arc<dyn SharedPixels<T>>),
}

/// The pixels of a [`Stack`]: a `[Z, Y, X]` array in standard (C) layout,
/// in a buffer of the engine's or another library's, shared without a copy
/// ([`StackArray::shared`]).
///
/// Reads go through [`StackArray::view`] (an ndarray view), [`StackArray::pixels`]
/// and [`StackArray::plane`]; writes through [`StackArray::view_mut`],
/// [`StackArray::pixels_mut`] or indexing, none of which can change the
/// layout, and which first copy shared pixels into a buffer of the stack's
/// own. [`StackArray::from`] copies an array in another layout into
/// standard layout (an array already in it is kept as it is).
#[derive(Clone)]
pub struct StackArray<T> {
    pixels: Pixels<T>,
    dim: (usize, usize, usize),
}

impl<T: Pixel> std::fmt::Debug for StackArray<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_shared() { "shared" } else { "owned" };
        write!(f, "StackArray<{}>({kind}) ", T::DTYPE)?;
        std::fmt::Debug::fmt(&self.view(), f)
    }
}

impl<T: PartialEq> PartialEq for StackArray<T> {
    fn eq(&self, other: &Self) -> bool {
        self.dim == other.dim && self.slice() == other.slice()
    }
}

impl<T: Pixel> From<Array3<T>> for StackArray<T> {
    fn from(a: Array3<T>) -> Self {
        let dim = a.dim();
        StackArray { pixels: Pixels::Owned(into_pixels(a)), dim }
    }
}

impl<T> Index<[usize; 3]> for StackArray<T> {
    type Output = T;
    fn index(&self, [z, y, x]: [usize; 3]) -> &T {
        &self.slice()[self.offset(z, y, x)]
    }
}

impl<T: Clone> IndexMut<[usize; 3]> for StackArray<T> {
    fn index_mut(&mut self, [z, y, x]: [usize; 3]) -> &mut T {
        let i = self.offset(z, y, x);
        &mut self.owned_mut()[i]
    }
}

impl<T: PartialEq> PartialEq<Array3<T>> for StackArray<T> {
    fn eq(&self, other: &Array3<T>) -> bool {
        self.dim == other.dim() && other.iter().eq(self.slice().iter())
    }
}

impl<T> StackArray<T> {
    /// Every pixel in standard order, wherever they are.
    fn slice(&self) -> &[T] {
        match &self.pixels {
            Pixels::Owned(v) => v,
            Pixels::Shared(s) => s.pixels(),
        }
    }

    /// The index of `[z, y, x]` in standard order; panics out of range, as indexing does.
    fn offset(&self, z: usize, y: usize, x: usize) -> usize {
        let (d, h, w) = self.dim;
        assert!(z < d && y < h && x < w, "index [{z}, {y}, {x}] out of a [{d}, {h}, {w}] stack");
        (z * h + y) * w + x
    }

    /// `(Z, Y, X)`.
    pub fn dim(&self) -> (usize, usize, usize) {
        self.dim
    }

    /// True if the pixels are another library's, shared without a copy.
    pub fn is_shared(&self) -> bool {
        matches!(self.pixels, Pixels::Shared(_))
    }
}

impl<T: Clone> StackArray<T> {
    /// The stack's own buffer: shared pixels are copied into one first.
    fn owned_mut(&mut self) -> &mut Vec<T> {
        if let Pixels::Shared(s) = &self.pixels {
            self.pixels = Pixels::Owned(s.pixels().to_vec());
        }
        match &mut self.pixels {
            Pixels::Owned(v) => v,
            Pixels::Shared(_) => unreachable!("made owned above"),
        }
    }
}

impl<T: Pixel> StackArray<T> {
    /// `[Z, Y, X]` pixels from a flat vector in standard order; an error if
    /// `pixels` does not hold exactly `Z·Y·X` values.
    pub fn from_vec(shape: [usize; 3], pixels: Vec<T>) -> Result<Self, ShapeError> {
        check_len(shape, pixels.len())?;
        Ok(StackArray { pixels: Pixels::Owned(pixels), dim: (shape[0], shape[1], shape[2]) })
    }

    /// `[Z, Y, X]` pixels another library owns, shared without a copy; an
    /// error if they are not exactly `Z·Y·X` values.
    pub fn shared(shape: [usize; 3], pixels: Arc<dyn SharedPixels<T>>) -> Result<Self, ShapeError> {
        check_len(shape, pixels.pixels().len())?;
        Ok(StackArray { pixels: Pixels::Shared(pixels), dim: (shape[0], shape[1], shape[2]) })
    }

    /// `[Z, Y, X]` zeros (`T::default()`).
    pub fn zeros(shape: [usize; 3]) -> Self {
        StackArray { pixels: Pixels::Owned(vec![T::default(); shape.iter().product()]), dim: (shape[0], shape[1], shape[2]) }
    }

    /// `[Z, Y, X]` pixels computed plane by plane, planes in parallel:
    /// `plane(z)` yields the `Y·X` values of plane `z` in standard order.
    /// Values past `Y·X` are ignored; a plane that yields fewer is completed
    /// with `T::default()`.
    ///
    /// Unlike [`zeros`](Self::zeros) followed by a fill, the buffer is never
    /// written twice: for a pointwise function over hundreds of MiB, zeroing
    /// the output first costs a third of the call.
    ///
    /// ```
    /// use hcsflow_core::StackArray;
    /// let s = StackArray::<u16>::from_planes([2, 1, 3], |z| (0..3).map(move |x| (10 * z + x) as u16));
    /// assert_eq!(s.pixels(), &[0, 1, 2, 10, 11, 12]);
    /// ```
    pub fn from_planes<I>(shape: [usize; 3], plane: impl Fn(usize) -> I + Sync) -> Self
    where
        I: Iterator<Item = T>,
    {
        use rayon::prelude::*;
        let plane_len = shape[1] * shape[2];
        let len = shape[0] * plane_len;
        if len == 0 {
            return Self::zeros(shape);
        }
        let mut pixels: Vec<T> = Vec::with_capacity(len);
        pixels.spare_capacity_mut()[..len].par_chunks_mut(plane_len).enumerate().for_each(|(z, dst)| {
            let mut filled = 0;
            for (slot, value) in dst.iter_mut().zip(plane(z)) {
                slot.write(value);
                filled += 1;
            }
            for slot in &mut dst[filled..] {
                slot.write(T::default());
            }
        });
        // SAFETY: the closure above wrote every one of the first `len` slots
        // (each chunk is written in full: the yielded values, then defaults).
        unsafe { pixels.set_len(len) };
        StackArray { pixels: Pixels::Owned(pixels), dim: (shape[0], shape[1], shape[2]) }
    }

    /// The pixels as an ndarray view.
    pub fn view(&self) -> ArrayView3<'_, T> {
        ArrayView3::from_shape(self.dim, self.slice()).unwrap_or_else(|_| unreachable!("the pixels hold Z·Y·X values"))
    }

    /// The typed array, giving up the stack (shared pixels are copied).
    pub fn into_array(self) -> Array3<T> {
        let dim = self.dim;
        Array3::from_shape_vec(dim, self.into_pixels()).unwrap_or_else(|_| unreachable!("the pixels hold Z·Y·X values"))
    }

    /// The pixels in standard order, giving up the stack (shared pixels are copied).
    pub fn into_pixels(self) -> Vec<T> {
        match self.pixels {
            Pixels::Owned(v) => v,
            Pixels::Shared(s) => s.pixels().to_vec(),
        }
    }

    /// Every pixel in standard order (plane after plane, row after row).
    pub fn pixels(&self) -> &[T] {
        self.slice()
    }

    /// [`StackArray::pixels`], writable (shared pixels are copied first).
    pub fn pixels_mut(&mut self) -> &mut [T] {
        self.owned_mut()
    }

    /// Plane `z` (`Y·X` pixels, row after row). Panics if `z >= Z`, as
    /// indexing does: callers iterate over `0..Z`.
    pub fn plane(&self, z: usize) -> &[T] {
        let (depth, h, w) = self.dim;
        assert!(z < depth, "plane {z} of a stack of {depth} planes");
        &self.pixels()[z * h * w..(z + 1) * h * w]
    }

    /// [`StackArray::plane`], writable.
    pub fn plane_mut(&mut self, z: usize) -> &mut [T] {
        let (depth, h, w) = self.dim;
        assert!(z < depth, "plane {z} of a stack of {depth} planes");
        &mut self.pixels_mut()[z * h * w..(z + 1) * h * w]
    }

    /// The planes in order, each as in [`StackArray::plane`].
    pub fn planes(&self) -> impl ExactSizeIterator<Item = &[T]> + '_ {
        (0..self.dim.0).map(|z| self.plane(z))
    }

    /// [`StackArray::planes`], writable.
    pub fn planes_mut(&mut self) -> impl ExactSizeIterator<Item = &mut [T]> + '_ {
        let (depth, h, w) = self.dim;
        let mut rest = self.pixels_mut();
        (0..depth).map(move |_| {
            let (plane, after) = std::mem::take(&mut rest).split_at_mut(h * w);
            rest = after;
            plane
        })
    }

    /// A writable view (the layout stays standard; shared pixels are copied first).
    pub fn view_mut(&mut self) -> ArrayViewMut3<'_, T> {
        let dim = self.dim;
        ArrayViewMut3::from_shape(dim, self.owned_mut()).unwrap_or_else(|_| unreachable!("the pixels hold Z·Y·X values"))
    }
}

/// `len` is the number of pixels of `shape`, or the error ndarray gives.
fn check_len(shape: [usize; 3], len: usize) -> Result<(), ShapeError> {
    if shape.iter().product::<usize>() == len {
        Ok(())
    } else {
        Err(ShapeError::from_kind(ndarray::ErrorKind::IncompatibleShape))
    }
}

impl Stack {
    /// A stack of zeros.
    pub fn zeros(dtype: DType, shape: [usize; 3]) -> Stack {
        match dtype {
            DType::U8 => Stack::from(Array3::<u8>::zeros(shape)),
            DType::U16 => Stack::from(Array3::<u16>::zeros(shape)),
            DType::F32 => Stack::from(Array3::<f32>::zeros(shape)),
        }
    }

    /// A stack from a flat vector of pixels in standard order (plane after
    /// plane, row after row); an error if `pixels` does not hold exactly
    /// `Z·Y·X` values.
    pub fn from_vec<T: Pixel>(shape: [usize; 3], pixels: Vec<T>) -> Result<Stack, ShapeError> {
        StackArray::from_vec(shape, pixels).map(|a| T::wrap_stack(a.into_array()))
    }

    /// `[Z, Y, X]`.
    pub fn shape(&self) -> [usize; 3] {
        with_pixels!(Stack, self, a, T => { let s = a.dim(); [s.0, s.1, s.2] })
    }

    pub fn dtype(&self) -> DType {
        match self {
            Stack::U8(_) => DType::U8,
            Stack::U16(_) => DType::U16,
            Stack::F32(_) => DType::F32,
        }
    }

    /// Number of planes (the stack axis).
    pub fn depth(&self) -> usize {
        self.shape()[0]
    }

    /// Size of the pixel data in bytes.
    pub fn nbytes(&self) -> usize {
        let [z, y, x] = self.shape();
        z * y * x * self.dtype().size_bytes()
    }

    /// The raw pixel bytes in native endianness, standard layout.
    pub fn as_bytes(&self) -> &[u8] {
        with_pixels!(Stack, self, a, T => bytemuck::cast_slice(a.pixels()))
    }

    /// Plane `z` as a one-plane stack (a copy). Panics if `z` is out of range:
    /// callers iterate over `0..depth()`.
    pub fn plane(&self, z: usize) -> Stack {
        with_pixels!(Stack, self, a, T => {
            Stack::from(a.view().index_axis(Axis(0), z).insert_axis(Axis(0)).to_owned())
        })
    }

    /// Planes `range` as a stack (a copy). Panics if the range is out of
    /// bounds: callers cut `0..depth()`.
    pub fn planes_range(&self, range: std::ops::Range<usize>) -> Stack {
        with_pixels!(Stack, self, a, T => Stack::from(a.view().slice_axis(Axis(0), ndarray::Slice::from(range)).to_owned()))
    }

    /// All pixels as f32, same shape.
    pub fn to_f32(&self) -> Array3<f32> {
        with_pixels!(Stack, self, a, T => a.view().mapv(Pixel::to_f32))
    }

    /// The stack as an n-dimensional host array (no copy of pixels).
    pub fn into_host_array(self) -> HostArray {
        with_pixels!(Stack, self, a, T => HostArray::from(a.into_array().into_dyn()))
    }

    /// Converts to `target` dtype according to `conversion`.
    ///
    /// Integer → wider or float types are exact. Float → integer follows
    /// [`DTypeConversion`]. Same dtype is returned unchanged (no stretch).
    pub fn cast(self, target: DType, conversion: DTypeConversion) -> Stack {
        if self.dtype() == target {
            return self;
        }
        if let (DTypeConversion::Stretch, Some((lo, hi))) = (conversion, target.integer_range()) {
            let f = self.to_f32();
            let (mn, mx) = f.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
            let scale = if mx > mn { (hi - lo) / (mx - mn) } else { 0.0 };
            let g = f.mapv(|v| lo + (v - mn) * scale);
            return Stack::from_f32_array(g, target);
        }
        match self {
            // No f32 copy of an f32 stack first.
            Stack::F32(a) => Stack::from_f32_array(a.into_array(), target),
            other => Stack::from_f32_array(other.to_f32(), target),
        }
    }

    /// Applies a [`DTypePolicy`] to a function result whose input had dtype `input`.
    pub fn apply_policy(self, input: DType, policy: DTypePolicy) -> Stack {
        self.cast(policy.output.resolve(input), policy.conversion)
    }

    /// Builds a stack of `dtype` from f32 values (clip and round for integers).
    pub fn from_f32_array(a: Array3<f32>, dtype: DType) -> Stack {
        match dtype {
            DType::U8 => Stack::from(a.mapv(u8::from_f32_clip)),
            DType::U16 => Stack::from(a.mapv(u16::from_f32_clip)),
            DType::F32 => Stack::from(a),
        }
    }

    /// Concatenates stacks along Z. All must share Y, X and dtype; at least one.
    pub fn concat(parts: &[Stack]) -> Option<Stack> {
        let first = parts.first()?;
        let [_, y, x] = first.shape();
        if parts.iter().any(|p| p.dtype() != first.dtype() || p.shape()[1..] != [y, x]) {
            return None;
        }
        with_pixels!(Stack, first, _a, T => concat_typed::<T>(parts))
    }
}

impl Stack {
    /// [`Stack::concat`] of stacks the caller gives up: the first part's
    /// buffer grows to hold the rest (the allocator may extend it in place),
    /// the other parts' pixels are appended and each part is freed once
    /// appended, so there is never a second copy of all the parts. `None` if
    /// the parts differ in Y, X or dtype, or there are none.
    pub fn concat_owned(parts: Vec<Stack>) -> Option<Stack> {
        let first = parts.first()?;
        let [_, y, x] = first.shape();
        let dtype = first.dtype();
        if parts.iter().any(|p| p.dtype() != dtype || p.shape()[1..] != [y, x]) {
            return None;
        }
        let depth = parts.iter().map(Stack::depth).sum();
        match dtype {
            DType::U8 => concat_owned_typed::<u8>(parts, [depth, y, x]),
            DType::U16 => concat_owned_typed::<u16>(parts, [depth, y, x]),
            DType::F32 => concat_owned_typed::<f32>(parts, [depth, y, x]),
        }
    }

    /// The planes as one-plane stacks, in order, giving up the stack: the
    /// first plane keeps the stack's buffer (shrunk to one plane), the others
    /// are copies. A one-plane stack is returned as it is.
    pub fn into_planes(self) -> Vec<Stack> {
        with_pixels!(Stack, self, a, T => split_owned(a.into_array()))
    }
}

fn concat_owned_typed<T: Pixel>(parts: Vec<Stack>, shape: [usize; 3]) -> Option<Stack> {
    let mut parts = parts.into_iter().map(T::unwrap_stack);
    let mut pixels = into_pixels(parts.next()??);
    pixels.reserve_exact(shape.iter().product::<usize>().saturating_sub(pixels.len()));
    for p in parts {
        pixels.extend_from_slice(StackArray::from(p?).pixels());
    }
    Stack::from_vec(shape, pixels).ok()
}

fn split_owned<T: Pixel>(a: Array3<T>) -> Vec<Stack> {
    let (depth, y, x) = a.dim();
    if depth <= 1 {
        return vec![Stack::from(a)];
    }
    let rest: Vec<Stack> = (1..depth).map(|z| Stack::from(a.view().index_axis(Axis(0), z).insert_axis(Axis(0)).to_owned())).collect();
    let mut pixels = into_pixels(a);
    pixels.truncate(y * x);
    pixels.shrink_to_fit();
    let mut planes = Vec::with_capacity(depth);
    // A stack of depth ≥ 2 holds at least one plane of pixels.
    planes.extend(Stack::from_vec([1, y, x], pixels).ok());
    planes.extend(rest);
    planes
}

/// The pixels of an array in standard order, in its own buffer when it
/// owns exactly them (no copy), else copied out.
fn into_pixels<T: Pixel>(a: Array3<T>) -> Vec<T> {
    let len = a.len();
    if !a.is_standard_layout() {
        return a.iter().copied().collect();
    }
    // A standard-layout array's pixels are the `len` elements from its offset.
    let (mut pixels, offset) = a.into_raw_vec_and_offset();
    match offset {
        Some(start) => {
            pixels.drain(..start.min(pixels.len()));
            pixels.truncate(len);
            pixels
        }
        None => Vec::new(), // an empty array
    }
}

fn concat_typed<T: Pixel>(parts: &[Stack]) -> Option<Stack> {
    let views: Option<Vec<_>> = parts.iter().map(|p| T::stack_array(p).map(|a| a.view())).collect();
    ndarray::concatenate(Axis(0), &views?).ok().map(T::wrap_stack)
}

/// An n-dimensional host array of any supported dtype.
///
/// This is what arrives from outside before validation (a TIFF page, a slice
/// handed to [`stack_slices`](crate::stack_slices)); a [`Stack`] is the
/// validated 3D form.
#[derive(Debug, Clone, PartialEq)]
pub enum HostArray {
    U8(ArrayD<u8>),
    U16(ArrayD<u16>),
    F32(ArrayD<f32>),
}

impl<T: Pixel> From<ArrayD<T>> for HostArray {
    fn from(a: ArrayD<T>) -> Self {
        T::wrap_host(a)
    }
}

impl HostArray {
    pub fn shape(&self) -> &[usize] {
        with_pixels!(HostArray, self, a, T => a.shape())
    }

    pub fn dtype(&self) -> DType {
        match self {
            HostArray::U8(_) => DType::U8,
            HostArray::U16(_) => DType::U16,
            HostArray::F32(_) => DType::F32,
        }
    }

    /// A 2D image of zeros.
    pub fn zeros_2d(dtype: DType, height: usize, width: usize) -> HostArray {
        Stack::zeros(dtype, [1, height, width]).into_host_array().index_first(0)
    }

    /// Sub-array at index `i` of the first axis (a copy). Panics if out of range.
    pub fn index_first(&self, i: usize) -> HostArray {
        with_pixels!(HostArray, self, a, T => HostArray::from(a.index_axis(Axis(0), i).to_owned()))
    }

    /// Reinterprets as a 3D stack if the array has exactly three axes.
    pub fn into_stack(self) -> Result<Stack, HostArray> {
        if self.shape().len() != 3 {
            return Err(self);
        }
        Ok(with_pixels!(HostArray, self, a, T => {
            let a = a.into_dimensionality::<ndarray::Ix3>().map_err(|_| ())
                .unwrap_or_else(|_| unreachable!("checked to have three axes"));
            Stack::from(a)
        }))
    }

    /// Adds a leading axis of length one (2D image → one-plane stack, etc.).
    pub fn insert_leading_axis(self) -> HostArray {
        with_pixels!(HostArray, self, a, T => HostArray::from(a.insert_axis(Axis(0))))
    }

    /// A 2D array from a flat vector, `[height, width]`.
    pub fn from_2d<T: Pixel>(height: usize, width: usize, data: Vec<T>) -> Option<HostArray> {
        ArrayD::from_shape_vec(IxDyn(&[height, width]), data).ok().map(HostArray::from)
    }
}
