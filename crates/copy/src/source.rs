//! The source side of a copy: sessions in the server that serves a shard.

use std::sync::Arc;

use fabrickv_storage::ShardBackend;
use fabrickv_types::ErrorCode;
use fabrickv_wire::shard::ShardMessage;

/// Finds a served shard by name.
pub type ShardLookup<'a> = &'a dyn Fn(&str) -> Option<Arc<dyn ShardBackend>>;

/// Every copy session of one server.
pub struct CopySources {
    data_host: std::net::IpAddr,
}

impl CopySources {
    /// Sessions whose data streams listen on `data_host`.
    pub fn new(data_host: std::net::IpAddr) -> CopySources {
        CopySources { data_host }
    }

    /// Where data streams listen.
    pub fn data_host(&self) -> std::net::IpAddr {
        self.data_host
    }

    /// Runs one control op; appends the reply payload to `out`.
    pub fn control(
        &self,
        msg: &ShardMessage<'_>,
        _shards: ShardLookup<'_>,
        _out: &mut Vec<u8>,
    ) -> Result<(), (ErrorCode, String)> {
        Err((
            ErrorCode::UnknownOpcode,
            format!("copy op {:?} is not served", msg.op),
        ))
    }
}
