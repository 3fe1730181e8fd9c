//! `docs/guarantees.md` cannot drift: every test it names exists (as a test, or as a shared
//! case that the named backend file runs), every store × fault pair has exactly one row,
//! and a verdict that claims something names at least one test. The checker is itself
//! shown to fail on doctored tables.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const STORES: [&str; 10] = [
    "redis",
    "redis-cluster",
    "postgres",
    "postgres-advisory",
    "mysql",
    "mysql-getlock",
    "sqlite",
    "etcd",
    "zookeeper",
    "redlock",
];

const FAULTS: [&str; 11] = [
    "process pause",
    "holder crash",
    "restart with persistence",
    "restart without persistence",
    "fail-over",
    "server paused",
    "clock jump",
    "host suspend",
    "network partition",
    "eviction",
    "transaction pooler",
];

const VERDICTS: [&str; 6] = [
    "holds",
    "fences hold",
    "fails closed",
    "does not hold",
    "not applicable",
    "not tested",
];

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/<name> sits two levels below the root")
        .to_path_buf()
}

/// Whether `source` defines a test function `name`: `fn name(` preceded, within a few
/// lines, by a `#[test]` or `#[tokio::test…]` attribute.
fn defines_test(source: &str, name: &str) -> bool {
    let lines: Vec<&str> = source.lines().collect();
    lines.iter().enumerate().any(|(i, l)| {
        let l = l.trim_start();
        let l = l.strip_prefix("async ").unwrap_or(l);
        l.starts_with(&format!("fn {name}("))
            && lines[i.saturating_sub(4)..i]
                .iter()
                .any(|a| a.trim_start().starts_with("#[test]") || a.contains("#[tokio::test"))
    })
}

/// Whether `source` defines a shared conformance case `name`.
fn defines_case(source: &str, name: &str) -> bool {
    source.contains(&format!("pub async fn {name}("))
}

/// Checks one reference `crate/tests/file.rs::name`; `None` if it is sound.
fn check_ref(root: &Path, reference: &str) -> Option<String> {
    let Some((path, name)) = reference.split_once("::") else {
        return Some(format!(
            "`{reference}` is not of the form crate/tests/file.rs::test"
        ));
    };
    let file = root.join("crates").join(path);
    let Ok(source) = std::fs::read_to_string(&file) else {
        return Some(format!("`{reference}`: no file {}", file.display()));
    };
    if defines_test(&source, name) {
        return None;
    }
    let conformance = root.join("crates/leasehold-conformance/src");
    let read = |f: &str| std::fs::read_to_string(conformance.join(f)).unwrap_or_default();
    let shared = (source.contains("conformance_suite!")
        && (defines_case(&read("cases.rs"), name) || defines_case(&read("coordination.rs"), name)))
        || (source.contains("fault_suite!") && defines_case(&read("fault_cases.rs"), name));
    if shared {
        None
    } else {
        Some(format!(
            "`{reference}`: no test `{name}` in {path}, nor a shared case it runs"
        ))
    }
}

/// Every problem with `doc`, a guarantees table.
fn check(doc: &str, root: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    let rows = doc
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| store ") && !l.starts_with("| ---"));
    for row in rows {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
        let [store, fault, verdict, _what, tests] = cells[..] else {
            errors.push(format!("a row without 5 cells: {row}"));
            continue;
        };
        if !STORES.contains(&store) {
            errors.push(format!("unknown store `{store}`"));
        }
        if !FAULTS.contains(&fault) {
            errors.push(format!("unknown fault `{fault}`"));
        }
        if !VERDICTS.contains(&verdict) {
            errors.push(format!("{store} × {fault}: unknown verdict `{verdict}`"));
        }
        *seen.entry((store.into(), fault.into())).or_default() += 1;
        let refs: Vec<&str> = tests
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, r)| r)
            .collect();
        let claims = matches!(verdict, "holds" | "fences hold" | "fails closed");
        if claims && refs.is_empty() {
            errors.push(format!("{store} × {fault}: `{verdict}` names no test"));
        }
        errors.extend(refs.iter().filter_map(|r| check_ref(root, r)));
    }
    // The text outside the table (leader election, semaphores) names tests too: each
    // must exist.
    for line in doc.lines().filter(|l| !l.starts_with("| ")) {
        let refs = line
            .split('`')
            .enumerate()
            .filter(|(i, r)| i % 2 == 1 && r.contains(".rs::") && !r.starts_with("crate/"))
            .map(|(_, r)| r);
        errors.extend(refs.filter_map(|r| check_ref(root, r)));
    }
    for store in STORES {
        for fault in FAULTS {
            match seen.get(&(store.into(), fault.into())) {
                Some(1) => {}
                Some(n) => errors.push(format!("{store} × {fault}: {n} rows")),
                None => errors.push(format!("{store} × {fault}: no row")),
            }
        }
    }
    errors
}

fn doc() -> String {
    std::fs::read_to_string(root().join("docs/guarantees.md")).expect("docs/guarantees.md")
}

#[test]
fn the_guarantees_table_names_only_tests_that_exist() {
    let errors = check(&doc(), &root());
    assert!(
        errors.is_empty(),
        "docs/guarantees.md:\n{}",
        errors.join("\n")
    );
}

#[test]
fn the_checker_catches_a_missing_test_a_missing_row_and_a_bare_claim() {
    let root = root();
    let good = doc();
    // A test that does not exist.
    let bad = good.replacen(
        "faults.rs::row_01_paused_holder_process",
        "faults.rs::row_01_no_such_test",
        1,
    );
    assert!(
        check(&bad, &root)
            .iter()
            .any(|e| e.contains("no test `row_01_no_such_test`"))
    );
    // A shared case named on a file that does not run the suite.
    let bad = good.replacen(
        "leasehold-redis/tests/conformance_standalone.rs::holder_killed_is_taken_over_after_its_ttl",
        "leasehold-redis/tests/faults.rs::holder_killed_is_taken_over_after_its_ttl",
        1,
    );
    assert!(
        check(&bad, &root)
            .iter()
            .any(|e| e.contains("faults.rs::holder_killed_is_taken_over_after_its_ttl"))
    );
    // A test named in a bullet list (leader election, semaphores) that does not exist.
    let bad = good.replacen(
        "conformance.rs::one_leader_at_a_time_and_terms_rise",
        "conformance.rs::one_leader_at_a_time_and_no_such_case",
        1,
    );
    assert!(
        check(&bad, &root)
            .iter()
            .any(|e| e.contains("one_leader_at_a_time_and_no_such_case"))
    );
    // A helper that is not a test.
    let bad = good.replacen(
        "faults.rs::row_01_paused_holder_process",
        "faults.rs::raw_lease",
        1,
    );
    assert!(check(&bad, &root).iter().any(|e| e.contains("`raw_lease`")));
    // A missing row.
    let bad: String = good
        .lines()
        .filter(|l| !l.starts_with("| sqlite | eviction |"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        check(&bad, &root)
            .iter()
            .any(|e| e == "sqlite × eviction: no row")
    );
    // A claim without a test.
    let bad = good.replacen(
        "| redis | holder crash | holds | a `kill -9`ed holder is taken over after its TTL, not before | `leasehold-redis/tests/conformance_standalone.rs::holder_killed_is_taken_over_after_its_ttl` |",
        "| redis | holder crash | holds | taken over after its TTL | — |",
        1,
    );
    assert!(
        check(&bad, &root)
            .iter()
            .any(|e| e == "redis × holder crash: `holds` names no test")
    );
    // A verdict outside the vocabulary.
    let bad = good.replacen(
        "| redis | eviction | fails closed |",
        "| redis | eviction | mostly |",
        1,
    );
    assert!(
        check(&bad, &root)
            .iter()
            .any(|e| e.contains("unknown verdict `mostly`"))
    );
}
