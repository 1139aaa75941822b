//! A global allocator that counts the live heap bytes, so a benchmark or an example
//! measures a structure's footprint instead of estimating it (`benches/ring.rs`,
//! `examples/last_seen_memory.rs`). The gateway itself never installs it.
//!
//! A binary includes this file (`#[path = ".../examples/support/counting_alloc.rs"] mod
//! counting_alloc;`, outside the library, which forbids unsafe code) and installs it with
//! `#[global_allocator] static ALLOCATOR: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// The system allocator, counting; see the module documentation.
pub struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

impl Counting {
    /// Heap bytes allocated and not freed since the process started.
    pub fn live_bytes() -> isize {
        LIVE_BYTES.load(Ordering::Relaxed)
    }
}

// SAFETY: every call goes to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}
