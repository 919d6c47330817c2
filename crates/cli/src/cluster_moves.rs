//! `fabrickv cluster add | remove | rebalance`: slots moved between the
//! servers of an etcd cluster while they serve (`fabrickv_cluster::moves`
//! has how). Each command commits its moves as one compare-and-swap of the
//! slot map, then follows the map until the servers have carried them
//! out: the sources stream the slots, promote their new owners and hand
//! the groups over themselves.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use fabrickv_cluster::etcd::{ClusterView, EtcdRegistry};
use fabrickv_cluster::moves::{fmt_ranges, Move};
use fabrickv_cluster::slots::SlotMap;

/// Most time between two reads of the map while a move is followed, in
/// milliseconds.
const MOVE_POLL_MS: u64 = 50;

/// Attempts at committing a plan when other changes of the map (a
/// failover, a promotion) win the compare-and-swap first.
const MOVE_COMMIT_TRIES: usize = 20;

/// The etcd cluster a move command changes.
#[derive(Args, Clone)]
pub struct MoveTarget {
    /// The etcd registry (etcd://HOST:PORT[,HOST:PORT...]).
    #[arg(long, env = "FABRICKV_REGISTRY", value_name = "URL")]
    pub registry: String,
    /// The cluster's name.
    #[arg(long, env = "FABRICKV_CLUSTER", default_value = "default")]
    pub cluster: String,
    /// Longest wait for the moves to be carried out, in seconds; 0
    /// commits them and returns at once (`cluster show` follows them).
    #[arg(long, value_name = "SECS", default_value_t = 600.0)]
    pub wait: f64,
}

/// Which server `cluster add` gives slots to.
#[derive(Args, Clone)]
#[group(required = true, multiple = false)]
pub struct Which {
    /// The server's id (it was started with `serve --id ID`).
    #[arg(long)]
    pub id: Option<u32>,
    /// The server by an address it registered (native or RESP, with or
    /// without its scheme).
    #[arg(long, value_name = "ADDR")]
    pub server: Option<String>,
}

fn connect(t: &MoveTarget) -> Result<EtcdRegistry, String> {
    let secret = fabrickv_auth::client_secret().map_err(|e| e.to_string())?;
    Ok(EtcdRegistry::connect(&t.registry, &t.cluster)
        .map_err(|e| e.to_string())?
        .with_secret(secret))
}

fn map_of(view: &ClusterView) -> Result<(SlotMap, i64), String> {
    view.map
        .clone()
        .ok_or_else(|| "no slot map yet: no server of the cluster has started".into())
}

/// The id of the registered server one of whose addresses is `addr`.
fn id_of(view: &ClusterView, addr: &str) -> Result<u32, String> {
    let bare = |a: &str| a.split("://").last().unwrap_or(a).to_string();
    let want = bare(addr);
    view.servers
        .iter()
        .flatten()
        .find(|d| d.addrs.iter().chain(d.resp.iter()).any(|a| bare(a) == want))
        .map(|d| d.id)
        .ok_or_else(|| format!("no server registered in the cluster has the address {addr}"))
}

/// `fabrickv cluster add`: gives server `which` an even share of the
/// slots.
pub fn add(t: &MoveTarget, which: &Which) -> Result<ExitCode, String> {
    let registry = connect(t)?;
    let view = registry.view().map_err(|e| e.to_string())?;
    let id = match (&which.id, &which.server) {
        (Some(id), _) => *id,
        (None, Some(addr)) => id_of(&view, addr)?,
        (None, None) => return Err("name the server with --id or --server".into()),
    };
    if view.server(id).is_none() {
        return Err(format!(
            "server {id} is not registered: start it first (serve --registry ... --id {id})"
        ));
    }
    commit_and_follow(&registry, t, &format!("add server {id}"), |m| {
        Ok(m.plan_add(id))
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `fabrickv cluster remove`: moves every slot server `id` leads to the
/// others, then replaces its backup copies; it holds nothing after.
pub fn remove(t: &MoveTarget, id: u32) -> Result<ExitCode, String> {
    let registry = connect(t)?;
    let (map, _) = map_of(&registry.view().map_err(|e| e.to_string())?)?;
    if !map.members().contains(&id) {
        return Err(format!("server {id} holds no slots"));
    }
    if map.members().len() <= usize::from(map.replicas) {
        return Err(format!(
            "the cluster keeps {} copies of each slot on {} servers; removing one would leave too few",
            map.replicas,
            map.members().len()
        ));
    }
    commit_and_follow(&registry, t, &format!("remove server {id}"), |m| {
        Ok(m.plan_remove(id))
    })?;
    // Then its copies as a backup, each replaced by a joiner elsewhere.
    let committed = commit(&registry, |m| Ok(m.without_copies_on(id)))?;
    if let Some(map) = committed {
        println!(
            "epoch {}: server {id}'s backup copies handed to other servers",
            map.epoch
        );
        follow(&registry, t, &|m: &SlotMap| {
            m.groups.iter().all(|g| g.joining.is_empty())
        })?;
    }
    println!("server {id} holds no slots now; it can be stopped");
    Ok(ExitCode::SUCCESS)
}

/// `fabrickv cluster rebalance`: evens out the slots each server leads.
pub fn rebalance(t: &MoveTarget) -> Result<ExitCode, String> {
    let registry = connect(t)?;
    commit_and_follow(&registry, t, "rebalance", |m| Ok(m.plan_rebalance()))?;
    Ok(ExitCode::SUCCESS)
}

/// Plans against the map in force and commits the moves (re-planning
/// when another change wins the swap), prints them, then follows the map
/// until no group is moving.
fn commit_and_follow(
    registry: &EtcdRegistry,
    t: &MoveTarget,
    what: &str,
    plan: impl Fn(&SlotMap) -> Result<Vec<Move>, String>,
) -> Result<(), String> {
    let mut planned = Vec::new();
    let committed = commit(registry, |m| {
        if m.moving() {
            return Err("a move is under way; wait for it to end (cluster show)".into());
        }
        planned = plan(m)?;
        if planned.is_empty() {
            return Ok(None);
        }
        m.with_moves(&planned).map(Some)
    })?;
    let Some(map) = committed else {
        println!("{what}: nothing to move");
        return Ok(());
    };
    let slots: u32 = planned.iter().map(Move::count).sum();
    println!(
        "{what}: epoch {}, {slots} slots to move ({:.1}% of all)",
        map.epoch,
        f64::from(slots) * 100.0 / f64::from(fabrickv_cluster::slots::SLOTS)
    );
    for m in &planned {
        println!(
            "  slots {} ({}) to server {}",
            fmt_ranges(&m.slots),
            m.count(),
            m.to
        );
    }
    let started = Instant::now();
    follow(registry, t, &|m: &SlotMap| !m.moving())?;
    if t.wait > 0.0 {
        println!("{what}: done in {:.2} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// Commits what `change` makes of the map in force, by compare-and-swap,
/// trying again against a newer map when another change won; `None` when
/// `change` had nothing to do.
fn commit(
    registry: &EtcdRegistry,
    mut change: impl FnMut(&SlotMap) -> Result<Option<SlotMap>, String>,
) -> Result<Option<SlotMap>, String> {
    for _ in 0..MOVE_COMMIT_TRIES {
        let (map, rev) = map_of(&registry.view().map_err(|e| e.to_string())?)?;
        let Some(next) = change(&map)? else {
            return Ok(None);
        };
        if registry.swap_map(rev, &next).map_err(|e| e.to_string())? {
            return Ok(Some(next));
        }
        std::thread::sleep(Duration::from_millis(MOVE_POLL_MS));
    }
    Err(format!(
        "the map kept changing under {MOVE_COMMIT_TRIES} attempts; try again"
    ))
}

/// Reads the map until `done` holds, up to `--wait`.
fn follow(
    registry: &EtcdRegistry,
    t: &MoveTarget,
    done: &dyn Fn(&SlotMap) -> bool,
) -> Result<(), String> {
    if t.wait <= 0.0 {
        return Ok(());
    }
    let deadline =
        Instant::now() + Duration::try_from_secs_f64(t.wait).map_err(|e| e.to_string())?;
    loop {
        let (map, _) = map_of(&registry.view().map_err(|e| e.to_string())?)?;
        if done(&map) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "not done after {} s; the servers go on (cluster show follows them):\n{map}",
                t.wait
            ));
        }
        std::thread::sleep(Duration::from_millis(MOVE_POLL_MS));
    }
}
