//! etcd with its own authentication on: the registry logs in with the user
//! and password the environment names (never a command line), and without
//! them is refused. A test binary of its own, since it sets the process's
//! environment.

use std::process::Command;

use fabrickv_cluster::etcd::{EtcdRegistry, ETCD_PASSWORD_FILE_ENV, ETCD_USER_ENV};
use fabrickv_cluster::local::LocalEtcd;
use fabrickv_cluster::slots::SlotMap;

/// Runs `etcdctl` against `etcd` with `args`, as root when `root_password`
/// is given (the password on etcdctl's command line is the test's own
/// throwaway one, on loopback).
fn etcdctl(etcd: &LocalEtcd, root_password: Option<&str>, args: &[&str]) {
    let endpoint = etcd.url().replace("etcd://", "");
    let mut cmd = Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"));
    if let Some(p) = root_password {
        cmd.arg(format!("--user=root:{p}"));
    }
    let out = cmd
        .args(args)
        .output()
        .expect("etcdctl runs (make deps installs it)");
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_registry_logs_in_with_the_user_the_environment_names() {
    let etcd = LocalEtcd::start().expect("etcd");
    let root = "root-pw-for-this-test";
    etcdctl(&etcd, None, &["user", "add", &format!("root:{root}")]);
    etcdctl(&etcd, None, &["auth", "enable"]);
    etcdctl(&etcd, Some(root), &["user", "add", "fkv:fkv-pw-0123"]);
    etcdctl(&etcd, Some(root), &["role", "add", "fkv"]);
    etcdctl(
        &etcd,
        Some(root),
        &[
            "role",
            "grant-permission",
            "fkv",
            "--prefix=true",
            "readwrite",
            "/fabrickv/",
        ],
    );
    etcdctl(&etcd, Some(root), &["user", "grant-role", "fkv", "fkv"]);

    // Without credentials: refused.
    let anonymous = EtcdRegistry::connect(&etcd.url(), "a").and_then(|r| r.view());
    assert!(
        anonymous.is_err(),
        "etcd with auth on refuses an anonymous client"
    );

    let dir = std::env::temp_dir().join(format!("fkv-etcd-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("password");
    std::fs::write(&file, "fkv-pw-0123\n").expect("password file");
    std::env::set_var(ETCD_USER_ENV, "fkv");
    std::env::set_var(ETCD_PASSWORD_FILE_ENV, &file);
    let reg = EtcdRegistry::connect(&etcd.url(), "a")
        .expect("logs in")
        .with_secret(None);
    let map = SlotMap::initial(2, 1).expect("map");
    let (got, _) = reg.create_map(&map).expect("writes under /fabrickv/");
    assert_eq!(got, map);
    assert_eq!(reg.view().expect("reads").map.expect("a map").0, map);

    std::fs::write(&file, "wrong\n").expect("password file");
    let wrong = EtcdRegistry::connect(&etcd.url(), "a").and_then(|r| r.view());
    assert!(wrong.is_err(), "a wrong password is refused");
    let _ = std::fs::remove_dir_all(&dir);
}
