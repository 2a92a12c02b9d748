//! One queue per worker: a [`QueueScope`] puts a thread's uploads, and the
//! kernels that run on them, on that queue of the adapter (its own wgpu
//! device); two threads on two queues at once get the host's results.
//! Two queues at most (each is a Vulkan device of its own on lavapipe).

use std::sync::Arc;

use hcsflow_core::queue::QUEUES_PER_ADAPTER;
use hcsflow_core::{Array, CallContext, ConversionPolicy, DType, Device, MemoryType, QueueId, QueueScope};
use hcsflow_gpu::GpuContext;

use crate::common::{gpu, random_stack, to_host};

#[test]
fn a_queue_scope_chooses_the_queue_of_uploads_and_kernels() {
    let Some(dev) = gpu() else { return };
    let Device::Gpu(adapter) = dev else { unreachable!() };
    let q0 = GpuContext::on_queue(dev, 0).unwrap();
    let q1 = GpuContext::on_queue(dev, 1).unwrap();
    assert_eq!((q0.queue, q1.queue), (QueueId { adapter, slot: 0 }, QueueId { adapter, slot: 1 }));
    assert!(!Arc::ptr_eq(&q0, &q1), "two contexts");
    assert!(Arc::ptr_eq(&q1, &GpuContext::on_queue(dev, 1 + QUEUES_PER_ADAPTER).unwrap()), "slots wrap around, shared after");
    assert!(Arc::ptr_eq(&q0, &GpuContext::get(dev).unwrap()), "no scope: queue 0");

    let stack = random_stack(DType::U16, [3, 17, 9], 7);
    let on_q1 = {
        let _scope = QueueScope::enter(1);
        assert!(Arc::ptr_eq(&q1, &GpuContext::get(dev).unwrap()));
        hcsflow_gpu::upload_stack(&stack, dev).unwrap()
    };
    assert_eq!(on_q1.context().queue.slot, 1, "the upload stays on its queue after the scope");
    assert_eq!(to_host(&on_q1), stack);

    // A kernel runs on its input's queue and leaves its result there.
    let (registry, conversions) = crate::common::registry();
    let args = registry.get("max_projection").unwrap().validate_args(vec![]).unwrap();
    let plan = registry.plan_call("max_projection", args, MemoryType::Wgpu, dev, &conversions, ConversionPolicy::default()).unwrap();
    let out = registry.execute_in(&plan, Array::Device(Arc::new(on_q1)), &conversions, &mut CallContext::default()).unwrap();
    let Array::Device(buffer) = out else { panic!("on the host") };
    let out = buffer.as_any().downcast_ref::<hcsflow_gpu::WgpuArray>().unwrap();
    assert_eq!(out.context().queue.slot, 1);
    assert_eq!(to_host(out), hcsflow_ops::projection::max_projection(&stack).unwrap());
}

#[test]
fn two_threads_on_two_queues_at_once_get_the_host_results() {
    let Some(dev) = gpu() else { return };
    let (registry, conversions) = crate::common::registry();
    let results: Vec<(usize, bool)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2usize)
            .map(|slot| {
                let (registry, conversions) = (&registry, &conversions);
                scope.spawn(move || {
                    let _scope = QueueScope::enter(slot);
                    let mut all_equal = true;
                    for seed in 0..4 {
                        let stack = random_stack(DType::F32, [4, 33, 20], 100 * slot as u64 + seed);
                        let args = registry.get("max_projection").unwrap().validate_args(vec![]).unwrap();
                        let plan = registry
                            .plan_call("max_projection", args, MemoryType::Host, dev, conversions, ConversionPolicy::default())
                            .unwrap();
                        let gpu = registry
                            .run_to_host(&plan, stack.clone(), conversions, ConversionPolicy::default(), &mut CallContext::default())
                            .unwrap();
                        all_equal &= gpu == hcsflow_ops::projection::max_projection(&stack).unwrap();
                    }
                    (GpuContext::get(dev).unwrap().queue.slot, all_equal)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(results, [(0, true), (1, true)]);
}
