//! Per-client rate limits (uploads, task requests): one `governor` GCRA limiter (rate
//! `per_second`, burst `2 × per_second`) per client key, in a map with bounded memory; the
//! client's address comes from [`client_ip`] (trusted proxies).
//!
//! - **Keys**: an IPv4 address, or an IPv6 address's /64 prefix (one end site gets a /64, so
//!   rotating addresses inside it buys nothing).
//! - **Memory**: keys idle long enough for their bucket to refill are dropped (losing
//!   nothing) at most once per [`SWEEP_EVERY`], never per request; with [`MAX_KEYS`] keys
//!   tracked, new clients share one overflow key until a sweep frees room, so a client
//!   rotating addresses cannot grow the map (it only throttles other newcomers, briefly).
//! - Addresses are only held in memory for limiting, never stored.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use dashmap::DashMap;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota};

/// Most keys tracked at once (~150 bytes each with the map: ~150 MB at most).
pub const MAX_KEYS: usize = 1_000_000;
/// Least time between two sweeps of idle keys.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// What a client is limited as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientKey {
    /// An IPv4 address.
    V4(u32),
    /// The first 64 bits of an IPv6 address.
    V6Prefix(u64),
    /// New clients while [`MAX_KEYS`] keys are tracked.
    Overflow,
}

impl From<IpAddr> for ClientKey {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => ClientKey::V4(v4.into()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => ClientKey::V4(v4.into()),
                None => ClientKey::V6Prefix((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

/// Requests in flight per client, at most `max` at once (0: no cap). Memory holds only the
/// clients with a request in flight, so it is bounded by the service's in-flight limit.
#[derive(Debug)]
pub struct InFlight {
    max: usize,
    counts: std::sync::Arc<DashMap<ClientKey, usize>>,
}

/// One request's place among its client's requests in flight ([`InFlight::enter`]); given
/// back when dropped.
#[derive(Debug)]
pub struct InFlightPlace {
    /// The client and the counts; `None` when nothing is capped.
    counted: Option<(ClientKey, std::sync::Arc<DashMap<ClientKey, usize>>)>,
}

impl InFlight {
    /// A cap of `max` requests in flight per client (0: none).
    pub fn new(max: usize) -> Self {
        Self {
            max,
            counts: Default::default(),
        }
    }

    /// A place for one more request of `ip`, held until the returned place is dropped;
    /// `None` when the client has `max` in flight already.
    pub fn enter(&self, ip: IpAddr) -> Option<InFlightPlace> {
        if self.max == 0 {
            return Some(InFlightPlace { counted: None });
        }
        let key = ClientKey::from(ip);
        let mut n = self.counts.entry(key).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(InFlightPlace {
            counted: Some((key, self.counts.clone())),
        })
    }

    /// Clients with a request in flight.
    pub fn clients(&self) -> usize {
        self.counts.len()
    }
}

impl Drop for InFlightPlace {
    fn drop(&mut self) {
        if let Some((key, counts)) = &self.counted {
            if let Some(mut n) = counts.get_mut(key) {
                *n -= 1;
            }
            counts.remove_if(key, |_, n| *n == 0);
        }
    }
}

/// One client's bucket and when it was last charged.
#[derive(Debug)]
struct Bucket {
    limiter: DefaultDirectRateLimiter,
    last: Instant,
}

/// The limiter. `per_second == 0` disables it.
#[derive(Debug)]
pub struct RateLimiter {
    quota: Option<Quota>,
    /// Time for an empty bucket to refill: a key idle this long is indistinguishable from a
    /// new one.
    refill: Duration,
    buckets: DashMap<ClientKey, Bucket>,
    last_sweep: Mutex<Instant>,
    max_keys: usize,
}

impl RateLimiter {
    /// A limiter allowing `per_second` requests per client (burst twice that; 0: unlimited).
    pub fn new(per_second: u32) -> Self {
        Self::with_max_keys(per_second, MAX_KEYS)
    }

    /// As [`RateLimiter::new`] with another key cap (tests).
    pub fn with_max_keys(per_second: u32, max_keys: usize) -> Self {
        let quota = NonZeroU32::new(per_second).map(|rate| {
            let burst = NonZeroU32::new(per_second.saturating_mul(2)).unwrap_or(rate);
            Quota::per_second(rate).allow_burst(burst)
        });
        Self {
            refill: quota.map_or(Duration::ZERO, |q| q.burst_size_replenished_in()),
            quota,
            buckets: DashMap::new(),
            last_sweep: Mutex::new(Instant::now()),
            max_keys: max_keys.max(1),
        }
    }

    /// Keys currently tracked.
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }

    /// Takes one request for `ip`: `Ok(())`, or `Err(whole seconds to wait, ≥ 1)`.
    pub fn check(&self, ip: IpAddr) -> Result<(), u64> {
        let Some(quota) = self.quota else {
            return Ok(());
        };
        self.sweep();
        let mut key = ClientKey::from(ip);
        if self.buckets.len() >= self.max_keys && !self.buckets.contains_key(&key) {
            key = ClientKey::Overflow;
        }
        let now = Instant::now();
        let mut bucket = self.buckets.entry(key).or_insert_with(|| Bucket {
            limiter: DefaultDirectRateLimiter::direct(quota),
            last: now,
        });
        bucket.last = now;
        bucket.limiter.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            wait.as_secs_f64().ceil().max(1.0) as u64
        })
    }

    /// Drops keys idle for a refill, at most once per [`SWEEP_EVERY`].
    fn sweep(&self) {
        let Ok(mut last) = self.last_sweep.try_lock() else {
            return; // another request is sweeping
        };
        if last.elapsed() >= SWEEP_EVERY {
            *last = Instant::now();
            let refill = self.refill;
            self.buckets.retain(|_, b| b.last.elapsed() < refill);
            self.buckets.shrink_to_fit();
        }
    }
}

/// The client address of a request whose TCP peer is `peer`: the peer itself, unless it is
/// one of `trusted` proxies; then the nearest address, right to left through the proxies'
/// `X-Forwarded-For` (or, without it, RFC 7239 `Forwarded: for=`), that is not itself a
/// trusted proxy. Unparsable entries end the walk at the last trusted hop, so a client can
/// never choose its own key by sending these headers to an untrusted hop. Addresses are
/// compared and returned in canonical form: an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`,
/// what a dual-stack listener sees for an IPv4 peer) is the IPv4 address.
pub fn client_ip(peer: SocketAddr, headers: &HeaderMap, trusted: &[IpAddr]) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|t| t.to_canonical() == ip);
    let mut ip = peer.ip().to_canonical();
    if !is_trusted(ip) {
        return ip;
    }
    let mut hops: Vec<IpAddr> = Vec::new();
    let mut parsed_all = true;
    let xff: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect();
    if !xff.is_empty() {
        for entry in xff {
            match parse_node(entry) {
                Some(a) => hops.push(a),
                None => parsed_all = false,
            }
        }
    } else {
        for element in headers
            .get_all("forwarded")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
        {
            let node = element.split(';').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                k.trim().eq_ignore_ascii_case("for").then_some(v)
            });
            match node.and_then(parse_node) {
                Some(a) => hops.push(a),
                None => parsed_all = false,
            }
        }
    }
    if !parsed_all {
        return ip;
    }
    for hop in hops.into_iter().rev() {
        ip = hop.to_canonical();
        if !is_trusted(ip) {
            break;
        }
    }
    ip
}

/// An address from a header entry: `1.2.3.4`, `1.2.3.4:5`, `2001:db8::1`, `"[2001:db8::1]:5"`.
fn parse_node(entry: &str) -> Option<IpAddr> {
    let s = entry.trim().trim_matches('"');
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    let inner = s.strip_prefix('[')?.split(']').next()?;
    inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn burst_then_limited() {
        let l = RateLimiter::new(5);
        let a = ip("127.0.0.1");
        for _ in 0..10 {
            assert!(l.check(a).is_ok());
        }
        assert_eq!(l.check(a), Err(1));
        assert!(l.check(ip("127.0.0.2")).is_ok());
        let off = RateLimiter::new(0);
        for _ in 0..1000 {
            assert!(off.check(a).is_ok());
        }
    }

    /// Rotating IPv6 addresses inside one /64 is one client; rotating /64s past the cap
    /// grows nothing: new clients share the overflow key.
    #[test]
    fn memory_is_bounded_and_ipv6_is_limited_per_64() {
        let l = RateLimiter::with_max_keys(1, 100);
        assert!(l.check(ip("2001:db8:1:2::1")).is_ok());
        assert!(l.check(ip("2001:db8:1:2::2")).is_ok());
        assert!(l.check(ip("2001:db8:1:2:ffff::3")).is_err());
        assert_eq!(
            ClientKey::from(ip("::ffff:10.0.0.1")),
            ClientKey::from(ip("10.0.0.1"))
        );
        for i in 0..10_000u32 {
            let v6 = Ipv6Addr::from((0x2001_0db8_u128 << 96) | (u128::from(i) << 64));
            let _ = l.check(IpAddr::V6(v6));
            assert!(l.tracked() <= 101, "{} keys after {i}", l.tracked());
        }
        // The overflow key is charged: past its burst, newcomers are limited together.
        let v6 = Ipv6Addr::from(0x2001_0db9_u128 << 96);
        assert!(l.check(IpAddr::V6(v6)).is_err());
    }

    #[test]
    fn forwarded_addresses_only_from_trusted_proxies() {
        let proxy = ip("10.0.0.9");
        let peer = SocketAddr::new(proxy, 4000);
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", "203.0.113.7, 10.0.0.9".parse().unwrap());
        // Untrusted peer: its headers mean nothing.
        assert_eq!(client_ip(peer, &h, &[]), proxy);
        // Trusted: the nearest untrusted hop, right to left (the client cannot spoof past it).
        assert_eq!(client_ip(peer, &h, &[proxy]), ip("203.0.113.7"));
        h.insert(
            "x-forwarded-for",
            "1.1.1.1, 203.0.113.7, 10.0.0.9".parse().unwrap(),
        );
        assert_eq!(client_ip(peer, &h, &[proxy]), ip("203.0.113.7"));
        h.insert("x-forwarded-for", "not-an-ip, 10.0.0.9".parse().unwrap());
        assert_eq!(client_ip(peer, &h, &[proxy]), proxy);
        let mut h = HeaderMap::new();
        h.insert(
            "forwarded",
            r#"for="[2001:db8::7]:4711";proto=https, for=10.0.0.9"#
                .parse()
                .unwrap(),
        );
        assert_eq!(client_ip(peer, &h, &[proxy]), ip("2001:db8::7"));
        assert_eq!(client_ip(peer, &HeaderMap::new(), &[proxy]), proxy);
    }

    /// Issue 33 item 12: a dual-stack listener sees an IPv4 proxy as `::ffff:10.0.0.9`; it is
    /// still the trusted `10.0.0.9` (and the reverse), and an IPv4-mapped client address is
    /// keyed as its IPv4 address.
    /// At most `max` places per client (an IPv6 /64 is one client), given back on drop; the
    /// map forgets a client with nothing in flight; a cap of 0 counts nothing.
    #[test]
    fn in_flight_places_are_capped_per_client() {
        let cap = InFlight::new(2);
        let a = [cap.enter(ip("10.0.0.1")), cap.enter(ip("10.0.0.1"))];
        assert!(a.iter().all(Option::is_some));
        assert!(cap.enter(ip("10.0.0.1")).is_none(), "third of one client");
        let b = cap.enter(ip("10.0.0.2")).expect("another client");
        let v6 = [cap.enter(ip("2001:db8::1")), cap.enter(ip("2001:db8::2"))];
        assert!(v6.iter().all(Option::is_some));
        assert!(cap.enter(ip("2001:db8::ffff")).is_none(), "same /64");
        assert_eq!(cap.clients(), 3);
        drop(a);
        assert!(cap.enter(ip("10.0.0.1")).is_some(), "places given back");
        drop((b, v6));
        assert_eq!(cap.clients(), 0, "nothing in flight, nothing kept");
        let off = InFlight::new(0);
        let many: Vec<_> = (0..100).map(|_| off.enter(ip("10.0.0.1"))).collect();
        assert!(many.iter().all(Option::is_some));
        assert_eq!(off.clients(), 0);
    }

    #[test]
    fn ipv4_mapped_addresses_match_their_ipv4_form() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-forwarded-for",
            "::ffff:203.0.113.7, ::ffff:10.0.0.9".parse().unwrap(),
        );
        let mapped_peer = SocketAddr::new(ip("::ffff:10.0.0.9"), 4000);
        let v4_peer = SocketAddr::new(ip("10.0.0.9"), 4000);
        assert_eq!(
            client_ip(mapped_peer, &h, &[ip("10.0.0.9")]),
            ip("203.0.113.7")
        );
        assert_eq!(
            client_ip(v4_peer, &h, &[ip("::ffff:10.0.0.9")]),
            ip("203.0.113.7")
        );
        // Untrusted: the peer itself, in IPv4 form.
        assert_eq!(client_ip(mapped_peer, &h, &[]), ip("10.0.0.9"));
    }
}
