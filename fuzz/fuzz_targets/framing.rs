//! The length-prefix framing of byte-stream transports.
//!
//! 1. Arbitrary bytes as a receive buffer: `framing::next` must walk it
//!    without panicking, and every answer must agree with the bytes.
//! 2. Arbitrary messages written with `begin`/`finish` must come back out
//!    of `next`, whole and in order, however the stream is cut.

#![no_main]

use fabrickv_transport::framing::{begin, finish, next, Next, PREFIX_BYTES};
use fabrickv_types::limits::MESSAGE_BYTES_MAX;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    walk(data);
    round_trip(data);
});

/// Walks a receive buffer the way a transport does.
fn walk(mut buf: &[u8]) {
    loop {
        match next(buf) {
            Next::Message(len) => {
                assert!(len > 0 && len <= MESSAGE_BYTES_MAX);
                assert!(buf.len() >= PREFIX_BYTES + len);
                let announced = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
                assert_eq!(announced as usize, len);
                buf = &buf[PREFIX_BYTES + len..];
            }
            Next::NeedMore(n) => {
                assert!(n > 0);
                if buf.len() < PREFIX_BYTES {
                    assert_eq!(n, PREFIX_BYTES - buf.len());
                    return;
                }
                // Exactly `n` more bytes complete the message.
                let mut more = buf.to_vec();
                more.resize(buf.len() + n, 0);
                let fewer = &more[..more.len() - 1];
                assert!(matches!(next(fewer), Next::NeedMore(1)));
                assert!(matches!(next(&more), Next::Message(_)));
                return;
            }
            Next::Corrupt(len) => {
                assert!(buf.len() >= PREFIX_BYTES);
                assert!(len == 0 || len as usize > MESSAGE_BYTES_MAX);
                return;
            }
        }
    }
}

/// Frames the input cut into messages at each 0xFF byte, then unframes it.
fn round_trip(data: &[u8]) {
    let messages: Vec<&[u8]> = data.split(|&b| b == 0xFF).collect();
    let mut stream = Vec::new();
    let mut kept = Vec::new();
    for m in &messages {
        let at = begin(&mut stream);
        stream.extend_from_slice(m);
        match finish(&mut stream, at) {
            Ok(true) => kept.push(*m),
            Ok(false) => assert!(m.is_empty(), "a non-empty message was dropped"),
            Err(_) => unreachable!("fuzz inputs are far below MESSAGE_BYTES_MAX"),
        }
    }
    let mut rest = &stream[..];
    let mut got = Vec::new();
    while let Next::Message(len) = next(rest) {
        got.push(&rest[PREFIX_BYTES..PREFIX_BYTES + len]);
        rest = &rest[PREFIX_BYTES + len..];
    }
    assert!(rest.is_empty(), "bytes left after the last message");
    assert_eq!(got, kept);
}
