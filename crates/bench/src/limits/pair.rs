//! Two ends of a raw TCP measurement on loopback, each on its own pinned
//! thread (`run_pair`), their sockets set up alike, and the clock that
//! marks the measured interval after the warm-up (`Clock`).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::check::{IO_TIMEOUT, WARMUP};

/// Runs `server` on a listener of `127.0.0.1:0` in one thread and `client`,
/// given its address, in another, each pinned to its CPU; their results.
///
/// When the client fails before it connects, one connection is opened and
/// closed so that the server's `accept` returns and its thread ends.
pub(crate) fn run_pair<S, C, A, B>(
    name: &str,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
    server: S,
    client: C,
) -> Result<(A, B), String>
where
    S: FnOnce(TcpListener) -> Result<A, String> + Send + 'static,
    C: FnOnce(SocketAddr) -> Result<B, String> + Send + 'static,
    A: Send + 'static,
    B: Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = crate::spawn_pinned(&format!("{name}-server"), server_cpu, move || {
        server(listener)
    })?;
    let client = crate::spawn_pinned(&format!("{name}-client"), client_cpu, move || client(addr));
    let measured = match client {
        Ok(c) => c
            .join()
            .map_err(|_| format!("{name} client thread panicked"))
            .and_then(|r| r),
        Err(e) => Err(e),
    };
    if measured.is_err() {
        let _ = TcpStream::connect_timeout(&addr, IO_TIMEOUT);
    }
    let served = server
        .join()
        .map_err(|_| format!("{name} server thread panicked"))
        .and_then(|r| r);
    let m = measured?;
    Ok((served?, m))
}

/// Accepts one connection and sets it up: `TCP_NODELAY`, timeouts.
pub(crate) fn accept_one(listener: &TcpListener) -> Result<TcpStream, String> {
    let (s, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    set_up(&s)?;
    Ok(s)
}

/// Connects to `addr` and sets the socket up like [`accept_one`].
pub(crate) fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    set_up(&s)?;
    Ok(s)
}

/// `TCP_NODELAY`, and read and write timeouts of [`IO_TIMEOUT`] so that a
/// stuck peer is an error, not a hang.
pub(crate) fn set_up(s: &TcpStream) -> Result<(), String> {
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())
}

/// A fixed byte pattern of `n` bytes, so payloads are not all zeros.
pub(crate) fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

/// What one measuring client saw.
pub(crate) struct Window {
    /// Units (replies, bytes) completed in the measured interval.
    pub count: u64,
    /// Length of the measured interval, seconds.
    pub seconds: f64,
    /// Units completed over the whole connection, warm-up and drain too.
    pub total: u64,
}

/// Marks the measured interval inside a run: it opens at the first
/// observation after the warm-up and closes at the first one `duration`
/// after that.
pub(crate) struct Clock {
    warm_until: Instant,
    duration: Duration,
    opened: Option<(Instant, u64)>,
}

impl Clock {
    pub fn start(duration: Duration) -> Self {
        Clock {
            warm_until: Instant::now() + WARMUP,
            duration,
            opened: None,
        }
    }

    /// Observes `done` units completed so far; the finished window once
    /// the measured interval is over.
    pub fn observe(&mut self, done: u64) -> Option<Window> {
        let now = Instant::now();
        match self.opened {
            None => {
                if now >= self.warm_until {
                    self.opened = Some((now, done));
                }
                None
            }
            Some((t0, d0)) => {
                let elapsed = now.duration_since(t0);
                (elapsed >= self.duration).then(|| Window {
                    count: done - d0,
                    seconds: elapsed.as_secs_f64(),
                    total: done,
                })
            }
        }
    }
}
