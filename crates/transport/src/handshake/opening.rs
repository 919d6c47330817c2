//! The bytes of the handshake: the [`Challenge`] and its proof, the
//! [`OpeningFormat`] each transport speaks ([`CompactOpening`] for tcp and
//! shm), and the client's reading of the answer.

use fabrickv_auth::{Secret, NONCE_BYTES};
use fabrickv_types::ErrorCode;

use crate::{Result, TransportError};

/// What a handshake proof is an HMAC of, besides the nonce: it names the
/// use, so that a proof made here is worth nothing anywhere else the
/// secret is used.
pub const PROOF_CONTEXT: &[u8] = b"fabrickv handshake v1";

/// First bytes of a [`Challenge`]: told apart from every transport's
/// answer ("FKV", "FKS", "FKVF") by the third byte.
const CHALLENGE_MAGIC: [u8; 3] = *b"FKC";

/// Version of the challenge message.
const CHALLENGE_VERSION: u8 = 1;

/// Bytes of the challenge before its nonce: as many as a compact answer,
/// so that a client reading one of those first can tell which came.
pub const CHALLENGE_HEAD_BYTES: usize = 8;

/// Bytes of a whole [`Challenge`].
pub const CHALLENGE_BYTES: usize = CHALLENGE_HEAD_BYTES + NONCE_BYTES;

/// The server's challenge to prove the cluster secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// The random nonce the proof must cover.
    pub nonce: [u8; NONCE_BYTES],
}

impl Challenge {
    /// The message on the wire.
    pub fn encode(&self) -> [u8; CHALLENGE_BYTES] {
        let mut b = [0u8; CHALLENGE_BYTES];
        b[..3].copy_from_slice(&CHALLENGE_MAGIC);
        b[3] = CHALLENGE_VERSION;
        b[4..6].copy_from_slice(&ErrorCode::AuthRequired.as_u16().to_le_bytes());
        b[CHALLENGE_HEAD_BYTES..].copy_from_slice(&self.nonce);
        b
    }

    /// Whether the first [`CHALLENGE_HEAD_BYTES`] a client read start a
    /// challenge (rather than the transport's answer).
    pub fn is_head(head: &[u8]) -> bool {
        head.len() >= CHALLENGE_HEAD_BYTES
            && head[..3] == CHALLENGE_MAGIC
            && head[3] == CHALLENGE_VERSION
    }
}

/// The client's side of the challenge: if `head` (the first
/// [`CHALLENGE_HEAD_BYTES`] the server sent) starts a challenge, reads
/// its nonce from `stream` and answers with the proof of `secret`;
/// returns whether it did, in which case the transport's answer is still
/// to be read. A challenge to a client without a secret is refused here
/// with `AUTH_REQUIRED` and a message saying where a secret comes from.
pub fn answer_challenge(
    head: &[u8],
    stream: &mut (impl std::io::Read + std::io::Write),
    secret: Option<&Secret>,
) -> Result<bool> {
    if !Challenge::is_head(head) {
        return Ok(false);
    }
    let Some(secret) = secret else {
        return Err(TransportError::Denied(
            ErrorCode::AuthRequired,
            format!(
                "the server requires the cluster secret: pass --auth-token-file FILE or set {}",
                fabrickv_auth::ENV_TOKEN
            ),
        ));
    };
    let mut nonce = [0u8; NONCE_BYTES];
    stream.read_exact(&mut nonce)?;
    stream.write_all(&secret.proof(PROOF_CONTEXT, &nonce))?;
    Ok(true)
}

/// How one transport's opening is laid out on the wire.
pub trait OpeningFormat {
    /// The parsed opening.
    type Opening: Send;

    /// Longest opening, in bytes: bounds each pending handshake's buffer.
    const BYTES_MAX: usize;

    /// Bytes the whole opening takes, judged from the `got` bytes read so
    /// far (never fewer than its fixed part): `None` if what is there
    /// cannot start an opening of this format.
    fn wanted(&self, got: &[u8]) -> Option<usize>;

    /// Parses a whole opening; `None` on a format or version mismatch.
    fn decode(&self, bytes: &[u8]) -> Option<Self::Opening>;

    /// The worker the opening asks for.
    fn worker(opening: &Self::Opening) -> u16;

    /// False if the opening asks for something this server cannot give
    /// (fabric: a receive window too small); it is then refused as
    /// `UNAVAILABLE`.
    fn usable(_opening: &Self::Opening) -> bool {
        true
    }
}

/// Bytes of a compact opening, and of the server's answer to it.
pub const COMPACT_OPENING_BYTES: usize = 8;

/// Handshake version that [`CompactOpening`] speaks.
const COMPACT_OPENING_VERSION: u8 = 1;

/// The 8-byte opening of the tcp and shm transports and the answer to
/// it, the two transports differing only in their magic:
///
/// ```text
/// client -> server:  MAGIC(3) version(u8=1) worker(u16) reserved(u16=0)
/// server -> client:  MAGIC(3) version(u8=1) status(u16) workers(u16)
/// ```
#[derive(Debug, Clone, Copy)]
pub struct CompactOpening {
    /// First bytes of each message ("FKV" for tcp, "FKS" for shm), so a
    /// client that reaches the wrong kind of server is told at once.
    pub magic: [u8; 3],
}

impl CompactOpening {
    /// Encodes a message: (worker, 0) from a client, (status, workers)
    /// from a server.
    pub fn encode(&self, first: u16, second: u16) -> [u8; COMPACT_OPENING_BYTES] {
        let mut b = [0u8; COMPACT_OPENING_BYTES];
        b[..3].copy_from_slice(&self.magic);
        b[3] = COMPACT_OPENING_VERSION;
        b[4..6].copy_from_slice(&first.to_le_bytes());
        b[6..8].copy_from_slice(&second.to_le_bytes());
        b
    }

    /// Parses a message into its two 16-bit fields; `None` on another
    /// magic or version.
    pub fn fields(&self, b: &[u8]) -> Option<(u16, u16)> {
        if b.len() != COMPACT_OPENING_BYTES
            || b[..3] != self.magic
            || b[3] != COMPACT_OPENING_VERSION
        {
            return None;
        }
        Some((
            u16::from_le_bytes([b[4], b[5]]),
            u16::from_le_bytes([b[6], b[7]]),
        ))
    }
}

impl OpeningFormat for CompactOpening {
    /// The worker asked for.
    type Opening = u16;

    const BYTES_MAX: usize = COMPACT_OPENING_BYTES;

    fn wanted(&self, _got: &[u8]) -> Option<usize> {
        Some(COMPACT_OPENING_BYTES)
    }

    fn decode(&self, bytes: &[u8]) -> Option<u16> {
        self.fields(bytes).map(|(worker, _)| worker)
    }

    fn worker(opening: &u16) -> u16 {
        *opening
    }
}

/// Checks a server's answer on the client: `Ok` if `status` accepts,
/// else the refusal every transport words alike (the worker asked for,
/// the stable code's name and the worker count), which tests and
/// operators match on.
pub fn check_answer(worker: u16, status: u16, workers: u16) -> Result<()> {
    if status == ErrorCode::Ok.as_u16() {
        return Ok(());
    }
    match ErrorCode::from_u16(status) {
        Some(code @ ErrorCode::AuthFailed) => {
            return Err(TransportError::Denied(
                code,
                "the server refused this client's proof of the cluster secret: \
                 the two hold different secrets"
                    .into(),
            ))
        }
        Some(code @ ErrorCode::AuthThrottled) => {
            return Err(TransportError::Denied(
                code,
                "the server refuses authentication from this address for now: too many \
                 failed proofs came from it; retry later"
                    .into(),
            ))
        }
        Some(code @ ErrorCode::PeerNotAllowed) => {
            return Err(TransportError::Denied(
                code,
                "the server does not admit this user to its shared memory".into(),
            ))
        }
        _ => {}
    }
    let name = ErrorCode::from_u16(status).map_or("unknown", |c| c.name());
    Err(refusal(worker, name, usize::from(workers)))
}

/// The refusal of a connection to `worker`, named by its code's `name`,
/// by a server of `workers` workers: one wording for every transport.
pub fn refusal(worker: u16, name: &str, workers: usize) -> TransportError {
    TransportError::Refused(format!(
        "worker {worker}: {name} (server has {workers} workers)"
    ))
}
