//! [`Server`]: what every private server shares (its process, port and directory, its
//! first start on a free port, its restart), around a [`Launch`] that holds what is its
//! own (its command line, its readiness probe, its logs).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::Signal;
use tempfile::TempDir;

use crate::free_port;
use crate::process::ServerProcess;
use crate::proof::{self, Injected};
use crate::ready::ReadyError;
use crate::util;

/// How many ports a first start tries before giving up.
const START_ATTEMPTS: usize = 4;

/// How one kind of server is spawned, probed and diagnosed.
pub(crate) trait Launch {
    /// The server's name in messages (`postgres`, `redis-server`, ...).
    const NAME: &'static str;
    /// Its log files in its directory, the main one first.
    const LOGS: &'static [&'static str];
    /// What its logs say when its port was taken.
    const PORT_TAKEN: &'static [&'static str];

    /// Picks the port of a first start (and any other port the server needs).
    fn pick_port(&self) -> u16 {
        free_port()
    }

    /// Spawns the server on `port`, in `dir`.
    fn spawn(&self, dir: &Path, port: u16) -> ServerProcess;

    /// Waits until the freshly spawned `process` answers on `port`.
    fn ready(&self, process: &ServerProcess, port: u16) -> Result<(), ReadyError>;

    /// Whether what the server acknowledged survives a kill and a start again (for the
    /// proofs' restart rows, [`crate::proof`]).
    fn keeps_data(&self) -> bool {
        true
    }

    /// Whether the server replicates among members, so that losing a member of a cluster
    /// is a fail-over ([`crate::proof::Injected::Failover`]).
    const REPLICATED: bool = false;
}

/// The server's logs in `dir`, one after the other.
fn read_logs<L: Launch>(dir: &Path) -> String {
    L::LOGS
        .iter()
        .map(|f| util::read_log(&dir.join(f)))
        .collect()
}

/// Whether the server's logs in `dir` say its port was taken.
fn port_taken<L: Launch>(dir: &Path) -> bool {
    let log = read_logs::<L>(dir);
    L::PORT_TAKEN.iter().any(|m| log.contains(m))
}

/// The tails of the server's logs in `dir`, for a panic message.
fn log_tails<L: Launch>(dir: &Path) -> String {
    let mut tails = format!("(dir {})", dir.display());
    for f in L::LOGS {
        let tail = util::log_tail(&dir.join(f), 8192);
        tails.push_str(&format!("\n--- {f} ---\n{tail}"));
    }
    tails
}

/// Where a server keeps its files.
#[derive(Debug)]
pub(crate) enum Home {
    /// A temporary directory of its own, removed once the process is killed.
    Own(TempDir),
    /// A directory inside a cluster's.
    In(PathBuf),
}

impl Home {
    fn path(&self) -> &Path {
        match self {
            Home::Own(tmp) => tmp.path(),
            Home::In(dir) => dir,
        }
    }
}

/// A server process on its port and directory, started and restarted by its [`Launch`].
/// Dropping it kills the process, then removes its own directory.
#[derive(Debug)]
pub(crate) struct Server<L> {
    // Field order matters: the process is killed before the directory goes.
    process: Mutex<ServerProcess>,
    port: u16,
    launch: L,
    home: Home,
}

impl<L: Launch> Server<L> {
    /// Starts the server in `home` on a port from [`Launch::pick_port`] and waits until it is
    /// ready. If it exits because its port was taken meanwhile (a race between parallel test
    /// processes), tries another port, up to 4 in all.
    ///
    /// # Panics
    ///
    /// Panics with the server's logs if it does not get ready.
    pub(crate) fn start(launch: L, home: Home) -> Self {
        let dir = home.path().to_path_buf();
        for attempt in 1..=START_ATTEMPTS {
            let port = launch.pick_port();
            let process = launch.spawn(&dir, port);
            match launch.ready(&process, port) {
                Ok(()) => {
                    tracing::info!(port, dir = %dir.display(), "{} ready", L::NAME);
                    return Self::new(process, port, launch, home);
                }
                Err(e) => {
                    drop(process);
                    if e == ReadyError::Exited && attempt < START_ATTEMPTS && port_taken::<L>(&dir)
                    {
                        tracing::warn!(
                            port,
                            attempt,
                            "{} port taken: retrying on another port",
                            L::NAME
                        );
                        continue;
                    }
                    panic!("{} on port {port} {e}\n{}", L::NAME, log_tails::<L>(&dir));
                }
            }
        }
        unreachable!("the last start attempt either returns or panics")
    }

    /// Wraps a process already spawned by `launch` on `port`, in `home` (and ready).
    pub(crate) fn new(process: ServerProcess, port: u16, launch: L, home: Home) -> Self {
        proof::record(Injected::ServerStarted(L::NAME));
        Self {
            process: Mutex::new(process),
            port,
            launch,
            home,
        }
    }

    /// Starts the server again on the same port and directory, after it was stopped or
    /// killed, and waits until it is ready.
    ///
    /// # Panics
    ///
    /// Panics if it is still running or does not get ready.
    pub(crate) fn start_again(&self) {
        let mut guard = self.process();
        assert!(
            !guard.is_running(),
            "{} on port {} is still running: stop or kill it first",
            L::NAME,
            self.port
        );
        let process = self.launch.spawn(self.dir(), self.port);
        if let Err(e) = self.launch.ready(&process, self.port) {
            drop(process);
            panic!(
                "{} restart on port {} {e}\n{}",
                L::NAME,
                self.port,
                log_tails::<L>(self.dir())
            );
        }
        *guard = process;
        tracing::info!(port = self.port, "{} restarted", L::NAME);
        proof::record(Injected::ServerRestarted {
            server: L::NAME,
            persistent: self.launch.keeps_data(),
        });
    }

    /// Freezes the server (`SIGSTOP`).
    pub(crate) fn pause(&self) {
        self.process().pause();
        proof::record(Injected::ServerPaused(L::NAME));
    }

    /// Continues it (`SIGCONT`).
    pub(crate) fn resume(&self) {
        self.process().resume();
    }

    /// Kills the server with `SIGKILL` and waits for it.
    pub(crate) fn kill(&self) {
        self.process().kill();
        self.lost_member();
    }

    /// Sends `sig` and waits up to `timeout` for the server to exit, then kills it.
    pub(crate) fn stop(&self, sig: Signal, timeout: Duration) {
        self.process().terminate(sig, timeout);
        self.lost_member();
    }

    /// Records a fail-over if the server was a member of a replicated cluster.
    fn lost_member(&self) {
        if L::REPLICATED && matches!(self.home, Home::In(_)) {
            proof::record(Injected::Failover(L::NAME));
        }
    }

    /// The server's logs, one after the other.
    pub(crate) fn log(&self) -> String {
        read_logs::<L>(self.dir())
    }

    /// Whether the server's logs say its port was taken.
    pub(crate) fn port_taken(&self) -> bool {
        port_taken::<L>(self.dir())
    }
}

impl<L> Server<L> {
    /// The current process.
    pub(crate) fn process(&self) -> MutexGuard<'_, ServerProcess> {
        self.process.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The TCP port on 127.0.0.1.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The server's directory.
    pub(crate) fn dir(&self) -> &Path {
        self.home.path()
    }

    /// How the server is started.
    pub(crate) fn launch(&self) -> &L {
        &self.launch
    }
}

/// Expands, inside the `impl` block of a type with a `server: Server<_>` field, to its
/// `port` and `addr` accessors (with the given docs) and to the process-control methods,
/// so every server offers the same controls with the same docs.
macro_rules! server_methods {
    ($port_doc:literal, $addr_doc:literal) => {
        #[doc = $port_doc]
        pub fn port(&self) -> u16 {
            self.server.port()
        }

        #[doc = $addr_doc]
        pub fn addr(&self) -> std::net::SocketAddr {
            self.server.addr()
        }

        /// The PID of the current server process.
        pub fn pid(&self) -> u32 {
            self.server.process().pid()
        }

        /// Whether the server process is alive (paused counts as alive).
        pub fn is_running(&self) -> bool {
            self.server.process().is_running()
        }

        /// Whether the server is paused.
        pub fn is_paused(&self) -> bool {
            self.server.process().is_paused()
        }

        /// Freezes the server (and its child processes) with `SIGSTOP`: the kernel still
        /// accepts connections, but nothing is answered.
        pub fn pause(&self) {
            self.server.pause();
        }

        /// Continues a paused server with `SIGCONT`.
        pub fn resume(&self) {
            self.server.resume();
        }

        /// Kills the server with `SIGKILL` (a crash) and waits for it.
        pub fn kill(&self) {
            self.server.kill();
        }

        /// Sends `sig` to the server process.
        pub fn signal(&self, sig: nix::sys::signal::Signal) {
            self.server.process().signal(sig);
        }
    };
}
pub(crate) use server_methods;

/// Expands, inside the `impl` block of a type with a `server: Server<_>` field and the
/// methods of [`server_methods`], to `start_again` and `restart`, a crash-restart (what
/// survives it is said on the type).
macro_rules! restart_methods {
    () => {
        /// Starts the server again on the same ports and directory, after
        /// [`kill`](Self::kill) or a stop, and waits until it is ready as a first start does.
        ///
        /// # Panics
        ///
        /// Panics if the server is still running or does not get ready.
        pub fn start_again(&self) {
            self.server.start_again();
        }

        /// Crash-restarts the server: [`kill`](Self::kill) (`SIGKILL`), then
        /// [`start_again`](Self::start_again).
        pub fn restart(&self) {
            self.kill();
            self.start_again();
        }
    };
}
pub(crate) use restart_methods;
