//! Puts and pushes: a table's vectors stored, or gradients applied, in as
//! many requests as the frames need, posted together; the post and the
//! collect are apart so that the cluster client can post to every server
//! before it collects from any.

use std::time::Instant;

use fabrickv_types::ErrorCode;
use fabrickv_wire::decode_frame;
use fabrickv_wire::ps::{
    decode_reply, encode_push, push_keys_per_frame, PushId, PushMode, TableDesc,
};

use super::{check_len, PsClient, PsReq};
use crate::conn::protocol;
use crate::{ClientError, Result};

impl PsClient {
    /// Stores `values` (`keys.len() * dim` floats) as the keys' vectors.
    pub fn put(&mut self, t: &TableDesc, keys: &[u64], values: &[f32]) -> Result<()> {
        self.push_mode(t, keys, values, PushMode::Overwrite)
    }

    /// Applies `grads` (`keys.len() * dim` floats) with the table's
    /// optimizer, atomically per key.
    pub fn push(&mut self, t: &TableDesc, keys: &[u64], grads: &[f32]) -> Result<()> {
        self.push_mode(t, keys, grads, PushMode::Gradient)
    }

    /// Applies `grads` as [`PsClient::push`] does, under request id `id`:
    /// a server that applied a push with this id (or, in a replicated
    /// cluster, whose predecessor as the keys' primary did) answers it
    /// again without applying it. A client that lost a push's answer
    /// sends it again with the same id; ids are `(client, seq)`, the
    /// client part random and the seq increasing by the frames each push
    /// takes ([`fabrickv_wire::ps::push_keys_per_frame`] keys per frame).
    pub fn push_once(
        &mut self,
        t: &TableDesc,
        keys: &[u64],
        grads: &[f32],
        id: PushId,
    ) -> Result<()> {
        let pending = self.push_post(t, keys, grads, PushMode::Gradient, Some(id))?;
        let deadline = self.sessions.deadline();
        self.push_collect(pending, deadline)
    }

    fn push_mode(
        &mut self,
        t: &TableDesc,
        keys: &[u64],
        values: &[f32],
        mode: PushMode,
    ) -> Result<()> {
        let pending = self.push_post(t, keys, values, mode, None)?;
        let deadline = self.sessions.deadline();
        self.push_collect(pending, deadline)
    }

    /// The post phase of a put or push: posts every frame and flushes,
    /// without waiting for a reply (the cluster client posts to every
    /// server before it collects from any). With `first`, the frames carry
    /// request ids `first`, `first.seq + 1`, ... (one per frame, see
    /// [`push_frames`]), so that a retry of the same keys carries the
    /// same ids and is not applied twice.
    pub(crate) fn push_post(
        &mut self,
        t: &TableDesc,
        keys: &[u64],
        values: &[f32],
        mode: PushMode,
        first: Option<PushId>,
    ) -> Result<PendingPush> {
        check_len(values.len(), keys.len(), t.spec.dim, "values")?;
        let dim = t.spec.dim as usize;
        let per = push_keys_per_frame(t.spec.dim);
        let mut reqs = Vec::with_capacity(keys.len().div_ceil(per));
        for (ci, chunk) in keys.chunks(per).enumerate() {
            let vals = &values[ci * per * dim..(ci * per + chunk.len()) * dim];
            let tid = t.id;
            let request = first.map(|f| PushId {
                client: f.client,
                seq: f.seq + ci as u64,
            });
            let posted = self.sessions.post(0, PsReq::Other, |b, req, w| {
                encode_push(b, req, w, tid, mode, chunk, vals, request)
            });
            match posted {
                Ok(req) => reqs.push((req, chunk.len())),
                Err(e) => {
                    self.give_up(&reqs);
                    return Err(e.into());
                }
            }
        }
        self.sessions.flush()?;
        Ok(PendingPush {
            reqs,
            keys: keys.len(),
        })
    }

    /// Gives the requests `reqs` of a put or push up: their replies are
    /// dropped on arrival, not kept for a caller that stopped waiting.
    fn give_up(&mut self, reqs: &[(u64, usize)]) {
        let q = self.sessions.session(0).queue_mut();
        for &(req, _) in reqs {
            q.give_up(req);
        }
    }

    /// The collect phase of a put or push: every reply, by `deadline`;
    /// the first refusal, if any, after all are in.
    pub(crate) fn push_collect(&mut self, pending: PendingPush, deadline: Instant) -> Result<()> {
        let mut first_err = None;
        let mut applied_before = 0usize;
        for (i, &(req, n)) in pending.reqs.iter().enumerate() {
            let body = match self.await_reply(req, deadline) {
                Ok(body) => body,
                Err(e) => {
                    // The later requests of the push are given up too.
                    self.give_up(&pending.reqs[i..]);
                    return Err(e);
                }
            };
            let outcome = body.and_then(|b| {
                let f = decode_frame(&b).map_err(protocol)?;
                let r = decode_reply(&f).map_err(protocol)?;
                let applied = r
                    .rest
                    .get(..4)
                    .map_or(0, |a| u32::from_le_bytes([a[0], a[1], a[2], a[3]]) as usize);
                if r.status == ErrorCode::Ok && applied == n {
                    Ok(())
                } else {
                    Err(ClientError::Server {
                        code: r.status,
                        message: format!(
                            "{} of {} keys applied before the failure",
                            applied_before + applied,
                            pending.keys
                        ),
                    })
                }
            });
            match outcome {
                Ok(()) => applied_before += n,
                Err(e) => {
                    if first_err.is_none() {
                        first_err = Some(e);
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// The frames a put or push of `keys` keys of dimension `dim` takes (and
/// so the request ids it uses).
pub(crate) fn push_frames(keys: usize, dim: u32) -> u64 {
    keys.div_ceil(push_keys_per_frame(dim)) as u64
}

/// A put or push whose frames are posted: request ids with their key
/// counts, and the keys in all.
#[derive(Debug)]
pub(crate) struct PendingPush {
    reqs: Vec<(u64, usize)>,
    keys: usize,
}
