//! A private `redis-server` on its own port and temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::faketime::FakeWallClock;
use crate::process::ServerProcess;
use crate::ready::{self, ReadyError};
use crate::server::{Home, Launch, Server};
use crate::tls::{ServerCert, TlsFiles};
use crate::util;
use crate::{free_port, free_port_with_bus};

/// How long a Redis server may take to answer `PING` after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a `redis-cli` invocation may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// Options for [`RedisServer::start_with`].
///
/// Command-line settings are applied in this order, later ones winning:
/// the defaults (`--save '' --appendonly no`), then `appendonly`,
/// `password` and `enable_debug_command`, then `extra_args`.
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    /// Sets `--requirepass`; [`RedisServer::cli`] then authenticates with it.
    pub password: Option<String>,
    /// Turns the append-only file on (`--appendonly yes`), so data survives a restart.
    pub appendonly: bool,
    /// Adds `--enable-debug-command yes` (needed for `DEBUG SLEEP`).
    pub enable_debug_command: bool,
    /// Extra `redis-server` arguments, e.g. `["--maxmemory", "10mb"]`.
    pub extra_args: Vec<String>,
    /// Runs the server under this wall clock (libfaketime; its monotonic clock stays the
    /// host's): see [`FakeWallClock::apply_with_glibc_malloc`].
    pub wall_clock: Option<Arc<FakeWallClock>>,
    /// TLS only: the server listens on its port with TLS and on no plaintext port
    /// (`--port 0 --tls-port PORT`), presents [`tls_cert`](Self::tls_cert) from these
    /// files, trusts their CA, and replicates over TLS (`--tls-replication yes`, with the
    /// client certificate). [`RedisServer::cli`] then speaks TLS.
    pub tls: Option<TlsFiles>,
    /// With [`tls`](Self::tls): which certificate the server presents.
    pub tls_cert: ServerCert,
    /// With [`tls`](Self::tls): clients must present a certificate signed by the CA
    /// (`--tls-auth-clients yes`); otherwise one is checked only if presented
    /// (`optional`).
    pub tls_client_auth: bool,
}

impl RedisOptions {
    /// Default options: no password, no persistence, no debug command.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requires this password (`--requirepass`).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Turns the append-only file on or off.
    pub fn appendonly(mut self, on: bool) -> Self {
        self.appendonly = on;
        self
    }

    /// Enables the `DEBUG` command (`--enable-debug-command yes`).
    pub fn enable_debug_command(mut self) -> Self {
        self.enable_debug_command = true;
        self
    }

    /// Runs the server under `clock` (its `TIME`, and the expiry of its keys, follow it).
    pub fn wall_clock(mut self, clock: Arc<FakeWallClock>) -> Self {
        self.wall_clock = Some(clock);
        self
    }

    /// TLS only, the server presenting `cert` from `files` (see [`tls`](Self::tls)).
    pub fn tls(mut self, files: TlsFiles, cert: ServerCert) -> Self {
        self.tls = Some(files);
        self.tls_cert = cert;
        self
    }

    /// With [`tls`](Self::tls): requires a client certificate (mutual TLS).
    pub fn tls_client_auth(mut self) -> Self {
        self.tls_client_auth = true;
        self
    }

    /// Adds one extra `redis-server` argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Adds several extra `redis-server` arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extra_args.extend(args.into_iter().map(Into::into));
        self
    }

    /// The password the server requires: `password`, or a `--requirepass`
    /// found in `extra_args`.
    pub fn effective_password(&self) -> Option<&str> {
        let from_args = self
            .extra_args
            .windows(2)
            .rev()
            .find(|w| w[0] == "--requirepass")
            .map(|w| w[1].as_str());
        from_args
            .or(self.password.as_deref())
            .filter(|p| !p.is_empty())
    }
}

/// How a server's port is chosen on a first start.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PortKind {
    /// Any free port.
    Plain,
    /// A port whose +10000 cluster bus port is free too.
    WithBus,
}

/// A private `redis-server` process: own port on 127.0.0.1, own temporary
/// directory (`--dir`, log file), no RDB snapshots. A crash-restart keeps only what the
/// append-only file kept.
///
/// Dropping it kills the server (`SIGKILL`) and removes the directory.
#[derive(Debug)]
pub struct RedisServer {
    server: Server<Launcher>,
    redis_cli: PathBuf,
}

/// How `redis-server` is started: this binary, with these options, on this kind of port.
#[derive(Debug)]
struct Launcher {
    redis_server: PathBuf,
    opts: RedisOptions,
    port_kind: PortKind,
}

impl RedisServer {
    /// Starts a server with default options and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// Panics if `redis-server` is not installed or does not get ready within 10 s.
    pub fn start() -> Self {
        Self::start_with(RedisOptions::default())
    }

    /// Starts a server with `opts` and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// Panics if `redis-server` is not installed or does not get ready within 10 s.
    pub fn start_with(opts: RedisOptions) -> Self {
        let home = Home::Own(util::temp_dir("leasehold-redis-"));
        Self::launch(home, opts, PortKind::Plain)
    }

    /// Starts a server in `home` (which must exist) on a fresh port.
    pub(crate) fn launch(home: Home, opts: RedisOptions, port_kind: PortKind) -> Self {
        let evicts = opts
            .extra_args
            .windows(2)
            .any(|w| w[0] == "--maxmemory-policy" && !w[1].eq_ignore_ascii_case("noeviction"));
        if evicts {
            crate::proof::record(crate::proof::Injected::EvictingPolicy(crate::proof::REDIS));
        }
        let launcher = Launcher {
            redis_server: util::find_binary("redis-server", "redis-server"),
            opts,
            port_kind,
        };
        Self {
            redis_cli: util::find_binary("redis-cli", "redis-tools"),
            server: Server::start(launcher, home),
        }
    }

    /// `redis://127.0.0.1:port/` (never contains the password); for a TLS server
    /// `rediss://127.0.0.1:port/?tls_ca=CA` (with `&tls_cert=…&tls_key=…` when it
    /// requires a client certificate).
    pub fn url(&self) -> String {
        match &self.options().tls {
            None => format!("redis://127.0.0.1:{}/", self.port()),
            Some(files) => format!(
                "rediss://127.0.0.1:{}/?{}",
                self.port(),
                tls_params(files, self.options().tls_client_auth)
            ),
        }
    }

    /// The certificates of a server started with [`RedisOptions::tls`].
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.options().tls.as_ref()
    }

    /// Like [`url`](Self::url) but with the password, if one is set:
    /// `redis://:password@127.0.0.1:port/`.
    pub fn authed_url(&self) -> String {
        match self.options().effective_password() {
            Some(pw) => self.url().replacen("://", &format!("://:{pw}@"), 1),
            None => self.url(),
        }
    }

    /// The options the server was started with.
    pub fn options(&self) -> &RedisOptions {
        &self.server.launch().opts
    }

    /// The server's working directory (`--dir`).
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// The contents of the server's log file.
    pub fn log(&self) -> String {
        self.server.log()
    }

    /// The append-only file that takes the server's writes now: the last incremental
    /// file its manifest names (Redis 7 multi-part AOF, default `appenddirname`
    /// `appendonlydir` and `appendfilename` `appendonly.aof`). Cutting it back to an
    /// earlier length while the server is down loses the writes after that point, as an
    /// operating-system crash loses what was written but not yet synced.
    ///
    /// # Panics
    ///
    /// Panics if the server runs without the append-only file (no manifest) or the
    /// manifest names no incremental file.
    pub fn aof_incr_file(&self) -> PathBuf {
        let aof_dir = self.dir().join("appendonlydir");
        let manifest = aof_dir.join("appendonly.aof.manifest");
        let text = std::fs::read_to_string(&manifest).unwrap_or_else(|e| {
            panic!(
                "no AOF manifest {} (is appendonly on?): {e}",
                manifest.display()
            )
        });
        // Lines: `file <name> seq <n> type <b|h|i>`.
        let name = text
            .lines()
            .filter(|l| {
                l.split_whitespace()
                    .collect::<Vec<_>>()
                    .ends_with(&["type", "i"])
            })
            .filter_map(|l| l.split_whitespace().nth(1))
            .next_back()
            .unwrap_or_else(|| panic!("the AOF manifest names no incremental file:\n{text}"));
        aof_dir.join(name)
    }

    crate::server::server_methods!("The TCP port on 127.0.0.1.", "`127.0.0.1:port`.");

    /// Shuts the server down cleanly (`SIGTERM`: the append-only file, if on,
    /// is flushed) and waits for it; kills it if it takes more than 30 s.
    pub fn stop(&self) {
        self.server.stop(Signal::SIGTERM, Duration::from_secs(30));
    }

    crate::server::restart_methods!();

    /// Clean restart: [`stop`](Self::stop) then [`start_again`](Self::start_again).
    pub fn stop_and_restart(&self) {
        self.stop();
        self.start_again();
    }

    /// A `redis-cli -p PORT ARGS...` command (authenticated when a password
    /// is set), for running it in the background or with custom settings.
    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.redis_cli);
        cmd.arg("-h")
            .arg("127.0.0.1")
            .arg("-p")
            .arg(self.port().to_string());
        if let Some(files) = &self.options().tls {
            cmd.args(cli_tls_args(files));
        }
        if let Some(pw) = self.options().effective_password() {
            cmd.env("REDISCLI_AUTH", pw);
        }
        cmd.args(args);
        cmd
    }

    /// Runs `redis-cli -p PORT ARGS...` and returns its stdout without the
    /// trailing newline (raw output: `OK`, `PONG`, a bare integer, one line
    /// per array element; an error reply reads `ERR ...`).
    ///
    /// # Panics
    ///
    /// Panics if `redis-cli` cannot run, exits non-zero with nothing on
    /// stdout, or takes longer than 60 s (e.g. the server is paused).
    pub fn cli(&self, args: &[&str]) -> String {
        if let ["CONFIG" | "config", "SET" | "set", name, policy] = args
            && name.eq_ignore_ascii_case("maxmemory-policy")
            && !policy.eq_ignore_ascii_case("noeviction")
        {
            crate::proof::record(crate::proof::Injected::EvictingPolicy(crate::proof::REDIS));
        }
        let mut cmd = self.cli_command(args);
        let out = util::run_with_timeout(&mut cmd, CLI_TIMEOUT, "redis-cli");
        let stdout = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
        if !out.status.success() && stdout.is_empty() {
            panic!(
                "redis-cli {args:?} on port {} failed: {}",
                self.port(),
                util::describe_output(&out)
            );
        }
        stdout
    }
}

impl Launch for Launcher {
    const NAME: &'static str = crate::proof::REDIS;
    const LOGS: &'static [&'static str] = &["log", "stdout.log"];
    const PORT_TAKEN: &'static [&'static str] = &["Address already in use", "bind:"];

    fn pick_port(&self) -> u16 {
        match self.port_kind {
            PortKind::Plain => free_port(),
            PortKind::WithBus => free_port_with_bus(),
        }
    }

    fn spawn(&self, dir: &Path, port: u16) -> ServerProcess {
        let opts = &self.opts;
        let mut cmd = Command::new(&self.redis_server);
        cmd.current_dir(dir)
            .arg("--port")
            .arg(port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(dir)
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg(if opts.appendonly { "yes" } else { "no" })
            .arg("--logfile")
            .arg(dir.join("log"))
            .arg("--daemonize")
            .arg("no");
        if let Some(pw) = &opts.password {
            cmd.arg("--requirepass").arg(pw);
        }
        if let Some(files) = &opts.tls {
            let (cert, key) = opts.tls_cert.files(files);
            cmd.args(["--port", "0", "--tls-port"])
                .arg(port.to_string())
                .arg("--tls-cert-file")
                .arg(cert)
                .arg("--tls-key-file")
                .arg(key)
                .arg("--tls-ca-cert-file")
                .arg(files.ca_cert())
                .arg("--tls-client-cert-file")
                .arg(files.client_cert())
                .arg("--tls-client-key-file")
                .arg(files.client_key())
                .args(["--tls-replication", "yes", "--tls-auth-clients"])
                .arg(if opts.tls_client_auth {
                    "yes"
                } else {
                    "optional"
                });
        }
        if opts.enable_debug_command {
            cmd.arg("--enable-debug-command").arg("yes");
        }
        cmd.args(&opts.extra_args);
        if let Some(clock) = &opts.wall_clock {
            clock.apply_with_glibc_malloc(&mut cmd);
        }
        ServerProcess::spawn(format!("redis-server:{port}"), cmd, &dir.join("stdout.log"))
    }

    fn keeps_data(&self) -> bool {
        self.opts.appendonly
    }

    fn ready(&self, process: &ServerProcess, port: u16) -> Result<(), ReadyError> {
        let auth = self.opts.effective_password().is_some();
        if let Some(files) = &self.opts.tls {
            let cli = util::find_binary("redis-cli", "redis-tools");
            return ready::wait_ready(process, READY_TIMEOUT, Duration::from_millis(50), || {
                tls_ping(&cli, files, port, auth)
            });
        }
        ready::wait_ready(process, READY_TIMEOUT, Duration::from_millis(20), || {
            ping(port, auth)
        })
    }
}

/// The URL parameters of a `rediss://` URL trusting `files`' CA (and presenting its
/// client certificate when `client_auth`).
pub(crate) fn tls_params(files: &TlsFiles, client_auth: bool) -> String {
    let mut params = format!("tls_ca={}", files.ca_cert().display());
    if client_auth {
        params.push_str(&format!(
            "&tls_cert={}&tls_key={}",
            files.client_cert().display(),
            files.client_key().display()
        ));
    }
    params
}

/// `redis-cli`'s TLS arguments: trust the CA of `files`, present its client certificate.
pub(crate) fn cli_tls_args(files: &TlsFiles) -> Vec<String> {
    vec![
        "--tls".to_owned(),
        "--cacert".to_owned(),
        files.ca_cert().display().to_string(),
        "--cert".to_owned(),
        files.client_cert().display().to_string(),
        "--key".to_owned(),
        files.client_key().display().to_string(),
    ]
}

/// `PING` over TLS with `redis-cli` (the server certificate's host is not checked: the
/// server may present the wrong-host certificate); `PONG`, or `NOAUTH` when a password
/// is set.
pub(crate) fn tls_ping(cli: &Path, files: &TlsFiles, port: u16, auth: bool) -> bool {
    let mut cmd = Command::new(cli);
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(cli_tls_args(files))
        .arg("PING");
    let out = util::run_with_timeout(&mut cmd, Duration::from_secs(5), "redis-cli");
    let text = String::from_utf8_lossy(&out.stdout);
    text.starts_with("PONG") || (auth && text.contains("NOAUTH"))
}

/// Sends an inline `PING` and checks for `+PONG` (or `-NOAUTH` when a password is set).
pub(crate) fn ping(port: u16, auth: bool) -> bool {
    util::ask(port, b"PING\r\n", 64, |a| a.contains(&b'\n'))
        .is_some_and(|a| a.starts_with(b"+PONG") || (auth && a.starts_with(b"-NOAUTH")))
}
