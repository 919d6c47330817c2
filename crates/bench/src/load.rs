//! The pipelined native load one client thread puts on a server, shared by
//! `bench kv` and `bench partition-move`: frames of random GETs and PUTs
//! over the keys each worker owns, up to `in_flight` frames per worker,
//! replies handed to the caller (who checks them and records latency), and
//! a short poll before blocking when nothing came.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use fabrickv_client::Client;
use fabrickv_wire::{PutCondition, RequestBuilder};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::keys::{fill_value, make_key};

/// How long a client thread busy-polls for replies before it blocks, in
/// microseconds.
pub const CLIENT_SPIN_US: u64 = 200;

/// A frame in flight: its request id, when it left, and what it asked
/// (key index, whether a GET) in order.
pub struct Sent {
    pub id: u64,
    pub at: Instant,
    pub ops: Vec<(u64, bool)>,
}

/// What each frame holds and how many are kept in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Operations per frame.
    pub batch: usize,
    /// Frames in flight per worker.
    pub in_flight: usize,
    /// Share of GETs, in percent (the rest are PUTs).
    pub get_percent: u32,
    /// Key size in bytes.
    pub key_size: usize,
    /// Value size in bytes.
    pub value_size: usize,
}

impl Default for Shape {
    /// HERD's mix: 16-byte keys, 32-byte values, 95% GETs, 16 operations
    /// per frame and 8 frames in flight.
    fn default() -> Self {
        Shape {
            batch: 16,
            in_flight: 8,
            get_percent: 95,
            key_size: 16,
            value_size: 32,
        }
    }
}

/// One thread's load: its frames in flight per worker and its scratch.
pub struct Load {
    shape: Shape,
    queues: Vec<VecDeque<Sent>>,
    /// Operation lists of answered frames, reused by the next ones.
    spare: Vec<Vec<(u64, bool)>>,
    key: Vec<u8>,
    value: Vec<u8>,
    rng: SmallRng,
    idle_since: Option<Instant>,
    timeout: Duration,
}

impl Load {
    /// A load over `workers` workers, its random draws seeded by `seed`;
    /// a frame unanswered for `timeout` fails it.
    pub fn new(workers: usize, seed: u64, shape: Shape, timeout: Duration) -> Load {
        Load {
            shape,
            queues: (0..workers).map(|_| VecDeque::new()).collect(),
            spare: Vec::new(),
            key: Vec::with_capacity(shape.key_size),
            value: vec![0u8; shape.value_size],
            rng: SmallRng::seed_from_u64(seed),
            idle_since: None,
            timeout,
        }
    }

    /// Tops every worker's frames in flight up to `in_flight`, each frame's
    /// keys drawn from `owned[worker]` (a worker owning none is skipped),
    /// and flushes each connection that got one.
    pub fn post(&mut self, client: &mut Client, owned: &[Vec<u64>]) -> Result<(), String> {
        let s = self.shape;
        for (w, keys) in owned.iter().enumerate() {
            if keys.is_empty() {
                continue;
            }
            let mut posted = false;
            while self.queues[w].len() < s.in_flight {
                let id = client.next_request_id();
                let mut list = self.spare.pop().unwrap_or_default();
                list.clear();
                for _ in 0..s.batch {
                    let i = keys[self.rng.gen_range(0..keys.len())];
                    list.push((i, self.rng.gen_range(0..100) < s.get_percent));
                }
                let (key, value) = (&mut self.key, &mut self.value);
                client
                    .endpoint(w as u16)
                    .post_with(&mut |buf| {
                        let mut b = RequestBuilder::new(buf, id, w as u16);
                        for &(i, is_get) in &list {
                            make_key(i, s.key_size, key);
                            if is_get {
                                b.get(key);
                            } else {
                                fill_value(i, value);
                                b.put(key, value, 0, PutCondition::Always);
                            }
                        }
                        b.finish();
                    })
                    .map_err(|e| e.to_string())?;
                self.queues[w].push_back(Sent {
                    id,
                    at: Instant::now(),
                    ops: list,
                });
                posted = true;
            }
            if posted {
                client
                    .endpoint(w as u16)
                    .flush(self.timeout)
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Hands every reply already in to `on_reply` with the frame it
    /// answers; returns whether any came. The first error stops it.
    pub fn poll<F>(&mut self, client: &mut Client, mut on_reply: F) -> Result<bool, String>
    where
        F: FnMut(&[u8], &Sent) -> Result<(), String>,
    {
        let mut progressed = false;
        for (w, queue) in self.queues.iter_mut().enumerate() {
            if queue.is_empty() {
                continue;
            }
            let spare = &mut self.spare;
            let mut failure = None;
            let n = client
                .endpoint(w as u16)
                .poll(usize::MAX, &mut |msg| {
                    let Some(sent) = queue.pop_front() else {
                        failure = Some("reply with nothing in flight".to_string());
                        return;
                    };
                    if failure.is_none() {
                        if let Err(e) = on_reply(msg, &sent) {
                            failure = Some(e);
                        }
                    }
                    spare.push(sent.ops);
                })
                .map_err(|e| e.to_string())?;
            if let Some(f) = failure {
                return Err(f);
            }
            progressed |= n > 0;
        }
        if progressed {
            self.idle_since = None;
        }
        Ok(progressed)
    }

    /// Whether no frame is in flight.
    pub fn is_drained(&self) -> bool {
        self.queues.iter().all(VecDeque::is_empty)
    }

    /// Waits a little when the last [`Load::poll`] found nothing: first
    /// polls briefly, like a verbs client polling its completion queue (a
    /// reply due in microseconds is not worth a wake-up), yielding between
    /// polls so that where threads outnumber cores the server's workers
    /// get the core at once (as the server's own idle loop does; see
    /// fabrickv_server::worker); then blocks on the oldest frame's
    /// connection, failing when that frame is older than the timeout.
    pub fn pause(&mut self, client: &mut Client, progressed: bool) -> Result<(), String> {
        if progressed {
            return Ok(());
        }
        if self.idle_since.get_or_insert_with(Instant::now).elapsed()
            < Duration::from_micros(CLIENT_SPIN_US)
        {
            std::thread::yield_now();
            return Ok(());
        }
        let Some(w) = self.queues.iter().position(|q| !q.is_empty()) else {
            return Ok(());
        };
        let oldest = self.queues[w].front().map_or_else(Instant::now, |s| s.at);
        if oldest.elapsed() > self.timeout {
            return Err(format!(
                "no reply from worker {w} within {:?}",
                self.timeout
            ));
        }
        client
            .endpoint(w as u16)
            .wait(Duration::from_millis(10))
            .map_err(|e| e.to_string())
    }
}
