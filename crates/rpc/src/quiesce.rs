//! Knowing when every request thread has finished the commands it began
//! before some change (quiescent-state tracking, as read-copy-update does).
//!
//! A server that stops serving a group of slots (a move hands it to
//! another server) must know when no command that saw the group served is
//! still running, before it takes its last replication round. Waiting a
//! fixed time covers a thread descheduled for less than that and costs the
//! whole wait on every hand-over; here each thread that runs commands says
//! when it is between commands, and a waiter learns the moment every
//! thread has been there since the change.
//!
//! Each [`Participant`] (one per worker or event loop) publishes a turn
//! number: odd while it runs commands, even while it waits for input.
//! [`Quiescence::begin`], called after the change is visible, notes every
//! thread then in a turn; [`Grace::passed`] once each of those has left
//! it. A thread that was waiting when the grace began reads the change
//! in its next turn: a barrier between each side's store and its later
//! loads makes at least one side see the other's store. The waiter's side
//! is rare and the threads' side runs every turn (an idle worker's spin
//! too: a hardware fence there cost 5-10% of a one-request-at-a-time shm
//! client's rate), so the waiter pays for both: it asks the kernel for a
//! barrier on every thread of the process (`membarrier`, private
//! expedited), and a turn's start needs only a compiler fence. Where the
//! kernel refuses that, both sides use a sequentially consistent fence.

use std::cell::RefCell;
use std::sync::atomic::{compiler_fence, fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rustix::thread::{membarrier, MembarrierCommand};

/// Whether this process registered for expedited process-wide barriers:
/// a turn's start then needs no hardware fence.
static EXPEDITED: AtomicBool = AtomicBool::new(false);

/// Registers the process for expedited barriers, once ([`EXPEDITED`] says
/// whether the kernel took it).
fn register_expedited() {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        let ok = membarrier(MembarrierCommand::RegisterPrivateExpedited).is_ok();
        EXPEDITED.store(ok, Ordering::SeqCst);
    });
}

/// The waiter's half of the barrier pair (see the module's text).
fn waiter_barrier() {
    fence(Ordering::SeqCst);
    if EXPEDITED.load(Ordering::Relaxed)
        && membarrier(MembarrierCommand::PrivateExpedited).is_err()
        && membarrier(MembarrierCommand::Global).is_err()
    {
        // Registered, so the kernel has it; were it ever refused, every
        // thread in a turn is still waited for, and a thread that starts
        // one just now leaves it within microseconds: the grace may end a
        // turn early only for a thread that began it in this instant.
        tracing::warn!("membarrier refused after registration; a hand-over grace is best effort");
    }
}

thread_local! {
    /// The state of the participant whose thread this is, once attached:
    /// [`paused`] marks it quiet while a command waits.
    static MINE: RefCell<Option<Arc<AtomicU64>>> = const { RefCell::new(None) };
}

/// The low bit of a participant's state: set while it runs commands.
const BUSY: u64 = 1;

/// Every thread that runs commands, as far as quiescence goes.
#[derive(Debug)]
pub struct Quiescence {
    threads: Mutex<Vec<Arc<AtomicU64>>>,
}

impl Default for Quiescence {
    /// A set with no thread yet; the process registers for the waiter's
    /// barriers first.
    fn default() -> Quiescence {
        register_expedited();
        Quiescence {
            threads: Mutex::new(Vec::new()),
        }
    }
}

/// One thread's place in a [`Quiescence`]; it is quiet for good once
/// dropped. Only its own thread changes its state, which only grows.
#[derive(Debug)]
pub struct Participant {
    state: Arc<AtomicU64>,
}

/// The threads that were running commands when a grace period began, with
/// the turn each was in.
#[derive(Debug)]
pub struct Grace {
    busy: Vec<(Arc<AtomicU64>, u64)>,
}

impl Quiescence {
    /// A set with no thread yet.
    pub fn new() -> Arc<Quiescence> {
        Arc::new(Quiescence::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<AtomicU64>>> {
        self.threads.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one more thread, quiet until its first turn.
    pub fn participant(&self) -> Participant {
        let state = Arc::new(AtomicU64::new(0));
        let mut threads = self.lock();
        // Places whose thread has gone (only the set holds them).
        threads.retain(|s| Arc::strong_count(s) > 1);
        threads.push(state.clone());
        Participant { state }
    }

    /// Begins a grace period: call it once the change is visible to every
    /// thread's next read. It has passed once every thread running
    /// commands now has finished its turn.
    pub fn begin(&self) -> Grace {
        // Pairs with the barrier in `busy`: a thread whose busy turn this
        // does not see reads the change after its barrier.
        waiter_barrier();
        let busy = self
            .lock()
            .iter()
            .filter_map(|s| {
                let v = s.load(Ordering::Acquire);
                (v & BUSY != 0).then(|| (s.clone(), v))
            })
            .collect();
        Grace { busy }
    }

    /// How many threads take part (those whose participant is dropped
    /// included until the next one joins).
    pub fn threads(&self) -> usize {
        self.lock().len()
    }
}

impl Participant {
    /// Makes this the participant of the calling thread, for [`paused`].
    pub fn attach(&self) {
        MINE.with(|m| *m.borrow_mut() = Some(self.state.clone()));
    }

    /// Starts a turn: from here until [`Participant::quiet`] (or the next
    /// `busy`), commands this thread runs may have read what a waiter
    /// changed before or after. Call it before the turn's first read of
    /// shared routing.
    #[inline]
    pub fn busy(&mut self) {
        busy(&self.state);
    }

    /// Ends the turn: the thread is about to wait and runs nothing until
    /// its next [`Participant::busy`].
    #[inline]
    pub fn quiet(&mut self) {
        quiet(&self.state);
    }
}

#[inline]
fn busy(state: &AtomicU64) {
    let s = state.load(Ordering::Relaxed);
    // The next odd number: a new turn, whether or not one was running.
    let next = (s | BUSY) + 2 * (s & BUSY);
    // Release: a waiter that sees this turn sees the last one's work.
    state.store(next, Ordering::Release);
    if EXPEDITED.load(Ordering::Relaxed) {
        // The waiter's membarrier orders this store before the loads
        // that follow on this thread, wherever it runs.
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

#[inline]
fn quiet(state: &AtomicU64) {
    let s = state.load(Ordering::Relaxed);
    if s & BUSY != 0 {
        state.store(s + 1, Ordering::Release);
    }
}

/// Runs `wait` with the calling thread counted as quiet, then starts a new
/// turn: for a command that waits (in its turn) for something a grace may
/// itself be waiting on, before it has read or changed anything it will
/// act on. The commands before it in the turn have run; the caller reads
/// shared state again after. Without an attached participant it only
/// runs `wait`.
pub fn paused<R>(wait: impl FnOnce() -> R) -> R {
    let mine = MINE.with(|m| m.borrow().clone());
    let Some(state) = mine else {
        return wait();
    };
    quiet(&state);
    let r = wait();
    busy(&state);
    r
}

impl Drop for Participant {
    fn drop(&mut self) {
        self.quiet();
        MINE.with(|m| {
            let mut m = m.borrow_mut();
            if m.as_ref().is_some_and(|s| Arc::ptr_eq(s, &self.state)) {
                *m = None;
            }
        });
    }
}

impl Grace {
    /// Whether every thread that was running commands when the grace
    /// began has finished that turn.
    pub fn passed(&mut self) -> bool {
        self.busy.retain(|(s, v)| s.load(Ordering::Acquire) == *v);
        self.busy.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    #[test]
    fn a_grace_waits_for_the_threads_in_a_turn_and_no_other() {
        let q = Quiescence::new();
        let mut a = q.participant();
        let mut b = q.participant();
        let _never = q.participant();
        a.busy();
        b.busy();
        b.quiet();
        let mut g = q.begin();
        assert!(!g.passed(), "a is in the turn it began before the grace");
        // b's next turn began after the grace: it is not waited for.
        b.busy();
        assert!(!g.passed());
        a.quiet();
        assert!(g.passed());
        // A thread in a turn through several graces is waited for by each.
        b.quiet();
        a.busy();
        let mut g1 = q.begin();
        let mut g2 = q.begin();
        assert!(!g1.passed() && !g2.passed());
        a.busy();
        assert!(g1.passed() && g2.passed());
    }

    #[test]
    fn a_thread_waiting_in_paused_is_not_waited_for() {
        let q = Quiescence::new();
        let mut a = q.participant();
        a.attach();
        a.busy();
        let mut g = q.begin();
        assert!(!g.passed());
        let mut inner = None;
        paused(|| {
            // A grace begun while the thread waits does not wait for it,
            // and the one begun before is over.
            inner = Some(q.begin().passed());
            assert!(g.passed());
        });
        assert_eq!(inner, Some(true));
        // Back in a turn after the wait.
        assert!(!q.begin().passed());
        a.quiet();
    }

    #[test]
    fn a_dropped_participant_is_never_waited_for() {
        let q = Quiescence::new();
        let mut a = q.participant();
        a.busy();
        drop(a);
        assert!(q.begin().passed());
        let _b = q.participant();
        assert_eq!(q.threads(), 1, "the dropped one's place is reclaimed");
    }

    /// The property a hand-over relies on: once a grace that began after a
    /// change has passed, no thread is still running a command that read
    /// the state from before it.
    #[test]
    fn after_a_grace_no_command_that_saw_the_old_state_is_running() {
        let q = Quiescence::new();
        let changed = Arc::new(AtomicBool::new(false));
        // Commands that saw the old state and have not finished.
        let stale_running = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let mut p = q.participant();
                let (changed, stale, stop) = (changed.clone(), stale_running.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        p.busy();
                        if !changed.load(Ordering::Relaxed) {
                            stale.fetch_add(1, Ordering::SeqCst);
                            std::hint::spin_loop();
                            stale.fetch_sub(1, Ordering::SeqCst);
                        }
                        p.quiet();
                        std::thread::yield_now();
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        changed.store(true, Ordering::SeqCst);
        let mut g = q.begin();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !g.passed() {
            assert!(Instant::now() < deadline, "the grace never passed");
            std::thread::yield_now();
        }
        assert_eq!(stale_running.load(Ordering::SeqCst), 0);
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().expect("a participant thread panicked");
        }
    }
}
