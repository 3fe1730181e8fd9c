//! A private single-member `etcd` (v3 API) on its own client and peer ports and its own
//! temporary data directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::free_port;
use crate::process::ServerProcess;
use crate::ready::{self, ReadyError};
use crate::server::{Home, Launch, Server};
use crate::util;

/// How long etcd may take to report itself healthy after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A private `etcd` process: client and peer ports on 127.0.0.1, its own data directory, a
/// 50 ms heartbeat and a 500 ms election timeout (so the smallest lease TTL it grants is
/// 1 s). [`start`](Self::start) makes a single-member cluster in a temporary directory; an
/// [`EtcdCluster`](crate::EtcdCluster)'s members are servers too. A crash-restart keeps
/// every acknowledged write (etcd syncs its write-ahead log before it answers).
///
/// Dropping it kills the server (`SIGKILL`) and removes its own directory.
#[derive(Debug)]
pub struct EtcdServer {
    pub(crate) server: Server<Launcher>,
}

impl EtcdServer {
    /// Starts a server and waits until its `/health` endpoint reports healthy.
    ///
    /// # Panics
    ///
    /// Panics if `etcd` is not installed (package `etcd-server`) or does not get ready
    /// within 20 s.
    pub fn start() -> Self {
        let launcher = Launcher {
            etcd: util::find_binary("etcd", "etcd-server"),
            name: "solo".to_owned(),
            peer: AtomicU16::new(0),
            cluster: None,
            token: "etcd-cluster".to_owned(),
            ready_timeout: READY_TIMEOUT,
        };
        let home = Home::Own(util::temp_dir("leasehold-etcd-"));
        Self {
            server: Server::start(launcher, home),
        }
    }

    /// The member's name (`solo`; `e1`, `e2`, `e3` in a cluster).
    pub fn name(&self) -> &str {
        &self.server.launch().name
    }

    /// `etcd://127.0.0.1:port`: this member only.
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port())
    }

    /// The server's directory (its data directory is `data` inside it).
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// The contents of the server's log file.
    pub fn log(&self) -> String {
        self.server.log()
    }

    crate::server::server_methods!(
        "The client port on 127.0.0.1.",
        "`127.0.0.1:port` (the client port)."
    );

    /// Shuts the server down cleanly (`SIGTERM`) and waits for it; kills it if it takes
    /// more than 30 s.
    pub fn stop(&self) {
        self.server.stop(Signal::SIGTERM, Duration::from_secs(30));
    }

    crate::server::restart_methods!();

    /// Whether the server answers `GET /health` with `"health":"true"` right now (it is
    /// up and sees a leader).
    pub fn is_healthy(&self) -> bool {
        health(self.port())
    }

    /// Whether the server says it is the leader right now (`etcd_server_is_leader 1` in
    /// its `/metrics`); false when it does not answer.
    pub fn is_leader(&self) -> bool {
        http_get(self.port(), "/metrics", 8 << 20)
            .is_some_and(|m| m.lines().any(|l| l.trim() == "etcd_server_is_leader 1"))
    }
}

/// How one etcd member is started: its name, its peer port, and the cluster it belongs to.
#[derive(Debug)]
pub(crate) struct Launcher {
    pub(crate) etcd: PathBuf,
    pub(crate) name: String,
    /// The peer port (a lone server picks it with its client port).
    pub(crate) peer: AtomicU16,
    /// `--initial-cluster`: `name=http://127.0.0.1:peer,…`; `None` for a lone server.
    pub(crate) cluster: Option<String>,
    /// `--initial-cluster-token`.
    pub(crate) token: String,
    /// How long the member may take to report itself healthy.
    pub(crate) ready_timeout: Duration,
}

impl Launch for Launcher {
    const NAME: &'static str = crate::proof::ETCD;
    const REPLICATED: bool = true;
    const LOGS: &'static [&'static str] = &["log"];
    const PORT_TAKEN: &'static [&'static str] = &["address already in use"];

    fn pick_port(&self) -> u16 {
        let port = free_port();
        // `free_port` never hands out a port twice.
        self.peer.store(free_port(), Ordering::Relaxed);
        port
    }

    /// Spawns the member with its data directory `data` and its log `log` in `dir`.
    fn spawn(&self, dir: &Path, port: u16) -> ServerProcess {
        let peer = self.peer.load(Ordering::Relaxed);
        let client = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let cluster = (self.cluster.clone()).unwrap_or_else(|| format!("{}={peer_url}", self.name));
        let mut cmd = Command::new(&self.etcd);
        cmd.current_dir(dir)
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer_url)
            .arg("--initial-cluster")
            .arg(cluster)
            .arg("--initial-cluster-token")
            .arg(&self.token)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--heartbeat-interval")
            .arg("50")
            .arg("--election-timeout")
            .arg("500")
            // No metrics or pprof listeners beyond the client URL; quiet logs.
            .arg("--log-level")
            .arg("warn")
            .arg("--logger")
            .arg("zap");
        // A service manager's settings must not leak in.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(k);
            }
        }
        ServerProcess::spawn(format!("etcd:{port}"), cmd, &dir.join("log"))
    }

    fn ready(&self, process: &ServerProcess, port: u16) -> Result<(), ReadyError> {
        ready::wait_ready(
            process,
            self.ready_timeout,
            Duration::from_millis(50),
            || health(port),
        )
    }
}

/// `GET /health` on the client port; true when the body says `"health":"true"` (the
/// member is up and sees a leader).
fn health(port: u16) -> bool {
    http_get(port, "/health", 4096).is_some_and(|t| t.contains("\"health\":\"true\""))
}

/// `GET path` on the client port (HTTP/1.0, so the server closes the connection after
/// its answer): the first `limit` bytes of the answer, or `None` when nothing answered.
fn http_get(port: u16, path: &str, limit: usize) -> Option<String> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    util::ask(port, request.as_bytes(), limit, |_| false)
        .map(|a| String::from_utf8_lossy(&a).into_owned())
}
