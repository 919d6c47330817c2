//! Arbitrary bytes as one transport message: every decoder of the native
//! protocol must refuse or accept them without panicking, and what it
//! accepts must agree with the bytes and with the bounds.
//!
//! Random bytes almost never start with the magic or carry a matching
//! CRC-32C (and libFuzzer learns 4- and 8-byte comparisons, not the 2-byte
//! magic), so each input is decoded twice: as given, which exercises every
//! refusal, and with magic, version, `body_len` and `checksum` patched to
//! fit, which takes the fuzzer to the kind, bound and body checks.

#![no_main]

use fabrickv_types::limits::{
    BATCH_OPS_MAX, ERROR_MESSAGE_BYTES_MAX, FRAME_BODY_BYTES_MAX, FRAME_HEADER_BYTES,
    KEY_BYTES_MAX, PS_DIM_MAX, PS_TABLES_MAX, PS_TABLE_NAME_BYTES_MAX, STAT_NAME_BYTES_MAX,
    TTL_MS_MAX, VALUE_BYTES_MAX,
};
use fabrickv_types::{ErrorCode, KeyHash};
use fabrickv_wire::control::{
    decode_checkpoint_reply, decode_checkpoint_request, decode_error, decode_hello_reply,
    decode_stats_reply, CheckpointRequest, CHECKPOINT_TEXT_BYTES_MAX,
};
use fabrickv_wire::ps;
use fabrickv_wire::{
    decode_frame, FrameHeader, OpCode, RequestIter, ResponseIter, WireError, MAGIC, VERSION,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    check_message(data);
    if data.len() >= FRAME_HEADER_BYTES {
        let mut fixed = data.to_vec();
        fixed[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        fixed[2] = VERSION;
        let body_len = (fixed.len() - FRAME_HEADER_BYTES) as u32;
        let crc = crc32c(&fixed[FRAME_HEADER_BYTES..]);
        fixed[16..20].copy_from_slice(&body_len.to_le_bytes());
        fixed[20..24].copy_from_slice(&crc.to_le_bytes());
        // The independent CRC-32C below must agree with the codec's.
        assert_ne!(decode_frame(&fixed).err(), Some(WireError::BadChecksum));
        check_message(&fixed);
    }
});

fn check_message(msg: &[u8]) {
    let header = FrameHeader::decode(msg);
    let frame = match decode_frame(msg) {
        Ok(f) => f,
        Err(e) => {
            // Every refusal maps to a stable code that is not success.
            assert_ne!(e.code(), ErrorCode::Ok);
            let _ = e.to_string();
            return;
        }
    };
    assert_eq!(
        header,
        Ok(frame.header),
        "decode_frame disagrees with the header"
    );
    let h = frame.header;
    assert!(usize::from(h.op_count) <= BATCH_OPS_MAX);
    assert!(h.body_len as usize <= FRAME_BODY_BYTES_MAX);
    assert_eq!(frame.body.len(), h.body_len as usize);
    assert_eq!(frame.body, &msg[FRAME_HEADER_BYTES..]);

    if let Ok(ops) = RequestIter::new(&frame) {
        assert_eq!(ops.len(), usize::from(h.op_count));
        let mut n = 0usize;
        let mut body_bytes = 0usize;
        for op in ops {
            n += 1;
            body_bytes += 16 + op.key.len() + op.value.len();
            match op.check() {
                Ok((code, _cond)) => {
                    assert!(!op.key.is_empty() && op.key.len() <= KEY_BYTES_MAX);
                    assert!(op.ttl_ms <= TTL_MS_MAX);
                    match code {
                        OpCode::Put => assert!(op.value.len() <= VALUE_BYTES_MAX),
                        OpCode::PutChunk => {
                            // The chunk lies within a large value's bounds.
                            let c = op.put_chunk().expect("checked");
                            assert!(!c.bytes.is_empty() && c.bytes.len() <= VALUE_BYTES_MAX);
                            assert!(c.total as usize > VALUE_BYTES_MAX);
                            assert!(c.offset + c.bytes.len() as u64 <= c.total);
                        }
                        OpCode::GetChunk => {
                            let c = op.get_chunk().expect("checked");
                            assert!(c.len >= 1 && c.len as usize <= VALUE_BYTES_MAX);
                            assert!(op.ttl_ms == 0 && op.flags == 0);
                        }
                        OpCode::Get | OpCode::Delete => {
                            assert!(op.value.is_empty() && op.ttl_ms == 0 && op.flags == 0)
                        }
                    }
                    // What the server does next: steer the key.
                    for parts in [1u32, 3, 4, 255] {
                        assert!(KeyHash::of(op.key).partition(parts) < parts);
                    }
                }
                Err(code) => assert_ne!(code, ErrorCode::Ok),
            }
        }
        assert_eq!(n, usize::from(h.op_count), "iterator stopped early");
        assert_eq!(
            body_bytes,
            frame.body.len(),
            "operations do not tile the body"
        );
    }

    if let Ok(results) = ResponseIter::new(&frame) {
        assert_eq!(results.len(), usize::from(h.op_count));
        let mut n = 0usize;
        let mut body_bytes = 0usize;
        for r in results {
            n += 1;
            body_bytes += 8 + r.value.len();
            assert!(r.value.len() <= VALUE_BYTES_MAX);
            // A status this side does not know is never read as success.
            if r.status != 0 {
                assert_ne!(r.code(), ErrorCode::Ok);
            }
        }
        assert_eq!(n, usize::from(h.op_count), "iterator stopped early");
        assert_eq!(body_bytes, frame.body.len(), "results do not tile the body");
    }

    if let Ok(info) = decode_hello_reply(&frame) {
        assert!(info.workers > 0 && info.partitions > 0);
    }
    if let Ok(stats) = decode_stats_reply(&frame) {
        assert_eq!(stats.len(), usize::from(h.op_count));
        for (name, _) in &stats {
            assert!(name.len() <= STAT_NAME_BYTES_MAX);
        }
    }
    // A checkpoint request names at most a bounded directory, and a reply
    // carries bounded texts.
    if let Ok(CheckpointRequest::Save(to)) = decode_checkpoint_request(&frame) {
        assert!(to.len() <= CHECKPOINT_TEXT_BYTES_MAX);
    }
    if let Ok(st) = decode_checkpoint_reply(&frame) {
        assert!(st.dir.len() <= CHECKPOINT_TEXT_BYTES_MAX);
        assert!(st.error.map_or(0, |e| e.len()) <= CHECKPOINT_TEXT_BYTES_MAX);
    }
    // The embedding (PS) decoders: what they accept agrees with the header.
    if let Ok(req) = ps::decode_request(&frame) {
        match req {
            ps::PsRequest::Create(rest) => {
                if let Ok(spec) = ps::decode_create(rest) {
                    assert!(spec.dim >= 1 && spec.dim as usize <= PS_DIM_MAX);
                    assert!(spec.lr.is_finite() && spec.lr >= 0.0);
                }
            }
            ps::PsRequest::Open(name) => assert!(name.len() <= PS_TABLE_NAME_BYTES_MAX),
            ps::PsRequest::List => assert_eq!(h.op_count, 0),
            ps::PsRequest::Pull { keys, .. } => {
                assert_eq!(keys.len(), 8 * usize::from(h.op_count))
            }
            ps::PsRequest::Push { keys, values, .. } => {
                let n = usize::from(h.op_count);
                assert_eq!(keys.len(), 8 * n);
                assert!(n == 0 && values.is_empty() || n > 0 && values.len() % (4 * n) == 0);
            }
        }
    }
    if let Ok(r) = ps::decode_reply(&frame) {
        if r.op == ps::PsOp::List {
            if let Ok(tables) = ps::decode_list(r.rest) {
                assert!(tables.len() <= PS_TABLES_MAX);
            }
        }
        let _ = ps::decode_desc(r.rest);
    }
    if let Ok((code, message)) = decode_error(&frame) {
        if h.status != 0 {
            assert_ne!(code, ErrorCode::Ok);
        }
        // Lossy UTF-8 decoding may grow the text, never past 3 bytes a byte.
        assert!(message.len() <= 3 * ERROR_MESSAGE_BYTES_MAX);
    }
}

/// CRC-32C (Castagnoli, reflected, polynomial 0x82F63B78), written out
/// here so the fuzz crate needs no dependency beyond the crates it tests.
fn crc32c(b: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in b {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82F6_3B78 & 0u32.wrapping_sub(crc & 1));
        }
    }
    !crc
}
