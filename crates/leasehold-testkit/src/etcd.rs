//! A private single-member `etcd` (v3 API) on its own client and peer ports and its own
//! temporary data directory.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::free_port;
use crate::process::ServerProcess;
use crate::ready::{self, ReadyError};
use crate::util;

/// How long etcd may take to report itself healthy after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A private single-member `etcd` process: client and peer ports on 127.0.0.1, its own
/// temporary data directory, a 50 ms heartbeat and a 500 ms election timeout (so the
/// smallest lease TTL it grants is 1 s).
///
/// Dropping it kills the server (`SIGKILL`) and removes the directory.
#[derive(Debug)]
pub struct EtcdServer {
    // Field order matters: the process is killed before the directory goes.
    process: Mutex<ServerProcess>,
    port: u16,
    peer_port: u16,
    dir: PathBuf,
    etcd: PathBuf,
    _tmp: TempDir,
}

impl EtcdServer {
    /// Starts a server and waits until its `/health` endpoint reports healthy.
    ///
    /// # Panics
    ///
    /// Panics if `etcd` is not installed (package `etcd-server`) or does not get ready
    /// within 20 s.
    pub fn start() -> Self {
        let etcd = util::find_binary("etcd", "etcd-server");
        let tmp = tempfile::Builder::new()
            .prefix("leasehold-etcd-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory for etcd: {e}"));
        let dir = tmp.path().to_path_buf();
        let peer = std::cell::Cell::new(0u16);
        let (process, port) = ready::start_on_free_port(
            "etcd",
            free_port,
            |port| {
                // `free_port` never hands out a port twice.
                peer.set(free_port());
                spawn(&etcd, &dir, &Member::solo(port, peer.get()))
            },
            wait_ready,
            || is_bind_error(&util::read_log(&dir.join("log"))),
            || {
                format!(
                    "(dir {})\n--- log ---\n{}",
                    dir.display(),
                    util::log_tail(&dir.join("log"), 8192)
                )
            },
        );
        tracing::info!(port, dir = %dir.display(), "etcd ready");
        Self {
            process: Mutex::new(process),
            port,
            peer_port: peer.get(),
            dir,
            etcd,
            _tmp: tmp,
        }
    }

    fn process(&self) -> MutexGuard<'_, ServerProcess> {
        self.process.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port` (the client port).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `etcd://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }

    /// The server's directory (its data directory is `data` inside it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The contents of the server's log file.
    pub fn log(&self) -> String {
        util::read_log(&self.dir.join("log"))
    }

    crate::process::control_methods!();

    /// Shuts the server down cleanly (`SIGTERM`) and waits for it; kills it if it takes
    /// more than 30 s.
    pub fn stop(&self) {
        self.process()
            .terminate(Signal::SIGTERM, Duration::from_secs(30));
    }

    /// Starts the server again on the same ports and data directory, after
    /// [`kill`](Self::kill) or [`stop`](Self::stop), and waits until it is healthy.
    ///
    /// # Panics
    ///
    /// Panics if the server is still running or does not get ready.
    pub fn start_again(&self) {
        let mut guard = self.process();
        assert!(
            !guard.is_running(),
            "etcd on port {} is still running: kill or stop it first",
            self.port
        );
        let process = spawn(
            &self.etcd,
            &self.dir,
            &Member::solo(self.port, self.peer_port),
        );
        if let Err(e) = wait_ready(&process, self.port) {
            drop(process);
            panic!(
                "etcd restart on port {} {e}\n--- log ---\n{}",
                self.port,
                util::log_tail(&self.dir.join("log"), 8192)
            );
        }
        *guard = process;
        tracing::info!(port = self.port, "etcd restarted");
    }

    /// Crash-restarts the server: `SIGKILL`, then start again on the same ports and data
    /// directory (etcd syncs its write-ahead log before it answers, so acknowledged
    /// writes survive).
    pub fn restart(&self) {
        self.kill();
        self.start_again();
    }

    /// Whether the server answers `GET /health` with `"health":"true"` right now.
    pub fn is_healthy(&self) -> bool {
        health(self.port)
    }
}

fn is_bind_error(log: &str) -> bool {
    log.contains("address already in use")
}

/// How one member is started: its name, ports, and the cluster it belongs to.
pub(crate) struct Member<'a> {
    pub(crate) name: &'a str,
    pub(crate) port: u16,
    pub(crate) peer: u16,
    /// `--initial-cluster`: `name=http://127.0.0.1:peer,…`.
    pub(crate) cluster: String,
    /// `--initial-cluster-token`.
    pub(crate) token: &'a str,
}

impl Member<'_> {
    fn solo(port: u16, peer: u16) -> Self {
        Member {
            name: "solo",
            port,
            peer,
            cluster: format!("solo=http://127.0.0.1:{peer}"),
            token: "etcd-cluster",
        }
    }
}

/// Spawns one etcd member with its data directory `data` and its log `log` in `dir`.
pub(crate) fn spawn(bin: &Path, dir: &Path, member: &Member<'_>) -> ServerProcess {
    let port = member.port;
    let client = format!("http://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{}", member.peer);
    let mut cmd = Command::new(bin);
    cmd.current_dir(dir)
        .arg("--name")
        .arg(member.name)
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
        .arg(&member.cluster)
        .arg("--initial-cluster-token")
        .arg(member.token)
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

pub(crate) fn wait_ready(process: &ServerProcess, port: u16) -> Result<(), ReadyError> {
    ready::wait_ready(process, READY_TIMEOUT, Duration::from_millis(50), || {
        health(port)
    })
}

/// `GET /health` on the client port; true when the body says `"health":"true"` (the
/// member is up and sees a leader).
pub(crate) fn health(port: u16) -> bool {
    http_get(port, "/health", 4096).is_some_and(|t| t.contains("\"health\":\"true\""))
}

/// `GET path` on the client port (HTTP/1.0, so the server closes the connection after
/// its answer): the first `limit` bytes of the answer, or `None` when nothing answered.
pub(crate) fn http_get(port: u16, path: &str, limit: u64) -> Option<String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut buf = Vec::new();
    let _ = stream.take(limit).read_to_end(&mut buf);
    (!buf.is_empty()).then(|| String::from_utf8_lossy(&buf).into_owned())
}
