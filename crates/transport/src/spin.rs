//! When an event loop should poll without blocking: only while it is busy.
//!
//! Polling for a moment after the last event spares a client in a tight
//! request loop the cost of waking the server's thread (an inter-processor
//! interrupt, dear on a virtual machine). But a loop that polls after every
//! event burns its core whenever requests arrive more often than the poll
//! window: a server half idle then shows a full core busy and pays more CPU
//! per operation than one that simply blocks (Redis blocks in `epoll_wait`
//! every time). The polling is worth it only near saturation, where the
//! gaps it fills are short and a wake-up would cost a comparable time.
//!
//! So [`SpinPolicy`] measures the share of the last window the loop spent
//! handling events (not polling) and allows the poll window only while
//! that share is at least [`SPIN_BUSY_MIN_PERCENT`]. A loop at half load
//! blocks like Redis; a saturated one polls through its short gaps.

use std::time::{Duration, Instant};

/// Share of wall time a loop must have spent handling events, over the
/// last [`SPIN_WINDOW_US`], before it polls without blocking, in percent.
/// Above a half-loaded server's share, so such a server blocks.
pub const SPIN_BUSY_MIN_PERCENT: u64 = 70;

/// Length of the window the busy share is measured over, in microseconds:
/// long enough to hold many events, short enough that a burst of load
/// turns polling on within a few milliseconds.
pub const SPIN_WINDOW_US: u64 = 5_000;

/// Whether a loop polls without blocking, from its recent busy share.
#[derive(Debug)]
pub struct SpinPolicy {
    /// The poll window after the last event, when polling is allowed.
    window: Duration,
    /// Start of the current measuring window.
    started: Instant,
    /// Time spent handling events in the current window, in nanoseconds.
    busy_ns: u64,
    /// Whether the last complete window was busy enough to poll.
    spin: bool,
}

impl SpinPolicy {
    /// A policy polling for `window` after the last event while busy.
    pub fn new(window: Duration) -> SpinPolicy {
        SpinPolicy {
            window,
            started: Instant::now(),
            busy_ns: 0,
            spin: false,
        }
    }

    /// The loop handled events from `from` to `to`; closes the measuring
    /// window when it has run its length.
    pub fn busy(&mut self, from: Instant, to: Instant) {
        self.busy_ns = self
            .busy_ns
            .saturating_add(to.saturating_duration_since(from).as_nanos() as u64);
        let elapsed = to.saturating_duration_since(self.started);
        if elapsed >= Duration::from_micros(SPIN_WINDOW_US) {
            self.close_window(elapsed);
            self.started = to;
        }
    }

    /// Whether to poll without blocking, `idle` after the last event.
    /// A loop that stopped reporting work (idle longer than a window)
    /// blocks whatever its last window said.
    pub fn poll_now(&mut self, idle: Duration) -> bool {
        if idle >= Duration::from_micros(SPIN_WINDOW_US) && self.spin {
            let now = Instant::now();
            self.close_window(now.saturating_duration_since(self.started));
            self.started = now;
        }
        self.spin && idle < self.window
    }

    fn close_window(&mut self, elapsed: Duration) {
        let wall_ns = (elapsed.as_nanos() as u64).max(1);
        self.spin = self.busy_ns.saturating_mul(100) >= wall_ns * SPIN_BUSY_MIN_PERCENT;
        self.busy_ns = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_micros(SPIN_WINDOW_US);

    #[test]
    fn a_loop_busy_most_of_a_window_polls_and_a_half_idle_one_blocks() {
        let mut p = SpinPolicy::new(Duration::from_micros(50));
        let t0 = p.started;
        assert!(!p.poll_now(Duration::ZERO), "no measure yet: block");
        // 90% busy over one window.
        p.busy(t0, t0 + WINDOW * 9 / 10);
        p.busy(t0 + WINDOW * 9 / 10, t0 + WINDOW * 9 / 10);
        p.busy(t0 + WINDOW, t0 + WINDOW);
        assert!(p.poll_now(Duration::from_micros(10)));
        assert!(!p.poll_now(Duration::from_micros(60)), "past the window");
        // 50% busy over the next window.
        let t1 = t0 + WINDOW;
        p.busy(t1, t1 + WINDOW / 2);
        p.busy(t1 + WINDOW, t1 + WINDOW);
        assert!(!p.poll_now(Duration::ZERO), "half idle: block");
    }

    #[test]
    fn a_loop_that_went_quiet_stops_polling() {
        let mut p = SpinPolicy::new(Duration::from_secs(1));
        let t0 = p.started;
        p.busy(t0, t0 + WINDOW);
        assert!(p.poll_now(Duration::ZERO));
        // Nothing handled since: a poll after a whole window of quiet
        // closes the window with no work in it.
        std::thread::sleep(WINDOW);
        assert!(!p.poll_now(WINDOW));
    }
}
