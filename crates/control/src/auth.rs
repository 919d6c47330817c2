//! The cluster secret on gRPC: a bearer token in each call's metadata.
//!
//! gRPC over plain HTTP/2 has no handshake of FabricKV's own, so the
//! secret travels as `authorization: Bearer SECRET` call metadata, as
//! grpcurl (`-H`) and every gRPC library can send it. The server checks it
//! in constant time ([`Secret::matches`]) with a tower layer in front of
//! every service it serves, server reflection included, so that nothing
//! about the service, not even its schema, is told to a caller without
//! the secret. Refusals carry FabricKV's stable codes like every other
//! status ([`crate::status`]): `AUTH_REQUIRED` for a call without the
//! metadata, `AUTH_FAILED` for a wrong token, both `UNAUTHENTICATED`.
//! Wrong tokens are counted per peer address in the server's failure
//! throttle (`fabrickv_auth::throttle`, shared with the native handshake
//! and RESP); a peer past its allowance is refused `AUTH_THROTTLED`
//! (`RESOURCE_EXHAUSTED`) with its token unjudged.

use fabrickv_auth::throttle::{SharedThrottle, Source};
use fabrickv_auth::Secret;
use fabrickv_types::ErrorCode;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::status::to_status;

/// The metadata key that carries the token (HTTP's `Authorization`
/// header; gRPC metadata keys are lower case).
pub const AUTHORIZATION_METADATA_KEY: &str = "authorization";

/// The scheme in front of the token, as RFC 6750 writes it.
pub const BEARER_PREFIX: &str = "Bearer ";

/// Checks every call's bearer token against the server's secret; lets
/// every call through when the server has none (a loopback server left
/// open on purpose).
#[derive(Clone, Debug, Default)]
pub struct BearerCheck {
    /// The cluster secret; `None` turns the check off.
    secret: Option<Secret>,
    /// Where wrong tokens are counted; `None`: not throttled.
    throttle: Option<SharedThrottle>,
}

impl BearerCheck {
    /// A check against `secret` (none: every call passes).
    pub fn new(secret: Option<Secret>) -> BearerCheck {
        BearerCheck {
            secret,
            throttle: None,
        }
    }

    /// Counts wrong tokens per peer address in `throttle` (the server's
    /// one) and refuses peers past their allowance unjudged.
    pub fn with_throttle(mut self, throttle: Option<SharedThrottle>) -> BearerCheck {
        self.throttle = throttle;
        self
    }

    /// Counts a wrong token from `source`.
    fn failed(&self, source: Source) {
        if let Some(t) = &self.throttle {
            t.failed(source);
        }
    }
}

impl Interceptor for BearerCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(secret) = &self.secret else {
            return Ok(request);
        };
        let Some(value) = request.metadata().get(AUTHORIZATION_METADATA_KEY) else {
            return Err(to_status(
                ErrorCode::AuthRequired,
                "this server needs the cluster secret: send `authorization: Bearer SECRET` metadata",
            ));
        };
        let source = Source::of(request.remote_addr());
        if let Some(Err(t)) = self.throttle.as_ref().map(|t| t.check(source)) {
            return Err(to_status(ErrorCode::AuthThrottled, &t.to_string()));
        }
        // The scheme is case-insensitive (RFC 7235); the token is not.
        let bytes = value.as_bytes();
        let token = match bytes.get(..BEARER_PREFIX.len()) {
            Some(p) if p.eq_ignore_ascii_case(BEARER_PREFIX.as_bytes()) => {
                &bytes[BEARER_PREFIX.len()..]
            }
            _ => {
                self.failed(source);
                return Err(to_status(
                    ErrorCode::AuthFailed,
                    "the authorization metadata is not `Bearer SECRET`",
                ));
            }
        };
        if secret.matches(token) {
            Ok(request)
        } else {
            self.failed(source);
            Err(to_status(
                ErrorCode::AuthFailed,
                "the bearer token is not this cluster's secret",
            ))
        }
    }
}

/// Adds the bearer token of `secret` to every outgoing call (the client
/// side of [`BearerCheck`]); with no secret, calls go out unchanged.
#[derive(Clone, Debug, Default)]
pub struct BearerToken {
    /// The metadata value, `Bearer SECRET`, made once; `None`: send none.
    value: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl BearerToken {
    /// The token of `secret`. A secret that is not printable ASCII cannot
    /// travel in HTTP/2 metadata; the error says how to make one that can.
    pub fn new(secret: Option<&Secret>) -> Result<BearerToken, String> {
        let Some(secret) = secret else {
            return Ok(BearerToken { value: None });
        };
        let mut text = zeroizing_prefix(secret.token_bytes());
        let value = std::str::from_utf8(&text)
            .ok()
            .and_then(|s| MetadataValue::try_from(s).ok())
            .ok_or_else(|| {
                "the cluster secret is not printable ASCII, so it cannot be sent as gRPC \
                 metadata: make one that is (for example `head -c 32 /dev/urandom | base64`)"
                    .to_string()
            });
        text.iter_mut().for_each(|b| *b = 0);
        let mut value = value?;
        value.set_sensitive(true);
        Ok(BearerToken { value: Some(value) })
    }
}

/// `Bearer ` followed by `token`, in a buffer the caller zeroes.
fn zeroizing_prefix(token: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(BEARER_PREFIX.len() + token.len());
    v.extend_from_slice(BEARER_PREFIX.as_bytes());
    v.extend_from_slice(token);
    v
}

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.value {
            request
                .metadata_mut()
                .insert(AUTHORIZATION_METADATA_KEY, v.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::code_of;

    fn secret() -> Secret {
        Secret::from_bytes(b"0123456789abcdef0123", "test").expect("secret")
    }

    fn with_auth(value: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(v) = value {
            r.metadata_mut().insert(
                AUTHORIZATION_METADATA_KEY,
                MetadataValue::try_from(v).expect("ascii"),
            );
        }
        r
    }

    #[test]
    fn no_secret_lets_every_call_through() {
        let mut check = BearerCheck::new(None);
        assert!(check.call(with_auth(None)).is_ok());
        assert!(check.call(with_auth(Some("Bearer wrong"))).is_ok());
    }

    #[test]
    fn missing_wrong_and_right_tokens() {
        let mut check = BearerCheck::new(Some(secret()));
        let e = check.call(with_auth(None)).expect_err("no token");
        assert_eq!(code_of(&e), ErrorCode::AuthRequired);
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = check
            .call(with_auth(Some("Bearer 0123456789abcdef0124")))
            .expect_err("wrong token");
        assert_eq!(code_of(&e), ErrorCode::AuthFailed);
        let e = check
            .call(with_auth(Some("Basic 0123456789abcdef0123")))
            .expect_err("wrong scheme");
        assert_eq!(code_of(&e), ErrorCode::AuthFailed);
        assert!(check
            .call(with_auth(Some("Bearer 0123456789abcdef0123")))
            .is_ok());
        assert!(check
            .call(with_auth(Some("bearer 0123456789abcdef0123")))
            .is_ok());
    }

    /// Wrong tokens were throttled not at all (1,407 guesses a second
    /// over gRPC): past a source's burst its calls are refused
    /// `AUTH_THROTTLED` with the token unjudged, the right one included.
    #[test]
    fn wrong_tokens_are_throttled_per_source() {
        use fabrickv_auth::throttle::SOURCE_FAILURES_BURST;
        let mut check = BearerCheck::new(Some(secret()))
            .with_throttle(Some(fabrickv_auth::throttle::SharedThrottle::default()));
        let started = std::time::Instant::now();
        let mut judged = 0u64;
        for _ in 0..2 * SOURCE_FAILURES_BURST {
            let e = check
                .call(with_auth(Some("Bearer 0123456789abcdef0124")))
                .expect_err("wrong token");
            if code_of(&e) == ErrorCode::AuthFailed {
                judged += 1;
            } else {
                assert_eq!(code_of(&e), ErrorCode::AuthThrottled);
                assert_eq!(e.code(), tonic::Code::ResourceExhausted);
            }
        }
        // The burst, and at most one more per second the loop took.
        let burst = u64::from(SOURCE_FAILURES_BURST);
        assert!(judged >= burst && judged <= burst + started.elapsed().as_secs() + 1);
        let e = check
            .call(with_auth(Some("Bearer 0123456789abcdef0123")))
            .expect_err("throttled");
        assert_eq!(code_of(&e), ErrorCode::AuthThrottled);
    }

    #[test]
    fn the_client_token_passes_the_check() {
        let s = secret();
        let mut token = BearerToken::new(Some(&s)).expect("printable");
        let sent = token.call(Request::new(())).expect("adds metadata");
        assert!(BearerCheck::new(Some(s)).call(sent).is_ok());
        let binary = Secret::from_bytes(&[0xffu8; 20], "test").expect("secret");
        let e = BearerToken::new(Some(&binary)).expect_err("not ASCII");
        assert!(e.contains("base64"), "{e}");
    }
}
