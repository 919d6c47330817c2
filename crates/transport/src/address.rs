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
}
