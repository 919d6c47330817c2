//! The echo service: an ECHO frame's body sent back in an ECHO_REPLY.
//!
//! It measures the request layer itself (`fabrickv bench rpc`) and is the
//! service of its behaviour suite ([`crate::testsuite`]): an echo costs the
//! decode, the dispatch, one copy of the body and the reply, as little as
//! a request can. The `fabrickv` server does not register it. Its frames
//! are bounded by the decoder (`FRAME_BODY_BYTES_MAX`) and come over
//! connections the transport authenticated, like every other frame.

use fabrickv_transport::Reply;
use fabrickv_wire::echo::encode_echo_reply;
use fabrickv_wire::FrameKind;

use crate::service::{Call, Refusal, Service};

/// Answers ECHO frames with their own body.
#[derive(Debug, Default)]
pub struct EchoService;

impl Service for EchoService {
    fn kinds(&self) -> &'static [FrameKind] {
        &[FrameKind::Echo]
    }

    #[inline]
    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        encode_echo_reply(reply.buf(), call.id(), call.worker.id, call.frame.body);
        Ok(())
    }
}
