//! A private PgBouncer in front of a private PostgreSQL, on its own port and directory.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::unistd::User;
use tempfile::TempDir;

use crate::free_port;
use crate::postgres::Postgres;
use crate::process::ServerProcess;
use crate::ready;
use crate::util;

/// PgBouncer's pooling mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client session.
    Session,
    /// A server connection per transaction: consecutive transactions of one client may run
    /// on different server connections (and so different backends).
    Transaction,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// A private `pgbouncer` (Debian package `pgbouncer`) forwarding every database to a
/// private [`Postgres`] as user `postgres`, with no authentication (`auth_type = any`), a
/// small server pool (`pool_size` connections per database), run as the `postgres` OS user
/// (PgBouncer refuses to run as root). Killed on drop.
#[derive(Debug)]
pub struct PgBouncer {
    process: Mutex<ServerProcess>,
    port: u16,
    dir: PathBuf,
    _tmp: TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in front of `upstream` in `mode`, with `pool_size` server
    /// connections per database, and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// Panics if `pgbouncer` is not installed or does not get ready.
    pub fn start(upstream: &Postgres, mode: PoolMode, pool_size: u32) -> Self {
        let bin = util::find_binary("pgbouncer", "pgbouncer");
        let setpriv = util::find_binary("setpriv", "util-linux");
        let user = User::from_name("postgres")
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("OS user postgres not found: install package postgresql"));
        let tmp = tempfile::Builder::new()
            .prefix("leasehold-pgbouncer-")
            .tempdir_in("/tmp")
            .unwrap_or_else(|e| panic!("cannot create a temporary directory for pgbouncer: {e}"));
        let dir = tmp.path().to_path_buf();
        std::os::unix::fs::chown(&dir, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
            .unwrap_or_else(|e| panic!("cannot chown {} to postgres: {e}", dir.display()));
        let log = dir.join("pgbouncer.log");
        let (process, port) = ready::start_on_free_port(
            "pgbouncer",
            free_port,
            |port| {
                let ini = dir.join("pgbouncer.ini");
                fs::write(
                    &ini,
                    format!(
                        "[databases]\n\
                         * = host=127.0.0.1 port={up} user=postgres\n\
                         [pgbouncer]\n\
                         listen_addr = 127.0.0.1\n\
                         listen_port = {port}\n\
                         unix_socket_dir =\n\
                         auth_type = any\n\
                         pool_mode = {mode}\n\
                         default_pool_size = {pool_size}\n\
                         max_client_conn = 200\n\
                         server_reset_query_always = 0\n\
                         ignore_startup_parameters = extra_float_digits,options,search_path\n",
                        up = upstream.port(),
                        mode = mode.as_str(),
                    ),
                )
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", ini.display()));
                let mut cmd = Command::new(&setpriv);
                cmd.args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
                    .arg(&bin)
                    .arg(&ini)
                    .current_dir(&dir);
                ServerProcess::spawn(format!("pgbouncer:{port}"), cmd, &log)
            },
            |process, port| {
                ready::wait_ready(
                    process,
                    Duration::from_secs(30),
                    Duration::from_millis(20),
                    || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
                )
            },
            || util::read_log(&log).contains("Address already in use"),
            || format!("--- log ---\n{}", util::log_tail(&log, 8192)),
        );
        tracing::info!(port, "pgbouncer ready");
        Self {
            process: Mutex::new(process),
            port,
            dir,
            _tmp: tmp,
        }
    }

    fn process(&self) -> MutexGuard<'_, ServerProcess> {
        self.process.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB` through the pooler.
    pub fn url_for_db(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// PgBouncer's log.
    pub fn log(&self) -> String {
        util::read_log(&self.dir.join("pgbouncer.log"))
    }

    crate::process::control_methods!();
}
