//! The operator's CLI (`ldpsyn-aggregator collections …`), real binaries on both sides: a
//! `serve` process on a temporary SQLite database, the CLI as a second process; people upload
//! through the SDK in between.

use std::process::{Command, Output};

use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::MemoryLedger;
use ldpsyn::schema::Schema;
use serde_json::{Value, json};
use uuid::Uuid;

const ADMIN: &str = "cli-admin-token-0123456789";

mod common;
use common::BIN;

/// `ldpsyn-aggregator collections ARGS` against `base`, with the admin token unless `token`
/// is false.
fn cli(base: &str, args: &[&str], token: bool) -> Output {
    let mut c = Command::new(BIN);
    c.arg("collections")
        .args(args)
        .env("LDPSYN_SERVER", base)
        .env_remove("LDPSYN_ADMIN_TOKEN")
        .env("LDPSYN_LOG", "warn");
    if token {
        c.env("LDPSYN_ADMIN_TOKEN", ADMIN);
    }
    c.output().expect("the CLI runs")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "CLI failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn failed(out: &Output) -> String {
    assert!(!out.status.success(), "CLI succeeded unexpectedly");
    String::from_utf8(out.stderr.clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collections_cli_drives_a_collection() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::serve(ADMIN, &[]);
    let base = server.base.clone();

    assert_eq!(ok(&cli(&base, &["list"], true)).trim(), "no collections");
    let schema_json = json!({"attributes": [
        {"name": "a", "type": "categorical", "labels": ["x", "y", "z"]},
        {"name": "h", "type": "numeric", "min": 0, "max": 10, "bins": 5, "integer": true}]});
    let schema_path = dir.path().join("schema.json");
    std::fs::write(&schema_path, schema_json.to_string()).unwrap();
    let schema_arg = schema_path.display().to_string();
    let create = [
        "create",
        "--schema",
        &schema_arg,
        "--epsilon",
        "2",
        "--target-users",
        "300",
        "--protocol",
        "independence",
        // Kept open at its target, so that the CLI closes a round and finalizes below.
        "--no-auto-finalize",
    ];
    let id: Uuid = ok(&cli(&base, &create, true)).trim().parse().unwrap();

    // A protocol with rounds: the status lists them (kind, state, reports).
    let mut create_auto = create;
    create_auto[8] = "auto";
    create_auto[6] = "50000";
    let auto: Uuid = ok(&cli(&base, &create_auto, true)).trim().parse().unwrap();
    let status = ok(&cli(&base, &["status", &auto.to_string()], true));
    assert!(
        status.contains("rounds      0 1-ways open (0 reports)"),
        "{status}"
    );

    let status = ok(&cli(&base, &["status", &id.to_string()], true));
    assert!(!status.contains("rounds "), "{status}");
    assert!(status.contains("independence at ε = 2"), "{status}");
    assert!(status.contains("0/300 (0.0%)"), "{status}");
    assert!(status.contains("model       not built"), "{status}");
    assert!(
        status.contains("at target   refuse further reports\n"),
        "{status}"
    );
    let listed = ok(&cli(&base, &["list"], true));
    assert!(
        listed.contains(&id.to_string()) && listed.contains("0/300"),
        "{listed}"
    );
    // Refusals print the server's problem and fail.
    let e = failed(&cli(&base, &["finalize", &id.to_string()], true));
    assert!(e.contains("HTTP 4"), "{e}");
    let e = failed(&cli(&base, &["status", &Uuid::nil().to_string()], true));
    assert!(e.contains("HTTP 404"), "{e}");
    let e = failed(&cli(&base, &["list"], false));
    assert!(e.contains("LDPSYN_ADMIN_TOKEN"), "{e}");
    let bad = [
        "create",
        "--schema",
        &schema_arg,
        "--epsilon=-1",
        "--target-users",
        "5",
    ];
    let e = failed(&cli(&base, &bad, true));
    assert!(e.contains("HTTP 400"), "{e}");

    // 300 people answer through the SDK.
    let schema: Schema = serde_json::from_value(schema_json).unwrap();
    let mut people: Vec<SimulatedPerson<MemoryLedger>> = (0..300u32)
        .map(|i| SimulatedPerson {
            record: schema.encoded(vec![i % 3, i % 5]).unwrap(),
            ledger: MemoryLedger::default(),
        })
        .collect();
    let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 1);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    for r in client.submit_batch(&mut people).await.unwrap() {
        r.expect("accepted");
    }

    let status: Value = serde_json::from_str(&ok(&cli(
        &base,
        &["status", &id.to_string(), "--json"],
        true,
    )))
    .unwrap();
    assert_eq!(status["status"]["reports_accepted"], 300, "{status}");
    ok(&cli(&base, &["close-round", &id.to_string()], true));
    let fin = ok(&cli(&base, &["finalize", &id.to_string()], true));
    assert!(fin.contains("finalized"), "{fin}");
    // The independence model: the fitness report's warning, with finalize and status.
    assert!(fin.contains("warning: the model has no edges"), "{fin}");
    let status = ok(&cli(&base, &["status", &id.to_string()], true));
    assert!(status.contains("model       ready"), "{status}");
    assert!(
        status.contains("warning: the model has no edges"),
        "{status}"
    );

    let download = |name: &str| {
        let path = dir.path().join(name).display().to_string();
        let args = [
            "download",
            &id.to_string(),
            "--out",
            &path,
            "--rows",
            "500",
            "--seed",
            "4",
            "--quiet",
        ];
        let said = ok(&cli(&base, &args, true));
        assert!(said.contains("500 rows written"), "{said}");
        assert!(said.contains("warning: the model has no edges"), "{said}");
        std::fs::read(&path).unwrap()
    };
    let first = download("a.csv");
    assert_eq!(first.iter().filter(|&&b| b == b'\n').count(), 501);
    assert!(first.starts_with(b"a,h\n"));
    assert_eq!(first, download("b.csv"), "same seed, same bytes");
    // Without --rows: as many rows as the collection's target users.
    let path = dir.path().join("default.csv").display().to_string();
    let said = ok(&cli(
        &base,
        &["download", &id.to_string(), "--out", &path, "--quiet"],
        true,
    ));
    assert!(said.contains("300 rows written"), "{said}");

    // The analyst's pandas recipe (README), when a Python with pandas is given.
    match std::env::var("LDPSYN_PYTHON") {
        Ok(python) => {
            let script = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../examples/pandas/read_synthetic.py"
            );
            let out = Command::new(python)
                .args([script, &base, &id.to_string(), "250", "a,h"])
                .env("LDPSYN_ADMIN_TOKEN", ADMIN)
                .output()
                .expect("python runs");
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "pandas recipe failed: {}{said}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(said.contains("250 rows × 2 columns"), "{said}");
        }
        Err(_) => common::missing_service(
            "the pandas recipe",
            "LDPSYN_PYTHON is not set (a Python with pandas)",
        ),
    }
}

/// Issue 36 item 6: a CLI error is printed once (not a tracing line and a plain line) and
/// names what it failed on: the missing schema file, the file that is not JSON, and for a
/// server that does not answer, the URL and whether `serve` runs there.
#[test]
fn cli_errors_name_the_file_or_url_and_print_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-schema.json");
    let missing_arg = missing.display().to_string();
    let create = |base: &str, schema: &str| {
        cli(
            base,
            &[
                "create",
                "--schema",
                schema,
                "--epsilon",
                "1",
                "--target-users",
                "10",
            ],
            true,
        )
    };
    // Nothing listens on port 9 (discard) of loopback in the test environment.
    let e = failed(&create("http://127.0.0.1:9", &missing_arg));
    assert_eq!(
        e,
        format!("error: {missing_arg}: No such file or directory (os error 2)\n")
    );
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{").unwrap();
    let e = failed(&create("http://127.0.0.1:9", &broken.display().to_string()));
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with(&format!("error: {} is not valid JSON", broken.display())),
        "{e}"
    );
    let e = failed(&cli("http://127.0.0.1:9", &["list"], true));
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(
        e.starts_with("error: cannot connect to http://127.0.0.1:9/v1/collections")
            && e.trim_end()
                .ends_with("is `serve` running at http://127.0.0.1:9?"),
        "{e}"
    );
}

/// Issue 36 item 6: `serve` prints the dashboard's URL (a wildcard bind shown as loopback).
#[test]
fn serve_prints_the_dashboard_url() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("ui.db").display());
    let mut child = Command::new(BIN)
        .args(["serve", "--bind", "0.0.0.0:0", "--database-url", &url])
        .env("LDPSYN_ADMIN_TOKEN", ADMIN)
        .env("LDPSYN_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("serve starts");
    // Read on a thread, so a `serve` that prints nothing fails the test instead of hanging it.
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(std::time::Duration::from_secs(30));
    child.kill().unwrap();
    child.wait().unwrap();
    let line = line.expect("serve printed a line within 30 s");
    assert!(line.starts_with("dashboard: http://127.0.0.1:"), "{line}");
    let port = line["dashboard: http://127.0.0.1:".len()..]
        .split('/')
        .next()
        .unwrap();
    assert!(port.parse::<u16>().is_ok_and(|p| p != 0), "{line}");
    assert!(line.contains(&format!("{port}/ui/")), "{line}");
}

/// Issue 67 item 3: a fit that outlasts the server's wait. With a 2 s request timeout the
/// server waits 1 s for the model, then answers 202; `collections finalize` (in this process,
/// on a server in this process whose fit is held for 3 s, longer than the request timeout)
/// waits while the model is built and prints it once ready: before, the request timed out
/// (503) and the command failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalize_waits_for_a_fit_longer_than_the_request_timeout() {
    use clap::Parser;
    use ldpsyn_aggregator::admin::{self, AdminCommand, AdminConfig};
    use ldpsyn_aggregator::service::Server;
    use ldpsyn_aggregator::service::config::ServeConfig;

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("f.db").display());
    let config = ServeConfig::parse_from([
        "serve",
        "--bind",
        "127.0.0.1:0",
        "--database-url",
        &url,
        "--admin-token",
        ADMIN,
        "--rate-limit-per-ip",
        "0",
        "--request-timeout-ms",
        "2000",
    ]);
    let server = Server::start(config).await.unwrap();
    let base = format!("http://{}", server.addr());
    let schema_json = json!({"attributes": [
        {"name": "a", "type": "categorical", "labels": ["x", "y", "z"]},
        {"name": "b", "type": "categorical", "labels": ["u", "v"]}]});
    let created: Value = reqwest::Client::new()
        .post(format!("{base}/v1/collections"))
        .bearer_auth(ADMIN)
        .json(
            &json!({"schema": schema_json, "epsilon": 2.0, "target_users": 10_000,
                      "protocol": "independence"}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id: Uuid = created["id"].as_str().unwrap().parse().unwrap();
    let schema: Schema = serde_json::from_value(schema_json).unwrap();
    let mut people: Vec<SimulatedPerson<MemoryLedger>> = (0..200u32)
        .map(|i| SimulatedPerson {
            record: schema.encoded(vec![i % 3, i % 2]).unwrap(),
            ledger: MemoryLedger::default(),
        })
        .collect();
    let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 7);
    let mut client = Client::connect(&base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    for r in client.submit_batch(&mut people).await.unwrap() {
        r.expect("accepted");
    }

    let hold = server
        .state()
        .collection(id)
        .await
        .unwrap()
        .hold_fits()
        .await;
    // On a thread of its own: the command's future is not `Send`.
    let cli = std::thread::spawn({
        let cfg = AdminConfig {
            server: base.clone(),
            json: false,
            command: AdminCommand::Finalize {
                id: id.to_string(),
                quiet: true,
            },
        };
        move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut out = Vec::new();
            rt.block_on(admin::run(&cfg, Some(ADMIN), &mut out))
                .map(|()| String::from_utf8(out).unwrap())
        }
    });
    // Held past the request timeout: the finalize has answered 202 by now and the command
    // polls the collection, which says `building`.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let status: Value = reqwest::Client::new()
        .get(format!("{base}/v1/collections/{id}"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&status["status"]["phase"], &status["status"]["model"]),
        (&json!("finalized"), &json!("building"))
    );
    assert!(!cli.is_finished(), "the command waits for the model");
    drop(hold);
    let printed = tokio::task::spawn_blocking(move || cli.join().unwrap())
        .await
        .unwrap()
        .expect("finalize succeeds once the model is built");
    assert!(
        printed.starts_with(&format!("{id}: finalized")),
        "{printed}"
    );
}
