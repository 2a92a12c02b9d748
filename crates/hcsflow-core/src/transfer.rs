//! Bytes moved between host and device memory, counted where the copies
//! happen (the GPU runtime calls [`record_upload`] and [`record_download`]
//! for every buffer it writes from or reads back to the host), the time the
//! device spent on each call ([`record_kernel`]), and the adapter that did
//! it: the proof of where a stack was processed.
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
    /// Function calls run on a device.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kernel_calls: u64,
    /// The time the device spent on them, in nanoseconds ([`KernelTiming`] says how it was measured).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kernel_nanos: u64,
    /// How [`Self::kernel_nanos`] was measured; `None` when no call was timed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_timing: Option<KernelTiming>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How the device time of a call was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelTiming {
    /// GPU timestamp queries written before and after the call's work: the
    /// time the device spent on it.
    Device,
    /// The adapter has no timestamp queries: the host's clock between a wait
    /// for the queue to drain before the call and another after it, which
    /// also counts what the host did meanwhile (the call's own copies and
    /// launches).
    Host,
}

impl KernelTiming {
    /// Its name in the report: `device` or `host`.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelTiming::Device => "device",
            KernelTiming::Host => "host",
        }
    }

    /// The weaker of two measurements (a total of device- and host-timed
    /// calls is only as precise as its host-timed part).
    fn weaker(self, other: KernelTiming) -> KernelTiming {
        self.max(other)
    }
}

impl Transfers {
    /// Adds `other`'s counts and adapters to these.
    pub fn add(&mut self, other: &Transfers) {
        self.uploaded_bytes += other.uploaded_bytes;
        self.downloaded_bytes += other.downloaded_bytes;
        self.uploads += other.uploads;
        self.downloads += other.downloads;
        self.note_kernels(other.kernel_calls, other.kernel_nanos, other.kernel_timing);
        for a in &other.adapters {
            self.note_adapter(a);
        }
    }

    /// The device time of the calls in this window, `None` when none was timed.
    pub fn kernel_time(&self) -> Option<std::time::Duration> {
        self.kernel_timing.map(|_| std::time::Duration::from_nanos(self.kernel_nanos))
    }

    fn note_kernels(&mut self, calls: u64, nanos: u64, timing: Option<KernelTiming>) {
        self.kernel_calls += calls;
        self.kernel_nanos += nanos;
        self.kernel_timing = match (self.kernel_timing, timing) {
            (Some(a), Some(b)) => Some(a.weaker(b)),
            (a, b) => a.or(b),
        };
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

/// Counts one call that kept `adapter` busy for `spent`, measured as
/// `timing` says, in the current thread's innermost open window.
pub fn record_kernel(adapter: &AdapterUsed, spent: std::time::Duration, timing: KernelTiming) {
    let nanos = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
    record(adapter, |t| t.note_kernels(1, nanos, Some(timing)));
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
        let copies = |up, down, adapter| Transfers {
            uploaded_bytes: up,
            downloaded_bytes: down,
            uploads: 1,
            downloads: 1,
            adapters: vec![adapter],
            ..Transfers::default()
        };
        assert_eq!(inner, copies(8, 40, gpu(1)));
        assert_eq!(outer, copies(100, 60, gpu(0)));
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

    #[test]
    fn kernel_time_adds_up_and_is_only_as_precise_as_its_weakest_part() {
        use std::time::Duration;
        let outer = TransferMeter::start();
        record_kernel(&gpu(0), Duration::from_micros(250), KernelTiming::Device);
        record_kernel(&gpu(0), Duration::from_micros(750), KernelTiming::Device);
        let device = outer.finish();
        assert_eq!((device.kernel_calls, device.kernel_nanos, device.kernel_timing), (2, 1_000_000, Some(KernelTiming::Device)));
        assert_eq!(device.kernel_time(), Some(Duration::from_millis(1)));
        assert!(device.is_empty(), "a call is not a copy");
        assert_eq!(device.adapters, [gpu(0)]);

        let window = TransferMeter::start();
        record_kernel(&gpu(1), Duration::from_nanos(5), KernelTiming::Host);
        let host = window.finish();
        let mut total = device.clone();
        total.add(&host);
        assert_eq!((total.kernel_calls, total.kernel_nanos, total.kernel_timing), (3, 1_000_005, Some(KernelTiming::Host)));
        // Nothing timed: no kernel time, none serialized.
        let none = Transfers::default();
        assert_eq!(none.kernel_time(), None);
        let json = serde_json::to_value(&none).unwrap();
        assert!(json.get("kernel_nanos").is_none() && json.get("kernel_timing").is_none(), "{json}");
        assert_eq!(serde_json::to_value(&device).unwrap()["kernel_timing"], KernelTiming::Device.as_str());
        assert_eq!(serde_json::to_value(KernelTiming::Host).unwrap(), KernelTiming::Host.as_str());
    }
}
