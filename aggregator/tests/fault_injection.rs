//! The fault-injection suite beyond the kill -9 cases of `crash_safety.rs` (issue 67 item 8):
//! under upload load, a full disk under a SQLite `serve` and a restart of the PostgreSQL
//! server under a PostgreSQL `serve`. After each: every acknowledged report is stored exactly
//! once, the service acknowledges uploads again within 10 s of the fault ending, and what was
//! attempted during the fault (a round close in both, a finalize on the full disk) left the
//! collection either done or not.
//! Each case prints a `FAULT` figures line (`--nocapture`); `docs/results.md` records them.
//!
//! Both cases bring their own fault domain, so they run beside any other test: the disk is
//! a tmpfs of 16 MiB mounted by the test (as root, or through `sudo -n`), the PostgreSQL server
//! one the test creates (`initdb`) on a free port and restarts at will, never the shared
//! one of `LDPSYN_TEST_DATABASE_URL`. Without either the case fails, unless
//! `LDPSYN_ALLOW_MISSING_SERVICES=1` lets it skip.

mod common;
mod load;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{free_port, missing_service};
use ldpsyn::Epsilon;
use ldpsyn::client::{Client, ClientOptions, SimulatedPerson};
use ldpsyn::ledger::{MemoryLedger, ReportState};
use ldpsyn::wire::{PROBLEM_CONTENT_TYPE, Report};
use ldpsyn_aggregator::engine::Engine;
use load::*;
use serde_json::{Value, json};
use uuid::Uuid;

/// A tmpfs mounted on a folder of its own for the test's life (unmounted when dropped).
struct Tmpfs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `16m`; writable by anyone, as `/tmp`), as root or
    /// through `sudo -n`; `None`, after [`missing_service`], when the mount is refused.
    fn mount(test: &str, size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        std::fs::create_dir(&path).unwrap();
        let mut command = privileged("mount");
        let options = format!("size={size},mode=1777");
        command
            .args(["-t", "tmpfs", "-o", &options, "tmpfs"])
            .arg(&path);
        let out = command.output();
        match out {
            Ok(o) if o.status.success() => Some(Self { path, _dir: dir }),
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr).trim().to_owned();
                missing_service(
                    test,
                    &format!(
                        "cannot mount a tmpfs (run as root, or with sudo without a password): {why}"
                    ),
                );
                None
            }
            Err(e) => {
                missing_service(test, &format!("cannot run {command:?}: {e}"));
                None
            }
        }
    }

    /// Fills the filesystem: writes `filler` until a write fails (no space left).
    fn fill(&self) -> u64 {
        let mut f = std::fs::File::create(self.path.join("filler")).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(28), "ENOSPC expected: {e}");
                    break;
                }
            }
        }
        written
    }

    /// Frees the space [`Tmpfs::fill`] took.
    fn free(&self) {
        std::fs::remove_file(self.path.join("filler")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a process still holding a file there must not keep the mount alive.
        let _ = privileged("umount").arg("-l").arg(&self.path).status();
    }
}

/// Whether the tests run as root (a file they create is root's).
fn root() -> bool {
    let f = tempfile::NamedTempFile::new().unwrap();
    f.as_file().metadata().unwrap().uid() == 0
}

/// `program` as a command run as root: itself when the tests are root, else through
/// `sudo -n` (which fails rather than asking for a password).
fn privileged(program: &str) -> Command {
    if root() {
        Command::new(program)
    } else {
        let mut c = Command::new("sudo");
        c.args(["-n", program]);
        c
    }
}

/// A PostgreSQL server of the test's own: a new cluster (`initdb`) in a temporary folder,
/// listening on a free port of 127.0.0.1 only, trusting local connections; stopped when
/// dropped. As root, its tools run as the `postgres` user (the server refuses root).
struct Postgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    as_postgres: bool,
}

impl Postgres {
    /// The folder of `initdb` and `pg_ctl`: `LDPSYN_PG_BINDIR`, `pg_config --bindir`, the
    /// newest `/usr/lib/postgresql/*/bin` (Debian), or `PATH`.
    fn bindir() -> Option<PathBuf> {
        let has = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
        if let Ok(d) = std::env::var("LDPSYN_PG_BINDIR") {
            return Some(PathBuf::from(d)).filter(|d| has(d));
        }
        let from_config = Command::new("pg_config")
            .arg("--bindir")
            .output()
            .ok()
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
        let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let v = e.file_name().to_str()?.parse().ok()?;
                Some((v, e.path().join("bin")))
            })
            .collect();
        debian.sort();
        let path = std::env::var_os("PATH").unwrap_or_default();
        from_config
            .into_iter()
            .chain(debian.into_iter().rev().map(|(_, d)| d))
            .chain(std::env::split_paths(&path))
            .find(|d| has(d))
    }

    /// Creates and starts the cluster; `None`, after [`missing_service`], without the tools.
    fn start(test: &str) -> Option<Self> {
        let Some(bin) = Self::bindir() else {
            missing_service(
                test,
                "PostgreSQL's server tools (initdb, pg_ctl) are not installed (apt install \
                 postgresql, or set LDPSYN_PG_BINDIR)",
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let as_postgres = root();
        if as_postgres {
            let ok = Command::new("chown")
                .args(["postgres:"])
                .arg(dir.path())
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                ok,
                "{test}: running as root, and there is no `postgres` user to run PostgreSQL as"
            );
        }
        let pg = Self {
            bin,
            dir,
            port: free_port(),
            as_postgres,
        };
        pg.run(
            "initdb",
            &[
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ],
        );
        pg.up();
        Some(pg)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// Runs a server tool with `args` and then the data folder; panics (with the server's
    /// log) if it fails.
    fn run(&self, tool: &str, args: &[&str]) {
        let tool = self.bin.join(tool);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(tool);
            c
        } else {
            Command::new(tool)
        };
        let out = command.args(args).arg(self.data()).output().unwrap();
        let log = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        assert!(
            out.status.success(),
            "{args:?} failed: {}{}\n{log}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the server and waits until it accepts connections.
    fn up(&self) {
        let log = self.dir.path().join("log").display().to_string();
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={}",
            self.port,
            self.dir.path().display()
        );
        self.run("pg_ctl", &["-w", "-l", &log, "-o", &options, "start", "-D"]);
    }

    /// Stops the server at once, as a crash would (`immediate`: no shutdown checkpoint; the
    /// next start recovers from the WAL).
    fn down(&self) {
        self.run("pg_ctl", &["-w", "-m", "immediate", "stop", "-D"]);
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| self.down());
    }
}

/// Connects a client to `base` and prepares reports for `people` (tasks fetched, reports
/// pending in their ledgers, nothing posted); their reports.
async fn prepared(
    base: &str,
    id: Uuid,
    people: &mut [SimulatedPerson<MemoryLedger>],
) -> Vec<Report> {
    let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 11);
    let mut client = Client::connect(base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    client.prepare_batch(people).await.unwrap();
    reports(people, id, ReportState::Pending)
}

/// Sends everyone of `people` not yet acknowledged (pending ones with their own bytes)
/// through `base`; every one must end acknowledged.
async fn resend(base: &str, id: Uuid, people: &mut [SimulatedPerson<MemoryLedger>]) {
    let options = ClientOptions::insecure_simulation(Epsilon::new(2.0).unwrap(), 99);
    let mut client = Client::connect(base, id, options, MemoryLedger::default())
        .await
        .unwrap();
    for part in people.chunks_mut(1000) {
        for r in client.submit_batch(part).await.unwrap() {
            assert!(acknowledged(&r), "resubmission failed: {r:?}");
        }
    }
}

/// A POST without body as admin; its status and JSON body.
async fn admin_post(http: &reqwest::Client, url: String) -> (u16, Value) {
    let r = http.post(url).bearer_auth(ADMIN).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Whether an answer to a request the fault got in the way of is one the issue allows:
/// done (2xx), or refused 503 with the problem document of a database that cannot store now.
fn clean(status: u16, media: &str, body: &Value) -> bool {
    (200..300).contains(&status)
        || (status == 503 && media == PROBLEM_CONTENT_TYPE && unavailable(body))
}

/// Whether `problem` is the 503 `unavailable` of a database that cannot store now.
fn unavailable(problem: &Value) -> bool {
    problem["type"]
        .as_str()
        .is_some_and(|t| t.ends_with(":unavailable"))
        && problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("out of space"))
}

/// The collection's phase, round and count as `base` shows them.
async fn shape(http: &reqwest::Client, base: &str, id: Uuid) -> (String, u64, u64) {
    let s = admin(http, "GET", format!("{base}/v1/collections/{id}")).await;
    let s = &s["status"];
    (
        s["phase"].as_str().unwrap().to_owned(),
        s["round"].as_u64().unwrap(),
        s["reports_accepted"].as_u64().unwrap(),
    )
}

/// Asserts that `later` is `earlier` or a state after it: the same phase and count, a round
/// no earlier (a round close that fell due and failed in the fault is retried later, by the
/// next commit, the upkeep pass or a restart).
fn same_or_later(earlier: &(String, u64, u64), later: &(String, u64, u64), what: &str) {
    assert!(
        later.0 == earlier.0 && later.2 == earlier.2 && later.1 >= earlier.1,
        "{what}: {earlier:?} then {later:?}"
    );
}

/// A full disk under a SQLite `serve` under upload load: uploads are refused with a 5xx
/// problem document while it is full (the process stays up), nothing acknowledged is lost,
/// uploads are acknowledged again within 10 s of the space coming back; a round close and a
/// finalize attempted while full are done whole or not at all (a restart on the file shows
/// what the process showed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_under_sqlite_uploads() {
    let test = "full_disk_under_sqlite_uploads";
    let Some(disk) = Tmpfs::mount(test, "16m") else {
        return;
    };
    let db = format!("sqlite://{}", disk.path.join("full.db").display());
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let mut server = spawn(&db, port);
    wait_healthy(&base).await;
    let http = reqwest::Client::new();
    // SamPrivSyn closes a round every 500 reports, so closes fall due while the disk is
    // full too; its estimates pool every round, so a clean reduction needs no round order.
    let (id, config) = create(
        &http,
        &base,
        json!({"protocol": "samprivsyn", "epsilon": 2.0, "target_users": 1_000_000_000u64,
               "batch_size": 500}),
    )
    .await;
    let mut spare = load::people(&config.schema, 5);
    let spare_reports = prepared(&base, id, &mut spare).await;

    let all = load::people(&config.schema, 16_000);
    let tasks: Vec<_> = all
        .chunks(4000)
        .enumerate()
        .map(|(i, c)| tokio::spawn(upload_all(base.clone(), id, c.to_vec(), i as u64)))
        .collect();
    status_until(&http, &base, id, "1000 reports committed", |s| {
        s["status"]["reports_accepted"].as_u64() >= Some(1000)
    })
    .await;
    let filled = disk.fill();
    let mut people = Vec::new();
    for t in tasks {
        people.extend(t.await.unwrap());
    }
    let acked = reports(&people, id, ReportState::Acknowledged).len();
    let pending = reports(&people, id, ReportState::Pending).len();
    eprintln!("disk full ({filled} bytes of filler): {acked} acknowledged, {pending} pending");
    assert!(acked < all.len(), "the full disk refused no upload");

    // While full: an upload is refused 503 `unavailable` (a problem document saying to
    // retry), the process stays up, and a round close is done or refused the same way.
    let (status, media, problem) = post_report(&http, &base, id, &spare_reports[0]).await;
    eprintln!("upload while full: {status} {media} {problem}");
    assert_eq!(
        (status, media.as_str()),
        (503, PROBLEM_CONTENT_TYPE),
        "{problem}"
    );
    assert!(unavailable(&problem), "{problem}");
    let before_close = shape(&http, &base, id).await;
    let (close, body) = admin_post(
        &http,
        format!("{base}/v1/collections/{id}/close-round?force=true"),
    )
    .await;
    eprintln!("round close while full: {close} {body}");
    assert!(
        close < 300 || (close == 503 && unavailable(&body)),
        "{close} {body}"
    );
    let after_close = shape(&http, &base, id).await;
    same_or_later(&before_close, &after_close, "a round close while full");
    assert!(
        close >= 300 || after_close.1 > before_close.1,
        "closed, same round"
    );
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "serve exited on a full disk"
    );

    // Space back: uploads are acknowledged again, every acknowledged report is stored.
    disk.free();
    let freed = Instant::now();
    let mut probe = load::people(&config.schema, 20);
    let recovery = recovery(&base, id, &mut probe, freed).await;
    let mut figures = Figures {
        case: "sqlite-full-disk",
        acknowledged: acked,
        // The spare people's reports are pending too (one was posted during the fault).
        pending: pending + spare_reports.len(),
        stored: accepted(&http, &base, id).await - probe.len() as u64,
        recovery,
        ..Figures::default()
    };
    people.extend(probe);
    people.extend(spare);
    resend(&base, id, &mut people).await;
    let acked = reports(&people, id, ReportState::Acknowledged);
    assert_eq!(acked.len(), people.len(), "everyone acknowledged");

    // Full again: a finalize is done whole or refused, and the process stays up.
    let before = shape(&http, &base, id).await;
    disk.fill();
    let (fin, body) = admin_post(&http, format!("{base}/v1/collections/{id}/finalize")).await;
    let what = if fin < 300 {
        json!("done")
    } else {
        body["type"].clone()
    };
    eprintln!("finalize while full: {fin} {what}");
    assert!(
        fin < 300 || (fin == 503 && unavailable(&body)),
        "{fin} {body}"
    );
    let live = shape(&http, &base, id).await;
    if fin < 300 {
        assert_eq!(live.0, "finalized", "{live:?}");
    } else {
        same_or_later(&before, &live, "a refused finalize changed the collection");
    }
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "serve exited on a full disk"
    );
    disk.free();

    // The file holds what the process showed (kill -9, restart on it).
    drop(server);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    server = spawn(&db, port);
    wait_healthy(&base).await;
    same_or_later(&live, &shape(&http, &base, id).await, "the restart");
    let fin = admin(
        &http,
        "POST",
        format!("{base}/v1/collections/{id}/finalize"),
    )
    .await;
    figures.final_acknowledged = acked.len();
    figures.final_stored = fin["status"]["reports_accepted"].as_u64().unwrap();
    figures.check();

    // The model is exactly a clean reduction of the acknowledged reports.
    let engine = Engine::new(&config).unwrap();
    let mut state = engine.initial_state();
    engine.mark_finalized(&mut state);
    let clean = engine.finalize(&state, &reduce(&engine, &acked)).unwrap();
    let m = admin(
        &http,
        "GET",
        format!("{base}/v1/collections/{id}/marginals?attrs=a,b"),
    )
    .await;
    assert_eq!(m["frequencies"], json!(clean.frequencies(&[0, 1]).unwrap()));
    drop(server);
}

/// A PostgreSQL restart (an immediate stop, four seconds down, a start) under upload load:
/// what the outage got in the way of was done or refused with a 5xx problem document (a
/// round close included), nothing acknowledged is lost, and the service acknowledges uploads
/// again within 10 s of the database being back, without a restart of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_under_uploads() {
    let test = "postgres_restart_under_uploads";
    let Some(pg) = Postgres::start(test) else {
        return;
    };
    let db = pg.url();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let server = spawn(&db, port);
    wait_healthy(&base).await;
    let http = reqwest::Client::new();
    let (id, config) = create(
        &http,
        &base,
        json!({"protocol": "samprivsyn", "epsilon": 2.0, "target_users": 1_000_000_000u64,
               "batch_size": 500}),
    )
    .await;
    let mut spare = load::people(&config.schema, 5);
    let spare_reports = prepared(&base, id, &mut spare).await;

    let all = load::people(&config.schema, 12_000);
    let tasks: Vec<_> = all
        .chunks(3000)
        .enumerate()
        .map(|(i, c)| tokio::spawn(upload_all(base.clone(), id, c.to_vec(), 20 + i as u64)))
        .collect();
    let at_fault = status_until(&http, &base, id, "1000 reports committed", |s| {
        s["status"]["reports_accepted"].as_u64() >= Some(1000)
    })
    .await;
    assert!(
        at_fault["status"]["reports_accepted"].as_u64() < Some(all.len() as u64 / 2),
        "the uploads ended before the fault"
    );
    pg.down();
    // Requests that meet the outage: an upload and a round close, answered whenever the
    // service answers them (during the outage or after it).
    let upload = tokio::spawn({
        let (http, base, r) = (http.clone(), base.clone(), spare_reports[0].clone());
        async move { post_report(&http, &base, id, &r).await }
    });
    let close = tokio::spawn({
        let (http, url) = (
            http.clone(),
            format!("{base}/v1/collections/{id}/close-round"),
        );
        async move {
            let r = http.post(url).bearer_auth(ADMIN).send().await.unwrap();
            let media = r
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let status = r.status().as_u16();
            (
                status,
                media,
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    });
    // Four seconds: long enough for the pool's connect backoff to reach its cap (2 s).
    tokio::time::sleep(Duration::from_secs(4)).await;
    pg.up();
    let back = Instant::now();
    let mut probe = load::people(&config.schema, 20);
    let recovery = recovery(&base, id, &mut probe, back).await;

    let mut people = Vec::new();
    for t in tasks {
        people.extend(t.await.unwrap());
    }
    let acked = reports(&people, id, ReportState::Acknowledged).len();
    let pending = reports(&people, id, ReportState::Pending).len();
    let (status, media, body) = upload.await.unwrap();
    eprintln!("upload in the outage: {status} {media} {body}");
    assert!(clean(status, &media, &body), "{status} {media} {body}");
    let (close, media, body) = close.await.unwrap();
    eprintln!("round close in the outage: {close} {media}");
    assert!(clean(close, &media, &body), "{close} {media} {body}");
    // Uploads that met the outage waited for the database (the pool retries its connects)
    // or were refused 503; the loaders stop at their first refusal, so the figures may hold
    // reports acknowledged after the database came back.
    let mut figures = Figures {
        case: "postgres-restart",
        acknowledged: acked,
        // The spare people's reports are pending too (one was posted during the fault).
        pending: pending + spare_reports.len(),
        stored: accepted(&http, &base, id).await - probe.len() as u64,
        recovery,
        ..Figures::default()
    };
    people.extend(probe);
    people.extend(spare);
    resend(&base, id, &mut people).await;
    let acked = reports(&people, id, ReportState::Acknowledged);
    assert_eq!(acked.len(), people.len(), "everyone acknowledged");

    // What the process shows is what the database holds: a second process agrees.
    let live = shape(&http, &base, id).await;
    let port = free_port();
    let other = format!("http://127.0.0.1:{port}");
    let _other = spawn(&db, port);
    wait_healthy(&other).await;
    same_or_later(&live, &shape(&http, &other, id).await, "a second process");
    let fin = admin(
        &http,
        "POST",
        format!("{base}/v1/collections/{id}/finalize"),
    )
    .await;
    figures.final_acknowledged = acked.len();
    figures.final_stored = fin["status"]["reports_accepted"].as_u64().unwrap();
    figures.check();
    let engine = Engine::new(&config).unwrap();
    let mut state = engine.initial_state();
    engine.mark_finalized(&mut state);
    let clean = engine.finalize(&state, &reduce(&engine, &acked)).unwrap();
    let m = admin(
        &http,
        "GET",
        format!("{base}/v1/collections/{id}/marginals?attrs=a,b"),
    )
    .await;
    assert_eq!(m["frequencies"], json!(clean.frequencies(&[0, 1]).unwrap()));
    drop(server);
}
