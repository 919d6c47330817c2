//! One data-path thread: poll a burst, execute it, flush once, repeat.
//!
//! The request layer: [`Worker::handle`] decodes each frame once, refuses
//! a frame that does not decode (or whose kind no service registered for)
//! with one ERROR frame counted in `frames_refused`, and hands every other
//! frame to the service registered for its kind ([`crate::service`] says
//! what a service is). Services register with [`Worker::register`]: the
//! table of which service owns which kinds is the only place the worker
//! learns of them, and it runs every registered service's jobs, sweeps
//! and counters the same way ([`StatsService`] answers STATS from them).
//!
//! Replies that wait for replication: on a replicating server a
//! connection whose replies may show a write not yet on the backups is
//! held on a gate ticket (its replies stay queued in the port,
//! [`WorkerPort::flush_except`]) while the other connections' replies go
//! and the worker serves on; it reads the acknowledgements after each
//! burst without waiting, and waits for them when idle. So a read served
//! by the worker that serves a writer does not wait for the writer's
//! round, nor does the writer's next request wait for the worker.
//!
//! Idle back-off: after a burst that found nothing the worker keeps polling
//! for `IDLE_SPIN_US` (a client in a tight request loop is answered without
//! a wake-up), then blocks in the transport's wait so an idle server uses
//! no CPU. For the first `IDLE_HOT_SPIN_US` it polls back to back (a
//! request-reply client's next request comes within them); after that it
//! yields its core (`sched_yield`) between polls rather than spinning in
//! place: when threads outnumber cores (clients and servers
//! on one machine, several servers sharing cores) a pure spin holds the
//! core for a whole time slice while a thread with work waits for it.
//! Measured on this project's 2-core machine: three one-worker servers
//! beside one two-worker server (`fabrickv bench cluster`) went from 0.52
//! to 0.55x to 0.74 to 0.90x the throughput and from 1.8 to 2.1x to 0.9 to
//! 1.1x the 100-key multi-get latency, and `bench herd` with two workers
//! from 2.1 to 3.5 Mops; single-worker figures stayed within the noise.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fabrickv_transport::{ConnId, PortStats, Reply, WorkerPort};
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::encode_stats_reply;
use fabrickv_wire::FrameKind;

use crate::service::{
    decode_or_refuse, refuse, Call, Clock, Refusal, Service, StatsList, WorkerView,
};

/// Most messages handled per burst before replies are flushed. Small on
/// purpose: a client keeps several frames in flight, and flushing after
/// every few lets it check replies while the rest execute; flushing only
/// after its whole window puts client and server in lock step, each idle
/// while the other works. Measured on this project's 2-core machine (HERD
/// mix, one worker, 8 frames in flight): 4 gave 14.9 Mops over shm and 6.9
/// over tcp; 64 gave 8.4 and 5.2. Each frame already batches up to
/// `BATCH_OPS_MAX` operations, so a flush still carries many.
pub const POLL_BURST_MSGS: usize = 4;

/// How long an idle worker keeps polling before it blocks, in microseconds.
pub const IDLE_SPIN_US: u64 = 100;

/// How long of that an idle worker polls without yielding its core, in
/// microseconds: a client in a request-reply loop sends its next request
/// about a microsecond after it reads a reply, and a `sched_yield`
/// between polls (half a microsecond or more) is then on the path of
/// every request. Short enough that a worker sharing its core with other
/// threads gives it up almost at once.
pub const IDLE_HOT_SPIN_US: u64 = 5;

/// Longest block in the transport's wait, in milliseconds; bounds how late
/// the TTL sweep runs on an idle server.
pub const IDLE_WAIT_MS: u64 = 200;

/// Longest wait of an idle worker holding replies for the
/// acknowledgements that release them, in microseconds, on a port with
/// an input descriptor ([`WorkerPort::input_fd`]): input and a completed
/// round (through the port's waker) end it sooner.
pub const HELD_WAIT_US: u64 = 1_000;

/// The same on a port without one, which is polled again after it: the
/// longest a request arriving meanwhile waits.
pub const HELD_WAIT_BLIND_US: u64 = 20;

/// How often the TTL sweep runs, in milliseconds.
pub const SWEEP_INTERVAL_MS: u64 = 100;

/// Most services one worker registers. The route table names a service
/// by a byte; the server registers seven (kv, ps, cache, shard, HELLO,
/// STATS, PARTITIONS), so this leaves room without a wider table.
pub const SERVICES_MAX: usize = 32;

/// Frame kinds the route table covers: every value of the header's kind
/// byte, so a lookup needs no bounds check beyond the byte itself.
const KIND_SLOTS: usize = 256;

/// The route table's mark for a kind no service registered for.
const NO_SERVICE: u8 = u8::MAX;

const _: () = assert!(SERVICES_MAX < NO_SERVICE as usize);

/// Why a service could not be registered: a mistake in the code that
/// builds a worker, reported at start.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegisterError {
    /// Another service registered this kind first.
    KindTaken(FrameKind),
    /// The worker holds [`SERVICES_MAX`] services already.
    TooMany,
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterError::KindTaken(k) => write!(f, "frame kind {k:?} has a service already"),
            RegisterError::TooMany => write!(f, "more than {SERVICES_MAX} services on one worker"),
        }
    }
}

impl std::error::Error for RegisterError {}

/// How the loop takes and answers its bursts. The server runs the
/// defaults; `fabrickv bench rpc` can change them to measure their effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopKnobs {
    /// Most messages taken per poll (batched receive); 1 disables it.
    pub poll_burst: usize,
    /// Flush the replies of a burst together (true, one write or ring
    /// publish per connection: the analogue of RDMA doorbell batching)
    /// or each on its own.
    pub batched_send: bool,
}

impl Default for LoopKnobs {
    fn default() -> Self {
        LoopKnobs {
            poll_burst: POLL_BURST_MSGS,
            batched_send: true,
        }
    }
}

/// The request layer of one worker, without I/O: each message in is
/// decoded once, refused once when it must be, and otherwise handed to
/// the service registered for its kind.
pub struct Worker {
    /// This worker's id, sent in every reply header.
    id: u16,
    /// The services, in registration order.
    services: Vec<Box<dyn Service>>,
    /// For each value of the kind byte, the index of its service in
    /// `services`, or [`NO_SERVICE`].
    route: [u8; KIND_SLOTS],
    /// Frames refused whole with an ERROR frame, by any service or here.
    frames_refused: u64,
    /// The worker port's counters as of the current burst, for STATS.
    transport: PortStats,
    /// What replies wait for before they leave (a replicating server's
    /// replicator), if anything.
    gate: Option<std::sync::Arc<crate::gate::FlushGate>>,
    /// While the gate is armed, the connections whose replies of this
    /// burst may show a write not yet replicated (repeats allowed).
    unsettled: Vec<ConnId>,
    /// Connections whose queued replies wait for a gate ticket, each with
    /// the newest ticket its replies need, in connection order.
    held: Vec<(ConnId, u64)>,
    /// The ids in `held`, in order, as the port's flush takes them.
    held_ids: Vec<ConnId>,
    /// Whether a queued job made replies this burst (for connections the
    /// worker did not see): the burst then waits for the gate whole.
    jobs_replied: bool,
    /// The flag the gate sets while this worker holds replies, so that a
    /// completed round wakes it ([`crate::gate::FlushGate::add_waiter`]).
    holding: Option<std::sync::Arc<AtomicBool>>,
    /// This worker's place among the threads a hand-over waits out
    /// ([`crate::quiesce`]), if the server moves slots.
    participant: Option<crate::quiesce::Participant>,
}

impl Worker {
    /// The request layer of worker `id`, with no service yet.
    pub fn new(id: u16) -> Worker {
        Worker {
            id,
            services: Vec::with_capacity(SERVICES_MAX),
            route: [NO_SERVICE; KIND_SLOTS],
            frames_refused: 0,
            transport: PortStats::default(),
            gate: None,
            unsettled: Vec::new(),
            held: Vec::new(),
            held_ids: Vec::new(),
            jobs_replied: false,
            holding: None,
            participant: None,
        }
    }

    /// Makes every flush of this worker's replies pass `gate` first.
    pub fn with_gate(mut self, gate: std::sync::Arc<crate::gate::FlushGate>) -> Worker {
        self.gate = Some(gate);
        self
    }

    /// Makes this worker say when it is between bursts, so that a change
    /// of what it serves can wait out the commands that began before it.
    pub fn with_quiescence(mut self, q: &crate::quiesce::Quiescence) -> Worker {
        self.participant = Some(q.participant());
        self
    }

    /// Waits for the gate, if there is one, before the burst's replies
    /// are flushed; every reply held before is then free to go too.
    #[inline]
    fn before_flush(&mut self) {
        if let Some(g) = &self.gate {
            g.before_flush();
            self.unsettled.clear();
            self.held.clear();
            self.jobs_replied = false;
            self.set_holding(false);
        }
    }

    /// Whether the gate is armed: replies may have to wait.
    #[inline]
    fn gated(&self) -> bool {
        self.gate.as_ref().is_some_and(|g| g.is_armed())
    }

    /// Flushes the burst's replies once the server may stand behind them.
    /// With the gate armed, on a port that holds replies: a connection
    /// whose replies may show a write not yet replicated is held on a
    /// ticket for every write made so far (which launches the round that
    /// replicates them) and the others' replies go now; a held
    /// connection goes once its ticket is done. The worker meanwhile
    /// serves its other connections, as the text front ends' loops do.
    /// Elsewhere it waits for the gate first, then flushes everything.
    fn flush_replies(&mut self, port: &mut dyn WorkerPort) {
        let Some(g) = self.gate.as_ref().filter(|g| g.is_armed()).cloned() else {
            flush_logged(port);
            return;
        };
        if self.jobs_replied || !port.holds_replies() {
            self.before_flush();
            flush_logged(port);
            return;
        }
        if !self.unsettled.is_empty() {
            if let Some(t) = g.ticket() {
                self.unsettled.sort_unstable();
                self.unsettled.dedup();
                // `held` stays sorted by connection: a worker may hold
                // thousands, and the port looks each dirty one up.
                for &c in &self.unsettled {
                    match self.held.binary_search_by_key(&c, |&(h, _)| h) {
                        Ok(i) => self.held[i].1 = self.held[i].1.max(t),
                        Err(i) => self.held.insert(i, (c, t)),
                    }
                }
            }
            self.unsettled.clear();
        }
        if !self.held.is_empty() {
            // Takes the acknowledgements already come, without waiting: a
            // busy worker is never idle long enough to wait for them.
            g.wait(None, Duration::ZERO);
        }
        self.held.retain(|&(_, t)| !g.done(t));
        if self.held.is_empty() {
            self.set_holding(false);
            flush_logged(port);
            return;
        }
        self.set_holding(true);
        self.held_ids.clear();
        self.held_ids.extend(self.held.iter().map(|&(c, _)| c));
        if let Err(e) = port.flush_except(&self.held_ids) {
            tracing::error!("worker flush failed: {e}");
        }
    }

    /// Notes whether this worker holds replies: while it does, the gate
    /// wakes its port when rounds complete.
    fn set_holding(&mut self, on: bool) {
        if let Some(h) = &self.holding {
            h.store(on, Ordering::Release);
        }
    }

    /// Registers `port`'s waker with the gate, so that a worker holding
    /// replies and waiting in the port is woken when rounds complete.
    fn watch_gate(&mut self, port: &dyn WorkerPort) {
        if let (Some(g), None) = (&self.gate, &self.holding) {
            let waker = port.waker();
            self.holding = Some(g.add_waiter(Box::new(move || waker.wake())));
        }
    }

    /// For an idle worker holding replies: waits up to `timeout` for the
    /// acknowledgements that release them (reading them in this thread)
    /// or for input on `port`. Returns false if it did not wait.
    fn wait_for_held(&self, port: &dyn WorkerPort, timeout: Duration) -> bool {
        match &self.gate {
            Some(g) if !self.held.is_empty() => g.wait(port.input_fd(), timeout),
            _ => false,
        }
    }

    /// This worker's id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Registers `service` for the kinds it names. Its counters follow
    /// those of the services registered before it in a STATS reply.
    pub fn register(&mut self, service: Box<dyn Service>) -> Result<(), RegisterError> {
        if self.services.len() >= SERVICES_MAX {
            return Err(RegisterError::TooMany);
        }
        let kinds = service.kinds();
        if let Some(&k) = kinds
            .iter()
            .find(|&&k| self.route[k as usize] != NO_SERVICE)
        {
            return Err(RegisterError::KindTaken(k));
        }
        let index = self.services.len() as u8;
        for &k in kinds {
            self.route[k as usize] = index;
        }
        self.services.push(service);
        Ok(())
    }

    /// [`Worker::register`] for several services, in order.
    pub fn with(
        mut self,
        services: impl IntoIterator<Item = Box<dyn Service>>,
    ) -> Result<Worker, RegisterError> {
        for s in services {
            self.register(s)?;
        }
        Ok(self)
    }

    /// Handles one message from connection `conn`, appending the reply.
    ///
    /// This is the one place every frame passes after it is decoded and
    /// before any service sees it, with its connection and kind at hand:
    /// a per-connection check (has this connection authenticated?) and a
    /// per-op one (a [`Service`] method saying whether a call is
    /// administrative) belong between the decode and the dispatch, and a
    /// refusal there is answered and counted like any other.
    ///
    /// Returns the frame's operations (at least one), which the loop
    /// counts toward the port's [`WorkerPort::flush_after_ops`].
    #[inline]
    pub fn handle(
        &mut self,
        conn: ConnId,
        msg: &[u8],
        reply: &mut dyn Reply,
        now_ms: u64,
    ) -> usize {
        let gated = self.gated();
        if gated {
            crate::gate::request_begins();
        }
        let ops = self.dispatch(conn, msg, reply, now_ms);
        if gated && !crate::gate::request_is_settled() {
            self.unsettled.push(conn);
        }
        ops
    }

    /// [`Worker::handle`] less the gate's bookkeeping.
    #[inline]
    fn dispatch(&mut self, conn: ConnId, msg: &[u8], reply: &mut dyn Reply, now_ms: u64) -> usize {
        let Some(frame) = decode_or_refuse(msg, self.id, reply.buf()) else {
            self.frames_refused += 1;
            return 1;
        };
        let kind = frame.header.kind;
        let ops = usize::from(frame.header.op_count).max(1);
        // NO_SERVICE is past the end, and splits off an empty tail.
        let index = usize::from(self.route[kind as usize]).min(self.services.len());
        let done = match self.services.split_at_mut(index) {
            (before, [this, after @ ..]) => {
                let call = Call {
                    conn,
                    frame,
                    now_ms,
                    worker: WorkerView {
                        id: self.id,
                        frames_refused: self.frames_refused,
                        transport: &self.transport,
                        before,
                        after,
                    },
                };
                this.handle(&call, reply)
            }
            _ => Err(not_served(kind)),
        };
        if let Err(r) = done {
            self.frames_refused += 1;
            refuse(reply.buf(), frame.header.request_id, self.id, &r);
        }
        ops
    }

    /// Records the transport's counters, to be reported by STATS.
    pub fn set_transport_stats(&mut self, s: PortStats) {
        self.transport = s;
    }

    /// Runs every service's queued jobs; returns how many ran.
    pub fn run_jobs(&mut self, port: &mut dyn WorkerPort) -> usize {
        let n = self.services.iter_mut().map(|s| s.run_jobs(port)).sum();
        // Their replies leave with this burst's, which then waits whole.
        self.jobs_replied |= n > 0;
        n
    }

    /// Runs every service's periodic work.
    pub fn sweep(&mut self, now_ms: u64) {
        for s in &mut self.services {
            s.sweep(now_ms);
        }
    }

    /// The counters a STATS reply carries ([`stats_list`]).
    pub fn stats_list(&self) -> StatsList {
        stats_list(&WorkerView {
            id: self.id,
            frames_refused: self.frames_refused,
            transport: &self.transport,
            before: &self.services,
            after: &[],
        })
    }
}

/// The refusal of a frame whose kind no service registered for (a reply
/// kind sent to the server, or a service this server does not run).
fn not_served(kind: FrameKind) -> Refusal {
    (
        ErrorCode::UnknownOpcode,
        format!("{kind:?} is not a request this server serves"),
    )
}

/// The counters a STATS reply carries, in order: each service's own in
/// registration order, the worker's (`frames_refused`), the transport's,
/// then (worker 0 only) the shared stores', in registration order.
pub fn stats_list(w: &WorkerView<'_>) -> StatsList {
    let mut list = StatsList::with_capacity(64);
    for s in w.services() {
        s.stats(&mut list);
    }
    let t = w.transport;
    list.extend([
        ("frames_refused", w.frames_refused),
        ("conns_accepted", t.conns_accepted),
        ("conns_open", t.conns_open),
        ("conns_closed_framing", t.conns_closed_framing),
        ("conns_closed_timeout", t.conns_closed_timeout),
        ("msgs_in", t.msgs_in),
        ("msgs_out", t.msgs_out),
        ("backpressure_pauses", t.backpressure_pauses),
        ("spliced_bytes", t.spliced_bytes),
    ]);
    // The shared stores: worker 0 alone reports them, so clients that add
    // up workers count them once.
    if w.id == 0 {
        for s in w.services() {
            s.shared_stats(&mut list);
        }
    }
    list
}

/// The STATS service: answers with the counters of every other service
/// registered on the worker, the worker's and the transport's.
#[derive(Debug, Default)]
pub struct StatsService;

impl Service for StatsService {
    fn kinds(&self) -> &'static [FrameKind] {
        &[FrameKind::Stats]
    }

    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        let list = stats_list(&call.worker);
        encode_stats_reply(reply.buf(), call.id(), call.worker.id, &list);
        Ok(())
    }
}

/// Runs a worker with the server's knobs until `stop` is set.
pub fn run(port: Box<dyn WorkerPort>, worker: Worker, clock: Clock, stop: &AtomicBool) {
    run_with(port, worker, clock, LoopKnobs::default(), stop);
}

/// Runs a worker until `stop` is set: jobs, a burst of up to
/// `knobs.poll_burst` messages, one flush (or one per message without
/// `batched_send`), the sweep when due, then spin or wait when idle.
pub fn run_with(
    mut port: Box<dyn WorkerPort>,
    mut worker: Worker,
    clock: Clock,
    knobs: LoopKnobs,
    stop: &AtomicBool,
) {
    let burst = Burst::of(knobs, port.as_ref());
    if burst.batched && port.holds_replies() {
        worker.watch_gate(port.as_ref());
    }
    let held_wait = Duration::from_micros(if port.input_fd().is_some() {
        HELD_WAIT_US
    } else {
        HELD_WAIT_BLIND_US
    });
    let mut idle_since: Option<Instant> = None;
    let mut last_sweep = clock.now_ms();
    // Every turn is busy from its start; a turn about to block says it
    // is quiet first (spinning turns follow each other, each a new one).
    let mut participant = worker.participant.take();
    if let Some(p) = &participant {
        p.attach();
    }
    while !stop.load(Ordering::Acquire) {
        if let Some(p) = participant.as_mut() {
            p.busy();
        }
        // One clock read a turn, for the services and for the idle
        // back-off both: each read is a vDSO call, and the two a turn
        // took were 3-4% of a spinning worker's samples under perf.
        let turn = Instant::now();
        let now = clock.ms_at(turn);
        // STATS replies report the transport's counters.
        worker.set_transport_stats(port.stats());
        let jobs = worker.run_jobs(port.as_mut());
        let polled = one_burst(port.as_mut(), &mut worker, burst, now);
        let handled = match polled {
            Ok(n) => n + jobs,
            Err(e) => {
                tracing::error!("worker poll failed: {e}");
                break;
            }
        };
        if now.saturating_sub(last_sweep) >= SWEEP_INTERVAL_MS {
            worker.sweep(now);
            last_sweep = now;
        }
        if handled > 0 {
            idle_since = None;
            continue;
        }
        let idle_for = turn.saturating_duration_since(*idle_since.get_or_insert(turn));
        if let Some(p) = participant.as_mut() {
            p.quiet();
        }
        // Holding replies: wait for what releases them (or for input).
        if worker.wait_for_held(port.as_ref(), held_wait) {
            continue;
        }
        if idle_for < Duration::from_micros(IDLE_HOT_SPIN_US) {
            std::hint::spin_loop();
            continue;
        }
        if idle_for < Duration::from_micros(IDLE_SPIN_US) {
            // Lets a runnable thread have this core; returns at once when
            // there is none.
            std::thread::yield_now();
            continue;
        }
        if let Err(e) = port.wait(Duration::from_millis(IDLE_WAIT_MS)) {
            tracing::error!("worker wait failed: {e}");
            break;
        }
    }
}

/// How a worker's bursts run, fixed for its life: the loop's knobs and
/// what its port says a flush is worth.
#[derive(Debug, Clone, Copy)]
struct Burst {
    /// Messages per poll (`LoopKnobs::poll_burst`, at least 1).
    msgs: usize,
    /// Replies flushed together (`LoopKnobs::batched_send`).
    batched: bool,
    /// Operations before a flush ([`WorkerPort::flush_after_ops`]).
    ops_max: usize,
}

impl Burst {
    fn of(knobs: LoopKnobs, port: &dyn WorkerPort) -> Burst {
        Burst {
            msgs: knobs.poll_burst.max(1),
            batched: knobs.batched_send,
            ops_max: port.flush_after_ops(),
        }
    }
}

/// One burst. When batched (the default), its replies are flushed
/// together: polls of up to `msgs` messages while a poll comes back full
/// and fewer than `ops_max` operations are done (each frame counts its
/// operations, at least one; a single poll when `msgs` is 1, the knob
/// that turns batched receive off, or when the port flushes cheaply).
/// Otherwise each reply is flushed on its own, up to `msgs` messages.
#[inline]
fn one_burst(
    port: &mut dyn WorkerPort,
    worker: &mut Worker,
    b: Burst,
    now: u64,
) -> Result<usize, fabrickv_transport::TransportError> {
    let mut n = 0;
    if !b.batched {
        while n < b.msgs {
            let (k, _) = poll_into(port, worker, 1, now)?;
            worker.before_flush();
            flush_logged(port);
            if k == 0 {
                break;
            }
            n += k;
        }
        return Ok(n);
    }
    let mut ops = 0;
    loop {
        let (k, o) = poll_into(port, worker, b.msgs, now)?;
        n += k;
        ops += o;
        if b.msgs == 1 || k < b.msgs || ops >= b.ops_max {
            break;
        }
    }
    worker.flush_replies(port);
    Ok(n)
}

/// One poll of up to `max` messages, each handled by `worker`; returns
/// the messages and the operations they carried.
#[inline]
fn poll_into(
    port: &mut dyn WorkerPort,
    worker: &mut Worker,
    max: usize,
    now: u64,
) -> Result<(usize, usize), fabrickv_transport::TransportError> {
    let mut ops = 0;
    let k = port.poll(max, &mut |conn, msg, reply| {
        ops += worker.handle(conn, msg, reply, now);
    })?;
    Ok((k, ops))
}

/// Sends the queued replies; a failed flush is logged (the transport
/// closes what it must) and the loop goes on.
#[inline]
fn flush_logged(port: &mut dyn WorkerPort) {
    if let Err(e) = port.flush() {
        tracing::error!("worker flush failed: {e}");
    }
}

#[cfg(test)]
mod tests;
