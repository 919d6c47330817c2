//! Bodies of the control frames: HELLO, STATS and ERROR.
//!
//! ```text
//! HelloReply body (24 bytes):
//!   0 u16 workers       data-path workers (one connection each)
//!   2 u16 reserved
//!   4 u32 partitions    keys map to partitions by KeyHash::partition
//!   8 u8  mode          0 = cache, 1 = store
//!   9 u8[3] reserved
//!  12 u32 key_bytes_max
//!  16 u32 value_bytes_max
//!  20 u32 batch_ops_max
//! StatsReply body: op_count entries of
//!   u8 name_len, name (ASCII, <= STAT_NAME_BYTES_MAX), u64 value
//! Error body: a UTF-8 message of at most ERROR_MESSAGE_BYTES_MAX bytes;
//!   the header's status field carries the ErrorCode.
//! Partitions body: empty (show the table), or 8 bytes (move, then show):
//!   0 u32 partition
//!   4 u16 worker        the partition's new owner
//!   6 u16 reserved
//! PartitionsReply body (16 + 18 per partition bytes):
//!   0 u64 epoch         bumped by every move; 0 at start
//!   8 u16 workers
//!  10 u16 reserved
//!  12 u32 partitions
//!  16 per partition: u16 owner, u64 ops, u64 misrouted
//! Checkpoint body (4 + to_len bytes):
//!   0 u8  op            0 = status, 1 = start a save
//!   1 u8  reserved
//!   2 u16 to_len        a save's directory (UTF-8; empty: the server's
//!                       checkpoint root), then to_len bytes of it
//! CheckpointReply body (32 + dir_len + error_len bytes):
//!   0 u64 finished      saves finished (well or not) since start
//!   8 u64 last_ok_unix_s  when the last good save finished (0: none)
//!  16 u64 generation    the last good save's generation
//!  24 u8  saving        1 while a save runs
//!  25 u8  failed        1 if the last save to finish failed
//!  26 u16 dir_len       the last good save's directory, then
//!  28 u16 error_len     the last failure's message (when failed)
//!  30 u16 reserved
//!  32 dir, error
//! ```

use fabrickv_types::limits::{
    BATCH_OPS_MAX, ERROR_MESSAGE_BYTES_MAX, PARTITIONS_MAX, STAT_NAME_BYTES_MAX,
};
use fabrickv_types::ErrorCode;

use crate::header::{finish_frame, Frame, FrameHeader, FrameKind, WireError};
use crate::{le_u16, le_u32, le_u64};

/// Size of a HelloReply body, in bytes.
pub const HELLO_REPLY_BODY_BYTES: usize = 24;

/// The server's shape and limits, as told to a client at connect time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerInfo {
    /// Data-path workers; the client opens one connection to each.
    pub workers: u16,
    /// Partitions that keys hash into.
    pub partitions: u32,
    /// True in store mode (lossless), false in cache mode (may evict).
    pub store_mode: bool,
    /// Longest key the server accepts, in bytes.
    pub key_bytes_max: u32,
    /// Largest value the server accepts, in bytes.
    pub value_bytes_max: u32,
    /// Most operations per frame the server accepts.
    pub batch_ops_max: u32,
}

/// Appends a HELLO request frame.
pub fn encode_hello(out: &mut Vec<u8>, request_id: u64, worker: u16) {
    let s = FrameHeader::begin(out, FrameKind::Hello, request_id, worker, 0);
    finish_frame(out, s, 0);
}

/// Appends a HelloReply frame.
pub fn encode_hello_reply(out: &mut Vec<u8>, request_id: u64, worker: u16, info: &ServerInfo) {
    let s = FrameHeader::begin(out, FrameKind::HelloReply, request_id, worker, 0);
    out.extend_from_slice(&info.workers.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&info.partitions.to_le_bytes());
    out.push(u8::from(info.store_mode));
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(&info.key_bytes_max.to_le_bytes());
    out.extend_from_slice(&info.value_bytes_max.to_le_bytes());
    out.extend_from_slice(&info.batch_ops_max.to_le_bytes());
    finish_frame(out, s, 0);
}

/// Reads a HelloReply body.
pub fn decode_hello_reply(frame: &Frame<'_>) -> Result<ServerInfo, WireError> {
    let b = frame.body;
    if frame.header.kind != FrameKind::HelloReply || b.len() != HELLO_REPLY_BODY_BYTES {
        return Err(WireError::Malformed("not a hello reply"));
    }
    let info = ServerInfo {
        workers: le_u16(b, 0),
        partitions: le_u32(b, 4),
        store_mode: b[8] != 0,
        key_bytes_max: le_u32(b, 12),
        value_bytes_max: le_u32(b, 16),
        batch_ops_max: le_u32(b, 20),
    };
    if info.workers == 0 || info.partitions == 0 {
        return Err(WireError::Malformed(
            "hello reply with no workers or partitions",
        ));
    }
    Ok(info)
}

/// Bytes of a PartitionsReply body before its per-partition entries.
pub const PARTITIONS_REPLY_HEAD_BYTES: usize = 16;

/// Bytes of one partition's entry in a PartitionsReply.
pub const PARTITION_ENTRY_BYTES: usize = 18;

/// Bytes of a Partitions request that moves a partition.
pub const PARTITION_MOVE_BYTES: usize = 8;

/// Which worker serves each partition (the partition table), with each
/// partition's counters, as a PARTITIONS reply carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartitionTable {
    /// Bumped by every move: two tables of one server with the same
    /// epoch are the same table.
    pub epoch: u64,
    /// The server's worker count.
    pub workers: u16,
    /// The worker that serves each partition uncontended, by partition.
    pub owners: Vec<u16>,
    /// Native kv operations executed on each partition, by any worker.
    pub ops: Vec<u64>,
    /// Of those, operations executed by a worker not owning the partition
    /// (sent by a client whose table was stale).
    pub misrouted: Vec<u64>,
}

/// One partition moving to another worker, as a PARTITIONS request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionMove {
    /// The partition.
    pub partition: u32,
    /// Its new owner.
    pub worker: u16,
}

/// Appends a PARTITIONS request: `None` asks for the table, `Some` moves a
/// partition first.
pub fn encode_partitions_request(
    out: &mut Vec<u8>,
    request_id: u64,
    worker: u16,
    mv: Option<PartitionMove>,
) {
    let s = FrameHeader::begin(out, FrameKind::Partitions, request_id, worker, 0);
    if let Some(m) = mv {
        out.extend_from_slice(&m.partition.to_le_bytes());
        out.extend_from_slice(&m.worker.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
    }
    finish_frame(out, s, 0);
}

/// Reads a PARTITIONS request: the move it asks for, if any.
pub fn decode_partitions_request(frame: &Frame<'_>) -> Result<Option<PartitionMove>, WireError> {
    let b = frame.body;
    if frame.header.kind != FrameKind::Partitions {
        return Err(WireError::Malformed("not a partitions request"));
    }
    match b.len() {
        0 => Ok(None),
        PARTITION_MOVE_BYTES if le_u16(b, 6) == 0 => Ok(Some(PartitionMove {
            partition: le_u32(b, 0),
            worker: le_u16(b, 4),
        })),
        _ => Err(WireError::Malformed("partitions request of a wrong length")),
    }
}

/// Appends a PartitionsReply frame.
pub fn encode_partitions_reply(
    out: &mut Vec<u8>,
    request_id: u64,
    worker: u16,
    t: &PartitionTable,
) {
    let s = FrameHeader::begin(out, FrameKind::PartitionsReply, request_id, worker, 0);
    let n = t.owners.len().min(PARTITIONS_MAX);
    out.extend_from_slice(&t.epoch.to_le_bytes());
    out.extend_from_slice(&t.workers.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(n as u32).to_le_bytes());
    for i in 0..n {
        out.extend_from_slice(&t.owners[i].to_le_bytes());
        out.extend_from_slice(&t.ops.get(i).copied().unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&t.misrouted.get(i).copied().unwrap_or(0).to_le_bytes());
    }
    finish_frame(out, s, 0);
}

/// Reads a PartitionsReply body; every owner must name one of the
/// server's workers.
pub fn decode_partitions_reply(frame: &Frame<'_>) -> Result<PartitionTable, WireError> {
    let b = frame.body;
    if frame.header.kind != FrameKind::PartitionsReply || b.len() < PARTITIONS_REPLY_HEAD_BYTES {
        return Err(WireError::Malformed("not a partitions reply"));
    }
    let workers = le_u16(b, 8);
    let n = le_u32(b, 12) as usize;
    if workers == 0 || n == 0 || n > PARTITIONS_MAX {
        return Err(WireError::Malformed(
            "partitions reply with no workers, or no or too many partitions",
        ));
    }
    if b.len() != PARTITIONS_REPLY_HEAD_BYTES + n * PARTITION_ENTRY_BYTES {
        return Err(WireError::Malformed("partitions reply of a wrong length"));
    }
    let mut t = PartitionTable {
        epoch: le_u64(b, 0),
        workers,
        owners: Vec::with_capacity(n),
        ops: Vec::with_capacity(n),
        misrouted: Vec::with_capacity(n),
    };
    for i in 0..n {
        let at = PARTITIONS_REPLY_HEAD_BYTES + i * PARTITION_ENTRY_BYTES;
        let owner = le_u16(b, at);
        if owner >= workers {
            return Err(WireError::Malformed("a partition owned by no such worker"));
        }
        t.owners.push(owner);
        t.ops.push(le_u64(b, at + 2));
        t.misrouted.push(le_u64(b, at + 10));
    }
    Ok(t)
}

/// Longest directory a CHECKPOINT frame names, and longest path or
/// message its reply carries, in bytes.
pub const CHECKPOINT_TEXT_BYTES_MAX: usize = 4096;

/// Bytes of a CheckpointReply body before its two strings.
pub const CHECKPOINT_REPLY_HEAD_BYTES: usize = 32;

/// What a CHECKPOINT frame asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointRequest {
    /// How saves went (nothing is started).
    Status,
    /// Start a save into this directory ("" for the checkpoint root);
    /// the reply is the status just after it started.
    Save(String),
}

/// The server's checkpoint status, as a CHECKPOINT reply carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckpointStatus {
    /// Saves that finished since the server started, well or not: a save
    /// started when this was N has finished when it is past N.
    pub finished: u64,
    /// Unix seconds when the last good save finished (0: none yet).
    pub last_ok_unix_s: u64,
    /// The last good save's generation (its directory's number).
    pub generation: u64,
    /// Whether a save is running.
    pub saving: bool,
    /// The last good save's directory on the server.
    pub dir: String,
    /// Why the last save to finish failed, if it did.
    pub error: Option<String>,
}

/// Appends a CHECKPOINT request.
pub fn encode_checkpoint_request(
    out: &mut Vec<u8>,
    request_id: u64,
    worker: u16,
    req: &CheckpointRequest,
) {
    let s = FrameHeader::begin(out, FrameKind::Checkpoint, request_id, worker, 0);
    let (op, to) = match req {
        CheckpointRequest::Status => (0u8, ""),
        CheckpointRequest::Save(to) => (1u8, to.as_str()),
    };
    let to = &to.as_bytes()[..char_floor(to, CHECKPOINT_TEXT_BYTES_MAX)];
    out.push(op);
    out.push(0);
    out.extend_from_slice(&(to.len() as u16).to_le_bytes());
    out.extend_from_slice(to);
    finish_frame(out, s, 0);
}

/// Reads a CHECKPOINT request.
pub fn decode_checkpoint_request(frame: &Frame<'_>) -> Result<CheckpointRequest, WireError> {
    let b = frame.body;
    if frame.header.kind != FrameKind::Checkpoint || b.len() < 4 || b[1] != 0 {
        return Err(WireError::Malformed("not a checkpoint request"));
    }
    let n = usize::from(le_u16(b, 2));
    if n > CHECKPOINT_TEXT_BYTES_MAX || b.len() != 4 + n {
        return Err(WireError::Malformed("checkpoint request of a wrong length"));
    }
    let to = std::str::from_utf8(&b[4..])
        .map_err(|_| WireError::Malformed("checkpoint directory is not UTF-8"))?;
    match (b[0], n) {
        (0, 0) => Ok(CheckpointRequest::Status),
        (1, _) => Ok(CheckpointRequest::Save(to.to_string())),
        _ => Err(WireError::Malformed("unknown checkpoint operation")),
    }
}

/// Appends a CheckpointReply frame; strings over
/// `CHECKPOINT_TEXT_BYTES_MAX` are cut on a character boundary.
pub fn encode_checkpoint_reply(
    out: &mut Vec<u8>,
    request_id: u64,
    worker: u16,
    st: &CheckpointStatus,
) {
    let s = FrameHeader::begin(out, FrameKind::CheckpointReply, request_id, worker, 0);
    let dir = &st.dir.as_bytes()[..char_floor(&st.dir, CHECKPOINT_TEXT_BYTES_MAX)];
    let err = st.error.as_deref().unwrap_or("");
    let err = &err.as_bytes()[..char_floor(err, CHECKPOINT_TEXT_BYTES_MAX)];
    out.extend_from_slice(&st.finished.to_le_bytes());
    out.extend_from_slice(&st.last_ok_unix_s.to_le_bytes());
    out.extend_from_slice(&st.generation.to_le_bytes());
    out.push(u8::from(st.saving));
    out.push(u8::from(st.error.is_some()));
    out.extend_from_slice(&(dir.len() as u16).to_le_bytes());
    out.extend_from_slice(&(err.len() as u16).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(dir);
    out.extend_from_slice(err);
    finish_frame(out, s, 0);
}

/// Reads a CheckpointReply body.
pub fn decode_checkpoint_reply(frame: &Frame<'_>) -> Result<CheckpointStatus, WireError> {
    let b = frame.body;
    if frame.header.kind != FrameKind::CheckpointReply || b.len() < CHECKPOINT_REPLY_HEAD_BYTES {
        return Err(WireError::Malformed("not a checkpoint reply"));
    }
    let dir_len = usize::from(le_u16(b, 26));
    let err_len = usize::from(le_u16(b, 28));
    let flags_ok = b[24] <= 1 && b[25] <= 1 && le_u16(b, 30) == 0;
    if !flags_ok
        || dir_len > CHECKPOINT_TEXT_BYTES_MAX
        || err_len > CHECKPOINT_TEXT_BYTES_MAX
        || b.len() != CHECKPOINT_REPLY_HEAD_BYTES + dir_len + err_len
    {
        return Err(WireError::Malformed("checkpoint reply of a wrong shape"));
    }
    let text = |at: usize, n: usize| {
        std::str::from_utf8(&b[at..at + n])
            .map(str::to_string)
            .map_err(|_| WireError::Malformed("checkpoint reply text is not UTF-8"))
    };
    let dir = text(CHECKPOINT_REPLY_HEAD_BYTES, dir_len)?;
    let error = text(CHECKPOINT_REPLY_HEAD_BYTES + dir_len, err_len)?;
    Ok(CheckpointStatus {
        finished: le_u64(b, 0),
        last_ok_unix_s: le_u64(b, 8),
        generation: le_u64(b, 16),
        saving: b[24] == 1,
        dir,
        error: (b[25] == 1).then_some(error),
    })
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary, so a cut string stays valid UTF-8.
pub(crate) fn char_floor(s: &str, max: usize) -> usize {
    let mut cut = s.len().min(max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

/// Appends a STATS request frame.
pub fn encode_stats_request(out: &mut Vec<u8>, request_id: u64, worker: u16) {
    let s = FrameHeader::begin(out, FrameKind::Stats, request_id, worker, 0);
    finish_frame(out, s, 0);
}

/// Appends a StatsReply frame. Names longer than `STAT_NAME_BYTES_MAX`
/// are cut, and at most `BATCH_OPS_MAX` entries are written.
pub fn encode_stats_reply(out: &mut Vec<u8>, request_id: u64, worker: u16, stats: &[(&str, u64)]) {
    let s = FrameHeader::begin(out, FrameKind::StatsReply, request_id, worker, 0);
    let stats = &stats[..stats.len().min(BATCH_OPS_MAX)];
    for (name, value) in stats {
        let name = &name.as_bytes()[..char_floor(name, STAT_NAME_BYTES_MAX)];
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        out.extend_from_slice(&value.to_le_bytes());
    }
    finish_frame(out, s, stats.len() as u16);
}

/// Reads a StatsReply body into (name, value) pairs.
pub fn decode_stats_reply(frame: &Frame<'_>) -> Result<Vec<(String, u64)>, WireError> {
    if frame.header.kind != FrameKind::StatsReply {
        return Err(WireError::Malformed("not a stats reply"));
    }
    let mut b = frame.body;
    let mut out = Vec::with_capacity(usize::from(frame.header.op_count));
    for _ in 0..frame.header.op_count {
        let n = usize::from(
            *b.first()
                .ok_or(WireError::Malformed("stats entry overruns"))?,
        );
        if n > STAT_NAME_BYTES_MAX || b.len() < 1 + n + 8 {
            return Err(WireError::Malformed("stats entry overruns"));
        }
        let name = std::str::from_utf8(&b[1..1 + n])
            .map_err(|_| WireError::Malformed("stats name is not UTF-8"))?;
        out.push((name.to_string(), le_u64(b, 1 + n)));
        b = &b[1 + n + 8..];
    }
    if !b.is_empty() {
        return Err(WireError::Malformed("bytes after the last stats entry"));
    }
    Ok(out)
}

/// Appends an ERROR frame refusing the request `request_id`.
pub fn encode_error(
    out: &mut Vec<u8>,
    request_id: u64,
    worker: u16,
    code: ErrorCode,
    message: &str,
) {
    let s = FrameHeader::begin(out, FrameKind::Error, request_id, worker, code.as_u16());
    out.extend_from_slice(&message.as_bytes()[..char_floor(message, ERROR_MESSAGE_BYTES_MAX)]);
    finish_frame(out, s, 0);
}

/// Reads an ERROR frame: its code and message.
pub fn decode_error(frame: &Frame<'_>) -> Result<(ErrorCode, String), WireError> {
    if frame.header.kind != FrameKind::Error || frame.body.len() > ERROR_MESSAGE_BYTES_MAX {
        return Err(WireError::Malformed("not an error frame"));
    }
    let code = ErrorCode::from_u16(frame.header.status).unwrap_or(ErrorCode::Internal);
    Ok((code, String::from_utf8_lossy(frame.body).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode_frame;

    #[test]
    fn hello_round_trips() {
        let info = ServerInfo {
            workers: 4,
            partitions: 4,
            store_mode: true,
            key_bytes_max: 250,
            value_bytes_max: 1 << 20,
            batch_ops_max: 512,
        };
        let mut buf = Vec::new();
        encode_hello_reply(&mut buf, 1, 0, &info);
        let f = decode_frame(&buf).expect("frame");
        assert_eq!(decode_hello_reply(&f), Ok(info));
    }

    #[test]
    fn partitions_round_trip_and_owners_are_checked() {
        let mut buf = Vec::new();
        let mv = PartitionMove {
            partition: 7,
            worker: 1,
        };
        encode_partitions_request(&mut buf, 2, 0, Some(mv));
        let f = decode_frame(&buf).expect("frame");
        assert_eq!(decode_partitions_request(&f), Ok(Some(mv)));
        buf.clear();
        encode_partitions_request(&mut buf, 2, 0, None);
        let f = decode_frame(&buf).expect("frame");
        assert_eq!(decode_partitions_request(&f), Ok(None));

        let mut t = PartitionTable {
            epoch: 9,
            workers: 2,
            owners: vec![0, 1, 1],
            ops: vec![5, 6, 7],
            misrouted: vec![0, 1, 0],
        };
        buf.clear();
        encode_partitions_reply(&mut buf, 3, 0, &t);
        let f = decode_frame(&buf).expect("frame");
        assert_eq!(decode_partitions_reply(&f), Ok(t.clone()));
        t.owners[2] = 2;
        buf.clear();
        encode_partitions_reply(&mut buf, 3, 0, &t);
        let f = decode_frame(&buf).expect("frame");
        assert!(decode_partitions_reply(&f).is_err(), "owner 2 of 2 workers");
    }

    #[test]
    fn checkpoint_frames_round_trip_and_refuse_bad_shapes() {
        let mut buf = Vec::new();
        for req in [
            CheckpointRequest::Status,
            CheckpointRequest::Save(String::new()),
            CheckpointRequest::Save("nightly/é".into()),
        ] {
            buf.clear();
            encode_checkpoint_request(&mut buf, 4, 0, &req);
            let f = decode_frame(&buf).expect("frame");
            assert_eq!(decode_checkpoint_request(&f), Ok(req));
        }
        let st = CheckpointStatus {
            finished: 3,
            last_ok_unix_s: 1_800_000_000,
            generation: 1_800_000_000_123,
            saving: true,
            dir: "/var/lib/fkv/ckpt-1".into(),
            error: Some("disk full".into()),
        };
        buf.clear();
        encode_checkpoint_reply(&mut buf, 4, 0, &st);
        let f = decode_frame(&buf).expect("frame");
        assert_eq!(decode_checkpoint_reply(&f), Ok(st.clone()));
        let ok = CheckpointStatus { error: None, ..st };
        buf.clear();
        encode_checkpoint_reply(&mut buf, 4, 0, &ok);
        let f = decode_frame(&buf).expect("frame");
        assert_eq!(decode_checkpoint_reply(&f), Ok(ok));
        // A status request that carries a directory, an unknown
        // operation, and a length that overruns are all refused.
        for body in [
            &[0u8, 0, 1, 0, b'x'][..],
            &[7, 0, 0, 0],
            &[1, 0, 9, 0, b'x'],
        ] {
            buf.clear();
            let s = FrameHeader::begin(&mut buf, FrameKind::Checkpoint, 1, 0, 0);
            buf.extend_from_slice(body);
            finish_frame(&mut buf, s, 0);
            let f = decode_frame(&buf).expect("frame");
            assert!(decode_checkpoint_request(&f).is_err(), "{body:?}");
        }
    }

    #[test]
    fn stats_round_trip() {
        let mut buf = Vec::new();
        encode_stats_reply(&mut buf, 5, 1, &[("hits", 10), ("misses", 2)]);
        let f = decode_frame(&buf).expect("frame");
        assert_eq!(
            decode_stats_reply(&f),
            Ok(vec![("hits".to_string(), 10), ("misses".to_string(), 2)])
        );
    }

    #[test]
    fn long_stat_names_are_cut_on_a_character_boundary() {
        let name = format!("a{}", "é".repeat(40));
        let mut buf = Vec::new();
        encode_stats_reply(&mut buf, 1, 0, &[(&name, 7)]);
        let f = decode_frame(&buf).expect("frame");
        let got = decode_stats_reply(&f).expect("decodable");
        assert!(got[0].0.len() <= STAT_NAME_BYTES_MAX && name.starts_with(&got[0].0));
        assert_eq!(got[0].1, 7);
    }

    #[test]
    fn error_round_trips_and_is_bounded() {
        let mut buf = Vec::new();
        let long = "é".repeat(ERROR_MESSAGE_BYTES_MAX);
        encode_error(&mut buf, 3, 0, ErrorCode::BatchTooLarge, &long);
        let f = decode_frame(&buf).expect("frame");
        let (code, msg) = decode_error(&f).expect("error frame");
        assert_eq!(code, ErrorCode::BatchTooLarge);
        assert!(msg.len() <= ERROR_MESSAGE_BYTES_MAX && msg.starts_with('é'));
    }
}
