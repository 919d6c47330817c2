//! Redis Cluster's side of the RESP front end: the redirection of a key
//! this server does not serve (`-MOVED`, `-CROSSSLOT`), and the commands a
//! cluster client asks the topology with (CLUSTER SLOTS, SHARDS, NODES,
//! INFO, MYID, KEYSLOT; READONLY, READWRITE, ASKING), answered from the
//! slot map the server follows in etcd ([`crate::slot_routing`]). A server
//! with no map answers as Redis does with cluster support off.
//!
//! Redis models a node as either a master or a replica; a FabricKV server
//! leads some slots and backs up others. CLUSTER SLOTS and SHARDS describe
//! that exactly (per range); CLUSTER NODES lists every server as a master
//! of the slots it leads.

use std::fmt::Write as _;

use fabrickv_cluster::slots::{key_slot, SLOTS};
use fabrickv_resp::reply::{self as resp, Reply};
use fabrickv_types::KeyHash;

use super::args::Args;
use super::clients::help;
use super::table::{spec, Cmd, Spec, NO_KEYS};
use super::RespShared;
use crate::slot_routing::{OpenedAt, Route, Routing, RoutingCache};

/// What COMMAND reports about the commands in this file (CLUSTER,
/// READONLY, READWRITE, ASKING), with Redis 7's values; `table` gathers
/// every file's into the table.
#[rustfmt::skip]
pub(super) const SPECS: &[Spec] = &[
    spec! { "cluster" Cluster -2 [] (0, 0, 0) ["@slow"] NO_KEYS "cluster" "3.0.0" "Depends on subcommand." "A container for Redis Cluster commands." [] },
    spec! { "readonly" Readonly 1 ["loading", "stale", "fast"] (0, 0, 0) ["@fast", "@connection"] NO_KEYS "cluster" "3.0.0" "O(1)" "Enables read-only queries for a connection to a Redis Cluster replica node." [] },
    spec! { "readwrite" Readwrite 1 ["loading", "stale", "fast"] (0, 0, 0) ["@fast", "@connection"] NO_KEYS "cluster" "3.0.0" "O(1)" "Enables read-write queries for a connection to a Redis Cluster replica node." [] },
    spec! { "asking" Asking 1 ["fast"] (0, 0, 0) ["@fast", "@connection"] NO_KEYS "cluster" "3.0.0" "O(1)" "Signals that a cluster client is following an -ASK redirect." [] },
];

/// Redis's answer to a cluster command on a server outside a cluster.
const CLUSTER_DISABLED: &str = "ERR This instance has cluster support disabled";

/// Redis's answer when a slot's primary is not reachable now.
const SLOT_DOWN: &str = "CLUSTERDOWN Hash slot not served";

/// Redis's answer to keys of different slots in one command.
const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

const CLUSTER_HELP: &[&str] = &[
    "CLUSTER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "INFO",
    "    Return information about the cluster.",
    "KEYSLOT <key>",
    "    Return the hash slot for <key>.",
    "MYID",
    "    Return the node id.",
    "NODES",
    "    Return cluster configuration seen by node.",
    "SHARDS",
    "    Return information about slot range mappings and the nodes they hold.",
    "SLOTS",
    "    Return information about slots range mappings.",
    "HELP",
    "    Print this help.",
];

/// The connection's view of the slot map and its READONLY flag.
pub(super) struct ClusterConn {
    view: RoutingCache,
    /// READONLY: reads of slots this server backs up are served here.
    readonly: bool,
    opened: OpenedAt,
}

/// What [`ClusterConn::gate`] decided for a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// Run it here.
    Run,
    /// Not here: the redirection or error is written.
    Refused,
    /// Close the connection without running it (see `OpenedAt`).
    Close,
}

impl ClusterConn {
    pub(super) fn new(shared: &RespShared) -> ClusterConn {
        ClusterConn {
            view: RoutingCache::default(),
            readonly: false,
            opened: OpenedAt::now(&shared.slot_routing),
        }
    }

    /// The current view, taken again only after it changed.
    #[inline]
    fn routing(&mut self, shared: &RespShared) -> Option<&Routing> {
        self.view.current(&shared.slot_routing)
    }
}

/// A Redis node id (40 hex digits) for server `id` of `cluster`: stable
/// across restarts, so a client's view of the nodes survives one.
fn node_id(cluster: &str, id: u32) -> String {
    let a = KeyHash::of(format!("{cluster}/{id}").as_bytes()).0;
    let b = KeyHash::of(format!("{id}/{cluster}").as_bytes()).0;
    format!("{a:016x}{b:016x}{id:08x}")
}

/// A server's RESP host and port, as a client is sent there; empty and 0
/// while it is not registered.
fn endpoint(r: &Routing, id: u32) -> (String, u16) {
    let Some(addr) = r.server(id).and_then(|d| d.resp.as_deref()) else {
        return (String::new(), 0);
    };
    match addr.rsplit_once(':') {
        Some((host, port)) => (host.to_string(), port.parse().unwrap_or(0)),
        None => (addr.to_string(), 0),
    }
}

impl ClusterConn {
    /// Redirects a keyed command this server does not serve on database
    /// `db`: [`Gate::Run`] when it runs here (no map, no keys, a shard
    /// database, or every key in a slot served here), else the error is
    /// written, or the connection is to be closed when it predates this
    /// server's leadership of the slot. A read on a READONLY connection is
    /// served by any replica of its slot.
    #[inline]
    pub(super) fn gate(
        &mut self,
        db: usize,
        shared: &RespShared,
        spec: &Spec,
        a: Args<'_>,
        out: &mut Reply<'_>,
    ) -> Gate {
        if spec.first_key <= 0 || db != 0 {
            return Gate::Run;
        }
        let replica_read = self.readonly && spec.flags.contains(&"readonly");
        let opened = self.opened;
        let Some(r) = self.routing(shared) else {
            return Gate::Run;
        };
        let argc = a.len();
        let last = if spec.last_key < 0 {
            argc as i64 + i64::from(spec.last_key)
        } else {
            i64::from(spec.last_key)
        };
        let last = usize::try_from(last)
            .unwrap_or(0)
            .min(argc.saturating_sub(1));
        let first = spec.first_key as usize;
        let step = spec.step.max(1) as usize;
        let mut slots = (first..=last)
            .step_by(step)
            .map(|i| key_slot(a.get(i)))
            .peekable();
        let first_slot = slots.peek().copied();
        match r.route(slots, replica_read) {
            // A READONLY read at a backup is not held to the connection's
            // age: a late read harms no one (its client left). Every other
            // command is, reads at the primary included.
            Route::Here if replica_read || first_slot.is_none_or(|s| opened.admits(r, s)) => {
                Gate::Run
            }
            Route::Here => Gate::Close,
            Route::Moved { slot, to: Some(to) } => {
                resp::error(out, &format!("MOVED {slot} {to}"));
                Gate::Refused
            }
            Route::Moved { to: None, .. } => {
                resp::error(out, SLOT_DOWN);
                Gate::Refused
            }
            Route::CrossSlot => {
                resp::error(out, CROSSSLOT);
                Gate::Refused
            }
            // Redis cluster clients send it again after a pause.
            Route::TryAgain { slot } => {
                resp::error(
                    out,
                    &format!("TRYAGAIN slot {slot} is being handed to another server"),
                );
                Gate::Refused
            }
        }
    }

    /// READONLY, READWRITE and ASKING.
    pub(super) fn mode(&mut self, shared: &RespShared, id: Cmd, out: &mut Reply<'_>) {
        if self.routing(shared).is_none() {
            resp::error(out, CLUSTER_DISABLED);
            return;
        }
        match id {
            Cmd::Readonly => self.readonly = true,
            Cmd::Readwrite => self.readonly = false,
            _ => {}
        }
        resp::simple(out, "OK");
    }

    /// CLUSTER INFO | KEYSLOT | MYID | NODES | SHARDS | SLOTS | HELP.
    pub(super) fn command(&mut self, shared: &RespShared, a: Args<'_>, out: &mut Reply<'_>) {
        let sub = a.get(1).to_ascii_lowercase();
        if sub == b"keyslot" {
            if a.len() != 3 {
                resp::error(
                    out,
                    "ERR wrong number of arguments for 'cluster|keyslot' command",
                );
                return;
            }
            resp::integer(out, i64::from(key_slot(a.get(2))));
            return;
        }
        if sub == b"help" {
            help(out, CLUSTER_HELP);
            return;
        }
        let Some(r) = self.routing(shared) else {
            resp::error(out, CLUSTER_DISABLED);
            return;
        };
        match sub.as_slice() {
            b"info" => info(r, out),
            b"myid" => resp::bulk(out, node_id(&r.cluster, r.me).as_bytes()),
            b"slots" => slots(r, out),
            b"shards" => shards(r, out),
            b"nodes" => nodes(r, out),
            _ => resp::error(
                out,
                &format!(
                    "ERR unknown subcommand '{}'. Try CLUSTER HELP.",
                    String::from_utf8_lossy(a.get(1))
                ),
            ),
        }
    }
}

/// CLUSTER INFO: ok while every slot's primary is registered.
fn info(r: &Routing, out: &mut Reply<'_>) {
    let down: u32 = r
        .map
        .groups
        .iter()
        .filter(|g| r.server(g.primary).is_none())
        .flat_map(|g| g.ranges.iter().map(|x| x.count()))
        .sum();
    let mut primaries: Vec<u32> = r.map.groups.iter().map(|g| g.primary).collect();
    primaries.sort_unstable();
    primaries.dedup();
    let mut s = String::new();
    let _ = write!(
        s,
        "cluster_state:{}\r\ncluster_slots_assigned:{SLOTS}\r\ncluster_slots_ok:{}\r\n\
         cluster_slots_pfail:0\r\ncluster_slots_fail:{down}\r\ncluster_known_nodes:{}\r\n\
         cluster_size:{}\r\ncluster_current_epoch:{}\r\ncluster_my_epoch:{}\r\n\
         cluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\n\
         total_cluster_links_buffer_limit_exceeded:0\r\n",
        if down == 0 { "ok" } else { "fail" },
        u32::from(SLOTS) - down,
        r.map.size,
        primaries.len(),
        r.map.epoch,
        r.map.epoch,
    );
    resp::bulk(out, s.as_bytes());
}

/// One node of CLUSTER SLOTS: host, port and id.
fn slot_node(r: &Routing, id: u32, out: &mut Reply<'_>) {
    let (host, port) = endpoint(r, id);
    resp::array_header(out, 3);
    resp::bulk(out, host.as_bytes());
    resp::integer(out, i64::from(port));
    resp::bulk(out, node_id(&r.cluster, id).as_bytes());
}

/// CLUSTER SLOTS: per range, its bounds, its primary, then its backups.
fn slots(r: &Routing, out: &mut Reply<'_>) {
    let ranges: usize = r.map.groups.iter().map(|g| g.ranges.len()).sum();
    resp::array_header(out, ranges);
    for g in &r.map.groups {
        for range in &g.ranges {
            resp::array_header(out, 2 + g.servers().count());
            resp::integer(out, i64::from(range.first));
            resp::integer(out, i64::from(range.last));
            for id in g.servers() {
                slot_node(r, id, out);
            }
        }
    }
}

/// CLUSTER SHARDS: per group, its ranges and its servers with their roles.
fn shards(r: &Routing, out: &mut Reply<'_>) {
    resp::array_header(out, r.map.groups.len());
    for g in &r.map.groups {
        out.map_header(2);
        resp::bulk(out, b"slots");
        resp::array_header(out, 2 * g.ranges.len());
        for range in &g.ranges {
            resp::integer(out, i64::from(range.first));
            resp::integer(out, i64::from(range.last));
        }
        resp::bulk(out, b"nodes");
        resp::array_header(out, g.servers().count());
        for id in g.servers() {
            let (host, port) = endpoint(r, id);
            out.map_header(7);
            resp::bulk(out, b"id");
            resp::bulk(out, node_id(&r.cluster, id).as_bytes());
            resp::bulk(out, b"port");
            resp::integer(out, i64::from(port));
            resp::bulk(out, b"ip");
            resp::bulk(out, host.as_bytes());
            resp::bulk(out, b"endpoint");
            resp::bulk(out, host.as_bytes());
            resp::bulk(out, b"role");
            resp::bulk(
                out,
                if id == g.primary {
                    b"master".as_slice()
                } else {
                    b"replica"
                },
            );
            resp::bulk(out, b"replication-offset");
            resp::integer(out, 0);
            resp::bulk(out, b"health");
            resp::bulk(
                out,
                if port == 0 {
                    b"fail".as_slice()
                } else {
                    b"online"
                },
            );
        }
    }
}

/// CLUSTER NODES: a line per server, as a master of the slots it leads.
fn nodes(r: &Routing, out: &mut Reply<'_>) {
    let mut s = String::new();
    for id in 0..r.map.size {
        let (host, port) = endpoint(r, id);
        let mut flags = String::new();
        if id == r.me {
            flags.push_str("myself,");
        }
        flags.push_str(if port == 0 { "master,fail" } else { "master" });
        let _ = write!(
            s,
            "{} {host}:{port}@0 {flags} - 0 0 {} {}",
            node_id(&r.cluster, id),
            r.map.epoch,
            if port == 0 {
                "disconnected"
            } else {
                "connected"
            }
        );
        for range in r.map.led_by(id) {
            if range.first == range.last {
                let _ = write!(s, " {}", range.first);
            } else {
                let _ = write!(s, " {}-{}", range.first, range.last);
            }
        }
        s.push('\n');
    }
    resp::bulk(out, s.as_bytes());
}
