//! Arbitrary bytes as a memcache receive buffer: the parser must walk it
//! command by command without panicking, every answer must agree with the
//! bytes and the bounds, and cutting the buffer short must only ever ask
//! for more (never give a different command).

#![no_main]

use fabrickv_memcache::{
    keys, keys_piece, parse, Command, KeysPiece, Parse, Storage, MC_COMMAND_BYTES_MAX,
    MC_DATA_LENGTH_BYTES_MAX, MC_KEYS_LINE_BYTES_MAX, MC_KEY_BYTES_MAX, MC_VALUE_BYTES_MAX,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The same bytes as the rest of a long retrieval line.
    match keys_piece(data) {
        KeysPiece::Incomplete { need } => assert!(need > data.len()),
        KeysPiece::Keys { keys: k, consumed, .. } => {
            assert!(consumed >= 1 && consumed <= data.len().min(MC_KEYS_LINE_BYTES_MAX + 2));
            assert!(keys(k).all(|k| k.len() <= MC_KEY_BYTES_MAX));
        }
        KeysPiece::TooLong { consumed, .. } => {
            assert!(consumed >= 1 && consumed <= data.len().min(MC_KEYS_LINE_BYTES_MAX + 2))
        }
    }
    let mut rest = data;
    while !rest.is_empty() {
        match parse(rest) {
            Parse::Incomplete { need } => {
                assert!(need > rest.len(), "asked for no more than it has");
                assert!(need <= MC_COMMAND_BYTES_MAX + 2, "need past every bound");
                break;
            }
            Parse::Complete { consumed, cmd } => {
                assert!(consumed >= 1 && consumed <= rest.len());
                check(&cmd);
                // A prefix that ends before the command must not parse
                // as something else that is complete.
                if consumed > 1 {
                    if let Parse::Complete { consumed: c2, .. } = parse(&rest[..consumed - 1]) {
                        assert!(c2 < consumed, "a prefix took more than the whole");
                    }
                }
                rest = &rest[consumed..];
            }
        }
    }
});

fn check(cmd: &Command<'_>) {
    match cmd {
        Command::Get { keys: k, .. } | Command::Gat { keys: k, .. } => {
            assert!(k.len() <= MC_KEYS_LINE_BYTES_MAX);
            assert!(keys(k).all(|k| k.len() <= MC_KEY_BYTES_MAX));
        }
        Command::Store(Storage { key, data, .. }) => {
            assert!(key.len() <= MC_KEY_BYTES_MAX);
            assert!(data.len() <= MC_VALUE_BYTES_MAX);
        }
        Command::Meta(m) => assert!(m.data.len() <= MC_VALUE_BYTES_MAX),
        Command::TooLarge { swallow, .. } => {
            let swallow = *swallow as u64;
            assert!(swallow > MC_VALUE_BYTES_MAX as u64 + 2);
            assert!(swallow <= MC_DATA_LENGTH_BYTES_MAX + 2);
        }
        Command::Refused(r) => assert!(r.swallow as u64 <= MC_DATA_LENGTH_BYTES_MAX + 2),
        _ => {}
    }
}
