//! A private Redis Cluster of masters only.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::redis::{PortKind, RedisOptions, RedisServer, cli_tls_args, tls_params};
use crate::server::Home;
use crate::tls::{ServerCert, TlsFiles};
use crate::util;

/// How long the nodes may take to agree on `cluster_state:ok`.
const STATE_OK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `redis-cli --cluster create` may take.
const CREATE_TIMEOUT: Duration = Duration::from_secs(120);

/// A private Redis Cluster: `masters` master nodes (no replicas), each a
/// [`RedisServer`] started with `--cluster-enabled yes` in its own
/// subdirectory of one temporary directory, slots spread by
/// `redis-cli --cluster create`.
///
/// Every node's port `P` has `P + 10000` free for the cluster bus. Dropping
/// the cluster kills every node and removes the directory.
///
/// Started with TLS ([`start_tls`](Self::start_tls), or [`RedisOptions::tls`] given to
/// [`start_with`](Self::start_with)), every node listens with TLS only on `P` (no plaintext
/// port) and the cluster bus on `P + 10000` speaks TLS too (`tls-cluster yes`).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    ids: Vec<String>,
    _root: TempDir,
    /// Holds the TLS files of [`start_tls`](Self::start_tls) (removed on drop, after the
    /// nodes are killed).
    _tls_home: Option<TempDir>,
}

impl RedisCluster {
    /// Starts a 3-master cluster.
    ///
    /// # Panics
    ///
    /// See [`start`](Self::start).
    pub fn start_default() -> Self {
        Self::start(3)
    }

    /// Starts `masters` nodes, joins them into a cluster and waits until every
    /// node reports `cluster_state:ok` (30 s at most).
    ///
    /// # Panics
    ///
    /// Panics if `masters < 3` (the minimum `redis-cli --cluster create`
    /// accepts), if `redis-server`/`redis-cli` are missing, or if the cluster
    /// does not form in time.
    pub fn start(masters: usize) -> Self {
        Self::start_with(masters, RedisOptions::default())
    }

    /// Starts `masters` nodes over TLS only, with fresh certificates ([`TlsFiles`], see
    /// [`tls`](Self::tls)): each node presents `cert`, trusts the CA, listens with TLS on
    /// its port and on no plaintext port, and speaks TLS on the cluster bus and for
    /// replication (`tls-cluster yes`, `tls-replication yes`, with the client
    /// certificate). With `client_auth`, every node requires a client certificate signed
    /// by the CA. [`url`](Self::url) is then `rediss+cluster://…?tls_ca=…`.
    ///
    /// # Panics
    ///
    /// See [`start`](Self::start).
    pub fn start_tls(masters: usize, cert: ServerCert, client_auth: bool) -> Self {
        let home = util::temp_dir("leasehold-redis-cluster-tls-");
        let files = TlsFiles::create(home.path());
        let mut opts = RedisOptions::new().tls(files, cert);
        if client_auth {
            opts = opts.tls_client_auth();
        }
        let mut cluster = Self::start_with(masters, opts);
        cluster._tls_home = Some(home);
        cluster
    }

    /// Like [`start`](Self::start), with extra options for every node (the
    /// cluster settings are appended to `opts.extra_args`; a password is not
    /// supported by the helpers here). With [`RedisOptions::tls`], the cluster bus
    /// speaks TLS too (`--tls-cluster yes`) and the cluster is joined over TLS.
    ///
    /// # Panics
    ///
    /// See [`start`](Self::start).
    pub fn start_with(masters: usize, opts: RedisOptions) -> Self {
        assert!(
            masters >= 3,
            "a Redis Cluster needs at least 3 masters, {masters} requested"
        );
        assert!(
            opts.effective_password().is_none(),
            "RedisCluster does not support passwords"
        );
        let root = tempfile::Builder::new()
            .prefix("leasehold-redis-cluster-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory for the cluster: {e}"));
        let nodes: Vec<RedisServer> = (0..masters)
            .map(|n| {
                let dir = root.path().join(n.to_string());
                std::fs::create_dir_all(&dir)
                    .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
                let node_opts = opts.clone().args([
                    "--cluster-enabled".to_string(),
                    "yes".to_string(),
                    "--cluster-config-file".to_string(),
                    dir.join("nodes.conf").to_string_lossy().into_owned(),
                    "--cluster-node-timeout".to_string(),
                    "2000".to_string(),
                ]);
                let node_opts = if node_opts.tls.is_some() {
                    node_opts.args(["--tls-cluster", "yes"])
                } else {
                    node_opts
                };
                RedisServer::launch(Home::In(dir), node_opts, PortKind::WithBus)
            })
            .collect();

        let redis_cli = util::find_binary("redis-cli", "redis-tools");
        let mut create = Command::new(redis_cli);
        if let Some(files) = &opts.tls {
            create.args(cli_tls_args(files));
        }
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        create.args(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = util::run_with_timeout(&mut create, CREATE_TIMEOUT, "redis-cli --cluster create");
        if !out.status.success() {
            panic!(
                "redis-cli --cluster create failed: {}",
                util::describe_output(&out)
            );
        }

        let ids = nodes
            .iter()
            .map(|node| {
                let id = node.cli(&["CLUSTER", "MYID"]);
                assert!(
                    id.len() == 40,
                    "unexpected CLUSTER MYID answer from port {}: {id:?}",
                    node.port()
                );
                id
            })
            .collect();
        let cluster = Self {
            nodes,
            ids,
            _root: root,
            _tls_home: None,
        };
        cluster.wait_state_ok(STATE_OK_TIMEOUT);
        tracing::info!(ports = ?cluster.ports(), "redis cluster ready");
        crate::proof::record(crate::proof::Injected::ServerStarted(
            crate::proof::REDIS_CLUSTER,
        ));
        cluster
    }

    /// The nodes, in creation order (node `i` got the `i`-th slot range).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node number `idx`.
    ///
    /// # Panics
    ///
    /// Panics if `idx` is out of range.
    pub fn node(&self, idx: usize) -> &RedisServer {
        &self.nodes[idx]
    }

    /// The 40-character cluster node ID of node `idx`.
    pub fn node_id(&self, idx: usize) -> &str {
        &self.ids[idx]
    }

    /// The node ports, in node order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The node addresses, in node order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(RedisServer::addr).collect()
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…/` with every node as a seed; for a
    /// TLS cluster `rediss+cluster://…/?tls_ca=CA` (with `&tls_cert=…&tls_key=…` when
    /// the nodes require a client certificate).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let opts = self.nodes[0].options();
        match &opts.tls {
            None => format!("redis+cluster://{}/", hosts.join(",")),
            Some(files) => format!(
                "rediss+cluster://{}/?{}",
                hosts.join(","),
                tls_params(files, opts.tls_client_auth)
            ),
        }
    }

    /// The certificates of a cluster started with TLS (`None` without).
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.nodes[0].tls()
    }

    /// `redis://127.0.0.1:P/` for every node (`rediss://…` for a TLS cluster: see
    /// [`RedisServer::url`]).
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The first node that is running and not paused (used to ask questions).
    ///
    /// # Panics
    ///
    /// Panics if every node is down or paused.
    pub fn any_live_node(&self) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.is_running() && !n.is_paused())
            .expect("no Redis Cluster node is running and unpaused")
    }

    /// Runs `redis-cli -c -p P ARGS...` against a live node (following
    /// `MOVED`/`ASK` redirections) and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut full = vec!["-c"];
        full.extend_from_slice(args);
        self.any_live_node().cli(&full)
    }

    /// The hash slot of `key`, as the server computes it (`CLUSTER KEYSLOT`).
    ///
    /// # Panics
    ///
    /// Panics if the answer is not a number.
    pub fn keyslot(&self, key: &str) -> u16 {
        let answer = self.any_live_node().cli(&["CLUSTER", "KEYSLOT", key]);
        answer
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("unexpected CLUSTER KEYSLOT answer: {answer:?}"))
    }

    /// The index of the node that owns `slot`, as seen by a live node.
    ///
    /// # Panics
    ///
    /// Panics if no known node owns the slot.
    pub fn node_index_for_slot(&self, slot: u16) -> usize {
        let asker = self.any_live_node();
        self.owner_seen_by(asker, slot).unwrap_or_else(|| {
            panic!(
                "no node owns slot {slot} according to port {}:\n{}",
                asker.port(),
                asker.cli(&["CLUSTER", "NODES"])
            )
        })
    }

    /// The node that owns `slot`, as seen by a live node.
    ///
    /// # Panics
    ///
    /// Panics if no known node owns the slot.
    pub fn node_for_slot(&self, slot: u16) -> &RedisServer {
        &self.nodes[self.node_index_for_slot(slot)]
    }

    /// The index of the node owning `slot` according to `asker`'s `CLUSTER NODES`.
    fn owner_seen_by(&self, asker: &RedisServer, slot: u16) -> Option<usize> {
        let nodes = asker.cli(&["CLUSTER", "NODES"]);
        let owner_id = nodes.lines().find_map(|line| {
            let mut fields = line.split_whitespace();
            let id = fields.next()?;
            let owns = fields.skip(7).any(|range| slot_in_range(slot, range));
            owns.then_some(id)
        })?;
        self.ids.iter().position(|id| id == owner_id)
    }

    /// Waits until every running, unpaused node reports `cluster_state:ok`.
    ///
    /// # Panics
    ///
    /// Panics with each node's `CLUSTER INFO` if that does not happen within `timeout`.
    pub fn wait_state_ok(&self, timeout: Duration) {
        let ok = util::poll_until(timeout, Duration::from_millis(100), || {
            self.nodes
                .iter()
                .filter(|n| n.is_running() && !n.is_paused())
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
                .then_some(())
        });
        if ok.is_none() {
            let infos: Vec<String> = self
                .nodes
                .iter()
                .filter(|n| n.is_running() && !n.is_paused())
                .map(|n| format!("port {}:\n{}", n.port(), n.cli(&["CLUSTER", "INFO"])))
                .collect();
            panic!(
                "Redis Cluster not ok within {timeout:?}:\n{}",
                infos.join("\n")
            );
        }
    }

    /// Moves `slot` and all its keys from node `from_idx` to node `to_idx`
    /// with the standard sequence: `CLUSTER SETSLOT slot IMPORTING` on the
    /// target, `MIGRATING` on the source, `MIGRATE` of every key in batches,
    /// then `CLUSTER SETSLOT slot NODE target` on the target, the source and
    /// every other live node. Waits until every live node sees the new owner.
    ///
    /// Paused or killed nodes are skipped (they learn the new owner by gossip).
    /// Keys must not contain newlines.
    ///
    /// # Panics
    ///
    /// Panics if `from_idx` does not own the slot or a step fails.
    pub fn migrate_slot(&self, slot: u16, from_idx: usize, to_idx: usize) {
        assert_ne!(
            from_idx, to_idx,
            "migrate_slot: source and target are the same node"
        );
        let source = &self.nodes[from_idx];
        let target = &self.nodes[to_idx];
        let slot_s = slot.to_string();
        let owner = self.owner_seen_by(source, slot);
        assert_eq!(
            owner,
            Some(from_idx),
            "migrate_slot: slot {slot} is owned by {owner:?}, not node {from_idx}"
        );

        expect_ok(
            target,
            &[
                "CLUSTER",
                "SETSLOT",
                &slot_s,
                "IMPORTING",
                &self.ids[from_idx],
            ],
        );
        expect_ok(
            source,
            &[
                "CLUSTER",
                "SETSLOT",
                &slot_s,
                "MIGRATING",
                &self.ids[to_idx],
            ],
        );
        let target_port = target.port().to_string();
        loop {
            let keys = source.cli(&["CLUSTER", "GETKEYSINSLOT", &slot_s, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let mut args = vec![
                "MIGRATE",
                "127.0.0.1",
                &target_port,
                "",
                "0",
                "10000",
                "KEYS",
            ];
            args.extend(keys.iter().copied());
            let answer = source.cli(&args);
            assert!(
                answer == "OK" || answer == "NOKEY",
                "MIGRATE of slot {slot} from port {} to {} failed: {answer}",
                source.port(),
                target.port()
            );
        }
        let set_node = ["CLUSTER", "SETSLOT", &slot_s, "NODE", &self.ids[to_idx]];
        expect_ok(target, &set_node);
        expect_ok(source, &set_node);
        for (i, node) in self.nodes.iter().enumerate() {
            if i != from_idx && i != to_idx && node.is_running() && !node.is_paused() {
                expect_ok(node, &set_node);
            }
        }
        let agreed = util::poll_until(Duration::from_secs(30), Duration::from_millis(50), || {
            self.nodes
                .iter()
                .filter(|n| n.is_running() && !n.is_paused())
                .all(|n| self.owner_seen_by(n, slot) == Some(to_idx))
                .then_some(())
        });
        assert!(
            agreed.is_some(),
            "after migrating slot {slot} the nodes do not agree that node {to_idx} owns it"
        );
        tracing::info!(slot, from_idx, to_idx, "slot migrated");
    }
}

fn expect_ok(node: &RedisServer, args: &[&str]) {
    let answer = node.cli(args);
    assert_eq!(
        answer,
        "OK",
        "{args:?} on port {} answered {answer:?}",
        node.port()
    );
}

/// Whether `range` (a `CLUSTER NODES` slot field: `N` or `A-B`; migration
/// markers in brackets are ignored) contains `slot`.
fn slot_in_range(slot: u16, range: &str) -> bool {
    if range.starts_with('[') {
        return false;
    }
    match range.split_once('-') {
        Some((a, b)) => match (a.parse::<u16>(), b.parse::<u16>()) {
            (Ok(a), Ok(b)) => (a..=b).contains(&slot),
            _ => false,
        },
        None => range.parse::<u16>() == Ok(slot),
    }
}

#[cfg(test)]
mod tests {
    use super::slot_in_range;

    #[test]
    fn slot_ranges() {
        assert!(slot_in_range(0, "0-5460"));
        assert!(slot_in_range(5460, "0-5460"));
        assert!(!slot_in_range(5461, "0-5460"));
        assert!(slot_in_range(42, "42"));
        assert!(!slot_in_range(42, "[42->-abc]"));
        assert!(!slot_in_range(42, "connected"));
    }
}
