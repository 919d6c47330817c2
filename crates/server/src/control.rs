//! The services of the frames that ask about the server rather than its
//! data: HELLO (the server's shape), PARTITIONS (the partition table,
//! and moving a partition) and CHECKPOINT (starting a save, its status). STATS is the request layer's own
//! (`fabrickv_rpc::StatsService`), and [`worker`] registers all of them
//! beside kv, ps, cache and shard.

use std::sync::Arc;

use fabrickv_rpc::{RegisterError, StatsService, Worker};
use fabrickv_transport::Reply;
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::{
    decode_checkpoint_request, decode_partitions_request, encode_checkpoint_reply,
    encode_hello_reply, encode_partitions_reply, CheckpointRequest, ServerInfo,
};
use fabrickv_wire::FrameKind;

use crate::cache::CacheService;
use crate::checkpoint::Checkpoints;
use crate::kv::KvService;
use crate::partitions::{MoveError, Partitions};
use crate::ps::PsService;
use crate::service::{wire_refusal, Call, Refusal, Service};
use crate::shard::ShardService;

/// The services of one worker, in the order they register (and report in
/// a STATS reply).
pub struct Services {
    /// Key-value frames (REQUEST).
    pub kv: KvService,
    /// Embedding-table frames (PS).
    pub ps: PsService,
    /// KV-cache frames (CACHE), and the gRPC transfers queued to this worker.
    pub cache: CacheService,
    /// Persistent-shard frames (SHARD: data and copy control).
    pub shard: ShardService,
    /// The server's checkpoints (CHECKPOINT frames).
    pub checkpoints: Arc<Checkpoints>,
}

/// Worker `id`'s request layer with every service of the server
/// registered: kv, ps, cache, shard, then HELLO, STATS, PARTITIONS and
/// CHECKPOINT.
pub fn worker(id: u16, s: Services) -> Result<Worker, RegisterError> {
    let hello = HelloService::new(s.kv.server_info());
    let partitions = PartitionsService {
        parts: s.kv.partitions().clone(),
    };
    let checkpoint = CheckpointService {
        checkpoints: s.checkpoints,
    };
    let services: [Box<dyn Service>; 8] = [
        Box::new(s.kv),
        Box::new(s.ps),
        Box::new(s.cache),
        Box::new(s.shard),
        Box::new(hello),
        Box::new(StatsService),
        Box::new(partitions),
        Box::new(checkpoint),
    ];
    Worker::new(id).with(services)
}

/// Answers HELLO with the server's shape, fixed at start.
#[derive(Debug, Clone)]
pub struct HelloService {
    /// What every HELLO_REPLY announces.
    info: ServerInfo,
}

impl HelloService {
    /// The service announcing `info` (the kv service's
    /// [`KvService::server_info`]).
    pub fn new(info: ServerInfo) -> HelloService {
        HelloService { info }
    }
}

impl Service for HelloService {
    fn kinds(&self) -> &'static [FrameKind] {
        &[FrameKind::Hello]
    }

    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        encode_hello_reply(reply.buf(), call.id(), call.worker.id, &self.info);
        Ok(())
    }
}

/// Answers PARTITIONS: moves a partition first if the frame asks to, then
/// replies with the table. Any worker answers it; the connection proved
/// the server's secret at its handshake, as every administrative frame's
/// does.
pub struct PartitionsService {
    /// The table every worker and front end shares.
    parts: Arc<Partitions>,
}

impl Service for PartitionsService {
    fn kinds(&self) -> &'static [FrameKind] {
        &[FrameKind::Partitions]
    }

    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        let parts = &self.parts;
        let mv = decode_partitions_request(&call.frame).map_err(wire_refusal)?;
        if let Some(m) = mv {
            match parts.move_partition(m.partition, m.worker) {
                Ok(epoch) => tracing::info!(
                    partition = m.partition,
                    worker = m.worker,
                    epoch,
                    "partition moved"
                ),
                Err(e @ MoveError::NoSuchWorker) => {
                    return Err((ErrorCode::NoSuchWorker, format!("worker {}: {e}", m.worker)))
                }
                Err(e) => {
                    return Err((
                        ErrorCode::Malformed,
                        format!("partition {}: {e}", m.partition),
                    ))
                }
            }
        }
        encode_partitions_reply(reply.buf(), call.id(), call.worker.id, &parts.table());
        Ok(())
    }
}

/// Answers CHECKPOINT: starts a save on a thread of its own if asked
/// (the worker never waits for the disk), then replies with the status;
/// the client reads the status again until the save has finished. An
/// administrative frame, as PARTITIONS is, and the server writes only
/// under its own checkpoint directory whatever a client names.
pub struct CheckpointService {
    checkpoints: Arc<Checkpoints>,
}

impl Service for CheckpointService {
    fn kinds(&self) -> &'static [FrameKind] {
        &[FrameKind::Checkpoint]
    }

    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        let ck = &self.checkpoints;
        if let CheckpointRequest::Save(to) =
            decode_checkpoint_request(&call.frame).map_err(wire_refusal)?
        {
            let started = ck
                .resolve(Some(&to))
                .and_then(|root| ck.save_in_background(root));
            started.map_err(|e| (e.code(), e.to_string()))?;
        }
        encode_checkpoint_reply(reply.buf(), call.id(), call.worker.id, &ck.status());
        Ok(())
    }
}

#[cfg(test)]
mod tests;
