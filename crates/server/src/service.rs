//! The request layer's contract: what a service is, what it is handed, and
//! how a refused frame is answered.
//!
//! The worker ([`crate::worker`]) decodes every frame once, refuses what
//! does not decode, answers HELLO and STATS itself, and hands each other
//! frame, decoded, to the one service that owns its kind (kv, ps, cache,
//! shard). A service appends its reply, or returns a [`Refusal`] that the
//! worker turns into an ERROR frame and counts in `frames_refused`. The
//! services know nothing of each other: this module, the clock and the
//! refusal helpers are all they share.

use std::time::Instant;

use fabrickv_transport::{ConnId, Reply, WorkerPort};
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::encode_error;
use fabrickv_wire::{decode_frame, Frame, WireError};

/// A refusal: the stable code and the words sent with it.
pub type Refusal = (ErrorCode, String);

/// Named counters as a STATS reply carries them, in order.
pub type StatsList = Vec<(&'static str, u64)>;

/// Milliseconds since the server started, as the engine's clock. Never 0,
/// so that 0 can mean "no expiry".
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
        }
    }

    /// The current time in engine milliseconds.
    #[inline]
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// One decoded request frame and what came with it, as the worker hands
/// it to the service that owns its kind.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// The connection the frame arrived on: the cache ties chunked puts
    /// and BIND to it, and a per-connection check (authentication) has it
    /// at hand in the worker before any service runs.
    pub conn: ConnId,
    /// The frame, decoded once by the worker (header checked, checksum
    /// verified); its kind is one the service owns.
    pub frame: Frame<'a>,
    /// The time, in engine milliseconds, for the whole burst.
    pub now_ms: u64,
}

impl Call<'_> {
    /// The request id, echoed in every reply to this frame.
    #[inline]
    pub fn id(&self) -> u64 {
        self.frame.header.request_id
    }
}

/// A service of one worker: the handler of one or more frame kinds.
///
/// Static dispatch: the worker holds each service by its type and picks
/// one with a `match` on the frame kind, so a frame costs no virtual call.
pub trait Service {
    /// Handles one frame of a kind this service owns, appending its reply
    /// to `reply`. `Err` means the frame is refused whole: nothing was
    /// appended, and the worker answers with an ERROR frame carrying the
    /// refusal's code and words, counted in `frames_refused`.
    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal>;

    /// Counters of a store every worker shares, appended to a STATS reply
    /// by worker 0 alone so that clients adding up workers count them once.
    fn shared_stats(&self, _out: &mut StatsList) {}

    /// Work queued to this worker from other threads, run between bursts
    /// with the worker's port; returns how many jobs ran.
    fn run_jobs(&mut self, _port: &mut dyn WorkerPort) -> usize {
        0
    }

    /// Periodic background work (expiry, abandoned transfers), run every
    /// `SWEEP_INTERVAL_MS`.
    fn sweep(&mut self, _now_ms: u64) {}
}

/// The request id of a frame whose header may be broken, so that even an
/// ERROR reply can be matched to its request when the id is readable.
pub fn request_id_of(msg: &[u8]) -> u64 {
    msg.get(8..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The refusal of a request whose body does not decode: the decoder's
/// stable code and words.
pub fn wire_refusal(e: WireError) -> Refusal {
    (e.code(), e.to_string())
}

/// Appends the ERROR frame that refuses request `id` whole.
pub fn refuse(out: &mut Vec<u8>, id: u64, worker: u16, refusal: &Refusal) {
    encode_error(out, id, worker, refusal.0, &refusal.1);
}

/// The frame in `msg`, or `None` after appending to `out` the ERROR frame
/// that refuses it (with the decoder's code and words, and the request id
/// when the header has one).
pub fn decode_or_refuse<'a>(msg: &'a [u8], worker: u16, out: &mut Vec<u8>) -> Option<Frame<'a>> {
    match decode_frame(msg) {
        Ok(f) => Some(f),
        Err(e) => {
            encode_error(out, request_id_of(msg), worker, e.code(), &e.to_string());
            None
        }
    }
}

/// Serves one raw message with `service` as the worker would, minus the
/// kind dispatch: decode, handle, refuse. Returns whether the frame was
/// refused. For tests of one service without a worker.
#[cfg(test)]
pub(crate) fn serve_one<S: Service>(
    service: &mut S,
    worker: u16,
    conn: ConnId,
    msg: &[u8],
    reply: &mut dyn Reply,
    now_ms: u64,
) -> bool {
    let Some(frame) = decode_or_refuse(msg, worker, reply.buf()) else {
        return true;
    };
    let call = Call {
        conn,
        frame,
        now_ms,
    };
    match service.handle(&call, reply) {
        Ok(()) => false,
        Err(r) => {
            refuse(reply.buf(), call.id(), worker, &r);
            true
        }
    }
}
