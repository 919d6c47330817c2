//! A cluster of hosts: three `fabrickv serve` processes, a memcached
//! registry and the clients, each in a network namespace of its own with
//! its own address, joined by a private switch (see `common::netns`).
//!
//! Runs over the transports that cross hosts: tcp, and libfabric's
//! `tcp;ofi_rxm` provider when the binary is built with it (inproc and shm
//! are same-host transports; the single-host cluster tests in
//! crates/server/tests/cluster.rs cover them). Where namespaces cannot be
//! created (no root, no `ip`), each test says so and skips.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::netns::Net;
use common::BIN;

/// Hosts of a test: 0..3 run servers (host 0 the registry too), 3 the
/// clients.
const SERVERS: usize = 3;
const CLIENT: usize = 3;
const PORT: u16 = 7379;
const MEMCACHED_PORT: u16 = 11211;
const CLUSTER: &str = "nt";
/// Seconds a dead server's registration lingers (kept short for the test).
const TTL_S: &str = "2";
/// How long any one step may take before the test counts it as hung.
const STEP: Duration = Duration::from_secs(20);
/// The cluster secret: servers listen beyond loopback (on the namespaces'
/// addresses), so they need one, and every client proves it.
const SECRET: &str = "the secret of the netns cluster";

/// `program` on host `i`, holding the cluster secret.
fn on(net: &Net, i: usize, program: &str) -> Command {
    let mut c = net.command(i, program);
    c.env("FABRICKV_AUTH_TOKEN", SECRET);
    c
}

/// Runs `program ARGS` on host `i`, holding the cluster secret.
fn run_on(net: &Net, i: usize, program: &str, args: &[&str]) -> Output {
    on(net, i, program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run a command in a namespace")
}

fn net_or_skip(hosts: usize) -> Option<Net> {
    match Net::new(hosts) {
        Ok(n) => Some(n),
        Err(e) => {
            println!("skipping: cannot create network namespaces here ({e})");
            None
        }
    }
}

fn registry(net: &Net) -> String {
    format!("memcached://{}:{MEMCACHED_PORT}", net.addr(0))
}

/// The native address of server `i` over `transport`.
fn server_addr(net: &Net, i: usize, transport: &str) -> String {
    match transport {
        "fabric" => format!("fabric://tcp;ofi_rxm/{}:{PORT}", net.addr(i)),
        _ => format!("tcp://{}:{PORT}", net.addr(i)),
    }
}

/// Starts memcached on host 0 and waits until it accepts connections.
fn start_memcached(net: &mut Net) {
    let child = net
        .command(0, "memcached")
        .args(["-u", "root", "-U", "0", "-m", "16"])
        .args(["-l", &net.addr(0), "-p", &MEMCACHED_PORT.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start memcached (make deps installs it)");
    net.keep(child);
    let probe = format!("echo > /dev/tcp/{}/{MEMCACHED_PORT}", net.addr(0));
    let deadline = Instant::now() + STEP;
    while !net.run(CLIENT, "bash", &["-c", &probe]).status.success() {
        assert!(Instant::now() < deadline, "memcached did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts server `i` on host `i`, registered in the cluster, and waits for
/// its banner (printed once it listens and is registered). Returns the
/// index of its child in `net`.
fn start_server(net: &mut Net, i: usize, transport: &str) -> usize {
    let mut child = on(net, i, BIN)
        .args(["serve", "--listen", &server_addr(net, i, transport)])
        .args(["--workers", "1", "--memory", "64MB", "--grpc", "off"])
        .args(["--cache-memory", "64MB", "--dram-pool-gb", "0.0625"])
        .args([
            "--dram-skip-mlock",
            "--dram-skip-memset",
            "--dram-skip-populate",
        ])
        .args(["--log-level", "warn", "--registry", &registry(net)])
        .args(["--cluster", CLUSTER, "--id", &i.to_string()])
        .args([
            "--cluster-size",
            &SERVERS.to_string(),
            "--registry-ttl",
            TTL_S,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a server");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("server {i} exited before serving"))
            .expect("read stderr");
        if line.contains("serving on") {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    net.keep(child)
}

/// Runs `fabrickv ARGS` on the client host against the registry.
fn client(net: &Net, args: &[&str]) -> Output {
    let reg = registry(net);
    let mut all: Vec<&str> = args.to_vec();
    all.extend_from_slice(&["--registry", &reg, "--cluster", CLUSTER]);
    run_on(net, CLIENT, BIN, &all)
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("key:{i}")).collect()
}

fn value_of(k: &str) -> String {
    format!("value of {k}")
}

/// The item count of server `i`, asked directly (not through the cluster).
fn items_on(net: &Net, i: usize, transport: &str) -> u64 {
    let out = run_on(
        net,
        CLIENT,
        BIN,
        &["stats", "--server", &server_addr(net, i, transport)],
    );
    ok(&out, "stats")
        .lines()
        .find_map(|l| l.strip_prefix("items: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("an items counter")
}

fn cluster_across_hosts(transport: &str) {
    if transport == "fabric" && !cfg!(feature = "fabric") {
        println!("skipping: this build has no libfabric transport");
        return;
    }
    let Some(mut net) = net_or_skip(SERVERS + 1) else {
        return;
    };
    start_memcached(&mut net);
    let servers: Vec<usize> = (0..SERVERS)
        .map(|i| start_server(&mut net, i, transport))
        .collect();

    // The client host finds all three servers by cluster name.
    let shown = ok(
        &client(&net, &["cluster", "show", "--wait", "10"]),
        "cluster show",
    );
    for i in 0..SERVERS {
        assert!(
            shown.contains(&server_addr(&net, i, transport)),
            "server {i} missing from:\n{shown}"
        );
    }
    // From another host, a client without the secret is refused.
    let addr = server_addr(&net, 0, transport);
    let out = net.run(CLIENT, BIN, &["get", "k", "--server", &addr]);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("AUTH_REQUIRED"), "{e}");

    // Writes and reads across the cluster, in request order.
    let ks = keys(60);
    let mut mset = vec!["mset".to_string()];
    for k in &ks {
        mset.push(k.clone());
        mset.push(value_of(k));
    }
    let args: Vec<&str> = mset.iter().map(String::as_str).collect();
    ok(&client(&net, &args), "mset");
    let mut mget = vec!["mget"];
    mget.extend(ks.iter().map(String::as_str));
    let got = ok(&client(&net, &mget), "mget");
    let want: Vec<String> = ks.iter().map(|k| value_of(k)).collect();
    assert_eq!(
        got.lines().collect::<Vec<_>>(),
        want,
        "values in request order"
    );

    // Every server holds its share, and exactly the keys the hash gives it.
    for i in 0..SERVERS {
        let expect = ks
            .iter()
            .filter(|k| fabrickv_cluster::server_of_key(k.as_bytes(), SERVERS as u32) == i as u32)
            .count() as u64;
        assert!(expect > 0, "60 keys leave no server empty");
        assert_eq!(items_on(&net, i, transport), expect, "items on server {i}");
    }

    // The same cluster from a static file.
    let file = std::env::temp_dir().join(format!(
        "fabrickv-netns-{}-{transport}.toml",
        std::process::id()
    ));
    let toml = ok(
        &client(&net, &["cluster", "show", "--toml"]),
        "cluster show --toml",
    );
    std::fs::write(&file, toml).expect("write cluster file");
    let mut args = vec![
        "mget",
        "--cluster-config",
        file.to_str().expect("utf-8 path"),
    ];
    args.extend(ks.iter().map(String::as_str));
    let got = ok(
        &run_on(&net, CLIENT, BIN, &args),
        "mget from the static file",
    );
    assert_eq!(got.lines().count(), ks.len());
    let _ = std::fs::remove_file(&file);

    // Processes on three hosts meet at a barrier.
    let reg = registry(&net);
    let waiters: Vec<_> = (0..SERVERS)
        .map(|i| {
            on(&net, i, BIN)
                .args(["barrier", "go", "--count", "3", "--timeout", "20"])
                .args(["--registry", &reg, "--cluster", CLUSTER])
                .stdout(Stdio::piped())
                .spawn()
                .expect("barrier")
        })
        .collect();
    let mut order: Vec<u64> = waiters
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("barrier exits");
            ok(&out, "barrier").trim().parse().expect("arrival order")
        })
        .collect();
    order.sort_unstable();
    assert_eq!(order, vec![1, 2, 3]);

    // Embedding tables and the KV cache across the hosts, from a client
    // process on the client host running this test binary's `ps_and_cache`.
    let me = std::env::current_exe().expect("test binary");
    let out = on(&net, CLIENT, me.to_str().expect("utf-8 path"))
        .args([
            "--exact",
            "ps_and_cache_on_a_client_host",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_REGISTRY, registry(&net))
        .output()
        .expect("run the client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(CHILD_DONE),
        "ps and cache across hosts failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Server 2 dies without a word.
    net.kill(servers[2]);
    let (on2, live): (Vec<&String>, Vec<&String>) = ks
        .iter()
        .partition(|k| fabrickv_cluster::server_of_key(k.as_bytes(), SERVERS as u32) == 2);
    // A request for its keys fails within the timeout, naming it.
    let start = Instant::now();
    let mut args = vec!["mget", "--timeout", "1"];
    args.extend(on2.iter().map(|k| k.as_str()));
    let out = client(&net, &args);
    let took = start.elapsed();
    assert_eq!(out.status.code(), Some(2), "a dead server is an error");
    let err = String::from_utf8_lossy(&out.stderr);
    // By address while its registration lasts; once that has expired
    // (REGISTRATION_TTL_S after its last refresh, which a busy machine
    // can reach before this client looks), as not registered.
    assert!(
        err.contains("server 2") && (err.contains(&net.addr(2)) || err.contains("not registered")),
        "the error names the server: {err}"
    );
    assert!(took < Duration::from_secs(4), "error after {took:?}");
    // The others keep serving.
    let mut args = vec!["mget", "--timeout", "1"];
    args.extend(live.iter().map(|k| k.as_str()));
    let got = ok(&client(&net, &args), "mget of live servers' keys");
    let want: Vec<String> = live.iter().map(|k| value_of(k)).collect();
    assert_eq!(got.lines().collect::<Vec<_>>(), want);

    // Its registration expires.
    let deadline = Instant::now() + STEP;
    loop {
        let out = client(&net, &["cluster", "show"]);
        if out.status.code() == Some(1)
            && String::from_utf8_lossy(&out.stdout).contains("(not registered)")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "registration of a dead server stayed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // A replacement registers and clients use it again.
    start_server(&mut net, 2, transport);
    let k = on2[0].as_str();
    ok(
        &client(&net, &["put", k, "again"]),
        "put on the new server 2",
    );
    assert_eq!(ok(&client(&net, &["get", k]), "get"), "again");
}

/// Names the registry for [`ps_and_cache_on_a_client_host`].
const CHILD_REGISTRY: &str = "FABRICKV_NETNS_REGISTRY";
/// What that child prints when every check passed.
const CHILD_DONE: &str = "ps and cache across the cluster: ok";

/// The client side of the ps and cache checks, run by
/// `cluster_across_hosts` as a process on the client host (a namespace is
/// entered with `ip netns exec`, so the checks run in a child process).
#[test]
#[ignore = "run inside a namespace by cluster_across_hosts_*"]
fn ps_and_cache_on_a_client_host() {
    use fabrickv_client::{ClusterCache, ClusterOptions, ClusterPs, TableSpec};
    let reg = std::env::var(CHILD_REGISTRY).expect("run by cluster_across_hosts");
    // The servers may be behind libfabric addresses, as the binary reaches.
    #[cfg(feature = "fabric")]
    fabrickv_transport_fabric::install();
    let opts = ClusterOptions {
        transport: None,
        timeout: Duration::from_secs(5),
        ..Default::default()
    };
    let mut ps = ClusterPs::join(&reg, CLUSTER, opts.clone()).expect("join for tables");
    let dim = 8usize;
    let t = ps
        .create_table(&TableSpec {
            lr: 0.5,
            ..TableSpec::new("emb", dim as u32)
        })
        .expect("create a table on every server");
    let keys: Vec<u64> = (1..=300).collect();
    let vals: Vec<f32> = (0..keys.len() * dim).map(|i| i as f32 * 0.25).collect();
    ps.put(&t, &keys, &vals).expect("put rows");
    let info = ps.tables().expect("tables");
    let per = &info
        .iter()
        .find(|i| i.spec.name == "emb")
        .expect("listed")
        .items_per_server;
    assert!(
        per.iter().all(|n| n.is_some_and(|n| n > 0)),
        "rows on every server: {per:?}"
    );
    // Pulled in reverse order, straight into this buffer.
    let ask: Vec<u64> = keys.iter().rev().copied().collect();
    let mut out = vec![f32::NAN; ask.len() * dim];
    ps.pull_into(&t, &ask, &mut out, None).expect("pull");
    for (i, k) in ask.iter().enumerate() {
        let j = (*k - 1) as usize;
        assert_eq!(
            &out[i * dim..(i + 1) * dim],
            &vals[j * dim..(j + 1) * dim],
            "key {k}"
        );
    }
    // SGD on the server that holds each row: v -= lr * g.
    ps.push(&t, &keys, &vec![1.0; keys.len() * dim])
        .expect("push");
    ps.pull_into(&t, &keys, &mut out, None)
        .expect("pull after push");
    for (i, (got, was)) in out.iter().zip(&vals).enumerate() {
        assert!(
            (got - (was - 0.5)).abs() < 1e-6,
            "element {i}: {got} after {was}"
        );
    }

    let mut cache = ClusterCache::join(&reg, CLUSTER, opts, 4 << 20).expect("join for the cache");
    let values: Vec<Vec<u8>> = (0..24u8)
        .map(|i| vec![i; 40_000 + usize::from(i)])
        .collect();
    for (i, v) in values.iter().enumerate() {
        cache
            .put(format!("blob:{i}").as_bytes(), v, None)
            .expect("cache put");
    }
    let mut buf = vec![0u8; 64 << 10];
    for (i, v) in values.iter().enumerate() {
        let n = cache
            .get_into(format!("blob:{i}").as_bytes(), &mut buf)
            .expect("cache get")
            .expect("present");
        assert_eq!(&buf[..n], v.as_slice(), "blob {i}");
    }
    println!("{CHILD_DONE}");
}

#[test]
fn cluster_across_hosts_tcp() {
    cluster_across_hosts("tcp");
}

#[test]
fn cluster_across_hosts_fabric() {
    cluster_across_hosts("fabric");
}

/// The namespaces of a test are gone after it, even when it fails.
#[test]
fn namespaces_are_removed_after_use() {
    let Some(net) = net_or_skip(2) else {
        return;
    };
    let name = net.host(1);
    // Hosts reach each other and nothing else.
    let out = net.run(1, "bash", &["-c", "ip -4 -o addr show dev eth0"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&net.addr(1)));
    drop(net);
    let list = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    assert!(
        !String::from_utf8_lossy(&list.stdout).contains(&name),
        "namespace {name} left behind"
    );
}
