//! The request layer's contract: what a service is, what it is handed,
//! and how a refused frame is answered.
//!
//! The worker ([`crate::worker`]) decodes every frame once, refuses what
//! does not decode, and hands each frame, decoded, to the one service
//! registered for its kind (kv, ps, cache, shard, HELLO, STATS,
//! PARTITIONS in the server; ECHO in `fabrickv bench rpc`). A service
//! appends its reply, or returns a [`Refusal`] that the worker turns into
//! an ERROR frame and counts in `frames_refused`. The services know
//! nothing of each other: this module, the clock and the refusal helpers
//! are all they share.

use std::time::Instant;

use fabrickv_transport::{ConnId, PortStats, Reply, WorkerPort};
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::encode_error;
use fabrickv_wire::{decode_frame, Frame, FrameKind, WireError};

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
        self.ms_at(Instant::now())
    }

    /// Instant `t` in engine milliseconds, for a caller that has read the
    /// clock already.
    #[inline]
    pub fn ms_at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.start).as_millis() as u64 + 1
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// One decoded request frame and what came with it, as the worker hands
/// it to the service registered for its kind.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    /// The connection the frame arrived on: the cache ties chunked puts
    /// and BIND to it, and a per-connection check (authentication) has it
    /// at hand in the worker before any service runs.
    pub conn: ConnId,
    /// The frame, decoded once by the worker (header checked, checksum
    /// verified); its kind is one the service registered for.
    pub frame: Frame<'a>,
    /// The time, in engine milliseconds, for the whole burst.
    pub now_ms: u64,
    /// The worker serving the call: its id, its own counters and the
    /// other services, for a service that reports on the whole worker
    /// (STATS).
    pub worker: WorkerView<'a>,
}

impl Call<'_> {
    /// The request id, echoed in every reply to this frame.
    #[inline]
    pub fn id(&self) -> u64 {
        self.frame.header.request_id
    }
}

/// What a call sees of the worker beyond its own service. Borrowed for
/// the one call: building it costs a few stores, no allocation.
#[derive(Clone, Copy)]
pub struct WorkerView<'a> {
    /// The worker's id, sent in every reply header.
    pub id: u16,
    /// Frames the worker refused whole with an ERROR frame so far.
    pub frames_refused: u64,
    /// The worker port's counters as of the current burst.
    pub transport: &'a PortStats,
    /// The services registered before the one called, in order.
    pub(crate) before: &'a [Box<dyn Service>],
    /// The services registered after the one called, in order.
    pub(crate) after: &'a [Box<dyn Service>],
}

/// The counters of a worker that has served nothing yet.
static NO_TRANSPORT_STATS: PortStats = PortStats {
    conns_accepted: 0,
    conns_open: 0,
    conns_closed_framing: 0,
    conns_closed_timeout: 0,
    msgs_in: 0,
    msgs_out: 0,
    backpressure_pauses: 0,
    spliced_bytes: 0,
};

impl WorkerView<'static> {
    /// A view of a worker with no other service (a service tested alone).
    pub fn alone(id: u16) -> WorkerView<'static> {
        WorkerView {
            id,
            frames_refused: 0,
            transport: &NO_TRANSPORT_STATS,
            before: &[],
            after: &[],
        }
    }
}

impl<'a> WorkerView<'a> {
    /// The other services of the worker, in registration order.
    pub fn services(&self) -> impl Iterator<Item = &'a dyn Service> {
        self.before.iter().chain(self.after).map(|s| &**s)
    }
}

/// A service of one worker: the handler of one or more frame kinds,
/// registered on a [`crate::worker::Worker`] under the kinds it names.
///
/// The worker holds its services in a table and picks one by the frame's
/// kind: one indirect call per frame, no allocation, lock or branch per
/// service.
pub trait Service: Send {
    /// The frame kinds this service answers; each kind has one service.
    fn kinds(&self) -> &'static [FrameKind];

    /// Handles one frame of a kind this service registered for, appending
    /// its reply to `reply`. `Err` means the frame is refused whole:
    /// nothing was appended, and the worker answers with an ERROR frame
    /// carrying the refusal's code and words, counted in
    /// `frames_refused`.
    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal>;

    /// This worker's counters of this service, appended to a STATS reply
    /// in registration order.
    fn stats(&self, _out: &mut StatsList) {}

    /// Counters of a store every worker shares, appended to a STATS reply
    /// by worker 0 alone so that clients adding up workers count them once.
    fn shared_stats(&self, _out: &mut StatsList) {}

    /// Work queued to this worker from other threads, run between bursts
    /// with the worker's port; returns how many jobs ran.
    fn run_jobs(&mut self, _port: &mut dyn WorkerPort) -> usize {
        0
    }

    /// Periodic background work (expiry, abandoned transfers), run every
    /// [`crate::worker::SWEEP_INTERVAL_MS`].
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
pub fn serve_one(
    service: &mut dyn Service,
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
        worker: WorkerView::alone(worker),
    };
    match service.handle(&call, reply) {
        Ok(()) => false,
        Err(r) => {
            refuse(reply.buf(), call.id(), worker, &r);
            true
        }
    }
}
