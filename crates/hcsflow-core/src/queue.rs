//! GPU queues: which of an adapter's queues the current thread's device work
//! goes to, so that wells in flight on one GPU do not wait on each other.
//!
//! A GPU runtime opens up to [`QUEUES_PER_ADAPTER`] queues per adapter, each
//! a device of its own on that adapter (with wgpu: its own logical device,
//! hence its own submission queue and memory pools), named by a [`QueueId`]
//! (`gpu:0/q1`). The executor runs each worker's wells on the worker's queue
//! ([`queue_slot_of_worker`]) by opening a [`QueueScope`] on the thread that
//! runs a stack's chain; the runtime places new device buffers (uploads) on
//! the innermost open scope's queue ([`current_queue_slot`], 0 when none is
//! open), and every kernel runs on the queue of its input's buffer.
//!
//! Scopes nest like [`crate::TransferMeter`] windows: a rayon thread waiting
//! inside one well's stack may run another well's stack, which opens its own
//! scope on top; the work it does counts on that scope's queue only.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

/// Queues a runtime opens per adapter at most. Workers beyond share them
/// ([`queue_slot_of_worker`]): each queue is a device of its own (its memory
/// pools and compiled kernels), which a handful of wells in flight use well.
pub const QUEUES_PER_ADAPTER: usize = 4;

/// The queue slot the wells of worker `worker` (0-based) run on:
/// `worker % QUEUES_PER_ADAPTER`.
pub fn queue_slot_of_worker(worker: usize) -> usize {
    worker % QUEUES_PER_ADAPTER
}

/// One queue of one adapter: `gpu:<adapter>/q<slot>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct QueueId {
    /// The adapter's `gpu:N` index.
    pub adapter: usize,
    /// The queue's slot on it, `0..QUEUES_PER_ADAPTER`.
    pub slot: usize,
}

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gpu:{}/q{}", self.adapter, self.slot)
    }
}

thread_local! {
    static SLOTS: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// The queue slot of the current thread's innermost open [`QueueScope`];
/// 0 when none is open (one-off calls, plate-wide steps, tests).
pub fn current_queue_slot() -> usize {
    SLOTS.with(|s| s.borrow().last().copied().unwrap_or(0))
}

/// While it lives, the current thread's new device buffers go to queue
/// slot `slot` of their adapter. Not `Send`: it belongs to its thread.
#[must_use = "the scope ends when this is dropped"]
pub struct QueueScope {
    depth: usize,
    _thread: PhantomData<*const ()>,
}

impl QueueScope {
    /// Opens a scope for `slot` (taken modulo [`QUEUES_PER_ADAPTER`]) on this thread.
    pub fn enter(slot: usize) -> QueueScope {
        let depth = SLOTS.with(|s| {
            let mut s = s.borrow_mut();
            s.push(slot % QUEUES_PER_ADAPTER);
            s.len()
        });
        QueueScope { depth, _thread: PhantomData }
    }
}

impl Drop for QueueScope {
    fn drop(&mut self) {
        // Scopes close in reverse order of opening; one left open above this
        // one (dropped out of order) closes with it.
        SLOTS.with(|s| s.borrow_mut().truncate(self.depth.saturating_sub(1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_innermost_scope_names_the_slot_and_other_threads_are_not_affected() {
        assert_eq!(current_queue_slot(), 0);
        let outer = QueueScope::enter(1);
        assert_eq!(current_queue_slot(), 1);
        {
            let _inner = QueueScope::enter(QUEUES_PER_ADAPTER + 2);
            assert_eq!(current_queue_slot(), 2, "modulo the queues per adapter");
            assert_eq!(std::thread::spawn(current_queue_slot).join().unwrap(), 0);
        }
        assert_eq!(current_queue_slot(), 1);
        drop(outer);
        assert_eq!(current_queue_slot(), 0);
    }

    #[test]
    fn workers_share_queues_beyond_the_limit_and_queues_are_named() {
        let slots: Vec<usize> = (0..QUEUES_PER_ADAPTER + 2).map(queue_slot_of_worker).collect();
        assert_eq!(slots, [0, 1, 2, 3, 0, 1]);
        assert_eq!(QueueId { adapter: 1, slot: 3 }.to_string(), "gpu:1/q3");
    }
}
