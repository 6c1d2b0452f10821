//! The threads that serve the MCP listener's connections: the caller's
//! runtime (thread 0) and, with `server.worker_threads` above one, threads
//! of their own, each running a current-thread runtime.
//!
//! Each accepted connection is dealt to the thread serving the fewest
//! (ties taken in turn) and stays there: its requests, the upstream
//! connections they reuse (pooled per thread, [`switchboard_core::thread`])
//! and the tasks they spawn all run on that one thread, with no wake-up
//! between threads and no work stealing on the way. What is not a
//! connection's (the admin API, edge devices, the background loops) runs on
//! thread 0.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;

/// The connection threads.
pub(crate) struct Workers {
    /// Thread 0 (the caller's runtime), then the threads of their own.
    threads: Vec<Worker>,
    /// Where the next tie goes.
    turn: AtomicUsize,
}

struct Worker {
    /// `None` for thread 0: spawned on the current runtime.
    handle: Option<tokio::runtime::Handle>,
    /// Connections being served.
    open: Arc<AtomicUsize>,
    /// Ends the thread (its runtime's `block_on`).
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Counts a connection as open on its thread until dropped.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Workers {
    /// Thread 0 and `more` threads of their own (named
    /// `switchboard-conn-N`), each with a current-thread runtime.
    pub(crate) fn start(more: usize) -> std::io::Result<Workers> {
        let mut threads = vec![Worker { handle: None, open: Arc::default(), stop: None, thread: None }];
        for index in 1..=more {
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let (ready, handle) = std::sync::mpsc::channel();
            let thread = std::thread::Builder::new().name(format!("switchboard-conn-{index}")).spawn(move || {
                switchboard_core::thread::set_index(index);
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                let _ = ready.send(Ok(runtime.handle().clone()));
                runtime.block_on(async {
                    let _ = stopped.await;
                });
                // Dropping the runtime ends what it still runs.
            })?;
            let handle = handle.recv().map_err(|_| std::io::Error::other("a connection thread did not start"))??;
            threads.push(Worker { handle: Some(handle), open: Arc::default(), stop: Some(stop), thread: Some(thread) });
        }
        Ok(Workers { threads, turn: AtomicUsize::new(0) })
    }

    /// How many threads serve connections.
    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }

    /// Serves `stream` with `serve` on the thread serving the fewest
    /// connections: moved to that thread's runtime (registered with it
    /// anew) unless that is thread 0.
    pub(crate) fn deal<F, Fut>(&self, stream: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let n = self.threads.len();
        let first = if n > 1 { self.turn.fetch_add(1, Ordering::Relaxed) % n } else { 0 };
        let worker = (0..n)
            .map(|i| &self.threads[(first + i) % n])
            .min_by_key(|w| w.open.load(Ordering::Relaxed))
            .expect("thread 0 is always there");
        worker.open.fetch_add(1, Ordering::Relaxed);
        let open = Open(worker.open.clone());
        let Some(handle) = &worker.handle else {
            tokio::spawn(async move {
                let _open = open;
                serve(stream).await;
            });
            return;
        };
        // Taken off this runtime's reactor, to join the other's.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "an accepted connection could not be handed to its thread; closed");
                return;
            }
        };
        handle.spawn(async move {
            let _open = open;
            match TcpStream::from_std(stream) {
                Ok(stream) => serve(stream).await,
                Err(e) => tracing::warn!(error = %e, "an accepted connection could not join its thread; closed"),
            }
        });
    }

    /// Ends the threads of their own (what their runtimes still run is
    /// dropped) and waits for them.
    pub(crate) async fn stop(mut self) {
        let mut joins = Vec::new();
        for worker in &mut self.threads {
            if let Some(stop) = worker.stop.take() {
                let _ = stop.send(());
            }
            joins.extend(worker.thread.take());
        }
        if joins.is_empty() {
            return;
        }
        let _ = tokio::task::spawn_blocking(move || {
            for join in joins {
                let _ = join.join();
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `workers` serves `count` connections held open at once: each
    /// one's thread index.
    async fn dealt(workers: &Workers, count: usize) -> Vec<usize> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (release, released) = tokio::sync::watch::channel(false);
        let mut clients = Vec::new();
        for _ in 0..count {
            clients.push(TcpStream::connect(addr).await.unwrap());
            let (stream, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            let mut released = released.clone();
            workers.deal(stream, move |mut stream| async move {
                use tokio::io::AsyncWriteExt;
                // Served here: the stream works on this thread's runtime.
                stream.write_all(b"x").await.unwrap();
                let _ = tx.send(switchboard_core::thread::index());
                let _ = released.wait_for(|r| *r).await;
            });
        }
        let mut threads = Vec::new();
        for client in &mut clients {
            use tokio::io::AsyncReadExt;
            let mut byte = [0u8; 1];
            client.read_exact(&mut byte).await.unwrap();
            threads.push(rx.recv().await.unwrap());
        }
        let _ = release.send(true);
        threads.sort_unstable();
        threads
    }

    #[tokio::test]
    async fn connections_are_spread_over_the_threads_and_served_there() {
        let workers = Workers::start(2).unwrap();
        assert_eq!(workers.len(), 3);
        assert_eq!(dealt(&workers, 6).await, vec![0, 0, 1, 1, 2, 2], "the fewest first");
        // Once closed, they count no more.
        for _ in 0..200 {
            if workers.threads.iter().all(|w| w.open.load(Ordering::Relaxed) == 0) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(workers.threads.iter().all(|w| w.open.load(Ordering::Relaxed) == 0));
        workers.stop().await;
    }

    #[tokio::test]
    async fn one_thread_serves_all_on_the_callers_runtime() {
        let workers = Workers::start(0).unwrap();
        assert_eq!(dealt(&workers, 3).await, vec![0, 0, 0]);
        workers.stop().await;
    }
}
