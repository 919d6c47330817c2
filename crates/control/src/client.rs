//! A blocking client of the `KvCache` service.
//!
//! FabricKV's client library and tools are synchronous (their data path has
//! no async runtime), so this wrapper owns a tokio runtime with a single
//! worker thread and blocks on each call. Callers that are async already should use
//! the generated [`KvCacheClient`], connected by [`connect_async`].

use std::fmt;
use std::future::Future;
use std::time::Duration;

use fabrickv_auth::Secret;
use fabrickv_types::ErrorCode;
use prost::bytes::Bytes;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::auth::BearerToken;

use crate::backend::{Fetched, Placed, Registered, Registration, StatsSnapshot};
use crate::pb::{self, get_request, get_response, put_request};
use crate::status::{code_from_grpc, code_of, detail_of, grpc_code};
use crate::KvCacheClient;
use crate::{
    CONNECTION_WINDOW_BYTES, CONNECT_TIMEOUT, GRPC_MESSAGE_BYTES_MAX, REQUEST_TIMEOUT,
    STREAM_WINDOW_BYTES,
};

/// A failed control-plane call.
///
/// `code` is the exact FabricKV code when the server sent one (it always
/// does); otherwise it is derived from the gRPC code, which covers failures
/// that happen before a server answers (no connection, timeout, a message
/// over the size limit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ControlError {
    /// The stable FabricKV code: match on this.
    pub code: ErrorCode,
    /// The gRPC status code the error arrived with.
    pub grpc_code: Code,
    /// Detail for people, without the code prefix the server adds.
    pub message: String,
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl ControlError {
    /// Reads a status the way the server writes it.
    pub fn from_status(status: &Status) -> Self {
        let code = code_of(status);
        ControlError {
            code,
            grpc_code: status.code(),
            message: detail_of(status, code).to_owned(),
        }
    }

    /// A batch item's failure, as if it had been a call of its own.
    fn from_item(status: &pb::ItemStatus) -> Self {
        let code = u16::try_from(status.code)
            .ok()
            .and_then(ErrorCode::from_u16)
            .unwrap_or(ErrorCode::Internal);
        ControlError {
            code,
            grpc_code: grpc_code(code),
            message: status.message.clone(),
        }
    }

    fn transport(e: &tonic::transport::Error) -> Self {
        // The Display of a transport error is terse ("transport error");
        // the cause chain says what actually failed.
        let mut message = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        ControlError {
            code: code_from_grpc(Code::Unavailable),
            grpc_code: Code::Unavailable,
            message,
        }
    }

    fn protocol(message: &str) -> Self {
        ControlError {
            code: ErrorCode::Malformed,
            grpc_code: Code::Internal,
            message: message.to_owned(),
        }
    }
}

/// Timeouts and credentials of a [`ControlClient`].
#[derive(Debug, Clone, PartialEq)]
pub struct ClientOptions {
    /// Longest wait for the connection to be established.
    pub connect_timeout: Duration,
    /// Longest wait for any one call, transfer included.
    pub request_timeout: Duration,
    /// The cluster secret every call offers as its bearer token; `None`
    /// offers the process's ([`fabrickv_auth::client_secret`]: what the
    /// CLI's `--auth-token-file` or the environment set), if any.
    pub secret: Option<Secret>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: CONNECT_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            secret: None,
        }
    }
}

/// The channel a connected client calls through: every call gets the
/// bearer token of the cluster secret on its way out.
pub type AuthChannel = InterceptedService<Channel, BearerToken>;

/// Where a value to store comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutSource {
    /// The value itself, carried in the request.
    Value(Bytes),
    /// A range of a registered client's receive buffer.
    Client {
        /// The registered client.
        client_id: u64,
        /// Offset of the value in its buffer.
        offset: u64,
        /// Length of the value.
        length: u64,
    },
}

/// One item of [`ControlClient::batch_put`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutItem {
    /// The key.
    pub key: Bytes,
    /// The value or where to read it.
    pub source: PutSource,
    /// Time to live in seconds; 0 for none.
    pub ttl_seconds: u64,
}

/// Where a fetched value should go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetDest {
    /// Back in the reply.
    Inline,
    /// Into a registered client's receive buffer.
    Client {
        /// The registered client.
        client_id: u64,
        /// Where in its buffer; `None` lets the server choose.
        offset: Option<u64>,
    },
}

/// One item of [`ControlClient::batch_get`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetItem {
    /// The key.
    pub key: Bytes,
    /// Where the value should go.
    pub dest: GetDest,
}

/// A value found by [`ControlClient::batch_get`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Got {
    /// Returned inline.
    Value(Fetched),
    /// Written into the client's buffer.
    Placed(Placed),
}

/// Connects the generated async client to `target` (`host:port`,
/// `[::1]:50051`, or a full `http://` URI) with the settings
/// [`ControlClient`] uses: the timeouts, FabricKV's message size limit
/// ([`GRPC_MESSAGE_BYTES_MAX`]) and the large flow-control windows.
///
/// The connection's background task runs on the runtime this is awaited
/// on, so the client must be used on that runtime.
pub async fn connect_async(
    target: &str,
    options: &ClientOptions,
) -> Result<KvCacheClient<AuthChannel>, ControlError> {
    let secret = match &options.secret {
        Some(s) => Some(s.clone()),
        None => fabrickv_auth::client_secret().map_err(|e| ControlError {
            code: ErrorCode::AuthRequired,
            grpc_code: Code::Unauthenticated,
            message: e.to_string(),
        })?,
    };
    let token = BearerToken::new(secret.as_ref()).map_err(|message| ControlError {
        code: ErrorCode::AuthFailed,
        grpc_code: Code::Unauthenticated,
        message,
    })?;
    let uri = if target.contains("://") {
        target.to_owned()
    } else {
        format!("http://{target}")
    };
    let channel = Endpoint::from_shared(uri)
        .map_err(|e| ControlError::transport(&e))?
        .connect_timeout(options.connect_timeout)
        .timeout(options.request_timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .connect()
        .await
        .map_err(|e| ControlError::transport(&e))?;
    Ok(KvCacheClient::with_interceptor(channel, token)
        .max_decoding_message_size(GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(GRPC_MESSAGE_BYTES_MAX))
}

/// A blocking client of the `KvCache` service.
///
/// Cheap to share: calls take `&self`, and several threads may call at
/// once (they share one HTTP/2 connection). Being blocking, it must not be
/// called or dropped on a thread that is running an async runtime (tokio
/// panics there); async code uses [`connect_async`] instead.
#[derive(Debug)]
pub struct ControlClient {
    runtime: tokio::runtime::Runtime,
    inner: KvCacheClient<AuthChannel>,
}

impl ControlClient {
    /// Connects to `target` (`host:port`, `[::1]:50051`, or a full
    /// `http://` URI) with the default [`ClientOptions`].
    pub fn connect(target: &str) -> Result<Self, ControlError> {
        Self::connect_with(target, &ClientOptions::default())
    }

    /// Connects to `target` with the given timeouts.
    pub fn connect_with(target: &str, options: &ClientOptions) -> Result<Self, ControlError> {
        // One worker thread keeps the connection's task running between
        // calls, so that the client answers the server's HTTP/2 pings and
        // GOAWAY at once: with a current-thread runtime nothing would run
        // while the caller is not inside a call, and a server shutting down
        // gracefully would wait out its whole grace period for the pong.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .thread_name("fabrickv-grpc-client")
            .enable_all()
            .build()
            .map_err(|e| ControlError {
                code: ErrorCode::Internal,
                grpc_code: Code::Internal,
                message: format!("cannot start the client runtime: {e}"),
            })?;
        let inner = runtime.block_on(connect_async(target, options))?;
        Ok(ControlClient { runtime, inner })
    }

    /// Runs one call to completion on the client's runtime.
    fn call<T, F, Fut>(&self, f: F) -> Result<T, ControlError>
    where
        F: FnOnce(KvCacheClient<AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.runtime
            .block_on(f(self.inner.clone()))
            .map(tonic::Response::into_inner)
            .map_err(|s| ControlError::from_status(&s))
    }

    /// Stores `value` under `key`. `value` is taken as [`Bytes`] so that a
    /// large `Vec<u8>` is sent without a copy.
    pub fn put(
        &self,
        key: &[u8],
        value: impl Into<Bytes>,
        ttl_seconds: u64,
    ) -> Result<(), ControlError> {
        let req = put_request_of(PutItem {
            key: Bytes::copy_from_slice(key),
            source: PutSource::Value(value.into()),
            ttl_seconds,
        });
        self.call(|mut c| async move { c.put(req).await })?;
        Ok(())
    }

    /// Stores under `key` the `length` bytes at `offset` of registered
    /// client `client_id`'s receive buffer.
    pub fn put_from(
        &self,
        key: &[u8],
        client_id: u64,
        offset: u64,
        length: u64,
        ttl_seconds: u64,
    ) -> Result<(), ControlError> {
        let req = put_request_of(PutItem {
            key: Bytes::copy_from_slice(key),
            source: PutSource::Client {
                client_id,
                offset,
                length,
            },
            ttl_seconds,
        });
        self.call(|mut c| async move { c.put(req).await })?;
        Ok(())
    }

    /// Fetches the value of `key` inline; `None` when it is not stored.
    pub fn get_inline(&self, key: &[u8]) -> Result<Option<Fetched>, ControlError> {
        let req = get_request_of(GetItem {
            key: Bytes::copy_from_slice(key),
            dest: GetDest::Inline,
        });
        let reply = self.call(|mut c| async move { c.get(req).await })?;
        match got_of(reply)? {
            None => Ok(None),
            Some(Got::Value(f)) => Ok(Some(f)),
            Some(Got::Placed(_)) => Err(ControlError::protocol(
                "asked for the value inline, the server placed it",
            )),
        }
    }

    /// Has the value of `key` written into registered client `client_id`'s
    /// buffer, at `offset` or where the server chooses; `None` when it is
    /// not stored.
    pub fn get_to(
        &self,
        key: &[u8],
        client_id: u64,
        offset: Option<u64>,
    ) -> Result<Option<Placed>, ControlError> {
        let req = get_request_of(GetItem {
            key: Bytes::copy_from_slice(key),
            dest: GetDest::Client { client_id, offset },
        });
        let reply = self.call(|mut c| async move { c.get(req).await })?;
        match got_of(reply)? {
            None => Ok(None),
            Some(Got::Placed(p)) => Ok(Some(p)),
            Some(Got::Value(_)) => Err(ControlError::protocol(
                "asked for a placement, the server returned the value inline",
            )),
        }
    }

    /// Removes `key`; returns whether it was stored.
    pub fn delete(&self, key: &[u8]) -> Result<bool, ControlError> {
        let req = pb::DeleteRequest {
            key: Bytes::copy_from_slice(key),
        };
        Ok(self
            .call(|mut c| async move { c.delete(req).await })?
            .deleted)
    }

    /// Tells whether `key` is stored.
    pub fn exists(&self, key: &[u8]) -> Result<bool, ControlError> {
        let req = pb::ExistsRequest {
            key: Bytes::copy_from_slice(key),
        };
        Ok(self
            .call(|mut c| async move { c.exists(req).await })?
            .exists)
    }

    /// Stores several values. The outer error is a failure of the whole
    /// call; each inner result is one item's, in order.
    pub fn batch_put(
        &self,
        items: Vec<PutItem>,
    ) -> Result<Vec<Result<(), ControlError>>, ControlError> {
        let req = pb::BatchPutRequest {
            items: items.into_iter().map(put_request_of).collect(),
        };
        let reply = self.call(|mut c| async move { c.batch_put(req).await })?;
        Ok(reply.results.iter().map(item_result).collect())
    }

    /// Fetches several values. A missing key is `Ok(None)`; an item the
    /// reply had no room for fails with [`ErrorCode::ReplyFull`] and should
    /// be asked again.
    pub fn batch_get(
        &self,
        items: Vec<GetItem>,
    ) -> Result<Vec<Result<Option<Got>, ControlError>>, ControlError> {
        let req = pb::BatchGetRequest {
            items: items.into_iter().map(get_request_of).collect(),
        };
        let reply = self.call(|mut c| async move { c.batch_get(req).await })?;
        Ok(reply
            .results
            .into_iter()
            .map(|item| {
                item_status(item.status.as_ref())?;
                match item.response {
                    Some(r) => got_of(r),
                    None => Err(ControlError::protocol("a batch item has no response")),
                }
            })
            .collect())
    }

    /// Removes several keys; each inner result says whether that key was
    /// stored.
    pub fn batch_delete<I, K>(
        &self,
        keys: I,
    ) -> Result<Vec<Result<bool, ControlError>>, ControlError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<[u8]>,
    {
        let req = pb::BatchDeleteRequest {
            keys: keys
                .into_iter()
                .map(|k| Bytes::copy_from_slice(k.as_ref()))
                .collect(),
        };
        let reply = self.call(|mut c| async move { c.batch_delete(req).await })?;
        Ok(reply
            .results
            .iter()
            .map(|item| item_status(item.status.as_ref()).map(|()| item.deleted))
            .collect())
    }

    /// Registers this process as a client (client_id 0 asks the server to
    /// assign one).
    pub fn register(&self, registration: Registration) -> Result<Registered, ControlError> {
        let req = pb::RegisterClientRequest {
            client_id: registration.client_id,
            addresses: registration.addresses,
            receive_buffer_bytes: registration.receive_buffer_bytes,
        };
        let r = self.call(|mut c| async move { c.register_client(req).await })?;
        Ok(Registered {
            client_id: r.client_id,
            heartbeat_interval_ms: r.heartbeat_interval_ms,
            heartbeat_timeout_ms: r.heartbeat_timeout_ms,
            data_plane: r.data_plane,
        })
    }

    /// Renews a registration; returns the milliseconds until it lapses.
    pub fn heartbeat(&self, client_id: u64) -> Result<u64, ControlError> {
        let req = pb::HeartbeatRequest { client_id };
        let r = self.call(|mut c| async move { c.heartbeat(req).await })?;
        Ok(r.expires_in_ms)
    }

    /// Releases a registration; returns whether it existed.
    pub fn unregister(&self, client_id: u64) -> Result<bool, ControlError> {
        let req = pb::UnregisterClientRequest { client_id };
        Ok(self
            .call(|mut c| async move { c.unregister_client(req).await })?
            .released)
    }

    /// Reads the server's counters, sorted by name.
    pub fn stats(&self) -> Result<StatsSnapshot, ControlError> {
        let r = self.call(|mut c| async move { c.stats(pb::StatsRequest {}).await })?;
        let mut counters: Vec<(String, u64)> = r.counters.into_iter().collect();
        counters.sort_unstable();
        Ok(StatsSnapshot {
            counters,
            fragmentation: r.fragmentation,
        })
    }
}

fn put_request_of(item: PutItem) -> pb::PutRequest {
    let source = match item.source {
        PutSource::Value(v) => put_request::Source::Value(v),
        PutSource::Client {
            client_id,
            offset,
            length,
        } => put_request::Source::Location(pb::Location {
            client_id,
            offset,
            length,
        }),
    };
    pb::PutRequest {
        key: item.key,
        source: Some(source),
        ttl_seconds: item.ttl_seconds,
    }
}

fn get_request_of(item: GetItem) -> pb::GetRequest {
    let dest = match item.dest {
        GetDest::Inline => get_request::Dest::Inline(pb::Inline {}),
        GetDest::Client { client_id, offset } => {
            get_request::Dest::Placement(pb::Placement { client_id, offset })
        }
    };
    pb::GetRequest {
        key: item.key,
        dest: Some(dest),
    }
}

fn got_of(r: pb::GetResponse) -> Result<Option<Got>, ControlError> {
    if !r.found {
        return Ok(None);
    }
    match r.data {
        Some(get_response::Data::Value(value)) => Ok(Some(Got::Value(Fetched {
            value,
            expires_in_ms: r.expires_in_ms,
        }))),
        Some(get_response::Data::Offset(offset)) => Ok(Some(Got::Placed(Placed {
            offset,
            length: r.length,
            expires_in_ms: r.expires_in_ms,
        }))),
        None => Err(ControlError::protocol(
            "a found value has neither data nor offset",
        )),
    }
}

fn item_status(status: Option<&pb::ItemStatus>) -> Result<(), ControlError> {
    match status {
        Some(s) if s.code == u32::from(ErrorCode::Ok.as_u16()) => Ok(()),
        Some(s) => Err(ControlError::from_item(s)),
        None => Err(ControlError::protocol("a batch item has no status")),
    }
}

fn item_result(status: &pb::ItemStatus) -> Result<(), ControlError> {
    item_status(Some(status))
}
