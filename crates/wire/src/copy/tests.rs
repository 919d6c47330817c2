//! Round trips and refusals of the copy's payloads and frames.

use fabrickv_types::{Digest, ErrorCode};

use super::*;

fn digest() -> Digest {
    let mut d = Digest::default();
    d.add(b"", b"empty key");
    d.add(b"k", b"v");
    d
}

#[test]
fn control_payloads_round_trip() {
    let mut b = Vec::new();
    let cp = CheckpointRequest {
        ranges: 3,
        boundaries: vec![b"g", b"p"],
    };
    cp.encode(&mut b);
    assert_eq!(CheckpointRequest::decode(&b), Ok(cp));

    let st = StartRequest {
        run_id: 9,
        token: 77,
        streams: 2,
        resume: vec![ResumePoint {
            range: 1,
            done: false,
            next_seq: 5,
            digest: digest(),
            after: Vec::new(),
        }],
    };
    b.clear();
    st.encode(&mut b);
    assert_eq!(StartRequest::decode(&b), Ok(st));

    let status = Status {
        state: CopyState::Error,
        ready: true,
        error: ErrorCode::StorageFailed,
        ranges: 2,
        ranges_done: 1,
        pairs_sent: 10,
        bytes_sent: 100,
        pairs_estimate: 20,
        bytes_estimate: 200,
        message: "disk".into(),
        boundaries: vec![b"m".to_vec()],
    };
    b.clear();
    status.encode(&mut b);
    assert_eq!(Status::decode(&b), Ok(status));
}

#[test]
fn frames_and_pairs_round_trip_the_empty_key_included() {
    let h = DataFrameHeader {
        kind: DataFrameKind::Data,
        range: 4,
        pairs: 2,
        seq: 12,
        payload_len: 30,
        digest: digest(),
    };
    assert_eq!(DataFrameHeader::decode(&h.encode()), Ok(h));
    let mut p = Vec::new();
    put_pair(&mut p, b"", b"empty key");
    put_pair(&mut p, b"k", b"");
    let got: Vec<_> = Pairs::new(&p).collect::<Result<_, _>>().expect("pairs");
    assert_eq!(
        got,
        vec![(&b""[..], &b"empty key"[..]), (&b"k"[..], &b""[..])]
    );
    let opening = StreamOpening {
        run_id: 1,
        token: 2,
        stream: 3,
    };
    assert_eq!(StreamOpening::decode(&opening.encode()), Ok(opening));
}

#[test]
fn bad_input_is_refused_never_panics() {
    assert!(CheckpointRequest::decode(&[0; 8]).is_err(), "0 ranges");
    let mut b = Vec::new();
    CheckpointRequest {
        ranges: 3,
        boundaries: vec![b"p", b"g"],
    }
    .encode(&mut b);
    assert!(CheckpointRequest::decode(&b).is_err(), "descending");
    let mut h = DataFrameHeader {
        kind: DataFrameKind::Data,
        range: 0,
        pairs: 0,
        seq: 0,
        payload_len: 0,
        digest: Digest::default(),
    }
    .encode();
    h[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(DataFrameHeader::decode(&h).is_err(), "oversized payload");
    let mut p = Vec::new();
    put_pair(&mut p, b"key", b"value");
    p.truncate(p.len() - 1);
    assert!(Pairs::new(&p).any(|r| r.is_err()), "truncated pair");
    // Arbitrary bytes: errors, no panic.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for len in 0..300 {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let _ = CheckpointRequest::decode(&bytes);
        let _ = StartRequest::decode(&bytes);
        let _ = Status::decode(&bytes);
        let _ = Pairs::new(&bytes).count();
        let _ = decode_abort(&bytes);
    }
}

#[test]
fn the_data_host_is_the_addresss_ip_or_loopback() {
    use std::net::IpAddr;
    let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
    assert_eq!(data_host("10.1.2.3:7379"), ip("10.1.2.3"));
    assert_eq!(data_host("tcp://10.1.2.3:7379"), ip("10.1.2.3"));
    assert_eq!(
        data_host("fabric://tcp;ofi_rxm/10.1.2.3:7379"),
        ip("10.1.2.3")
    );
    assert_eq!(data_host("tcp://[::1]:7379"), ip("::1"));
    assert_eq!(data_host("shm://copy-1"), ip("127.0.0.1"));
    assert_eq!(data_host("inproc://x"), ip("127.0.0.1"));
}
