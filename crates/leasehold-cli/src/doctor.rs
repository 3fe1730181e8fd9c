//! `leasehold doctor`: what the store URL reaches, as whom, and which rows of
//! `docs/guarantees.md` hold for this deployment, each with the setting that decides it.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use leasehold::{Diagnosis, Store, Verdict};
use serde::Serialize;

use crate::failure::Failure;

/// The after-help of `leasehold doctor`: the exit statuses (as docs/cli.md's table).
pub(crate) const HELP: &str = "\
It reads only: nothing is acquired, written or broken. Each row is a fault of
docs/guarantees.md for this store, with the verdict this deployment's settings give
(holds, fences hold, does not hold, unknown) and the setting that decides it.

With --json, one line: {\"store\",\"facts\":{NAME:VALUE},\"rows\":[{\"row\",\"verdict\",
\"setting\",\"why\"}],\"warnings\":[...],\"required\":LEVEL|null,\"ok\":true|false}.

Exit status:
  0   printed, and every row --require asks for holds (or no --require)
  64  bad usage, or a bad store URL
  69  store error (unreachable, no answer within 10s, refused credentials, a
      refused TLS handshake, no such database, no privilege, missing tables)
  78  a row --require asks for does not hold here (the rows are printed)

Example:
  leasehold doctor --store 'postgres://app@db/app?sslmode=verify-full' --require holds";

/// `leasehold doctor`'s flags.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Exit 78 unless every row (or each --row) is at least this good here.
    #[arg(long, value_enum, value_name = "LEVEL")]
    require: Option<Level>,
    /// With --require: hold only this row to it (a fault as docs/guarantees.md names it,
    /// e.g. 'restart with persistence'); repeat for several.
    #[arg(long = "row", value_name = "FAULT", requires = "require")]
    rows: Vec<String>,
}

/// What `--require` asks of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Level {
    /// At most one holder at a time, fences rising.
    Holds,
    /// At least the fences rise (the guard rejects a stale holder's writes).
    FencesHold,
}

impl Level {
    fn met_by(self, verdict: Verdict) -> bool {
        match self {
            Level::Holds => verdict == Verdict::Holds,
            Level::FencesHold => matches!(verdict, Verdict::Holds | Verdict::FencesHold),
        }
    }
}

/// The rows of `d` that `required` (held to `rows`, or all when empty) refuses; a `--row`
/// that the diagnosis does not have is refused too (its verdict is not known).
fn refused<'d>(d: &'d Diagnosis, required: Level, rows: &'d [String]) -> Vec<&'d str> {
    if rows.is_empty() {
        return d
            .findings
            .iter()
            .filter(|f| !required.met_by(f.verdict))
            .map(|f| f.row.as_str())
            .collect();
    }
    rows.iter()
        .filter(|r| d.row(r).is_none_or(|f| !required.met_by(f.verdict)))
        .map(String::as_str)
        .collect()
}

/// The report as text: facts, rows, warnings.
fn text(backend: &str, d: &Diagnosis) -> String {
    let mut out = format!("store\t{backend}\n");
    for f in &d.facts {
        out.push_str(&format!("{}\t{}\n", f.name, f.value));
    }
    if d.findings.is_empty() {
        out.push_str("rows\tthis store reports no settings to hold against docs/guarantees.md\n");
    }
    for f in &d.findings {
        out.push_str(&format!(
            "row\t{}\t{}\t{}\t{}\n",
            f.row, f.verdict, f.setting, f.why
        ));
    }
    for w in &d.warnings {
        out.push_str(&format!("warning\t{w}\n"));
    }
    out
}

fn json(backend: &str, d: &Diagnosis, required: Option<Level>, ok: bool) -> String {
    let facts: serde_json::Map<String, serde_json::Value> = d
        .facts
        .iter()
        .map(|f| (f.name.clone(), f.value.clone().into()))
        .collect();
    let rows: Vec<_> = d
        .findings
        .iter()
        .map(|f| {
            serde_json::json!({
                "row": f.row, "verdict": f.verdict.as_str(), "setting": f.setting, "why": f.why,
            })
        })
        .collect();
    format!(
        "{}\n",
        serde_json::json!({
            "store": backend, "facts": facts, "rows": rows, "warnings": d.warnings,
            "required": required, "ok": ok,
        })
    )
}

/// `leasehold doctor`.
pub(crate) async fn doctor(url: &str, args: DoctorArgs) -> Result<ExitCode, Failure> {
    let store = crate::admin::connect_bounded(url).await?;
    let d = store.diagnose().await?;
    let refused = match args.require {
        Some(level) => refused(&d, level, &args.rows),
        None => Vec::new(),
    };
    let backend = store.backend();
    let printed = if args.json {
        json(backend, &d, args.require, refused.is_empty())
    } else {
        text(backend, &d)
    };
    crate::out::print(&printed)?;
    if refused.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let level = match args.require {
        Some(Level::FencesHold) => "fences hold",
        _ => "holds",
    };
    Err(Failure::NotHolding(format!(
        "not every row required holds here (--require {level}): {}",
        refused.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use leasehold::{Finding, Verdict};

    use super::*;

    fn diagnosis() -> Diagnosis {
        let mut d = Diagnosis::new();
        d.fact("server version", "7.0.15");
        d.finding(Finding::new("holder crash", Verdict::Holds, "-", "always"));
        d.finding(Finding::new(
            "restart with persistence",
            Verdict::FencesHold,
            "appendfsync=everysec",
            "a host crash loses up to a second of grants",
        ));
        d.finding(Finding::new(
            "eviction",
            Verdict::Unknown,
            "maxmemory-policy=?",
            "CONFIG GET refused",
        ));
        d.warn("the identity may run every command");
        d
    }

    #[test]
    fn each_level_refuses_the_rows_below_it() {
        let d = diagnosis();
        assert_eq!(
            refused(&d, Level::Holds, &[]),
            ["restart with persistence", "eviction"]
        );
        assert_eq!(refused(&d, Level::FencesHold, &[]), ["eviction"]);
        let only = ["restart with persistence".to_owned()];
        assert_eq!(refused(&d, Level::FencesHold, &only), Vec::<&str>::new());
        assert_eq!(
            refused(&d, Level::Holds, &only),
            ["restart with persistence"]
        );
        let missing = ["fail-over".to_owned(), "holder crash".to_owned()];
        assert_eq!(refused(&d, Level::Holds, &missing), ["fail-over"]);
    }

    #[test]
    fn the_text_and_the_json_carry_every_fact_row_and_warning() {
        let d = diagnosis();
        let t = text("redis", &d);
        assert!(
            t.starts_with("store\tredis\nserver version\t7.0.15\n"),
            "{t}"
        );
        assert!(t.contains(
            "row\trestart with persistence\tfences hold\tappendfsync=everysec\ta host crash"
        ));
        assert!(t.contains("warning\tthe identity may run every command\n"));
        let j: serde_json::Value =
            serde_json::from_str(&json("redis", &d, Some(Level::FencesHold), false)).unwrap();
        assert_eq!(j["facts"]["server version"], "7.0.15");
        assert_eq!(j["rows"][2]["verdict"], "unknown");
        assert_eq!(j["required"], "fences-hold");
        assert_eq!(j["ok"], false);
        assert!(text("x", &Diagnosis::new()).contains("reports no settings"));
    }
}
