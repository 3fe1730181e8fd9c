//! `leasehold demo --html FILE`, black-box: the timeline picture a person understands
//! without the text (issue 27 item 7). The page is read as the generator wrote it: marks,
//! ticks and legend entries carry their coordinates as `data-` attributes, so the checks
//! are on positions, never on pixels.

use std::process::Output;

mod common;

use common::{Env, stderr, stdout};

/// The opening tags in `page` that start with `start`.
fn tags<'a>(page: &'a str, start: &str) -> Vec<&'a str> {
    page.match_indices(start)
        .map(|(i, _)| &page[i..i + page[i..].find('>').unwrap()])
        .collect()
}

/// The value of attribute `name` in an opening `tag`.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let from = tag.find(&key)? + key.len();
    Some(&tag[from..from + tag[from..].find('"')?])
}

fn num(tag: &str, name: &str) -> f64 {
    attr(tag, name)
        .unwrap_or_else(|| panic!("{name} in {tag}"))
        .parse()
        .unwrap()
}

/// A mark as the page places it.
#[derive(Debug)]
struct Mark {
    role: String,
    worker: String,
    cx: f64,
    cy: f64,
    r: f64,
}

fn marks(page: &str) -> Vec<Mark> {
    tags(page, "<g class=\"mark\"")
        .into_iter()
        .map(|t| Mark {
            role: attr(t, "data-role").unwrap().to_owned(),
            worker: attr(t, "data-worker").unwrap().to_owned(),
            cx: num(t, "data-cx"),
            cy: num(t, "data-cy"),
            r: num(t, "data-r"),
        })
        .collect()
}

/// Runs the demo and returns its output and its page.
fn demo(env: &Env, unfenced: bool) -> (Output, String) {
    let html = env.path(if unfenced {
        "unfenced.html"
    } else {
        "fenced.html"
    });
    let mut args = vec!["demo", "--html", html.to_str().unwrap()];
    if unfenced {
        args.push("--unfenced");
    }
    let out = env.run(&args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    (out, std::fs::read_to_string(&html).unwrap())
}

/// The fences the demo printed ("acquires the lease…, fence N").
fn printed_fences(out: &Output) -> Vec<String> {
    stdout(out)
        .lines()
        .filter(|l| l.contains("acquires the lease"))
        .map(|l| l.rsplit("fence ").next().unwrap().trim().to_owned())
        .collect()
}

fn check_picture(unfenced: bool, out: &Output, page: &str) {
    let what = if unfenced { "unfenced" } else { "fenced" };
    let marks = marks(page);

    // A legend, naming every kind of mark drawn.
    assert!(page.contains("<g class=\"legend\">"), "{what}: no legend");
    let legend: Vec<&str> = tags(page, "<g class=\"legend-entry\"")
        .into_iter()
        .map(|t| attr(t, "data-role").unwrap())
        .collect();
    for role in ["held", "frozen", "deadline"] {
        assert!(legend.contains(&role), "{what}: {role} not in {legend:?}");
    }
    for m in &marks {
        assert!(
            legend.contains(&m.role.as_str()),
            "{what}: {m:?} not in {legend:?}"
        );
    }

    // A learns of the loss right before its write: both in sight.
    let lost = marks
        .iter()
        .find(|m| m.role == "lost")
        .expect("a lost marker");
    let write = marks
        .iter()
        .find(|m| m.worker == "A" && m.role != "lost")
        .expect("A's write");
    let distance = (lost.cx - write.cx).hypot(lost.cy - write.cy);
    assert!(
        distance > lost.r + write.r,
        "{what}: the lost marker {lost:?} overlaps the write {write:?}"
    );
    for (i, a) in marks.iter().enumerate() {
        for b in &marks[i + 1..] {
            assert!(
                (a.cx - b.cx).hypot(a.cy - b.cy) > a.r + b.r,
                "{what}: {a:?} overlaps {b:?}"
            );
        }
    }

    // The corrupting write is drawn as corruption: only in the unfenced run.
    let roles: Vec<(&str, &str)> = marks
        .iter()
        .map(|m| (m.worker.as_str(), m.role.as_str()))
        .collect();
    if unfenced {
        assert_eq!(
            roles,
            [("B", "ok"), ("A", "lost"), ("A", "corrupt")],
            "{what}"
        );
        assert!(
            page.contains("CORRUPTION: invoice #1 issued twice"),
            "{page}"
        );
        assert!(
            page.contains("class=\"dup\""),
            "the two writes of #1 are linked"
        );
    } else {
        assert_eq!(
            roles,
            [("B", "ok"), ("A", "lost"), ("A", "rejected")],
            "{what}"
        );
        assert!(!page.contains("data-role=\"corrupt\""));
    }

    // Ticks: 0 and on by one round step, evenly spaced, labelled with their value.
    let ticks: Vec<(u64, f64, &str)> = tags(page, "<text x=")
        .into_iter()
        .filter(|t| t.contains("class=\"tick\""))
        .map(|t| {
            let ms: u64 = attr(t, "data-ms").unwrap().parse().unwrap();
            let end = page.find(t).unwrap() + t.len() + 1;
            let label = &page[end..end + page[end..].find('<').unwrap()];
            (ms, num(t, "x"), label)
        })
        .collect();
    assert!(ticks.len() >= 3 && ticks.len() <= 8, "{what}: {ticks:?}");
    assert_eq!(ticks[0].0, 0);
    let step = ticks[1].0;
    let mut mantissa = step;
    while mantissa.is_multiple_of(10) {
        mantissa /= 10;
    }
    assert!([1, 2, 5, 25].contains(&mantissa), "{what}: step {step} ms");
    let dx = ticks[1].1 - ticks[0].1;
    for pair in ticks.windows(2) {
        assert_eq!(pair[1].0 - pair[0].0, step, "{what}: {ticks:?}");
        // Positions are written with one decimal.
        assert!(
            (pair[1].1 - pair[0].1 - dx).abs() <= 0.11,
            "{what}: {ticks:?}"
        );
    }
    for (ms, _, label) in &ticks {
        let secs: f64 = label.strip_suffix(" s").unwrap().parse().unwrap();
        assert!(
            (secs * 1000.0 - *ms as f64).abs() < 1e-6,
            "{label} at {ms} ms"
        );
    }

    // Fences: short on the picture, the full value on hover.
    let fences = printed_fences(out);
    assert_eq!(fences.len(), 2, "{}", stdout(out));
    for full in &fences {
        assert!(
            page.contains(&format!("<title>fence {full}</title>")),
            "{what}: fence {full} has no <title>"
        );
        let shown: Vec<&str> = tags(page, "<text x=")
            .into_iter()
            .filter(|t| attr(t, "data-fence") == Some(full))
            .collect();
        assert_eq!(shown.len(), 1, "{what}: fence {full}");
        let end = page.find(shown[0]).unwrap() + shown[0].len() + 1;
        let text = &page[end..end + page[end..].find('<').unwrap()];
        let digits = text.trim_start_matches("fence …");
        assert!(
            full.ends_with(digits) && digits.len() < full.len(),
            "{text}"
        );
    }
}

#[test]
fn the_fenced_picture_has_a_legend_round_ticks_and_the_lost_marker_in_sight() {
    let env = Env::new();
    let (out, page) = demo(&env, false);
    check_picture(false, &out, &page);
}

#[test]
fn the_unfenced_picture_draws_the_corrupting_write_as_corruption() {
    let env = Env::new();
    let (out, page) = demo(&env, true);
    assert!(stdout(&out).contains("CORRUPTED"), "{}", stdout(&out));
    check_picture(true, &out, &page);
}
