//! Acquire and release of an 8 KiB buffer: tierbuf's `SlotPool` side by side with peer
//! pools, on one thread and on two threads sharing one pool.
//!
//! Run: `cargo bench -p tierbuf-benches --bench pool`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tierbuf_benches::{pin_to_core, two_threads};
use tierbuf_pool::{HostRegistrar, MemoryBudget, SlotPool};

const BUFFER: usize = 8 * 1024;
/// Buffers each bounded pool holds.
const POOL_SLOTS: usize = 64;

fn tierbuf_pool() -> SlotPool {
    let registrar = HostRegistrar::new(MemoryBudget::with_cap(1 << 30));
    SlotPool::new(&registrar, BUFFER, POOL_SLOTS).expect("register the bench pool")
}

fn crossbeam_pool() -> crossbeam_queue::ArrayQueue<Box<[u8]>> {
    let queue = crossbeam_queue::ArrayQueue::new(POOL_SLOTS);
    for _ in 0..POOL_SLOTS {
        queue
            .push(vec![0u8; BUFFER].into_boxed_slice())
            .expect("queue has room");
    }
    queue
}

fn one_thread(c: &mut Criterion) {
    pin_to_core(0);
    let mut group = c.benchmark_group("pool/acquire_release_8KiB");

    let pool = tierbuf_pool();
    group.bench_function("tierbuf", |b| {
        b.iter(|| {
            let slot = pool.try_acquire().expect("a free slot");
            black_box(slot.as_ptr());
        })
    });

    let queue = crossbeam_pool();
    group.bench_function("crossbeam_arrayqueue", |b| {
        b.iter(|| {
            let buffer = queue.pop().expect("a free buffer");
            black_box(buffer.as_ptr());
            queue.push(buffer).expect("room to give it back");
        })
    });

    let linear = lockfree_object_pool::LinearObjectPool::<Vec<u8>>::new(
        || Vec::with_capacity(BUFFER),
        |buffer| buffer.clear(),
    );
    group.bench_function("lockfree_object_pool", |b| {
        b.iter(|| {
            let buffer = linear.pull();
            black_box(buffer.as_ptr());
        })
    });

    group.bench_function("malloc", |b| {
        b.iter(|| {
            let buffer: Vec<u8> = Vec::with_capacity(BUFFER);
            black_box(buffer.as_ptr());
        })
    });
    group.finish();
}

fn two_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool/acquire_release_8KiB_2threads");

    let pool = tierbuf_pool();
    group.bench_function("tierbuf", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, || {
                let slot = pool.try_acquire().expect("a free slot");
                black_box(slot.as_ptr());
            })
        })
    });

    let queue = crossbeam_pool();
    group.bench_function("crossbeam_arrayqueue", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, || {
                let buffer = queue.pop().expect("a free buffer");
                black_box(buffer.as_ptr());
                queue.push(buffer).expect("room to give it back");
            })
        })
    });
    group.finish();
}

criterion_group!(benches, one_thread, two_thread);
criterion_main!(benches);
