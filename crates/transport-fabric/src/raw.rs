//! The floor: a bare libfabric ping-pong (`fi_send` / `fi_recv`, busy
//! polling `fi_cq_read`), no framing, no credits, no framework. Server and
//! client run in one process on two threads, each with its own endpoint.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use fabrickv_transport::{Result, TransportError};

use crate::fi::{Event, Node};

/// Round trips run before timing starts.
pub const RAW_WARMUP_ITERS: usize = 100;

/// Receive slots each side posts.
const RAW_RX_SLOTS: usize = 4;

/// Longest wait for one message before the run fails.
const RAW_STEP_TIMEOUT: Duration = Duration::from_secs(10);

fn open(provider: &str, msg_size: usize) -> Result<Node> {
    let name = crate::source_node(provider, std::net::Ipv4Addr::LOCALHOST.into());
    let mut node = Node::open(provider, Some(&name), RAW_RX_SLOTS, msg_size)?;
    node.core.use_inject = false;
    node.add_rx_slab(RAW_RX_SLOTS, msg_size)?;
    Ok(node)
}

/// Waits for one received message, reposts its slot; returns its length.
fn recv_one(node: &mut Node) -> Result<usize> {
    let deadline = Instant::now() + RAW_STEP_TIMEOUT;
    loop {
        node.core.progress()?;
        match node.core.events.pop_front() {
            Some(Event::Recv { slab, slot, len }) => {
                node.post_recv(slab, slot)?;
                return Ok(len);
            }
            Some(Event::RecvFailed { slab, slot }) => node.post_recv(slab, slot)?,
            Some(Event::SendFailed { .. }) => return Err(TransportError::Closed),
            None if Instant::now() >= deadline => return Err(TransportError::Timeout),
            None => std::hint::spin_loop(),
        }
    }
}

fn send_one(node: &mut Node, dest: u64, msg: &[u8]) -> Result<()> {
    let deadline = Instant::now() + RAW_STEP_TIMEOUT;
    while !node.core.send(dest, &[msg])? {
        if Instant::now() >= deadline {
            return Err(TransportError::Timeout);
        }
    }
    Ok(())
}

/// Times `iters` round trips of `msg_size`-byte messages over `provider`
/// (after [`RAW_WARMUP_ITERS`] untimed ones); one duration per round trip.
pub fn raw_pingpong(provider: &str, msg_size: usize, iters: usize) -> Result<Vec<Duration>> {
    let msg_size = msg_size.max(1);
    let total = RAW_WARMUP_ITERS + iters;
    let (to_server, from_client) = mpsc::channel::<Vec<u8>>();
    let (to_client, from_server) = mpsc::channel::<Result<Vec<u8>>>();
    let prov = provider.to_string();
    let server = std::thread::spawn(move || -> Result<()> {
        let mut node = match open(&prov, msg_size) {
            Ok(n) => n,
            Err(e) => {
                let _ = to_client.send(Err(e));
                return Ok(());
            }
        };
        let _ = to_client.send(Ok(node.core.name.clone()));
        let peer_name = from_client
            .recv_timeout(RAW_STEP_TIMEOUT)
            .map_err(|_| TransportError::Timeout)?;
        let peer = node.core.insert(&peer_name)?;
        let msg = vec![0x5a; msg_size];
        for _ in 0..total {
            recv_one(&mut node)?;
            send_one(&mut node, peer, &msg)?;
        }
        Ok(())
    });
    let server_name = from_server
        .recv_timeout(RAW_STEP_TIMEOUT)
        .map_err(|_| TransportError::Timeout)??;
    let run = || -> Result<Vec<Duration>> {
        let mut node = open(provider, msg_size)?;
        let peer = node.core.insert(&server_name)?;
        to_server
            .send(node.core.name.clone())
            .map_err(|_| TransportError::Closed)?;
        let msg = vec![0xa5; msg_size];
        let mut times = Vec::with_capacity(iters);
        for i in 0..total {
            let t = Instant::now();
            send_one(&mut node, peer, &msg)?;
            recv_one(&mut node)?;
            if i >= RAW_WARMUP_ITERS {
                times.push(t.elapsed());
            }
        }
        Ok(times)
    };
    let times = run();
    let served = server
        .join()
        .map_err(|_| TransportError::Io(std::io::Error::other("raw ping-pong server panicked")))?;
    let times = times?;
    served?;
    Ok(times)
}
