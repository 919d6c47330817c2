//! A reply that comes after its call timed out is dropped, never handed
//! to the next call on the same connection (the request layer's
//! late-reply policy, as a client sees it).

#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::time::Duration;

use fabrickv_client::{CacheClient, CacheClientOptions};
use fabrickv_transport::{Endpoint, Result, TransportError};
use fabrickv_types::ErrorCode;
use fabrickv_wire::cache::{encode_status_reply, CacheOp};
use fabrickv_wire::FrameHeader;

/// A cache server in the endpoint itself: it holds its answer to the
/// first request until the next request comes, then sends both, the late
/// one first. The first key is absent, every later one present.
#[derive(Default)]
struct SlowFirst {
    posted: Vec<Vec<u8>>,
    held: Vec<u64>,
    inbox: VecDeque<Vec<u8>>,
    answered: usize,
}

impl SlowFirst {
    fn answer(&mut self, id: u64, status: ErrorCode) {
        let mut m = Vec::new();
        encode_status_reply(&mut m, id, 0, CacheOp::Exists, status);
        self.inbox.push_back(m);
    }
}

impl Endpoint for SlowFirst {
    fn post_with(&mut self, build: &mut dyn FnMut(&mut Vec<u8>)) -> Result<()> {
        let mut b = Vec::new();
        build(&mut b);
        self.posted.push(b);
        Ok(())
    }

    fn flush(&mut self, _: Duration) -> Result<()> {
        for m in std::mem::take(&mut self.posted) {
            let id = FrameHeader::decode(&m).unwrap().request_id;
            if self.answered == 0 {
                self.held.push(id);
            } else {
                for late in std::mem::take(&mut self.held) {
                    self.answer(late, ErrorCode::NotFound);
                }
                self.answer(id, ErrorCode::Ok);
            }
            self.answered += 1;
        }
        Ok(())
    }

    fn poll(&mut self, max: usize, on_msg: &mut dyn FnMut(&[u8])) -> Result<usize> {
        let mut n = 0;
        while n < max {
            let Some(m) = self.inbox.pop_front() else {
                break;
            };
            on_msg(&m);
            n += 1;
        }
        Ok(n)
    }

    /// Nothing in: the wait is over at once (the deadline "passed"),
    /// so the test needs no sleep.
    fn wait(&mut self, _: Duration) -> Result<()> {
        if self.inbox.is_empty() {
            return Err(TransportError::Timeout);
        }
        Ok(())
    }
}

#[test]
fn a_call_after_a_timeout_gets_its_own_reply_not_the_late_one() {
    let opts = CacheClientOptions {
        buffer_bytes: 4096,
        timeout: Duration::from_secs(60),
    };
    let mut c = CacheClient::on_endpoint(Box::new(SlowFirst::default()), 0, opts).unwrap();
    let first = c.exists(b"absent");
    assert_eq!(first.unwrap_err().code(), ErrorCode::Timeout);
    // The late NOT_FOUND of the first call comes before this call's OK.
    assert!(c.exists(b"present").unwrap(), "got the late reply");
    assert!(
        c.exists(b"present too").unwrap(),
        "the connection is in step"
    );
}
