//! One connection: its socket and buffers ([`Io`]), the protocol state
//! beside them, and one wake-up's reads, executions and writes.

use fabrickv_rpc::gate::FlushGate;
use std::io::{self, Read};

use mio::net::TcpStream;

use super::Proto;

/// One connection's socket and buffers, as every front end has them.
pub(crate) struct Io {
    pub stream: TcpStream,
    pub input: Vec<u8>,
    /// Unconsumed input is `input[start..end]`.
    pub start: usize,
    pub end: usize,
    /// Unconsumed bytes needed before parsing again.
    pub need: usize,
    pub out: Vec<u8>,
    pub out_pos: usize,
    /// The last read came back short: nothing more until the next event.
    pub drained: bool,
    /// The peer closed its side.
    pub eof: bool,
    /// Close once the output is written.
    pub closing: bool,
    /// When the client last sent something (the loop's clock, in ms).
    pub(super) active_ms: u64,
}

impl Io {
    /// Records what one `process` call did; returns true when whole
    /// commands may be left (it stopped for output room).
    pub fn took(&mut self, consumed: usize, need: usize, close: bool) -> bool {
        self.start += consumed;
        self.need = need;
        self.closing |= close;
        !close && need == 0 && self.start < self.end
    }

    /// One read into `dst` (not the input buffer): records EOF, and
    /// whether the socket is drained; returns the bytes read.
    pub fn read_into(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let offered = dst.len();
        match self.stream.read(dst) {
            Ok(0) => self.eof = true,
            Ok(n) => {
                self.drained = n < offered;
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.drained = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        Ok(0)
    }

    /// One read into the room [`make_room`] made: records EOF, and whether
    /// the socket is drained (a short read or nothing to read).
    pub(super) fn read_once(&mut self) -> io::Result<()> {
        let offered = self.input.len() - self.end;
        match self.stream.read(&mut self.input[self.end..]) {
            Ok(0) => self.eof = true,
            Ok(n) => {
                self.end += n;
                self.drained = n < offered;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.drained = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

/// What one wake-up of a connection left it as.
pub(super) enum Drive {
    Keep,
    Close,
    /// Parked until this time (engine ms), e.g. by a failed AUTH.
    Held(u64),
    /// Replies held until the server may stand behind them (a replicating
    /// server's writes are on its backups): driven again when woken.
    Settling,
}

pub(super) struct Conn<P> {
    pub(super) io: Io,
    pub(super) proto: P,
    /// The bytes this connection last reported to [`ClientMemory`].
    pub(super) reported: usize,
    /// The flush gate's ticket its pending replies wait on, if any.
    pub(super) ticket: Option<u64>,
}

/// The first half of a wake-up: reads and executes what one read brings,
/// leaving the replies for [`drive`] to write.
pub(super) fn fill<P: Proto>(c: &mut Conn<P>, shared: &P::Shared, now_ms: u64) {
    if c.io.closing || c.io.eof || c.io.drained || c.output_pending() {
        return;
    }
    if c.proto.receiving() {
        if c.proto.read_large(&mut c.io).is_ok() && !c.proto.receiving() {
            c.execute(shared, now_ms);
        }
        return;
    }
    if !make_room::<P>(&mut c.io) {
        return;
    }
    // An error is left for drive, which meets it again and closes.
    if c.io.read_once().is_ok() {
        c.execute(shared, now_ms);
    }
}

/// Executes, writes and reads for one connection until it has nothing to
/// do or must wait for the socket.
pub(super) fn drive<P: Proto>(
    c: &mut Conn<P>,
    shared: &P::Shared,
    now_ms: u64,
    gate: &FlushGate,
) -> Drive {
    loop {
        // Replies held on a ticket leave once it is done, before anything
        // more executes (what would execute is not covered by it).
        let mut more_buffered = false;
        // Whether the replies pending are covered by a done ticket (a
        // fresh ticket would wait for writes made since, by others).
        let mut covered = false;
        match c.ticket {
            Some(t) if !gate.done(t) => return Drive::Settling,
            Some(_) => {
                c.ticket = None;
                covered = true;
            }
            // 1. Execute what is buffered (bounded by the output soft
            // limit).
            None => more_buffered = c.execute(shared, now_ms),
        }
        // A failed AUTH parks the connection, its reply unsent.
        let held_until_ms = c.proto.held_until_ms();
        if held_until_ms > now_ms {
            return Drive::Held(held_until_ms);
        }
        // 2. Write the replies, once the server may stand behind them
        // (a replicating server's backups have the writes); meanwhile the
        // loop serves its other connections.
        if c.output_pending() && !covered && !c.proto.replies_settled() {
            if let Some(t) = gate.ticket() {
                c.ticket = Some(t);
                if !gate.done(t) {
                    return Drive::Settling;
                }
                c.ticket = None;
            }
        }
        while c.output_pending() {
            match c.proto.write_some(&mut c.io) {
                Ok(0) => return Drive::Close,
                Ok(n) => c.proto.advance_out(&mut c.io, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Drive::Keep,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Drive::Close,
            }
        }
        c.reset_out();
        if c.io.closing || (c.io.eof && !more_buffered) {
            return Drive::Close;
        }
        if more_buffered {
            continue;
        }
        if c.io.drained {
            compact_idle::<P>(&mut c.io);
            return Drive::Keep;
        }
        // 3. Read more.
        if c.proto.receiving() {
            if c.proto.read_large(&mut c.io).is_err() {
                return Drive::Close;
            }
            continue;
        }
        if !make_room::<P>(&mut c.io) {
            // A command over every bound: the parser refuses it before this.
            return Drive::Close;
        }
        if c.io.read_once().is_err() {
            return Drive::Close;
        }
    }
}

impl<P: Proto> Conn<P> {
    /// Runs the buffered commands; returns true when it stopped for output
    /// room with whole commands possibly left.
    pub(super) fn execute(&mut self, shared: &P::Shared, now_ms: u64) -> bool {
        if self.io.closing || self.io.end - self.io.start < self.io.need.max(1) {
            return false;
        }
        self.proto.execute(&mut self.io, shared, now_ms)
    }

    /// Whether anything is pending: unparsed input, a large value being
    /// received, or replies not yet written.
    pub(super) fn pending(&self) -> bool {
        self.io.start != self.io.end || self.proto.receiving() || self.output_pending()
    }

    /// Bytes this connection holds beyond every connection's allowance
    /// (see [`ClientMemory`]).
    pub(super) fn held_bytes(&self) -> usize {
        self.io.input.len().saturating_sub(P::READ_CHUNK_BYTES)
            + self
                .io
                .out
                .capacity()
                .saturating_sub(P::IDLE_BUFFER_BYTES_MAX)
            + self.proto.held_bytes()
    }

    /// Whether replies are waiting to be written.
    pub(super) fn output_pending(&self) -> bool {
        self.io.out_pos < self.io.out.len() || self.proto.output_queued()
    }

    pub(super) fn reset_out(&mut self) {
        self.io.out.clear();
        self.io.out_pos = 0;
        self.proto.reset_out();
        if self.io.out.capacity() > P::IDLE_BUFFER_BYTES_MAX {
            self.io.out = Vec::new();
        }
    }
}

/// Gives back a large input buffer once nothing is pending in it.
pub(super) fn compact_idle<P: Proto>(io: &mut Io) {
    if io.start == io.end {
        io.start = 0;
        io.end = 0;
        if io.input.len() > P::IDLE_BUFFER_BYTES_MAX {
            io.input = vec![0; P::READ_CHUNK_BYTES];
        }
    }
}

/// Makes room for a read: moves pending bytes to the front, and grows the
/// buffer (up to [`Proto::INPUT_BYTES_MAX`]) when a command needs more.
pub(super) fn make_room<P: Proto>(io: &mut Io) -> bool {
    if io.start == io.end {
        io.start = 0;
        io.end = 0;
    }
    if io.input.len() - io.end >= P::READ_CHUNK_BYTES {
        return true;
    }
    let pending = io.end - io.start;
    if io.start > 0 {
        io.input.copy_within(io.start..io.end, 0);
        io.start = 0;
        io.end = pending;
    }
    let want = (pending.max(io.need) + P::READ_CHUNK_BYTES).min(P::INPUT_BYTES_MAX);
    if io.input.len() < want {
        io.input.resize(want, 0);
    }
    io.input.len() > io.end
}
