//! Property tests: round trips of random commands, the `need` hint on every
//! cut of them, invariants on arbitrary bytes, and the reply encoder
//! against `format!`.

use proptest::prelude::*;

use crate::{reply, tests, CommandParser, Parse, RESP_COMMAND_BYTES_MAX};

/// The multibulk encoding of owned `args` (see [`tests::multibulk`]).
fn multibulk(args: &[Vec<u8>]) -> Vec<u8> {
    let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    tests::multibulk(&args)
}

fn args_strategy() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let arg = prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..16),
        1 => proptest::collection::vec(any::<u8>(), 0..400),
    ];
    proptest::collection::vec(arg, 1..24)
}

/// Bytes that look like RESP often enough to reach deep into the parser.
fn resp_like_strategy() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(&b"*"[..]),
        Just(&b"$"[..]),
        Just(&b"\r\n"[..]),
        Just(&b"\r"[..]),
        Just(&b"\n"[..]),
        Just(&b"-"[..]),
        Just(&b"0"[..]),
        Just(&b"1"[..]),
        Just(&b"2"[..]),
        Just(&b"3"[..]),
        Just(&b" "[..]),
        Just(&b"\""[..]),
        Just(&b"'"[..]),
        Just(&b"\\"[..]),
        Just(&b"x"[..]),
        Just(&b"4f"[..]),
        Just(&b"GET"[..]),
    ];
    proptest::collection::vec(token, 0..64).prop_map(|t| t.concat())
}

/// Walks `data` command by command, checking every answer against the
/// bytes; the same checks as the `resp_parse` fuzz target.
fn walk(data: &[u8]) {
    let mut p = CommandParser::new();
    let mut q = CommandParser::new();
    let mut rest = data;
    loop {
        match p.parse(rest) {
            Ok(Parse::Complete { consumed }) => {
                assert!(consumed >= 1 && consumed <= rest.len());
                assert!(consumed <= RESP_COMMAND_BYTES_MAX);
                let args: Vec<&[u8]> = p.args(rest).collect();
                for a in &args {
                    // Spans lie in the command; unescaping only shrinks.
                    assert!(a.len() < consumed);
                }
                // A command is self-delimiting: its own bytes parse the
                // same, and one byte fewer is incomplete with a `need`
                // that its length satisfies.
                let own = &rest[..consumed];
                assert_eq!(q.parse(own), Ok(Parse::Complete { consumed }));
                assert!(q.args(own).eq(args.iter().copied()));
                match q.parse(&own[..consumed - 1]) {
                    Ok(Parse::Incomplete { need }) => assert!(need <= consumed),
                    other => panic!("a cut command gave {other:?}"),
                }
                // What was parsed round-trips through the multibulk form.
                if !args.is_empty() {
                    let owned: Vec<Vec<u8>> = args.iter().map(|a| a.to_vec()).collect();
                    let again = multibulk(&owned);
                    assert_eq!(
                        q.parse(&again),
                        Ok(Parse::Complete {
                            consumed: again.len()
                        })
                    );
                    assert!(q.args(&again).eq(args.iter().copied()));
                }
                rest = &rest[consumed..];
            }
            Ok(Parse::Incomplete { need }) => {
                assert!(need > rest.len());
                assert!(need <= RESP_COMMAND_BYTES_MAX);
                assert_eq!(p.argc(), 0);
                return;
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                assert_eq!(p.argc(), 0);
                return;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn multibulk_round_trips(args in args_strategy(), tail in proptest::collection::vec(any::<u8>(), 0..8)) {
        let wire = multibulk(&args);
        let mut buf = wire.clone();
        buf.extend_from_slice(&tail);
        let mut p = CommandParser::new();
        prop_assert_eq!(p.parse(&buf), Ok(Parse::Complete { consumed: wire.len() }));
        prop_assert_eq!(p.argc(), args.len());
        for (i, a) in args.iter().enumerate() {
            prop_assert_eq!(p.arg(&buf, i), &a[..]);
        }
    }

    #[test]
    fn every_cut_is_incomplete_with_a_sound_need(args in args_strategy()) {
        let wire = multibulk(&args);
        let mut p = CommandParser::new();
        for cut in 0..wire.len() {
            match p.parse(&wire[..cut]) {
                Ok(Parse::Incomplete { need }) => {
                    prop_assert!(need > cut, "cut {} need {}", cut, need);
                    prop_assert!(need <= wire.len(), "cut {} need {}", cut, need);
                }
                other => prop_assert!(false, "cut {} gave {:?}", cut, other),
            }
        }
        // A reader that waits for `need` each time finishes in a few
        // parses per argument, whatever their sizes.
        let mut have = 0;
        let mut parses = 0;
        loop {
            parses += 1;
            match p.parse(&wire[..have]) {
                Ok(Parse::Incomplete { need }) => have = need,
                Ok(Parse::Complete { consumed }) => {
                    prop_assert_eq!(consumed, wire.len());
                    break;
                }
                Err(e) => prop_assert!(false, "{}", e),
            }
        }
        prop_assert!(parses <= 2 * args.len() + 3, "{} parses for {} args", parses, args.len());
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        walk(&data);
        walk(&[b"*".as_slice(), &data].concat());
    }

    #[test]
    fn resp_like_bytes_never_panic(data in resp_like_strategy()) {
        walk(&data);
    }

    #[test]
    fn integers_encode_like_format(n in any::<i64>()) {
        let mut out = Vec::new();
        reply::integer(&mut out, n);
        prop_assert_eq!(out, format!(":{n}\r\n").into_bytes());
    }

    #[test]
    fn bulks_and_headers_encode_like_format(
        bytes in proptest::collection::vec(any::<u8>(), 0..300),
        len in any::<usize>(),
    ) {
        let mut out = Vec::new();
        reply::bulk(&mut out, &bytes);
        let mut want = format!("${}\r\n", bytes.len()).into_bytes();
        want.extend_from_slice(&bytes);
        want.extend_from_slice(b"\r\n");
        prop_assert_eq!(out, want);
        let mut out = Vec::new();
        reply::array_header(&mut out, len);
        reply::bulk_header(&mut out, len);
        prop_assert_eq!(out, format!("*{len}\r\n${len}\r\n").into_bytes());
    }
}

#[test]
fn walk_checks_known_streams() {
    walk(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nset \"a b\" 'c'\r\n*0\r\n\r\n*1\r\n$2\r\nab");
    walk(b"\"\\x41\" x\n*-1\r\n");
}
