//! `docs/guarantees.md` cannot drift or over-claim:
//!
//! - every store × fault pair has exactly one row, with a verdict of the vocabulary;
//! - every test a row names exists (as a test, or as a shared case that the named backend
//!   file runs);
//! - a row that claims something (`holds`, `fences hold`, `fails closed`) names at least
//!   one test, and **every** test it names is tagged with that row's store and fault
//!   (`proves(Backend::…, Fault::…)` in the test's body, or `fx.proves(Fault::…)` in a
//!   shared case whose suite the backend file runs with `backend = …`): a row proven only
//!   on another store, or by a test that injects another fault, is rejected. At run time
//!   the tag's [`Proof`](leasehold_conformance::proof::Proof) fails the test unless the
//!   test kit saw it inject that fault on that store;
//! - the table's summary line, and the README's, count the rows as they are.
//!
//! The checker is itself shown to fail on doctored tables.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use leasehold_conformance::proof::{Backend, Fault};

const VERDICTS: [&str; 6] = [
    "holds",
    "fences hold",
    "fails closed",
    "does not hold",
    "not applicable",
    "not tested",
];

const CLAIMS: [&str; 3] = ["holds", "fences hold", "fails closed"];

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/<name> sits two levels below the root")
        .to_path_buf()
}

/// The body of the function `name` in `source` (from its `fn` line to the closing brace
/// at the same indentation), if it is defined there.
fn body<'a>(source: &'a str, name: &str) -> Option<(usize, Vec<&'a str>)> {
    let lines: Vec<&str> = source.lines().collect();
    let start = lines.iter().position(|l| {
        let t = l.trim_start();
        let t = t.strip_prefix("pub ").unwrap_or(t);
        let t = t.strip_prefix("async ").unwrap_or(t);
        t.starts_with(&format!("fn {name}("))
    })?;
    let indent = lines[start].len() - lines[start].trim_start().len();
    let close = format!("{}}}", " ".repeat(indent));
    let end = (start..lines.len())
        .find(|&i| lines[i] == close)
        .unwrap_or(lines.len() - 1);
    Some((start, lines[start..=end].to_vec()))
}

/// Whether `source` defines a test function `name`: `fn name(` preceded, within a few
/// lines, by a `#[test]` or `#[tokio::test…]` attribute.
fn defines_test(source: &str, name: &str) -> bool {
    let lines: Vec<&str> = source.lines().collect();
    body(source, name).is_some_and(|(i, _)| {
        lines[i.saturating_sub(4)..i]
            .iter()
            .any(|a| a.trim_start().starts_with("#[test]") || a.contains("#[tokio::test"))
    })
}

/// The tags in `body`: `proves(Backend::B, Fault::F)` gives `(Some(B), F)`,
/// `fx.proves(Fault::F)` gives `(None, F)` (the suite's backend).
fn tags(body: &[&str]) -> Vec<(Option<Backend>, Fault)> {
    let text = body.join("\n");
    let ident = |s: &str, after: &str| -> Option<String> {
        let at = s.find(after)? + after.len();
        Some(
            s[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect(),
        )
    };
    text.match_indices("proves(")
        .filter_map(|(at, _)| {
            let call = &text[at..];
            let call = &call[..call.find(')').unwrap_or(call.len())];
            let fault = Fault::from_variant(&ident(call, "Fault::")?)?;
            let backend = ident(call, "Backend::").and_then(|b| Backend::from_variant(&b));
            Some((backend, fault))
        })
        .collect()
}

/// The `backend = …` of the suite macro `mac` in a backend's test file.
fn suite_backend(source: &str, mac: &str) -> Option<Backend> {
    let at = source.find(&format!("{mac}!("))?;
    let rest = &source[at..];
    let rest = &rest[..rest.find(')')?];
    let b = rest.split("backend = ").nth(1)?;
    let b: String = b.chars().take_while(char::is_ascii_alphanumeric).collect();
    Backend::from_variant(&b)
}

/// A test a row names, as found.
#[derive(Debug)]
struct Found {
    /// The rows (store, fault) it is tagged with.
    proves: BTreeSet<(Backend, Fault)>,
}

/// Finds the test `crate/tests/file.rs::name`.
fn find(root: &Path, reference: &str) -> Result<Found, String> {
    let Some((path, name)) = reference.split_once("::") else {
        return Err(format!(
            "`{reference}` is not of the form crate/tests/file.rs::test"
        ));
    };
    let file = root.join("crates").join(path);
    let Ok(source) = std::fs::read_to_string(&file) else {
        return Err(format!("`{reference}`: no file {}", file.display()));
    };
    if defines_test(&source, name) {
        let (_, lines) = body(&source, name).expect("defined");
        let proves = tags(&lines)
            .into_iter()
            .filter_map(|(b, f)| b.map(|b| (b, f)))
            .collect();
        return Ok(Found { proves });
    }
    let conformance = root.join("crates/leasehold-conformance/src");
    let read = |f: &str| std::fs::read_to_string(conformance.join(f)).unwrap_or_default();
    let suites = [
        (
            "conformance_suite",
            ["cases.rs", "coordination.rs", "holder_faults.rs"].as_slice(),
        ),
        ("fault_suite", ["fault_cases.rs"].as_slice()),
    ];
    for (mac, files) in suites {
        if !source.contains(&format!("{mac}!(")) {
            continue;
        }
        for f in files {
            let case_source = read(f);
            let Some((_, lines)) = body(&case_source, name) else {
                continue;
            };
            if !lines[0].trim_start().starts_with("pub async fn") {
                continue;
            }
            let backend = suite_backend(&source, mac)
                .ok_or_else(|| format!("`{reference}`: its `{mac}!` names no `backend = …`"))?;
            let proves = tags(&lines)
                .into_iter()
                .map(|(b, f)| (b.unwrap_or(backend), f))
                .collect();
            return Ok(Found { proves });
        }
    }
    Err(format!(
        "`{reference}`: no test `{name}` in {path}, nor a shared case it runs"
    ))
}

/// The test references in a cell of backticked names.
fn refs(cell: &str) -> Vec<&str> {
    cell.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, r)| r)
        .collect()
}

/// The table's rows: (store, fault, verdict, tests cell).
fn rows(doc: &str) -> Vec<Result<[&str; 4], String>> {
    doc.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| store ") && !l.starts_with("| ---"))
        .map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
            match cells[..] {
                [store, fault, verdict, _what, tests] => Ok([store, fault, verdict, tests]),
                _ => Err(format!("a row without 5 cells: {row}")),
            }
        })
        .collect()
}

/// The summary sentence the table's counts give.
fn summary(doc: &str) -> String {
    let mut by_verdict: BTreeMap<&str, usize> = BTreeMap::new();
    for row in rows(doc).into_iter().flatten() {
        *by_verdict.entry(row[2]).or_default() += 1;
    }
    let n = |v: &str| by_verdict.get(v).copied().unwrap_or(0);
    let claims: usize = CLAIMS.iter().map(|v| n(v)).sum();
    format!(
        "Summary: {claims} rows claim a guarantee ({} holds, {} fences hold, {} fails closed), \
         each proven on its own store by a test that injects its fault; {} rows are not \
         tested, {} do not hold, {} are not applicable.",
        n("holds"),
        n("fences hold"),
        n("fails closed"),
        n("not tested"),
        n("does not hold"),
        n("not applicable"),
    )
}

/// Every problem with `doc`, a guarantees table, and `readme`, the README.
fn check(doc: &str, readme: &str, root: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    for row in rows(doc) {
        let [store, fault, verdict, tests] = match row {
            Ok(row) => row,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let backend = Backend::ROWS.into_iter().find(|b| b.row_name() == store);
        let fault_of = Fault::ALL.into_iter().find(|f| f.row_name() == fault);
        if backend.is_none() {
            errors.push(format!("unknown store `{store}`"));
        }
        if fault_of.is_none() {
            errors.push(format!("unknown fault `{fault}`"));
        }
        if !VERDICTS.contains(&verdict) {
            errors.push(format!("{store} × {fault}: unknown verdict `{verdict}`"));
        }
        *seen.entry((store.into(), fault.into())).or_default() += 1;
        let refs = refs(tests);
        let claims = CLAIMS.contains(&verdict);
        if claims && refs.is_empty() {
            errors.push(format!("{store} × {fault}: `{verdict}` names no test"));
        }
        for r in refs {
            match find(root, r) {
                Err(e) => errors.push(e),
                Ok(found) => {
                    if let (true, Some(b), Some(f)) = (claims, backend, fault_of)
                        && !found.proves.contains(&(b, f))
                    {
                        errors.push(format!(
                            "{store} × {fault}: `{r}` is not tagged as proving it (its tags: \
                             {:?}); a claim row names only tests that inject its fault on its \
                             store",
                            found.proves
                        ));
                    }
                }
            }
        }
    }
    // The text outside the table (leader election, semaphores) names tests too: each
    // must exist.
    for line in doc.lines().filter(|l| !l.starts_with("| ")) {
        let refs = line
            .split('`')
            .enumerate()
            .filter(|(i, r)| i % 2 == 1 && r.contains(".rs::") && !r.starts_with("crate/"))
            .map(|(_, r)| r);
        errors.extend(refs.filter_map(|r| find(root, r).err()));
    }
    for store in Backend::ROWS {
        for fault in Fault::ALL {
            let pair = (store.row_name().to_owned(), fault.row_name().to_owned());
            match seen.get(&pair) {
                Some(1) => {}
                Some(n) => errors.push(format!("{store} × {fault}: {n} rows")),
                None => errors.push(format!("{store} × {fault}: no row")),
            }
        }
    }
    let summary = summary(doc);
    if !doc.lines().any(|l| l == summary) {
        errors.push(format!(
            "docs/guarantees.md must say, on a line of its own:\n{summary}"
        ));
    }
    let short = summary.trim_start_matches("Summary: ");
    if !readme.replace('\n', " ").contains(short) {
        errors.push(format!("README.md must say: {short}"));
    }
    errors
}

fn doc() -> String {
    std::fs::read_to_string(root().join("docs/guarantees.md")).expect("docs/guarantees.md")
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

#[test]
fn every_claim_row_is_proven_on_its_own_store_by_a_test_of_its_fault() {
    let errors = check(&doc(), &readme(), &root());
    assert!(
        errors.is_empty(),
        "docs/guarantees.md:\n{}",
        errors.join("\n")
    );
}

/// `good` with its first `from` replaced by `to`, which must be there.
fn doctor(good: &str, from: &str, to: &str) -> String {
    assert!(
        good.contains(from),
        "the doctored text is not in the table: {from}"
    );
    good.replacen(from, to, 1)
}

fn fails_with(doc: &str, wanted: &str) {
    let errors = check(doc, &readme(), &root());
    assert!(
        errors.iter().any(|e| e.contains(wanted)),
        "no error containing {wanted:?} in {errors:#?}"
    );
}

#[test]
fn the_checker_catches_a_missing_test_a_missing_row_and_a_bare_claim() {
    let good = doc();
    // A test that does not exist.
    fails_with(
        &doctor(
            &good,
            "faults.rs::row_01_paused_holder_process",
            "faults.rs::row_01_no_such_test",
        ),
        "no test `row_01_no_such_test`",
    );
    // A shared case named on a file that does not run the suite.
    fails_with(
        &doctor(
            &good,
            "leasehold-redis/tests/conformance_standalone.rs::holder_killed_is_taken_over_after_its_ttl",
            "leasehold-redis/tests/faults.rs::holder_killed_is_taken_over_after_its_ttl",
        ),
        "faults.rs::holder_killed_is_taken_over_after_its_ttl",
    );
    // A test named in a bullet list (leader election, semaphores) that does not exist.
    fails_with(
        &doctor(
            &good,
            "conformance.rs::one_leader_at_a_time_and_terms_rise",
            "conformance.rs::one_leader_at_a_time_and_no_such_case",
        ),
        "one_leader_at_a_time_and_no_such_case",
    );
    // A helper that is not a test.
    fails_with(
        &doctor(
            &good,
            "faults.rs::row_01_paused_holder_process",
            "faults.rs::raw_lease",
        ),
        "`raw_lease`",
    );
    // A missing row.
    let bad: String = good
        .lines()
        .filter(|l| !l.starts_with("| sqlite | eviction |"))
        .map(|l| format!("{l}\n"))
        .collect();
    fails_with(&bad, "sqlite × eviction: no row");
    // A claim without a test.
    fails_with(
        &doctor(
            &good,
            "| redis | holder crash | holds | a `kill -9`ed holder is taken over after its TTL, not before | `leasehold-redis/tests/conformance_standalone.rs::holder_killed_is_taken_over_after_its_ttl` |",
            "| redis | holder crash | holds | taken over after its TTL | — |",
        ),
        "redis × holder crash: `holds` names no test",
    );
    // A verdict outside the vocabulary.
    fails_with(
        &doctor(
            &good,
            "| redis | eviction | fails closed |",
            "| redis | eviction | mostly |",
        ),
        "unknown verdict `mostly`",
    );
}

#[test]
fn the_checker_rejects_a_row_proven_on_another_store_or_by_another_fault() {
    let good = doc();
    // The same shared case, run on another store's conformance file.
    fails_with(
        &doctor(
            &good,
            "`leasehold-redis/tests/conformance_cluster.rs::holder_killed_is_taken_over_after_its_ttl`",
            "`leasehold-redis/tests/conformance_standalone.rs::holder_killed_is_taken_over_after_its_ttl`",
        ),
        "redis-cluster × holder crash: `leasehold-redis/tests/conformance_standalone.rs::holder_killed_is_taken_over_after_its_ttl` is not tagged",
    );
    // A test of another fault on the row's own store.
    fails_with(
        &doctor(
            &good,
            "`leasehold-redis/tests/conformance_standalone.rs::holder_killed_is_taken_over_after_its_ttl`",
            "`leasehold-redis/tests/conformance_standalone.rs::row_04_server_paused_lost_before_store_expiry`",
        ),
        "redis × holder crash: `leasehold-redis/tests/conformance_standalone.rs::row_04_server_paused_lost_before_store_expiry` is not tagged",
    );
    // A test that injects nothing (the guard case).
    fails_with(
        &doctor(
            &good,
            "`leasehold-redis/tests/conformance_standalone.rs::holder_killed_is_taken_over_after_its_ttl`",
            "`leasehold-redis/tests/conformance_standalone.rs::stale_writer_rejected_by_guard`",
        ),
        "stale_writer_rejected_by_guard` is not tagged",
    );
}

#[test]
fn the_summary_must_count_the_rows_as_they_are() {
    let good = doc();
    // A claim row turned into "not tested": the old summary no longer matches.
    let bad = doctor(
        &good,
        "| redis | eviction | fails closed |",
        "| redis | eviction | not tested |",
    );
    fails_with(&bad, "docs/guarantees.md must say");
    fails_with(&bad, "README.md must say");
}

#[test]
fn tags_are_read_from_test_bodies_and_suite_macros() {
    let body = [
        "async fn t() {",
        "    let _p = proves(Backend::RedisCluster, Fault::ServerPaused);",
        "    let _q = fx.proves(Fault::HolderCrash);",
        "    let _r = proves(Backend::Nope, Fault::Nope);",
        "}",
    ];
    assert_eq!(
        tags(&body),
        vec![
            (Some(Backend::RedisCluster), Fault::ServerPaused),
            (None, Fault::HolderCrash)
        ]
    );
    let file = "leasehold_conformance::fault_suite!(common::fixture, backend = MysqlGetlock, holder = open);";
    assert_eq!(
        suite_backend(file, "fault_suite"),
        Some(Backend::MysqlGetlock)
    );
    assert_eq!(suite_backend(file, "conformance_suite"), None);
    let source = "fn a() {\n    x();\n}\n\n#[test]\nfn b() {\n    if y {\n    }\n}\n";
    assert_eq!(body_of(source, "b"), 4);
    assert!(defines_test(source, "b"));
    assert!(!defines_test(source, "a"));
}

fn body_of(source: &str, name: &str) -> usize {
    body(source, name).map_or(0, |(_, l)| l.len())
}
