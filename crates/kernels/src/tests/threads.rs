//! Sizing the global pool.

use crate::{set_threads, KernelError};

#[test]
fn set_threads_reports_an_already_sized_pool() {
    // The global pool can be sized once per process; whichever call comes second must say so, naming the
    // requested size (the first may already have lost to another test touching the pool).
    let _ = set_threads(2);
    match set_threads(3) {
        Err(KernelError::ThreadPool { threads: 3, .. }) => {}
        other => panic!("expected ThreadPool error for 3 threads, got {other:?}"),
    }
    assert!(rayon::current_num_threads() >= 1);
}
