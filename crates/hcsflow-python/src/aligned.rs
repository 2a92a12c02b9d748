//! An allocator that aligns large buffers to 64 bytes.
//!
//! Stacks reach Python without a copy (numpy arrays over the engine's
//! buffers), and from there torch and JAX through DLPack. JAX's CPU client
//! shares a buffer only if it is 64-byte aligned and silently copies any
//! other (references-wave2.md §4.2); the system allocator aligns to 16. So
//! every allocation of [`LARGE`] bytes or more is made with an alignment of
//! at least [`ALIGN`]: image buffers are, small ones are left as they are.
//!
//! Underneath is mimalloc, as in the CLI: freed buffers are reused instead of
//! unmapped and page-faulted in again by the next call.

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc;

/// The alignment of large buffers: what XLA's CPU client requires.
pub const ALIGN: usize = 64;
/// Allocations of this many bytes or more are aligned to [`ALIGN`].
pub const LARGE: usize = 4096;

/// mimalloc, with large buffers aligned to [`ALIGN`].
pub struct Aligned;

/// The layout actually allocated for `layout`: the same size, aligned to
/// [`ALIGN`] when large. A function of the layout alone, so alloc and
/// dealloc of one block always agree.
fn widened(layout: Layout) -> Layout {
    if layout.size() >= LARGE && layout.align() < ALIGN {
        // ALIGN is a power of two and a size that fits `layout` fits it too
        // (sizes ≥ 4 KiB are far from isize::MAX rounding), so this cannot fail.
        Layout::from_size_align(layout.size(), ALIGN).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: every method forwards to `MiMalloc` with the widened layout, which
// has the caller's size and an alignment at least the caller's; a block is
// always freed with the layout it was allocated with (`widened` depends on
// the layout only), and `realloc` between two widenings moves the block.
unsafe impl GlobalAlloc for Aligned {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { MiMalloc.alloc(widened(layout)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        unsafe { MiMalloc.alloc_zeroed(widened(layout)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { MiMalloc.dealloc(ptr, widened(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = widened(layout);
        let Ok(new) = Layout::from_size_align(new_size, layout.align()).map(widened) else {
            return std::ptr::null_mut();
        };
        if old.align() == new.align() {
            return unsafe { MiMalloc.realloc(ptr, old, new_size) };
        }
        // The block crosses the LARGE threshold: a new block with the new
        // alignment, the contents moved, the old block freed.
        let moved = unsafe { MiMalloc.alloc(new) };
        if !moved.is_null() {
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                MiMalloc.dealloc(ptr, old);
            }
        }
        moved
    }
}
