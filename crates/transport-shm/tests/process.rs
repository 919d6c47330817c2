//! Client and server in separate processes: message exchange, `kill -9`
//! of either side, no leftovers, and an idle server's CPU use.
//!
//! The other process is this test binary run again with
//! `FKV_SHM_CHILD=ROLE:NAME`, which makes [`child_role`] play the role
//! instead of returning at once. A child exits when its stdin closes, so
//! a failed test leaves no process behind.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabrickv_transport::{Endpoint, TransportError};

mod common;
use common::unique;

const TIMEOUT: Duration = Duration::from_secs(10);
const CHILD_ENV: &str = "FKV_SHM_CHILD";

/// Runs an echo server on `shm://name` until killed.
fn serve_forever(name: &str) -> ! {
    let l = fabrickv_transport::listen(&format!("shm://{name}"), 1).expect("listen");
    let mut acceptor = l.acceptor;
    std::thread::spawn(move || {
        let stop = AtomicBool::new(false);
        acceptor.run(&stop).expect("acceptor")
    });
    let mut port = l.ports.into_iter().next().expect("port");
    println!("READY");
    loop {
        let n = port
            .poll(64, &mut |_, msg, reply| reply.buf().extend_from_slice(msg))
            .expect("poll");
        port.flush().expect("flush");
        if n == 0 {
            port.wait(Duration::from_millis(200)).expect("wait");
        }
    }
}

/// Connects to `shm://name`, exchanges messages, then idles until killed.
fn client_forever(name: &str) -> ! {
    let mut ep = connect(name);
    echo_rounds(&mut *ep, 10);
    println!("CONNECTED");
    loop {
        let _ = ep.wait(Duration::from_secs(1));
    }
}

/// Not a test of its own: the entry point of child processes.
#[test]
fn child_role() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    fabrickv_transport_shm::install();
    // Exit when the parent goes away (it holds our stdin).
    std::thread::spawn(|| {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        std::process::exit(0);
    });
    match spec.split_once(':') {
        Some(("server", name)) => serve_forever(name),
        Some(("client", name)) => client_forever(name),
        _ => panic!("bad {CHILD_ENV}={spec}"),
    }
}

/// Starts a child in `role` and waits until it prints `ready_line`.
fn spawn_child(role: &str, name: &str, ready_line: &str) -> Child {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["child_role", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{role}:{name}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let out = child.stdout.take().expect("child stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let want = ready_line.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if line.trim_end().ends_with(want.as_str()) {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(TIMEOUT).expect("child never became ready");
    child
}

fn connect(name: &str) -> Box<dyn Endpoint> {
    fabrickv_transport::connect(&format!("shm://{name}"), 0, TIMEOUT).expect("connect")
}

fn echo_rounds(ep: &mut dyn Endpoint, rounds: u32) {
    for round in 0..rounds {
        for i in 0..16u32 {
            ep.post(&(round << 8 | i).to_le_bytes()).expect("post");
        }
        ep.flush(TIMEOUT).expect("flush");
        let deadline = Instant::now() + TIMEOUT;
        let mut next = 0u32;
        while next < 16 {
            ep.poll(16, &mut |m| {
                assert_eq!(m, (round << 8 | next).to_le_bytes());
                next += 1;
            })
            .expect("poll");
            assert!(Instant::now() < deadline, "echo timed out");
            if next < 16 {
                ep.wait(Duration::from_millis(100)).expect("wait");
            }
        }
    }
}

/// Nothing named after the connection is left in /dev/shm.
fn assert_no_shm_files(name: &str) {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in dir.flatten() {
        let f = e.file_name().to_string_lossy().into_owned();
        assert!(!f.contains(name), "left behind: /dev/shm/{f}");
    }
}

#[test]
fn killed_server_process_is_reported_closed() {
    let name = unique("kill-server");
    let mut child = spawn_child("server", &name, "READY");
    let mut ep = connect(&name);
    echo_rounds(&mut *ep, 50);

    child.kill().expect("kill -9");
    let killed = Instant::now();
    child.wait().expect("reap");
    loop {
        match ep.poll(1, &mut |_| {}) {
            Err(TransportError::Closed) => break,
            Err(e) => panic!("expected Closed, got {e}"),
            Ok(n) => assert_eq!(n, 0, "no message after the echoes"),
        }
        assert!(killed.elapsed() < TIMEOUT, "closure never reported");
        ep.wait(Duration::from_millis(50)).expect("wait");
    }
    eprintln!("server kill noticed after {:?}", killed.elapsed());
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "closure reported late"
    );
    // Later calls fail fast too, they never hang.
    ep.post(b"x").expect("post is local");
    match ep.flush(TIMEOUT) {
        Ok(()) | Err(TransportError::Closed) => {}
        Err(e) => panic!("flush after closure: {e}"),
    }
    assert!(matches!(
        ep.poll(1, &mut |_| {}),
        Err(TransportError::Closed)
    ));
    drop(ep);
    assert_no_shm_files(&name);
    // The kernel freed the abstract socket name with the process.
    let again = fabrickv_transport::listen(&format!("shm://{name}"), 1);
    assert!(again.is_ok(), "name still taken after the server died");
}

#[test]
fn killed_client_process_closes_its_connection() {
    let name = unique("kill-client");
    let l = fabrickv_transport::listen(&format!("shm://{name}"), 1).expect("listen");
    let stop = Arc::new(AtomicBool::new(false));
    let open = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let mut acceptor = l.acceptor;
    let acceptor_waker = acceptor.waker();
    let s = stop.clone();
    let acceptor_thread = std::thread::spawn(move || acceptor.run(&s).expect("acceptor"));
    let mut port = l.ports.into_iter().next().expect("port");
    let waker = port.waker();
    let (s, o, a) = (stop.clone(), open.clone(), accepted.clone());
    let worker = std::thread::spawn(move || {
        while !s.load(Ordering::Acquire) {
            let n = port
                .poll(64, &mut |_, msg, reply| reply.buf().extend_from_slice(msg))
                .expect("poll");
            port.flush().expect("flush");
            o.store(port.stats().conns_open, Ordering::Release);
            a.store(port.stats().conns_accepted, Ordering::Release);
            if n == 0 {
                port.wait(Duration::from_millis(50)).expect("wait");
            }
        }
    });

    let await_value = |what: &AtomicU64, want: u64| {
        let deadline = Instant::now() + TIMEOUT;
        while what.load(Ordering::Acquire) != want {
            assert!(Instant::now() < deadline, "value never became {want}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let mut child = spawn_child("client", &name, "CONNECTED");
    await_value(&accepted, 1);
    await_value(&open, 1);
    child.kill().expect("kill -9");
    let killed = Instant::now();
    child.wait().expect("reap");
    await_value(&open, 0);
    eprintln!("client kill noticed after {:?}", killed.elapsed());
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "closure noticed late"
    );

    stop.store(true, Ordering::Release);
    waker.wake();
    acceptor_waker.wake();
    worker.join().expect("worker");
    acceptor_thread.join().expect("acceptor");
    assert_no_shm_files(&name);
}

/// User plus system CPU time of process `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

#[test]
fn idle_server_uses_no_cpu() {
    /// Linux reports CPU times in USER_HZ ticks, 100 per second.
    const TICKS_PER_SEC: u64 = 100;
    const WINDOW: Duration = Duration::from_secs(1);
    let name = unique("idle");
    let mut child = spawn_child("server", &name, "READY");
    let mut ep = connect(&name);
    echo_rounds(&mut *ep, 5);
    // Let the spin after the last message run out.
    std::thread::sleep(Duration::from_millis(50));
    let before = cpu_ticks(child.id());
    let start = Instant::now();
    std::thread::sleep(WINDOW);
    let used = cpu_ticks(child.id()) - before;
    let elapsed = start.elapsed().as_secs_f64();
    let share = used as f64 / TICKS_PER_SEC as f64 / elapsed;
    eprintln!(
        "idle server: {used} ticks in {elapsed:.2} s = {:.1}% of a core",
        share * 100.0
    );
    assert!(
        share < 0.10,
        "idle server used {:.0}% of a core",
        share * 100.0
    );
    // The connection still works after the idle spell (the server slept
    // and is woken by the doorbell).
    echo_rounds(&mut *ep, 2);
    child.kill().expect("kill");
    child.wait().expect("reap");
}
