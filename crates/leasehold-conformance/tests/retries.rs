//! No retries for safety: `.config/nextest.toml` gives no test a retry, in any profile,
//! except a named list of timing tests, each with its reason, none of them a safety test.
//! A bug that shows in 30 % of runs passes a run with one retry 91 % of the time.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/<name> sits two levels below the root")
        .to_path_buf()
}

/// What may never be retried: the suites and tests whose failure is a wrong answer.
const SAFETY: &[&str] = &[
    "leasehold-conformance",
    "leasehold-chaos",
    "conformance",
    "broken",
    "guarantee",
    "faults",
    "row_",
    "checker",
    "fence",
    "exclusive",
];

/// Every problem with `config`, the text of a nextest configuration.
fn check(config: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let lines: Vec<&str> = config.lines().collect();
    // The section each line is in, and the override's filter.
    let mut section = String::new();
    let mut filter: Option<(usize, String)> = None;
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        if t.starts_with('[') {
            section = t.to_owned();
            filter = None;
            continue;
        }
        if let Some(f) = t.strip_prefix("filter = ") {
            filter = Some((i, f.trim_matches('"').to_owned()));
            continue;
        }
        let Some(n) = t.strip_prefix("retries = ") else {
            continue;
        };
        let n = n.split('#').next().unwrap_or("").trim();
        if !section.contains("overrides") {
            if n != "0" {
                errors.push(format!(
                    "line {}: `{section}` retries every test ({n}): only named timing tests may \
                     have a retry",
                    i + 1
                ));
            }
            continue;
        }
        if n == "0" {
            continue;
        }
        let Some((at, f)) = &filter else {
            errors.push(format!("line {}: a retry without a filter", i + 1));
            continue;
        };
        let named = f.split('|').all(|p| {
            let p = p.trim();
            p.starts_with("test(=") && p.ends_with(')') && !p.contains('/')
        });
        if !named {
            errors.push(format!(
                "line {}: a retry must name its tests exactly (`test(=name)`), not `{f}`",
                at + 1
            ));
        }
        if let Some(s) = SAFETY.iter().find(|s| f.contains(**s)) {
            errors.push(format!(
                "line {}: `{f}` looks like a safety test (`{s}`): never retried",
                at + 1
            ));
        }
        if n != "1" {
            errors.push(format!("line {}: at most one retry, not {n}", i + 1));
        }
        // The reason: a comment right above the override's table header.
        let header = (0..*at).rev().find(|&j| lines[j].trim().starts_with("[["));
        let reason = header.is_some_and(|h| h > 0 && lines[h - 1].trim().starts_with("# "));
        if !reason {
            errors.push(format!(
                "line {}: a retried test needs its reason in a comment above its override",
                at + 1
            ));
        }
    }
    errors
}

#[test]
fn no_test_is_retried_but_named_timing_tests_with_their_reasons() {
    let config =
        std::fs::read_to_string(root().join(".config/nextest.toml")).expect(".config/nextest.toml");
    let errors = check(&config);
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn the_check_catches_a_blanket_retry_and_a_retried_safety_test() {
    let blanket = "[profile.ci]\nretries = 1\n";
    assert!(check(blanket)[0].contains("retries every test"));
    let safety =
        "# slow\n[[profile.ci.overrides]]\nfilter = \"test(=row_07_blackhole)\"\nretries = 1\n";
    assert!(check(safety).iter().any(|e| e.contains("safety test")));
    let pattern = "# slow\n[[profile.ci.overrides]]\nfilter = \"test(/watch/)\"\nretries = 1\n";
    assert!(check(pattern).iter().any(|e| e.contains("exactly")));
    let silent = "[[profile.ci.overrides]]\nfilter = \"test(=a_watch_wakes)\"\nretries = 1\n";
    assert!(check(silent).iter().any(|e| e.contains("reason")));
    let fine = "# a stalled machine delays the notice, never a wrong one\n[[profile.ci.overrides]]\nfilter = \"test(=a_watch_wakes)\"\nretries = 1\n";
    assert_eq!(check(fine), Vec::<String>::new());
    assert_eq!(check("[profile.ci]\nretries = 0\n"), Vec::<String>::new());
}
