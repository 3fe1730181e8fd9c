//! What a store can tell about its own deployment ([`Store::diagnose`](crate::Store::diagnose)):
//! what the client connected to, who it is there, and the server settings that decide the
//! rows of `docs/guarantees.md` — the words `leasehold doctor` prints.

use std::fmt;

/// A store's report on its deployment, from [`Store::diagnose`](crate::Store::diagnose).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Diagnosis {
    /// What the client connected to and as whom: server version, TLS version, the peer
    /// certificate, the authenticated identity, what that identity may do. In the order
    /// found; a name appears once.
    pub facts: Vec<Fact>,
    /// Rows of `docs/guarantees.md` (this store's, by fault) held against the settings
    /// that decide them.
    pub findings: Vec<Finding>,
    /// What an operator should change although no row depends on it: TLS that checks no
    /// certificate, an identity allowed more than leasehold needs.
    pub warnings: Vec<String>,
}

impl Diagnosis {
    /// An empty report: nothing known yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the fact `name` = `value` (replacing an earlier one of that name).
    pub fn fact(&mut self, name: impl Into<String>, value: impl Into<String>) -> &mut Self {
        let (name, value) = (name.into(), value.into());
        match self.facts.iter_mut().find(|f| f.name == name) {
            Some(f) => f.value = value,
            None => self.facts.push(Fact { name, value }),
        }
        self
    }

    /// Adds a finding.
    pub fn finding(&mut self, finding: Finding) -> &mut Self {
        self.findings.push(finding);
        self
    }

    /// Adds a warning.
    pub fn warn(&mut self, warning: impl Into<String>) -> &mut Self {
        self.warnings.push(warning.into());
        self
    }

    /// The value of the fact `name`, if found.
    pub fn fact_value(&self, name: &str) -> Option<&str> {
        self.facts
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.value.as_str())
    }

    /// The finding of the row `row` (the fault's name in `docs/guarantees.md`).
    pub fn row(&self, row: &str) -> Option<&Finding> {
        self.findings.iter().find(|f| f.row == row)
    }

    /// The findings whose verdict is not [`Verdict::Holds`]: what `leasehold doctor
    /// --require holds` refuses.
    pub fn not_holding(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.verdict != Verdict::Holds)
    }
}

/// One thing the client learnt about the deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    /// What it is: `server version`, `TLS`, `peer certificate`, `identity`, …
    pub name: String,
    /// Its value. Never a credential.
    pub value: String,
}

/// A row of `docs/guarantees.md` held against this deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The row's fault, as the table names it (`restart with persistence`, `eviction`,
    /// `fail-over`, `transaction pooler`, …).
    pub row: String,
    /// What holds here.
    pub verdict: Verdict,
    /// The setting that decides it, with its value here (`appendfsync=everysec`).
    pub setting: String,
    /// Why the setting gives that verdict, in one sentence.
    pub why: String,
}

impl Finding {
    /// A finding of `row`: `verdict`, decided by `setting`, because `why`.
    pub fn new(
        row: impl Into<String>,
        verdict: Verdict,
        setting: impl Into<String>,
        why: impl Into<String>,
    ) -> Self {
        Self {
            row: row.into(),
            verdict,
            setting: setting.into(),
            why: why.into(),
        }
    }
}

/// What holds for a row here, in the words of `docs/guarantees.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// At most one holder believes it holds the lease at any moment; fences only rise.
    Holds,
    /// Two holders may believe at once, but fences only rise: the guard rejects the older
    /// holder's writes.
    FencesHold,
    /// Neither: the setting loses grants and fences together.
    DoesNotHold,
    /// The setting could not be read (not permitted, not exposed by the server).
    Unknown,
}

impl Verdict {
    /// The verdict as `docs/guarantees.md` writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::FencesHold => "fences hold",
            Verdict::DoesNotHold => "does not hold",
            Verdict::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fact_named_twice_keeps_the_last_value_in_the_first_place() {
        let mut d = Diagnosis::new();
        d.fact("server version", "1").fact("TLS", "no");
        d.fact("server version", "2");
        assert_eq!(d.fact_value("server version"), Some("2"));
        assert_eq!(d.fact_value("TLS"), Some("no"));
        assert_eq!(d.fact_value("identity"), None);
        let names: Vec<_> = d.facts.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["server version", "TLS"]);
    }

    #[test]
    fn only_rows_that_do_not_hold_are_refused() {
        let mut d = Diagnosis::new();
        for (row, verdict) in [
            ("holder crash", Verdict::Holds),
            ("restart with persistence", Verdict::FencesHold),
            ("eviction", Verdict::DoesNotHold),
            ("fail-over", Verdict::Unknown),
        ] {
            d.finding(Finding::new(row, verdict, "s=v", "because"));
        }
        let refused: Vec<_> = d.not_holding().map(|f| f.row.as_str()).collect();
        assert_eq!(
            refused,
            ["restart with persistence", "eviction", "fail-over"]
        );
        assert_eq!(
            d.row("eviction").map(|f| f.verdict),
            Some(Verdict::DoesNotHold)
        );
        assert_eq!(d.row("eviction").map(|f| f.setting.as_str()), Some("s=v"));
        assert!(d.row("clock jump").is_none());
        d.warn("w");
        assert_eq!(d.warnings, ["w"]);
    }

    #[test]
    fn verdicts_read_as_the_guarantees_table_writes_them() {
        let all = [
            (Verdict::Holds, "holds"),
            (Verdict::FencesHold, "fences hold"),
            (Verdict::DoesNotHold, "does not hold"),
            (Verdict::Unknown, "unknown"),
        ];
        for (v, s) in all {
            assert_eq!(v.to_string(), s);
        }
    }
}
