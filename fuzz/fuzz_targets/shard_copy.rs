//! Arbitrary bytes into every persistent-shard and copy decoder: the SHARD
//! frame prefix, the data ops' payloads, the copy's control payloads, data
//! frame headers, openings and DATA payloads. Each must refuse or accept
//! without panicking, and what it accepts must keep within its bounds.

#![no_main]

use fabrickv_types::limits::{SHARD_KEY_BYTES_MAX, SHARD_NAME_BYTES_MAX, SHARD_VALUE_BYTES_MAX};
use fabrickv_wire::copy::{
    decode_abort, CheckpointRequest, DataFrameHeader, Pairs, StartRequest, Status, StreamOpening,
    COPY_FRAME_PAYLOAD_BYTES_MAX, COPY_RANGES_MAX, COPY_STREAMS_MAX, DATA_FRAME_HEADER_BYTES,
    STREAM_OPENING_BYTES,
};
use fabrickv_wire::shard_data::{decode_get_reply, decode_keys, decode_pairs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The data ops' payloads.
    if let Ok(keys) = decode_keys(data) {
        for k in keys.iter() {
            assert!(k.len() <= SHARD_KEY_BYTES_MAX);
        }
    }
    if let Ok(pairs) = decode_pairs(data) {
        for (k, v) in pairs.iter() {
            assert!(k.len() <= SHARD_KEY_BYTES_MAX && v.len() <= SHARD_VALUE_BYTES_MAX);
        }
    }
    if let Ok(results) = decode_get_reply(data) {
        for r in results.iter() {
            let _ = r;
        }
    }
    // The copy's control payloads.
    if let Ok(c) = CheckpointRequest::decode(data) {
        assert!(c.ranges >= 1 && c.ranges <= COPY_RANGES_MAX);
        assert!(c.boundaries.is_empty() || c.boundaries.len() as u32 == c.ranges - 1);
        assert!(c.boundaries.windows(2).all(|w| w[0] < w[1]));
    }
    if let Ok(s) = StartRequest::decode(data) {
        assert!(s.streams >= 1 && s.streams <= COPY_STREAMS_MAX);
        assert!(s.resume.len() <= COPY_RANGES_MAX as usize);
    }
    if let Ok(s) = Status::decode(data) {
        assert!(s.ready || s.boundaries.is_empty());
    }
    let _ = decode_abort(data);
    // Data streams.
    if let Some(h) = data.first_chunk::<DATA_FRAME_HEADER_BYTES>() {
        if let Ok(h) = DataFrameHeader::decode(h) {
            assert!(h.payload_len as usize <= COPY_FRAME_PAYLOAD_BYTES_MAX);
            assert_eq!(DataFrameHeader::decode(&h.encode()), Ok(h));
        }
    }
    if let Some(h) = data.first_chunk::<STREAM_OPENING_BYTES>() {
        if let Ok(h) = StreamOpening::decode(h) {
            assert_eq!(StreamOpening::decode(&h.encode()), Ok(h));
        }
    }
    let mut tiled = 0usize;
    for p in Pairs::new(data) {
        match p {
            Ok((k, v)) => tiled += 8 + k.len() + v.len(),
            Err(_) => break,
        }
    }
    assert!(tiled <= data.len());
    // The SHARD frame prefix: names are bounded UTF-8.
    let header = fabrickv_wire::FrameHeader {
        kind: fabrickv_wire::FrameKind::Shard,
        op_count: 0,
        request_id: 1,
        body_len: data.len() as u32,
        checksum: 0,
        worker: 0,
        status: 0,
        map_epoch: 0,
    };
    let frame = fabrickv_wire::Frame { header, body: data };
    if let Ok(m) = fabrickv_wire::shard::decode_request(&frame) {
        assert!(m.name.len() <= SHARD_NAME_BYTES_MAX);
        assert!(m.name.len() + m.payload.len() + 8 == data.len());
    }
});
