//! Private Redis Cluster: formation and slot migration.

use std::time::Duration;

use leasehold_testkit::RedisCluster;

#[test]
fn cluster_forms_and_migrates_a_slot() {
    let cluster = RedisCluster::start_default();
    assert_eq!(cluster.nodes().len(), 3);
    for node in cluster.nodes() {
        let info = node.cli(&["CLUSTER", "INFO"]);
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_known_nodes:3"), "{info}");
    }
    let urls = cluster.seed_urls();
    assert_eq!(urls.len(), 3);
    for (url, node) in urls.iter().zip(cluster.nodes()) {
        assert_eq!(url, &format!("redis://127.0.0.1:{}/", node.port()));
    }

    let key = "{lease}resource";
    let slot = cluster.keyslot(key);
    assert_eq!(
        slot,
        cluster.keyslot("{lease}other"),
        "hash tags share a slot"
    );
    assert_eq!(cluster.cli(&["SET", key, "holder-1"]), "OK");
    assert_eq!(cluster.cli(&["SET", "{lease}other", "x"]), "OK");

    let from = cluster.node_index_for_slot(slot);
    let to = (from + 1) % 3;
    assert_eq!(cluster.node(from).cli(&["GET", key]), "holder-1");

    cluster.migrate_slot(slot, from, to);

    assert_eq!(cluster.node_index_for_slot(slot), to);
    assert_eq!(cluster.node_for_slot(slot).port(), cluster.node(to).port());
    // The key moved with the slot: served by the new owner directly ...
    assert_eq!(cluster.node(to).cli(&["GET", key]), "holder-1");
    assert_eq!(cluster.node(to).cli(&["GET", "{lease}other"]), "x");
    // ... the old owner redirects ...
    let moved = cluster.node(from).cli(&["GET", key]);
    assert!(moved.contains("MOVED"), "{moved}");
    assert!(
        moved.contains(&cluster.node(to).port().to_string()),
        "{moved}"
    );
    // ... and a redirect-following client reads it from anywhere.
    for node in cluster.nodes() {
        assert_eq!(node.cli(&["-c", "GET", key]), "holder-1");
    }

    // A node can be paused, and crash-restarted with its identity (nodes.conf).
    let other = (to + 1) % 3;
    cluster.node(other).pause();
    assert_eq!(cluster.node(to).cli(&["GET", key]), "holder-1");
    cluster.node(other).resume();
    let id = cluster.node_id(other).to_string();
    cluster.node(other).restart();
    assert_eq!(cluster.node(other).cli(&["CLUSTER", "MYID"]), id);
    cluster.wait_state_ok(Duration::from_secs(30));
    assert_eq!(cluster.cli(&["GET", key]), "holder-1");
}
