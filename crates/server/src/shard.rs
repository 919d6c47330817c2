//! Persistent shards served next to the in-memory services: the native
//! SHARD frames (data operations and the copy's control) and the set of
//! shards a server opened at start.

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use fabrickv_storage::{FjallShard, ShardBackend, ShardOptions};
use fabrickv_transport::Reply;
use fabrickv_types::limits::{SHARDS_MAX, SHARD_NAME_BYTES_MAX};
use fabrickv_types::ErrorCode;
use fabrickv_wire::shard::{decode_request, encode_refusal, encode_reply, ShardMessage};
use fabrickv_wire::FrameKind;

use crate::service::{wire_refusal, Call, Refusal, Service};

pub mod copy_source;
pub(crate) mod data;

use copy_source::CopySources;

/// Block cache of a served shard, in bytes: none. fjall puts every value
/// it reads from a blob file into the cache, so a copy's scan of a whole
/// shard churns through it, and the churn cost more than the hits saved:
/// a 2 GB copy here ran at 143 MB/s with 64 MiB of cache, 221 MB/s with
/// 4 MiB and 246 MB/s with none. Blocks still come from the page cache.
pub const SERVED_SHARD_CACHE_BYTES: u64 = 0;

/// A shard to serve: its name on the wire and its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSpec {
    /// What clients call it (1..=`SHARD_NAME_BYTES_MAX` bytes of
    /// `[A-Za-z0-9_.-]`).
    pub name: String,
    /// The shard's directory (created when missing).
    pub path: PathBuf,
}

impl FromStr for ShardSpec {
    type Err = String;

    /// Parses `NAME=PATH`. A relative PATH is resolved against the current
    /// directory now, so the shard the server opens (and logs) is the one
    /// the operator meant, whatever directory the process moves to. A
    /// second `=` is refused: `a=b=/p` more likely means a mistyped flag
    /// than a directory named `b=`. So is a `..` component (see
    /// [`ShardSpec::validate`]).
    fn from_str(s: &str) -> Result<ShardSpec, String> {
        let (name, path) = s
            .split_once('=')
            .ok_or_else(|| format!("shard {s:?} is not NAME=PATH"))?;
        if path.contains('=') {
            return Err(format!(
                "shard {s:?} is ambiguous: NAME=PATH takes one '=' (rename a directory whose name has '=')"
            ));
        }
        if path.is_empty() {
            return Err(format!("shard {name:?} has an empty path"));
        }
        refuse_parent_components(name, std::path::Path::new(path))?;
        let path = std::path::absolute(path)
            .map_err(|e| format!("shard {name:?}: cannot resolve {path:?}: {e}"))?;
        let spec = ShardSpec {
            name: name.to_string(),
            path,
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Refuses a shard path with a `..` component. `std::path::absolute`
/// keeps them (resolving one needs the symlinks on the way, which may not
/// exist yet), so the path logged would not say which directory is meant,
/// and `a=../../tmp/x` climbs out of wherever the operator thought the
/// shards live: the full path says the same thing unambiguously.
fn refuse_parent_components(name: &str, path: &std::path::Path) -> Result<(), String> {
    if path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(format!(
            "shard {name:?}: the path {} has a '..' component; give the directory without one",
            path.display()
        ));
    }
    Ok(())
}

impl ShardSpec {
    /// Checks the name's bytes and length, and that the path is not empty,
    /// has no `..` component and is not a file.
    fn validate(&self) -> Result<(), String> {
        let n = &self.name;
        if n.is_empty()
            || n.len() > SHARD_NAME_BYTES_MAX
            || !n
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        {
            return Err(format!(
                "shard name {n:?} must be 1..={SHARD_NAME_BYTES_MAX} bytes of letters, digits, '_', '.' or '-'"
            ));
        }
        if self.path.as_os_str().is_empty() {
            return Err(format!("shard {n:?} has an empty path"));
        }
        refuse_parent_components(n, &self.path)?;
        if self.path.exists() && !self.path.is_dir() {
            return Err(format!(
                "shard {n:?}: {} exists and is not a directory",
                self.path.display()
            ));
        }
        Ok(())
    }

    /// Checks every spec, and that names and paths are unique.
    pub fn validate_all(specs: &[ShardSpec]) -> Result<(), String> {
        if specs.len() > SHARDS_MAX {
            return Err(format!(
                "{} shards exceed SHARDS_MAX ({SHARDS_MAX})",
                specs.len()
            ));
        }
        for (i, s) in specs.iter().enumerate() {
            s.validate()?;
            if specs[..i].iter().any(|o| o.name == s.name) {
                return Err(format!("shard name {:?} is given twice", s.name));
            }
            if specs[..i].iter().any(|o| o.path == s.path) {
                return Err(format!("shard path {} is given twice", s.path.display()));
            }
        }
        Ok(())
    }
}

/// The shards a server serves, opened at start, and their copy runs.
/// Generic over the storage backend (fjall on disk by default) so that the
/// data ops reach it through [`ShardBackend`] with static calls; only a
/// copy run, which holds its shard for the run's life, sees it as
/// `dyn ShardBackend`.
pub struct Shards<S: ShardBackend = FjallShard> {
    by_name: HashMap<String, Arc<S>>,
    /// In the order given on the command line (RESP's `SELECT n` picks
    /// `order[n - 1]`).
    order: Vec<String>,
    copies: CopySources,
}

impl Shards<FjallShard> {
    /// Opens (creating when missing) every shard of `specs`.
    pub fn open(specs: &[ShardSpec], copies: CopySources) -> Result<Shards, String> {
        let mut opened = Vec::with_capacity(specs.len());
        for s in specs {
            let shard = FjallShard::open(
                &s.path,
                &ShardOptions {
                    cache_bytes: SERVED_SHARD_CACHE_BYTES,
                    create: true,
                },
            )
            .map_err(|e| format!("shard {:?} at {}: {e}", s.name, s.path.display()))?;
            tracing::info!(shard = %s.name, path = %s.path.display(), pairs = shard.approximate_len(), "serving shard");
            opened.push((s.name.clone(), Arc::new(shard)));
        }
        Ok(Shards::with_backends(opened, copies))
    }

    /// Opens `specs` with copy runs on loopback, for tests that need
    /// shards (or none) without a whole server.
    #[cfg(test)]
    pub(crate) fn open_for_tests(specs: &[ShardSpec]) -> Shards {
        let copies = CopySources::new(std::net::IpAddr::from([127, 0, 0, 1]));
        Shards::open(specs, copies).expect("shards open")
    }
}

impl<S: ShardBackend> Shards<S> {
    /// Serves `shards` (name and backend, in the order `SELECT n` counts
    /// them), already open; names are assumed checked and unique.
    pub fn with_backends(shards: Vec<(String, Arc<S>)>, copies: CopySources) -> Shards<S> {
        let order = shards.iter().map(|(n, _)| n.clone()).collect();
        Shards {
            by_name: shards.into_iter().collect(),
            order,
            copies,
        }
    }

    /// The shard named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<S>> {
        self.by_name.get(name)
    }

    /// The shard names, in the order they were given.
    pub fn names(&self) -> &[String] {
        &self.order
    }

    /// The copy runs of this server.
    pub fn copies(&self) -> &CopySources {
        &self.copies
    }
}

/// The SHARD frame handler of one worker.
pub struct ShardService<S: ShardBackend = FjallShard> {
    worker: u16,
    shards: Arc<Shards<S>>,
}

impl<S: ShardBackend + 'static> ShardService<S> {
    /// A handler for worker `worker`.
    pub fn new(worker: u16, shards: Arc<Shards<S>>) -> ShardService<S> {
        ShardService { worker, shards }
    }

    fn run(&self, req: &ShardMessage<'_>, out: &mut Vec<u8>) -> Result<(), Refusal> {
        if req.op.is_copy() {
            let lookup = |name: &str| {
                self.shards
                    .get(name)
                    .map(|s| s.clone() as Arc<dyn ShardBackend>)
            };
            return self.shards.copies.control(req, &lookup, out);
        }
        let shard = self.shards.get(req.name).ok_or_else(|| {
            (
                ErrorCode::NoSuchShard,
                format!("no shard named {:?} is served here", req.name),
            )
        })?;
        data::execute(shard.as_ref(), req, out)
    }
}

impl<S: ShardBackend + 'static> Service for ShardService<S> {
    fn kinds(&self) -> &'static [FrameKind] {
        &[FrameKind::Shard]
    }

    /// Serves one SHARD frame. Only a frame whose request cannot be read
    /// is refused whole; an op that fails is answered with a refusal reply
    /// of its own op.
    fn handle(&mut self, call: &Call<'_>, reply: &mut dyn Reply) -> Result<(), Refusal> {
        let id = call.id();
        let req = decode_request(&call.frame).map_err(wire_refusal)?;
        // The op writes its payload straight into the reply; a refused op
        // takes back what it wrote and answers with its code instead.
        let start = reply.buf().len();
        let mut ran = Ok(());
        encode_reply(reply.buf(), id, self.worker, req.op, ErrorCode::Ok, |b| {
            ran = self.run(&req, b);
        });
        if let Err((code, why)) = ran {
            reply.buf().truncate(start);
            encode_refusal(reply.buf(), id, self.worker, req.op, code, &why);
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod spec_tests {
    use super::ShardSpec;

    #[test]
    fn a_relative_shard_path_is_resolved_against_the_current_directory() {
        let spec: ShardSpec = "users=data/users".parse().unwrap();
        assert!(spec.path.is_absolute(), "{}", spec.path.display());
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(spec.path, cwd.join("data/users"));
        let abs: ShardSpec = "users=/srv/users".parse().unwrap();
        assert_eq!(abs.path, std::path::PathBuf::from("/srv/users"));
    }

    #[test]
    fn a_shard_path_with_a_parent_component_is_refused() {
        for spec in ["a=../../tmp/x", "a=/srv/../etc", "a=data/..", "a=./x/../y"] {
            let err = spec.parse::<ShardSpec>().unwrap_err();
            assert!(err.contains("'..'"), "{spec}: {err}");
        }
        let built = ShardSpec {
            name: "a".into(),
            path: "/srv/shards/../x".into(),
        };
        assert!(ShardSpec::validate_all(&[built]).is_err());
        // `.` components and doubled slashes go; the path is absolute.
        let spec: ShardSpec = "a=./data//x/.".parse().unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(spec.path, cwd.join("data/x"));
    }

    #[test]
    fn a_second_equals_sign_is_refused_as_ambiguous() {
        let err = "a=b=/p".parse::<ShardSpec>().unwrap_err();
        assert!(err.contains("ambiguous"), "{err}");
        assert!("a="
            .parse::<ShardSpec>()
            .unwrap_err()
            .contains("empty path"));
        assert!("noequals".parse::<ShardSpec>().is_err());
    }

    #[test]
    fn a_shard_path_that_is_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let err = format!("s={}", file.display())
            .parse::<ShardSpec>()
            .unwrap_err();
        assert!(err.contains("not a directory"), "{err}");
    }
}
