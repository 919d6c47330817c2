//! A minimal blocking RESP2 client, as a [`ValueSink`] and a
//! [`ValueSource`], so that Redis is measured by the same phases.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::source::{OnValue, ValueSink, ValueSource};
use super::CACHE_BENCH_TIMEOUT;

/// Bytes of the RESP client's header buffer: far more than any reply
/// header, so one `read` usually brings a whole header and the start of
/// the value.
const RESP_STAGE_BYTES: usize = 4096;

/// Largest bulk reply the RESP client accepts (Redis's own
/// `proto-max-bulk-len` default): a corrupt length fails instead of
/// allocating without bound.
pub const RESP_BULK_BYTES_MAX: usize = 512 << 20;

/// One RESP2 reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// `+text`.
    Simple(String),
    /// `-text`: the server refused the command.
    Error(String),
    /// `:n`.
    Integer(i64),
    /// `$n` and `n` bytes, in the client's value buffer.
    Bulk(&'a [u8]),
    /// `$-1`: no such key.
    Nil,
}

/// A minimal blocking RESP2 client: one command in flight, bulk replies
/// read straight into a value buffer reused from reply to reply.
///
/// A reply's header is found in a small staging buffer; the bytes of the
/// value that came with it are copied out of that, and the rest is read
/// from the socket directly into the value buffer, so a large value costs
/// one copy out of the kernel and no more (what FabricKV's tcp client also
/// pays).
pub struct RespClient<S> {
    io: S,
    stage: Box<[u8]>,
    /// Unconsumed bytes are `stage[lo..hi]`.
    lo: usize,
    hi: usize,
    value: Vec<u8>,
    request: Vec<u8>,
}

impl RespClient<TcpStream> {
    /// Connects to redis-server on `127.0.0.1:port`.
    pub fn connect(port: u16) -> Result<RespClient<TcpStream>, String> {
        let s = TcpStream::connect(("127.0.0.1", port))
            .map_err(|e| format!("cannot connect to redis at 127.0.0.1:{port}: {e}"))?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(CACHE_BENCH_TIMEOUT))
            .map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(CACHE_BENCH_TIMEOUT))
            .map_err(|e| e.to_string())?;
        Ok(RespClient::new(s))
    }
}

impl<S: Read + Write> RespClient<S> {
    /// A client over a connected stream.
    pub fn new(io: S) -> RespClient<S> {
        RespClient {
            io,
            stage: vec![0; RESP_STAGE_BYTES].into_boxed_slice(),
            lo: 0,
            hi: 0,
            value: Vec::new(),
            request: Vec::new(),
        }
    }

    /// Sends a command (as an array of bulk strings) and reads its reply.
    pub fn command(&mut self, args: &[&[u8]]) -> Result<Reply<'_>, String> {
        self.request.clear();
        self.push_command(args);
        self.io
            .write_all(&self.request)
            .map_err(|e| format!("redis write: {e}"))?;
        self.read_reply()
    }

    /// Appends a command (an array of bulk strings) to the request.
    fn push_command(&mut self, args: &[&[u8]]) {
        self.request
            .extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            self.request
                .extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            self.request.extend_from_slice(a);
            self.request.extend_from_slice(b"\r\n");
        }
    }

    /// Reads more bytes into the staging buffer (compacting it first when
    /// its end is reached).
    fn fill(&mut self) -> Result<(), String> {
        if self.lo == self.hi {
            self.lo = 0;
            self.hi = 0;
        } else if self.hi == self.stage.len() {
            self.stage.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
            if self.hi == self.stage.len() {
                return Err(format!(
                    "a reply header is longer than {RESP_STAGE_BYTES} bytes"
                ));
            }
        }
        loop {
            match self.io.read(&mut self.stage[self.hi..]) {
                Ok(0) => return Err("redis closed the connection mid-reply".into()),
                Ok(n) => {
                    self.hi += n;
                    return Ok(());
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("redis read: {e}")),
            }
        }
    }

    /// The next line (without its CRLF), consumed from the stage.
    fn line(&mut self) -> Result<String, String> {
        loop {
            let pending = &self.stage[self.lo..self.hi];
            if let Some(p) = pending.windows(2).position(|w| w == b"\r\n") {
                let text = String::from_utf8_lossy(&pending[..p]).into_owned();
                self.lo += p + 2;
                return Ok(text);
            }
            self.fill()?;
        }
    }

    /// Reads one reply.
    pub fn read_reply(&mut self) -> Result<Reply<'_>, String> {
        let line = self.line()?;
        let (kind, rest) = line.split_at(line.len().min(1));
        match kind {
            "+" => Ok(Reply::Simple(rest.to_string())),
            "-" => Ok(Reply::Error(rest.to_string())),
            ":" => rest
                .parse()
                .map(Reply::Integer)
                .map_err(|_| format!("bad integer reply {line:?}")),
            "$" => {
                let n: i64 = rest
                    .parse()
                    .map_err(|_| format!("bad bulk header {line:?}"))?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let n = usize::try_from(n)
                    .ok()
                    .filter(|n| *n <= RESP_BULK_BYTES_MAX)
                    .ok_or_else(|| format!("bulk reply of {n} bytes is too large"))?;
                self.read_bulk(n)?;
                Ok(Reply::Bulk(&self.value[..n]))
            }
            _ => Err(format!("unexpected reply {line:?}")),
        }
    }

    /// Reads `n` value bytes and the CRLF after them into `value[..n]`.
    fn read_bulk(&mut self, n: usize) -> Result<(), String> {
        if self.value.len() < n {
            self.value.resize(n, 0);
        }
        let have = (self.hi - self.lo).min(n);
        self.value[..have].copy_from_slice(&self.stage[self.lo..self.lo + have]);
        self.lo += have;
        if have < n {
            self.io
                .read_exact(&mut self.value[have..n])
                .map_err(|e| format!("redis read: {e}"))?;
        }
        while self.hi - self.lo < 2 {
            self.fill()?;
        }
        if &self.stage[self.lo..self.lo + 2] != b"\r\n" {
            return Err("a bulk reply does not end with CRLF".into());
        }
        self.lo += 2;
        Ok(())
    }
}

impl<S: Read + Write> ValueSink for RespClient<S> {
    /// `SET key value [EX seconds]` (whole seconds, at least one).
    fn store(&mut self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<(), String> {
        let secs = ttl.map(|t| t.as_secs().max(1).to_string());
        let reply = match &secs {
            Some(s) => self.command(&[b"SET", key, value, b"EX", s.as_bytes()])?,
            None => self.command(&[b"SET", key, value])?,
        };
        match reply {
            Reply::Simple(s) if s == "OK" => Ok(()),
            Reply::Error(e) => Err(format!("redis: {e}")),
            r => Err(format!("unexpected SET reply {r:?}")),
        }
    }
}

impl<S: Read + Write> ValueSource for RespClient<S> {
    /// `GET key`, the value in the client's reused buffer.
    fn fetch(&mut self, key: &[u8]) -> Result<Option<&[u8]>, String> {
        let r = self.command(&[b"GET", key])?;
        get_value(r)
    }

    /// The GETs pipelined: all written at once, then the replies read in
    /// order, each checked before the next is read into the same buffer.
    fn fetch_batch(
        &mut self,
        keys: &[&[u8]],
        _slot_bytes: usize,
        each: &mut OnValue<'_>,
    ) -> Result<(), String> {
        self.request.clear();
        for k in keys {
            self.push_command(&[b"GET", k]);
        }
        self.io
            .write_all(&self.request)
            .map_err(|e| format!("redis write: {e}"))?;
        for i in 0..keys.len() {
            let r = self.read_reply()?;
            each(i, get_value(r)?)?;
        }
        Ok(())
    }
}

/// The value of a GET reply (`None`: no such key).
fn get_value(r: Reply<'_>) -> Result<Option<&[u8]>, String> {
    match r {
        Reply::Bulk(v) => Ok(Some(v)),
        Reply::Nil => Ok(None),
        Reply::Error(e) => Err(format!("redis: {e}")),
        r => Err(format!("unexpected GET reply {r:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that hands out its bytes at most `step` at a time (reads
    /// split anywhere, as TCP may split them) and swallows writes.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len() - self.at);
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn client(data: &[u8], step: usize) -> RespClient<Trickle> {
        RespClient::new(Trickle {
            data: data.to_vec(),
            at: 0,
            step,
        })
    }

    #[test]
    fn resp_replies_parse_however_the_reads_are_split() {
        let big = vec![7u8; 3 * RESP_STAGE_BYTES + 5];
        let mut wire = Vec::new();
        wire.extend_from_slice(b"+OK\r\n$5\r\nhello\r\n$-1\r\n-ERR wrong type\r\n:42\r\n");
        wire.extend_from_slice(format!("${}\r\n", big.len()).as_bytes());
        wire.extend_from_slice(&big);
        wire.extend_from_slice(b"\r\n$0\r\n\r\n");
        for step in [1, 2, 3, 7, 64, RESP_STAGE_BYTES, usize::MAX] {
            let mut c = client(&wire, step);
            assert_eq!(
                c.read_reply().expect("simple"),
                Reply::Simple("OK".into()),
                "step {step}"
            );
            assert_eq!(c.read_reply().expect("bulk"), Reply::Bulk(b"hello"));
            assert_eq!(c.read_reply().expect("nil"), Reply::Nil);
            assert_eq!(
                c.read_reply().expect("error"),
                Reply::Error("ERR wrong type".into())
            );
            assert_eq!(c.read_reply().expect("integer"), Reply::Integer(42));
            assert_eq!(c.read_reply().expect("big bulk"), Reply::Bulk(&big[..]));
            assert_eq!(c.read_reply().expect("empty bulk"), Reply::Bulk(b""));
            assert!(c.read_reply().is_err(), "the stream has ended");
        }
    }

    #[test]
    fn pipelined_gets_hand_over_each_reply_in_order() {
        for step in [1, 5, usize::MAX] {
            let mut c = client(b"$3\r\nabc\r\n$-1\r\n$2\r\nxy\r\n", step);
            let mut seen = Vec::new();
            c.fetch_batch(&[b"a", b"b", b"c"], 3, &mut |i, v| {
                seen.push((i, v.map(<[u8]>::to_vec)));
                Ok(())
            })
            .expect("three replies");
            assert_eq!(
                seen,
                vec![
                    (0, Some(b"abc".to_vec())),
                    (1, None),
                    (2, Some(b"xy".to_vec()))
                ]
            );
        }
        // A reply missing from the stream is an error, not a short batch.
        let mut c = client(b"$3\r\nabc\r\n", 2);
        assert!(c.fetch_batch(&[b"a", b"b"], 3, &mut |_, _| Ok(())).is_err());
    }

    #[test]
    fn get_maps_nil_and_error_replies() {
        let mut c = client(b"$-1\r\n", 1);
        assert_eq!(c.fetch(b"k").expect("nil is not an error"), None);
        let mut c = client(b"-WRONGTYPE Operation against a key\r\n", 3);
        let e = c.fetch(b"k").expect_err("an error reply fails the GET");
        assert!(e.contains("WRONGTYPE"), "{e}");
        let mut c = client(b"$3\r\nabcXY", 2);
        assert!(c.fetch(b"k").is_err(), "a bulk without its CRLF");
        let mut c = client(b"$99999999999\r\n", 64);
        assert!(c.fetch(b"k").is_err(), "a bulk longer than allowed");
    }
}
