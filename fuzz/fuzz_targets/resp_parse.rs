//! Arbitrary bytes as a RESP receive buffer: the command parser must walk
//! it command by command without panicking, and every answer must agree
//! with the bytes and with the bounds.
//!
//! Each input is walked twice: as given, which reaches inline parsing and
//! every refusal, and behind a `*`, which sends it down the multibulk path
//! (libFuzzer finds `$`, digits and CRLF quickly with resp.dict).

#![no_main]

use fabrickv_resp::{
    CommandParser, Parse, RESP_ARGS_MAX, RESP_BULK_BYTES_MAX, RESP_COMMAND_BYTES_MAX,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    walk(data);
    let mut starred = Vec::with_capacity(data.len() + 1);
    starred.push(b'*');
    starred.extend_from_slice(data);
    walk(&starred);
});

/// Parses commands one after another, advancing by `consumed`, the way a
/// connection drains its receive buffer.
fn walk(data: &[u8]) {
    let mut p = CommandParser::new();
    let mut q = CommandParser::new();
    let mut rest = data;
    loop {
        match p.parse(rest) {
            Ok(Parse::Complete { consumed }) => {
                assert!(consumed >= 1, "a complete command took no bytes");
                assert!(consumed <= rest.len(), "consumed past the buffer");
                assert!(consumed <= RESP_COMMAND_BYTES_MAX);
                assert!(p.argc() <= RESP_ARGS_MAX);
                let args: Vec<&[u8]> = p.args(rest).collect();
                assert_eq!(args.len(), p.argc());
                let rest_range = rest.as_ptr_range();
                for a in &args {
                    assert!(a.len() <= RESP_BULK_BYTES_MAX);
                    // An argument is either a slice of this command or an
                    // unescaped copy, which is never longer.
                    assert!(a.len() < consumed);
                    let r = a.as_ptr_range();
                    if !a.is_empty() && rest_range.contains(&r.start) {
                        assert!(r.end <= rest[..consumed].as_ptr_range().end);
                    }
                }
                assert_eq!(p.argc(), args.len());

                // Self-delimiting: the command's own bytes parse the same,
                // and one byte fewer is incomplete with a need it meets.
                let own = &rest[..consumed];
                assert_eq!(q.parse(own), Ok(Parse::Complete { consumed }));
                assert!(q.args(own).eq(args.iter().copied()));
                match q.parse(&own[..consumed - 1]) {
                    Ok(Parse::Incomplete { need }) => assert!(need <= consumed),
                    other => panic!("a command cut by one byte gave {other:?}"),
                }

                // What was parsed round-trips through the multibulk form.
                if !args.is_empty() {
                    let again = multibulk(&args);
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
                assert!(need > rest.len(), "need {need} is already met");
                assert!(need <= RESP_COMMAND_BYTES_MAX);
                assert_eq!(p.argc(), 0);
                // `need` is a lower bound: no extension shorter than it
                // completes the command. Extend with the input's own bytes.
                if need - rest.len() <= 4096 && !data.is_empty() {
                    let mut longer = rest.to_vec();
                    longer.extend(data.iter().cycle().take(need - 1 - rest.len()));
                    assert!(
                        !matches!(q.parse(&longer), Ok(Parse::Complete { .. })),
                        "completed before need {need}"
                    );
                }
                return;
            }
            Err(e) => {
                assert!(e.to_string().starts_with("Protocol error: "));
                let mut reply = Vec::new();
                e.write_reply(&mut reply);
                assert!(reply.starts_with(b"-ERR ") && reply.ends_with(b"\r\n"));
                assert!(!reply[..reply.len() - 2]
                    .iter()
                    .any(|&b| b == b'\r' || b == b'\n'));
                assert_eq!(p.argc(), 0);
                return;
            }
        }
    }
}

fn multibulk(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}
