//! ECHO frames: a body the server sends back unchanged in an ECHO_REPLY.
//!
//! The request layer's own measurement (`fabrickv bench rpc`) and its
//! behaviour suite send them through the same decode, dispatch and reply
//! path as every other frame. A server answers them only when it
//! registers the echo service; the product server does not, and refuses
//! them with `UNKNOWN_OPCODE` like any kind it does not serve.

use crate::header::{finish_frame, FrameHeader};
use crate::{Frame, FrameKind, WireError};

/// Appends an ECHO frame carrying `payload`.
pub fn encode_echo(out: &mut Vec<u8>, request_id: u64, worker: u16, payload: &[u8]) {
    encode(out, FrameKind::Echo, request_id, worker, payload);
}

/// Appends the ECHO_REPLY to request `request_id`, carrying `payload`.
pub fn encode_echo_reply(out: &mut Vec<u8>, request_id: u64, worker: u16, payload: &[u8]) {
    encode(out, FrameKind::EchoReply, request_id, worker, payload);
}

fn encode(out: &mut Vec<u8>, kind: FrameKind, request_id: u64, worker: u16, payload: &[u8]) {
    let s = FrameHeader::begin(out, kind, request_id, worker, 0);
    out.extend_from_slice(payload);
    finish_frame(out, s, 0);
}

/// The payload of an ECHO_REPLY frame.
pub fn decode_echo_reply<'a>(frame: &Frame<'a>) -> Result<&'a [u8], WireError> {
    if frame.header.kind != FrameKind::EchoReply {
        return Err(WireError::Malformed("not an ECHO_REPLY frame"));
    }
    Ok(frame.body)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::decode_frame;

    #[test]
    fn echo_and_its_reply_carry_the_payload() {
        let mut out = Vec::new();
        encode_echo(&mut out, 9, 2, b"ping");
        let f = decode_frame(&out).unwrap();
        assert_eq!(
            (f.header.kind, f.header.request_id, f.body),
            (FrameKind::Echo, 9, &b"ping"[..])
        );
        assert!(decode_echo_reply(&f).is_err(), "a request is not a reply");
        let mut reply = Vec::new();
        encode_echo_reply(&mut reply, 9, 2, f.body);
        let r = decode_frame(&reply).unwrap();
        assert_eq!(decode_echo_reply(&r).unwrap(), b"ping");
    }
}
