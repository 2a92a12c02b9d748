//! Bytes moved between host and device memory, counted where the copies
//! happen (the GPU runtime calls [`record_upload`] and [`record_download`]
//! for every buffer it writes from or reads back to the host), and the
//! adapter that moved them: the proof of where a stack was processed.
//!
//! A [`TransferMeter`] opens a window on the current thread; the copies made
//! on that thread until it is finished are counted in it. Windows nest (a
//! rayon thread waiting inside one stack may run another stack's work, which
//! opens its own window): a copy counts in the innermost window only.

use std::cell::RefCell;
use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

/// A GPU adapter that moved data, as the report names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AdapterUsed {
    /// `gpu:N`.
    pub device: String,
    /// The adapter's name (e.g. "llvmpipe (LLVM 15.0.7, 256 bits)").
    pub name: String,
    /// Graphics API: "Vulkan", "Metal", "Dx12".
    pub backend: String,
}

/// The host ↔ device copies counted in a window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfers {
    /// Bytes copied from host to device memory.
    pub uploaded_bytes: u64,
    /// Bytes copied from device back to host memory.
    pub downloaded_bytes: u64,
    /// Number of host → device copies.
    pub uploads: u64,
    /// Number of device → host copies.
    pub downloads: u64,
    /// The adapters that made them, sorted, each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<AdapterUsed>,
}

impl Transfers {
    /// Adds `other`'s counts and adapters to these.
    pub fn add(&mut self, other: &Transfers) {
        self.uploaded_bytes += other.uploaded_bytes;
        self.downloaded_bytes += other.downloaded_bytes;
        self.uploads += other.uploads;
        self.downloads += other.downloads;
        for a in &other.adapters {
            self.note_adapter(a);
        }
    }

    /// True if nothing was copied.
    pub fn is_empty(&self) -> bool {
        self.uploads == 0 && self.downloads == 0
    }

    fn note_adapter(&mut self, adapter: &AdapterUsed) {
        if let Err(at) = self.adapters.binary_search(adapter) {
            self.adapters.insert(at, adapter.clone());
        }
    }
}

thread_local! {
    static WINDOWS: RefCell<Vec<Transfers>> = const { RefCell::new(Vec::new()) };
}

fn record(adapter: &AdapterUsed, update: impl FnOnce(&mut Transfers)) {
    WINDOWS.with(|w| {
        if let Some(top) = w.borrow_mut().last_mut() {
            update(top);
            top.note_adapter(adapter);
        }
    });
}

/// Counts a copy of `bytes` bytes from the host to `adapter` in the current
/// thread's innermost open window (none open: not counted).
pub fn record_upload(adapter: &AdapterUsed, bytes: u64) {
    record(adapter, |t| {
        t.uploaded_bytes += bytes;
        t.uploads += 1;
    });
}

/// Counts a copy of `bytes` bytes from `adapter` back to the host.
pub fn record_download(adapter: &AdapterUsed, bytes: u64) {
    record(adapter, |t| {
        t.downloaded_bytes += bytes;
        t.downloads += 1;
    });
}

/// A window counting the current thread's copies from [`TransferMeter::start`]
/// to [`TransferMeter::finish`]. Not `Send`: it belongs to its thread.
#[must_use = "finish() returns what was counted"]
pub struct TransferMeter {
    depth: usize,
    _thread: PhantomData<*const ()>,
}

impl TransferMeter {
    /// Opens a window on this thread.
    pub fn start() -> TransferMeter {
        let depth = WINDOWS.with(|w| {
            let mut w = w.borrow_mut();
            w.push(Transfers::default());
            w.len()
        });
        TransferMeter { depth, _thread: PhantomData }
    }

    /// Closes the window and returns what was copied in it.
    pub fn finish(self) -> Transfers {
        let counted = WINDOWS.with(|w| {
            let mut w = w.borrow_mut();
            // Windows close in reverse order of opening; one left open by a
            // panic inside is dropped with its own meter.
            w.truncate(self.depth);
            w.pop().unwrap_or_default()
        });
        std::mem::forget(self);
        counted
    }
}

impl Drop for TransferMeter {
    fn drop(&mut self) {
        WINDOWS.with(|w| w.borrow_mut().truncate(self.depth.saturating_sub(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(n: usize) -> AdapterUsed {
        AdapterUsed { device: format!("gpu:{n}"), name: format!("adapter {n}"), backend: "Vulkan".into() }
    }

    #[test]
    fn copies_count_in_the_innermost_open_window_only() {
        record_upload(&gpu(0), 999); // no window: not counted anywhere
        let outer = TransferMeter::start();
        record_upload(&gpu(0), 100);
        let inner = TransferMeter::start();
        record_download(&gpu(1), 40);
        record_upload(&gpu(1), 8);
        let inner = inner.finish();
        record_download(&gpu(0), 60);
        let outer = outer.finish();
        assert_eq!(inner, Transfers { uploaded_bytes: 8, downloaded_bytes: 40, uploads: 1, downloads: 1, adapters: vec![gpu(1)] });
        assert_eq!(outer, Transfers { uploaded_bytes: 100, downloaded_bytes: 60, uploads: 1, downloads: 1, adapters: vec![gpu(0)] });
        let mut total = outer.clone();
        total.add(&inner);
        assert_eq!((total.uploaded_bytes, total.downloaded_bytes, total.adapters), (108, 100, vec![gpu(0), gpu(1)]));
    }

    #[test]
    fn a_dropped_window_is_closed_and_other_threads_are_not_counted() {
        let outer = TransferMeter::start();
        {
            let _abandoned = TransferMeter::start();
            record_upload(&gpu(0), 5);
        }
        std::thread::spawn(|| record_upload(&gpu(0), 7)).join().unwrap();
        record_upload(&gpu(0), 3);
        assert_eq!(outer.finish().uploaded_bytes, 3);
    }
}
