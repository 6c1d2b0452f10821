//! Support for the benchmarks in `benches/`: a heap allocation counter and a
//! rig that runs the real router and the mock upstream in-process.
//!
//! Allocation counting: [`Counting`] is installed as the global allocator of
//! every benchmark binary. It counts every allocation, and separately those
//! made on threads that called [`count_this_thread`] (the router's own
//! thread in the full-call benchmark), so the router's allocations per call
//! can be told apart from the client's and the mock's; and the bytes held
//! ([`live_bytes`]), for what a thing kept costs in heap.
// The allocator needs `unsafe impl GlobalAlloc`; it only counts and then
// delegates to the system allocator with the same arguments, so it upholds
// every contract the system allocator does.
#![deny(unsafe_op_in_unsafe_fn)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

pub mod rig;

/// Counts allocations, then lets the system allocator do the work.
pub struct Counting;

static ALL: AtomicU64 = AtomicU64::new(0);
static MARKED: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicI64 = AtomicI64::new(0);

thread_local! {
    static MARK: Cell<bool> = const { Cell::new(false) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same layout, forwarded unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: same layout, forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: ptr and layout come from this allocator, which is System underneath.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: ptr and layout come from this allocator, which is System underneath.
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn count() {
    ALL.fetch_add(1, Ordering::Relaxed);
    if MARK.try_with(Cell::get).unwrap_or(false) {
        MARKED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts this thread's allocations in [`marked_allocations`] from now on.
pub fn count_this_thread() {
    MARK.with(|m| m.set(true));
}

/// Whether this thread's allocations are counted (it called [`count_this_thread`]).
pub fn counting_here() -> bool {
    MARK.try_with(Cell::get).unwrap_or(false)
}

/// Allocations made so far, on any thread.
pub fn allocations() -> u64 {
    ALL.load(Ordering::Relaxed)
}

/// Allocations made so far on threads that called [`count_this_thread`].
pub fn marked_allocations() -> u64 {
    MARKED.load(Ordering::Relaxed)
}

/// Heap bytes allocated and not yet freed, by every thread (as asked for:
/// the allocator's own overhead is not counted).
pub fn live_bytes() -> i64 {
    LIVE.load(Ordering::Relaxed)
}

/// Allocations made by `f` on this thread (and any other, so run it alone).
pub fn allocations_of<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = allocations();
    let out = f();
    (out, allocations() - before)
}

/// A blocking HTTP/1.1 keep-alive connection, small enough not to disturb
/// what is measured.
pub struct Conn {
    reader: BufReader<TcpStream>,
    host: String,
}

/// One response.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

impl Conn {
    /// Connects to `addr`.
    pub fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Conn { reader: BufReader::new(stream), host: addr.to_string() }
    }

    /// Sends a prebuilt request (from [`Conn::request`]) and reads the answer.
    pub fn send(&mut self, request: &[u8]) -> Answer {
        self.reader.get_mut().write_all(request).expect("write");
        self.read()
    }

    /// A complete POST request for `path` with `headers` and `body`.
    pub fn request(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            self.host,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        bytes
    }

    fn read(&mut self) -> Answer {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("status line");
        let status: u16 = line.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
        let mut headers = Vec::new();
        let mut length: Option<usize> = None;
        let mut chunked = false;
        loop {
            line.clear();
            self.reader.read_line(&mut line).expect("header");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                let (k, v) = (k.trim().to_owned(), v.trim().to_owned());
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.parse().ok();
                }
                if k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked") {
                    chunked = true;
                }
                headers.push((k, v));
            }
        }
        let mut body = Vec::new();
        if let Some(n) = length {
            body.resize(n, 0);
            self.reader.read_exact(&mut body).expect("body");
        } else if chunked {
            loop {
                line.clear();
                self.reader.read_line(&mut line).expect("chunk size");
                let size = usize::from_str_radix(line.trim(), 16).expect("hex size");
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).expect("chunk");
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        }
        Answer { status, headers, body }
    }
}
