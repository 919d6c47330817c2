//! Parser unit tests: every error, every bound at and one past its value,
//! and the `need` hint on hand-computed cases.

use crate::{
    CommandParser, Parse, ParseLarge, ProtocolError, RESP_ARGS_KEPT, RESP_ARGS_MAX,
    RESP_BULK_BYTES_MAX, RESP_COMMAND_BYTES_MAX, RESP_INLINE_BYTES_MAX, RESP_LARGE_BULK_BYTES_MIN,
    RESP_LENGTH_DIGITS_MAX,
};

type Outcome = Result<(Vec<Vec<u8>>, usize), Result<usize, ProtocolError>>;

/// Parses `buf` once: `Ok((args, consumed))`, `Err(Ok(need))` when
/// incomplete, `Err(Err(e))` on an error.
fn parse(buf: &[u8]) -> Outcome {
    let mut p = CommandParser::new();
    match p.parse(buf) {
        Ok(Parse::Complete { consumed }) => {
            Ok((p.args(buf).map(<[u8]>::to_vec).collect(), consumed))
        }
        Ok(Parse::Incomplete { need }) => {
            assert_eq!(p.argc(), 0);
            Err(Ok(need))
        }
        Err(e) => {
            assert_eq!(p.argc(), 0);
            Err(Err(e))
        }
    }
}

fn complete(buf: &[u8], args: &[&[u8]]) {
    let want: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
    assert_eq!(
        parse(buf),
        Ok((want, buf.len())),
        "{:?}",
        String::from_utf8_lossy(buf)
    );
}

fn need(buf: &[u8], need: usize) {
    assert_eq!(
        parse(buf),
        Err(Ok(need)),
        "{:?}",
        String::from_utf8_lossy(buf)
    );
}

fn fails(buf: &[u8], e: ProtocolError) {
    assert_eq!(
        parse(buf),
        Err(Err(e)),
        "{:?}",
        String::from_utf8_lossy(buf)
    );
}

/// `args` as a client sends them: a multibulk of bulk strings, built with
/// `format!` rather than the crate's own encoder, so the tests check it.
pub(crate) fn multibulk(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[test]
fn multibulk_commands() {
    complete(b"*1\r\n$4\r\nPING\r\n", &[b"PING"]);
    complete(
        b"*3\r\n$3\r\nSET\r\n$16\r\nkey:000000000042\r\n$3\r\nxxx\r\n",
        &[b"SET", b"key:000000000042", b"xxx"],
    );
    complete(b"*2\r\n$0\r\n\r\n$0\r\n\r\n", &[b"", b""]);
    // Payloads are opaque: CRLF, NUL, `*` and `$` inside are data.
    complete(
        b"*2\r\n$3\r\nSET\r\n$8\r\n\r\n*1\r\n$\0\r\n",
        &[b"SET", b"\r\n*1\r\n$\0"],
    );
}

#[test]
fn empty_multibulk_is_an_empty_command() {
    for buf in [
        &b"*0\r\n"[..],
        b"*-1\r\n",
        b"*-5\r\n",
        b"*-9223372036854775808\r\n",
    ] {
        complete(buf, &[]);
    }
    // The bytes after it are the next command's.
    assert_eq!(parse(b"*0\r\n*1\r\n"), Ok((vec![], 4)));
}

#[test]
fn blank_inline_lines_are_empty_commands() {
    complete(b"\r\n", &[]);
    complete(b"\n", &[]);
    complete(b" \t \x0b\x0c \r\n", &[]);
}

#[test]
fn pipelined_commands_parse_one_after_another() {
    let mut stream = multibulk(&[b"SET", b"k", b"v"]);
    stream.extend_from_slice(b"get k\r\n");
    stream.extend_from_slice(b"*0\r\n");
    stream.extend_from_slice(b"\n");
    stream.extend_from_slice(&multibulk(&[b"DEL", b"k", b""]));
    stream.extend_from_slice(b"*1\r\n$4\r\nPI");
    let want: [&[&[u8]]; 5] = [
        &[b"SET", b"k", b"v"],
        &[b"get", b"k"],
        &[],
        &[],
        &[b"DEL", b"k", b""],
    ];
    let mut p = CommandParser::new();
    let mut rest = &stream[..];
    for args in want {
        let Ok(Parse::Complete { consumed }) = p.parse(rest) else {
            panic!(
                "expected a complete command in {:?}",
                String::from_utf8_lossy(rest)
            );
        };
        assert_eq!(p.args(rest).collect::<Vec<_>>(), args);
        rest = &rest[consumed..];
    }
    assert_eq!(rest, b"*1\r\n$4\r\nPI");
    assert_eq!(p.parse(rest), Ok(Parse::Incomplete { need: 14 }));
    assert_eq!(p.argc(), 0);
}

#[test]
fn need_counts_known_lengths_and_unseen_arguments() {
    need(b"", 1);
    need(b"*", 4);
    need(b"*-", 5);
    need(b"*0", 4);
    need(b"*0\r", 4);
    // `*3\r\n` then three arguments of at least `$0\r\n\r\n`.
    need(b"*3", 22);
    need(b"*3\r", 22);
    need(b"*3\r\n", 22);
    need(b"*3\r\n$", 22);
    need(b"*3\r\n$3", 25);
    need(b"*3\r\n$3\r\nSE", 25);
    need(b"*3\r\n$3\r\nSET\r", 25);
    need(b"*3\r\n$3\r\nSET\r\n", 25);
    // A large value's full length is asked for as soon as it is announced.
    let value = vec![b'v'; 1_000_000];
    let cmd = multibulk(&[b"SET", b"k", &value]);
    let full = cmd.len();
    // `*3\r\n$3\r\nSET\r\n$1\r\nk\r\n` then `$1000000\r\n`.
    let header_end = 20 + 10;
    assert_eq!(&cmd[20..header_end], b"$1000000\r\n");
    for cut in [
        header_end - 2,
        header_end - 1,
        header_end,
        header_end + 1,
        full - 1,
    ] {
        need(&cmd[..cut], full);
    }
    // Before the last digit, only what is known so far counts.
    need(&cmd[..header_end - 3], header_end - 1 + 100_000 + 2);
    complete(&cmd, &[b"SET", b"k", &value]);
}

#[test]
fn multibulk_count_errors() {
    use ProtocolError::InvalidMultibulkLength as E;
    for buf in [
        &b"*\r\n"[..],
        b"*x",
        b"*+1\r\n",
        b"* 1\r\n",
        b"*1 \r\n",
        b"*01\r\n",
        b"*00",
        b"*-0",
        b"*--1",
        b"*1-",
        b"*1\rX",
        b"*1\n",
        b"*-9223372036854775809\r\n",
        b"*-99999999999999999999",
    ] {
        fails(buf, E);
    }
}

/// The most arguments a command of `*N` form can announce and still fit
/// in `RESP_COMMAND_BYTES_MAX`, each at its smallest.
fn count_that_fits() -> usize {
    let mut n = RESP_ARGS_MAX;
    while format!("*{n}\r\n").len() + n * 6 > RESP_COMMAND_BYTES_MAX {
        n -= 1;
    }
    n
}

#[test]
fn multibulk_count_bound() {
    // The count is bounded by the bytes its command needs, not by a number
    // of its own: the largest count that can fit is waited for...
    let n = count_that_fits();
    let at = format!("*{n}\r\n");
    need(at.as_bytes(), at.len() + n * 6);
    // ...and one more is too big a command at once.
    let over = format!("*{}\r\n", n + 1);
    fails(over.as_bytes(), ProtocolError::CommandTooBig);
    // Refused as soon as the number passes RESP_ARGS_MAX, CRLF or not.
    let past = format!("*{}", RESP_ARGS_MAX + 1);
    fails(past.as_bytes(), ProtocolError::CommandTooBig);
}

/// Regression: a command of more than 2,049 arguments was
/// refused with "invalid multibulk length" and its connection closed;
/// Redis takes MSET of 10,001 pairs and MGET of 100,000 keys.
#[test]
fn commands_of_many_arguments_parse() {
    let pairs: Vec<Vec<u8>> = (0..2 * 10_001)
        .map(|i| format!("k{i}").into_bytes())
        .collect();
    let mut args: Vec<&[u8]> = vec![b"MSET"];
    args.extend(pairs.iter().map(Vec::as_slice));
    complete(&multibulk(&args), &args);
    let keys: Vec<Vec<u8>> = (0..100_000)
        .map(|i| format!("key:{i}").into_bytes())
        .collect();
    let mut args: Vec<&[u8]> = vec![b"MGET"];
    args.extend(keys.iter().map(Vec::as_slice));
    complete(&multibulk(&args), &args);
    // The most arguments that fit, each empty.
    let n = count_that_fits();
    let args = vec![&b""[..]; n];
    let buf = multibulk(&args);
    assert!(buf.len() <= RESP_COMMAND_BYTES_MAX);
    complete(&buf, &args);
}

/// A command of many arguments grows the span buffer for itself; the
/// next command gives the room back, down to `RESP_ARGS_KEPT`, and an
/// ordinary command after that parses without the buffer growing.
#[test]
fn a_big_command_does_not_keep_its_span_buffer() {
    let keys: Vec<Vec<u8>> = (0..50_000).map(|i| format!("{i}").into_bytes()).collect();
    let mut args: Vec<&[u8]> = vec![b"DEL"];
    args.extend(keys.iter().map(Vec::as_slice));
    let big = multibulk(&args);
    let mut p = CommandParser::new();
    assert_eq!(
        p.parse(&big),
        Ok(Parse::Complete {
            consumed: big.len()
        })
    );
    assert_eq!(p.argc(), args.len());
    assert!(p.spans_capacity() >= args.len());
    // Half of the big command: incomplete, and the buffer kept for the
    // retry.
    let half = &big[..big.len() / 2];
    assert!(matches!(p.parse(half), Ok(Parse::Incomplete { .. })));
    assert!(matches!(p.parse(half), Ok(Parse::Incomplete { .. })));
    assert_eq!(
        p.parse(&big),
        Ok(Parse::Complete {
            consumed: big.len()
        })
    );
    let get = multibulk(&[b"GET", b"k"]);
    assert_eq!(
        p.parse(&get),
        Ok(Parse::Complete {
            consumed: get.len()
        })
    );
    assert!(p.spans_capacity() <= RESP_ARGS_KEPT);
    let kept = p.spans_capacity();
    let wide: Vec<&[u8]> = vec![b"x"; RESP_ARGS_KEPT.min(kept)];
    let wide = multibulk(&wide);
    for _ in 0..3 {
        assert!(matches!(p.parse(&wide), Ok(Parse::Complete { .. })));
        assert_eq!(p.spans_capacity(), kept);
    }
}

#[test]
fn length_header_digit_bound() {
    // Twenty characters is the longest header number; only a negative
    // count (an empty command) can be that long and valid.
    let at = format!("*-1{}", "0".repeat(RESP_LENGTH_DIGITS_MAX - 2));
    assert_eq!(at.len(), 1 + RESP_LENGTH_DIGITS_MAX);
    complete(format!("{at}\r\n").as_bytes(), &[]);
    need(at.as_bytes(), at.len() + 2);
    fails(format!("{at}0").as_bytes(), ProtocolError::TooBigMbulkCount);
}

#[test]
fn bulk_length_errors() {
    use ProtocolError::InvalidBulkLength as E;
    for buf in [
        &b"*1\r\n$\r\n"[..],
        b"*1\r\n$-1\r\n",
        b"*1\r\n$-",
        b"*1\r\n$x",
        b"*1\r\n$+1\r\n",
        b"*1\r\n$ 1\r\n",
        b"*1\r\n$01\r\n",
        b"*1\r\n$00",
        b"*1\r\n$1\rX",
        b"*1\r\n$1\n",
        b"*1\r\n$99999999999999999999999",
    ] {
        fails(buf, E);
    }
}

#[test]
fn bulk_length_bound() {
    // A plain parser buffers whole commands: a bulk at the bound is a
    // command over the buffer's bound.
    let at = format!("*1\r\n${RESP_BULK_BYTES_MAX}\r\n");
    fails(at.as_bytes(), ProtocolError::CommandTooBig);
    let past = format!("*1\r\n${}", RESP_BULK_BYTES_MAX + 1);
    fails(past.as_bytes(), ProtocolError::InvalidBulkLength);
    // One that takes large bulks hands it over at its header.
    let mut p = CommandParser::new();
    assert_eq!(
        p.parse_large(at.as_bytes()),
        Ok(ParseLarge::LargeBulk {
            header_at: 4,
            data_at: at.len(),
            len: RESP_BULK_BYTES_MAX,
            arg: 0
        })
    );
    assert_eq!(
        p.parse_large(past.as_bytes()),
        Err(ProtocolError::InvalidBulkLength)
    );
    assert_eq!(
        ProtocolError::InvalidBulkLength.to_string(),
        "Protocol error: invalid bulk length"
    );
}

#[test]
fn large_bulks_are_handed_over_and_resume_as_empty_arguments() {
    let mut p = CommandParser::new();
    let head = format!("*4\r\n$3\r\nSET\r\n$1\r\nk\r\n${RESP_LARGE_BULK_BYTES_MIN}\r\n");
    // Waits for the header only, not for the payload.
    assert_eq!(
        p.parse_large(&head.as_bytes()[..head.len() - 1]),
        Ok(ParseLarge::Parse(Parse::Incomplete { need: head.len() }))
    );
    let mut buf = head.clone().into_bytes();
    buf.extend_from_slice(b"abc");
    let header_at = head.find("$1048577").expect("header");
    assert_eq!(
        p.parse_large(&buf),
        Ok(ParseLarge::LargeBulk {
            header_at,
            data_at: head.len(),
            len: RESP_LARGE_BULK_BYTES_MIN,
            arg: 2
        })
    );
    assert_eq!(p.argc(), 0);
    // The caller received the payload elsewhere and left `$0\r\n` plus
    // what followed the payload.
    let mut resumed = buf[..header_at].to_vec();
    resumed.extend_from_slice(b"$0\r\n\r\n$2\r\nNX\r\n");
    assert_eq!(
        p.parse_large(&resumed),
        Ok(ParseLarge::Parse(Parse::Complete {
            consumed: resumed.len()
        }))
    );
    let args: Vec<&[u8]> = p.args(&resumed).collect();
    assert_eq!(args, [&b"SET"[..], b"k", b"", b"NX"]);
    // A bulk just under the threshold is buffered as before.
    let value = vec![1u8; RESP_LARGE_BULK_BYTES_MIN - 1];
    let wire = multibulk(&[b"SET", b"k", &value]);
    assert_eq!(
        p.parse_large(&wire),
        Ok(ParseLarge::Parse(Parse::Complete {
            consumed: wire.len()
        }))
    );
}

#[test]
fn bulk_must_start_with_dollar() {
    fails(b"*1\r\n:1\r\n", ProtocolError::ExpectedDollar(b':'));
    fails(b"*2\r\n$1\r\na\r\nX", ProtocolError::ExpectedDollar(b'X'));
    fails(b"*1\r\n\r\n", ProtocolError::ExpectedDollar(b'\r'));
}

#[test]
fn bulk_payload_must_end_with_crlf() {
    use ProtocolError::InvalidBulkLength as E;
    fails(b"*1\r\n$1\r\naXY", E);
    fails(b"*1\r\n$1\r\na\rX", E);
    fails(b"*1\r\n$1\r\na\n\r", E);
    fails(b"*1\r\n$1\r\nab\r\n", E);
    need(b"*1\r\n$1\r\na\r", 11);
    need(b"*1\r\n$1\r\na", 11);
}

/// A command of exactly `total` bytes: `*8` and eight bulks whose sizes add
/// up to the rest.
fn command_of(total: usize) -> Vec<u8> {
    const ARGS: usize = 8;
    // `*8\r\n`, and `$` + 7 digits + CRLF + CRLF around each payload.
    let payload = total - 4 - ARGS * 12;
    let mut sizes = [payload / ARGS; ARGS];
    sizes[ARGS - 1] += payload % ARGS;
    let values: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![b'x'; n]).collect();
    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let buf = multibulk(&refs);
    assert_eq!(buf.len(), total);
    buf
}

#[test]
fn command_size_bound() {
    let at = command_of(RESP_COMMAND_BYTES_MAX);
    assert!(matches!(
        parse(&at),
        Ok((args, n)) if args.len() == 8 && n == RESP_COMMAND_BYTES_MAX
    ));
    let past = command_of(RESP_COMMAND_BYTES_MAX + 1);
    fails(&past, ProtocolError::CommandTooBig);
    // Refused when the last header arrives, without waiting for its value
    // (payloads are all `x`, so the last `$` starts the last header).
    let cut = past.iter().rposition(|&b| b == b'$').map_or(0, |i| i + 10);
    assert_eq!(&past[cut - 2..cut], b"\r\n");
    fails(&past[..cut], ProtocolError::CommandTooBig);
    // And when the unseen arguments alone cannot fit.
    let mut big = format!("*{RESP_ARGS_MAX}\r\n").into_bytes();
    let value = vec![0u8; RESP_COMMAND_BYTES_MAX / 8];
    for _ in 0..8 {
        big.extend_from_slice(&multibulk(&[&value])[4..]);
    }
    fails(&big, ProtocolError::CommandTooBig);
}

#[test]
fn inline_commands() {
    complete(b"PING\r\n", &[b"PING"]);
    complete(b"PING\n", &[b"PING"]);
    complete(b"  set  k \t v \r\n", &[b"set", b"k", b"v"]);
    complete(b"a\rb\n", &[b"a", b"b"]);
    complete(b"$3 *1\r\n", &[b"$3", b"*1"]);
    need(b"PING", 5);
    need(b"PING\r", 6);
    assert_eq!(
        parse(b"get k\r\nget j\r\n"),
        Ok((vec![b"get".to_vec(), b"k".to_vec()], 7))
    );
}

#[test]
fn inline_quotes_and_escapes() {
    complete(b"set \"a b\" 'c d'\r\n", &[b"set", b"a b", b"c d"]);
    complete(b"\"\" ''\n", &[b"", b""]);
    complete(
        b"\"\\n\\r\\t\\b\\a\\\\\\\"\\x41\\x4a\\xff\\xzz\\q\"\n",
        &[b"\n\r\t\x08\x07\\\"AJ\xffxzzq"],
    );
    // `\x` needs two hex digits, or it is just `x`.
    complete(b"\"\\x4\"\n", &[b"x4"]);
    complete(b"'it\\'s' 'a\\nb' 'x\"y'\n", &[b"it's", b"a\\nb", b"x\"y"]);
    complete(b"\"it's\"\n", &[b"it's"]);
    // A quote may open mid-word; the plain part comes along.
    complete(b"a\"b c\" d\n", &[b"ab c", b"d"]);
    complete(b"a'b c'\n", &[b"ab c"]);
    // CR inside quotes is data (only the one before LF is stripped).
    complete(b"\"a\rb\"\r\n", &[b"a\rb"]);
}

#[test]
fn inline_quote_errors() {
    for buf in [
        &b"\"abc\n"[..],
        b"'abc\n",
        b"\"a\"b\n",
        b"'a'b\n",
        b"a\"b\"c\n",
        b"\"abc\\\"\n",
        b"'a\\'\n",
        b"\"\"\"\"\n",
        b"set \"k\n",
    ] {
        fails(buf, ProtocolError::UnbalancedQuotes);
    }
}

#[test]
fn inline_args_resolve_in_buffer_or_scratch() {
    let buf = b"get \"k 1\" plain\r\n";
    let mut p = CommandParser::new();
    assert_eq!(
        p.parse(buf),
        Ok(Parse::Complete {
            consumed: buf.len()
        })
    );
    assert_eq!(p.argc(), 3);
    // Plain words point into the caller's buffer.
    assert_eq!(p.arg(buf, 0).as_ptr(), buf.as_ptr());
    assert_eq!(p.arg(buf, 1), b"k 1");
    assert_eq!(p.arg(buf, 2).as_ptr(), buf[10..].as_ptr());
    assert_eq!(p.arg(buf, 3), b"");
    assert_eq!(
        p.arg(b"", 0),
        b"",
        "a wrong buffer gives empty, not a panic"
    );
}

#[test]
fn inline_line_bound() {
    let at = vec![b'a'; RESP_INLINE_BYTES_MAX];
    let long = |suffix: &[u8]| [&at[..], suffix].concat();
    complete(&long(b"\r\n"), &[&at]);
    complete(&long(b"\n"), &[&at]);
    need(&at, RESP_INLINE_BYTES_MAX + 1);
    need(&long(b"\r"), RESP_INLINE_BYTES_MAX + 2);
    fails(&long(b"a"), ProtocolError::TooBigInline);
    fails(&long(b"a\n"), ProtocolError::TooBigInline);
    fails(&long(b"\rX"), ProtocolError::TooBigInline);
    fails(&long(b"\r\r\n"), ProtocolError::TooBigInline);
}

#[test]
fn inline_argument_count_bound() {
    // The longest inline line holds fewer arguments than RESP_ARGS_MAX, so
    // the multibulk bound holds for inline commands too.
    let n = RESP_INLINE_BYTES_MAX / 2;
    let mut at = b"a ".repeat(n);
    at.pop();
    let args = vec![&b"a"[..]; n];
    complete(&[&at[..], b"\n"].concat(), &args);
}

#[test]
fn parser_state_does_not_leak_between_commands() {
    let mut p = CommandParser::new();
    let quoted = b"\"x\" \"y\"\n";
    assert!(p.parse(quoted).is_ok());
    assert_eq!(p.args(quoted).collect::<Vec<_>>(), [&b"x"[..], b"y"]);
    let plain = multibulk(&[b"GET", b"k"]);
    assert!(p.parse(&plain).is_ok());
    assert_eq!(p.args(&plain).collect::<Vec<_>>(), [&b"GET"[..], b"k"]);
    assert!(p.parse(b"*2\r\n$1\r\n").is_ok());
    assert_eq!(p.argc(), 0);
    assert!(p.parse(b"*x").is_err());
    assert_eq!(p.argc(), 0);
}

#[test]
fn unauthenticated_bounds_refuse_at_the_header() {
    let mut p = CommandParser::new();
    p.set_unauthenticated(true);
    // A count past the bound is refused without waiting for its arguments.
    assert_eq!(
        p.parse(b"*100\r\n"),
        Err(ProtocolError::UnauthenticatedMultibulkLength)
    );
    // Even before its line ends.
    assert_eq!(
        p.parse(b"*11"),
        Err(ProtocolError::UnauthenticatedMultibulkLength)
    );
    assert_eq!(
        p.parse(b"*1\r\n$16385\r\n"),
        Err(ProtocolError::UnauthenticatedBulkLength)
    );
    // At the bounds a command still parses.
    let mut ten = b"*10\r\n".to_vec();
    for _ in 0..10 {
        ten.extend_from_slice(b"$1\r\na\r\n");
    }
    assert!(matches!(p.parse(&ten), Ok(Parse::Complete { .. })));
    assert!(matches!(
        p.parse(b"*1\r\n$16384\r\n"),
        Ok(Parse::Incomplete { .. })
    ));
    // A malformed header is still malformed.
    assert_eq!(
        p.parse(b"*x\r\n"),
        Err(ProtocolError::InvalidMultibulkLength)
    );
    // Once authenticated, the general bounds apply again.
    p.set_unauthenticated(false);
    assert!(matches!(p.parse(b"*100\r\n"), Ok(Parse::Incomplete { .. })));
    assert!(matches!(
        p.parse(b"*1\r\n$16385\r\n"),
        Ok(Parse::Incomplete { .. })
    ));
}
