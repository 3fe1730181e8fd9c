//! `leasehold`: run a command under a distributed lease, and inspect, list or break leases.
#![forbid(unsafe_code)]

mod admin;
mod demo;
mod doctor;
mod elect;
mod exit;
mod failure;
mod guard;
mod health;
mod help;
mod kind;
mod man;
mod migrate;
mod out;
mod run;
mod run_json;
mod stores;

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::failure::Failure;

const EXAMPLES: &str = "\
Examples:
  leasehold run --key nightly-invoices -- ./generate-invoices.sh
  leasehold run --key db:migrate --ttl 30s --wait 5m --store redis://locks:6379/ -- ./migrate
  leasehold inspect nightly-invoices --json
  leasehold list job:
  leasehold break nightly-invoices

Without --store or LEASEHOLD_STORE, leases live in an embedded SQLite database in
$XDG_STATE_HOME/leasehold/ (one host only).";

/// Distributed leases with fencing tokens.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, about, after_help = EXAMPLES)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct Global {
    /// Store URL (redis://, rediss://, redis+cluster://, redis+sentinel://, redlock://,
    /// postgres://, postgres+advisory://, mysql://, mysql+getlock://, sqlite://, zookeeper://;
    /// etcd:// in a build with the etcd feature).
    /// Default: the embedded SQLite database.
    /// memory:// is refused: each process would get its own store, so nothing would be
    /// excluded. An empty value (LEASEHOLD_STORE=) is the default.
    #[arg(long, env = "LEASEHOLD_STORE", global = true, hide_env_values = true)]
    store: Option<String>,
    /// A file whose content (without its trailing newline) is the store's password, put
    /// into the store URL so that no password shows in `ps` or in the environment: for
    /// postgres://, mysql:// (mariadb://), redis://, rediss://, redis+cluster://,
    /// redis+sentinel://, rediss+sentinel://, redlock://, etcd:// and zookeeper:// URLs
    /// without a password of their own.
    /// PostgreSQL URLs without a password also take PGPASSWORD or PGPASSFILE.
    #[arg(
        long,
        env = "LEASEHOLD_STORE_PASSWORD_FILE",
        global = true,
        hide_env_values = true,
        value_name = "PATH"
    )]
    // An OsString, not a PathBuf: clap refuses an empty path, and an empty
    // LEASEHOLD_STORE_PASSWORD_FILE= means none, as an empty LEASEHOLD_STORE= the default.
    store_password_file: Option<std::ffi::OsString>,
    /// Log format on standard error.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// Log level filter (e.g. `info`, `leasehold=debug`; default `warn`, `error` for the
    /// demo); `RUST_LOG` works too.
    #[arg(long, global = true, env = "LEASEHOLD_LOG", hide_env_values = true)]
    log: Option<String>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9464).
    #[arg(long, global = true)]
    metrics_addr: Option<SocketAddr>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding a lease; stop it before the lease could expire under it.
    #[command(after_help = run::HELP)]
    Run(run::RunArgs),
    /// Show who holds a lease.
    #[command(after_help = help::INSPECT)]
    Inspect {
        /// The lease key.
        key: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List held leases whose keys start with PREFIX.
    #[command(after_help = help::LIST)]
    List {
        /// Key prefix (default: all).
        #[arg(default_value = "")]
        prefix: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Admin: remove a lease and advance its fence, so the evicted holder's writes are
    /// rejected by the guard.
    #[command(after_help = help::BREAK)]
    Break {
        /// The lease key.
        key: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the leader of an election (the holder of the lease NAME) and its value.
    #[command(after_help = elect::LEADER_HELP)]
    Leader {
        /// The election's name (a lease key).
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the leader of an election, then each change, as JSON lines.
    #[command(after_help = elect::OBSERVE_HELP)]
    Observe {
        /// The election's name (a lease key).
        name: String,
        /// How often to read the leader (1ms to 1h).
        #[arg(long, default_value = "1s", value_parser = parse_interval)]
        interval: Duration,
    },
    /// Create the store's tables, the guard tables and the SQL guard (or --print the SQL).
    #[command(after_help = migrate::HELP)]
    Migrate(migrate::MigrateArgs),
    /// Show the paused-worker story: a stale write rejected by the guard (or, with
    /// --unfenced, corrupting the data).
    #[command(after_help = demo::HELP)]
    Demo(demo::DemoArgs),
    /// Show what the store URL reaches (server, TLS, identity) and which rows of
    /// docs/guarantees.md hold for this deployment, with the settings that decide them.
    #[command(after_help = doctor::HELP)]
    Doctor(doctor::DoctorArgs),
    /// Print shell completions.
    #[command(after_help = help::COMPLETIONS)]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page, leasehold(1), as roff.
    #[command(after_help = help::MAN)]
    Man,
    /// Install the man page and the shell completions in your data directory.
    #[command(after_help = help::INSTALL)]
    InstallCompletions(man::InstallArgs),
}

/// Parses a duration like `10s`, `1m30s`, `250ms`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (try e.g. 10s, 1m30s, 250ms)"))
}

/// The longest `--wait` and `--max-hold`: a year. Longer values are refused at parse time
/// (leave `--max-hold` out for an unbounded hold), so no deadline computed from them can
/// overflow the clock.
const MAX_WAIT: (Duration, &str) = (Duration::from_secs(365 * 24 * 60 * 60), "365d");

/// Parses a duration and checks it against inclusive bounds given with their spelling.
fn parse_in(s: &str, min: (Duration, &str), max: (Duration, &str)) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < min.0 {
        Err(format!("must be at least {}", min.1))
    } else if d > max.0 {
        Err(format!("must be at most {}", max.1))
    } else {
        Ok(d)
    }
}

/// A lease TTL: the library's range, 10ms to 24h.
pub(crate) fn parse_ttl(s: &str) -> Result<Duration, String> {
    parse_in(
        s,
        (leasehold::config::MIN_TTL, "10ms"),
        (leasehold::config::MAX_TTL, "24h"),
    )
}

/// `--wait`: 0 (one attempt) to a year.
pub(crate) fn parse_wait(s: &str) -> Result<Duration, String> {
    parse_in(s, (Duration::ZERO, "0"), MAX_WAIT)
}

/// `--max-hold`: above zero, up to a year.
pub(crate) fn parse_max_hold(s: &str) -> Result<Duration, String> {
    parse_in(s, (Duration::from_nanos(1), "1ns"), MAX_WAIT)
}

/// `observe --interval`: 1ms to 1h.
pub(crate) fn parse_interval(s: &str) -> Result<Duration, String> {
    parse_in(
        s,
        (Duration::from_millis(1), "1ms"),
        (Duration::from_secs(3600), "1h"),
    )
}

/// `--grace`: 0 to 12h (half the longest TTL; checked against the actual TTL later).
pub(crate) fn parse_grace(s: &str) -> Result<Duration, String> {
    parse_in(
        s,
        (Duration::ZERO, "0"),
        (leasehold::config::MAX_TTL / 2, "12h"),
    )
}

/// The one exit point of a failure: one line on standard error, its exit code.
fn report(failure: &Failure) -> ExitCode {
    eprintln!("leasehold: {failure}");
    ExitCode::from(failure.code())
}

/// Whether log lines on standard error may carry ANSI colour: only when standard error is
/// a terminal and `NO_COLOR` is unset or empty (<https://no-color.org>). A log redirected to
/// a file or a pipe holds plain text.
fn colour_stderr() -> bool {
    use std::io::IsTerminal;
    colour_allowed(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

/// [`colour_stderr`]'s rule: a terminal, and no non-empty `NO_COLOR`.
fn colour_allowed(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

fn init_logging(global: &Global, default: &str) -> Result<(), String> {
    let level = global.log.as_deref().unwrap_or(default);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .map_err(|e| format!("bad --log filter: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour_stderr());
    match global.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

fn main() -> ExitCode {
    // The guard process of `leasehold run` (see `guard`): not a subcommand users see.
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new(guard::SUBCOMMAND)) {
        return guard::main();
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(exit::USAGE);
            }
            // One line: clap's message without its usage block.
            let rendered = e.to_string();
            let message: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .map(str::trim)
                .filter(|l| {
                    !l.is_empty()
                        && !l.starts_with("tip:")
                        && !l.starts_with("For more information")
                })
                .collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            return report(&Failure::Usage(format!("{message} (see leasehold --help)")));
        }
    };
    // The demo shows lost leases and rejected writes in its timeline; no need to warn.
    let default_level = if matches!(cli.command, Command::Demo(_)) {
        "error"
    } else {
        "warn"
    };
    if let Err(e) = init_logging(&cli.global, default_level) {
        return report(&Failure::Usage(e));
    }
    let printed = match &cli.command {
        Command::Completions { shell } => {
            Some(out::print(&man::completions(*shell, &mut Cli::command())))
        }
        Command::Man => Some(out::print(&man::render(Cli::command()))),
        Command::InstallCompletions(args) => Some(man::install(args, Cli::command())),
        _ => None,
    };
    if let Some(result) = printed {
        return result.unwrap_or_else(|failure| report(&failure));
    }
    if matches!(cli.command, Command::Run(_)) {
        run::block_sigttou();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return report(&Failure::Internal(format!("cannot start the runtime: {e}")));
        }
    };
    match runtime.block_on(async_main(cli)) {
        Ok(code) => code,
        Err(failure) => report(&failure),
    }
}

/// The store URL to open (with the password file's password in it, if one is given) and
/// the URL as the user gave it, for messages.
fn store_urls(global: &Global) -> Result<(String, String), Failure> {
    let url = stores::resolve(global.store.as_deref())?;
    match global
        .store_password_file
        .as_deref()
        .filter(|p| !p.is_empty())
    {
        Some(path) => Ok((stores::with_password_file(&url, Path::new(path))?, url)),
        None => Ok((url.clone(), url)),
    }
}

async fn async_main(cli: Cli) -> Result<ExitCode, Failure> {
    if let Some(addr) = cli.global.metrics_addr {
        let installed = metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .set_buckets(leasehold::metrics::SECONDS_BUCKETS)
            .and_then(|b| b.install());
        if let Err(e) = installed {
            return Err(Failure::Usage(format!(
                "cannot serve metrics on {addr}: {e}"
            )));
        }
        leasehold::metrics::describe();
    }
    // The demo makes its own store; every other command here opens the one named.
    let (url, shown_url) = if matches!(cli.command, Command::Demo(_)) {
        (String::new(), String::new())
    } else {
        match store_urls(&cli.global) {
            Ok(urls) => urls,
            Err(f) => match &cli.command {
                Command::Run(args) => return Err(run::failed_early(args, f)),
                _ => return Err(f),
            },
        }
    };
    let result = match cli.command {
        // It names `leasehold migrate` itself: its --json object carries the error too.
        Command::Run(args) => return run::run(&url, args).await,
        Command::Inspect { key, json } => admin::inspect(&url, &key, json).await,
        Command::List { prefix, json } => admin::list(&url, &prefix, json).await,
        Command::Break { key, json } => admin::break_lease(&url, &key, json).await,
        Command::Leader { name, json } => elect::leader(&url, &name, json).await,
        Command::Observe { name, interval } => elect::observe(&url, &name, interval).await,
        Command::Migrate(args) => migrate::migrate(&url, args).await,
        Command::Doctor(args) => doctor::doctor(&url, args).await,
        Command::Demo(args) => demo::demo(args).await,
        Command::Completions { .. } | Command::Man | Command::InstallCompletions(_) => {
            unreachable!("handled before the runtime starts")
        }
    };
    // A store without leasehold's tables (found when it opens or at its first call):
    // name the command that creates them, for this URL.
    result.map_err(|f| migrate::explain_missing_schema(&shown_url, f))
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use clap::CommandFactory;

    use super::{Cli, colour_allowed};

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour_allowed(true, None));
        // NO_COLOR set to an empty string does not count (no-color.org).
        assert!(colour_allowed(true, Some(OsStr::new(""))));
        assert!(!colour_allowed(true, Some(OsStr::new("1"))));
        assert!(!colour_allowed(true, Some(OsStr::new("false"))));
        assert!(!colour_allowed(false, None));
        assert!(!colour_allowed(false, Some(OsStr::new(""))));
    }

    /// `--help` must not print `[env: NAME=]` for an unset variable, nor a set variable's
    /// value (a store URL may hold a password): every flag read from the environment,
    /// on every subcommand, hides its value.
    #[test]
    fn every_env_backed_flag_hides_its_value_in_help() {
        fn check(cmd: &clap::Command, path: &str, found: &mut usize) {
            for arg in cmd.get_arguments() {
                if let Some(env) = arg.get_env() {
                    *found += 1;
                    assert!(
                        arg.is_hide_env_values_set(),
                        "{path} --{}: [env: {}] needs hide_env_values",
                        arg.get_id(),
                        env.to_string_lossy()
                    );
                }
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()), found);
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        let mut found = 0;
        check(&cmd, "leasehold", &mut found);
        assert!(found >= 2, "LEASEHOLD_STORE and LEASEHOLD_LOG at least");
    }
}
