//! A real `ldpsyn-aggregator serve` process for the integration tests of this folder: on a
//! free port of 127.0.0.1, on a SQLite database in its own temporary folder, killed when
//! dropped.
// Each test file uses a part of this module.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_ldpsyn-aggregator");

/// A running `serve` process.
pub struct Serve {
    child: Child,
    /// `127.0.0.1:port`.
    pub addr: String,
    /// `http://127.0.0.1:port`.
    pub base: String,
    _dir: Option<tempfile::TempDir>,
}

impl Serve {
    /// SIGKILLs the process (as a crash would) and waits for it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Starts `serve` with the admin token `admin` (no per-IP rate limit unless `args` sets
/// `--rate-limit-per-ip`) and `args`, and waits
/// until `/healthz` answers 200 (503 while the state loads). Blocking (plain TCP), so it
/// works from sync and async tests alike.
pub fn serve(admin: &str, args: &[&str]) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("serve.db").display());
    let mut server = serve_on(admin, &url, args);
    server._dir = Some(dir);
    server
}

/// As [`serve`], on the database `database_url` (which outlives the process).
pub fn serve_on(admin: &str, database_url: &str, args: &[&str]) -> Serve {
    // A port free a moment ago can be taken before `serve` binds it (another test picked
    // it too): a process that exits before it is healthy is started again on a new port.
    for _ in 0..5 {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut command = Command::new(BIN);
        command.args(["serve", "--bind", &addr]);
        if !args.contains(&"--rate-limit-per-ip") {
            command.args(["--rate-limit-per-ip", "0"]);
        }
        let child = command
            .args(["--database-url", database_url])
            .args(args)
            .env("LDPSYN_ADMIN_TOKEN", admin)
            .env("LDPSYN_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("serve starts");
        let mut server = Serve {
            child,
            base: format!("http://{addr}"),
            addr,
            _dir: None,
        };
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                eprintln!(
                    "serve on {} exited ({status}); trying another port",
                    server.addr
                );
                break;
            }
            if let Ok(mut s) = TcpStream::connect(&server.addr) {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ =
                    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
                let mut answer = String::new();
                let _ = s.read_to_string(&mut answer);
                if answer.starts_with("HTTP/1.1 200") {
                    return server;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "serve did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("serve exited on five ports in a row");
}

/// The variable that lets a test whose service is missing skip instead of fail.
pub const ALLOW_MISSING: &str = "LDPSYN_ALLOW_MISSING_SERVICES";

/// Called by an environment-gated test (PostgreSQL, Chromium, pandas) whose service is
/// missing, with what is missing and how to provide it. The one scheme for such tests (the
/// same helper is in `tests/src/lib.rs`): a missing service **fails** the test, unless
/// `LDPSYN_ALLOW_MISSING_SERVICES=1`, which lets it return early after a `SKIPPED` line on
/// stderr (a local run without the service, by choice). `.ci/run` provides every service and
/// never sets the variable, so CI fails loudly when a service it promises is missing.
pub fn missing_service(test: &str, why: &str) {
    assert!(
        std::env::var(ALLOW_MISSING).as_deref() == Ok("1"),
        "{test}: {why}. Provide it, or set {ALLOW_MISSING}=1 to skip this test"
    );
    eprintln!("{test}: SKIPPED ({why}; {ALLOW_MISSING}=1)");
}

/// The PostgreSQL URL for tests (`LDPSYN_TEST_DATABASE_URL`), or `None` when it is not set
/// and [`missing_service`] allows skipping (otherwise it panics).
pub fn postgres_url(test: &str) -> Option<String> {
    match std::env::var("LDPSYN_TEST_DATABASE_URL") {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            missing_service(
                test,
                "LDPSYN_TEST_DATABASE_URL is not set (a PostgreSQL database, e.g. \
                 postgres://postgres@127.0.0.1:5432/ldpsyn_test)",
            );
            None
        }
    }
}

/// Polls `check` every 20 ms until it returns `Some`, and returns that; fails the test,
/// naming `what`, after 60 s. For a state the server reaches after it answered (a round
/// closed off the committer), never a fixed sleep.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
