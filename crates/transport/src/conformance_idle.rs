//! A conformance check for every transport's idle timeout, for the tests
//! that start a server with one (the server's over tcp and shm, the
//! fabric transport's): a connection silent past the timeout is closed,
//! one that keeps asking is not. The server and the client that asks
//! are the caller's, so the check needs neither.

use std::time::{Duration, Instant};

use crate::{Endpoint, TransportError};

/// How long a test waits for the server to close an idle connection:
/// many times any timeout these tests set, for a loaded machine.
pub const CLOSE_WITHIN: Duration = Duration::from_secs(30);

/// Whether the server has closed `ep`; any failure other than a closed
/// connection fails the test.
pub fn closed(ep: &mut dyn Endpoint) -> bool {
    match ep.poll(usize::MAX, &mut |_| {}) {
        Err(TransportError::Closed) | Err(TransportError::Io(_)) => return true,
        Err(e) => panic!("expected the connection to be closed, got {e}"),
        Ok(_) => {}
    }
    matches!(
        ep.wait(Duration::from_millis(50)),
        Err(TransportError::Closed) | Err(TransportError::Io(_))
    )
}

/// With the server's idle timeout `idle`: `ask` (a request on another
/// connection, true when it is answered as it should be) runs every fifth
/// of `idle` for three timeouts, so its connection is never idle, while
/// `silent`, which never asks, is closed within [`CLOSE_WITHIN`].
pub fn an_asking_connection_stays_while_a_silent_one_goes(
    idle: Duration,
    silent: &mut dyn Endpoint,
    mut ask: impl FnMut() -> bool,
) {
    let start = Instant::now();
    while start.elapsed() < 3 * idle {
        assert!(ask(), "the asking connection got a wrong answer");
        std::thread::sleep(idle / 5);
    }
    while !closed(silent) {
        assert!(
            start.elapsed() < CLOSE_WITHIN,
            "the silent connection stayed"
        );
    }
}
