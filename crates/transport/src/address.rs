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

/// How a registered transport listens: the address after `SCHEME://`,
/// and the number of workers.
pub type ListenFn = fn(&str, usize) -> Result<Listening>;

/// How a registered transport connects: the address after `SCHEME://`,
/// the worker, and the timeout.
pub type ConnectFn = fn(&str, u16, Duration) -> Result<Box<dyn Endpoint>>;

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

/// Starts listening on `addr` with `workers` worker ports.
pub fn listen(addr: &str, workers: usize) -> Result<Listening> {
    match Address::parse(addr)? {
        Address::Tcp(a) => tcp::listen(&a, workers),
        Address::Inproc(name) => inproc::listen(&name, workers),
        Address::Other(s, rest) => (scheme(&s)?.0)(&rest, workers),
    }
}

/// Connects to worker `worker` of the server at `addr`.
pub fn connect(addr: &str, worker: u16, timeout: Duration) -> Result<Box<dyn Endpoint>> {
    match Address::parse(addr)? {
        Address::Tcp(a) => Ok(Box::new(tcp::TcpEndpoint::connect(&a, worker, timeout)?)),
        Address::Inproc(name) => Ok(Box::new(inproc::InprocEndpoint::connect(&name, worker)?)),
        Address::Other(s, rest) => (scheme(&s)?.1)(&rest, worker, timeout),
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
        fn no_listen(_: &str, _: usize) -> Result<Listening> {
            Err(TransportError::Unsupported("listening in this test"))
        }
        fn no_connect(_: &str, _: u16, _: Duration) -> Result<Box<dyn Endpoint>> {
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
