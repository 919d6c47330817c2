//! The `KvCache` gRPC service: request checking and the hop to the backend.
//!
//! Every request is checked against the limits in `fabrickv_types::limits`
//! here, before the backend is called, so that a store implementation never
//! sees an over-long key or an over-large value and every refusal carries the
//! same code whichever backend runs. Backend calls then run on tokio's
//! blocking pool: they may copy megabytes or wait on the data plane, and the
//! runtime thread must stay free to keep other connections moving.

use std::collections::HashMap;
use std::sync::Arc;

use fabrickv_types::limits::{
    CACHE_BATCH_KEYS_MAX, CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX, TTL_SECS_MAX,
};
use fabrickv_types::ErrorCode;
use prost::bytes::Bytes;
use tonic::{Request, Response, Status};

use crate::backend::{BackendError, CacheBackend, Caller, ClientRange, Registration};
use crate::pb::{self, get_request, get_response, put_request};
use crate::status::{item_err, item_ok, to_status};

/// Most data-plane address strings one RegisterClient may carry. Real
/// clients announce a handful (one per transport and NIC); the bound keeps a
/// registration's memory small on a server holding thousands of them.
pub const REGISTER_ADDRESSES_MAX: usize = 64;

/// Longest data-plane address string, in bytes. Room for a serialized
/// fabric address plus a memory-region descriptor, written out as text.
pub const REGISTER_ADDRESS_BYTES_MAX: usize = 4096;

/// The `KvCache` service over a [`CacheBackend`].
#[derive(Clone)]
pub struct CacheService {
    backend: Arc<dyn CacheBackend>,
}

impl std::fmt::Debug for CacheService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheService").finish_non_exhaustive()
    }
}

impl CacheService {
    /// A service that serves `backend`.
    pub fn new(backend: Arc<dyn CacheBackend>) -> Self {
        CacheService { backend }
    }

    /// Wraps the service in the generated tonic server with the message
    /// size limits set to [`GRPC_MESSAGE_BYTES_MAX`](crate::GRPC_MESSAGE_BYTES_MAX),
    /// ready to add to a `tonic::transport::Server`.
    pub fn into_server(self) -> pb::kv_cache_server::KvCacheServer<CacheService> {
        pb::kv_cache_server::KvCacheServer::new(self)
            .max_decoding_message_size(crate::GRPC_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(crate::GRPC_MESSAGE_BYTES_MAX)
    }

    /// Runs `f` against the backend on the blocking pool. A panic in the
    /// backend becomes an INTERNAL status for this request instead of taking
    /// the server down.
    async fn blocking<T, F>(&self, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&dyn CacheBackend) -> T + Send + 'static,
    {
        let backend = Arc::clone(&self.backend);
        tokio::task::spawn_blocking(move || f(backend.as_ref()))
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "cache backend call panicked");
                to_status(ErrorCode::Internal, "the backend failed")
            })
    }
}

fn refuse(code: ErrorCode, message: String) -> BackendError {
    BackendError::new(code, message)
}

fn check_key(key: &[u8]) -> Result<(), BackendError> {
    if key.is_empty() {
        return Err(refuse(ErrorCode::KeyTooLong, "the key is empty".into()));
    }
    if key.len() > CACHE_KEY_BYTES_MAX {
        return Err(refuse(
            ErrorCode::KeyTooLong,
            format!(
                "the key is {} bytes; at most {CACHE_KEY_BYTES_MAX} are allowed",
                key.len()
            ),
        ));
    }
    Ok(())
}

fn check_value_len(len: u64) -> Result<(), BackendError> {
    if len > CACHE_VALUE_BYTES_MAX as u64 {
        return Err(refuse(
            ErrorCode::ValueTooLarge,
            format!("the value is {len} bytes; at most {CACHE_VALUE_BYTES_MAX} are allowed"),
        ));
    }
    Ok(())
}

/// Checks a ttl and converts it to the milliseconds the backend takes.
fn ttl_ms(ttl_seconds: u64) -> Result<u64, BackendError> {
    if ttl_seconds > TTL_SECS_MAX {
        return Err(refuse(
            ErrorCode::TtlTooLarge,
            format!("ttl_seconds is {ttl_seconds}; at most {TTL_SECS_MAX} is allowed"),
        ));
    }
    // Cannot overflow: TTL_SECS_MAX * 1000 is far below u64::MAX.
    Ok(ttl_seconds * 1000)
}

fn check_batch_len(len: usize) -> Result<(), Status> {
    if len > CACHE_BATCH_KEYS_MAX {
        return Err(to_status(
            ErrorCode::BatchTooLarge,
            &format!("the batch has {len} items; at most {CACHE_BATCH_KEYS_MAX} are allowed"),
        ));
    }
    Ok(())
}

/// A Put that passed the checks.
enum PutOp {
    Inline {
        key: Bytes,
        value: Bytes,
        ttl_ms: u64,
    },
    FromClient {
        key: Bytes,
        location: pb::Location,
        ttl_ms: u64,
    },
}

impl PutOp {
    fn parse(req: pb::PutRequest) -> Result<PutOp, BackendError> {
        check_key(&req.key)?;
        let ttl_ms = ttl_ms(req.ttl_seconds)?;
        match req.source {
            Some(put_request::Source::Value(value)) => {
                check_value_len(value.len() as u64)?;
                Ok(PutOp::Inline {
                    key: req.key,
                    value,
                    ttl_ms,
                })
            }
            Some(put_request::Source::Location(location)) => {
                check_value_len(location.length)?;
                if location.offset.checked_add(location.length).is_none() {
                    return Err(refuse(
                        ErrorCode::BufferTooSmall,
                        "offset + length overflows".into(),
                    ));
                }
                Ok(PutOp::FromClient {
                    key: req.key,
                    location,
                    ttl_ms,
                })
            }
            None => Err(refuse(
                ErrorCode::Malformed,
                "a Put needs a value or a location".into(),
            )),
        }
    }

    fn apply(&self, backend: &dyn CacheBackend) -> Result<(), BackendError> {
        match self {
            PutOp::Inline { key, value, ttl_ms } => backend.put(key, value, *ttl_ms),
            PutOp::FromClient {
                key,
                location,
                ttl_ms,
            } => {
                let from = ClientRange {
                    client_id: location.client_id,
                    offset: location.offset,
                    len: location.length,
                };
                backend.put_from_client(key, from, *ttl_ms)
            }
        }
    }
}

/// A Get that passed the checks.
struct GetOp {
    key: Bytes,
    /// `None`: inline; `Some`: written into that client's buffer.
    placement: Option<pb::Placement>,
}

impl GetOp {
    fn parse(req: pb::GetRequest) -> Result<GetOp, BackendError> {
        check_key(&req.key)?;
        let placement = match req.dest {
            None | Some(get_request::Dest::Inline(_)) => None,
            Some(get_request::Dest::Placement(p)) => Some(p),
        };
        Ok(GetOp {
            key: req.key,
            placement,
        })
    }

    fn apply(&self, backend: &dyn CacheBackend) -> Result<pb::GetResponse, BackendError> {
        match self.placement {
            None => Ok(match backend.get(&self.key)? {
                None => pb::GetResponse::default(),
                Some(f) => pb::GetResponse {
                    found: true,
                    length: f.value.len() as u64,
                    data: Some(get_response::Data::Value(f.value)),
                    expires_in_ms: f.expires_in_ms,
                },
            }),
            Some(p) => Ok(
                match backend.get_to_client(&self.key, p.client_id, p.offset)? {
                    None => pb::GetResponse::default(),
                    Some(placed) => pb::GetResponse {
                        found: true,
                        length: placed.length,
                        data: Some(get_response::Data::Offset(placed.offset)),
                        expires_in_ms: placed.expires_in_ms,
                    },
                },
            ),
        }
    }
}

/// Inline value bytes of a reply, for the BatchGet budget.
fn inline_len(r: &pb::GetResponse) -> usize {
    match &r.data {
        Some(get_response::Data::Value(v)) => v.len(),
        _ => 0,
    }
}

#[tonic::async_trait]
impl pb::kv_cache_server::KvCache for CacheService {
    async fn put(
        &self,
        request: Request<pb::PutRequest>,
    ) -> Result<Response<pb::PutResponse>, Status> {
        let op = PutOp::parse(request.into_inner())?;
        self.blocking(move |b| op.apply(b)).await??;
        Ok(Response::new(pb::PutResponse {}))
    }

    async fn get(
        &self,
        request: Request<pb::GetRequest>,
    ) -> Result<Response<pb::GetResponse>, Status> {
        let op = GetOp::parse(request.into_inner())?;
        let reply = self.blocking(move |b| op.apply(b)).await??;
        Ok(Response::new(reply))
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let key = request.into_inner().key;
        check_key(&key)?;
        let deleted = self.blocking(move |b| b.delete(&key)).await??;
        Ok(Response::new(pb::DeleteResponse { deleted }))
    }

    async fn exists(
        &self,
        request: Request<pb::ExistsRequest>,
    ) -> Result<Response<pb::ExistsResponse>, Status> {
        let key = request.into_inner().key;
        check_key(&key)?;
        let exists = self.blocking(move |b| b.exists(&key)).await??;
        Ok(Response::new(pb::ExistsResponse { exists }))
    }

    async fn batch_put(
        &self,
        request: Request<pb::BatchPutRequest>,
    ) -> Result<Response<pb::BatchPutResponse>, Status> {
        let items = request.into_inner().items;
        check_batch_len(items.len())?;
        // Refused items keep their error and never reach the backend; the
        // rest run in one trip to the blocking pool, in request order.
        let ops: Vec<Result<PutOp, BackendError>> = items.into_iter().map(PutOp::parse).collect();
        let results = self
            .blocking(move |b| {
                ops.iter()
                    .map(|op| match op {
                        Ok(op) => match op.apply(b) {
                            Ok(()) => item_ok(),
                            Err(e) => item_err(&e),
                        },
                        Err(e) => item_err(e),
                    })
                    .collect()
            })
            .await?;
        Ok(Response::new(pb::BatchPutResponse { results }))
    }

    async fn batch_get(
        &self,
        request: Request<pb::BatchGetRequest>,
    ) -> Result<Response<pb::BatchGetResponse>, Status> {
        let items = request.into_inner().items;
        check_batch_len(items.len())?;
        let ops: Vec<Result<GetOp, BackendError>> = items.into_iter().map(GetOp::parse).collect();
        let results = self
            .blocking(move |b| {
                // The reply must fit one gRPC message: inline values share a
                // budget of one maximal value (so the first always fits), and
                // an item that would overflow it is answered REPLY_FULL, to be
                // asked again, like a native batch whose reply frame is full.
                let mut budget = CACHE_VALUE_BYTES_MAX;
                ops.into_iter()
                    .map(|op| {
                        let result = op.and_then(|op| op.apply(b));
                        match result {
                            Ok(reply) if inline_len(&reply) > budget => pb::BatchGetItem {
                                status: Some(item_err(&refuse(
                                    ErrorCode::ReplyFull,
                                    "earlier values fill this reply; ask again".into(),
                                ))),
                                response: None,
                            },
                            Ok(reply) => {
                                budget -= inline_len(&reply);
                                pb::BatchGetItem {
                                    status: Some(item_ok()),
                                    response: Some(reply),
                                }
                            }
                            Err(e) => pb::BatchGetItem {
                                status: Some(item_err(&e)),
                                response: None,
                            },
                        }
                    })
                    .collect()
            })
            .await?;
        Ok(Response::new(pb::BatchGetResponse { results }))
    }

    async fn batch_delete(
        &self,
        request: Request<pb::BatchDeleteRequest>,
    ) -> Result<Response<pb::BatchDeleteResponse>, Status> {
        let keys = request.into_inner().keys;
        check_batch_len(keys.len())?;
        let results = self
            .blocking(move |b| {
                keys.iter()
                    .map(|key| match check_key(key).and_then(|()| b.delete(key)) {
                        Ok(deleted) => pb::BatchDeleteItem {
                            status: Some(item_ok()),
                            deleted,
                        },
                        Err(e) => pb::BatchDeleteItem {
                            status: Some(item_err(&e)),
                            deleted: false,
                        },
                    })
                    .collect()
            })
            .await?;
        Ok(Response::new(pb::BatchDeleteResponse { results }))
    }

    async fn register_client(
        &self,
        request: Request<pb::RegisterClientRequest>,
    ) -> Result<Response<pb::RegisterClientResponse>, Status> {
        let caller = caller_of(&request);
        let req = request.into_inner();
        if req.addresses.len() > REGISTER_ADDRESSES_MAX {
            return Err(to_status(
                ErrorCode::Malformed,
                &format!(
                    "{} addresses; at most {REGISTER_ADDRESSES_MAX} are allowed",
                    req.addresses.len()
                ),
            ));
        }
        if let Some(a) = req
            .addresses
            .iter()
            .find(|a| a.len() > REGISTER_ADDRESS_BYTES_MAX)
        {
            return Err(to_status(
                ErrorCode::Malformed,
                &format!(
                    "an address is {} bytes; at most {REGISTER_ADDRESS_BYTES_MAX} are allowed",
                    a.len()
                ),
            ));
        }
        let registration = Registration {
            client_id: req.client_id,
            addresses: req.addresses,
            receive_buffer_bytes: req.receive_buffer_bytes,
        };
        let r = self
            .blocking(move |b| b.register(&caller, registration))
            .await??;
        Ok(Response::new(pb::RegisterClientResponse {
            client_id: r.client_id,
            heartbeat_interval_ms: r.heartbeat_interval_ms,
            heartbeat_timeout_ms: r.heartbeat_timeout_ms,
            data_plane: r.data_plane,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let caller = caller_of(&request);
        let client_id = request.into_inner().client_id;
        let expires_in_ms = self
            .blocking(move |b| b.heartbeat(&caller, client_id))
            .await??;
        Ok(Response::new(pb::HeartbeatResponse {
            ok: true,
            expires_in_ms,
        }))
    }

    async fn unregister_client(
        &self,
        request: Request<pb::UnregisterClientRequest>,
    ) -> Result<Response<pb::UnregisterClientResponse>, Status> {
        let caller = caller_of(&request);
        let client_id = request.into_inner().client_id;
        let released = self
            .blocking(move |b| b.unregister(&caller, client_id))
            .await??;
        Ok(Response::new(pb::UnregisterClientResponse { released }))
    }

    async fn stats(
        &self,
        _request: Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsResponse>, Status> {
        let snapshot = self.blocking(|b| b.stats()).await?;
        Ok(Response::new(pb::StatsResponse {
            counters: snapshot.counters.into_iter().collect::<HashMap<_, _>>(),
            fragmentation: snapshot.fragmentation,
        }))
    }
}

/// Who sent `request`: its connection's peer address.
fn caller_of<T>(request: &Request<T>) -> Caller {
    Caller {
        peer: request.remote_addr(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_bounded_both_ways() {
        assert_eq!(
            check_key(b"").map_err(|e| e.code),
            Err(ErrorCode::KeyTooLong)
        );
        assert!(check_key(&[7; CACHE_KEY_BYTES_MAX]).is_ok());
        assert_eq!(
            check_key(&[7; CACHE_KEY_BYTES_MAX + 1]).map_err(|e| e.code),
            Err(ErrorCode::KeyTooLong)
        );
    }

    #[test]
    fn ttl_is_bounded_and_scaled() {
        assert_eq!(ttl_ms(0), Ok(0));
        assert_eq!(ttl_ms(TTL_SECS_MAX), Ok(TTL_SECS_MAX * 1000));
        assert_eq!(
            ttl_ms(TTL_SECS_MAX + 1).map_err(|e| e.code),
            Err(ErrorCode::TtlTooLarge)
        );
    }

    #[test]
    fn put_without_source_is_malformed() {
        let req = pb::PutRequest {
            key: Bytes::from_static(b"k"),
            source: None,
            ttl_seconds: 0,
        };
        assert!(matches!(
            PutOp::parse(req),
            Err(BackendError {
                code: ErrorCode::Malformed,
                ..
            })
        ));
    }

    #[test]
    fn location_range_must_not_wrap() {
        let req = pb::PutRequest {
            key: Bytes::from_static(b"k"),
            source: Some(put_request::Source::Location(pb::Location {
                client_id: 1,
                offset: u64::MAX,
                length: 2,
            })),
            ttl_seconds: 0,
        };
        assert!(matches!(
            PutOp::parse(req),
            Err(BackendError {
                code: ErrorCode::BufferTooSmall,
                ..
            })
        ));
    }
}
