//! Workers on a listening address: one thread per worker running
//! [`crate::worker::run_with`], and the acceptor, for a process that
//! serves only the services it registers (`fabrickv bench rpc`'s echo
//! server, the behaviour suite). The `fabrickv` server starts its own
//! (it adds CPU pinning, idle timeouts and the text front ends).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use fabrickv_transport::Waker;

use crate::service::Clock;
use crate::worker::{run_with, LoopKnobs, RegisterError, Worker};
use crate::RpcError;

/// Running workers and their acceptor; stopped when dropped.
pub struct Serving {
    /// The address clients connect to, with the port resolved.
    addr: String,
    /// Set to stop every thread.
    stop: Arc<AtomicBool>,
    /// Wakes the acceptor and each worker out of a blocking wait.
    wakers: Vec<Waker>,
    /// The acceptor and the workers.
    threads: Vec<JoinHandle<()>>,
}

impl Serving {
    /// Listens on `addr` with `workers` workers, worker `i` built by
    /// `make(i)`, each looping as `knobs` say. Threads are named
    /// `fkv-worker-<i>`.
    pub fn start(
        addr: &str,
        workers: usize,
        knobs: LoopKnobs,
        make: impl Fn(u16) -> Result<Worker, RegisterError>,
    ) -> Result<Serving, RpcError> {
        if workers == 0 {
            return Err(RpcError::Invalid("at least one worker".into()));
        }
        let l = fabrickv_transport::listen(addr, workers)?;
        let mut s = Serving {
            addr: l.local_addr,
            stop: Arc::new(AtomicBool::new(false)),
            wakers: vec![l.acceptor.waker()],
            threads: Vec::with_capacity(workers + 1),
        };
        let clock = Clock::new();
        for (i, port) in l.ports.into_iter().enumerate() {
            let worker = make(i as u16).map_err(|e| RpcError::Invalid(e.to_string()))?;
            s.wakers.push(port.waker());
            let stop = s.stop.clone();
            s.spawn(format!("fkv-worker-{i}"), move || {
                run_with(port, worker, clock, knobs, &stop)
            })?;
        }
        let mut acceptor = l.acceptor;
        let stop = s.stop.clone();
        s.spawn("fkv-acceptor".into(), move || {
            if let Err(e) = acceptor.run(&stop) {
                tracing::error!("acceptor stopped: {e}");
            }
        })?;
        Ok(s)
    }

    fn spawn(&mut self, name: String, f: impl FnOnce() + Send + 'static) -> Result<(), RpcError> {
        let t = std::thread::Builder::new()
            .name(name)
            .spawn(f)
            .map_err(|e| RpcError::Invalid(format!("cannot start a thread: {e}")))?;
        self.threads.push(t);
        Ok(())
    }

    /// The address clients connect to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Stops every thread and waits for them.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
