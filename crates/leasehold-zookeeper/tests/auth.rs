//! Digest authentication and ACLs against a private ZooKeeper: a store with credentials
//! (`zookeeper://user:password@…`) creates every node with an ACL giving all permissions to
//! its digest identity only, so another identity can neither break, release nor overwrite
//! its leases and records, nor create or delete anything under a root it made; stores of
//! one identity break each other's leases; a wrong password is refused at `open`, typed,
//! and never shown; the credentials are sent again after a reconnect.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Fence, Key, OwnerToken, Refusal, RenewOutcome, Store, StoreError,
    StoreErrorKind,
};
use leasehold_testkit::ZkServer;
use leasehold_zookeeper::ZkStore;
use zookeeper_client as zk;

const ALICE_PASSWORD: &str = "sentinel-alice-pw-41d0";
const BOB_PASSWORD: &str = "sentinel-bob-pw-8c2e";
const WRONG_PASSWORD: &str = "sentinel-wrong-pw-77aa";
const BOUNDS: &str = "session_timeout=8s&timeout=2s&connect_timeout=3s&tick_time=250ms";
const TTL: Duration = Duration::from_secs(5);

fn key(name: &str) -> Key {
    Key::new(format!("zk-auth:{name}")).unwrap()
}

async fn start() -> ZkServer {
    tokio::task::spawn_blocking(ZkServer::start).await.unwrap()
}

/// `zookeeper://user:password@127.0.0.1:port<root>?…`.
fn url(zk: &ZkServer, user: &str, password: &str, root: &str) -> String {
    format!(
        "zookeeper://{user}:{password}@127.0.0.1:{}{root}?{BOUNDS}",
        zk.port()
    )
}

async fn open(zk: &ZkServer, user: &str, password: &str, root: &str) -> ZkStore {
    ZkStore::open(&url(zk, user, password, root))
        .await
        .unwrap_or_else(|e| panic!("open as {user}: {e}"))
}

/// A raw client authenticated as each of `identities` (`user:password`).
async fn raw(zk: &ZkServer, identities: &[&str]) -> zk::Client {
    let mut connector = zk::Client::connector().with_session_timeout(Duration::from_secs(8));
    for id in identities {
        connector = connector.with_auth("digest", id.as_bytes());
    }
    connector
        .connect(&zk.connect_string())
        .await
        .expect("raw zookeeper client")
}

/// Asserts that `e` is a typed permission refusal, says so, and shows no password.
fn assert_permission(e: &StoreError, what: &str) {
    assert_eq!(e.kind(), StoreErrorKind::Config, "{what}: {e}");
    assert_eq!(e.refusal(), Some(Refusal::Permission), "{what}: {e}");
    assert!(e.to_string().contains("permission"), "{what}: {e}");
    assert_no_password(e);
}

/// Asserts that `e` is a typed credentials refusal that shows no password.
fn assert_refused_credentials(e: &StoreError, what: &str) {
    assert_eq!(e.kind(), StoreErrorKind::Config, "{what}: {e}");
    assert_eq!(e.refusal(), Some(Refusal::Credentials), "{what}: {e}");
    assert_no_password(e);
}

fn assert_no_password(e: &StoreError) {
    let shown = format!("{e} {e:?}");
    for secret in [ALICE_PASSWORD, BOB_PASSWORD, WRONG_PASSWORD, "sentinel-"] {
        assert!(!shown.contains(secret), "a password in: {shown}");
    }
}

/// Under a root both identities may use (made by an administrator with both digests), a
/// lease and a record of identity A: B's acquire, break, release and record write are
/// refused with a typed permission error, and so are B's direct deletes of A's lease node
/// and record; A still holds its lease and its record is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_b_cannot_break_release_or_overwrite_identity_as_lease_and_record() {
    let zk = start().await;
    let alice_id = format!("alice:{ALICE_PASSWORD}");
    let bob_id = format!("bob:{BOB_PASSWORD}");
    // The shared root: ALL to alice and to bob (the `auth` ACL of a client that is both).
    let admin = raw(&zk, &[&alice_id, &bob_id]).await;
    admin
        .mkdir(
            "/shared",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all()),
        )
        .await
        .unwrap();
    let alice = open(&zk, "alice", ALICE_PASSWORD, "/shared").await;
    let bob = open(&zk, "bob", BOB_PASSWORD, "/shared").await;

    let k = key("held");
    let rec = key("record");
    let me = OwnerToken::random();
    let AcquireOutcome::Acquired { fence, .. } = alice.acquire(&k, &me, TTL).await.unwrap() else {
        panic!("alice's acquire of a free key was not granted");
    };
    alice.put_record(&rec, fence, b"alice").await.unwrap();

    let thief = OwnerToken::random();
    let e = bob
        .acquire(&k, &thief, TTL)
        .await
        .expect_err("bob's acquire");
    assert_permission(&e, "bob's acquire");
    let e = bob.break_lease(&k).await.expect_err("bob's break");
    assert_permission(&e, "bob's break");
    let e = bob.release(&k, &me).await.expect_err("bob's release");
    assert_permission(&e, "bob's release");
    let e = bob
        .put_record(&rec, Fence(fence.0 + 1_000_000), b"bob")
        .await
        .expect_err("bob's record write");
    assert_permission(&e, "bob's record write");

    // Directly, as bob only: the lease node, the key's directory, the record.
    let bob_raw = raw(&zk, &[&bob_id]).await;
    let node = {
        let alice_raw = raw(&zk, &[&alice_id]).await;
        let names = alice_raw.list_children(&alice.lease_dir(&k)).await.unwrap();
        format!("{}/{}", alice.lease_dir(&k), names[0])
    };
    for path in [node.as_str(), &alice.record_path(&rec)] {
        assert_eq!(
            bob_raw.delete(path, None).await,
            Err(zk::Error::NoAuth),
            "bob deleted {path}"
        );
    }
    assert_eq!(
        bob_raw
            .set_data(&alice.record_path(&rec), b"x", None)
            .await
            .map(|_| ()),
        Err(zk::Error::NoAuth),
        "bob overwrote the record"
    );

    // Alice still holds, with the same fence, and her record is hers.
    assert!(matches!(
        alice.renew(&k, &me, TTL).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    let info = alice.inspect(&k).await.unwrap().expect("alice's lease");
    assert_eq!((info.owner, info.fence), (me, fence));
    let record = alice
        .get_record(&rec)
        .await
        .unwrap()
        .expect("alice's record");
    assert_eq!((record.fence, record.value), (fence, b"alice".to_vec()));
}

/// Two stores of one identity (two processes of one service): the second breaks the
/// first's lease (as `leasehold break` needs), the first's renewal then fails, and the
/// second takes the key with a higher fence and overwrites the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_of_one_identity_break_each_others_leases() {
    let zk = start().await;
    let one = open(&zk, "alice", ALICE_PASSWORD, "/leasehold").await;
    let two = open(&zk, "alice", ALICE_PASSWORD, "/leasehold").await;
    let k = key("shared");
    let rec = key("shared-record");
    let first = OwnerToken::random();
    let AcquireOutcome::Acquired { fence, .. } = one.acquire(&k, &first, TTL).await.unwrap() else {
        panic!("the first acquire was not granted");
    };
    one.put_record(&rec, fence, b"one").await.unwrap();
    let broken = two.break_lease(&k).await.expect("the same identity breaks");
    assert!(broken > fence, "break fence {broken} <= {fence}");
    assert_eq!(
        one.renew(&k, &first, TTL).await.unwrap(),
        RenewOutcome::NotOwner
    );
    let second = OwnerToken::random();
    let AcquireOutcome::Acquired { fence: next, .. } = two.acquire(&k, &second, TTL).await.unwrap()
    else {
        panic!("the acquire after the break was not granted");
    };
    assert!(next > broken, "{next} <= {broken}");
    let written = two.put_record(&rec, next, b"two").await.unwrap();
    assert_eq!(written.value, b"two");
    assert_eq!(
        one.get_record(&rec).await.unwrap().map(|r| r.value),
        Some(b"two".to_vec())
    );
}

/// ZooKeeper accepts any digest password (a wrong one is just another identity, which the
/// root's ACL does not name, and the server refuses it even the ACL): the store reads the
/// root's ACL at `open` and refuses with a typed credentials refusal naming the user, never
/// the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_with_a_typed_error_that_never_shows_it() {
    let zk = start().await;
    let _alice = open(&zk, "alice", ALICE_PASSWORD, "/leasehold").await;
    let e = ZkStore::open(&url(&zk, "alice", WRONG_PASSWORD, "/leasehold"))
        .await
        .expect_err("a wrong password opened the store");
    assert_refused_credentials(&e, "a wrong password");
    assert!(e.to_string().contains("wrong password"), "{e}");
    assert!(e.to_string().contains("`alice`"), "{e}");
}

/// Least privilege: identity B (and a client without credentials) can neither open a store
/// on, nor create, list or delete anything under, a root identity A made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_b_cannot_create_or_delete_under_a_root_a_made() {
    let zk = start().await;
    let alice = open(&zk, "alice", ALICE_PASSWORD, "/app/locks").await;
    let k = key("mine");
    let me = OwnerToken::random();
    assert!(matches!(
        alice.acquire(&k, &me, TTL).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    // At open: the root's ACL does not admit bob (nor anybody without credentials).
    let e = ZkStore::open(&url(&zk, "bob", BOB_PASSWORD, "/app/locks"))
        .await
        .expect_err("bob opened a store on alice's root");
    assert_refused_credentials(&e, "bob's open");
    assert!(e.to_string().contains("another identity"), "{e}");
    let anonymous = format!("zookeeper://127.0.0.1:{}/app/locks?{BOUNDS}", zk.port());
    let e = ZkStore::open(&anonymous)
        .await
        .expect_err("a store without credentials opened alice's root");
    assert_refused_credentials(&e, "an open without credentials");
    // The ancestor the store made is alice's too: bob cannot make a root beside hers.
    let e = ZkStore::open(&url(&zk, "bob", BOB_PASSWORD, "/app/other"))
        .await
        .expect_err("bob made a root under alice's /app");
    assert_permission(&e, "bob's open beside alice's root");

    let bob_id = format!("bob:{BOB_PASSWORD}");
    for client in [raw(&zk, &[&bob_id]).await, raw(&zk, &[]).await] {
        let open_acl = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        assert_eq!(
            client
                .create("/app/locks/intruder", b"", &open_acl)
                .await
                .map(|_| ()),
            Err(zk::Error::NoAuth)
        );
        assert_eq!(
            client
                .create("/app/intruder", b"", &open_acl)
                .await
                .map(|_| ()),
            Err(zk::Error::NoAuth)
        );
        assert_eq!(
            client.list_children("/app/locks").await.map(|_| ()),
            Err(zk::Error::NoAuth)
        );
        assert_eq!(
            client.delete(&alice.lease_dir(&k), None).await,
            Err(zk::Error::NoAuth)
        );
    }
    let info = alice.inspect(&k).await.unwrap().expect("alice's lease");
    assert_eq!(info.owner, me);
}

/// Every node the store creates carries one ACL entry: all permissions to its digest
/// identity (`digest:alice:<hash>`), nothing to anyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_the_store_creates_names_its_identity_only() {
    let zk = start().await;
    let alice = open(&zk, "alice", ALICE_PASSWORD, "/leasehold").await;
    let k = key("acl");
    let me = OwnerToken::random();
    let AcquireOutcome::Acquired { fence, .. } = alice.acquire(&k, &me, TTL).await.unwrap() else {
        panic!("not granted");
    };
    alice.put_record(&k, fence, b"v").await.unwrap();
    let raw_alice = raw(&zk, &[&format!("alice:{ALICE_PASSWORD}")]).await;
    let dir = alice.lease_dir(&k);
    let node = format!("{dir}/{}", raw_alice.list_children(&dir).await.unwrap()[0]);
    for path in [
        "/leasehold".to_owned(),
        dir,
        node,
        alice.records_dir(),
        alice.record_path(&k),
    ] {
        let (acl, _) = raw_alice.get_acl(&path).await.unwrap();
        assert_eq!(acl.len(), 1, "{path}: {acl:?}");
        assert_eq!(acl[0].permission(), zk::Permission::ALL, "{path}: {acl:?}");
        assert_eq!(acl[0].scheme(), "digest", "{path}: {acl:?}");
        assert!(acl[0].id().starts_with("alice:"), "{path}: {acl:?}");
    }
}

/// The credentials go with every connect request: after the server restarted (the store's
/// session reconnects), the store still creates nodes under its root, which only its
/// identity may do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_credentials_are_sent_again_after_a_reconnect() {
    let zk = start().await;
    let alice = open(&zk, "alice", ALICE_PASSWORD, "/leasehold").await;
    let first = key("before");
    assert!(matches!(
        alice
            .acquire(&first, &OwnerToken::random(), TTL)
            .await
            .unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let zk = tokio::task::spawn_blocking(move || {
        zk.restart();
        zk
    })
    .await
    .unwrap();
    // Wait until the store's session serves again (a read, which needs the identity's
    // READ), then one acquire, which needs its CREATE.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while let Err(e) = alice.inspect(&first).await {
        assert!(
            e.is_retryable() && tokio::time::Instant::now() < deadline,
            "the store did not serve again after the restart: {e}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let outcome = alice
        .acquire(&key("after"), &OwnerToken::random(), TTL)
        .await
        .expect("the acquire after the reconnect");
    assert!(
        matches!(outcome, AcquireOutcome::Acquired { .. }),
        "{outcome:?}"
    );
    drop(zk);
}
