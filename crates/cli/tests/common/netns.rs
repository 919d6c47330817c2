//! Hosts made of Linux network namespaces, for multi-host tests on one
//! machine.
//!
//! A [`Net`] is a private switch (a bridge in a namespace of its own) and
//! `hosts` namespaces, each joined to the switch by a veth pair and given
//! the address `10.99.0.(i+1)/24`. Nothing is routed out of the switch:
//! every packet of a test stays between its namespaces. Each test builds
//! its own `Net` with names that hold the process id and a counter, so
//! tests in parallel never share an interface, and the subnet can be the
//! same in every one. Dropping the `Net` kills what ran in it and deletes
//! the namespaces (which deletes their interfaces).

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static NETS: AtomicU32 = AtomicU32::new(0);

/// The first three octets of every host's address.
pub const SUBNET: &str = "10.99.0";

/// A switch and its hosts; torn down when dropped.
pub struct Net {
    prefix: String,
    hosts: usize,
    children: Vec<Child>,
}

/// Runs `ip ARGS`, failing with its stderr.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Net {
    /// Builds the switch and `hosts` hosts, or says why it cannot (no `ip`
    /// command, or no right to create namespaces): tests then skip.
    pub fn new(hosts: usize) -> Result<Net, String> {
        assert!(hosts <= 200, "one /24 subnet");
        let n = NETS.fetch_add(1, Ordering::Relaxed);
        // Interface names are at most 15 bytes: "fk" + pid + "." + n + "vNNb".
        let prefix = format!("fk{}.{n}", std::process::id() % 1_000_000);
        let mut net = Net {
            prefix,
            hosts: 0,
            children: Vec::new(),
        };
        let hub = net.hub();
        ip(&["netns", "add", &hub])?;
        net.in_ns(&hub, &["ip", "link", "add", "br0", "type", "bridge"])?;
        net.in_ns(&hub, &["ip", "link", "set", "br0", "up"])?;
        for i in 0..hosts {
            let ns = net.host(i);
            ip(&["netns", "add", &ns])?;
            net.hosts = i + 1;
            let (a, b) = (
                format!("{}v{i}a", net.prefix),
                format!("{}v{i}b", net.prefix),
            );
            ip(&[
                "link", "add", &a, "netns", &ns, "type", "veth", "peer", "name", &b, "netns", &hub,
            ])?;
            net.in_ns(&hub, &["ip", "link", "set", &b, "master", "br0"])?;
            net.in_ns(&hub, &["ip", "link", "set", &b, "up"])?;
            net.in_ns(&ns, &["ip", "link", "set", "lo", "up"])?;
            net.in_ns(&ns, &["ip", "link", "set", &a, "name", "eth0"])?;
            let addr = format!("{}/24", net.addr(i));
            net.in_ns(&ns, &["ip", "addr", "add", &addr, "dev", "eth0"])?;
            net.in_ns(&ns, &["ip", "link", "set", "eth0", "up"])?;
        }
        Ok(net)
    }

    fn hub(&self) -> String {
        format!("{}hub", self.prefix)
    }

    /// The namespace name of host `i`.
    pub fn host(&self, i: usize) -> String {
        format!("{}h{i}", self.prefix)
    }

    /// The address of host `i`.
    pub fn addr(&self, i: usize) -> String {
        format!("{SUBNET}.{}", i + 1)
    }

    fn in_ns(&self, ns: &str, cmd: &[&str]) -> Result<(), String> {
        let mut args = vec!["netns", "exec", ns];
        args.extend_from_slice(cmd);
        ip(&args)
    }

    /// A command that runs `program ARGS` on host `i`.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.host(i), program]);
        c
    }

    /// Runs `program ARGS` on host `i` to completion.
    pub fn run(&self, i: usize, program: &str, args: &[&str]) -> Output {
        self.command(i, program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run a command in a namespace")
    }

    /// Keeps a child started in this net, to be killed with it.
    pub fn keep(&mut self, c: Child) -> usize {
        self.children.push(c);
        self.children.len() - 1
    }

    /// Kills (SIGKILL) the `k`-th kept child and reaps it.
    pub fn kill(&mut self, k: usize) {
        let c = &mut self.children[k];
        let _ = c.kill();
        let _ = c.wait();
    }

    /// The `k`-th kept child.
    pub fn child(&mut self, k: usize) -> &mut Child {
        &mut self.children[k]
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for i in 0..self.hosts {
            let _ = ip(&["netns", "del", &self.host(i)]);
        }
        let _ = ip(&["netns", "del", &self.hub()]);
    }
}
