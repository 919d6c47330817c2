//! Running the control-plane server.
//!
//! [`serve`] and [`serve_with_listener`] run on the caller's tokio runtime.
//! [`ControlServer`] is for the FabricKV server process, whose data path runs
//! on its own threads without tokio: it starts a one-thread runtime on a
//! thread of its own, so that gRPC traffic costs the data path at most one
//! core's worth of scheduling, and a multi-threaded runtime does not spread
//! over the cores the data path needs.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use fabrickv_auth::Secret;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::service::InterceptorLayer;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use crate::auth::BearerCheck;
use crate::backend::CacheBackend;
use crate::pb;
use crate::service::CacheService;
use crate::{CONNECTION_WINDOW_BYTES, STREAM_WINDOW_BYTES};

/// How long a stopping server waits for requests under way to finish before
/// it drops them. Bounded so that shutdown (and dropping a
/// [`ControlServer`]) cannot hang on a client that never closes.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Most threads the server's runtime runs backend calls on at once. Each
/// may hold a request's value (up to 64 MiB) while it copies it, so the
/// bound also caps that memory; more would not help on a machine whose
/// cores belong to the data path.
pub const BLOCKING_THREADS_MAX: usize = 8;

/// Most requests one HTTP/2 connection may have under way at once. tonic
/// decodes a whole request before the handler runs, so this bounds the
/// memory one connection can pin to this many maximal messages.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 16;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listening socket or the runtime could not be set up.
    #[error("control server I/O: {0}")]
    Io(#[from] io::Error),
    /// tonic failed while serving.
    #[error("control server transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The reflection service could not load the schema (a build defect).
    #[error("control server reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The server thread panicked.
    #[error("control server thread panicked")]
    Panicked,
}

/// Serves the control plane on `addr` until `shutdown` completes, on the
/// caller's tokio runtime. With `auth`, every call must carry it as a
/// bearer token ([`crate::auth`]).
pub async fn serve(
    addr: SocketAddr,
    backend: Arc<dyn CacheBackend>,
    auth: Option<Secret>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let listener = TcpListener::bind(addr).await?;
    serve_with_listener(listener, backend, auth, shutdown).await
}

/// Serves the control plane on an already bound listener until `shutdown`
/// completes. Binding first lets the caller learn the port (when it asked
/// for port 0) before anyone connects.
///
/// The server has the `KvCache` service and server reflection (v1 and
/// v1alpha, since grpcurl and older tools ask for either), all behind one
/// [`BearerCheck`] of `auth`: a layer, not a per-service interceptor, so
/// that no service added later can be left open by mistake.
pub async fn serve_with_listener(
    listener: TcpListener,
    backend: Arc<dyn CacheBackend>,
    auth: Option<Secret>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    serve_checked(listener, backend, BearerCheck::new(auth), shutdown).await
}

/// [`serve_with_listener`] with the caller's [`BearerCheck`] (one that
/// counts failures in the server's throttle).
pub async fn serve_checked(
    listener: TcpListener,
    backend: Arc<dyn CacheBackend>,
    check: BearerCheck,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    // Control messages are small and latency-bound; Nagle would hold them.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    Server::builder()
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_concurrent_streams(STREAMS_PER_CONNECTION_MAX)
        .layer(InterceptorLayer::new(check))
        .add_service(CacheService::new(backend).into_server())
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// The control-plane server running on a thread of its own.
///
/// [`ControlServer::start`] returns once the socket is bound and listening,
/// so clients can connect as soon as it returns. The server stops on
/// [`ControlServer::shutdown`] or when the handle is dropped.
#[derive(Debug)]
pub struct ControlServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), ServeError>>>,
}

impl ControlServer {
    /// Binds `addr` (port 0 picks a free port) and starts serving `backend`
    /// on a new thread named `fabrickv-grpc`; with `auth`, to callers that
    /// send it as a bearer token only.
    pub fn start(
        addr: SocketAddr,
        backend: Arc<dyn CacheBackend>,
        auth: Option<Secret>,
    ) -> Result<Self, ServeError> {
        ControlServer::start_checked(addr, backend, BearerCheck::new(auth))
    }

    /// [`ControlServer::start`] with the caller's [`BearerCheck`] (one
    /// that counts failures in the server's throttle).
    pub fn start_checked(
        addr: SocketAddr,
        backend: Arc<dyn CacheBackend>,
        check: BearerCheck,
    ) -> Result<Self, ServeError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(BLOCKING_THREADS_MAX)
            .thread_name("fabrickv-grpc-backend")
            .build()?;
        // Bind here, not on the new thread, so that a taken port is reported
        // to the caller and the bound address is known before returning.
        let std_listener = std::net::TcpListener::bind(addr)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let listener = {
            let _guard = runtime.enter();
            TcpListener::from_std(std_listener)?
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("fabrickv-grpc".into())
            .spawn(move || run(runtime, listener, backend, check, stop_rx))?;
        tracing::info!(%addr, "gRPC control plane listening");
        Ok(ControlServer {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The address the server listens on, with the actual port.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets requests under way finish (for at most
    /// [`SHUTDOWN_GRACE`]) and waits for the server thread to end.
    pub fn shutdown(mut self) -> Result<(), ServeError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            // An error means the thread is gone already; join says why.
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => thread.join().map_err(|_| ServeError::Panicked)?,
            None => Ok(()),
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if let Err(e) = self.stop_and_join() {
            tracing::warn!(error = %e, "gRPC control plane stopped with an error");
        }
    }
}

/// The server thread's body: serve until told to stop, then give requests
/// under way [`SHUTDOWN_GRACE`] to finish.
fn run(
    runtime: tokio::runtime::Runtime,
    listener: TcpListener,
    backend: Arc<dyn CacheBackend>,
    check: BearerCheck,
    stop: oneshot::Receiver<()>,
) -> Result<(), ServeError> {
    let (stopping_tx, stopping_rx) = oneshot::channel::<()>();
    let result = runtime.block_on(async move {
        let signal = async move {
            // A dropped sender (handle leaked without drop) also stops.
            let _ = stop.await;
            let _ = stopping_tx.send(());
        };
        let serving = serve_checked(listener, backend, check, signal);
        let grace = async move {
            if stopping_rx.await.is_ok() {
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            result = serving => result,
            () = grace => {
                tracing::warn!("gRPC control plane: requests still under way after the grace period were dropped");
                Ok(())
            }
        }
    });
    // Backend calls already running on the blocking pool cannot be
    // interrupted; wait for them for a bounded time only.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    tracing::info!("gRPC control plane stopped");
    result
}
