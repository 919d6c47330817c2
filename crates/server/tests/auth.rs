//! The cluster secret on the native protocol: a server that holds one
//! lets in only clients that prove it in the handshake, on every
//! transport, and refuses the others with a stable code before it reads
//! a byte of their requests.
//!
//! Every client of this test binary offers [`SECRET`] (set once, process
//! wide, as the CLI's `--auth-token-file` does); refusals are checked
//! with connections that name what they offer.

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::OnceLock;

use common::{request, TestServer, Transport, MEMORY_BYTES, TIMEOUT};
use fabrickv_auth::{Secret, NONCE_BYTES};
use fabrickv_client::Kv;
use fabrickv_server::Mode;
use fabrickv_transport::handshake::{
    Challenge, CHALLENGE_BYTES, CHALLENGE_HEAD_BYTES, PROOF_CONTEXT,
};
use fabrickv_transport::{connect_with, Dial, TransportError};
use fabrickv_types::ErrorCode;
use fabrickv_wire::PutCondition;

const SECRET: &str = "the secret of the auth tests";

/// The server's secret, also made every client's of this process.
fn secret() -> Secret {
    static S: OnceLock<Secret> = OnceLock::new();
    S.get_or_init(|| {
        let s = Secret::from_bytes(SECRET.as_bytes(), "test").expect("secret");
        fabrickv_auth::set_client_secret(Some(s.clone()));
        s
    })
    .clone()
}

fn server(t: Transport) -> TestServer {
    let s = secret();
    TestServer::start_with(t, 2, Mode::Store, MEMORY_BYTES, |c| c.auth = Some(s))
}

fn clients_with_the_secret_work_and_others_are_refused_with_a_code(t: Transport) {
    let s = server(t);
    let mut c = s.client();
    c.put(b"k", b"v").expect("put");
    assert_eq!(c.get(b"k").expect("get").as_deref(), Some(&b"v"[..]));
    let wrong = Secret::from_bytes(b"not the secret of the auth tests", "test").ok();
    for (offered, code) in [
        (None, ErrorCode::AuthRequired),
        (wrong, ErrorCode::AuthFailed),
    ] {
        let dial = Dial {
            timeout: TIMEOUT,
            secret: offered,
        };
        match connect_with(&s.addr, 1, &dial) {
            Err(TransportError::Denied(c, why)) => assert_eq!(c, code, "{why}"),
            Err(e) => panic!("expected {code}, got {e}"),
            // In-process clients share the server's memory: no secret.
            Ok(_) if t == Transport::Inproc => {}
            Ok(_) => panic!("a client without the secret got in over {t:?}"),
        }
    }
    // The refused clients left the authenticated one undisturbed.
    assert_eq!(c.get(b"k").expect("get").as_deref(), Some(&b"v"[..]));
    s.shutdown();
}

transport_tests!(clients_with_the_secret_work_and_others_are_refused_with_a_code);

/// Sends a tcp opening for worker 0 and reads the challenge's nonce.
fn challenged(addr: &str) -> (TcpStream, [u8; NONCE_BYTES]) {
    let mut sock = TcpStream::connect(addr).expect("connect");
    sock.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    sock.write_all(b"FKV\x01\0\0\0\0").expect("opening");
    let mut c = [0u8; CHALLENGE_BYTES];
    sock.read_exact(&mut c).expect("challenge");
    assert!(Challenge::is_head(&c), "{c:?}");
    let nonce = c[CHALLENGE_HEAD_BYTES..].try_into().expect("nonce");
    (sock, nonce)
}

/// The status of a tcp handshake answer.
fn answer(sock: &mut TcpStream) -> u16 {
    let mut a = [0u8; 8];
    sock.read_exact(&mut a).expect("answer");
    assert_eq!(&a[..4], b"FKV\x01");
    u16::from_le_bytes([a[4], a[5]])
}

#[test]
fn a_wrong_or_replayed_proof_is_refused_before_any_request_is_read() {
    let s = server(Transport::Tcp);
    let addr = s.tcp_socket_addr().to_string();
    // A wrong proof, with a PUT right behind it.
    let (mut sock, _) = challenged(&addr);
    let put = request(1, 0, |b| {
        b.put(b"smuggled", b"v", 0, PutCondition::Always);
    });
    let mut bytes = vec![0u8; 32];
    bytes.extend_from_slice(&(put.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&put);
    sock.write_all(&bytes).expect("send");
    assert_eq!(answer(&mut sock), ErrorCode::AuthFailed.as_u16());
    let mut rest = Vec::new();
    let _ = sock.read_to_end(&mut rest);
    assert!(
        rest.is_empty(),
        "the server wrote more after refusing: {rest:?}"
    );
    // A right proof, recorded, then replayed on a new connection.
    let (mut good, n1) = challenged(&addr);
    let proof = secret().proof(PROOF_CONTEXT, &n1);
    good.write_all(&proof).expect("proof");
    assert_eq!(answer(&mut good), ErrorCode::Ok.as_u16());
    let (mut replay, n2) = challenged(&addr);
    assert_ne!(n1, n2, "a nonce came twice");
    replay.write_all(&proof).expect("replay");
    assert_eq!(answer(&mut replay), ErrorCode::AuthFailed.as_u16());
    let mut c = s.client();
    assert_eq!(
        c.get(b"smuggled").expect("get"),
        None,
        "the refused PUT ran"
    );
    s.shutdown();
}

/// A tcp connection to `addr` from the loopback address `from` (Linux
/// routes all of 127/8 to lo, so a second client address is at hand).
fn connect_from(from: &str, addr: &str) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let to: std::net::SocketAddr = addr.parse().expect("addr");
    let sock = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    let local: std::net::SocketAddr = format!("{from}:0").parse().expect("from");
    sock.bind(&local.into()).expect("bind");
    sock.connect_timeout(&to.into(), TIMEOUT).expect("connect");
    let sock: TcpStream = sock.into();
    sock.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    sock
}

/// One native tcp handshake from `from` proving `prover`: the status the
/// server answered (`AUTH_THROTTLED` comes at the opening, unchallenged).
fn handshake_from(from: &str, addr: &str, prover: &Secret) -> ErrorCode {
    let mut sock = connect_from(from, addr);
    sock.write_all(b"FKV\x01\0\0\0\0").expect("opening");
    let mut head = [0u8; 8];
    sock.read_exact(&mut head).expect("first bytes");
    if head.starts_with(b"FKV\x01") {
        return ErrorCode::from_u16(u16::from_le_bytes([head[4], head[5]])).expect("a code");
    }
    let mut c = [0u8; CHALLENGE_BYTES];
    c[..8].copy_from_slice(&head);
    sock.read_exact(&mut c[8..]).expect("challenge");
    assert!(Challenge::is_head(&c), "{c:?}");
    let nonce: [u8; NONCE_BYTES] = c[CHALLENGE_HEAD_BYTES..].try_into().expect("nonce");
    sock.write_all(&prover.proof(PROOF_CONTEXT, &nonce))
        .expect("proof");
    ErrorCode::from_u16(answer(&mut sock)).expect("a code")
}

/// Failed proofs were throttled per connection only: 400 parallel
/// connections made 2,258 wrong proofs a second. Now one address gets
/// its burst of failures, then is refused unjudged (`AUTH_THROTTLED`,
/// even with the right proof); a client of another address that holds
/// the secret gets in on its first try.
#[test]
fn wrong_proofs_from_one_address_are_throttled_and_the_secret_still_gets_in() {
    use fabrickv_auth::throttle::SOURCE_FAILURES_BURST;
    let s = server(Transport::Tcp);
    let addr = s.tcp_socket_addr().to_string();
    let wrong = Secret::from_bytes(b"not the secret of the auth tests", "test").expect("secret");
    let started = std::time::Instant::now();
    let (mut judged, mut throttled) = (0u64, 0u64);
    for _ in 0..3 * SOURCE_FAILURES_BURST {
        match handshake_from("127.0.0.1", &addr, &wrong) {
            ErrorCode::AuthFailed => judged += 1,
            ErrorCode::AuthThrottled => throttled += 1,
            c => panic!("unexpected {c}"),
        }
    }
    // The burst, and at most one more per second the loop took.
    let allowed = u64::from(SOURCE_FAILURES_BURST) + started.elapsed().as_secs() + 1;
    assert!(
        judged <= allowed,
        "{judged} wrong proofs judged, {allowed} allowed"
    );
    assert!(throttled > 0, "never throttled");
    assert_eq!(
        handshake_from("127.0.0.1", &addr, &secret()),
        ErrorCode::AuthThrottled,
        "a throttled address is refused unjudged"
    );
    let t = std::time::Instant::now();
    assert_eq!(handshake_from("127.0.0.2", &addr, &secret()), ErrorCode::Ok);
    assert!(
        t.elapsed() < TIMEOUT,
        "the secret's holder waited {:?}",
        t.elapsed()
    );
    s.shutdown();
}

/// RESP AUTH as the native handshake: fresh connections (which escape
/// the per-connection delay) from one address get their burst of
/// WRONGPASS, then `-AUTH_THROTTLED` with the password unjudged; the
/// password still opens a connection from another address at once.
#[test]
fn wrong_resp_auths_from_one_address_are_throttled_and_the_password_still_works() {
    use fabrickv_auth::throttle::SOURCE_FAILURES_BURST;
    let s = TestServer::start_with(Transport::Tcp, 1, Mode::Store, MEMORY_BYTES, |c| {
        c.resp = Some("127.0.0.1:0".into());
        c.auth = Some(secret());
    });
    let resp_addr = s.resp_addr().to_string();
    let auth = |from: &str, password: &str| {
        let mut w = connect_from(from, &resp_addr);
        w.write_all(&common::encode(&[b"AUTH", password.as_bytes()]))
            .expect("send");
        let mut r = std::io::BufReader::new(w);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut r, &mut line).expect("reply");
        line.trim_end().to_string()
    };
    let started = std::time::Instant::now();
    let (mut judged, mut throttled) = (0u64, 0u64);
    for _ in 0..3 * SOURCE_FAILURES_BURST {
        let reply = auth("127.0.0.1", "not the password");
        if reply.starts_with("-WRONGPASS") {
            judged += 1;
        } else if reply.starts_with("-AUTH_THROTTLED") {
            throttled += 1;
        } else {
            panic!("unexpected {reply}");
        }
    }
    let allowed = u64::from(SOURCE_FAILURES_BURST) + started.elapsed().as_secs() + 1;
    assert!(
        judged <= allowed,
        "{judged} wrong AUTHs judged, {allowed} allowed"
    );
    assert!(throttled > 0, "never throttled");
    assert!(auth("127.0.0.1", SECRET).starts_with("-AUTH_THROTTLED"));
    let t = std::time::Instant::now();
    assert_eq!(auth("127.0.0.2", SECRET), "+OK");
    assert!(
        t.elapsed() < TIMEOUT,
        "the password's holder waited {:?}",
        t.elapsed()
    );
    s.shutdown();
}
