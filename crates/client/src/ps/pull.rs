//! Pulls: starting one ([`PsClient::pull_async`]), its state while its
//! requests are in flight, waiting for it (into a new vector, a caller's
//! slice, or a view of where it landed) and cancelling it.

use fabrickv_types::ErrorCode;
use fabrickv_wire::ps::{encode_pull, pull_keys_per_frame, PullDest, TableDesc};

use super::{
    check_len, unknown_pull, Landing, PsClient, PsReq, PullId, PullState, Pulled,
    PS_OUTSTANDING_PULLS_MAX,
};
use crate::conn::region_bytes;
use crate::{ClientError, Result};

impl PsClient {
    /// Starts a pull of `keys` from table `t`; returns at once with an id
    /// to poll, wait on or cancel.
    pub fn pull_async(&mut self, t: &TableDesc, keys: &[u64]) -> Result<PullId> {
        self.start_pull(t, keys, false)
    }

    /// [`PsClient::pull_async`]; with `caller`, inline replies are to land
    /// in the slice [`PsClient::pull_into`] lends ([`Landing::Caller`]).
    fn start_pull(&mut self, t: &TableDesc, keys: &[u64], caller: bool) -> Result<PullId> {
        while self.pulls.len() >= PS_OUTSTANDING_PULLS_MAX {
            let oldest = self.pulls.keys().min().copied();
            if let Some(id) = oldest {
                let deadline = self.sessions.deadline();
                while !self.pull_finished(id) {
                    self.drive(deadline)?;
                }
                if self.pulls.get(&id).is_some_and(|p| p.cancelled) {
                    self.pulls.remove(&id);
                }
                break;
            }
        }
        let dim = t.spec.dim as usize;
        let vb = dim * 4;
        let total = keys.len() * vb;
        let landing = match &mut self.region {
            Some((_, alloc)) if total > 0 => {
                alloc.alloc(total).map_or(Landing::Inline, Landing::Region)
            }
            _ if caller => Landing::Caller,
            _ => Landing::Inline,
        };
        let pull = self.sessions.next_request_id();
        let per = pull_keys_per_frame(t.spec.dim);
        let chunks = keys.len().div_ceil(per).max(1);
        let values = match landing {
            Landing::Inline => vec![0f32; keys.len() * dim],
            Landing::Caller | Landing::Region(_) => Vec::new(),
        };
        self.pulls.insert(
            pull,
            PullState {
                dim,
                keys: keys.len(),
                landing,
                values,
                found: vec![false; keys.len()],
                requests_left: chunks,
                error: None,
                cancelled: false,
            },
        );
        let region = self.region.as_ref().map(|(r, _)| *r);
        for c in 0..chunks {
            let first = c * per;
            let part = &keys[first.min(keys.len())..(first + per).min(keys.len())];
            let dest = match (landing, region) {
                (Landing::Region(off), Some(r)) => Some(PullDest {
                    region: region_bytes(&r),
                    offset: (off + first * vb) as u64,
                }),
                _ => None,
            };
            let tid = t.id;
            let posted = self
                .sessions
                .post(0, PsReq::Pull { pull, first }, |b, req, w| {
                    encode_pull(b, req, w, tid, part, dest.as_ref())
                });
            if let Err(e) = posted {
                self.fail_pull(pull, chunks - c);
                return Err(e.into());
            }
        }
        self.sessions.flush()?;
        Ok(PullId(pull))
    }

    /// A pull whose requests could not all be posted: it completes with an
    /// error once the posted ones are answered.
    fn fail_pull(&mut self, pull: u64, unposted: usize) {
        if let Some(p) = self.pulls.get_mut(&pull) {
            p.requests_left -= unposted;
            p.error = Some(ClientError::Protocol("pull could not be posted".into()));
        }
    }

    fn pull_finished(&self, id: u64) -> bool {
        self.pulls.get(&id).is_none_or(|p| p.requests_left == 0)
    }

    /// Whether pull `id` has completed (PetPS's QueryRPCFinished). Reads
    /// whatever replies have arrived, without blocking.
    pub fn is_done(&mut self, id: PullId) -> Result<bool> {
        self.pump()?;
        match self.pulls.get(&id.0) {
            Some(p) if !p.cancelled => Ok(p.requests_left == 0),
            _ => Err(unknown_pull(id)),
        }
    }

    /// Waits for pull `id` and returns its vectors (PetPS's WaitRPCFinish).
    pub fn wait(&mut self, id: PullId) -> Result<Pulled> {
        self.wait_with(id, |state, region| {
            let values = match (state.landing, region) {
                (Landing::Region(off), Some(bytes)) => {
                    let mut v = vec![0f32; state.keys * state.dim];
                    bytemuck::cast_slice_mut::<f32, u8>(&mut v)
                        .copy_from_slice(&bytes[off..off + state.keys * state.dim * 4]);
                    v
                }
                _ => std::mem::take(&mut state.values),
            };
            Pulled {
                values,
                found: std::mem::take(&mut state.found),
            }
        })
    }

    /// Waits for pull `id` and copies its vectors into `out` (keys x dim
    /// floats); returns how many keys the table held. `found`, if given,
    /// receives the per-key flags.
    pub fn wait_into(
        &mut self,
        id: PullId,
        out: &mut [f32],
        found: Option<&mut [bool]>,
    ) -> Result<usize> {
        self.wait_with(id, |state, region| {
            let n = state.keys * state.dim;
            if out.len() != n {
                return Err(ClientError::Invalid(
                    ErrorCode::BadDimension,
                    format!("output holds {} floats; the pull has {n}", out.len()),
                ));
            }
            match (state.landing, region) {
                (Landing::Region(off), Some(bytes)) => {
                    bytemuck::cast_slice_mut::<f32, u8>(out)
                        .copy_from_slice(&bytes[off..off + n * 4]);
                }
                _ => out.copy_from_slice(&state.values[..n]),
            }
            if let Some(f) = found {
                let m = f.len().min(state.found.len());
                f[..m].copy_from_slice(&state.found[..m]);
            }
            Ok(state.found.iter().filter(|x| **x).count())
        })?
    }

    /// Waits for pull `id`, then lends its vectors (as little-endian f32
    /// bytes, request order) and found flags to `f` without copying them:
    /// in place in the registered region where the pull was one-sided.
    pub fn wait_view<T>(&mut self, id: PullId, f: impl FnOnce(&[u8], &[bool]) -> T) -> Result<T> {
        self.wait_with(id, |state, region| {
            let n = state.keys * state.dim * 4;
            match (state.landing, region) {
                (Landing::Region(off), Some(bytes)) => f(&bytes[off..off + n], &state.found),
                _ => f(bytemuck::cast_slice(&state.values[..]), &state.found),
            }
        })
    }

    fn wait_with<T>(
        &mut self,
        id: PullId,
        f: impl FnOnce(&mut PullState, Option<&[u8]>) -> T,
    ) -> Result<T> {
        match self.pulls.get(&id.0) {
            Some(p) if !p.cancelled => {}
            _ => return Err(unknown_pull(id)),
        }
        let deadline = self.sessions.deadline();
        while !self.pull_finished(id.0) {
            self.drive(deadline)?;
        }
        let mut state = self.pulls.remove(&id.0).ok_or_else(|| unknown_pull(id))?;
        if let Landing::Region(off) = state.landing {
            if let Some((_, alloc)) = &mut self.region {
                alloc.free(off, state.keys * state.dim * 4);
            }
        }
        if let Some(e) = state.error.take() {
            return Err(e);
        }
        let region = match (&self.region, state.landing) {
            (Some((r, _)), Landing::Region(_)) => Some(*r),
            _ => None,
        };
        match region {
            Some(r) => {
                let bytes = self.sessions.session(0).endpoint().local_region(&r)?;
                Ok(f(&mut state, Some(bytes)))
            }
            None => Ok(f(&mut state, None)),
        }
    }

    /// Gives up on pull `id` (PetPS's RevokeRPCResource). Its slot of the
    /// region is freed only once the server's reply has arrived, since the
    /// server may still be writing it.
    pub fn cancel(&mut self, id: PullId) -> Result<()> {
        match self.pulls.get_mut(&id.0) {
            Some(p) if !p.cancelled => {
                p.cancelled = true;
                p.values = Vec::new();
            }
            _ => return Err(unknown_pull(id)),
        }
        self.reap(id.0);
        Ok(())
    }

    /// Drops a cancelled pull once all its replies are in.
    pub(super) fn reap(&mut self, pull: u64) {
        let done = self
            .pulls
            .get(&pull)
            .is_some_and(|p| p.cancelled && p.requests_left == 0);
        if !done {
            return;
        }
        if let Some(p) = self.pulls.remove(&pull) {
            if let (Landing::Region(off), Some((_, alloc))) = (p.landing, &mut self.region) {
                alloc.free(off, p.keys * p.dim * 4);
            }
        }
    }

    /// Pulls `keys` into `out` (`keys.len() * dim` floats); returns how
    /// many keys the table held.
    pub fn pull_into(
        &mut self,
        t: &TableDesc,
        keys: &[u64],
        out: &mut [f32],
        found: Option<&mut [bool]>,
    ) -> Result<usize> {
        check_len(out.len(), keys.len(), t.spec.dim, "output")?;
        let id = self.start_pull(t, keys, true)?;
        if !matches!(
            self.pulls.get(&id.0).map(|p| p.landing),
            Some(Landing::Caller)
        ) {
            return self.wait_into(id, out, found);
        }
        // Inline replies land straight in `out` as they are read; a pull
        // that fails here is cancelled, so that no later reply of it
        // looks for `out` once this call has returned.
        let deadline = self.sessions.deadline();
        while !self.pull_finished(id.0) {
            if let Err(e) = self.drive_landing(deadline, Some((id.0, &mut *out))) {
                let _ = self.cancel(id);
                return Err(e);
            }
        }
        let state = self.pulls.remove(&id.0).ok_or_else(|| unknown_pull(id))?;
        if let Some(e) = state.error {
            return Err(e);
        }
        if let Some(f) = found {
            let m = f.len().min(state.found.len());
            f[..m].copy_from_slice(&state.found[..m]);
        }
        Ok(state.found.iter().filter(|x| **x).count())
    }

    /// Pulls `keys`, returning fresh vectors.
    pub fn pull(&mut self, t: &TableDesc, keys: &[u64]) -> Result<Pulled> {
        let id = self.pull_async(t, keys)?;
        self.wait(id)
    }
}
