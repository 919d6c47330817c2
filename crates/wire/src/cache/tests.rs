use super::*;
use crate::decode_frame;

fn req(msg: &[u8]) -> CacheRequest<'_> {
    decode_request(&decode_frame(msg).expect("frame")).expect("request")
}

fn slice() -> RegionSlice {
    RegionSlice {
        region: [7; REGION_BYTES],
        offset: 4096,
        len: 1 << 20,
    }
}

#[test]
fn requests_round_trip() {
    let mut m = Vec::new();
    encode_put_chunk(&mut m, 1, 0, b"k1", 9, 500, 10, 4, b"abc");
    assert_eq!(
        req(&m),
        CacheRequest::Put {
            key: b"k1",
            transfer: 9,
            ttl_ms: 500,
            total_len: 10,
            offset: 4,
            source: PutSource::Inline(b"abc"),
        }
    );
    m.clear();
    encode_put_from_region(&mut m, 1, 0, b"k2", 0, &slice());
    assert_eq!(
        req(&m),
        CacheRequest::Put {
            key: b"k2",
            transfer: 0,
            ttl_ms: 0,
            total_len: 1 << 20,
            offset: 0,
            source: PutSource::Region(slice()),
        }
    );
    m.clear();
    encode_get(&mut m, 1, 0, b"k3", 5, 100, 200, Some(&slice()));
    assert_eq!(
        req(&m),
        CacheRequest::Get {
            key: b"k3",
            generation: 5,
            offset: 100,
            max_len: 200,
            dest: Some(slice()),
            read_now: false,
        }
    );
    m.clear();
    encode_get_read_now(&mut m, 1, 0, b"k3", &slice());
    assert_eq!(
        req(&m),
        CacheRequest::Get {
            key: b"k3",
            generation: 0,
            offset: 0,
            max_len: 0,
            dest: Some(slice()),
            read_now: true,
        }
    );
    m.clear();
    encode_key_op(&mut m, 1, 0, CacheOp::Exists, b"k4");
    assert_eq!(req(&m), CacheRequest::Exists { key: b"k4" });
    m.clear();
    let region = RegionSlice {
        offset: 0,
        ..slice()
    };
    encode_bind(&mut m, 1, 0, 77, &region);
    assert_eq!(
        req(&m),
        CacheRequest::Bind {
            client_id: 77,
            region
        }
    );
}

#[test]
fn replies_round_trip() {
    let mut m = Vec::new();
    let w = GetReplyWriter::begin(&mut m, 3, 1, ErrorCode::Ok, 42, 9, 3, 1000);
    m.extend_from_slice(b"xyz");
    w.finish(&mut m);
    let f = decode_frame(&m).expect("frame");
    let r = decode_reply(&f).expect("reply");
    assert_eq!(
        (r.op, r.status, r.generation),
        (CacheOp::Get, ErrorCode::Ok, 42)
    );
    assert_eq!(
        (r.a, r.b, r.expires_in_ms, r.data),
        (9, 3, 1000, &b"xyz"[..])
    );
    m.clear();
    encode_put_reply(&mut m, 3, 1, ErrorCode::Ok, 8, 10, 10);
    let f = decode_frame(&m).expect("frame");
    let r = decode_reply(&f).expect("reply");
    assert_eq!((r.op, r.generation, r.a, r.b), (CacheOp::Put, 8, 10, 10));
    m.clear();
    encode_status_reply(&mut m, 3, 1, CacheOp::Get, ErrorCode::BufferTooSmall);
    let f = decode_frame(&m).expect("frame");
    assert_eq!(
        decode_reply(&f).expect("reply").status,
        ErrorCode::BufferTooSmall
    );
}

#[test]
fn a_reply_finished_before_its_chunk_equals_one_with_it() {
    let chunk = vec![0x5A; 3000];
    let mut whole = Vec::new();
    let w = GetReplyWriter::begin(&mut whole, 4, 2, ErrorCode::Ok, 7, 9000, 3000, 0);
    whole.extend_from_slice(&chunk);
    w.finish(&mut whole);
    let mut head = vec![1, 2, 3];
    let w = GetReplyWriter::begin(&mut head, 4, 2, ErrorCode::Ok, 7, 9000, 3000, 0);
    w.finish_before(&mut head, chunk.len(), crate::checksum::crc32c(&chunk));
    head.extend_from_slice(&chunk);
    assert_eq!(head[3..], whole[..]);
}

#[test]
fn concatenated_crcs_match_the_crc_of_the_concatenation() {
    let data: Vec<u8> = (0..70_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    for cut in [0, 1, 7, 64, 1000, 65_536, 69_999, 70_000] {
        let (a, b) = data.split_at(cut);
        assert_eq!(
            crc32c_concat(
                crate::checksum::crc32c(a),
                crate::checksum::crc32c(b),
                b.len()
            ),
            crate::checksum::crc32c(&data),
            "cut at {cut}"
        );
    }
}

#[test]
fn split_get_replies_decode_like_whole_ones() {
    let chunk: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    let mut m = Vec::new();
    let w = GetReplyWriter::begin(&mut m, 9, 0, ErrorCode::Ok, 33, 12_000, 4096, 50);
    m.extend_from_slice(&chunk);
    w.finish(&mut m);
    let (head, tail) = m.split_at(GET_REPLY_HEAD_BYTES);
    let h = peek_get_reply_head(head, m.len()).expect("head");
    assert_eq!(
        (
            h.request_id,
            h.status,
            h.generation,
            h.total_len,
            h.offset,
            h.chunk_len
        ),
        (9, ErrorCode::Ok, 33, 12_000, 4096, chunk.len())
    );
    let (header, r) = decode_split_get_reply(head, tail).expect("split reply");
    let whole = decode_frame(&m).expect("frame");
    assert_eq!(header, whole.header);
    assert_eq!(r, decode_reply(&whole).expect("reply"));
    // One flipped byte of the chunk, wherever it landed, is caught.
    let mut bad = tail.to_vec();
    bad[4321] ^= 1;
    assert_eq!(
        decode_split_get_reply(head, &bad).err(),
        Some(WireError::BadChecksum)
    );
    // A chunk of the wrong length, a head of the wrong length or kind.
    assert_eq!(
        decode_split_get_reply(head, &tail[1..]).err(),
        Some(WireError::Truncated)
    );
    assert!(peek_get_reply_head(head, m.len() + 1).is_err());
    assert!(peek_get_reply_head(&head[1..], m.len()).is_err());
    let mut put = Vec::new();
    encode_put_reply(&mut put, 9, 0, ErrorCode::Ok, 1, 2, 2);
    put.resize(GET_REPLY_HEAD_BYTES, 0);
    assert!(peek_get_reply_head(&put, 10_000).is_err());
}

#[test]
fn malformed_requests_are_refused() {
    let bad = |m: &[u8]| decode_request(&decode_frame(m).expect("frame")).is_err();
    let mut m = Vec::new();
    // A chunk that runs past the value's end.
    encode_put_chunk(&mut m, 1, 0, b"k", 0, 0, 4, 2, b"abc");
    assert!(bad(&m));
    m.clear();
    // An empty key.
    encode_key_op(&mut m, 1, 0, CacheOp::Delete, b"");
    assert!(bad(&m));
    m.clear();
    // A key over the bound.
    encode_key_op(
        &mut m,
        1,
        0,
        CacheOp::Delete,
        &vec![b'k'; CACHE_KEY_BYTES_MAX + 1],
    );
    assert!(bad(&m));
    m.clear();
    // A value over the bound.
    encode_put_chunk(
        &mut m,
        1,
        0,
        b"k",
        0,
        0,
        CACHE_VALUE_BYTES_MAX as u64 + 1,
        0,
        b"a",
    );
    assert!(bad(&m));
    m.clear();
    // Unknown flags.
    encode_key_op(&mut m, 1, 0, CacheOp::Exists, b"k");
    m[fabrickv_types::limits::FRAME_HEADER_BYTES + 1] = 2;
    let s = 0;
    finish_frame(&mut m, s, 0);
    assert!(bad(&m));
    m.clear();
    // FLAG_READ_NOW on a GET without a destination, and on a PUT.
    encode_get(&mut m, 1, 0, b"k", 0, 0, 100, None);
    m[fabrickv_types::limits::FRAME_HEADER_BYTES + 1] = FLAG_READ_NOW;
    finish_frame(&mut m, 0, 0);
    assert!(bad(&m));
    m.clear();
    encode_put_from_region(&mut m, 1, 0, b"k", 0, &slice());
    m[fabrickv_types::limits::FRAME_HEADER_BYTES + 1] = FLAG_REGION | FLAG_READ_NOW;
    finish_frame(&mut m, 0, 0);
    assert!(bad(&m));
}
