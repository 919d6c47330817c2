//! Heartbeats between the servers of a replicated cluster and its
//! failover controller, and the lease they give a server.
//!
//! etcd's leases cannot find a dead primary fast enough (etcd 3.4 refuses
//! a TTL under about 2 s), so every server sends the controller a UDP
//! datagram every [`HEARTBEAT_INTERVAL_MS`] and the controller answers
//! each one. An answer that grants renews the server's *lease*: the
//! server may serve (and acknowledge) until [`LEASE_MS`] after it *sent*
//! the beat that was answered. The controller declares a server dead only
//! after hearing nothing for [`DEAD_AFTER_MS`], longer than a lease: the
//! last beat it heard was sent no later than it arrived, so by then the
//! server's lease has run out, and a primary that was only frozen
//! (SIGSTOP) or cut off cannot serve a read or acknowledge a write after
//! its successor starts. Both ends measure on the same monotonic clock
//! when they share a host; across hosts the margin between the two
//! bounds absorbs clock rate differences, which are parts per million.
//!
//! A datagram is fixed-size, versioned and, with a cluster secret, MACed
//! (under [`HEARTBEAT_MAC_CONTEXT`] and the cluster's name), so nobody
//! without the secret can keep a dead server alive or depose a live one.

use fabrickv_auth::{Secret, MAC_BYTES};

/// How often a server sends a beat, in milliseconds.
pub const HEARTBEAT_INTERVAL_MS: u64 = 50;

/// How long an answered beat lets its server serve, from when the beat
/// was sent, in milliseconds.
pub const LEASE_MS: u64 = 300;

/// Silence after which the controller declares a server dead and fails
/// its groups over, in milliseconds. Six missed beats: a busy machine's
/// scheduling delays (tens of milliseconds) do not cause a failover.
pub const DEAD_AFTER_MS: u64 = 500;

const _: () = assert!(DEAD_AFTER_MS > LEASE_MS + HEARTBEAT_INTERVAL_MS);

/// What a heartbeat MAC is made for.
pub const HEARTBEAT_MAC_CONTEXT: &[u8] = b"fabrickv heartbeat v1";

/// The datagram's magic.
const MAGIC: [u8; 4] = *b"FKHB";

/// The datagram format's version.
const VERSION: u8 = 1;

/// Bytes before the MAC.
const BODY_BYTES: usize = 4 + 1 + 1 + 2 + 4 + 8 + 8 + 8;

/// Bytes of one datagram.
pub const HEARTBEAT_BYTES: usize = BODY_BYTES + MAC_BYTES;

/// Which way a datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BeatKind {
    /// A server's beat.
    Beat,
    /// The controller's answer: the lease is renewed.
    Granted,
    /// The controller's answer: no lease (this run of the server holds no
    /// role the controller has stamped, or it was declared dead).
    Refused,
}

/// One datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// Beat or answer.
    pub kind: BeatKind,
    /// The server's id.
    pub id: u32,
    /// The beat's number (an answer repeats it).
    pub seq: u64,
    /// The server run's incarnation (an answer repeats it).
    pub incarnation: u64,
    /// The slot map epoch its sender knows.
    pub epoch: u64,
}

impl Beat {
    /// The datagram, MACed with `secret` for `cluster` when there is one.
    pub fn encode(&self, secret: Option<&Secret>, cluster: &str) -> [u8; HEARTBEAT_BYTES] {
        let mut b = [0u8; HEARTBEAT_BYTES];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = match self.kind {
            BeatKind::Beat => 1,
            BeatKind::Granted => 2,
            BeatKind::Refused => 3,
        };
        b[8..12].copy_from_slice(&self.id.to_le_bytes());
        b[12..20].copy_from_slice(&self.seq.to_le_bytes());
        b[20..28].copy_from_slice(&self.incarnation.to_le_bytes());
        b[28..36].copy_from_slice(&self.epoch.to_le_bytes());
        if let Some(s) = secret {
            let mac = s.mac(&context(cluster), &b[..BODY_BYTES]);
            b[BODY_BYTES..].copy_from_slice(&mac);
        }
        b
    }

    /// Reads a datagram; `None` for anything that is not a well-formed one
    /// of this version with a good MAC (when there is a secret).
    pub fn decode(bytes: &[u8], secret: Option<&Secret>, cluster: &str) -> Option<Beat> {
        if bytes.len() != HEARTBEAT_BYTES || bytes[0..4] != MAGIC || bytes[4] != VERSION {
            return None;
        }
        if let Some(s) = secret {
            if !s.verify_mac(
                &context(cluster),
                &bytes[..BODY_BYTES],
                &bytes[BODY_BYTES..],
            ) {
                return None;
            }
        }
        let kind = match bytes[5] {
            1 => BeatKind::Beat,
            2 => BeatKind::Granted,
            3 => BeatKind::Refused,
            _ => return None,
        };
        let u64_at = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let mut id = [0u8; 4];
        id.copy_from_slice(&bytes[8..12]);
        Some(Beat {
            kind,
            id: u32::from_le_bytes(id),
            seq: u64_at(12),
            incarnation: u64_at(20),
            epoch: u64_at(28),
        })
    }
}

/// Real-time priority (SCHED_FIFO) of the threads that send and answer
/// heartbeats: the lowest, enough to run ahead of every ordinary thread.
pub const HEARTBEAT_RT_PRIORITY: i32 = 1;

/// Puts the calling thread in the real-time class (best effort: it needs
/// root or CAP_SYS_NICE, and is logged once and skipped otherwise).
///
/// A heartbeat thread starved of CPU by a busy machine would look like a
/// dead server and cause a failover nothing else called for; in the
/// real-time class it runs as soon as its datagram or timer is due,
/// whatever else the cores are doing. It does almost nothing when it
/// runs, so it takes no measurable CPU from the rest.
#[allow(unsafe_code)]
pub fn raise_priority() {
    let param = libc::sched_param {
        sched_priority: HEARTBEAT_RT_PRIORITY,
    };
    // SAFETY: sched_setscheduler reads the parameter struct, which lives
    // across the call; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        tracing::info!(
            "heartbeats run at normal priority (real-time needs root or CAP_SYS_NICE): {}",
            std::io::Error::last_os_error()
        );
    }
}

fn context(cluster: &str) -> Vec<u8> {
    let mut c = HEARTBEAT_MAC_CONTEXT.to_vec();
    c.push(0);
    c.extend_from_slice(cluster.as_bytes());
    c
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn beat() -> Beat {
        Beat {
            kind: BeatKind::Beat,
            id: 7,
            seq: 42,
            incarnation: 0xfeed,
            epoch: 9,
        }
    }

    #[test]
    fn a_beat_round_trips_and_a_forgery_does_not_pass() {
        let secret = Secret::from_bytes(b"0123456789abcdef0123", "test").unwrap();
        let b = beat().encode(Some(&secret), "c");
        assert_eq!(Beat::decode(&b, Some(&secret), "c"), Some(beat()));
        assert_eq!(
            Beat::decode(&b, Some(&secret), "other"),
            None,
            "another cluster"
        );
        let mut forged = b;
        forged[12] ^= 1;
        assert_eq!(Beat::decode(&forged, Some(&secret), "c"), None);
        let unsigned = beat().encode(None, "c");
        assert_eq!(Beat::decode(&unsigned, Some(&secret), "c"), None);
        assert_eq!(Beat::decode(&unsigned, None, "c"), Some(beat()));
        assert_eq!(Beat::decode(&b[..10], None, "c"), None, "short");
    }
}
