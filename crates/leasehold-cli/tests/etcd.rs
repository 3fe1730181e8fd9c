//! The `leasehold` command against a private etcd (`--store etcd://…`): built only with
//! the `etcd` feature (`scripts/test` turns it on).
#![cfg(feature = "etcd")]

use std::time::Duration;

use leasehold_testkit::{EtcdServer, WorkerProcess};

mod common;

use common::{Env, stderr, stdout, wait_for_file};

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

#[test]
fn run_on_etcd_passes_the_fence_and_fences_rise() {
    let etcd = EtcdServer::start();
    let env = Env::new();
    let url = etcd.url();
    let fence = |env: &Env| -> u64 {
        let out = env.run_ok(&[
            "--store",
            &url,
            "run",
            "--key",
            "job:etcd",
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_FENCE",
        ]);
        stdout(&out)
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{e}: {:?} {}", stdout(&out), stderr(&out)))
    };
    let first = fence(&env);
    assert!(first > 0);
    let second = fence(&env);
    assert!(second > first, "{second} <= {first}");
    // Released after each run.
    let v = json(&env.run_ok(&["--store", &url, "inspect", "job:etcd", "--json"]));
    assert_eq!(v["held"], false, "{v}");
}

#[test]
fn inspect_list_and_break_on_etcd() {
    let etcd = EtcdServer::start();
    let env = Env::new();
    let url = etcd.url();
    let pidfile = env.path("child.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut holder = env.cmd();
    holder.args([
        "--store", &url, "run", "--key", "job:busy", "--ttl", "4s", "--", "sh", "-c", &script,
    ]);
    let holder = WorkerProcess::spawn(holder);
    wait_for_file(&pidfile, Duration::from_secs(20));
    let out = env.run(&[
        "--store",
        &url,
        "run",
        "--key",
        "job:busy",
        "--no-wait",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    let v = json(&env.run_ok(&["--store", &url, "inspect", "job:busy", "--json"]));
    assert_eq!(v["held"], true, "{v}");
    let fence = v["lease"]["fence"].as_u64().unwrap();
    let v = json(&env.run_ok(&["--store", &url, "list", "job:", "--json"]));
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    let v = json(&env.run_ok(&["--store", &url, "break", "job:busy", "--json"]));
    assert!(v["fence"].as_u64().unwrap() > fence, "{v}");
    // The evicted holder learns at its next renewal and exits with "lease lost".
    let status = holder
        .wait_timeout(Duration::from_secs(20))
        .expect("the evicted holder exits");
    assert_eq!(status.code(), Some(70));
}

/// `leasehold doctor` on etcd: one member cannot fail over (unknown, so `--require holds`
/// exits 78); three members carry every grant through the loss of one (holds).
#[test]
fn doctor_on_etcd_judges_fail_over_by_the_members() {
    let env = Env::new();
    let solo = EtcdServer::start();
    let out = env.run(&[
        "--store",
        &solo.url(),
        "doctor",
        "--json",
        "--require",
        "holds",
    ]);
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let v = json(&out);
    assert!(
        v["facts"]["server version"]
            .as_str()
            .unwrap()
            .starts_with("etcd 3."),
        "{v}"
    );
    assert_eq!(
        v["facts"]["health"], "a leader, no member errors, no alarms",
        "{v}"
    );
    let fail_over = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["row"] == "fail-over")
        .unwrap();
    assert_eq!(fail_over["verdict"], "unknown", "{v}");
    assert_eq!(fail_over["setting"], "1 member(s)", "{v}");
    let cluster = leasehold_testkit::EtcdCluster::start();
    let out = env.run(&[
        "--store",
        &cluster.url(),
        "doctor",
        "--json",
        "--require",
        "holds",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["ok"], true, "{v}");
}

/// etcd's TLS failures are the same type as the SQL stores' (`leasehold::TlsFailure`): a
/// member signed by a CA the URL does not name, and one whose certificate names another
/// host, exit 69 with their own lines (docs/cli.md, "Errors a script can expect").
#[test]
fn etcd_tls_causes() {
    use leasehold_testkit::{EtcdOptions, ServerCert};
    let env = Env::new();
    let etcd = EtcdServer::start_with(EtcdOptions::new().tls(ServerCert::Localhost));
    let tls = etcd.tls().unwrap();
    // The test kit's members also ask for a client certificate.
    let url = |ca: &std::path::Path| {
        format!(
            "etcd://127.0.0.1:{}?connect_timeout=2s&tls=true&cacert={}&cert={}&key={}",
            etcd.port(),
            ca.display(),
            tls.client_cert().display(),
            tls.client_key().display()
        )
    };
    let out = env.run(&["--store", &url(&tls.ca_cert()), "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.run(&["--store", &url(&tls.wrong_ca_cert()), "list"]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with(
            "leasehold: store error: the server's TLS certificate is not signed by a trusted CA"
        ),
        "{}",
        stderr(&out)
    );
    let other = EtcdServer::start_with(EtcdOptions::new().tls(ServerCert::WrongHost));
    let files = other.tls().unwrap();
    let url = format!(
        "etcd://127.0.0.1:{}?connect_timeout=2s&tls=true&cacert={}&cert={}&key={}",
        other.port(),
        files.ca_cert().display(),
        files.client_cert().display(),
        files.client_key().display()
    );
    let out = env.run(&["--store", &url, "list"]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with(
            "leasehold: store error: the server's TLS certificate does not name the host"
        ),
        "{err}"
    );
    assert!(err.contains("`127.0.0.1`"), "{err}");
    // Plaintext to a TLS member: dropped, then found to speak TLS.
    let plain = format!("etcd://127.0.0.1:{}?connect_timeout=2s", etcd.port());
    let out = env.run(&["--store", &plain, "list"]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .starts_with("leasehold: store error: the server refused a connection without TLS"),
        "{}",
        stderr(&out)
    );
}

/// etcd over TLS with client certificates: each member answers `/health` on its own client
/// URL over a handshake of leasehold's own (presenting the URL's certificate), which gives
/// the protocol version, the members' certificate, each member's health and its clock
/// against this host's (from the `Date` header: whole seconds, so a bound of about a
/// second).
#[test]
fn doctor_on_etcd_over_tls_asks_each_member_for_its_health_and_clock() {
    use leasehold_testkit::{EtcdOptions, ServerCert};
    let env = Env::new();
    let etcd = EtcdServer::start_with(EtcdOptions::new().tls(ServerCert::Localhost));
    let tls = etcd.tls().unwrap();
    let url = format!(
        "etcd://127.0.0.1:{}?tls=true&cacert={}&cert={}&key={}",
        etcd.port(),
        tls.ca_cert().display(),
        tls.client_cert().display(),
        tls.client_key().display()
    );
    let out = env.run(&["--store", &url, "doctor", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json(&out);
    let facts = &v["facts"];
    let tls_fact = facts["TLS"].as_str().unwrap();
    assert!(
        tls_fact.starts_with("TLSv1.3, TLS13_") || tls_fact.starts_with("TLSv1.2, TLS_"),
        "{v}"
    );
    assert!(
        facts["peer certificate"].as_str().unwrap().starts_with(
            "CN=localhost, issued by CN=leasehold test CA; names localhost, 127.0.0.1; valid until "
        ),
        "{v}"
    );
    let health = facts["member health"].as_str().unwrap();
    assert!(health.ends_with(": healthy"), "{v}");
    assert!(health.contains("https://"), "{v}");
    let skew = facts["clock skew"].as_str().unwrap();
    // The same host's clock: the interval holds zero and is about a second wide.
    let (low, high) = skew
        .split_once("(between ")
        .and_then(|(_, r)| r.split_once(" s)"))
        .and_then(|(r, _)| r.split_once(" and "))
        .map(|(l, h)| (l.parse::<f64>().unwrap(), h.parse::<f64>().unwrap()))
        .unwrap_or_else(|| panic!("{skew}"));
    assert!(low <= 0.0 && high >= 0.0 && high - low < 3.0, "{skew}");
    assert!(
        !v["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("clock")),
        "{v}"
    );
}
