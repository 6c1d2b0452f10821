//! Which of the router's connection threads the current thread is.
//!
//! The router serves its connections on threads that each run a
//! current-thread runtime of their own (`server.worker_threads`). A socket
//! is registered with the runtime that opened it, and wakes that runtime's
//! thread; whatever keeps sockets for reuse across requests (the upstream
//! connection pools) keeps them apart per thread, so that a request reuses
//! only what its own thread opened. Every other thread (the runtime a test
//! or a multi-threaded caller serves on, the audit writer) is thread 0.

use std::cell::Cell;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The current thread's index: 0 unless [`set_index`] said otherwise on it.
pub fn index() -> usize {
    INDEX.with(Cell::get)
}

/// Makes the current thread connection thread `index`.
pub fn set_index(index: usize) {
    INDEX.with(|i| i.set(index));
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_thread_has_its_own_index() {
        assert_eq!(super::index(), 0);
        super::set_index(3);
        assert_eq!(super::index(), 3);
        let other = std::thread::spawn(super::index).join().expect("thread");
        assert_eq!(other, 0, "a new thread is thread 0 until told");
        assert_eq!(super::index(), 3);
    }
}
