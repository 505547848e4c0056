//! Slow and idle clients against a real `ldpsyn-aggregator serve` process over raw TCP
//! (issue 13 item 10c): a half-sent header is cut off by the header-read timeout, an idle
//! keep-alive connection is closed by the idle timeout, and a body whose declared
//! `Content-Length` exceeds the limit is answered 413 before any of it is sent.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const ADMIN: &str = "slow-clients-admin-token-0123";

mod common;

/// Starts `serve` with `args` and waits for `/healthz`.
fn serve(args: &[&str]) -> common::Serve {
    common::serve(ADMIN, args)
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Reads until the server closes the connection (EOF or reset); returns what was read and
/// when the close came. Panics if the connection is still open after the read timeout.
fn read_until_closed(s: &mut TcpStream) -> (Vec<u8>, Instant) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, Instant::now()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => {
                return (got, Instant::now());
            }
            Err(e) => panic!(
                "the server did not close the connection ({e}); read so far: {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
}

/// Reads one response with a `content-length` body; returns its head and body.
fn read_response(s: &mut TcpStream) -> (String, String) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .expect("a content-length");
            while got.len() < end + 4 + len {
                let n = s.read(&mut buf).expect("the response body");
                assert!(n > 0, "closed inside the body");
                got.extend_from_slice(&buf[..n]);
            }
            let body = String::from_utf8_lossy(&got[end + 4..end + 4 + len]).to_string();
            return (head, body);
        }
        let n = s.read(&mut buf).expect("a response");
        assert!(
            n > 0,
            "closed before a response: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn half_sent_header_is_disconnected_after_the_header_read_timeout() {
    let server = serve(&[
        "--header-read-timeout-ms",
        "600",
        "--idle-timeout-ms",
        "60000",
    ]);
    // Half a header, then one more header line every 100 ms: bytes keep moving (the idle
    // clock never fires), the headers never end.
    let mut s = connect(&server.addr);
    let sent = Instant::now();
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        .unwrap();
    let mut trickle = s.try_clone().unwrap();
    let feeder = std::thread::spawn(move || {
        for i in 0..100 {
            std::thread::sleep(Duration::from_millis(100));
            if trickle
                .write_all(format!("x-slow-{i}: 1\r\n").as_bytes())
                .is_err()
            {
                return;
            }
        }
    });
    let (got, closed) = read_until_closed(&mut s);
    let waited = closed - sent;
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(5),
        "closed after {waited:?}"
    );
    // hyper closes without an answer (or with a 408); never a 200 for an unfinished request.
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
    feeder.join().unwrap();

    // A connection that sends nothing at all is closed by the same clock.
    let mut silent = connect(&server.addr);
    let opened = Instant::now();
    let (got, closed) = read_until_closed(&mut silent);
    assert!(got.is_empty() || got.starts_with(b"HTTP/1.1 408"));
    assert!(
        closed - opened < Duration::from_secs(5),
        "{:?}",
        closed - opened
    );

    // A complete request on a fresh connection is still served.
    let mut ok = connect(&server.addr);
    ok.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let (head, body) = read_response(&mut ok);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("ok"), "{body}");
}

#[test]
fn idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let server = serve(&[
        "--header-read-timeout-ms",
        "30000",
        "--idle-timeout-ms",
        "700",
    ]);
    let mut s = connect(&server.addr);
    // Two requests on one keep-alive connection, the second after a pause shorter than the
    // idle timeout: both answered.
    for pause in [0, 300] {
        std::thread::sleep(Duration::from_millis(pause));
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .unwrap();
        let (head, _) = read_response(&mut s);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(!head.to_ascii_lowercase().contains("connection: close"));
    }
    let answered = Instant::now();
    // Then silence: the server closes the connection.
    let (got, closed) = read_until_closed(&mut s);
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    let waited = closed - answered;
    assert!(
        waited >= Duration::from_millis(550) && waited < Duration::from_secs(5),
        "closed after {waited:?}"
    );
}

#[test]
fn declared_oversized_body_gets_413_before_it_is_sent() {
    let server = serve(&["--max-body-bytes", "1000000"]);
    // A collection to upload to (a small create body is under the limit).
    let create = r#"{"schema": {"attributes": [{"name": "a", "type": "categorical", "labels": ["x", "y"]}]}, "protocol": "independence", "epsilon": 1, "target_users": 10}"#;
    let mut s = connect(&server.addr);
    s.write_all(
        format!(
            "POST /v1/collections HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{create}",
            create.len()
        )
        .as_bytes(),
    )
    .unwrap();
    let (head, body) = read_response(&mut s);
    assert!(head.starts_with("HTTP/1.1 201"), "{head}\n{body}");
    let id = body
        .split("\"id\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("an id")
        .to_owned();

    // 10 MB declared on both body-reading routes, only the headers sent: the answer comes
    // without the body (were the server reading it, it would wait for the request timeout).
    for (path, auth) in [
        (format!("/v1/collections/{id}/reports"), String::new()),
        (
            "/v1/collections".to_owned(),
            format!("authorization: Bearer {ADMIN}\r\n"),
        ),
    ] {
        let mut s = connect(&server.addr);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let sent = Instant::now();
        s.write_all(
            format!(
                "POST {path} HTTP/1.1\r\nhost: x\r\n{auth}content-type: application/json\r\n\
                 content-length: 10485760\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
        let (head, body) = read_response(&mut s);
        assert!(head.starts_with("HTTP/1.1 413"), "{path}: {head}\n{body}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/problem+json"),
            "{head}"
        );
        assert!(body.contains("payload-too-large"), "{body}");
        assert!(body.contains("10485760 bytes declared"), "{body}");
        assert!(sent.elapsed() < Duration::from_secs(5));
    }
}
