//! The MAC a registry entry carries when the cluster has a secret, the
//! same for the memcached and etcd registries: anyone who reaches the
//! registry can write there, so a reader holding the secret ignores (and
//! logs) a value whose MAC is wrong or missing, as if the key were absent.
//! A value is stored as `VALUE\nmac:HEX`, where HEX is [`Secret::mac`]
//! under [`REGISTRY_MAC_CONTEXT`] of the key, a 0 byte and the value.

use fabrickv_auth::Secret;

/// What a registry MAC is made for, so that a MAC made with the cluster
/// secret for anything else (a handshake, another version's entries)
/// never passes as one.
pub const REGISTRY_MAC_CONTEXT: &[u8] = b"fabrickv registry v1";

/// What separates a value from its MAC (neither JSON from serde_json nor
/// a number holds a line break).
const MAC_SEPARATOR: &str = "\nmac:";

/// `value` as stored under `key`: with its MAC when there is a secret.
pub(crate) fn seal(secret: Option<&Secret>, key: &str, value: &str) -> String {
    match secret {
        None => value.to_string(),
        Some(s) => {
            let mac = s.mac(REGISTRY_MAC_CONTEXT, &mac_input(key, value));
            let mut out = String::with_capacity(value.len() + MAC_SEPARATOR.len() + 64);
            out.push_str(value);
            out.push_str(MAC_SEPARATOR);
            for b in mac {
                out.push_str(&format!("{b:02x}"));
            }
            out
        }
    }
}

/// The value stored under `key`, if it is one to trust: its MAC checks
/// out (with a secret), and it is text. Otherwise the reason is logged
/// (never the secret, nor the junk itself beyond its length) and the
/// key counts as absent.
pub(crate) fn open<'a>(
    secret: Option<&Secret>,
    addr: &str,
    key: &str,
    raw: &'a [u8],
) -> Option<&'a str> {
    let Ok(text) = std::str::from_utf8(raw) else {
        tracing::warn!(
            "registry {}: key {key} holds {} bytes that are not text; ignored",
            addr,
            raw.len()
        );
        return None;
    };
    let (value, mac) = match text.split_once(MAC_SEPARATOR) {
        Some((v, m)) => (v, Some(m)),
        None => (text, None),
    };
    let Some(secret) = secret else {
        return Some(value);
    };
    let ok = mac
        .and_then(parse_hex_mac)
        .is_some_and(|m| secret.verify_mac(REGISTRY_MAC_CONTEXT, &mac_input(key, value), &m));
    if !ok {
        tracing::warn!(
            "registry {}: key {key} {} a MAC made with this cluster's secret; ignored \
             (written by a server with another secret, or forged)",
            addr,
            if mac.is_some() {
                "does not carry"
            } else {
                "carries no"
            },
        );
        return None;
    }
    Some(value)
}

/// What a registry MAC covers: the key, a 0 byte (neither holds one) and
/// the value, so that a valid entry copied under another key fails.
fn mac_input(key: &str, value: &str) -> Vec<u8> {
    let mut m = Vec::with_capacity(key.len() + 1 + value.len());
    m.extend_from_slice(key.as_bytes());
    m.push(0);
    m.extend_from_slice(value.as_bytes());
    m
}

/// A MAC written as lower-case hex, or `None` if it is not one.
fn parse_hex_mac(hex: &str) -> Option<[u8; fabrickv_auth::MAC_BYTES]> {
    let hex = hex.as_bytes();
    if hex.len() != 2 * fabrickv_auth::MAC_BYTES {
        return None;
    }
    let mut mac = [0u8; fabrickv_auth::MAC_BYTES];
    for (b, pair) in mac.iter_mut().zip(hex.chunks_exact(2)) {
        let s = std::str::from_utf8(pair).ok()?;
        *b = u8::from_str_radix(s, 16).ok()?;
    }
    Some(mac)
}
