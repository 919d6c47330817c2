//! Every bound of FabricKV, as a named constant whose name ends in its unit.
//!
//! A request that breaks one of these bounds is refused with a stable error
//! code before anything is allocated for it. Servers size their buffers by
//! adding these up, so that memory use has a ceiling known at start-up.

/// Longest key accepted anywhere, in bytes (memcached's convention).
pub const KEY_BYTES_MAX: usize = 250;

/// Key length of the HERD fast path, in bytes: 16-byte keys (hashes of
/// integers in HERD) are the common case the engine is tuned for.
pub const HERD_KEY_BYTES: usize = 16;

/// Largest value carried inline in a native frame, in bytes (1 MiB, like
/// memcached's default item size ceiling). Larger values belong to the
/// cache service, which moves them one-sided.
pub const VALUE_BYTES_MAX: usize = 1 << 20;

/// Largest value the in-memory kv holds, in bytes (512 MiB, Redis's
/// `proto-max-bulk-len`). Values over [`VALUE_BYTES_MAX`] are kept by the
/// engine as separately allocated large objects and travel over RESP
/// (where the connection reads them straight into their final buffer) and
/// over the native protocol as chunks of at most [`LARGE_CHUNK_BYTES_MAX`]
/// (PUT_CHUNK / GET_CHUNK operations, one frame each).
pub const LARGE_VALUE_BYTES_MAX: usize = 512 << 20;

/// Most value bytes one native PUT_CHUNK or GET_CHUNK operation carries,
/// in bytes (a frame's worth: 1 MiB).
pub const LARGE_CHUNK_BYTES_MAX: usize = VALUE_BYTES_MAX;

/// Most operations one native frame may carry.
pub const BATCH_OPS_MAX: usize = 512;

/// Size of the fixed native frame header, in bytes.
pub const FRAME_HEADER_BYTES: usize = 32;

/// Size of the per-operation header inside a request body, in bytes
/// (opcode, flags, key length, value length, time-to-live).
pub const OP_HEADER_BYTES: usize = 16;

/// Size of the per-result header inside a response body, in bytes.
pub const RESULT_HEADER_BYTES: usize = 8;

/// Largest native frame body, in bytes. Big enough for one maximal value
/// with its key and headers, or a full batch of HERD-sized operations.
pub const FRAME_BODY_BYTES_MAX: usize = VALUE_BYTES_MAX + KEY_BYTES_MAX + 4096;

/// Largest native frame including its header, in bytes.
pub const FRAME_BYTES_MAX: usize = FRAME_HEADER_BYTES + FRAME_BODY_BYTES_MAX;

/// Largest transport message, in bytes: a frame and nothing more. A stream
/// that announces a longer message has corrupt framing and is closed.
pub const MESSAGE_BYTES_MAX: usize = FRAME_BYTES_MAX;

/// Longest error message carried in an error frame, in bytes.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 256;

/// Longest statistic name in a stats reply, in bytes.
pub const STAT_NAME_BYTES_MAX: usize = 64;

/// Most connections one server accepts at once, over all workers.
pub const CONNECTIONS_MAX: usize = 4096;

/// Most connections waiting for their transport handshake at once.
pub const HANDSHAKES_PENDING_MAX: usize = 256;

/// How long a new connection may take to send its handshake, in
/// milliseconds, before it is closed.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 5_000;

/// How long a connection may hold a partially received message, in
/// milliseconds, before it is closed (the slow-loris bound).
pub const PARTIAL_MESSAGE_TIMEOUT_MS: u64 = 10_000;

/// Most reply bytes a server queues for one connection before it stops
/// reading that connection's requests, in bytes. A client that pipelines
/// without reading its replies is throttled, not allowed to grow memory.
pub const CONN_SEND_QUEUE_BYTES_MAX: usize = 2 * FRAME_BYTES_MAX;

/// Most workers (data-path threads) in one server.
pub const WORKERS_MAX: usize = 256;

/// Most engine partitions in one server (`--partitions`): a PARTITIONS
/// reply carries 18 bytes per partition, 72 KiB at this bound.
pub const PARTITIONS_MAX: usize = 4096;

/// Partitions per worker when `--partitions` is not given: enough that a
/// hot partition can move to an idle worker and leave its old one others
/// to serve, few enough that a 2-worker server's 8 partitions each get a
/// useful share of memory.
pub const PARTITIONS_PER_WORKER_DEFAULT: usize = 4;

const _: () = assert!(WORKERS_MAX * PARTITIONS_PER_WORKER_DEFAULT <= PARTITIONS_MAX);
const _: () = assert!(PARTITIONS_MAX <= u16::MAX as usize);

/// Longest time-to-live accepted, in seconds (10 years).
pub const TTL_SECS_MAX: u64 = 10 * 365 * 24 * 3600;

/// Longest time-to-live accepted, in milliseconds.
pub const TTL_MS_MAX: u64 = TTL_SECS_MAX * 1000;

const _: () = assert!(HERD_KEY_BYTES <= KEY_BYTES_MAX);
const _: () = assert!(
    KEY_BYTES_MAX <= u8::MAX as usize,
    "key length travels in one byte"
);
const _: () = assert!(
    BATCH_OPS_MAX <= u16::MAX as usize,
    "op count travels in two bytes"
);
const _: () = assert!(
    FRAME_BYTES_MAX <= u32::MAX as usize,
    "frame length travels in four bytes"
);
const _: () = assert!(
    FRAME_BODY_BYTES_MAX >= OP_HEADER_BYTES + KEY_BYTES_MAX + VALUE_BYTES_MAX,
    "one maximal PUT must fit in a frame"
);
const _: () = assert!(
    FRAME_BODY_BYTES_MAX >= RESULT_HEADER_BYTES + VALUE_BYTES_MAX,
    "one maximal GET reply must fit in a frame"
);
const _: () = assert!(
    FRAME_BODY_BYTES_MAX >= RESULT_HEADER_BYTES * BATCH_OPS_MAX + VALUE_BYTES_MAX,
    "the first GET of any batch always fits its reply, so a resent GET makes progress"
);
const _: () = assert!(WORKERS_MAX <= u16::MAX as usize);

/// Most keys one embedding pull or push request carries (PetPS sends up to
/// about 500 per request). Clients split larger calls into several requests.
pub const PS_KEYS_PER_REQUEST_MAX: usize = BATCH_OPS_MAX;

/// Largest embedding dimension, in f32 elements (a 64 KiB vector).
pub const PS_DIM_MAX: usize = 16 * 1024;

/// Most embedding tables one server holds.
pub const PS_TABLES_MAX: usize = 256;

/// Longest embedding table name, in bytes.
pub const PS_TABLE_NAME_BYTES_MAX: usize = 64;

const _: () = assert!(PS_KEYS_PER_REQUEST_MAX >= 500, "PetPS batches of 500 fit");
const _: () = assert!(
    PS_DIM_MAX * 4 + 64 <= FRAME_BODY_BYTES_MAX,
    "one pushed vector fits a frame"
);

/// Longest KV-cache key, in bytes (inference engines key blocks by long
/// prefix hashes and model names).
pub const CACHE_KEY_BYTES_MAX: usize = 1024;

/// Largest KV-cache value, in bytes (64 MiB).
pub const CACHE_VALUE_BYTES_MAX: usize = 64 << 20;

/// Most keys of one batch Put/Get/Delete call (gRPC and native).
pub const CACHE_BATCH_KEYS_MAX: usize = 1024;

/// Largest piece of a value one native frame carries over a transport
/// without one-sided writes (512 KiB): bigger values travel as several
/// chunks, each one frame.
pub const CACHE_CHUNK_BYTES_MAX: usize = 512 << 10;

/// Most client registrations a cache server holds at once.
pub const CACHE_CLIENTS_MAX: usize = 4096;

/// Largest receive buffer a client may register, in bytes (4 GiB).
pub const CACHE_CLIENT_BUFFER_BYTES_MAX: u64 = 4 << 30;

/// A client whose last heartbeat is older than this is released, in ms.
pub const CACHE_HEARTBEAT_TIMEOUT_MS: u64 = 30_000;

const _: () = assert!(
    CACHE_CHUNK_BYTES_MAX + CACHE_KEY_BYTES_MAX + 4096 <= FRAME_BODY_BYTES_MAX,
    "one chunk and its key fit a frame"
);

/// Longest shard name on the wire and on the command line, in bytes.
pub const SHARD_NAME_BYTES_MAX: usize = 64;

/// Shards one server serves at once.
pub const SHARDS_MAX: usize = 64;

/// Longest key a persistent shard stores, in bytes (fjall's own limit is
/// 64 KiB; a key is something a client names, a value is the payload).
/// Here rather than in the storage crate because the shard data ops and
/// the copy streams carry such keys, and their codecs do not depend on
/// the storage engine.
pub const SHARD_KEY_BYTES_MAX: usize = 16 << 10;

/// Largest value a persistent shard stores, in bytes.
pub const SHARD_VALUE_BYTES_MAX: usize = 64 << 20;
