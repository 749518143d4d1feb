//! Once a batch is warm, `parse_into` allocates nothing: counted by a global
//! allocator that counts this thread's allocations while a flag is set.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tfpipe::Batch;
use tfpipe::example::{BatchParser, Schema};

use super::common::*;

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: delegates to the system allocator; only bumps a thread-local counter.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations(f: impl FnOnce()) -> usize {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn parse_into_a_warm_batch_allocates_nothing() {
    let records = read_records("examples.tfrecord");
    let schema = Schema::from_feature_texts(&[
        "id:int64",
        "label:bytes=x",
        "score:float32=-1",
        "emb:float32:3=0",
        "tags:bytes:var",
        "counts:int64:var",
        "weights:float32:var",
    ])
    .unwrap();
    let mut parser = BatchParser::new(schema).unwrap();
    let mut batch = Batch::default();
    // Warm with the whole file, then parse every batch of 8 into the same buffers.
    parser.parse_into(&records, &mut batch).unwrap();
    let n = allocations(|| {
        for chunk in records.chunks(8) {
            parser.parse_into(chunk, &mut batch).unwrap();
        }
        parser.parse_into(&records, &mut batch).unwrap();
    });
    assert_eq!(n, 0);
    // Counting works: a cold batch allocates.
    assert!(allocations(|| drop(parser.parse(&records[..1]).unwrap())) > 0);

    let records = read_records("sequence.tfrecord");
    let schema = Schema::from_feature_texts(&[
        "seq_id:int64",
        "lang:bytes=und",
        "ctx_score:float32:var",
        "frames:float32:seq:2",
        "tokens:int64:seq:var",
        "words:bytes:seq:var",
    ])
    .unwrap();
    let mut parser = BatchParser::new(schema).unwrap();
    parser.parse_into(&records, &mut batch).unwrap();
    let n = allocations(|| {
        for chunk in records.chunks(3) {
            parser.parse_into(chunk, &mut batch).unwrap();
        }
    });
    assert_eq!(n, 0);
}
