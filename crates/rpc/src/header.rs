//! The RPC header.
//!
//! ```text
//! offset size field
//!      0    1 version     1
//!      1    1 flags       bit 0: response; bit 1: payload out of line
//!      2    2 req_type    handler to run (0..REQ_TYPES_MAX)
//!      4    2 status      RpcStatus (responses), 0 in requests
//!      6    2 slot        requests: the client's reply slot for an
//!                         out-of-line response (NO_SLOT: none);
//!                         responses: the slot used, or NO_SLOT
//!      8    8 request_id  chosen by the client, echoed in the response
//!     16    . payload     the rest of the message; for an out-of-line
//!                         response a u32 length, the bytes being in the
//!                         client's slot (written one-sided before it)
//! ```

/// Bytes of the header.
pub const RPC_HEADER_BYTES: usize = 16;

/// Header version spoken here.
pub const RPC_VERSION: u8 = 1;

const FLAG_RESPONSE: u8 = 1;
const FLAG_OUT_OF_LINE: u8 = 2;

/// The slot value that names no slot.
pub const NO_SLOT: u16 = u16::MAX;

/// Outcome of a call, as carried in a response (stable numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum RpcStatus {
    /// The handler ran and this is its answer.
    Ok = 0,
    /// No handler is registered for the request type.
    NoHandler = 1,
    /// The request's header did not parse.
    Malformed = 2,
    /// The handler refused the request.
    HandlerError = 3,
    /// The client gave up waiting (never sent by a server).
    Timeout = 4,
}

impl RpcStatus {
    /// Parses a status; unknown values read as `HandlerError`, never `Ok`.
    pub fn from_u16(v: u16) -> RpcStatus {
        match v {
            0 => RpcStatus::Ok,
            1 => RpcStatus::NoHandler,
            2 => RpcStatus::Malformed,
            4 => RpcStatus::Timeout,
            _ => RpcStatus::HandlerError,
        }
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcHeader {
    /// Response (true) or request.
    pub response: bool,
    /// Handler to run.
    pub req_type: u16,
    /// Status of a response.
    pub status: RpcStatus,
    /// The client's id for the request.
    pub request_id: u64,
    /// Reply slot offered (request) or used (response); `NO_SLOT` if none.
    pub slot: u16,
    /// The response payload is in the client's slot, not in the message.
    pub out_of_line: bool,
}

impl RpcHeader {
    /// An inline response header.
    pub fn response_to(req_type: u16, request_id: u64, status: RpcStatus) -> RpcHeader {
        RpcHeader {
            response: true,
            req_type,
            status,
            request_id,
            slot: NO_SLOT,
            out_of_line: false,
        }
    }

    /// Appends the header.
    #[inline]
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(RPC_VERSION);
        let mut flags = 0;
        if self.response {
            flags |= FLAG_RESPONSE;
        }
        if self.out_of_line {
            flags |= FLAG_OUT_OF_LINE;
        }
        out.push(flags);
        out.extend_from_slice(&self.req_type.to_le_bytes());
        out.extend_from_slice(&(self.status as u16).to_le_bytes());
        out.extend_from_slice(&self.slot.to_le_bytes());
        out.extend_from_slice(&self.request_id.to_le_bytes());
    }

    /// Splits a message into its header and payload.
    #[inline]
    pub fn decode(msg: &[u8]) -> Option<(RpcHeader, &[u8])> {
        let h = msg.get(..RPC_HEADER_BYTES)?;
        if h[0] != RPC_VERSION || h[1] & !(FLAG_RESPONSE | FLAG_OUT_OF_LINE) != 0 {
            return None;
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&h[8..16]);
        Some((
            RpcHeader {
                response: h[1] & FLAG_RESPONSE != 0,
                req_type: u16::from_le_bytes([h[2], h[3]]),
                status: RpcStatus::from_u16(u16::from_le_bytes([h[4], h[5]])),
                request_id: u64::from_le_bytes(id),
                slot: u16::from_le_bytes([h[6], h[7]]),
                out_of_line: h[1] & FLAG_OUT_OF_LINE != 0,
            },
            &msg[RPC_HEADER_BYTES..],
        ))
    }

    /// The request id of a message whose header may be broken (0 if short).
    pub fn request_id_of(msg: &[u8]) -> u64 {
        msg.get(8..16)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let h = RpcHeader {
            response: true,
            req_type: 7,
            status: RpcStatus::NoHandler,
            request_id: 99,
            slot: 3,
            out_of_line: true,
        };
        let mut b = Vec::new();
        h.encode(&mut b);
        b.extend_from_slice(b"payload");
        assert_eq!(b.len(), RPC_HEADER_BYTES + 7);
        let (got, payload) = RpcHeader::decode(&b).expect("decodes");
        assert_eq!(got, h);
        assert_eq!(payload, b"payload");
    }

    #[test]
    fn rejects_bad_headers() {
        assert!(RpcHeader::decode(&[1; 15]).is_none());
        let mut b = Vec::new();
        RpcHeader {
            response: false,
            req_type: 1,
            status: RpcStatus::Ok,
            request_id: 1,
            slot: NO_SLOT,
            out_of_line: false,
        }
        .encode(&mut b);
        let mut bad = b.clone();
        bad[0] = 2;
        assert!(RpcHeader::decode(&bad).is_none());
        let mut bad = b.clone();
        bad[1] = 0x84;
        assert!(RpcHeader::decode(&bad).is_none());
        assert_eq!(RpcStatus::from_u16(999), RpcStatus::HandlerError);
    }
}
