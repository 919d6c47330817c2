//! Arbitrary bytes as one replication message body: the decoder must
//! refuse or accept without panicking, an accepted batch must iterate
//! exactly the records it counted, each within the bounds, and a batch
//! rebuilt from those records must decode to the same records (a table's
//! shape re-encoded from its decoded form included).

#![no_main]

use fabrickv_types::limits::{
    CACHE_KEY_BYTES_MAX, CACHE_VALUE_BYTES_MAX, KEY_BYTES_MAX, LARGE_VALUE_BYTES_MAX,
};
use fabrickv_wire::ps::decode_create;
use fabrickv_wire::repl::{decode, BatchBuf, Message, Record, HASH_SLOTS, PS_ROW_BYTES_MAX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(Message::Batch {
        epoch,
        seq,
        records,
    }) = decode(data)
    else {
        return;
    };
    let all: Vec<Record<'_>> = records.iter().collect();
    assert_eq!(all.len(), records.len(), "every counted record iterates");
    let mut again = BatchBuf::default();
    for r in &all {
        match r {
            Record::Put {
                key,
                value,
                expire_unix_ms,
                meta,
            } => {
                assert!(!key.is_empty() && key.len() <= KEY_BYTES_MAX);
                assert!(value.len() <= LARGE_VALUE_BYTES_MAX);
                again.put(key, value, *expire_unix_ms, *meta);
            }
            Record::Del { key } => {
                assert!(!key.is_empty() && key.len() <= KEY_BYTES_MAX);
                again.del(key);
            }
            Record::FlushPartition { count, index } => {
                assert!(index < count);
                again.flush_partition(*count, *index);
            }
            Record::StreamBegin { ranges } => {
                assert!(ranges.iter().all(|r| r.first <= r.last && r.last < HASH_SLOTS));
                again.stream_begin(ranges);
            }
            Record::PsTable { id, spec } => {
                let spec = decode_create(spec).expect("an accepted table shape decodes");
                again.ps_table(*id, &spec);
            }
            Record::PsRow {
                table,
                key,
                value,
                expire_unix_ms,
            } => {
                assert!(value.len() <= PS_ROW_BYTES_MAX);
                again.ps_row(*table, *key, value, *expire_unix_ms);
            }
            Record::PsDel { table, key } => again.ps_del(*table, *key),
            Record::CacheEntry {
                key,
                value,
                expire_unix_ms,
            } => {
                assert!(!key.is_empty() && key.len() <= CACHE_KEY_BYTES_MAX);
                assert!(value.len() <= CACHE_VALUE_BYTES_MAX);
                again.cache_entry(key, value, *expire_unix_ms);
            }
        }
    }
    let bytes = again.seal(epoch, seq);
    let Ok(Message::Batch { records: r2, .. }) = decode(&bytes[4..]) else {
        panic!("a rebuilt batch decodes");
    };
    assert_eq!(r2.iter().collect::<Vec<_>>(), all);
});
