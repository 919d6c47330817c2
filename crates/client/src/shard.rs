//! The persistent-shard client: batched GET, PUT and DELETE on the shards
//! a server serves (`serve --shard NAME=PATH`).
//!
//! A [`ShardClient`] owns one connection to one of the server's workers
//! and keeps one request in flight. Any worker serves any shard, and a
//! shard op runs on the worker that receives it, to the end (a durable
//! write waits there for its sync): so each new client takes the next
//! worker in turn ([`ShardClient::connect`]), and the clients of a
//! process, and of several processes, spread over all of them instead of
//! queueing on one. Writes are acknowledged only once
//! durable: when [`ShardClient::put_many`] or [`ShardClient::delete_many`]
//! returns `Ok`, the batch has been applied atomically and its journal
//! synced, and it survives a crash of the server.
//!
//! A PUT or DELETE batch is one frame, so that it is one atomic write: a
//! batch larger than a frame (or than `SHARD_BATCH_KEYS_MAX` entries) is
//! refused before it is sent rather than split. Reads have no such need:
//! [`ShardClient::get_many`] splits its keys over as many requests as it
//! takes, and asks again for the keys the server could not fit in a reply
//! (`REPLY_FULL`).
//!
//! Request ids, the requests in flight and the reply loop are the request
//! layer's (`fabrickv_rpc::Sessions`, one session): a request that timed
//! out stays there, given up, and its late reply is read and dropped.

use std::time::Duration;

use fabrickv_rpc::placement::Turns;
use fabrickv_types::limits::{FRAME_BODY_BYTES_MAX, SHARD_NAME_BYTES_MAX};
use fabrickv_types::ErrorCode;
use fabrickv_wire::shard::{decode_reply, ShardOp};
use fabrickv_wire::shard_data::{
    decode_get_reply, encode_delete, encode_get, encode_put, keys_payload_bytes,
    pairs_payload_bytes, request_overhead_bytes, KEY_ENTRY_HEADER_BYTES, SHARD_BATCH_KEYS_MAX,
    SHARD_DATA_KEY_BYTES_MAX, SHARD_DATA_VALUE_BYTES_MAX,
};
use fabrickv_wire::{decode_frame, FrameKind};

use crate::conn::{self, refusal, Conn, Workers};
use crate::{ClientError, Result, DEFAULT_TIMEOUT};

/// Shard clients this process has connected so far: the next one talks to
/// worker `(turn + pid) % workers`. The process id offsets the turn so
/// that processes with one client each spread too.
static TURNS: Turns = Turns::new();

/// A client of the persistent shards of one server.
pub struct ShardClient {
    /// The one session, to the worker the requests run on: request ids,
    /// the requests in flight, the timeout, the reply loop (one request
    /// is awaited at a time, so they carry no tag).
    sessions: Conn<()>,
}

impl std::fmt::Debug for ShardClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardClient")
            .field("timeout", &self.sessions.timeout())
            .finish()
    }
}

impl ShardClient {
    /// Connects to the server at `addr`; `timeout` bounds the connect and
    /// each call (a durable write waits for the server's disk).
    ///
    /// It asks worker 0 for the server's worker count (HELLO), then
    /// connects to the worker whose turn it is (staying on worker 0 when
    /// that is the one).
    pub fn connect(addr: &str, timeout: Duration) -> Result<ShardClient> {
        let pid = std::process::id() as usize;
        let c = conn::connect(addr, timeout, Workers::InTurn(&TURNS, pid), 0)?;
        Ok(ShardClient {
            sessions: c.sessions,
        })
    }

    /// Connects to worker `worker` of the server at `addr`, whatever the
    /// turn: to keep a client's ops off (or on) one worker. A worker the
    /// server does not have is refused at the handshake (`UNAVAILABLE`,
    /// with the server's worker count in the message).
    pub fn connect_worker(addr: &str, worker: u16, timeout: Duration) -> Result<ShardClient> {
        let c = conn::connect(addr, timeout, Workers::Worker(worker), 0)?;
        Ok(ShardClient {
            sessions: c.sessions,
        })
    }

    /// The server worker this client's requests run on.
    pub fn worker(&self) -> u16 {
        self.sessions.get(0).worker()
    }

    /// Bounds each later call by `timeout` (the connect keeps the one it
    /// was given).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.sessions.set_timeout(timeout);
    }

    /// Connects with [`DEFAULT_TIMEOUT`].
    pub fn connect_default(addr: &str) -> Result<ShardClient> {
        ShardClient::connect(addr, DEFAULT_TIMEOUT)
    }

    /// Reads one key of shard `shard`; `None` when absent.
    pub fn get(&mut self, shard: &str, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.get_many(shard, &[key])?.pop().flatten())
    }

    /// Reads many keys of shard `shard`; one result per key, in order.
    /// Keys are sent in as many requests as the bounds need.
    pub fn get_many<K: AsRef<[u8]>>(
        &mut self,
        shard: &str,
        keys: &[K],
    ) -> Result<Vec<Option<Vec<u8>>>> {
        check_name(shard)?;
        for k in keys {
            check_key(k.as_ref())?;
        }
        let mut out: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        let mut pending: Vec<usize> = (0..keys.len()).collect();
        let room = FRAME_BODY_BYTES_MAX - request_overhead_bytes(shard);
        while !pending.is_empty() {
            // As many pending keys as one request holds (at least one:
            // any key within the bounds fits a request alone).
            let mut take = 0;
            let mut bytes = keys_payload_bytes::<&[u8]>(&[]);
            while take < pending.len() && take < SHARD_BATCH_KEYS_MAX {
                let more = KEY_ENTRY_HEADER_BYTES + keys[pending[take]].as_ref().len();
                if take > 0 && bytes + more > room {
                    break;
                }
                bytes += more;
                take += 1;
            }
            let batch: Vec<&[u8]> = pending[..take].iter().map(|&i| keys[i].as_ref()).collect();
            let payload = self.call(ShardOp::Get, |b, id, worker| {
                encode_get(b, id, worker, shard, &batch)
            })?;
            let results = decode_get_reply(&payload).map_err(protocol)?;
            if results.len() != take {
                return Err(ClientError::Protocol(format!(
                    "a GET of {take} keys was answered with {} results",
                    results.len()
                )));
            }
            let mut again = Vec::new();
            for (r, &i) in results.iter().zip(&pending[..take]) {
                match r.code {
                    ErrorCode::Ok => out[i] = Some(r.value.to_vec()),
                    ErrorCode::NotFound => {}
                    ErrorCode::ReplyFull if i != pending[0] => again.push(i),
                    ErrorCode::ReplyFull => {
                        return Err(ClientError::Protocol(
                            "the first key of a GET did not fit its reply".into(),
                        ))
                    }
                    code => {
                        return Err(ClientError::Server {
                            code,
                            message: format!(
                                "key #{i} ({} bytes) of shard {shard:?}",
                                keys[i].as_ref().len()
                            ),
                        })
                    }
                }
            }
            again.extend_from_slice(&pending[take..]);
            pending = again;
        }
        Ok(out)
    }

    /// Writes one pair, durably.
    pub fn put(&mut self, shard: &str, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_many(shard, &[(key, value)])
    }

    /// Writes `pairs` to shard `shard` as one atomic batch (in order: a key
    /// given twice ends with its last value); returns once the batch is
    /// durable. The batch must fit one frame.
    pub fn put_many<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        shard: &str,
        pairs: &[(K, V)],
    ) -> Result<()> {
        check_name(shard)?;
        if pairs.is_empty() {
            return Ok(());
        }
        for (k, v) in pairs {
            check_key(k.as_ref())?;
            let v = v.as_ref();
            if v.len() > SHARD_DATA_VALUE_BYTES_MAX {
                return Err(ClientError::Invalid(
                    ErrorCode::ValueTooLarge,
                    format!(
                        "a value of {} bytes exceeds SHARD_DATA_VALUE_BYTES_MAX ({SHARD_DATA_VALUE_BYTES_MAX})",
                        v.len()
                    ),
                ));
            }
        }
        check_batch(shard, pairs.len(), pairs_payload_bytes(pairs))?;
        self.call(ShardOp::Put, |b, id, worker| {
            encode_put(b, id, worker, shard, pairs)
        })
        .map(drop)
    }

    /// Removes `keys` from shard `shard` as one atomic batch (absent keys
    /// are fine); returns once the batch is durable.
    pub fn delete_many<K: AsRef<[u8]>>(&mut self, shard: &str, keys: &[K]) -> Result<()> {
        check_name(shard)?;
        if keys.is_empty() {
            return Ok(());
        }
        for k in keys {
            check_key(k.as_ref())?;
        }
        check_batch(shard, keys.len(), keys_payload_bytes(keys))?;
        self.call(ShardOp::Delete, |b, id, worker| {
            encode_delete(b, id, worker, shard, keys)
        })
        .map(drop)
    }

    /// Removes one key, durably.
    pub fn delete(&mut self, shard: &str, key: &[u8]) -> Result<()> {
        self.delete_many(shard, &[key])
    }

    /// Sends one copy control op (`CopyCheckpoint`, `CopyStart`,
    /// `CopyStatus`, `CopyEnd`) whose payload `payload` writes, naming
    /// `shard` (empty for the ops that name a copy by its id); returns the
    /// reply's payload. The payloads are `fabrickv_wire::copy`'s; this
    /// only carries them.
    pub fn copy_control(
        &mut self,
        op: ShardOp,
        shard: &str,
        payload: impl FnOnce(&mut Vec<u8>),
    ) -> Result<Vec<u8>> {
        if !op.is_copy() {
            return Err(ClientError::Invalid(
                ErrorCode::UnknownOpcode,
                format!("{op:?} is not a copy control op"),
            ));
        }
        self.call(op, |b, id, worker| {
            fabrickv_wire::shard::encode_request(b, id, worker, op, shard, payload)
        })
    }

    /// Sends one request built by `build` (given its id and worker) and
    /// returns its reply's payload (status OK), or the server's refusal as
    /// an error.
    fn call(&mut self, op: ShardOp, build: impl FnOnce(&mut Vec<u8>, u64, u16)) -> Result<Vec<u8>> {
        let deadline = self.sessions.deadline();
        self.sessions
            .call(0, (), deadline, build, |msg, _| reply_of(msg, op))
    }
}

/// Reads the reply to a request of `op`: its payload, or the server's
/// refusal.
fn reply_of(msg: &[u8], op: ShardOp) -> Result<Vec<u8>> {
    let frame = decode_frame(msg).map_err(|e| ClientError::Protocol(e.to_string()))?;
    if frame.header.kind == FrameKind::Error {
        return Err(refusal(&frame));
    }
    let (code, m) = decode_reply(&frame).map_err(|e| ClientError::Protocol(e.to_string()))?;
    if m.op != op {
        return Err(ClientError::Protocol(format!(
            "a {op:?} was answered as a {:?}",
            m.op
        )));
    }
    if code != ErrorCode::Ok {
        return Err(ClientError::Server {
            code,
            message: String::from_utf8_lossy(m.payload).into_owned(),
        });
    }
    Ok(m.payload.to_vec())
}

fn protocol(e: fabrickv_wire::shard_data::DataError) -> ClientError {
    ClientError::Protocol(format!("shard reply: {e}"))
}

fn check_name(shard: &str) -> Result<()> {
    if shard.is_empty() || shard.len() > SHARD_NAME_BYTES_MAX {
        return Err(ClientError::Invalid(
            ErrorCode::Malformed,
            format!(
                "shard name of {} bytes; names are 1..={SHARD_NAME_BYTES_MAX} bytes",
                shard.len()
            ),
        ));
    }
    Ok(())
}

fn check_key(key: &[u8]) -> Result<()> {
    if key.len() > SHARD_DATA_KEY_BYTES_MAX {
        return Err(ClientError::Invalid(
            ErrorCode::KeyTooLong,
            format!(
                "a key of {} bytes exceeds SHARD_DATA_KEY_BYTES_MAX ({SHARD_DATA_KEY_BYTES_MAX})",
                key.len()
            ),
        ));
    }
    Ok(())
}

/// Checks that a write batch is one request: it must stay atomic.
fn check_batch(shard: &str, count: usize, payload_bytes: usize) -> Result<()> {
    if count > SHARD_BATCH_KEYS_MAX {
        return Err(ClientError::Invalid(
            ErrorCode::BatchTooLarge,
            format!(
                "a batch of {count} entries exceeds SHARD_BATCH_KEYS_MAX ({SHARD_BATCH_KEYS_MAX}); an atomic batch is one request"
            ),
        ));
    }
    let bytes = request_overhead_bytes(shard) + payload_bytes;
    if bytes > FRAME_BODY_BYTES_MAX {
        return Err(ClientError::Invalid(
            ErrorCode::FrameTooLarge,
            format!(
                "a batch of {bytes} bytes exceeds a frame ({FRAME_BODY_BYTES_MAX} bytes); an atomic batch is one request"
            ),
        ));
    }
    Ok(())
}
