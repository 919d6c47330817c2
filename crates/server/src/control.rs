//! The services of the frames that ask about the server rather than its
//! data: HELLO (the server's shape) and PARTITIONS (the partition table,
//! and moving a partition). STATS is the request layer's own
//! (`fabrickv_rpc::StatsService`), and [`worker`] registers all of them
//! beside kv, ps, cache and shard.

use std::sync::Arc;

use fabrickv_rpc::{RegisterError, StatsService, Worker};
use fabrickv_transport::Reply;
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::{
    decode_partitions_request, encode_hello_reply, encode_partitions_reply, ServerInfo,
};
use fabrickv_wire::FrameKind;

use crate::cache::CacheService;
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
}

/// Worker `id`'s request layer with every service of the server
/// registered: kv, ps, cache, shard, then HELLO, STATS and PARTITIONS.
pub fn worker(id: u16, s: Services) -> Result<Worker, RegisterError> {
    let hello = HelloService::new(s.kv.server_info());
    let partitions = PartitionsService {
        parts: s.kv.partitions().clone(),
    };
    let services: [Box<dyn Service>; 7] = [
        Box::new(s.kv),
        Box::new(s.ps),
        Box::new(s.cache),
        Box::new(s.shard),
        Box::new(hello),
        Box::new(StatsService),
        Box::new(partitions),
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

#[cfg(test)]
mod tests;
