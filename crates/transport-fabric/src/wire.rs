//! What travels between the two sides, sans-I/O: the rendezvous handshake
//! (over TCP), the packet header (over libfabric), credit-based flow
//! control, and reassembly of messages from packets.
//!
//! Each direction of a connection is a byte stream of length-prefixed
//! messages (the framing of `fabrickv_transport::framing`) cut into
//! packets of at most [`PACKET_BYTES`]. A flush packs every queued message
//! into as few packets as it can (many small messages share one packet; a
//! large one spans several), so one `fi_send` carries a whole burst.
//!
//! Packet header (16 bytes, little-endian):
//!
//! ```text
//! magic(u8=0xFB) kind(u8) reserved(u16) conn(u32) seq(u32) credits(u32)
//! ```
//!
//! `conn` is the server's id for the connection (the server's endpoint is
//! shared by all its clients; this is how it tells them apart), `seq`
//! numbers the packets of one direction (a gap is a broken connection),
//! `credits` returns receive slots to the peer.

use fabrickv_transport::framing::{self, Next, PREFIX_BYTES};
use fabrickv_transport::handshake::OpeningFormat;

/// Bytes of one packet, header included: the size of each receive slot.
/// 16 KiB fits the eager buffers of `ofi_rxm` (so no rendezvous protocol
/// per packet) and keeps a connection's receive window small.
pub const PACKET_BYTES: usize = 16 * 1024;

/// Bytes of the packet header.
pub const HEADER_BYTES: usize = 16;

/// Message-stream bytes one packet carries at most.
pub const PAYLOAD_BYTES_MAX: usize = PACKET_BYTES - HEADER_BYTES;

/// Receive slots each side posts for each connection, in packets: the
/// sender's initial credits. Memory per connection per side is
/// `WINDOW_PACKETS * PACKET_BYTES` (256 KiB).
pub const WINDOW_PACKETS: u32 = 16;

/// A receiver returns credits in a packet of their own once it owes this
/// many (otherwise they ride on its next data packet).
pub const CREDIT_RETURN_PACKETS: u32 = WINDOW_PACKETS / 2;

const _: () = assert!(WINDOW_PACKETS >= 4 && CREDIT_RETURN_PACKETS < WINDOW_PACKETS - 1);
const _: () = assert!(PAYLOAD_BYTES_MAX > PREFIX_BYTES);

const MAGIC: u8 = 0xFB;

/// Kind of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Carries message-stream bytes (and credits).
    Data,
    /// Carries credits only.
    Credit,
}

/// A decoded packet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub conn: u32,
    pub seq: u32,
    pub credits: u32,
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0] = MAGIC;
        b[1] = match self.kind {
            Kind::Data => 1,
            Kind::Credit => 2,
        };
        b[4..8].copy_from_slice(&self.conn.to_le_bytes());
        b[8..12].copy_from_slice(&self.seq.to_le_bytes());
        b[12..16].copy_from_slice(&self.credits.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER_BYTES || b[0] != MAGIC {
            return None;
        }
        let kind = match b[1] {
            1 => Kind::Data,
            2 => Kind::Credit,
            _ => return None,
        };
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(Header {
            kind,
            conn: word(4),
            seq: word(8),
            credits: word(12),
        })
    }
}

/// Credit-based flow control of one connection, both directions.
///
/// A sender may have at most as many unreturned packets in flight as the
/// receiver posted slots for it. Data needs two credits, so the last one
/// is kept for a credit-only packet: a side that owes credits can always
/// return them, and two sides that both wait for credits cannot deadlock.
#[derive(Debug, Clone)]
pub struct Flow {
    /// Packets this side may still send.
    pub credits: u32,
    /// Slots this side reposted for the peer and has not reported yet.
    pub owed: u32,
    tx_seq: u32,
    rx_seq: u32,
}

impl Flow {
    pub fn new(window: u32) -> Flow {
        Flow {
            credits: window,
            owed: 0,
            tx_seq: 0,
            rx_seq: 0,
        }
    }

    /// True if a data packet may go now.
    pub fn can_send_data(&self) -> bool {
        self.credits >= 2
    }

    /// True if owed credits should go in a packet of their own now.
    pub fn should_return(&self) -> bool {
        self.owed >= CREDIT_RETURN_PACKETS && self.credits >= 1
    }

    /// The header of the next packet (commit it with [`Flow::sent`] once
    /// the provider took the packet).
    pub fn peek_header(&self, kind: Kind, conn: u32) -> Header {
        Header {
            kind,
            conn,
            seq: self.tx_seq,
            credits: self.owed,
        }
    }

    /// Accounts a packet sent: spends a credit, clears the debt.
    pub fn sent(&mut self) {
        debug_assert!(self.credits >= 1);
        self.credits -= 1;
        self.owed = 0;
        self.tx_seq = self.tx_seq.wrapping_add(1);
    }

    /// Accounts a received packet's header.
    pub fn on_packet(&mut self, h: &Header) -> Result<(), String> {
        if h.seq != self.rx_seq {
            return Err(format!(
                "packet {} arrived where {} was due",
                h.seq, self.rx_seq
            ));
        }
        self.rx_seq = self.rx_seq.wrapping_add(1);
        self.credits = self.credits.saturating_add(h.credits);
        Ok(())
    }
}

/// Reassembles messages from one direction's packets.
#[derive(Debug, Default)]
pub struct Reassembly {
    /// A message spanning packets, with its length prefix, while it grows.
    partial: Vec<u8>,
    /// `partial` held a whole message that was handed out: clear it first.
    done: bool,
}

/// What [`Reassembly::next`] found.
pub enum Piece<'a> {
    /// A whole message.
    Message(&'a [u8]),
    /// The packet is used up.
    End,
}

impl Reassembly {
    /// The next whole message from `payload[*pos..]`, advancing `pos`.
    /// Messages inside one packet come straight from it (no copy); one
    /// that spans packets is gathered in `partial`.
    pub fn next<'a>(&'a mut self, payload: &'a [u8], pos: &mut usize) -> Result<Piece<'a>, String> {
        if self.done {
            self.partial.clear();
            self.done = false;
        }
        if !self.partial.is_empty() {
            loop {
                match framing::next(&self.partial) {
                    Next::NeedMore(need) => {
                        let take = need.min(payload.len() - *pos);
                        if take == 0 {
                            return Ok(Piece::End);
                        }
                        self.partial.extend_from_slice(&payload[*pos..*pos + take]);
                        *pos += take;
                    }
                    Next::Message(len) => {
                        self.done = true;
                        return Ok(Piece::Message(
                            &self.partial[PREFIX_BYTES..PREFIX_BYTES + len],
                        ));
                    }
                    Next::Corrupt(n) => return Err(format!("message length {n} out of bounds")),
                }
            }
        }
        let rest = &payload[*pos..];
        if rest.is_empty() {
            return Ok(Piece::End);
        }
        match framing::next(rest) {
            Next::Message(len) => {
                *pos += PREFIX_BYTES + len;
                Ok(Piece::Message(&rest[PREFIX_BYTES..PREFIX_BYTES + len]))
            }
            Next::NeedMore(_) => {
                // The prefix (once whole) was checked against
                // MESSAGE_BYTES_MAX, so `partial` stays bounded.
                self.partial.extend_from_slice(rest);
                *pos = payload.len();
                Ok(Piece::End)
            }
            Next::Corrupt(n) => Err(format!("message length {n} out of bounds")),
        }
    }

    /// True if a message is partly received.
    pub fn is_partial(&self) -> bool {
        !self.done && !self.partial.is_empty()
    }
}

/// Queued outgoing messages of one connection (framed), cut into packets
/// at flush.
#[derive(Debug, Default)]
pub struct Outbox {
    pub out: Vec<u8>,
    pub head: usize,
}

impl Outbox {
    /// Bytes waiting.
    pub fn pending(&self) -> usize {
        self.out.len() - self.head
    }

    /// The next packet's payload.
    pub fn next_payload(&self) -> &[u8] {
        let end = (self.head + PAYLOAD_BYTES_MAX).min(self.out.len());
        &self.out[self.head..end]
    }

    /// Marks `n` bytes sent; resets the buffer when empty.
    pub fn advance(&mut self, n: usize) {
        self.head += n;
        if self.head == self.out.len() {
            self.out.clear();
            self.head = 0;
        }
    }
}

/// Rendezvous handshake version spoken here.
pub const HANDSHAKE_VERSION: u8 = 1;
const HANDSHAKE_MAGIC: &[u8; 4] = b"FKVF";

/// Bytes of the client's opening before its endpoint name.
pub const OPENING_BYTES: usize = 16;
/// Bytes of the server's answer before its endpoint name.
pub const WELCOME_BYTES: usize = 24;

/// The client's opening, the handshake's first message: which worker,
/// its window, its endpoint name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    pub worker: u16,
    pub window: u32,
    pub name: Vec<u8>,
}

impl Opening {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(OPENING_BYTES + self.name.len());
        b.extend_from_slice(HANDSHAKE_MAGIC);
        b.push(HANDSHAKE_VERSION);
        b.push(0);
        b.extend_from_slice(&self.worker.to_le_bytes());
        b.extend_from_slice(&self.window.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.name);
        b
    }

    /// Bytes the whole opening needs, once its fixed part is in; `None` if
    /// the fixed part is not a FabricKV fabric opening.
    pub fn total_bytes(fixed: &[u8]) -> Option<usize> {
        if fixed.len() < OPENING_BYTES || &fixed[..4] != HANDSHAKE_MAGIC {
            return None;
        }
        let name = u16::from_le_bytes([fixed[14], fixed[15]]) as usize;
        (name <= crate::fi::NAME_BYTES_MAX).then_some(OPENING_BYTES + name)
    }

    /// Parses a whole opening; `None` on a version or shape mismatch.
    pub fn decode(b: &[u8]) -> Option<Opening> {
        let total = Opening::total_bytes(b)?;
        if b.len() != total || b[4] != HANDSHAKE_VERSION {
            return None;
        }
        Some(Opening {
            worker: u16::from_le_bytes([b[6], b[7]]),
            window: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            name: b[OPENING_BYTES..].to_vec(),
        })
    }
}

/// The layout of [`Opening`] for the shared handshake table
/// (`fabrickv_transport::handshake`): a fixed part, then the client
/// endpoint's name, whose length the fixed part gives.
#[derive(Debug, Clone, Copy)]
pub struct OpeningWire;

/// Smallest receive window a client may offer, in packets: the credit
/// scheme keeps one in reserve and needs room for data besides.
pub const WINDOW_PACKETS_MIN: u32 = 4;

impl OpeningFormat for OpeningWire {
    type Opening = Opening;

    const BYTES_MAX: usize = OPENING_BYTES + crate::fi::NAME_BYTES_MAX;

    fn wanted(&self, got: &[u8]) -> Option<usize> {
        if got.len() < OPENING_BYTES {
            return Some(OPENING_BYTES);
        }
        Opening::total_bytes(got)
    }

    fn decode(&self, bytes: &[u8]) -> Option<Opening> {
        Opening::decode(bytes)
    }

    fn worker(opening: &Opening) -> u16 {
        opening.worker
    }

    fn usable(opening: &Opening) -> bool {
        opening.window >= WINDOW_PACKETS_MIN
    }
}

/// The server's answer: status (an `ErrorCode`), worker count, the
/// connection id, its window, and the worker endpoint's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    pub status: u16,
    pub workers: u16,
    pub conn: u32,
    pub window: u32,
    pub name: Vec<u8>,
}

impl Welcome {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(WELCOME_BYTES + self.name.len());
        b.extend_from_slice(HANDSHAKE_MAGIC);
        b.push(HANDSHAKE_VERSION);
        b.push(0);
        b.extend_from_slice(&self.status.to_le_bytes());
        b.extend_from_slice(&self.workers.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&self.conn.to_le_bytes());
        b.extend_from_slice(&self.window.to_le_bytes());
        b.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&self.name);
        b
    }

    /// Parses the fixed part; returns it with the name length to read.
    pub fn decode_fixed(b: &[u8; WELCOME_BYTES]) -> Option<(Welcome, usize)> {
        if &b[..4] != HANDSHAKE_MAGIC || b[4] != HANDSHAKE_VERSION {
            return None;
        }
        let name = u16::from_le_bytes([b[20], b[21]]) as usize;
        if name > crate::fi::NAME_BYTES_MAX {
            return None;
        }
        Some((
            Welcome {
                status: u16::from_le_bytes([b[6], b[7]]),
                workers: u16::from_le_bytes([b[8], b[9]]),
                conn: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
                window: u32::from_le_bytes([b[16], b[17], b[18], b[19]]),
                name: Vec::new(),
            },
            name,
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn framed(msgs: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in msgs {
            let at = framing::begin(&mut out);
            out.extend_from_slice(m);
            framing::finish(&mut out, at).unwrap();
        }
        out
    }

    fn collect(r: &mut Reassembly, packets: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        for p in packets {
            let mut pos = 0;
            while let Piece::Message(m) = r.next(p, &mut pos).unwrap() {
                got.push(m.to_vec());
            }
            assert_eq!(pos, p.len());
        }
        got
    }

    #[test]
    fn header_round_trips() {
        let h = Header {
            kind: Kind::Credit,
            conn: 7,
            seq: u32::MAX,
            credits: 3,
        };
        assert_eq!(Header::decode(&h.encode()), Some(h));
        assert_eq!(Header::decode(&[0; HEADER_BYTES]), None);
    }

    #[test]
    fn reassembles_messages_split_anywhere() {
        let msgs: Vec<Vec<u8>> = vec![b"a".to_vec(), vec![7; 100], b"xyz".to_vec(), vec![1; 3000]];
        let refs: Vec<&[u8]> = msgs.iter().map(|m| &m[..]).collect();
        let stream = framed(&refs);
        for cut in [1, 2, 3, 5, 17, 1000, stream.len()] {
            let packets: Vec<&[u8]> = stream.chunks(cut).collect();
            let mut r = Reassembly::default();
            assert_eq!(collect(&mut r, &packets), msgs, "cut {cut}");
            assert!(!r.is_partial());
        }
    }

    #[test]
    fn corrupt_length_is_an_error() {
        let mut r = Reassembly::default();
        let mut pos = 0;
        assert!(r.next(&[0, 0, 0, 0, 1], &mut pos).is_err());
    }

    #[test]
    fn credits_keep_one_in_reserve() {
        let mut a = Flow::new(4);
        let mut b = Flow::new(4);
        let mut sent = 0;
        while a.can_send_data() {
            let h = a.peek_header(Kind::Data, 0);
            a.sent();
            b.on_packet(&h).unwrap();
            b.owed += 1;
            sent += 1;
        }
        assert_eq!(sent, 3);
        assert_eq!(a.credits, 1);
        assert!(b.should_return() || b.owed < CREDIT_RETURN_PACKETS);
        let h = b.peek_header(Kind::Credit, 0);
        b.sent();
        a.on_packet(&h).unwrap();
        assert_eq!(a.credits, 4);
        let mut late = h;
        late.seq = 99;
        assert!(a.on_packet(&late).is_err(), "a gap in sequence is refused");
    }

    #[test]
    fn handshakes_round_trip() {
        let h = Opening {
            worker: 3,
            window: 16,
            name: b"fi_shm://x".to_vec(),
        };
        assert_eq!(Opening::decode(&h.encode()), Some(h));
        let w = Welcome {
            status: 0,
            workers: 2,
            conn: 9,
            window: 16,
            name: vec![1, 2, 3],
        };
        let b = w.encode();
        let fixed: [u8; WELCOME_BYTES] = b[..WELCOME_BYTES].try_into().unwrap();
        let (mut got, n) = Welcome::decode_fixed(&fixed).unwrap();
        got.name = b[WELCOME_BYTES..WELCOME_BYTES + n].to_vec();
        assert_eq!(got, w);
    }
}
