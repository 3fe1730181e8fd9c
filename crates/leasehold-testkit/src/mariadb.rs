//! A private MariaDB server on its own port, socket and temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::process::ServerProcess;
use crate::ready::{self, ReadyError};
use crate::server::{Home, Launch, Server};
use crate::tls::{ServerCert, TlsFiles};
use crate::util;

const INSTALL_TIMEOUT: Duration = Duration::from_secs(180);
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const SQL_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Options for [`MariaDb::start_with`].
#[derive(Debug, Clone, Default)]
pub struct MariaDbOptions {
    /// Extra `mariadbd` arguments, e.g. `["--innodb-lock-wait-timeout=5"]`.
    pub extra_args: Vec<String>,
    /// TLS required: fresh certificates ([`TlsFiles`], in `DIR/tls`), the server
    /// presenting the one named here (`--ssl-cert`, `--ssl-key`, `--ssl-ca`), and
    /// `--require-secure-transport=ON` (a plaintext TCP connection is refused). The
    /// kit's own client ([`MariaDb::client_command`]) then connects with TLS, trusting the
    /// test CA. `None`: no TLS (the default).
    pub tls: Option<ServerCert>,
}

impl MariaDbOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requires TLS, the server presenting `cert` (see [`tls`](Self::tls)).
    pub fn tls(mut self, cert: ServerCert) -> Self {
        self.tls = Some(cert);
        self
    }

    /// Adds one extra `mariadbd` argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }
}

/// A private MariaDB server: `mariadb-install-db` into a temporary directory
/// owned by the `mysql` OS user, then `mariadbd --no-defaults --user=mysql`
/// on its own port (127.0.0.1 only) and socket, with an empty database
/// `test`. The `root` user has no password.
///
/// Dropping it kills the server (`SIGKILL`) and removes the directory.
#[derive(Debug)]
pub struct MariaDb {
    server: Server<Launcher>,
    tls: Option<TlsFiles>,
}

/// How `mariadbd` is started: this binary, with these options.
#[derive(Debug)]
struct Launcher {
    mariadbd: PathBuf,
    opts: MariaDbOptions,
    /// With TLS: the CA the kit's clients trust.
    ca: Option<PathBuf>,
}

/// The client arguments for TLS, trusting `ca` (none without TLS).
fn client_tls_args(ca: Option<&Path>) -> Vec<String> {
    match ca {
        Some(ca) => vec!["--ssl".to_owned(), format!("--ssl-ca={}", ca.display())],
        None => Vec::new(),
    }
}

impl MariaDb {
    /// Starts a server with default options, waits until it answers and
    /// creates the database `test`.
    ///
    /// # Panics
    ///
    /// Panics if MariaDB is not installed or setup fails.
    pub fn start() -> Self {
        Self::start_with(MariaDbOptions::default())
    }

    /// Starts a server with `opts`, waits until it answers and creates the
    /// database `test`.
    ///
    /// # Panics
    ///
    /// Panics if MariaDB is not installed or setup fails.
    pub fn start_with(mut opts: MariaDbOptions) -> Self {
        let mariadbd = util::find_binary("mariadbd", "mariadb-server");
        let install_db = util::find_binary("mariadb-install-db", "mariadb-server");
        util::find_binary("mariadb", "mariadb-client");
        util::find_binary("mariadb-admin", "mariadb-client");
        let (tmp, user) = util::temp_dir_owned_by("leasehold-mariadb-", "mysql", "mariadb-server");
        let dir = tmp.path().to_path_buf();

        // A private temporary directory: parallel installs sharing /tmp delete each
        // other's temporary tables ("Unknown table 'mysql.tmp_user_sys'").
        let server_tmp = dir.join("tmp");
        std::fs::create_dir(&server_tmp)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", server_tmp.display()));
        util::chown(&server_tmp, &user);
        let mut cmd = Command::new(install_db);
        cmd.current_dir(&dir)
            .env("TMPDIR", &server_tmp)
            .arg("--no-defaults")
            .arg("--user=mysql")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ]);
        let started = Instant::now();
        let out = util::run_with_timeout(&mut cmd, INSTALL_TIMEOUT, "mariadb-install-db");
        assert!(
            out.status.success(),
            "mariadb-install-db failed: {}",
            util::describe_output(&out)
        );
        tracing::debug!(elapsed = ?started.elapsed(), "mariadb-install-db done");

        let tls = opts.tls.map(|cert| {
            let tls_dir = dir.join("tls");
            std::fs::create_dir(&tls_dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", tls_dir.display()));
            let files = TlsFiles::create(&tls_dir);
            // mariadbd reads its key as `mysql`.
            let (cert_file, key_file) = cert.files(&files);
            for path in [&tls_dir, &cert_file, &key_file] {
                util::chown(path, &user);
            }
            opts.extra_args.extend([
                format!("--ssl-cert={}", cert_file.display()),
                format!("--ssl-key={}", key_file.display()),
                format!("--ssl-ca={}", files.ca_cert().display()),
                "--require-secure-transport=ON".to_owned(),
            ]);
            files
        });
        let launcher = Launcher {
            mariadbd,
            opts,
            ca: tls.as_ref().map(TlsFiles::ca_cert),
        };
        let db = Self {
            server: Server::start(launcher, Home::Own(tmp)),
            tls,
        };
        db.sql_in(None, "CREATE DATABASE IF NOT EXISTS test")
            .unwrap_or_else(|e| panic!("CREATE DATABASE test failed: {e}"));
        db
    }

    /// `mysql://root@127.0.0.1:PORT/test`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port())
    }

    /// The certificates of a server started with [`MariaDbOptions::tls`] (`None`
    /// without TLS): the CA to trust, the client certificate, and the wrong ones.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// The server's Unix socket.
    pub fn socket_path(&self) -> PathBuf {
        self.server.dir().join("sock")
    }

    /// The server's error log.
    pub fn log(&self) -> String {
        util::read_log(&self.server.dir().join("err.log"))
    }

    crate::server::server_methods!("The TCP port on 127.0.0.1.", "`127.0.0.1:port`.");

    /// Clean shutdown (`SIGTERM`) and wait.
    pub fn stop(&self) {
        self.server.stop(Signal::SIGTERM, STOP_TIMEOUT);
    }

    crate::server::restart_methods!();

    /// A `mariadb` client command connected as `root` over TCP, in batch mode
    /// without column names (`-N -B`); append `-e STATEMENT` and a database.
    pub fn client_command(&self) -> Command {
        let mut cmd = Command::new(util::find_binary("mariadb", "mariadb-client"));
        cmd.arg("--no-defaults")
            .arg("-h127.0.0.1")
            .arg(format!("-P{}", self.port()))
            .args(["-uroot", "--connect-timeout=10", "-N", "-B"])
            .args(client_tls_args(self.server.launch().ca.as_deref()));
        cmd
    }

    fn sql_in(&self, db: Option<&str>, stmt: &str) -> Result<String, String> {
        let mut cmd = self.client_command();
        cmd.arg("-e").arg(stmt);
        if let Some(db) = db {
            cmd.arg(db);
        }
        let out = util::run_with_timeout(&mut cmd, SQL_TIMEOUT, "mariadb");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
        } else {
            Err(util::describe_output(&out))
        }
    }

    /// Runs `stmt` in database `test`; returns stdout (tab-separated columns,
    /// one line per row, no header) or the error output.
    pub fn try_sql(&self, stmt: &str) -> Result<String, String> {
        self.sql_in(Some("test"), stmt)
    }

    /// Runs `stmt` in database `test` and returns stdout (tab-separated
    /// columns, one line per row, no header) without the trailing newline.
    ///
    /// # Panics
    ///
    /// Panics if the statement fails or takes more than 60 s.
    pub fn sql(&self, stmt: &str) -> String {
        self.try_sql(stmt)
            .unwrap_or_else(|e| panic!("SQL {stmt:?} on port {} failed: {e}", self.port()))
    }
}

impl Launch for Launcher {
    const NAME: &'static str = crate::proof::MARIADB;
    const LOGS: &'static [&'static str] = &["err.log", "stdout.log"];
    const PORT_TAKEN: &'static [&'static str] =
        &["Address already in use", "Do you already have another"];

    fn spawn(&self, dir: &Path, port: u16) -> ServerProcess {
        let mut cmd = Command::new(&self.mariadbd);
        cmd.current_dir(dir)
            .arg("--no-defaults")
            .arg("--user=mysql")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--skip-name-resolve")
            .arg(format!("--log-error={}", dir.join("err.log").display()))
            .arg(format!("--tmpdir={}", dir.join("tmp").display()))
            .args(&self.opts.extra_args);
        ServerProcess::spawn(format!("mariadbd:{port}"), cmd, &dir.join("stdout.log"))
    }

    fn ready(&self, process: &ServerProcess, port: u16) -> Result<(), ReadyError> {
        let admin = util::find_binary("mariadb-admin", "mariadb-client");
        ready::wait_ready(process, READY_TIMEOUT, Duration::from_millis(50), || {
            let mut cmd = Command::new(&admin);
            cmd.arg("--no-defaults")
                .arg("-h127.0.0.1")
                .arg(format!("-P{port}"))
                .args(["-uroot", "--connect-timeout=5"])
                .args(client_tls_args(self.ca.as_deref()))
                .arg("ping");
            util::run_with_timeout(&mut cmd, Duration::from_secs(30), "mariadb-admin ping")
                .status
                .success()
        })
    }
}
