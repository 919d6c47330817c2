//! The cluster secret: one secret for every server and client of a
//! cluster, read from a file or the environment (never from a command
//! line, where every user of the host can read it in `/proc/PID/cmdline`),
//! and the three ways it is used without being sent:
//!
//! - a **proof** in each native handshake: the server sends a fresh random
//!   nonce, the client answers HMAC-SHA256(secret, context ‖ nonce), the
//!   server checks it in constant time ([`Secret::proof`],
//!   [`Secret::verify_proof`]);
//! - a **MAC** over data others may forge, such as the registry entries a
//!   cluster keeps in memcached ([`Secret::mac`], [`Secret::verify_mac`]);
//! - a **token** compared in constant time where a protocol can only carry
//!   the secret itself (RESP `AUTH`, a gRPC bearer) ([`Secret::matches`]).
//!
//! A [`Secret`] zeroes its bytes when dropped and never prints them. A
//! secret file (the cluster secret's, the RESP password's) that group or
//! others may read or write is refused, as ssh refuses such a key, unless
//! the operator says otherwise ([`open_secret_file`]).

pub mod throttle;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

/// The environment variable that holds the secret itself.
pub const ENV_TOKEN: &str = "FABRICKV_AUTH_TOKEN";
/// The environment variable that names a file holding the secret (what
/// `--auth-token-file` says on a command line).
pub const ENV_TOKEN_FILE: &str = "FABRICKV_AUTH_TOKEN_FILE";

/// The environment variable that, set to `1` (or `true`, `yes`, `on`),
/// lets a secret file that group or others may read be used (what
/// `--allow-open-secret-file` says on a command line).
pub const ENV_ALLOW_OPEN_SECRET_FILE: &str = "FABRICKV_ALLOW_OPEN_SECRET_FILE";
/// The permission bits a secret file must not have: any for group or
/// others, as ssh demands of a private key. Readable, anyone on the host
/// can take the secret; writable, anyone can replace it with theirs.
pub const SECRET_FILE_MODE_FORBIDDEN: u32 = 0o077;

/// Shortest secret accepted, in bytes: 16 random bytes (128 bits) are
/// beyond guessing; a shorter one is most likely a mistake.
pub const SECRET_BYTES_MIN: usize = 16;
/// Longest secret accepted, in bytes: bounds what a file read takes.
pub const SECRET_BYTES_MAX: usize = 4096;
/// Bytes of a handshake nonce (a fresh random challenge per connection).
pub const NONCE_BYTES: usize = 32;
/// Bytes of a proof or MAC (HMAC-SHA256).
pub const PROOF_BYTES: usize = 32;
/// Bytes of a MAC (HMAC-SHA256).
pub const MAC_BYTES: usize = PROOF_BYTES;

/// Why a secret could not be had.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The secret file could not be read.
    #[error("cannot read the secret file {path}: {source}")]
    Read {
        /// The file named.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The secret file may be read or written by group or others, and
    /// no one said that is wanted.
    #[error(
        "the secret file {path} is open to group or others (mode {mode:o}): chmod 600 it, \
         or pass --allow-open-secret-file ({ENV_ALLOW_OPEN_SECRET_FILE}=1) where it cannot \
         be made private (a container's secret mount)"
    )]
    OpenPermissions {
        /// The file named.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The secret is too short or too long (its bytes are never shown).
    #[error(
        "the secret from {from} is {len} bytes; it must be {SECRET_BYTES_MIN} to \
         {SECRET_BYTES_MAX} bytes (for example `head -c 32 /dev/urandom | base64`)"
    )]
    Length {
        /// Where it came from (a path or a variable name).
        from: String,
        /// Its length after trimming the line end.
        len: usize,
    },
}

/// The cluster secret. Cloning is cheap (`Arc`); the bytes are zeroed
/// when the last clone is dropped, and `Debug` never shows them.
#[derive(Clone)]
pub struct Secret {
    bytes: Arc<Zeroizing<Vec<u8>>>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Equal when both hold the same bytes (compared in constant time); a
/// configuration compares its secret this way.
impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        self.matches(&other.bytes)
    }
}

type HmacSha256 = Hmac<Sha256>;

impl Secret {
    /// A secret from its bytes, with one trailing line end (`\n` or
    /// `\r\n`) removed as files and `echo` leave it; `from` names where
    /// the bytes came from in an error.
    pub fn from_bytes(bytes: &[u8], from: &str) -> Result<Secret, AuthError> {
        let mut b = bytes;
        if let Some(rest) = b.strip_suffix(b"\n") {
            b = rest.strip_suffix(b"\r").unwrap_or(rest);
        }
        if !(SECRET_BYTES_MIN..=SECRET_BYTES_MAX).contains(&b.len()) {
            return Err(AuthError::Length {
                from: from.to_string(),
                len: b.len(),
            });
        }
        Ok(Secret {
            bytes: Arc::new(Zeroizing::new(b.to_vec())),
        })
    }

    /// Reads the secret from `path`, which [`open_secret_file`] must
    /// accept.
    pub fn from_file(path: &Path) -> Result<Secret, AuthError> {
        use std::io::Read;
        let file = open_secret_file(path)?;
        let mut buf = Zeroizing::new(Vec::new());
        file.take(SECRET_BYTES_MAX as u64 + 3)
            .read_to_end(&mut buf)
            .map_err(|source| AuthError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        Secret::from_bytes(&buf, &path.display().to_string())
    }

    /// The secret a process should use: from `file` if given (a
    /// `--auth-token-file`), else from `FABRICKV_AUTH_TOKEN`, else from
    /// the file `FABRICKV_AUTH_TOKEN_FILE` names; `None` if none is set.
    pub fn resolve(file: Option<&Path>) -> Result<Option<Secret>, AuthError> {
        if let Some(path) = file {
            return Secret::from_file(path).map(Some);
        }
        if let Some(v) = std::env::var_os(ENV_TOKEN) {
            use std::os::unix::ffi::OsStrExt;
            return Secret::from_bytes(v.as_bytes(), ENV_TOKEN).map(Some);
        }
        match std::env::var_os(ENV_TOKEN_FILE) {
            Some(path) if !path.is_empty() => Secret::from_file(Path::new(&path)).map(Some),
            _ => Ok(None),
        }
    }

    fn hmac(&self, context: &[u8], parts: &[&[u8]]) -> HmacSha256 {
        hmac_keyed(&self.bytes, context, parts)
    }

    /// The proof that answers a handshake's `nonce`: HMAC-SHA256 over
    /// `context` (which names the protocol, so a proof made for one use
    /// is worth nothing in another) and the nonce.
    pub fn proof(&self, context: &[u8], nonce: &[u8; NONCE_BYTES]) -> [u8; PROOF_BYTES] {
        self.hmac(context, &[nonce]).finalize().into_bytes().into()
    }

    /// Whether `proof` answers `nonce` under `context`, in constant time.
    pub fn verify_proof(&self, context: &[u8], nonce: &[u8; NONCE_BYTES], proof: &[u8]) -> bool {
        self.hmac(context, &[nonce]).verify_slice(proof).is_ok()
    }

    /// A MAC of `msg` under `context`.
    pub fn mac(&self, context: &[u8], msg: &[u8]) -> [u8; MAC_BYTES] {
        self.hmac(context, &[msg]).finalize().into_bytes().into()
    }

    /// Whether `mac` is the MAC of `msg` under `context`, in constant time.
    pub fn verify_mac(&self, context: &[u8], msg: &[u8], mac: &[u8]) -> bool {
        self.hmac(context, &[msg]).verify_slice(mac).is_ok()
    }

    /// The secret itself, for the one place a protocol can carry nothing
    /// else: the bearer token a gRPC client sends (HTTP/2 metadata has no
    /// challenge). Everything else proves or MACs the secret instead.
    pub fn token_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether `offered` is the secret itself, in time that depends on
    /// neither's contents nor on where they first differ: both are run
    /// through one HMAC and the digests compared in constant time.
    pub fn matches(&self, offered: &[u8]) -> bool {
        token_matches(&self.bytes, offered)
    }
}

/// HMAC-SHA256 keyed by `key` over `context` (length first, so that no
/// context is a prefix of another's input) and `parts`.
fn hmac_keyed(key: &[u8], context: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC accepts a key of any length.
    #[allow(clippy::expect_used)]
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(&(context.len() as u32).to_le_bytes());
    m.update(context);
    for p in parts {
        m.update(p);
    }
    m
}

/// Whether `offered` is `expected`, in time that depends on neither's
/// contents nor on where they first differ: both are run through one
/// HMAC keyed by `expected` and the digests compared in constant time.
/// [`Secret::matches`] is this for the cluster secret; a password of
/// any length (RESP's `requirepass`, which [`Secret`]'s length bounds
/// do not fit) uses it directly.
pub fn token_matches(expected: &[u8], offered: &[u8]) -> bool {
    const CONTEXT: &[u8] = b"fabrickv token";
    let mine = hmac_keyed(expected, CONTEXT, &[expected])
        .finalize()
        .into_bytes();
    hmac_keyed(expected, CONTEXT, &[offered])
        .verify_slice(&mine)
        .is_ok()
}

/// Whether [`set_allow_open_secret_files`] said yes.
static ALLOW_OPEN_SECRET_FILES: AtomicBool = AtomicBool::new(false);

/// Lets this process use secret files that group or others may read (the
/// CLI calls it for `--allow-open-secret-file`). Some hosts cannot make
/// them private: a container's secret mount is often 0644.
pub fn set_allow_open_secret_files(allow: bool) {
    ALLOW_OPEN_SECRET_FILES.store(allow, Ordering::Relaxed);
}

/// Whether open secret files are allowed: by [`set_allow_open_secret_files`]
/// or by [`ENV_ALLOW_OPEN_SECRET_FILE`] (read at each call, so that a
/// library user such as the Python package can set it too).
fn open_secret_files_allowed() -> bool {
    ALLOW_OPEN_SECRET_FILES.load(Ordering::Relaxed)
        || std::env::var(ENV_ALLOW_OPEN_SECRET_FILE).is_ok_and(|v| {
            ["1", "true", "yes", "on"]
                .iter()
                .any(|y| v.trim().eq_ignore_ascii_case(y))
        })
}

/// Opens a file that holds a secret (the cluster secret, the RESP
/// password), refusing one that group or others may read or write
/// ([`SECRET_FILE_MODE_FORBIDDEN`]) unless that is allowed
/// ([`set_allow_open_secret_files`], [`ENV_ALLOW_OPEN_SECRET_FILE`]), in
/// which case it warns. The mode is read from the opened file, so that
/// what is checked is what is read.
pub fn open_secret_file(path: &Path) -> Result<std::fs::File, AuthError> {
    open_secret_file_with(path, open_secret_files_allowed())
}

fn open_secret_file_with(path: &Path, allow_open: bool) -> Result<std::fs::File, AuthError> {
    use std::os::unix::fs::PermissionsExt;
    let read_err = |source| AuthError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mode = file.metadata().map_err(read_err)?.permissions().mode() & 0o7777;
    if mode & SECRET_FILE_MODE_FORBIDDEN != 0 {
        if !allow_open {
            return Err(AuthError::OpenPermissions {
                path: path.to_path_buf(),
                mode,
            });
        }
        tracing::warn!(
            "the secret file {} is open to group or others (mode {:o}), used as allowed",
            path.display(),
            mode
        );
    }
    Ok(file)
}

/// A fresh random nonce from the operating system.
pub fn nonce() -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    fill_random(&mut n);
    n
}

/// Fills `buf` with random bytes from the operating system (for nonces
/// and ids that must not be guessed).
pub fn fill_random(buf: &mut [u8]) {
    if let Err(e) = getrandom::getrandom(buf) {
        // The kernel's random source cannot fail on Linux once booted; a
        // failure here means the process cannot make a safe nonce.
        panic!("the operating system's random source failed: {e}");
    }
}

/// A random 64-bit number that cannot be guessed.
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    fill_random(&mut b);
    u64::from_le_bytes(b)
}

/// The secret a client process set with [`set_client_secret`].
fn client_override() -> &'static RwLock<Option<Option<Secret>>> {
    static SET: RwLock<Option<Option<Secret>>> = RwLock::new(None);
    &SET
}

/// Sets the secret every client connection of this process offers,
/// instead of the environment's (`Some(None)`: offer none). The CLI calls
/// it with what `--auth-token-file` names.
pub fn set_client_secret(secret: Option<Secret>) {
    if let Ok(mut s) = client_override().write() {
        *s = Some(secret);
    }
}

/// Forgets what [`set_client_secret`] set: the environment decides again.
pub fn clear_client_secret() {
    if let Ok(mut s) = client_override().write() {
        *s = None;
    }
}

/// The secret a client connection offers when its caller gave none: the
/// one [`set_client_secret`] set, else [`Secret::resolve`] of the
/// environment (read at each call, so a variable set later counts).
pub fn client_secret() -> Result<Option<Secret>, AuthError> {
    if let Ok(s) = client_override().read() {
        if let Some(set) = s.as_ref() {
            return Ok(set.clone());
        }
    }
    Secret::resolve(None)
}

/// Whether `host` (an address's host part: an IP, `localhost`, or a
/// bracketed IPv6) names only this host, so that a listener there needs
/// no secret. A name that is not `localhost` could resolve anywhere and
/// counts as not loopback.
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    if h.eq_ignore_ascii_case("localhost") {
        return true;
    }
    h.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// [`is_loopback_host`] of a `HOST:PORT` address (a bare host is judged
/// as is).
pub fn is_loopback_addr(addr: &str) -> bool {
    if addr.parse::<std::net::IpAddr>().is_ok() {
        return is_loopback_host(addr);
    }
    match addr.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => is_loopback_host(host),
        _ => is_loopback_host(addr),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn secret(s: &str) -> Secret {
        Secret::from_bytes(s.as_bytes(), "test").unwrap()
    }

    #[test]
    fn proofs_check_only_under_the_same_secret_context_and_nonce() {
        let a = secret("correct horse battery staple");
        let b = secret("correct horse battery stapler");
        let n = nonce();
        let p = a.proof(b"tcp", &n);
        assert!(a.verify_proof(b"tcp", &n, &p));
        assert!(!b.verify_proof(b"tcp", &n, &p), "another secret");
        assert!(!a.verify_proof(b"shm", &n, &p), "another context");
        let mut other = n;
        other[0] ^= 1;
        assert!(!a.verify_proof(b"tcp", &other, &p), "another nonce");
        assert!(!a.verify_proof(b"tcp", &n, &p[..31]), "a short proof");
        assert_ne!(nonce(), nonce(), "nonces repeat");
    }

    #[test]
    fn macs_and_tokens() {
        let a = secret("0123456789abcdef");
        let m = a.mac(b"registry", b"entry");
        assert!(a.verify_mac(b"registry", b"entry", &m));
        assert!(!a.verify_mac(b"registry", b"entrY", &m));
        assert!(a.matches(b"0123456789abcdef"));
        assert!(!a.matches(b"0123456789abcdeF"));
        assert!(!a.matches(b""));
        assert!(!a.matches(b"0123456789abcdef0"));
    }

    #[test]
    fn token_matches_passwords_of_any_length() {
        assert!(token_matches(b"pw", b"pw"));
        assert!(!token_matches(b"pw", b"pW"));
        assert!(!token_matches(b"pw", b"pw\0"));
        assert!(!token_matches(b"pw", b""));
        assert!(
            token_matches(b"", b""),
            "an empty password matches only itself"
        );
        assert!(!token_matches(b"", b"x"));
    }

    #[test]
    fn lengths_line_ends_and_redaction() {
        assert!(matches!(
            Secret::from_bytes(b"short\n", "x"),
            Err(AuthError::Length { len: 5, .. })
        ));
        let s = Secret::from_bytes(b"0123456789abcdef\r\n", "x").unwrap();
        assert!(s.matches(b"0123456789abcdef"));
        assert_eq!(format!("{s:?}"), "Secret(<redacted>)");
        let long = vec![b'a'; SECRET_BYTES_MAX + 1];
        assert!(Secret::from_bytes(&long, "x").is_err());
    }

    fn chmod(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_secret_file_open_to_group_or_others_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "a secret of many bytes\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            chmod(&path, mode);
            let e = open_secret_file_with(&path, false).unwrap_err();
            assert!(
                matches!(e, AuthError::OpenPermissions { mode: m, .. } if m == mode),
                "{mode:o}: {e}"
            );
            let text = e.to_string();
            assert!(
                text.contains("chmod 600") && text.contains("--allow-open-secret-file"),
                "{text}"
            );
            assert!(
                open_secret_file_with(&path, true).is_ok(),
                "{mode:o} allowed"
            );
        }
        for mode in [0o600, 0o400] {
            chmod(&path, mode);
            assert!(open_secret_file_with(&path, false).is_ok(), "{mode:o}");
        }
    }

    #[test]
    fn a_file_is_read_and_its_errors_name_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "a secret of many bytes\n").unwrap();
        chmod(&path, 0o600);
        let s = Secret::resolve(Some(&path)).unwrap().unwrap();
        assert!(s.matches(b"a secret of many bytes"));
        let missing = dir.path().join("missing");
        let e = Secret::from_file(&missing).unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
        std::fs::write(&path, "tiny").unwrap();
        let e = Secret::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("4 bytes") && !e.contains("tiny"), "{e}");
    }

    #[test]
    fn loopback_hosts() {
        for h in [
            "127.0.0.1:1",
            "127.9.9.9:6379",
            "[::1]:50051",
            "localhost:1",
            "::1",
        ] {
            assert!(is_loopback_addr(h), "{h}");
        }
        for h in [
            "0.0.0.0:1",
            "[::]:1",
            "10.0.0.1:1",
            "example.com:1",
            "192.168.1.1",
        ] {
            assert!(!is_loopback_addr(h), "{h}");
        }
    }
}
