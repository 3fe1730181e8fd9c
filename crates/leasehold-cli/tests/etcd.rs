//! The `leasehold` command against a private etcd (`--store etcd://…`): built only with
//! the `etcd` feature (`scripts/test` turns it on).
#![cfg(feature = "etcd")]

use std::time::Duration;

use leasehold_testkit::{EtcdServer, WorkerProcess};

mod common;

use common::{Env, stderr, stdout, wait_for_file};

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

#[test]
fn run_on_etcd_passes_the_fence_and_fences_rise() {
    let etcd = EtcdServer::start();
    let env = Env::new();
    let url = etcd.url();
    let fence = |env: &Env| -> u64 {
        let out = env.run_ok(&[
            "--store",
            &url,
            "run",
            "--key",
            "job:etcd",
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_FENCE",
        ]);
        stdout(&out)
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{e}: {:?} {}", stdout(&out), stderr(&out)))
    };
    let first = fence(&env);
    assert!(first > 0);
    let second = fence(&env);
    assert!(second > first, "{second} <= {first}");
    // Released after each run.
    let v = json(&env.run_ok(&["--store", &url, "inspect", "job:etcd", "--json"]));
    assert_eq!(v["held"], false, "{v}");
}

#[test]
fn inspect_list_and_break_on_etcd() {
    let etcd = EtcdServer::start();
    let env = Env::new();
    let url = etcd.url();
    let pidfile = env.path("child.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut holder = env.cmd();
    holder.args([
        "--store", &url, "run", "--key", "job:busy", "--ttl", "4s", "--", "sh", "-c", &script,
    ]);
    let holder = WorkerProcess::spawn(holder);
    wait_for_file(&pidfile, Duration::from_secs(20));
    let out = env.run(&[
        "--store",
        &url,
        "run",
        "--key",
        "job:busy",
        "--no-wait",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    let v = json(&env.run_ok(&["--store", &url, "inspect", "job:busy", "--json"]));
    assert_eq!(v["held"], true, "{v}");
    let fence = v["lease"]["fence"].as_u64().unwrap();
    let v = json(&env.run_ok(&["--store", &url, "list", "job:", "--json"]));
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    let v = json(&env.run_ok(&["--store", &url, "break", "job:busy", "--json"]));
    assert!(v["fence"].as_u64().unwrap() > fence, "{v}");
    // The evicted holder learns at its next renewal and exits with "lease lost".
    let status = holder
        .wait_timeout(Duration::from_secs(20))
        .expect("the evicted holder exits");
    assert_eq!(status.code(), Some(70));
}
