//! Redis Cluster over TLS (`rediss+cluster://`) against a private 3-master cluster whose
//! nodes listen with TLS only (`port 0`, no plaintext port) and speak TLS on the cluster
//! bus too (`tls-cluster yes`), requiring a client certificate:
//!
//! - grant, renew, release and fenced records on every node, reached from one seed: the
//!   other nodes, found through `CLUSTER SLOTS`, are reached over verified TLS as well;
//! - refusals, each an error within a bound (no hang): a plaintext `redis+cluster://`
//!   client, a client trusting another CA (typed [`TlsProblem::UntrustedCertificate`]),
//!   nodes whose certificate names another host (typed [`TlsProblem::WrongHost`]); none
//!   shows the URL's password or a line of a key.

use leasehold_testkit::renderings;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, Fence, Key, OwnerToken, ReleaseOutcome, RenewOutcome, Store, StoreError,
    StoreErrorKind,
};
use leasehold_redis::{RedisStore, TlsFailure, TlsProblem};
use leasehold_testkit::tls::WRONG_HOST;
use leasehold_testkit::{RedisCluster, ServerCert, TlsFiles};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);
/// A password put in the refused URLs: it must not show in their errors.
const PW: &str = "cl5ster-TLS-password-q";
/// Timeouts far above what a refusal may take: an error that comes well before them was
/// not waited for (`REFUSED_WITHIN`).
const PATIENT: &str = "timeout=20s&connect_timeout=20s";
/// How soon a refusal must come, even on a loaded machine: well below `PATIENT`.
const REFUSED_WITHIN: Duration = Duration::from_secs(8);

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

async fn tls_cluster(cert: ServerCert, client_auth: bool) -> Arc<RedisCluster> {
    Arc::new(blocking(move || RedisCluster::start_tls(3, cert, client_auth)).await)
}

/// `host:port,…` of every node (the URL's authority without a scheme).
fn hosts(cluster: &RedisCluster) -> String {
    cluster
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Asserts that `text` shows neither [`PW`] nor a line of the client's or server's key.
fn assert_no_secret(what: &str, text: &str, tls: &TlsFiles) {
    assert!(!text.contains(PW), "{what} shows the password:\n{text}");
    for file in [tls.client_key(), tls.server_key(), tls.wrong_host_key()] {
        let key = std::fs::read_to_string(file).unwrap();
        for line in key.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!text.contains(line), "{what} shows a key:\n{text}");
        }
    }
}

/// The TLS failure of `e`, which must be a non-retryable configuration error.
fn tls_failure(e: &StoreError) -> &TlsFailure {
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(!e.is_retryable(), "{e}");
    TlsFailure::of(e).unwrap_or_else(|| panic!("no TlsFailure behind: {e}"))
}

/// For each node, in node order, a key whose lease lives on that node.
async fn key_per_node(cluster: &Arc<RedisCluster>, store: &RedisStore) -> Vec<Key> {
    let mut found: Vec<Option<Key>> = vec![None; cluster.nodes().len()];
    for i in 0..200 {
        if found.iter().all(Option::is_some) {
            break;
        }
        let k = Key::new(format!("job:cluster-tls-{i}")).unwrap();
        let lease_key = store.lease_key(&k);
        let c = cluster.clone();
        let node = blocking(move || c.node_index_for_slot(c.keyslot(&lease_key))).await;
        found[node].get_or_insert(k);
    }
    found
        .into_iter()
        .enumerate()
        .map(|(i, k)| k.unwrap_or_else(|| panic!("no key of 200 lands on node {i}")))
        .collect()
}

/// Grant, renew, release and fenced records on every node of a TLS-only cluster that
/// requires client certificates, reached from one seed: the client finds the other
/// nodes through `CLUSTER SLOTS` and reaches them over verified TLS too. A record written
/// with an older fence after a newer one is kept at the newer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_renew_release_and_fenced_writes_on_every_node_over_tls() {
    let cluster = tls_cluster(ServerCert::Localhost, true).await;
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    assert!(url.contains("tls_cert="), "{url}");
    // One seed only: the two other nodes are learnt from the cluster.
    let seed = cluster.ports()[0];
    let query = url.split_once('?').unwrap().1;
    let store = RedisStore::open(&format!(
        "rediss+cluster://127.0.0.1:{seed}/?{query}&timeout=3s&connect_timeout=3s&prefix=ctls:"
    ))
    .await
    .expect("open over TLS with a client certificate");
    assert!(store.is_cluster());

    let keys = key_per_node(&cluster, &store).await;
    for (node, k) in keys.iter().enumerate() {
        let me = OwnerToken::random();
        let AcquireOutcome::Acquired { fence: f1, .. } = store.acquire(k, &me, TTL).await.unwrap()
        else {
            panic!("{k} (node {node}): a free key was not granted");
        };
        assert!(matches!(
            store.renew(k, &me, TTL).await.unwrap(),
            RenewOutcome::Renewed { .. }
        ));
        // The lease is on the node that owns its slot (read over TLS by redis-cli).
        let lease_key = store.lease_key(k);
        let on_node = {
            let c = cluster.clone();
            blocking(move || c.node(node).cli(&["GET", &lease_key])).await
        };
        assert_eq!(
            on_node,
            format!("{}:{f1}", me.to_hex()),
            "{k} on node {node}"
        );
        let other = OwnerToken::random();
        assert!(matches!(
            store.acquire(k, &other, TTL).await.unwrap(),
            AcquireOutcome::Held { .. }
        ));

        // A record written with the lease's fence, in the lease's slot.
        let rec = store.put_record(k, f1, b"first").await.unwrap();
        assert_eq!((rec.fence, rec.value.as_slice()), (f1, &b"first"[..]));
        assert_eq!(
            store.release(k, &me).await.unwrap(),
            ReleaseOutcome::Released
        );
        assert!(store.inspect(k).await.unwrap().is_none());

        // The next holder's fence is higher; a write with the older one is kept out.
        let AcquireOutcome::Acquired { fence: f2, .. } =
            store.acquire(k, &other, TTL).await.unwrap()
        else {
            panic!("{k}: not granted after the release");
        };
        assert!(f2 > f1, "{f2} after {f1}");
        store.put_record(k, f2, b"second").await.unwrap();
        let stale = store.put_record(k, f1, b"stale").await.unwrap();
        assert_eq!(
            (stale.fence, stale.value.as_slice()),
            (f2, &b"second"[..]),
            "a write with the older fence {f1} was taken over {f2}"
        );
        let read = store.get_record(k).await.unwrap().expect("the record");
        assert_eq!((read.fence, read.value.as_slice()), (f2, &b"second"[..]));
        assert!(read.fence > Fence(0));
        assert_eq!(
            store.release(k, &other).await.unwrap(),
            ReleaseOutcome::Released
        );
    }
}

/// Against TLS-only nodes: a plaintext `redis+cluster://` client is refused (the nodes
/// drop what is not a TLS handshake) with an error, soon, not after its timeouts; a
/// client trusting another CA is refused with a typed, non-retryable error naming the
/// host. Neither shows the URL's password or a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_and_another_ca_are_refused_soon() {
    let cluster = tls_cluster(ServerCert::Localhost, true).await;
    let tls = cluster.tls().unwrap().clone();
    let hosts = hosts(&cluster);

    // Plaintext to TLS-only ports.
    let plain = format!("redis+cluster://:{PW}@{hosts}/?{PATIENT}");
    let started = Instant::now();
    let e = RedisStore::open(&plain).await.map(|_| ()).unwrap_err();
    let took = started.elapsed();
    // The node resets the connection; the store then finds that the seeds speak TLS and
    // says so, typed, naming the scheme to use.
    let t = tls_failure(&e);
    assert_eq!(t.problem(), TlsProblem::PlaintextRefused, "{e}");
    assert_eq!(t.host(), Some("127.0.0.1"), "{e}");
    assert!(e.to_string().contains("(rediss+cluster://)"), "{e}");
    assert!(
        took < REFUSED_WITHIN,
        "a plaintext client was refused after {took:?}, not at once: {e}"
    );
    assert_no_secret("a plaintext connect's error", &renderings(&e), &tls);

    // Another CA: the nodes' certificates are not trusted.
    let other_ca = format!(
        "rediss+cluster://:{PW}@{hosts}/?{PATIENT}&tls_ca={}&tls_cert={}&tls_key={}",
        tls.wrong_ca_cert().display(),
        tls.client_cert().display(),
        tls.client_key().display(),
    );
    let started = Instant::now();
    let e = RedisStore::open(&other_ca).await.map(|_| ()).unwrap_err();
    let took = started.elapsed();
    let t = tls_failure(&e);
    assert_eq!(t.problem(), TlsProblem::UntrustedCertificate, "{e}");
    assert_eq!(t.host(), Some("127.0.0.1"), "{e}");
    assert!(e.to_string().contains("tls_ca"), "what to do: {e}");
    assert!(
        took < REFUSED_WITHIN,
        "refused after {took:?}, not at once: {e}"
    );
    assert_no_secret("a failed TLS handshake to a node", &renderings(&e), &tls);
}

/// Nodes whose certificate names only another host: refused with a typed error naming
/// the host connected to and what the certificate names, soon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_is_refused_naming_the_host() {
    let cluster = tls_cluster(ServerCert::WrongHost, false).await;
    let tls = cluster.tls().unwrap().clone();
    let url = format!(
        "rediss+cluster://:{PW}@{}/?{PATIENT}&tls_ca={}",
        hosts(&cluster),
        tls.ca_cert().display()
    );
    let started = Instant::now();
    let e = RedisStore::open(&url).await.map(|_| ()).unwrap_err();
    let took = started.elapsed();
    let t = tls_failure(&e);
    assert_eq!(t.problem(), TlsProblem::WrongHost, "{e}");
    assert_eq!(t.host(), Some("127.0.0.1"), "{e}");
    let text = e.to_string();
    assert!(text.contains("`127.0.0.1`"), "the host: {text}");
    assert!(
        text.contains(WRONG_HOST),
        "what the certificate names: {text}"
    );
    assert!(
        took < REFUSED_WITHIN,
        "refused after {took:?}, not at once: {e}"
    );
    assert_no_secret("a certificate for another host", &renderings(&e), &tls);
}
