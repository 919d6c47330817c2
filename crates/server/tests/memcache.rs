//! The memcache front end over a real socket: text and meta commands,
//! pipelining, values arriving in pieces, hostile input, agreement with
//! the native kv (one keyspace), the connection cap, and `memcapable`
//! (libmemcached-tools) when it is installed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use fabrickv_client::{Client, Kv};
use fabrickv_server::{Mode, Server, ServerConfig, ServerHandle};

const TIMEOUT: Duration = Duration::from_secs(10);

fn server(mode: Mode) -> ServerHandle {
    server_with_workers(mode, 2)
}

fn server_with_workers(mode: Mode, workers: usize) -> ServerHandle {
    start(ServerConfig {
        workers: Some(workers),
        mode,
        ..memcache_config()
    })
}

fn memcache_config() -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".into(),
        workers: Some(2),
        memory_bytes: 64 << 20,
        log_level: "warn".into(),
        memcache: Some("127.0.0.1:0".into()),
        ..ServerConfig::default()
    }
}

fn start(cfg: ServerConfig) -> ServerHandle {
    Server::start(&cfg).expect("server starts")
}

/// Two servers following one slot map (installed by hand, as the etcd
/// watch installs it), each forwarding memcache commands for the other's
/// slots; each serves with `workers` loops. With the map's owner of a key.
fn forwarding_pair(workers: usize) -> ([ServerHandle; 2], impl Fn(&str) -> usize) {
    use fabrickv_cluster::slots::{key_slot, SlotMap};
    use fabrickv_cluster::ServerDesc;
    use fabrickv_server::slot_routing::Routing;

    let forwarding = || {
        start(ServerConfig {
            workers: Some(workers),
            memcache_forwarding: true,
            ..memcache_config()
        })
    };
    let hs = [forwarding(), forwarding()];
    let descs: Vec<Option<ServerDesc>> = hs
        .iter()
        .enumerate()
        .map(|(i, h)| {
            Some(ServerDesc {
                id: i as u32,
                addrs: vec![h.addr().to_string()],
                resp: None,
                grpc: None,
                memcache: h.memcache_addr().map(str::to_string),
                memcache_peer: h.memcache_peer_addr().map(str::to_string),
                repl: None,
                workers: workers as u32,
                pid: 0,
            })
        })
        .collect();
    let map = SlotMap::initial(2, 1).expect("map");
    for (i, h) in hs.iter().enumerate() {
        h.slot_routing()
            .install(Routing::new(i as u32, "mc", map.clone(), descs.clone()));
    }
    (hs, |k: &str| usize::from(key_slot(k.as_bytes()) >= 8192))
}

struct Mc {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Mc {
    fn connect(h: &ServerHandle) -> Mc {
        let w = TcpStream::connect(h.memcache_addr().expect("memcache on")).expect("connects");
        w.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        let r = BufReader::new(w.try_clone().expect("clone"));
        Mc { w, r }
    }

    fn send(&mut self, b: &[u8]) {
        self.w.write_all(b).expect("writes");
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("reads");
        assert!(l.ends_with("\r\n"), "line {l:?}");
        l.truncate(l.len() - 2);
        l
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n + 2];
        self.r.read_exact(&mut v).expect("data");
        assert_eq!(&v[n..], b"\r\n");
        v.truncate(n);
        v
    }

    /// Sends `cmd` and reads one line.
    fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd.as_bytes());
        self.line()
    }
}

#[test]
fn text_commands_over_a_socket() {
    for mode in [Mode::Store, Mode::Cache] {
        let h = server(mode);
        let mut c = Mc::connect(&h);
        assert_eq!(c.ask("set a 42 0 5\r\nhello\r\n"), "STORED");
        c.send(b"gets a missing\r\n");
        let head = c.line();
        let parts: Vec<&str> = head.split(' ').collect();
        assert_eq!(&parts[..4], ["VALUE", "a", "42", "5"]);
        let cas: u64 = parts[4].parse().expect("cas");
        assert_eq!(c.bytes(5), b"hello");
        assert_eq!(c.line(), "END");
        assert_eq!(
            c.ask(&format!("cas a 1 0 1 {}\r\nx\r\n", cas + 1000)),
            "EXISTS"
        );
        assert_eq!(c.ask(&format!("cas a 1 0 1 {cas}\r\nx\r\n")), "STORED");
        assert_eq!(
            c.ask("incr a 1\r\n"),
            "CLIENT_ERROR cannot increment or decrement non-numeric value"
        );
        assert_eq!(c.ask("set n 0 0 2\r\n10\r\n"), "STORED");
        assert_eq!(c.ask("incr n 18446744073709551615\r\n"), "9");
        assert_eq!(c.ask("decr n 100\r\n"), "0");
        assert_eq!(c.ask("touch n 100\r\n"), "TOUCHED");
        assert_eq!(c.ask("delete n\r\n"), "DELETED");
        assert_eq!(c.ask("delete n\r\n"), "NOT_FOUND");
        assert_eq!(c.ask("flush_all\r\n"), "OK");
        assert_eq!(c.ask("get a\r\n"), "END");
        assert_eq!(c.ask("nonsense\r\n"), "ERROR");
        assert!(c.ask("version\r\n").starts_with("VERSION "));
        // Pipelined, with noreply in between.
        let mut batch = Vec::new();
        for i in 0..100 {
            batch.extend_from_slice(format!("set k{i} {i} 0 3 noreply\r\nv{i:02}\r\n").as_bytes());
        }
        batch.extend_from_slice(b"get k7 k99\r\n");
        c.send(&batch);
        assert_eq!(c.line(), "VALUE k7 7 3");
        assert_eq!(c.bytes(3), b"v07");
        assert_eq!(c.line(), "VALUE k99 99 3");
        assert_eq!(c.bytes(3), b"v99");
        assert_eq!(c.line(), "END");
        c.send(b"stats\r\n");
        let mut stats = Vec::new();
        loop {
            let l = c.line();
            if l == "END" {
                break;
            }
            stats.push(l);
        }
        assert!(
            stats
                .iter()
                .any(|s| s.starts_with("STAT curr_connections 1")),
            "{stats:?}"
        );
        assert!(stats.iter().any(|s| s == "STAT threads 2"), "{stats:?}");
        c.send(b"quit\r\n");
        let mut rest = Vec::new();
        assert_eq!(c.r.read_to_end(&mut rest).expect("closed"), 0);
        h.shutdown();
    }
}

#[test]
fn meta_commands_over_a_socket() {
    let h = server(Mode::Store);
    let mut c = Mc::connect(&h);
    assert_eq!(
        c.ask("ms m 3 F9 T100 c\r\nabc\r\n").split(' ').next(),
        Some("HD")
    );
    assert_eq!(c.ask("mg m v f s k O77\r\n"), "VA 3 f9 s3 km O77");
    assert_eq!(c.bytes(3), b"abc");
    let t = c.ask("mg m t\r\n");
    let ttl: u64 = t.strip_prefix("HD t").expect("ttl").parse().expect("n");
    assert!((99..=100).contains(&ttl), "{t}");
    c.send(b"mg gone v q\r\nmg gone v k\r\nmn\r\n");
    assert_eq!(c.line(), "EN kgone");
    assert_eq!(c.line(), "MN");
    assert_eq!(c.ask("ma ctr N0 J41 v\r\n"), "VA 2");
    assert_eq!(c.bytes(2), b"41");
    assert_eq!(c.ask("ma ctr v\r\n"), "VA 2");
    assert_eq!(c.bytes(2), b"42");
    assert_eq!(c.ask("md ctr C1\r\n"), "EX");
    assert_eq!(c.ask("md ctr\r\n"), "HD");
    assert_eq!(c.ask("mg m l\r\n"), "CLIENT_ERROR invalid flag");
    h.shutdown();
}

#[test]
fn one_keyspace_with_the_native_kv() {
    let h = server(Mode::Store);
    let mut c = Mc::connect(&h);
    let mut kv = Client::connect(h.addr()).expect("native client");
    assert_eq!(c.ask("set shared 5 0 4\r\nfrom\r\n"), "STORED");
    assert_eq!(kv.get(b"shared").expect("get"), Some(b"from".to_vec()));
    kv.put(b"native", b"value").expect("put");
    assert_eq!(c.ask("get native\r\n"), "VALUE native 0 5");
    assert_eq!(c.bytes(5), b"value");
    assert_eq!(c.line(), "END");
    h.shutdown();
}

#[test]
fn large_values_in_pieces_and_oversized_ones_refused() {
    let h = server(Mode::Store);
    let mut c = Mc::connect(&h);
    let n = 300 << 10;
    let v: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    c.send(format!("set big 0 0 {n}\r\n").as_bytes());
    for piece in v.chunks(7000) {
        c.send(piece);
    }
    c.send(b"\r\n");
    assert_eq!(c.line(), "STORED");
    assert_eq!(c.ask("get big\r\n"), format!("VALUE big 0 {n}"));
    assert_eq!(c.bytes(n), v);
    assert_eq!(c.line(), "END");
    // The largest value the engine takes fits with its CAS and flags.
    let max = fabrickv_memcache::MC_VALUE_BYTES_MAX;
    c.send(format!("set max 1 0 {max}\r\n").as_bytes());
    c.send(&vec![b'm'; max]);
    c.send(b"\r\n");
    assert_eq!(c.line(), "STORED");
    assert_eq!(c.ask("get max\r\n"), format!("VALUE max 1 {max}"));
    assert_eq!(c.bytes(max), vec![b'm'; max]);
    assert_eq!(c.line(), "END");
    let too = fabrickv_memcache::MC_VALUE_BYTES_MAX + 1;
    c.send(format!("set huge 0 0 {too}\r\n").as_bytes());
    assert_eq!(c.line(), "SERVER_ERROR object too large for cache");
    let junk = vec![b'j'; too + 2];
    c.send(&junk);
    assert_eq!(c.ask("get huge\r\n"), "END");
    // A line past the bound closes the connection.
    c.send(&vec![b'x'; fabrickv_memcache::MC_LINE_BYTES_MAX + 10]);
    assert_eq!(c.line(), "CLIENT_ERROR line too long");
    h.shutdown();
}

/// What an outside memcached compatibility run found, over a socket: a
/// length memcached cannot read is a bad line and the next one is read (no hang), a get line of
/// 18,725 keys (187 KB) is answered whole, `noreply` silences an error,
/// and an HTTP request line closes the connection without a reply.
#[test]
fn hostile_lengths_long_get_lines_and_http_as_memcached_answers_them() {
    let h = server(Mode::Store);
    let mut c = Mc::connect(&h);
    assert_eq!(c.ask("set key000001 0 0 1\r\na\r\n"), "STORED");
    c.send(b"set key000001 0 0 4294967295\r\nget key000001\r\n");
    assert_eq!(c.line(), "CLIENT_ERROR bad command line format");
    assert_eq!(c.line(), "VALUE key000001 0 1");
    assert_eq!(c.bytes(1), b"a");
    assert_eq!(c.line(), "END");
    let keys: Vec<String> = (0..18_725).map(|i| format!("key{i:06}")).collect();
    let line = format!("get {}\r\n", keys.join(" "));
    assert!(line.len() > 187_000);
    c.send(line.as_bytes());
    assert_eq!(c.line(), "VALUE key000001 0 1");
    assert_eq!(c.bytes(1), b"a");
    assert_eq!(c.line(), "END");
    assert_eq!(c.ask("delete key000001 10 noreply\r\nmn\r\n"), "MN");
    let mut web = Mc::connect(&h);
    web.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let mut rest = Vec::new();
    web.r.read_to_end(&mut rest).expect("closed, not timed out");
    assert_eq!(rest, b"", "no reply before the close");
    h.shutdown();
}

/// memcapable, libmemcached's protocol checker, in ASCII mode. Debian
/// calls it memccapable. Skipped, saying so, when neither is installed.
#[test]
fn memcapable_ascii_checks_pass() {
    let tool = ["memcapable", "memccapable"]
        .into_iter()
        .find(|t| std::process::Command::new(t).arg("--help").output().is_ok());
    let Some(tool) = tool else {
        eprintln!("SKIPPED: memcapable (libmemcached-tools) is not installed");
        return;
    };
    let h = server(Mode::Store);
    let addr = h.memcache_addr().expect("on").to_string();
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    let out = std::process::Command::new(tool)
        .args(["-a", "-h", host, "-p", port, "-t", "10"])
        .output()
        .expect("runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    let failed: Vec<&str> = text.lines().filter(|l| l.contains("[FAIL]")).collect();
    assert!(failed.is_empty(), "memcapable failures: {failed:?}");
    assert!(text.contains("[pass]"), "memcapable ran no check: {text}");
    h.shutdown();
}

#[test]
fn idle_connections_are_closed_after_the_timeout() {
    let cfg = ServerConfig {
        listen: "127.0.0.1:0".into(),
        workers: Some(1),
        memory_bytes: 64 << 20,
        log_level: "warn".into(),
        memcache: Some("127.0.0.1:0".into()),
        memcache_idle_timeout_secs: 1,
        ..ServerConfig::default()
    };
    let h = Server::start(&cfg).expect("server starts");
    let mut c = Mc::connect(&h);
    assert_eq!(c.ask("mn\r\n"), "MN");
    let t = std::time::Instant::now();
    let mut rest = Vec::new();
    assert_eq!(c.r.read_to_end(&mut rest).expect("closed by the server"), 0);
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    h.shutdown();
}

/// At `MC_CONNECTIONS_MAX` a newcomer is refused until some connection has
/// been silent `MC_EVICT_IDLE_MIN_MS`; then the longest-silent one makes
/// way for it, one closed per newcomer.
#[test]
fn at_the_cap_a_silent_connection_makes_way() {
    use fabrickv_server::{MC_CONNECTIONS_MAX, MC_EVICT_IDLE_MIN_MS};
    use std::time::Instant;
    // One loop thread takes connections in the order they arrive, so no
    // newcomer is counted before a silent connection opened ahead of it
    // (with two, one thread's newcomer can beat the other's last silent
    // connection to the count, and that one is refused at the cap).
    let h = server_with_workers(Mode::Store, 1);
    let addr = h.memcache_addr().expect("on").to_string();
    let connect = || {
        let c = TcpStream::connect(&addr).expect("connects");
        c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        c
    };
    let silent: Vec<TcpStream> = (0..MC_CONNECTIONS_MAX).map(|_| connect()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut newcomers = Vec::new();
    while newcomers.len() < 4 {
        let mut c = connect();
        c.write_all(b"mn\r\n").expect("send");
        let mut reply = [0u8; 4];
        match c.read_exact(&mut reply) {
            Ok(()) if &reply == b"MN\r\n" => newcomers.push(c),
            _ => {
                assert!(
                    Instant::now() < deadline,
                    "newcomers still refused at the cap"
                );
                std::thread::sleep(Duration::from_millis(MC_EVICT_IDLE_MIN_MS / 10));
            }
        }
    }
    for c in &silent {
        c.set_nonblocking(true).expect("nonblocking");
    }
    let is_closed = |mut c: &TcpStream| match c.read(&mut [0u8; 16]) {
        Ok(0) => true,
        Ok(_) => panic!("a silent connection was sent something"),
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut gone = 0;
    while gone < 4 {
        gone = silent.iter().filter(|c| is_closed(c)).count();
        assert!(Instant::now() < deadline, "{gone} of 4 evicted seen closed");
    }
    assert_eq!(gone, 4, "more connections closed than newcomers came");
    drop(silent);
    h.shutdown();
}

/// Two servers following one slot map (installed by hand, as the etcd
/// watch installs it): each one's memcache front end serves every key,
/// forwarding a key of the other's hash slots to it, so a memcached
/// client that hashes keys its own way reads and writes the one keyspace.
#[test]
fn a_key_of_another_servers_slot_is_forwarded_to_it() {
    let (hs, owner) = forwarding_pair(2);
    let keys: Vec<String> = (0..40).map(|i| format!("mk{i}")).collect();
    assert!(keys.iter().any(|k| owner(k) == 0) && keys.iter().any(|k| owner(k) == 1));
    let mut a = Mc::connect(&hs[0]);
    for k in &keys {
        assert_eq!(
            a.ask(&format!("set {k} 7 0 {}\r\n{k}\r\n", k.len())),
            "STORED"
        );
    }
    // Every key sits on its slot's server, which alone serves it natively.
    for (i, h) in hs.iter().enumerate() {
        let mut native = Client::connect(h.addr()).expect("native client");
        for k in &keys {
            match native.get(k.as_bytes()) {
                Ok(v) => assert!(owner(k) == i && v.as_deref() == Some(k.as_bytes()), "{k}"),
                Err(e) => assert!(
                    owner(k) != i && e.code() == fabrickv_types::ErrorCode::WrongServer,
                    "{k} at server {i}: {e}"
                ),
            }
        }
    }
    // One get line over both servers, through the other server.
    let mut b = Mc::connect(&hs[1]);
    let line: Vec<&str> = keys.iter().map(String::as_str).collect();
    b.send(format!("get {} absent\r\n", line.join(" ")).as_bytes());
    for k in &keys {
        assert_eq!(b.line(), format!("VALUE {k} 7 {}", k.len()));
        assert_eq!(b.bytes(k.len()), k.as_bytes());
    }
    assert_eq!(b.line(), "END");
    // The other commands, noreply and quiet meta ones among them.
    let far = keys
        .iter()
        .find(|k| owner(k) == 1)
        .expect("a key of server 1");
    assert_eq!(
        a.ask(&format!("set {far} 0 0 2 noreply\r\nxy\r\nmg {far} v\r\n")),
        "VA 2"
    );
    assert_eq!(a.bytes(2), b"xy");
    assert_eq!(a.ask(&format!("ms {far} 1 q\r\n5\r\nmn\r\n")), "MN");
    assert_eq!(a.ask(&format!("incr {far} 2\r\n")), "7");
    assert_eq!(a.ask(&format!("touch {far} 100\r\n")), "TOUCHED");
    assert_eq!(a.ask(&format!("delete {far}\r\n")), "DELETED");
    assert_eq!(a.ask(&format!("mg {far} v\r\n")), "EN");
    for h in hs {
        h.shutdown();
    }
}

/// Two single-loop servers whose clients both want keys of the other's
/// slots at once: each server's loop waits on the other's answer while
/// the other's forward comes in. Forwarded commands are served by loops
/// that never forward, so neither waits on the other (were they served
/// by the forwarding loops, both would wait out the forwarding timeout
/// and answer `SERVER_ERROR`).
#[test]
fn servers_forwarding_to_each_other_at_once_both_answer() {
    let (hs, owner) = forwarding_pair(1);
    const ROUNDS: usize = 300;
    std::thread::scope(|s| {
        for (i, h) in hs.iter().enumerate() {
            let owner = &owner;
            s.spawn(move || {
                let far: Vec<String> = (0..)
                    .map(|n| format!("x{i}-{n}"))
                    .filter(|k| owner(k) != i)
                    .take(8)
                    .collect();
                let mut c = Mc::connect(h);
                for r in 0..ROUNDS {
                    let k = &far[r % far.len()];
                    let v = format!("{r:06}");
                    assert_eq!(c.ask(&format!("set {k} 0 0 6\r\n{v}\r\n")), "STORED", "{k}");
                    assert_eq!(c.ask(&format!("get {k}\r\n")), format!("VALUE {k} 0 6"));
                    assert_eq!(c.bytes(6), v.as_bytes());
                    assert_eq!(c.line(), "END");
                }
            });
        }
    });
    for h in hs {
        h.shutdown();
    }
}

/// A write reaching a new primary on a client connection opened before
/// it took the key's slot over may have been sent before a failover and
/// held up in the network: the connection is closed and nothing runs,
/// while a connection opened since is served.
#[test]
fn a_connection_older_than_a_takeover_is_closed_before_it_writes() {
    use fabrickv_cluster::slots::SlotMap;
    use fabrickv_server::slot_routing::Routing;

    let (hs, owner) = forwarding_pair(1);
    let taken = (0..)
        .map(|i| format!("t{i}"))
        .find(|k| owner(k) == 1)
        .expect("a key of server 1");
    let mut old = Mc::connect(&hs[0]);
    assert_eq!(old.ask("version\r\n").split(' ').next(), Some("VERSION"));
    // Server 0 leads server 1's slots from epoch 2 on.
    let before = hs[0].slot_routing().routing().expect("a map");
    let mut map: SlotMap = before.map.clone();
    map.epoch = 2;
    map.groups[1].primary = 0;
    map.groups[1].since = 2;
    let descs: Vec<_> = (0..2).map(|i| before.server(i).cloned()).collect();
    for (i, h) in hs.iter().enumerate() {
        h.slot_routing()
            .install(Routing::new(i as u32, "mc", map.clone(), descs.clone()));
    }
    old.send(format!("set {taken} 0 0 4\r\nlate\r\n").as_bytes());
    let mut rest = String::new();
    let n = old.r.read_line(&mut rest).unwrap_or(0);
    assert_eq!((n, rest.as_str()), (0, ""), "closed without an answer");
    let mut new = Mc::connect(&hs[0]);
    assert_eq!(
        new.ask(&format!("get {taken}\r\n")),
        "END",
        "the late write did not run"
    );
    assert_eq!(new.ask(&format!("set {taken} 0 0 2\r\nok\r\n")), "STORED");
    for h in hs {
        h.shutdown();
    }
}
