//! A private three-member etcd cluster: each member on its own client and peer ports, in
//! its own data directory, one member at a time killed, restarted or paused.

use std::path::Path;
use std::sync::atomic::AtomicU16;
use std::time::Duration;

use tempfile::TempDir;

use crate::EtcdServer;
use crate::etcd::Launcher;
use crate::free_port;
use crate::server::{Home, Launch, Server};
use crate::util;

/// How long the members may take to elect a leader and report healthy.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How many times a first start is tried (a port taken by another test process meanwhile).
const START_ATTEMPTS: usize = 3;
/// The size of cluster started by [`EtcdCluster::start`].
const MEMBERS: usize = 3;

/// A private three-member etcd cluster (members `e1`..`e3`), each member a direct child
/// of the test process with its own client and peer ports on 127.0.0.1 and its own data
/// directory under one temporary directory; a 50 ms heartbeat and a 500 ms election
/// timeout, as [`EtcdServer`](crate::EtcdServer).
///
/// Dropping it kills every member (`SIGKILL`) and removes the directory.
#[derive(Debug)]
pub struct EtcdCluster {
    // Field order matters: the members are killed before the directory goes.
    members: Vec<EtcdServer>,
    _root: TempDir,
}

impl EtcdCluster {
    /// Starts three members and waits until every one reports healthy (a leader is
    /// elected).
    ///
    /// # Panics
    ///
    /// Panics if `etcd` is not installed (package `etcd-server`) or the cluster does not
    /// form within 30 s.
    pub fn start() -> Self {
        let etcd = util::find_binary("etcd", "etcd-server");
        let mut last_logs = String::new();
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(&etcd) {
                Ok(cluster) => return cluster,
                Err(logs) => last_logs = logs,
            }
        }
        panic!("the etcd cluster did not form\n{last_logs}");
    }

    fn try_start(etcd: &Path) -> Result<Self, String> {
        let root = util::temp_dir("leasehold-etcd-cluster-");
        let ports: Vec<(u16, u16)> = (0..MEMBERS).map(|_| (free_port(), free_port())).collect();
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("e{}=http://127.0.0.1:{peer}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("leasehold-{}", ports[0].0);
        let mut members = Vec::new();
        for (i, &(port, peer_port)) in ports.iter().enumerate() {
            let name = format!("e{}", i + 1);
            let dir = root.path().join(&name);
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
            let launcher = Launcher {
                etcd: etcd.to_path_buf(),
                name,
                peer: AtomicU16::new(peer_port),
                metrics: AtomicU16::new(0),
                cluster: Some(cluster.clone()),
                token: token.clone(),
                ready_timeout: READY_TIMEOUT,
                tls: None,
                auth_token_ttl_secs: None,
                info_log: false,
            };
            let process = launcher.spawn(&dir, port);
            members.push(EtcdServer {
                server: Server::new(process, port, launcher, Home::In(dir)),
            });
        }
        let cluster = Self {
            members,
            _root: root,
        };
        let formed = util::poll_until(READY_TIMEOUT, Duration::from_millis(100), || {
            cluster
                .members
                .iter()
                .all(|m| m.is_running() && m.is_healthy())
                .then_some(())
        });
        match formed {
            Some(()) => {
                tracing::info!(ports = ?cluster.endpoints(), "etcd cluster ready");
                Ok(cluster)
            }
            None => Err(cluster.logs()),
        }
    }

    /// The last lines of every member's log.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                format!(
                    "--- {} (port {}, dir {}) ---\n{}",
                    m.name(),
                    m.port(),
                    m.dir().display(),
                    util::log_tail(&m.dir().join("log"), 4096)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The members, `e1` first.
    pub fn members(&self) -> &[EtcdServer] {
        &self.members
    }

    /// Member `i` (0-based).
    ///
    /// # Panics
    ///
    /// Panics if `i` is not below 3.
    pub fn member(&self, i: usize) -> &EtcdServer {
        &self.members[i]
    }

    /// Every member's `127.0.0.1:port`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port()))
            .collect()
    }

    /// `etcd://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3`: every member.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    /// The member that says it is the leader right now, if one does (a paused member is
    /// not asked: it would not answer).
    pub fn leader(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.is_running() && !m.is_paused() && m.is_leader())
    }

    /// Waits up to `timeout` for a member to say it is the leader.
    pub fn wait_for_leader(&self, timeout: Duration) -> Option<usize> {
        util::poll_until(timeout, Duration::from_millis(50), || self.leader())
    }

    /// Starts member `i` again on its ports and data directory, after a kill, and waits
    /// until it reports healthy (it has rejoined and sees a leader).
    ///
    /// # Panics
    ///
    /// Panics if the member is still running or does not get healthy within 30 s.
    pub fn start_again(&self, i: usize) {
        self.members[i].start_again();
    }

    /// Freezes every member (`SIGSTOP`).
    pub fn pause_all(&self) {
        for m in &self.members {
            m.pause();
        }
    }

    /// Continues every paused member (`SIGCONT`).
    pub fn resume_all(&self) {
        for m in &self.members {
            if m.is_paused() {
                m.resume();
            }
        }
    }
}
