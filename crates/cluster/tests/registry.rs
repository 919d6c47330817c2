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
