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
use crate::tls::{ServerCert, TlsFiles};
use crate::util;

/// Options for [`EtcdServer::start_with`].
#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    /// TLS on the client port: fresh certificates ([`TlsFiles`], in `DIR/tls`), the
    /// server presenting the one named here (`--cert-file`, `--key-file`,
    /// `--trusted-ca-file`), an `https://` client URL only (a plaintext client cannot
    /// talk to it). `/health` and `/metrics` move to a plaintext metrics port
    /// (`--listen-metrics-urls`), which the readiness check reads. `None`: no TLS.
    pub tls: Option<ServerCert>,
    /// With [`tls`](Self::tls): `--client-cert-auth`, every client must present a
    /// certificate signed by the test CA.
    pub client_cert_auth: bool,
    /// `--auth-token-ttl` in seconds: how long a simple auth token lives after its last
    /// use (etcd's default is 300).
    pub auth_token_ttl_secs: Option<u32>,
    /// Log at `info` rather than `warn` (e.g. to see `deleted a simple token` when an
    /// auth token expires).
    pub info_log: bool,
}

impl EtcdOptions {
    /// Default options: no TLS, etcd's token TTL, `warn` logs.
    pub fn new() -> Self {
        Self::default()
    }

    /// TLS on the client port, the server presenting `cert` (see [`tls`](Self::tls)).
    pub fn tls(mut self, cert: ServerCert) -> Self {
        self.tls = Some(cert);
        self
    }

    /// Requires a client certificate (see
    /// [`client_cert_auth`](Self::client_cert_auth)); turns TLS on if it is not.
    pub fn client_cert_auth(mut self) -> Self {
        self.tls.get_or_insert(ServerCert::Localhost);
        self.client_cert_auth = true;
        self
    }

    /// `--auth-token-ttl` (see [`auth_token_ttl_secs`](Self::auth_token_ttl_secs)).
    pub fn auth_token_ttl_secs(mut self, secs: u32) -> Self {
        self.auth_token_ttl_secs = Some(secs);
        self
    }

    /// Logs at `info` (see [`info_log`](Self::info_log)).
    pub fn info_log(mut self) -> Self {
        self.info_log = true;
        self
    }
}

/// The TLS files and flags of a member started with TLS.
#[derive(Debug)]
pub(crate) struct LaunchTls {
    files: TlsFiles,
    cert: ServerCert,
    client_cert_auth: bool,
}

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
        Self::start_with(EtcdOptions::new())
    }

    /// Starts a server with `options` and waits until it reports healthy.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start); also when the certificates cannot be written.
    pub fn start_with(options: EtcdOptions) -> Self {
        let dir = util::temp_dir("leasehold-etcd-");
        let tls = options.tls.map(|cert| {
            let tls_dir = dir.path().join("tls");
            std::fs::create_dir(&tls_dir).expect("create DIR/tls");
            LaunchTls {
                files: TlsFiles::create(&tls_dir),
                cert,
                client_cert_auth: options.client_cert_auth,
            }
        });
        let launcher = Launcher {
            etcd: util::find_binary("etcd", "etcd-server"),
            name: "solo".to_owned(),
            peer: AtomicU16::new(0),
            metrics: AtomicU16::new(0),
            cluster: None,
            token: "etcd-cluster".to_owned(),
            ready_timeout: READY_TIMEOUT,
            tls,
            auth_token_ttl_secs: options.auth_token_ttl_secs,
            info_log: options.info_log,
        };
        Self {
            server: Server::start(launcher, Home::Own(dir)),
        }
    }

    /// The certificates of a server started with [`EtcdOptions::tls`] (`None` without
    /// TLS): the CA to trust, the client certificate, and the wrong ones.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.server.launch().tls.as_ref().map(|t| &t.files)
    }

    /// The member's name (`solo`; `e1`, `e2`, `e3` in a cluster).
    pub fn name(&self) -> &str {
        &self.server.launch().name
    }

    /// `etcd://127.0.0.1:port`: this member only (with TLS, add `?tls=true` and the
    /// files: see [`tls`](Self::tls)).
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
        health(self.server.launch().http_port(self.port()))
    }

    /// How many unary gRPC requests of `method` (`Range`, `Txn`, `LeaseGrant`,
    /// `LeaseRevoke`, `LeaseTimeToLive`, ...) the server has handled since it started, or
    /// streams of it started (`LeaseKeepAlive`, `Watch`), from its `/metrics`
    /// (`grpc_server_handled_total` / `grpc_server_started_total`, all codes summed). So a
    /// test can count what a call sent. Panics when the server does not answer.
    pub fn grpc_requests(&self, method: &str) -> u64 {
        let metrics = http_get(
            self.server.launch().http_port(self.port()),
            "/metrics",
            8 << 20,
        )
        .expect("etcd answers GET /metrics");
        let label = format!("grpc_method=\"{method}\"");
        let stream = ["LeaseKeepAlive", "Watch"].contains(&method);
        let counter = if stream {
            "grpc_server_started_total{"
        } else {
            "grpc_server_handled_total{"
        };
        metrics
            .lines()
            .filter(|l| l.starts_with(counter) && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    }

    /// Whether the server says it is the leader right now (`etcd_server_is_leader 1` in
    /// its `/metrics`); false when it does not answer.
    pub fn is_leader(&self) -> bool {
        http_get(
            self.server.launch().http_port(self.port()),
            "/metrics",
            8 << 20,
        )
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
    /// The plaintext metrics port of a member with TLS (picked with its client port).
    pub(crate) metrics: AtomicU16,
    /// `--initial-cluster`: `name=http://127.0.0.1:peer,…`; `None` for a lone server.
    pub(crate) cluster: Option<String>,
    /// `--initial-cluster-token`.
    pub(crate) token: String,
    /// How long the member may take to report itself healthy.
    pub(crate) ready_timeout: Duration,
    /// TLS on the client port; `None`: plaintext.
    pub(crate) tls: Option<LaunchTls>,
    /// `--auth-token-ttl`.
    pub(crate) auth_token_ttl_secs: Option<u32>,
    /// `--log-level info` rather than `warn`.
    pub(crate) info_log: bool,
}

impl Launcher {
    /// The port serving `/health` and `/metrics` in plaintext: the client port, or the
    /// metrics port of a member with TLS.
    fn http_port(&self, client_port: u16) -> u16 {
        match self.tls {
            Some(_) => self.metrics.load(Ordering::Relaxed),
            None => client_port,
        }
    }
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
        if self.tls.is_some() {
            self.metrics.store(free_port(), Ordering::Relaxed);
        }
        port
    }

    /// Spawns the member with its data directory `data` and its log `log` in `dir`.
    fn spawn(&self, dir: &Path, port: u16) -> ServerProcess {
        let peer = self.peer.load(Ordering::Relaxed);
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{port}");
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
            .arg(if self.info_log { "info" } else { "warn" })
            .arg("--logger")
            .arg("zap");
        if let Some(tls) = &self.tls {
            let (cert, key) = tls.cert.files(&tls.files);
            let metrics = self.metrics.load(Ordering::Relaxed);
            cmd.arg("--cert-file")
                .arg(cert)
                .arg("--key-file")
                .arg(key)
                .arg("--trusted-ca-file")
                .arg(tls.files.ca_cert())
                .arg("--listen-metrics-urls")
                .arg(format!("http://127.0.0.1:{metrics}"));
            if tls.client_cert_auth {
                cmd.arg("--client-cert-auth");
            }
        }
        if let Some(ttl) = self.auth_token_ttl_secs {
            cmd.arg("--auth-token-ttl").arg(ttl.to_string());
        }
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
            || health(self.http_port(port)),
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
