//! One copy run with the source, driven over the native protocol (SHARD
//! frames): CHECKPOINT opens the run, STATUS until its checkpoint is
//! split, START, the streams (`streams`), then the target synced, verified
//! (`verify`) and its progress marked complete; END whatever happened. A
//! copy resumed after a crash is a new run, on a new checkpoint.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fabrickv_client::ShardClient;
use fabrickv_storage::{FjallShard, ShardBackend, ShardOptions};
use fabrickv_types::{Digest, ErrorCode};
use fabrickv_wire::copy::{
    encode_run_id, CheckpointReply, CheckpointRequest, CopyState, StartRequest, COPY_RANGES_MAX,
    COPY_STREAMS_MAX,
};
use fabrickv_wire::shard::ShardOp;

use crate::control::{source_failed, status};
use crate::error::{client, err, storage, CopyError};
use crate::lock;
use crate::options::{CopyOptions, COPY_SPLIT_POLL_MS, COPY_TARGET_CACHE_BYTES};
use crate::progress::{claim, hex, prepare, Progress, RangeProgress, PROGRESS_VERSION};
use crate::report::{CopyReport, Event};
use crate::shared::Shared;
use crate::streams::stream;
use crate::verify::verify;

/// Copies `opts.shard` from `opts.from` into `opts.to`, calling `on_event`
/// as it goes (from this thread only).
pub fn copy(
    opts: &CopyOptions,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<CopyReport, CopyError> {
    if opts.ranges == 0 || opts.ranges > COPY_RANGES_MAX {
        return Err(err(
            ErrorCode::Malformed,
            format!("ranges must be 1..={COPY_RANGES_MAX}"),
        ));
    }
    if opts.parallelism == 0 || opts.parallelism > COPY_STREAMS_MAX {
        return Err(err(
            ErrorCode::Malformed,
            format!("parallelism must be 1..={COPY_STREAMS_MAX}"),
        ));
    }
    // The source first: a copy that cannot reach it changes nothing here.
    let mut ctl = ShardClient::connect(&opts.from, opts.connect_timeout)
        .map_err(|e| client(&format!("connecting to {}", opts.from), e))?;
    ctl.set_timeout(opts.op_timeout);
    let resumed = prepare(opts)?;
    if resumed.is_none() {
        claim(opts)?;
    }
    let shard = FjallShard::open(
        &opts.to,
        &ShardOptions {
            cache_bytes: COPY_TARGET_CACHE_BYTES,
            create: true,
        },
    )
    .map_err(|e| storage("opening the target shard", e))?;
    // Checkpoint: a resumed copy asks for the ranges it had.
    let boundaries_had = match &resumed {
        Some(p) => p.boundaries()?,
        None => Vec::new(),
    };
    let ranges_wanted = if resumed.is_some() {
        boundaries_had.len() as u32 + 1
    } else {
        opts.ranges
    };
    let req = CheckpointRequest {
        ranges: ranges_wanted,
        boundaries: boundaries_had.iter().map(Vec::as_slice).collect(),
    };
    let reply = ctl
        .copy_control(ShardOp::CopyCheckpoint, &opts.shard, |b| req.encode(b))
        .map_err(|e| client("CHECKPOINT", e))?;
    let cp = CheckpointReply::decode(&reply).map_err(|e| err(e.code(), e.to_string()))?;
    let result = drive_run(opts, &shard, &mut ctl, &cp, resumed, on_event);
    // The run is ended whatever happened; a failure to end it is only
    // logged (the source drops finished runs when it needs room).
    if let Err(e) = ctl.copy_control(ShardOp::CopyEnd, "", |b| encode_run_id(b, cp.run_id)) {
        tracing::debug!("END of copy run {}: {e}", cp.run_id);
    }
    result
}

/// Drives the run `cp` opened from its split to the verified target; the
/// caller ENDs it.
fn drive_run<S: ShardBackend>(
    opts: &CopyOptions,
    shard: &S,
    ctl: &mut ShardClient,
    cp: &CheckpointReply,
    resumed: Option<Progress>,
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<CopyReport, CopyError> {
    let st = loop {
        let st = status(ctl, cp.run_id)?;
        if matches!(st.state, CopyState::Error | CopyState::Stopped) {
            return Err(source_failed(&st));
        }
        if st.ready {
            break st;
        }
        std::thread::sleep(Duration::from_millis(COPY_SPLIT_POLL_MS));
    };
    let progress = match resumed {
        Some(p) => {
            if p.boundaries()? != st.boundaries {
                return Err(err(
                    ErrorCode::Internal,
                    "the source split the resumed copy differently",
                ));
            }
            p
        }
        None => {
            let p = Progress {
                version: PROGRESS_VERSION,
                from: opts.from.clone(),
                shard: opts.shard.clone(),
                boundaries: st.boundaries.iter().map(|b| hex(b)).collect(),
                ranges: vec![RangeProgress::default(); st.boundaries.len() + 1],
                complete: false,
            };
            p.save(&opts.to)?;
            p
        }
    };
    let resume = progress.resume_points()?;
    let ranges = progress.ranges.len() as u32;
    let ranges_resumed = progress.ranges.iter().filter(|r| r.done).count() as u32;
    let bytes_before: u64 = progress.ranges.iter().map(|r| r.bytes).sum();
    let all_done = ranges_resumed == ranges;
    let shared = Arc::new(Shared {
        dir: opts.to.clone(),
        progress: Mutex::new(progress),
        pairs: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        failure: Mutex::new(None),
        stop: AtomicBool::new(false),
        durable_every: opts.durable_every_bytes.max(1),
        keep_cached: opts.keep_cached,
    });
    on_event(Event::Started {
        ranges,
        ranges_done: ranges_resumed,
        bytes_estimate: st.bytes_estimate,
        bytes_before,
    });
    let t0 = Instant::now();
    let mut samples = Vec::new();
    if !all_done {
        let start = StartRequest {
            run_id: cp.run_id,
            token: cp.token,
            streams: opts
                .parallelism
                .min(ranges.try_into().unwrap_or(u16::MAX))
                .max(1),
            resume,
        };
        ctl.copy_control(ShardOp::CopyStart, "", |b| start.encode(b))
            .map_err(|e| client("START", e))?;
        samples = stream(opts, shard, ctl, cp, &start, &shared, on_event)?;
    }
    let bytes_this_run = shared.bytes.load(Ordering::Relaxed);
    shard
        .sync()
        .map_err(|e| storage("syncing the target shard", e))?;
    let copy_secs = t0.elapsed().as_secs_f64();
    let mut expected = Digest::default();
    {
        let p = lock(&shared.progress);
        for r in &p.ranges {
            expected.merge(&r.digest()?);
        }
    }
    let tv = Instant::now();
    let verified = if opts.verify {
        on_event(Event::Log("verifying: scanning the copy"));
        let (boundaries, wanted) = {
            let p = lock(&shared.progress);
            let wanted = p
                .ranges
                .iter()
                .map(RangeProgress::digest)
                .collect::<Result<Vec<_>, _>>()?;
            (p.boundaries()?, wanted)
        };
        verify(shard, &boundaries, &wanted, usize::from(opts.parallelism))?;
        true
    } else {
        false
    };
    let verify_secs = if verified {
        tv.elapsed().as_secs_f64()
    } else {
        0.0
    };
    {
        let mut p = lock(&shared.progress);
        p.complete = true;
        p.save(&opts.to)?;
    }
    // fjall made its files with the process's umask; the target is its
    // owner's only, as a shard the server creates is.
    fabrickv_storage::restrict_to_owner(&opts.to).map_err(|e| {
        err(
            ErrorCode::StorageFailed,
            format!("restricting {}: {e}", opts.to.display()),
        )
    })?;
    Ok(CopyReport {
        pairs: expected.pairs,
        bytes: expected.bytes,
        bytes_this_run,
        copy_secs,
        verify_secs,
        digest: expected,
        ranges,
        ranges_resumed,
        samples,
        verified,
    })
}
