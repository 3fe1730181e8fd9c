//! `leasehold run --store redlock://…` against three private Redis servers.

use leasehold_testkit::RedisServer;

mod common;

use common::{Env, stderr, stdout};

fn fence_of_run(env: &Env, url: &str) -> u64 {
    let out = env.run(&[
        "--store",
        url,
        "run",
        "--key",
        "job:redlock",
        "--ttl",
        "5s",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("LEASEHOLD_FENCE {:?}: {e}", stdout(&out)))
}

#[test]
fn run_on_redlock_gets_a_fence_and_survives_a_node_down() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let url = format!(
        "redlock://{}",
        servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect::<Vec<_>>()
            .join(",")
    );
    let env = Env::new();
    let first = fence_of_run(&env, &url);
    assert!(first > 0);
    // Released on every node afterwards.
    let out = env.run_ok(&["--store", &url, "inspect", "job:redlock", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], false, "{v}");
    for s in &servers {
        assert_eq!(s.cli(&["EXISTS", "leasehold:{job:redlock}"]), "0");
    }
    // One node of three down: still granted, with a higher fence.
    servers[1].kill();
    let second = fence_of_run(&env, &url);
    assert!(second > first, "fence {second} after {first}");
}
