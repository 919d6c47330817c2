use super::*;

fn cmd(input: &[u8]) -> (usize, Command<'_>) {
    match parse(input) {
        Parse::Complete { consumed, cmd } => (consumed, cmd),
        p => panic!("incomplete: {p:?}"),
    }
}

fn refused(input: &[u8]) -> Refusal {
    match cmd(input).1 {
        Command::Refused(r) => r,
        c => panic!("not refused: {c:?}"),
    }
}

#[test]
fn retrievals_take_many_keys() {
    let (n, c) = cmd(b"get a bb  ccc\r\nrest");
    assert_eq!(n, 15);
    let Command::Get { keys: k, cas } = c else {
        panic!()
    };
    assert!(!cas);
    assert_eq!(keys(k).collect::<Vec<_>>(), [&b"a"[..], b"bb", b"ccc"]);
    assert!(matches!(cmd(b"gets a\n").1, Command::Get { cas: true, .. }));
    assert!(matches!(
        cmd(b"gats 100 a b\r\n").1,
        Command::Gat {
            exptime: 100,
            cas: true,
            ..
        }
    ));
    assert_eq!(refused(b"get\r\n").reply, ERROR);
    assert_eq!(refused(b"gat x a\r\n").reply, ERROR);
}

#[test]
fn storage_waits_for_its_data_then_takes_it() {
    assert_eq!(parse(b"set k 5 0 3\r\nab"), Parse::Incomplete { need: 18 });
    let (n, c) = cmd(b"set k 5 0 3\r\nabc\r\nget k\r\n");
    assert_eq!(n, 18);
    assert_eq!(
        c,
        Command::Store {
            mode: StoreMode::Set,
            key: b"k",
            flags: 5,
            exptime: 0,
            data: b"abc",
            cas_unique: 0,
            noreply: false
        }
    );
    let (_, c) = cmd(b"cas k 0 -1 1 77 noreply\r\nx\r\n");
    assert!(matches!(
        c,
        Command::Store {
            mode: StoreMode::Cas,
            cas_unique: 77,
            exptime: -1,
            noreply: true,
            ..
        }
    ));
    assert_eq!(refused(b"set k 0 0 3\r\nabcd\r\n").reply, BAD_CHUNK);
    assert_eq!(refused(b"set k x 0 3\r\nabc\r\n").reply, BAD_FORMAT);
    assert_eq!(refused(b"set k 0 0 -1\r\n").reply, BAD_FORMAT);
    assert_eq!(refused(b"set k 4294967296 0 1\r\n").reply, BAD_FORMAT);
    assert_eq!(refused(b"set k 0 0\r\n").reply, ERROR);
    let big = format!("set k 0 0 {}\r\n", MC_VALUE_BYTES_MAX + 1);
    let r = refused(big.as_bytes());
    assert_eq!((r.reply, r.swallow), (TOO_LARGE, MC_VALUE_BYTES_MAX + 3));
    let long_key = format!("set {} 0 0 1\r\nx\r\n", "k".repeat(MC_KEY_BYTES_MAX + 1));
    assert_eq!(refused(long_key.as_bytes()).reply, BAD_FORMAT);
}

#[test]
fn lines_are_bounded() {
    let long = vec![b'x'; MC_LINE_BYTES_MAX + 2];
    let r = refused(&long);
    assert!(r.close && r.reply == LINE_TOO_LONG);
    assert_eq!(
        parse(&long[..MC_LINE_BYTES_MAX]),
        Parse::Incomplete {
            need: MC_LINE_BYTES_MAX + 1
        }
    );
    // Retrievals may be longer.
    let mut get = b"get ".to_vec();
    while get.len() < MC_LINE_BYTES_MAX * 2 {
        get.extend_from_slice(b"key ");
    }
    get.extend_from_slice(b"\r\n");
    assert!(matches!(cmd(&get).1, Command::Get { .. }));
}

#[test]
fn simple_commands() {
    assert_eq!(
        cmd(b"delete k noreply\r\n").1,
        Command::Delete {
            key: b"k",
            noreply: true
        }
    );
    assert!(matches!(cmd(b"delete k 0\r\n").1, Command::Delete { .. }));
    assert!(matches!(
        cmd(b"incr k 18446744073709551615\r\n").1,
        Command::Arith {
            incr: true,
            delta: u64::MAX,
            ..
        }
    ));
    assert_eq!(refused(b"decr k -1\r\n").reply, BAD_DELTA);
    assert!(matches!(
        cmd(b"touch k 10 noreply\r\n").1,
        Command::Touch {
            exptime: 10,
            noreply: true,
            ..
        }
    ));
    assert_eq!(
        cmd(b"flush_all 5 noreply\r\n").1,
        Command::FlushAll {
            delay: 5,
            noreply: true
        }
    );
    assert_eq!(cmd(b"version\r\n").1, Command::Version);
    assert_eq!(cmd(b"quit\r\n").1, Command::Quit);
    assert_eq!(cmd(b"stats\r\n").1, Command::Stats { group: None });
    assert_eq!(refused(b"bogus\r\n").reply, ERROR);
    assert_eq!(refused(b"\r\n").reply, ERROR);
}

#[test]
fn meta_commands_and_their_flags() {
    let (_, c) = cmd(b"mg k v f t c k s O123 q\r\n");
    let Command::Meta(m) = c else { panic!() };
    assert_eq!((m.kind, m.key), (MetaKind::Get, &b"k"[..]));
    assert!(m.flags.value && m.flags.quiet);
    assert_eq!(m.flags.opaque, Some(&b"123"[..]));
    let (n, c) = cmd(b"ms k 2 T90 F7 C3 MA\r\nhi\r\n");
    assert_eq!(n, 25);
    let Command::Meta(m) = c else { panic!() };
    assert_eq!(m.data, b"hi");
    assert_eq!(
        (
            m.flags.ttl,
            m.flags.client_flags,
            m.flags.compare_cas,
            m.flags.mode
        ),
        (Some(90), Some(7), Some(3), Some(b'A'))
    );
    assert_eq!(refused(b"mg k h\r\n").reply, INVALID_FLAG);
    assert_eq!(refused(b"mg k Z\r\n").reply, INVALID_FLAG);
    assert_eq!(refused(b"ms k 1 MX\r\nx\r\n").reply, INVALID_MODE);
    assert_eq!(refused(b"ms k 2\r\nabc\r\n").reply, BAD_CHUNK);
    assert_eq!(refused(b"mg\r\n").reply, BAD_FORMAT);
    assert!(matches!(cmd(b"ma k N0 J5 D2 MD v\r\n").1, Command::Meta(_)));
    assert_eq!(cmd(b"mn\r\n").1, Command::MetaNoop);
}

#[test]
fn exptimes_follow_memcached() {
    let now = 1_000;
    let unix = 1_700_000_000_000;
    assert_eq!(deadline_ms(0, now, unix), None);
    assert_eq!(deadline_ms(-1, now, unix), Some(0));
    assert_eq!(deadline_ms(10, now, unix), Some(11_000));
    assert_eq!(deadline_ms(1_700_000_010, now, unix), Some(11_000));
    assert_eq!(deadline_ms(1_600_000_000, now, unix), Some(0));
}

#[test]
fn base64_round_trips() {
    for src in [&b"f"[..], b"fo", b"foo", b"foob", b"\x00\xff\x10"] {
        let mut enc = Vec::new();
        base64_encode(src, &mut enc);
        let mut out = [0u8; 8];
        let n = base64_decode(&enc, &mut out).expect("decodes");
        assert_eq!(&out[..n], src);
    }
    let mut out = [0u8; 8];
    assert_eq!(base64_decode(b"Zm9v", &mut out), Some(3));
    assert_eq!(base64_decode(b"Zm9", &mut out), None);
    assert_eq!(base64_decode(b"Z!9v", &mut out), None);
}

/// The fuzz target's invariants over random and mutated input (a cheap
/// stand-in for `fuzz/fuzz_targets/memcache_parse.rs` in every test run).
#[test]
fn random_input_never_panics_and_keeps_the_bounds() {
    let seeds: [&[u8]; 8] = [
        b"set k 1 2 3\r\nabc\r\n",
        b"get a b c\r\n",
        b"gats 10 a\r\n",
        b"cas k 0 0 1 9 noreply\r\nx\r\n",
        b"ms k 2 T1 F2 C3 MA q O1 b\r\nhi\r\n",
        b"mg k v c f s t k O1 q T5\r\n",
        b"ma k N0 J1 D2 MD v\r\n",
        b"incr k 18446744073709551615\r\nflush_all 1 noreply\r\n",
    ];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..20_000 {
        let mut buf: Vec<u8> = seeds[round % seeds.len()].to_vec();
        for _ in 0..(next() % 6) {
            let at = (next() as usize) % (buf.len() + 1);
            match next() % 4 {
                0 => buf.insert(at, next() as u8),
                1 if at < buf.len() => buf[at] = b" \r\n0-9vMN"[(next() % 9) as usize],
                2 if at < buf.len() => {
                    buf.remove(at);
                }
                _ => buf.truncate(at),
            }
        }
        let mut rest = &buf[..];
        while !rest.is_empty() {
            match parse(rest) {
                Parse::Incomplete { need } => {
                    assert!(need > rest.len() && need <= MC_COMMAND_BYTES_MAX + 2);
                    break;
                }
                Parse::Complete { consumed, cmd } => {
                    assert!(consumed >= 1 && consumed <= rest.len(), "{buf:?}");
                    match cmd {
                        Command::Store { key, data, .. } => {
                            assert!(key.len() <= MC_KEY_BYTES_MAX);
                            assert!(data.len() <= MC_VALUE_BYTES_MAX);
                        }
                        Command::Get { keys: k, .. } => {
                            assert!(keys(k).all(|k| k.len() <= MC_KEY_BYTES_MAX))
                        }
                        _ => {}
                    }
                    rest = &rest[consumed..];
                }
            }
        }
    }
}
