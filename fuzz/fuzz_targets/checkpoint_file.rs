//! Arbitrary bytes as a whole checkpoint file: the parser must refuse or
//! accept without panicking, and an accepted file's trailer must count
//! exactly the frames and records the parser handed over.

#![no_main]

use fabrickv_wire::checkpoint::parse_file;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (mut frames, mut records) = (0u64, 0u64);
    if let Ok((_, trailer)) = parse_file(data, &mut |recs| {
        frames += 1;
        records += recs.iter().count() as u64;
    }) {
        assert_eq!(trailer.frames, frames);
        assert_eq!(trailer.records, records);
    }
});
