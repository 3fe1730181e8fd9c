//! Private three-member etcd cluster: formation, one leader, a leader kill and restart, a
//! member paused and resumed.

use std::time::Duration;

use leasehold_testkit::EtcdCluster;

#[test]
fn cluster_forms_elects_again_after_a_leader_kill_and_takes_the_member_back() {
    let cluster = EtcdCluster::start();
    assert_eq!(cluster.members().len(), 3);
    let ports: Vec<u16> = cluster.members().iter().map(|m| m.port()).collect();
    assert_eq!(
        cluster.url(),
        format!(
            "etcd://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
            ports[0], ports[1], ports[2]
        )
    );
    for m in cluster.members() {
        assert!(m.is_healthy(), "{} is not healthy", m.name());
    }
    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .expect("a leader");
    let leaders = cluster.members().iter().filter(|m| m.is_leader()).count();
    assert_eq!(leaders, 1, "exactly one member says it leads");

    cluster.member(leader).kill();
    assert!(!cluster.member(leader).is_running());
    let next = cluster
        .wait_for_leader(Duration::from_secs(20))
        .expect("the two others elect a leader");
    assert_ne!(next, leader);
    cluster.start_again(leader);
    assert!(cluster.member(leader).is_healthy());

    let follower = (0..3)
        .find(|&i| !cluster.member(i).is_leader())
        .expect("a follower");
    cluster.member(follower).pause();
    assert!(cluster.member(follower).is_paused());
    assert!(
        !cluster.member(follower).is_healthy(),
        "a paused member answers"
    );
    assert!(cluster.leader().is_some_and(|l| l != follower));
    cluster.resume_all();
    assert!(!cluster.member(follower).is_paused());
    let healthy = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        cluster.member(follower).is_healthy()
    });
    assert!(healthy, "the resumed member is healthy again");
}
