//! Per-IP upload rate limit: a token bucket per client address (rate `per_second`, burst
//! `2 × per_second`). Kept in a `DashMap` (no crate: `governor` would add a dependency tree
//! for twenty lines). The address is only held in memory for limiting, never stored.

use std::net::IpAddr;
use std::time::Instant;

use dashmap::DashMap;

/// Entries not touched for this long are dropped when the map grows.
const IDLE_SECS: f64 = 60.0;
/// Map size above which idle entries are swept.
const SWEEP_ABOVE: usize = 100_000;

/// The limiter. `per_second == 0` disables it.
#[derive(Debug)]
pub struct RateLimiter {
    per_second: f64,
    burst: f64,
    buckets: DashMap<IpAddr, (f64, Instant)>,
}

impl RateLimiter {
    /// A limiter allowing `per_second` uploads per address (0: unlimited).
    pub fn new(per_second: u32) -> Self {
        Self {
            per_second: per_second as f64,
            burst: (2 * per_second) as f64,
            buckets: DashMap::new(),
        }
    }

    /// Takes one request for `ip`: `Ok(())`, or `Err(seconds to wait)`.
    pub fn check(&self, ip: IpAddr) -> Result<(), u64> {
        if self.per_second <= 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        if self.buckets.len() > SWEEP_ABOVE {
            self.buckets
                .retain(|_, (_, t)| now.duration_since(*t).as_secs_f64() < IDLE_SECS);
        }
        let mut entry = self.buckets.entry(ip).or_insert((self.burst, now));
        let (tokens, last) = *entry;
        let tokens =
            (tokens + now.duration_since(last).as_secs_f64() * self.per_second).min(self.burst);
        if tokens >= 1.0 {
            *entry = (tokens - 1.0, now);
            Ok(())
        } else {
            *entry = (tokens, now);
            Err(((1.0 - tokens) / self.per_second).ceil().max(1.0) as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_limited() {
        let l = RateLimiter::new(5);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        for _ in 0..10 {
            assert!(l.check(ip).is_ok());
        }
        assert_eq!(l.check(ip), Err(1));
        let other: IpAddr = "127.0.0.2".parse().unwrap();
        assert!(l.check(other).is_ok());
        let off = RateLimiter::new(0);
        for _ in 0..1000 {
            assert!(off.check(ip).is_ok());
        }
    }
}
