//! Cluster membership for FabricKV.
//!
//! A cluster is `size` servers with ids `0..size`. Which server owns a key
//! is a pure function of the key and `size` ([`server_of_key`],
//! [`server_of_u64`]): jump consistent hash, so that growing a cluster from
//! n to n+1 servers moves only 1/(n+1) of the keys. Clients learn the
//! servers' addresses either from a static file ([`Cluster::from_toml`], the
//! default) or from a memcached registry ([`registry`]) where each server
//! publishes its descriptor, as PetPS's processes exchange their RDMA
//! queue-pair details.
//! The registry also holds named barriers.

pub mod controller;
pub mod etcd;
pub mod heartbeat;
pub mod local;
mod mac;
pub mod moves;
pub mod registry;
pub mod slots;

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use registry::{Registration, Registry, RegistryError};

/// Where a client read its cluster from, to read a server's descriptor
/// there again before reconnecting (a server restarted at another
/// address is found).
#[derive(Debug, Clone)]
pub enum Directory {
    /// The memcached registry.
    Memcached(Registry),
    /// The etcd registry.
    Etcd(Box<etcd::EtcdRegistry>),
}

impl Directory {
    /// Server `id`'s descriptor, if it is registered now.
    pub fn server(&self, id: u32) -> Result<Option<ServerDesc>, RegistryError> {
        match self {
            Directory::Memcached(r) => r.server(id),
            Directory::Etcd(r) => r.server(id),
        }
    }
}

impl From<Registry> for Directory {
    fn from(r: Registry) -> Directory {
        Directory::Memcached(r)
    }
}

/// Most servers one cluster may have (each client keeps a connection per
/// server and worker, and a batch is split into one part per server).
pub const CLUSTER_SERVERS_MAX: u32 = 1024;

/// Longest cluster or barrier name, in bytes. Names become parts of
/// memcached keys, which are at most 250 bytes.
pub const NAME_BYTES_MAX: usize = 64;

/// Salt mixed into a key's hash before jump hashing, so that the choice of
/// server is independent of the bits that choose the partition and bucket
/// inside the server (which come from the same 64-bit hash).
const SERVER_HASH_SALT: u64 = 0x6a09_e667_f3bc_c909;

/// One step of splitmix64: a bijective mixer of 64-bit values.
#[inline]
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Jump consistent hash (Lamping and Veach, 2014): the bucket in
/// `0..buckets` for `key`. Going from n to n+1 buckets moves a key only to
/// the new bucket, and for about 1/(n+1) of the keys. `buckets` of 0 is
/// treated as 1.
pub fn jump_hash(mut key: u64, buckets: u32) -> u32 {
    let n = i64::from(buckets.max(1));
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < n {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        // (b + 1) * 2^31 / ((key >> 33) + 1), in floating point as the
        // algorithm is defined.
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// The server of a byte-string key (kv and cache keys).
#[inline]
pub fn server_of_key(key: &[u8], servers: u32) -> u32 {
    server_of_hash(fabrickv_types::KeyHash::of(key).0, servers)
}

/// The server of a key whose 64-bit hash is already known.
#[inline]
pub fn server_of_hash(hash: u64, servers: u32) -> u32 {
    if servers <= 1 {
        return 0;
    }
    jump_hash(mix64(hash ^ SERVER_HASH_SALT), servers)
}

/// The server of a u64 key (embedding tables).
#[inline]
pub fn server_of_u64(key: u64, servers: u32) -> u32 {
    if servers <= 1 {
        return 0;
    }
    jump_hash(mix64(mix64(key) ^ SERVER_HASH_SALT), servers)
}

/// Checks a cluster or barrier name: 1 to [`NAME_BYTES_MAX`] bytes of
/// ASCII letters, digits, `.`, `_` and `-` (memcached keys may not hold
/// spaces or control bytes).
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(format!(
            "{what} name must be 1..={NAME_BYTES_MAX} bytes, not {}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{what} name {name:?} holds {c:?}; use letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

/// What a server publishes about itself: enough for a client to connect
/// with any of its transports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerDesc {
    /// Its id, `0..size`: the jump-hash bucket it owns.
    pub id: u32,
    /// Native-protocol addresses, with their scheme (`tcp://H:P`,
    /// `shm://NAME`, `fabric://PROVIDER/H:P`). Clients take the first one
    /// whose transport they want.
    pub addrs: Vec<String>,
    /// The RESP front-end, if it serves one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resp: Option<String>,
    /// The gRPC control plane of the KV cache, if it serves one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<String>,
    /// The memcache front end, if it serves one (where another server of
    /// an etcd cluster forwards a memcache command for a key of its slots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memcache: Option<String>,
    /// Where other servers forward those memcache commands: the memcache
    /// protocol on loops that never forward themselves, so two servers
    /// forwarding to each other cannot wait on each other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memcache_peer: Option<String>,
    /// Where its primaries ship writes to it as a backup (`HOST:PORT`,
    /// tcp), on a server of a cluster keeping more than one copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repl: Option<String>,
    /// Data-path workers (one connection per worker per client).
    #[serde(default)]
    pub workers: u32,
    /// Process id on its host, for operators.
    #[serde(default)]
    pub pid: u32,
}

impl ServerDesc {
    /// The address to reach this server over `transport` (`tcp`, `shm`,
    /// `fabric`, `inproc`), or its first address when `transport` is
    /// `None`.
    pub fn addr_for(&self, transport: Option<&str>) -> Option<&str> {
        match transport {
            None => self.addrs.first().map(String::as_str),
            Some(t) => self
                .addrs
                .iter()
                .find(|a| scheme_of(a) == t)
                .map(String::as_str),
        }
    }
}

/// The transport of an address: its scheme, `tcp` when it has none.
pub fn scheme_of(addr: &str) -> &str {
    addr.split_once("://").map_or("tcp", |(s, _)| s)
}

/// A cluster: its name and one slot per server id; a slot is `None` when
/// that server is not registered (not started yet, or gone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// The cluster's name.
    pub name: String,
    /// Indexed by server id.
    pub servers: Vec<Option<ServerDesc>>,
}

/// Why a cluster map is not usable.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The file could not be read.
    #[error("cannot read {0}: {1}")]
    Read(String, std::io::Error),
    /// The map breaks a rule (ids, sizes, names).
    #[error("invalid cluster map: {0}")]
    Invalid(String),
}

/// The static cluster file (TOML):
///
/// ```toml
/// name = "demo"
/// [[server]]
/// id = 0
/// addrs = ["tcp://10.0.0.1:7379"]
/// [[server]]
/// id = 1
/// addrs = ["tcp://10.0.0.2:7379"]
/// ```
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    #[serde(default = "default_name")]
    name: String,
    #[serde(rename = "server")]
    servers: Vec<ServerDesc>,
}

fn default_name() -> String {
    "default".into()
}

impl Cluster {
    /// A cluster of the given servers; ids must be exactly `0..n`.
    pub fn new(name: &str, mut servers: Vec<ServerDesc>) -> Result<Cluster, ClusterError> {
        check_name("cluster", name).map_err(ClusterError::Invalid)?;
        if servers.is_empty() {
            return Err(ClusterError::Invalid("a cluster needs a server".into()));
        }
        if servers.len() > CLUSTER_SERVERS_MAX as usize {
            return Err(ClusterError::Invalid(format!(
                "{} servers; at most {CLUSTER_SERVERS_MAX}",
                servers.len()
            )));
        }
        servers.sort_by_key(|s| s.id);
        for (i, s) in servers.iter().enumerate() {
            if s.id as usize != i {
                return Err(ClusterError::Invalid(format!(
                    "server ids must be 0..{} with none missing or repeated; found id {} where {i} was expected",
                    servers.len(),
                    s.id
                )));
            }
            if s.addrs.is_empty() {
                return Err(ClusterError::Invalid(format!(
                    "server {} has no address",
                    s.id
                )));
            }
        }
        Ok(Cluster {
            name: name.to_string(),
            servers: servers.into_iter().map(Some).collect(),
        })
    }

    /// A cluster of plain addresses, server `i` at `addrs[i]`.
    pub fn of_addrs<S: AsRef<str>>(name: &str, addrs: &[S]) -> Result<Cluster, ClusterError> {
        let servers = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| ServerDesc {
                id: i as u32,
                addrs: vec![a.as_ref().to_string()],
                resp: None,
                grpc: None,
                memcache: None,
                memcache_peer: None,
                repl: None,
                workers: 0,
                pid: 0,
            })
            .collect();
        Cluster::new(name, servers)
    }

    /// Parses the static cluster file's text.
    pub fn from_toml(text: &str) -> Result<Cluster, ClusterError> {
        let f: ClusterFile =
            toml::from_str(text).map_err(|e| ClusterError::Invalid(e.to_string()))?;
        Cluster::new(&f.name, f.servers)
    }

    /// Reads the static cluster file.
    pub fn from_file(path: &Path) -> Result<Cluster, ClusterError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ClusterError::Read(path.display().to_string(), e))?;
        Cluster::from_toml(&text)
    }

    /// The map as the static file's TOML.
    pub fn to_toml(&self) -> String {
        let f = ClusterFile {
            name: self.name.clone(),
            servers: self.servers.iter().flatten().cloned().collect(),
        };
        toml::to_string(&f).unwrap_or_default()
    }

    /// Number of servers (ids `0..size`), registered or not.
    pub fn size(&self) -> u32 {
        self.servers.len() as u32
    }

    /// The server that owns `key`.
    #[inline]
    pub fn server_of_key(&self, key: &[u8]) -> u32 {
        server_of_key(key, self.size())
    }

    /// The server that owns the u64 `key`.
    #[inline]
    pub fn server_of_u64(&self, key: u64) -> u32 {
        server_of_u64(key, self.size())
    }

    /// Ids of servers with no descriptor.
    pub fn missing(&self) -> Vec<u32> {
        (0..self.size())
            .filter(|&i| self.servers[i as usize].is_none())
            .collect()
    }
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "cluster {} ({} servers)", self.name, self.size())?;
        for (i, s) in self.servers.iter().enumerate() {
            match s {
                Some(s) => writeln!(
                    f,
                    "  {i:>4}  {}  workers={}{}{}",
                    s.addrs.join(","),
                    s.workers,
                    s.resp
                        .as_deref()
                        .map(|r| format!("  resp={r}"))
                        .unwrap_or_default(),
                    s.grpc
                        .as_deref()
                        .map(|g| format!("  grpc={g}"))
                        .unwrap_or_default()
                )?,
                None => writeln!(f, "  {i:>4}  (not registered)")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference values of the published algorithm for a few keys, so a
    /// change in the arithmetic (which would remap every stored key) fails.
    #[test]
    fn jump_hash_is_stable_and_in_range() {
        assert_eq!(jump_hash(0, 1), 0);
        assert_eq!(jump_hash(12345, 1), 0);
        for n in [1u32, 2, 3, 5, 17, 1000] {
            for k in 0..2000u64 {
                assert!(jump_hash(mix64(k), n) < n);
            }
        }
        // Same input, same bucket.
        assert_eq!(jump_hash(0xdead_beef, 10), jump_hash(0xdead_beef, 10));
    }

    #[test]
    fn growing_moves_only_to_the_new_server() {
        let keys: Vec<u64> = (0..20_000).collect();
        for n in [1u32, 2, 3, 7, 10] {
            let mut moved = 0;
            for &k in &keys {
                let a = server_of_u64(k, n);
                let b = server_of_u64(k, n + 1);
                if a != b {
                    assert_eq!(b, n, "a key moved between old servers");
                    moved += 1;
                }
            }
            let expect = keys.len() as f64 / f64::from(n + 1);
            assert!(
                (moved as f64) > expect * 0.85 && (moved as f64) < expect * 1.15,
                "{moved} keys moved going to {} servers, about {expect:.0} expected",
                n + 1
            );
        }
    }

    #[test]
    fn keys_spread_evenly_and_independently_of_partitions() {
        let n = 3u32;
        let mut counts = [[0u32; 4]; 3];
        for i in 0..30_000u64 {
            let key = format!("key:{i}");
            let s = server_of_key(key.as_bytes(), n);
            let p = fabrickv_types::KeyHash::of(key.as_bytes()).partition(4);
            counts[s as usize][p as usize] += 1;
        }
        // Every (server, partition) cell gets about 1/12 of the keys: the
        // server choice does not starve any partition of a server.
        for row in counts {
            for c in row {
                assert!((2000..3000).contains(&c), "skewed cell: {c} of 30000");
            }
        }
    }

    #[test]
    fn static_file_round_trips_and_checks_ids() {
        let text = r#"
            name = "demo"
            [[server]]
            id = 1
            addrs = ["tcp://10.0.0.2:7379"]
            [[server]]
            id = 0
            addrs = ["tcp://10.0.0.1:7379", "shm://s0"]
        "#;
        let c = Cluster::from_toml(text).expect("valid file");
        assert_eq!(c.size(), 2);
        let s0 = c.servers[0].as_ref().expect("server 0");
        assert_eq!(s0.addr_for(Some("shm")), Some("shm://s0"));
        assert_eq!(s0.addr_for(None), Some("tcp://10.0.0.1:7379"));
        assert_eq!(s0.addr_for(Some("fabric")), None);
        assert_eq!(Cluster::from_toml(&c.to_toml()).expect("round trip"), c);

        let gap = "[[server]]\nid = 0\naddrs = [\"a:1\"]\n[[server]]\nid = 2\naddrs = [\"b:1\"]\n";
        let e = Cluster::from_toml(gap).expect_err("id 1 missing");
        assert!(e.to_string().contains("found id 2"), "{e}");
        let dup = "[[server]]\nid = 0\naddrs = [\"a:1\"]\n[[server]]\nid = 0\naddrs = [\"b:1\"]\n";
        assert!(Cluster::from_toml(dup).is_err());
        let noaddr = "[[server]]\nid = 0\naddrs = []\n";
        assert!(Cluster::from_toml(noaddr).is_err());
        assert!(
            Cluster::from_toml("name = \"a b\"\n[[server]]\nid = 0\naddrs = [\"x:1\"]\n").is_err()
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("cluster", "ps-bench_1.a").is_ok());
        assert!(check_name("cluster", "").is_err());
        assert!(check_name("cluster", "a b").is_err());
        assert!(check_name("cluster", &"x".repeat(NAME_BYTES_MAX + 1)).is_err());
    }
}
