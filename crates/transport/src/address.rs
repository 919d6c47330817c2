//! Transport addresses and the schemes they name: [`listen`] and
//! [`connect`] pick the transport from the address (`tcp://`, `inproc://`,
//! or a scheme another crate registered, such as `shm://` or `fabric://`).

use std::time::Duration;

use crate::{inproc, tcp, Endpoint, Listening, Result, TransportError};

/// A parsed transport address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `tcp://HOST:PORT` or a bare `HOST:PORT`.
    Tcp(String),
    /// `inproc://NAME`: same process only.
    Inproc(String),
    /// `SCHEME://REST` for a transport registered with [`register_scheme`].
    Other(String, String),
}

impl Address {
    /// Parses an address string.
    pub fn parse(s: &str) -> Result<Address> {
        if let Some(rest) = s.strip_prefix("tcp://") {
            return Ok(Address::Tcp(rest.to_string()));
        }
        if let Some(rest) = s.strip_prefix("inproc://") {
            if rest.is_empty() {
                return Err(TransportError::BadAddress(s.to_string()));
            }
            return Ok(Address::Inproc(rest.to_string()));
        }
        if let Some((scheme, rest)) = s.split_once("://") {
            if !rest.is_empty() && schemes().read().is_ok_and(|m| m.contains_key(scheme)) {
                return Ok(Address::Other(scheme.to_string(), rest.to_string()));
            }
            return Err(TransportError::BadAddress(s.to_string()));
        }
        if !s.contains(':') {
            return Err(TransportError::BadAddress(s.to_string()));
        }
        Ok(Address::Tcp(s.to_string()))
    }
}

/// How a server listens, whatever the transport.
#[derive(Debug, Clone, Default)]
pub struct ListenOptions {
    /// Worker ports to open.
    pub workers: usize,
    /// The cluster secret each client must prove in its handshake
    /// (`None`: every client that reaches the listener is let in).
    pub secret: Option<fabrickv_auth::Secret>,
    /// shm only: users (uids) besides the server's own whose processes
    /// may connect; the peer's uid comes from the kernel (`SO_PEERCRED`).
    pub shm_allow_uids: Vec<u32>,
    /// Where failed proofs are counted (the server's one throttle, shared
    /// with RESP and gRPC); `None`: not throttled.
    pub throttle: Option<fabrickv_auth::throttle::SharedThrottle>,
}

impl ListenOptions {
    /// `workers` ports, no secret, the server's own user only.
    pub fn workers(workers: usize) -> ListenOptions {
        ListenOptions {
            workers,
            ..ListenOptions::default()
        }
    }
}

/// How a client connects, whatever the transport.
#[derive(Debug, Clone)]
pub struct Dial {
    /// Longest each blocking step of the connect may take.
    pub timeout: Duration,
    /// The cluster secret to prove if the server asks for one.
    pub secret: Option<fabrickv_auth::Secret>,
}

impl Dial {
    /// A dial with `timeout` and the process's client secret
    /// ([`fabrickv_auth::client_secret`]: the CLI's `--auth-token-file`,
    /// else `FABRICKV_AUTH_TOKEN` or `FABRICKV_AUTH_TOKEN_FILE`).
    pub fn new(timeout: Duration) -> Result<Dial> {
        let secret = fabrickv_auth::client_secret().map_err(|e| {
            TransportError::Denied(fabrickv_types::ErrorCode::AuthRequired, e.to_string())
        })?;
        Ok(Dial { timeout, secret })
    }
}

/// How a registered transport listens: the address after `SCHEME://`,
/// and the options.
pub type ListenFn = fn(&str, &ListenOptions) -> Result<Listening>;

/// How a registered transport connects: the address after `SCHEME://`,
/// the worker, and the dial.
pub type ConnectFn = fn(&str, u16, &Dial) -> Result<Box<dyn Endpoint>>;

type SchemeMap = std::collections::HashMap<String, (ListenFn, ConnectFn)>;

fn schemes() -> &'static std::sync::RwLock<SchemeMap> {
    static SCHEMES: std::sync::OnceLock<std::sync::RwLock<SchemeMap>> = std::sync::OnceLock::new();
    SCHEMES.get_or_init(Default::default)
}

/// Makes `SCHEME://...` addresses reach a transport from another crate
/// (shm, fabric): this crate holds the traits, so it cannot depend on
/// them; they register themselves instead. Registering again replaces.
pub fn register_scheme(scheme: &str, listen: ListenFn, connect: ConnectFn) {
    if let Ok(mut m) = schemes().write() {
        m.insert(scheme.to_string(), (listen, connect));
    }
}

/// Ends a bad address's message with the schemes an address may name
/// besides `tcp://`: `inproc://NAME`, then those registered when the
/// error is shown, in name order (what this process can reach, whatever
/// the build's features), e.g. ", inproc://NAME or a registered scheme
/// (fabric://, shm://)".
pub(crate) fn write_registered_schemes(f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    let mut names: Vec<String> = schemes()
        .read()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    if names.is_empty() {
        return write!(f, " or inproc://NAME");
    }
    names.sort_unstable();
    write!(f, ", inproc://NAME or a registered scheme (")?;
    for (i, n) in names.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        write!(f, "{sep}{n}://")?;
    }
    write!(f, ")")
}

fn scheme(name: &str) -> Result<(ListenFn, ConnectFn)> {
    schemes()
        .read()
        .ok()
        .and_then(|m| m.get(name).copied())
        .ok_or_else(|| TransportError::BadAddress(format!("{name}://")))
}

/// Starts listening on `addr` with `workers` worker ports, letting in
/// every client that reaches it.
pub fn listen(addr: &str, workers: usize) -> Result<Listening> {
    listen_with(addr, &ListenOptions::workers(workers))
}

/// Starts listening on `addr` as `opts` say. `inproc://` is reached only
/// from this process and asks for no secret.
pub fn listen_with(addr: &str, opts: &ListenOptions) -> Result<Listening> {
    match Address::parse(addr)? {
        Address::Tcp(a) => tcp::listen_with(&a, opts),
        Address::Inproc(name) => inproc::listen(&name, opts.workers),
        Address::Other(s, rest) => (scheme(&s)?.0)(&rest, opts),
    }
}

/// Connects to worker `worker` of the server at `addr`, proving the
/// process's client secret if the server asks ([`Dial::new`]).
pub fn connect(addr: &str, worker: u16, timeout: Duration) -> Result<Box<dyn Endpoint>> {
    connect_with(addr, worker, &Dial::new(timeout)?)
}

/// Connects to worker `worker` of the server at `addr` as `dial` says.
pub fn connect_with(addr: &str, worker: u16, dial: &Dial) -> Result<Box<dyn Endpoint>> {
    match Address::parse(addr)? {
        Address::Tcp(a) => Ok(Box::new(tcp::TcpEndpoint::connect_with(&a, worker, dial)?)),
        Address::Inproc(name) => Ok(Box::new(inproc::InprocEndpoint::connect(&name, worker)?)),
        Address::Other(s, rest) => (scheme(&s)?.1)(&rest, worker, dial),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        assert_eq!(
            Address::parse("127.0.0.1:7379").ok(),
            Some(Address::Tcp("127.0.0.1:7379".into()))
        );
        assert_eq!(
            Address::parse("tcp://[::1]:1").ok(),
            Some(Address::Tcp("[::1]:1".into()))
        );
        assert_eq!(
            Address::parse("inproc://x").ok(),
            Some(Address::Inproc("x".into()))
        );
        for bad in ["inproc://", "shm://x", "localhost", ""] {
            assert!(Address::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// The bad-address message names the schemes registered when it is
    /// shown, not a list fixed at build time.
    #[test]
    fn bad_address_names_the_registered_schemes() {
        fn no_listen(_: &str, _: &ListenOptions) -> Result<Listening> {
            Err(TransportError::Unsupported("listening in this test"))
        }
        fn no_connect(_: &str, _: u16, _: &Dial) -> Result<Box<dyn Endpoint>> {
            Err(TransportError::Unsupported("connecting in this test"))
        }
        register_scheme("registry-test", no_listen, no_connect);
        let shown = TransportError::BadAddress("nowhere".into()).to_string();
        assert!(
            shown.starts_with(
                "bad address \"nowhere\": expected HOST:PORT, tcp://HOST:PORT, inproc://NAME or a registered scheme ("
            ),
            "{shown}"
        );
        assert!(shown.contains("registry-test://"), "{shown}");
        assert!(shown.ends_with(')'), "{shown}");
    }
}
