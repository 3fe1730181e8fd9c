//! Parsers of what the benchmark reads: its command line, `pgbench`'s report and Redis's
//! `INFO commandstats`.

/// The benchmark's usage text.
pub const USAGE: &str = "usage: cargo bench -p leasehold-bench --bench compare -- [--json] [--quick] [--only redis|postgres|mysql|sqlite|etcd|zookeeper|tls[,...]] [--pg-fsync on|off] [--slices N]
  --json      print one JSON document instead of the tables
  --quick     a smoke run: short slices (a minute or two)
  --slices    slices per level and per contender (default 8, with --quick 3): more of them
              steady the medians on a busy machine, each adding its share of the run time
  --only      run only these stores' sections (comma-separated, or repeat the option)
  --pg-fsync  the private PostgreSQL's fsync (default on: every grant waits for its WAL
              flush; off: what the same run costs without the disk)";

/// A store the benchmark has a section for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Redis.
    Redis,
    /// PostgreSQL.
    Postgres,
    /// MySQL / MariaDB.
    Mysql,
    /// SQLite.
    Sqlite,
    /// etcd.
    Etcd,
    /// ZooKeeper.
    Zookeeper,
    /// The cost of TLS: PostgreSQL, MariaDB, etcd, Redis, Redlock and ZooKeeper, each with
    /// and without it.
    Tls,
}

impl Backend {
    /// Every section, in the order they run.
    pub const ALL: [Backend; 7] = [
        Self::Redis,
        Self::Postgres,
        Self::Mysql,
        Self::Sqlite,
        Self::Etcd,
        Self::Zookeeper,
        Self::Tls,
    ];

    /// `redis`, `postgres` (or `postgresql`, `pg`), `mysql` (or `mariadb`), `sqlite`,
    /// `etcd`, `zookeeper` (or `zk`), `tls`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "redis" => Some(Self::Redis),
            "postgres" | "postgresql" | "pg" => Some(Self::Postgres),
            "mysql" | "mariadb" => Some(Self::Mysql),
            "sqlite" => Some(Self::Sqlite),
            "etcd" => Some(Self::Etcd),
            "zookeeper" | "zk" => Some(Self::Zookeeper),
            "tls" => Some(Self::Tls),
            _ => None,
        }
    }

    /// Its section's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::Postgres => "postgres",
            Self::Mysql => "mysql",
            Self::Sqlite => "sqlite",
            Self::Etcd => "etcd",
            Self::Zookeeper => "zookeeper",
            Self::Tls => "tls",
        }
    }
}

/// The options of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opts {
    /// One JSON document instead of the tables.
    pub json: bool,
    /// Short slices.
    pub quick: bool,
    /// The sections to run, in this order.
    pub only: Vec<Backend>,
    /// `fsync` of the private PostgreSQL (`--pg-fsync on|off`, default on).
    pub pg_fsync: bool,
    /// Slices per level and per contender instead of the plan's (`--slices N`, N ≥ 1).
    pub slices: Option<usize>,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cli {
    /// A run.
    Run(Opts),
    /// The usage text.
    Help,
}

/// Parses the arguments (without the program name).
///
/// # Errors
/// A message for an unknown argument or a bad `--only`.
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Cli, String> {
    let mut o = Opts {
        json: false,
        quick: false,
        only: Vec::new(),
        pg_fsync: true,
        slices: None,
    };
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        match flag.as_str() {
            // cargo bench passes --bench to every bench target.
            "--bench" => {}
            "--json" => o.json = true,
            "--quick" => o.quick = true,
            "--only" => {
                // (cargo bench appends --bench after the user's arguments: not a store.)
                let v = inline
                    .or_else(|| it.next())
                    .filter(|v| !v.starts_with("--"))
                    .ok_or(
                        "--only needs a store: redis, postgres, mysql, sqlite, etcd or zookeeper",
                    )?;
                for name in v.split(',').filter(|s| !s.is_empty()) {
                    let b = Backend::parse(name).ok_or_else(|| {
                        format!("unknown store {name:?} (redis, postgres, mysql, sqlite or etcd)")
                    })?;
                    if !o.only.contains(&b) {
                        o.only.push(b);
                    }
                }
            }
            "--pg-fsync" => {
                o.pg_fsync = match inline.or_else(|| it.next()).as_deref() {
                    Some("on") => true,
                    Some("off") => false,
                    _ => return Err("--pg-fsync needs on or off".into()),
                };
            }
            "--slices" => {
                let n = inline.or_else(|| it.next()).and_then(|v| v.parse().ok());
                o.slices = Some(
                    n.filter(|&n| n > 0)
                        .ok_or("--slices needs a count of at least 1")?,
                );
            }
            "-h" | "--help" => return Ok(Cli::Help),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    if o.only.is_empty() {
        o.only = Backend::ALL.to_vec();
    }
    Ok(Cli::Run(o))
}

/// The transactions per second in `pgbench`'s report:
/// `tps = 1234.5 (without initial connection time)` → 1234.5.
pub fn pgbench_tps(report: &str) -> Option<f64> {
    report
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The `calls=` of each command in Redis's `INFO commandstats`
/// (`cmdstat_evalsha:calls=3,usec=…` → `("evalsha", 3)`).
pub fn commandstats_calls(info: &str) -> Vec<(String, u64)> {
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (cmd, rest) = l.split_once(':')?;
            let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((cmd.to_owned(), calls.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Cli, String> {
        parse_args(a.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn command_line() {
        let Ok(Cli::Run(o)) = args(&["--bench", "--json", "--only", "redis,pg", "--only=sqlite"])
        else {
            panic!("parse")
        };
        assert!(o.json && !o.quick && o.pg_fsync);
        assert_eq!(o.only, [Backend::Redis, Backend::Postgres, Backend::Sqlite]);
        for (a, on) in [
            (&["--pg-fsync", "off"][..], false),
            (&["--pg-fsync=off"], false),
            (&["--pg-fsync", "on"], true),
        ] {
            let Ok(Cli::Run(o)) = args(a) else {
                panic!("parse {a:?}")
            };
            assert_eq!(o.pg_fsync, on, "{a:?}");
        }
        assert!(args(&["--pg-fsync"]).is_err());
        for (a, n) in [
            (&["--slices", "24"][..], Some(24)),
            (&["--slices=3"], Some(3)),
            (&[], None),
        ] {
            let Ok(Cli::Run(o)) = args(a) else {
                panic!("parse {a:?}")
            };
            assert_eq!(o.slices, n, "{a:?}");
        }
        for a in [&["--slices"][..], &["--slices", "0"], &["--slices", "many"]] {
            assert!(args(a).is_err(), "{a:?}");
        }
        assert!(args(&["--pg-fsync", "maybe"]).is_err());
        let Ok(Cli::Run(o)) = args(&["--quick"]) else {
            panic!("parse")
        };
        assert_eq!(o.only, Backend::ALL);
        assert!(args(&["--only"]).is_err());
        assert_eq!(
            args(&["--only", "--bench"]),
            Err("--only needs a store: redis, postgres, mysql, sqlite, etcd or zookeeper".into())
        );
        assert!(args(&["--only", "nosuch"]).is_err());
        assert_eq!(
            args(&["--only", "zk"]).map(|c| matches!(c, Cli::Run(_))),
            Ok(true)
        );
        assert!(args(&["--fast"]).is_err());
        assert_eq!(args(&["-h"]), Ok(Cli::Help));
    }

    #[test]
    fn reports() {
        assert_eq!(
            pgbench_tps(
                "latency average = 1.2 ms\ntps = 1234.567890 (without initial connection time)\n"
            ),
            Some(1234.56789)
        );
        assert_eq!(pgbench_tps("nothing"), None);
        assert_eq!(
            commandstats_calls(
                "# Commandstats\r\ncmdstat_set:calls=3,usec=1\r\ncmdstat_client|setinfo:calls=4,usec=2\r\n"
            ),
            [("set".to_owned(), 3), ("client|setinfo".to_owned(), 4)]
        );
    }
}
