//! Encode, then decode: whatever the builders write within the protocol's
//! bounds must decode to exactly what was written. Covers request batches,
//! response batches and the HELLO, STATS and ERROR bodies.

#![no_main]

use arbitrary::Arbitrary;
use fabrickv_types::limits::{
    BATCH_OPS_MAX, ERROR_MESSAGE_BYTES_MAX, KEY_BYTES_MAX, STAT_NAME_BYTES_MAX, TTL_MS_MAX,
};
use fabrickv_types::ErrorCode;
use fabrickv_wire::control::{
    decode_error, decode_hello_reply, decode_stats_reply, encode_error, encode_hello_reply,
    encode_stats_reply, ServerInfo,
};
use fabrickv_wire::{
    decode_frame, FrameKind, OpCode, PutCondition, RequestBuilder, RequestIter, ResponseBuilder,
    ResponseIter,
};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Cond {
    Always,
    IfAbsent,
    IfPresent,
}

impl Cond {
    fn wire(&self) -> PutCondition {
        match self {
            Cond::Always => PutCondition::Always,
            Cond::IfAbsent => PutCondition::IfAbsent,
            Cond::IfPresent => PutCondition::IfPresent,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum FuzzOp {
    Get(Vec<u8>),
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        ttl_ms: u64,
        cond: Cond,
    },
    Delete(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// Junk before the frame: frames may start anywhere in a buffer.
    lead: Vec<u8>,
    request_id: u64,
    worker: u16,
    ops: Vec<FuzzOp>,
    /// (status index into `ErrorCode::ALL`, value) per result.
    results: Vec<(u8, Vec<u8>)>,
    hello: (u16, u32, bool, u32, u32, u32),
    /// Statistic names; cut to ASCII below (see `ascii`).
    stats: Vec<(String, u64)>,
    error_code: u8,
    error_message: String,
}

/// Brings a fuzzed key into 1..=KEY_BYTES_MAX bytes.
fn key(k: &[u8]) -> Vec<u8> {
    let mut k = k[..k.len().min(KEY_BYTES_MAX)].to_vec();
    if k.is_empty() {
        k.push(0);
    }
    k
}

/// Keeps the ASCII characters of a name. Statistic names are ASCII by
/// protocol; `encode_stats_reply` cuts long names by bytes, which would
/// split a multi-byte character (reported separately, not fuzzed here).
fn ascii(s: &str) -> String {
    s.chars().filter(char::is_ascii).collect()
}

fn code(i: u8) -> ErrorCode {
    ErrorCode::ALL[usize::from(i) % ErrorCode::ALL.len()]
}

fuzz_target!(|input: Input| {
    requests(&input);
    responses(&input);
    control(&input);
});

fn requests(input: &Input) {
    let mut buf = input.lead.clone();
    let mut b = RequestBuilder::new(&mut buf, input.request_id, input.worker);
    let mut sent = Vec::new();
    for op in &input.ops {
        let (k, v) = match op {
            FuzzOp::Get(k) | FuzzOp::Delete(k) => (key(k), Vec::new()),
            FuzzOp::Put { key: k, value, .. } => (key(k), value.clone()),
        };
        if !b.fits(k.len(), v.len()) {
            break;
        }
        match op {
            FuzzOp::Get(_) => {
                b.get(&k);
                sent.push((OpCode::Get, k, v, 0, PutCondition::Always));
            }
            FuzzOp::Put { ttl_ms, cond, .. } => {
                let ttl = ttl_ms % (TTL_MS_MAX + 1);
                b.put(&k, &v, ttl, cond.wire());
                sent.push((OpCode::Put, k, v, ttl, cond.wire()));
            }
            FuzzOp::Delete(_) => {
                b.delete(&k);
                sent.push((OpCode::Delete, k, v, 0, PutCondition::Always));
            }
        }
    }
    assert!(sent.len() <= BATCH_OPS_MAX);
    b.finish();
    let frame = decode_frame(&buf[input.lead.len()..]).expect("builder output decodes");
    assert_eq!(frame.header.kind, FrameKind::Request);
    assert_eq!(frame.header.request_id, input.request_id);
    assert_eq!(frame.header.worker, input.worker);
    assert_eq!(frame.header.status, 0);
    assert_eq!(usize::from(frame.header.op_count), sent.len());
    let got: Vec<_> = RequestIter::new(&frame)
        .expect("builder output parses")
        .collect();
    assert_eq!(got.len(), sent.len());
    for (g, (op, k, v, ttl, cond)) in got.iter().zip(&sent) {
        assert_eq!(g.check(), Ok((*op, *cond)));
        assert_eq!(g.key, &k[..]);
        assert_eq!(g.value, &v[..]);
        assert_eq!(g.ttl_ms, *ttl);
    }
}

fn responses(input: &Input) {
    let mut buf = input.lead.clone();
    let mut b = ResponseBuilder::new(&mut buf, input.request_id, input.worker);
    let results = &input.results[..input.results.len().min(BATCH_OPS_MAX)];
    for (s, v) in results {
        b.result(code(*s), v);
    }
    b.finish();
    let frame = decode_frame(&buf[input.lead.len()..]).expect("builder output decodes");
    assert_eq!(frame.header.kind, FrameKind::Response);
    assert_eq!(frame.header.request_id, input.request_id);
    let got: Vec<_> = ResponseIter::new(&frame)
        .expect("builder output parses")
        .collect();
    assert_eq!(got.len(), results.len());
    for (g, (s, v)) in got.iter().zip(results) {
        assert_eq!(g.code(), code(*s));
        assert_eq!(g.status, code(*s).as_u16());
        assert_eq!(g.value, &v[..]);
    }
}

fn control(input: &Input) {
    let (workers, partitions, store_mode, key_max, value_max, batch_max) = input.hello;
    let info = ServerInfo {
        workers: workers.max(1),
        partitions: partitions.max(1),
        store_mode,
        key_bytes_max: key_max,
        value_bytes_max: value_max,
        batch_ops_max: batch_max,
    };
    let mut buf = Vec::new();
    encode_hello_reply(&mut buf, input.request_id, input.worker, &info);
    let frame = decode_frame(&buf).expect("hello reply decodes");
    assert_eq!(decode_hello_reply(&frame), Ok(info));

    let names: Vec<(String, u64)> = input.stats.iter().map(|(n, v)| (ascii(n), *v)).collect();
    let pairs: Vec<(&str, u64)> = names.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let mut buf = Vec::new();
    encode_stats_reply(&mut buf, input.request_id, input.worker, &pairs);
    let frame = decode_frame(&buf).expect("stats reply decodes");
    let got = decode_stats_reply(&frame).expect("stats reply parses");
    let want: Vec<(String, u64)> = pairs
        .iter()
        .take(BATCH_OPS_MAX)
        .map(|(n, v)| (n[..n.len().min(STAT_NAME_BYTES_MAX)].to_string(), *v))
        .collect();
    assert_eq!(got, want);

    let c = code(input.error_code);
    let mut buf = Vec::new();
    encode_error(
        &mut buf,
        input.request_id,
        input.worker,
        c,
        &input.error_message,
    );
    let frame = decode_frame(&buf).expect("error frame decodes");
    assert_eq!(frame.header.status, c.as_u16());
    let (got_code, message) = decode_error(&frame).expect("error frame parses");
    assert_eq!(got_code, c);
    assert!(message.len() <= ERROR_MESSAGE_BYTES_MAX);
    assert!(input.error_message.starts_with(&message));
    // The cut lands on the last character boundary within the bound.
    let next_char = input.error_message[message.len()..].chars().next();
    if let Some(ch) = next_char {
        assert!(message.len() + ch.len_utf8() > ERROR_MESSAGE_BYTES_MAX);
    }
}
