//! The memcached registry against a real memcached on loopback.

use std::time::{Duration, Instant};

use fabrickv_cluster::local::LocalMemcached;
use fabrickv_cluster::{Registration, Registry, ServerDesc};

fn desc(id: u32) -> ServerDesc {
    ServerDesc {
        id,
        addrs: vec![format!("tcp://127.0.0.1:{}", 7000 + id)],
        resp: None,
        grpc: None,
        memcache: None,
        memcache_peer: None,
        repl: None,
        workers: 2,
        pid: std::process::id(),
    }
}

#[test]
fn servers_register_and_clients_read_them() {
    let mc = LocalMemcached::start().expect("memcached");
    let reg = Registry::connect(&mc.url(), "c1").expect("registry");
    assert!(
        reg.read().expect("read").is_none(),
        "nothing registered yet"
    );
    let a = Registration::start(
        Registry::connect(&mc.url(), "c1").expect("r"),
        3,
        desc(0),
        10,
    )
    .expect("register 0");
    let b = Registration::start(
        Registry::connect(&mc.url(), "c1").expect("r"),
        3,
        desc(2),
        10,
    )
    .expect("register 2");
    let c = reg.lookup(Duration::ZERO, false).expect("lookup");
    assert_eq!(c.size(), 3);
    assert_eq!(c.servers[0].as_ref(), Some(&desc(0)));
    assert_eq!(c.servers[2].as_ref(), Some(&desc(2)));
    assert_eq!(c.missing(), vec![1]);

    // A server that disagrees on the size is refused.
    let e = Registry::connect(&mc.url(), "c1")
        .expect("r")
        .publish(4, &desc(1), 10)
        .expect_err("size 4 in a 3-server cluster");
    assert!(e.to_string().contains("registered with 3 servers"), "{e}");

    // Another cluster on the same memcached is separate.
    let other = Registry::connect(&mc.url(), "c2").expect("registry");
    assert!(other.read().expect("read").is_none());

    // Waiting for all servers returns once the last one registers.
    let late = std::thread::spawn({
        let url = mc.url();
        move || {
            std::thread::sleep(Duration::from_millis(50));
            Registration::start(Registry::connect(&url, "c1").expect("r"), 3, desc(1), 10)
                .expect("register 1")
        }
    });
    let full = reg.lookup(Duration::from_secs(10), true).expect("lookup");
    assert!(full.missing().is_empty(), "{full}");
    let c_reg = late.join().expect("thread");

    // An orderly exit removes the registration at once.
    drop(b);
    let c = reg.read().expect("read").expect("cluster");
    assert_eq!(c.missing(), vec![2]);
    drop((a, c_reg));
}

#[test]
fn a_registration_that_is_not_refreshed_expires() {
    let mc = LocalMemcached::start().expect("memcached");
    let reg = Registry::connect(&mc.url(), "gone").expect("registry");
    // Published once and never refreshed: a crashed server. 2 s, not 1:
    // memcached's once-a-second clock may lapse a 1 s TTL before the read
    // below on a loaded machine.
    reg.publish(1, &desc(0), 2).expect("publish");
    assert!(reg.read().expect("read").is_some());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = reg.read().expect("read");
        if c.as_ref().is_none_or(|c| !c.missing().is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "registration did not expire");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_refreshed_registration_outlives_its_ttl() {
    let mc = LocalMemcached::start().expect("memcached");
    // memcached counts expiry in whole seconds on a clock that ticks once a
    // second, so a 1 s TTL may lapse almost at once; 3 s leaves the refresh
    // thread (every 1 s) two seconds of slack on a loaded machine.
    let ttl_s = 3;
    let _r = Registration::start(
        Registry::connect(&mc.url(), "live").expect("r"),
        1,
        desc(0),
        ttl_s,
    )
    .expect("register");
    let reg = Registry::connect(&mc.url(), "live").expect("registry");
    // Well past two TTLs: only the refresh thread can have kept it.
    let until = Instant::now() + Duration::from_secs(u64::from(ttl_s) * 8 / 3);
    while Instant::now() < until {
        let c = reg.read().expect("read").expect("registered");
        assert!(
            c.missing().is_empty(),
            "registration lapsed while the server lived"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn barrier_releases_all_when_the_last_arrives() {
    let mc = LocalMemcached::start().expect("memcached");
    let n = 4u64;
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let url = mc.url();
            std::thread::spawn(move || {
                let r = Registry::connect(&url, "b").expect("registry");
                let me = r
                    .barrier("start", n, Duration::from_secs(20))
                    .expect("barrier");
                (me, Instant::now())
            })
        })
        .collect();
    let mut order: Vec<u64> = Vec::new();
    for t in threads {
        order.push(t.join().expect("thread").0);
    }
    order.sort_unstable();
    assert_eq!(
        order,
        (1..=n).collect::<Vec<_>>(),
        "each arrival counted once"
    );

    // A barrier nobody else reaches times out with the count in the error.
    let r = Registry::connect(&mc.url(), "b").expect("registry");
    let e = r
        .barrier("lonely", 2, Duration::from_millis(200))
        .expect_err("only one of two arrives");
    assert!(e.to_string().contains("1 of 2 arrived"), "{e}");
    assert!(r.barrier("bad name", 1, Duration::ZERO).is_err());
}

#[test]
fn an_unreachable_registry_is_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    // Nothing listens there now.
    let url = format!("memcached://127.0.0.1:{port}");
    let e = Registry::connect(&url, "x")
        .and_then(|r| r.read().map(|_| ()))
        .expect_err("nothing listens");
    assert!(e.to_string().contains(&url), "{e}");
    assert!(Registry::connect("redis://h:1", "x").is_err());
}

/// Writes `value` under `key` of memcached at `url`, as anyone who can
/// reach memcached could.
fn raw_set(url: &str, key: &str, value: &[u8]) {
    let hostport = url.strip_prefix("memcached://").expect("memcached url");
    let mc = memcache::Client::connect(format!("memcache://{hostport}?protocol=ascii"))
        .expect("raw memcached client");
    mc.set(key, value, 60).expect("raw set");
}

fn secret(text: &str) -> fabrickv_auth::Secret {
    fabrickv_auth::Secret::from_bytes(text.as_bytes(), "test").expect("secret")
}

/// Junk under one server's key (not JSON, not even text) used to fail the
/// whole cluster read, hiding the live servers beside it: now that slot
/// reads as missing and the others are found.
#[test]
fn a_junk_entry_does_not_hide_the_other_servers() {
    let mc = LocalMemcached::start().expect("memcached");
    let reg = Registry::connect(&mc.url(), "junk")
        .expect("registry")
        .with_secret(None);
    reg.publish(3, &desc(0), 60).expect("publish 0");
    reg.publish(3, &desc(2), 60).expect("publish 2");
    raw_set(&mc.url(), "fabrickv/junk/server/1", b"\xff\xfe not json");
    let c = reg.lookup(Duration::ZERO, false).expect("lookup succeeds");
    assert_eq!(c.servers[0].as_ref(), Some(&desc(0)));
    assert_eq!(c.servers[2].as_ref(), Some(&desc(2)));
    assert_eq!(c.missing(), vec![1]);
    raw_set(&mc.url(), "fabrickv/junk/server/1", b"{\"id\": 7}");
    let c = reg.lookup(Duration::ZERO, false).expect("lookup succeeds");
    assert_eq!(c.missing(), vec![1]);
    // A junk size reads as none published, and the next publish fixes it.
    raw_set(&mc.url(), "fabrickv/junk/size", b"lots");
    assert!(reg.read().expect("read").is_none());
    reg.publish(3, &desc(0), 60).expect("publish over junk");
    assert_eq!(reg.size().expect("size"), Some(3));
}

/// With a cluster secret, entries carry a MAC: a reader with the secret
/// ignores a forged entry (valid JSON without a MAC, or with one made
/// under another secret, or copied from another key) and reads the rest.
#[test]
fn forged_entries_are_ignored_by_a_reader_with_the_secret() {
    let mc = LocalMemcached::start().expect("memcached");
    let good = secret("registry-test-secret-0123");
    let reg = Registry::connect(&mc.url(), "mac")
        .expect("registry")
        .with_secret(Some(good.clone()));
    reg.publish(3, &desc(0), 60).expect("publish 0");
    // A forgery with no MAC, pointing server 1 at an attacker's address.
    let mut forged = desc(1);
    forged.addrs = vec!["tcp://127.0.0.1:6666".into()];
    let json = serde_json::to_string(&forged).expect("json");
    raw_set(&mc.url(), "fabrickv/mac/server/1", json.as_bytes());
    // Another with a MAC made under another secret.
    Registry::connect(&mc.url(), "mac")
        .expect("registry")
        .with_secret(Some(secret("another-secret-0123456")))
        .publish(3, &desc(2), 60)
        .expect("publish 2 with the wrong secret");
    // That rewrote the size too, which the reader now ignores (as if no
    // size were published) until a server of its own refreshes it.
    assert!(reg.read().expect("read").is_none());
    reg.publish(3, &desc(0), 60).expect("server 0 refreshes");
    let c = reg.lookup(Duration::ZERO, false).expect("lookup succeeds");
    assert_eq!(c.servers[0].as_ref(), Some(&desc(0)));
    assert_eq!(c.missing(), vec![1, 2], "both forgeries are ignored");
    assert_eq!(reg.server(1).expect("server 1"), None);

    // A valid entry copied under another server's key fails too: the MAC
    // covers the key.
    let hostport = mc.url().replace("memcached://", "memcache://");
    let raw = memcache::Client::connect(format!("{hostport}?protocol=ascii")).expect("raw");
    let sealed: Vec<u8> = raw
        .get("fabrickv/mac/server/0")
        .expect("get")
        .expect("server 0 is there");
    assert!(String::from_utf8_lossy(&sealed).contains("\nmac:"));
    raw.set("fabrickv/mac/server/2", sealed.as_slice(), 60)
        .expect("copy");
    assert_eq!(
        reg.lookup(Duration::ZERO, false).expect("lookup").missing(),
        vec![1, 2]
    );

    // A reader without the secret reads the entries, MAC or not.
    let open = Registry::connect(&mc.url(), "mac")
        .expect("registry")
        .with_secret(None);
    assert_eq!(open.server(0).expect("server 0"), Some(desc(0)));
}
