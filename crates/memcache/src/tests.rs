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
    let Command::Get {
        keys: k,
        cas,
        more: false,
    } = c
    else {
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
    assert_eq!(refused(b"gat x a\r\n").reply, INVALID_EXPTIME);
    assert_eq!(refused(b"gat\r\n").reply, ERROR);
    // gat with no keys answers END in memcached.
    assert!(matches!(
        cmd(b"gat 10\r\n").1,
        Command::Gat { exptime: 10, .. }
    ));
}

#[test]
fn storage_waits_for_its_data_then_takes_it() {
    assert_eq!(parse(b"set k 5 0 3\r\nab"), Parse::Incomplete { need: 18 });
    let (n, c) = cmd(b"set k 5 0 3\r\nabc\r\nget k\r\n");
    assert_eq!(n, 18);
    assert_eq!(
        c,
        Command::Store(Storage {
            mode: StoreMode::Set,
            key: b"k",
            flags: 5,
            exptime: 0,
            data: b"abc",
            cas_unique: 0,
            noreply: false
        })
    );
    let (_, c) = cmd(b"cas k 0 -1 1 77 noreply\r\nx\r\n");
    assert!(matches!(
        c,
        Command::Store(Storage {
            mode: StoreMode::Cas,
            cas_unique: 77,
            exptime: -1,
            noreply: true,
            ..
        })
    ));
    assert_eq!(refused(b"set k 0 0 3\r\nabcd\r\n").reply, BAD_CHUNK);
    assert_eq!(refused(b"set k x 0 3\r\nabc\r\n").reply, BAD_FORMAT);
    assert_eq!(refused(b"set k 0 0 -1\r\n").reply, BAD_FORMAT);
    assert_eq!(refused(b"set k 4294967296 0 1\r\n").reply, BAD_FORMAT);
    assert_eq!(refused(b"set k 0 0\r\n").reply, ERROR);
    let big = format!("set k 0 0 {}\r\n", MC_VALUE_BYTES_MAX + 1);
    assert_eq!(
        cmd(big.as_bytes()).1,
        Command::TooLarge {
            key: b"k",
            base64: false,
            unlink: true,
            swallow: MC_VALUE_BYTES_MAX + 3,
            noreply: false
        }
    );
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
        // The same bytes as the rest of a long retrieval line.
        match keys_piece(&buf) {
            KeysPiece::Incomplete { need } => assert!(need > buf.len()),
            KeysPiece::Keys {
                keys: k, consumed, ..
            } => {
                assert!(consumed >= 1 && consumed <= buf.len());
                assert!(keys(k).all(|k| k.len() <= MC_KEY_BYTES_MAX));
            }
            KeysPiece::TooLong { consumed, .. } => assert!(consumed >= 1 && consumed <= buf.len()),
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
                        Command::Store(Storage { key, data, .. }) => {
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

#[test]
fn lengths_past_what_memcached_reads_are_bad_lines_not_swallows() {
    for len in ["4294967295", "2147483646", "99999999999999999999"] {
        let r = refused(format!("set k 0 0 {len}\r\nget k\r\n").as_bytes());
        assert_eq!((r.reply, r.swallow), (BAD_FORMAT, 0), "{len}");
        let r = refused(format!("ms k {len}\r\n").as_bytes());
        assert_eq!((r.reply, r.swallow), (BAD_FORMAT, 0), "ms {len}");
    }
    // The longest memcached reads is swallowed: it may really follow.
    let (n, c) = cmd(b"add k 0 0 2147483645 noreply\r\n");
    assert_eq!(n, 30);
    assert_eq!(
        c,
        Command::TooLarge {
            key: b"k",
            base64: false,
            unlink: false,
            swallow: 2_147_483_647,
            noreply: true
        }
    );
    assert!(matches!(
        cmd(b"ms aw== 2000000 b MA\r\n").1,
        Command::TooLarge {
            base64: true,
            unlink: true,
            ..
        }
    ));
    // An ms refused for its flags swallows its data, as memcached does.
    let r = refused(b"ms k 2 Z\r\nab\r\n");
    assert_eq!((r.reply, r.swallow), (INVALID_FLAG, 4));
}

#[test]
fn noreply_silences_refusals_but_not_wrong_word_counts() {
    for line in [
        &b"delete k 10 noreply\r\n"[..],
        b"incr k x noreply\r\n",
        b"touch k x noreply\r\n",
        b"flush_all x noreply\r\n",
        b"verbosity x noreply\r\n",
        b"set k x 0 1 noreply\r\n",
        b"set k 0 0 1 noreply\r\nxy\r\n",
    ] {
        assert!(refused(line).noreply, "{}", String::from_utf8_lossy(line));
    }
    assert_eq!(refused(b"delete k 10 noreply\r\n").reply, DELETE_USAGE);
    assert_eq!(refused(b"delete k 10\r\n").reply, DELETE_USAGE);
    let r = refused(b"delete k a b noreply\r\n");
    assert_eq!((r.reply, r.noreply), (ERROR, false));
    assert_eq!(
        cmd(b"delete noreply\r\n").1,
        Command::Delete {
            key: b"noreply",
            noreply: false
        }
    );
    assert_eq!(
        cmd(b"flush_all 1 2\r\n").1,
        Command::FlushAll {
            delay: 1,
            noreply: false
        }
    );
    let r = refused(b"flush_all invalid\r\n");
    assert_eq!((r.reply, r.noreply), (INVALID_EXPTIME, false));
}

#[test]
fn an_http_request_line_closes_without_a_reply() {
    for line in [
        &b"GET / HTTP/1.1\r\n"[..],
        b"POST /a HTTP/1.0\r\n",
        b"HTTP/1.1\r\n",
    ] {
        let r = refused(line);
        assert!(r.close && r.noreply, "{}", String::from_utf8_lossy(line));
    }
    assert!(!refused(b"GET k\r\n").close);
    assert!(!refused(b"set k HTTP/1.1\r\n").close);
    assert!(matches!(cmd(b"get / HTTP/1.1\r\n").1, Command::Get { .. }));
}

#[test]
fn stats_cachedump_checks_its_arguments_as_memcached() {
    assert_eq!(
        cmd(b"stats cachedump 1 0\r\n").1,
        Command::Stats {
            group: Some(b"cachedump")
        }
    );
    assert_eq!(refused(b"stats cachedump 1\r\n").reply, BAD_LINE);
    assert_eq!(refused(b"stats cachedump x 1\r\n").reply, BAD_FORMAT);
    assert_eq!(refused(b"stats cachedump 64 1\r\n").reply, ILLEGAL_SLAB_ID);
    assert_eq!(
        cmd(b"stats items x\r\n").1,
        Command::Stats {
            group: Some(b"items")
        }
    );
}

/// The keys of `get k00000 k00001 ...` with `n` keys.
fn long_get(n: usize) -> Vec<u8> {
    let mut line = b"get".to_vec();
    for i in 0..n {
        line.extend_from_slice(format!(" k{i:05}").as_bytes());
    }
    line.extend_from_slice(b"\r\n");
    line
}

#[test]
fn a_retrieval_line_past_the_bound_comes_in_pieces() {
    let line = long_get(20_000);
    assert!(line.len() > 2 * MC_KEYS_LINE_BYTES_MAX);
    // Until the bound is reached, it waits for the newline.
    assert!(matches!(
        parse(&line[..MC_KEYS_LINE_BYTES_MAX]),
        Parse::Incomplete { .. }
    ));
    let (first, c) = cmd(&line);
    let Command::Get {
        keys: k,
        more: true,
        ..
    } = c
    else {
        panic!("{c:?}")
    };
    assert!(first <= MC_KEYS_LINE_BYTES_MAX && line[first - 1] == b' ');
    let mut seen: Vec<Vec<u8>> = keys(k).map(<[u8]>::to_vec).collect();
    let mut at = first;
    loop {
        match keys_piece(&line[at..]) {
            KeysPiece::Keys {
                keys: k,
                consumed,
                last,
            } => {
                assert!(consumed <= MC_KEYS_LINE_BYTES_MAX + 2);
                seen.extend(keys(k).map(<[u8]>::to_vec));
                at += consumed;
                if last {
                    break;
                }
            }
            p => panic!("{p:?}"),
        }
    }
    assert_eq!(at, line.len());
    let want: Vec<Vec<u8>> = (0..20_000)
        .map(|i| format!("k{i:05}").into_bytes())
        .collect();
    assert_eq!(seen, want, "every key once, none cut");
    assert_eq!(keys_piece(b"k1 k2"), KeysPiece::Incomplete { need: 6 });
    // A key over the bound is refused with the rest of its line.
    let mut bad = b"get ".to_vec();
    bad.resize(MC_KEYS_LINE_BYTES_MAX + 10, b'x');
    let r = refused(&bad);
    assert!(r.skip_line && r.reply == BAD_FORMAT);
    // One after a whole key waits for the next piece, which refuses it.
    bad[4..6].copy_from_slice(b"a ");
    assert!(matches!(cmd(&bad), (6, Command::Get { more: true, .. })));
    assert_eq!(
        keys_piece(&bad[6..]),
        KeysPiece::TooLong {
            consumed: MC_KEYS_LINE_BYTES_MAX,
            last: false
        }
    );
    let mut gat = b"gat x ".to_vec();
    gat.resize(MC_KEYS_LINE_BYTES_MAX + 10, b'k');
    let r = refused(&gat);
    assert!(r.skip_line && r.reply == INVALID_EXPTIME);
}
