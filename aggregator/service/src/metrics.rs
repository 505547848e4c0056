//! Prometheus text-format metrics, kept in atomics (no registry crate needed for a handful of
//! counters and one histogram).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use ldpsyn::wire::ProblemType;

/// Upper bounds of the commit-latency histogram buckets, seconds.
const BUCKETS_S: [f64; 12] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0,
];

/// The service's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    accepted: AtomicU64,
    duplicate: AtomicU64,
    rejected: [AtomicU64; 32],
    upload_requests: AtomicU64,
    task_requests: AtomicU64,
    tasks_issued: AtomicU64,
    commits: AtomicU64,
    commit_buckets: [AtomicU64; BUCKETS_S.len()],
    commit_sum_us: AtomicU64,
    rounds_closed: AtomicU64,
    collection_lookups: AtomicU64,
    synthetic_bytes: AtomicU64,
}

fn problem_index(p: ProblemType) -> usize {
    ProblemType::ALL
        .iter()
        .position(|&t| t == p)
        .unwrap_or(0)
        .min(31)
}

impl Metrics {
    /// Counts report outcomes.
    pub fn reports(&self, accepted: u64, duplicate: u64) {
        self.accepted.fetch_add(accepted, Relaxed);
        self.duplicate.fetch_add(duplicate, Relaxed);
    }
    /// Counts one rejected report.
    pub fn rejected(&self, reason: ProblemType) {
        self.rejected[problem_index(reason)].fetch_add(1, Relaxed);
    }
    /// Counts one upload request.
    pub fn upload_request(&self) {
        self.upload_requests.fetch_add(1, Relaxed);
    }
    /// Counts one task request handing out `n` tasks.
    pub fn task_request(&self, n: u64) {
        self.task_requests.fetch_add(1, Relaxed);
        self.tasks_issued.fetch_add(n, Relaxed);
    }
    /// Records one group commit's latency.
    pub fn commit(&self, latency: Duration) {
        self.commits.fetch_add(1, Relaxed);
        let s = latency.as_secs_f64();
        for (i, b) in BUCKETS_S.iter().enumerate() {
            if s <= *b {
                self.commit_buckets[i].fetch_add(1, Relaxed);
            }
        }
        self.commit_sum_us
            .fetch_add(latency.as_micros().min(u64::MAX as u128) as u64, Relaxed);
    }
    /// Counts closed rounds (and SamPrivSyn re-weightings).
    pub fn rounds_closed(&self, n: u64) {
        self.rounds_closed.fetch_add(n, Relaxed);
    }
    /// Counts bytes of synthetic data produced for downloads.
    pub fn synthetic_bytes(&self, n: u64) {
        self.synthetic_bytes.fetch_add(n, Relaxed);
    }
    /// Counts one database lookup of a collection id this process did not have in memory.
    pub fn collection_lookup(&self) {
        self.collection_lookups.fetch_add(1, Relaxed);
    }
    /// The Prometheus text exposition: `collections` loaded, and per collection in `rounds`
    /// `(collection id, current round, accepted reports)` (empty for the public view).
    pub fn render(&self, collections: usize, rounds: &[(String, u32, u64)]) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# HELP ldpsyn_collections Collections this process serves.\n# TYPE ldpsyn_collections gauge\nldpsyn_collections {collections}"
        );
        // Writing into a String cannot fail.
        let _ = writeln!(
            s,
            "# HELP ldpsyn_reports_total Reports answered, by outcome and rejection reason.\n# TYPE ldpsyn_reports_total counter"
        );
        let _ = writeln!(
            s,
            "ldpsyn_reports_total{{outcome=\"accepted\"}} {}",
            self.accepted.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "ldpsyn_reports_total{{outcome=\"duplicate\"}} {}",
            self.duplicate.load(Relaxed)
        );
        for (i, t) in ProblemType::ALL.iter().enumerate().take(32) {
            let n = self.rejected[i].load(Relaxed);
            if n > 0 {
                let _ = writeln!(
                    s,
                    "ldpsyn_reports_total{{outcome=\"rejected\",reason=\"{}\"}} {n}",
                    t.slug()
                );
            }
        }
        let _ = writeln!(
            s,
            "# HELP ldpsyn_requests_total Requests by route.\n# TYPE ldpsyn_requests_total counter"
        );
        let _ = writeln!(
            s,
            "ldpsyn_requests_total{{route=\"reports\"}} {}",
            self.upload_requests.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "ldpsyn_requests_total{{route=\"task\"}} {}",
            self.task_requests.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "# HELP ldpsyn_tasks_issued_total Tasks handed out.\n# TYPE ldpsyn_tasks_issued_total counter\nldpsyn_tasks_issued_total {}",
            self.tasks_issued.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "# HELP ldpsyn_commit_seconds Latency of one group commit (batched transaction).\n# TYPE ldpsyn_commit_seconds histogram"
        );
        for (i, b) in BUCKETS_S.iter().enumerate() {
            let _ = writeln!(
                s,
                "ldpsyn_commit_seconds_bucket{{le=\"{b}\"}} {}",
                self.commit_buckets[i].load(Relaxed)
            );
        }
        let count = self.commits.load(Relaxed);
        let _ = writeln!(s, "ldpsyn_commit_seconds_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            s,
            "ldpsyn_commit_seconds_sum {}",
            self.commit_sum_us.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(s, "ldpsyn_commit_seconds_count {count}");
        let _ = writeln!(
            s,
            "# HELP ldpsyn_rounds_closed_total Rounds closed (PrivIncr) and batches re-weighted (SamPrivSyn).\n# TYPE ldpsyn_rounds_closed_total counter\nldpsyn_rounds_closed_total {}",
            self.rounds_closed.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "# HELP ldpsyn_collection_lookups_total Database lookups of collection ids not in memory (PostgreSQL; one per new id, then cached).\n# TYPE ldpsyn_collection_lookups_total counter\nldpsyn_collection_lookups_total {}",
            self.collection_lookups.load(Relaxed)
        );
        let _ = writeln!(
            s,
            "# HELP ldpsyn_synthetic_bytes_total Bytes of synthetic data produced for downloads (production stops when the client goes away).\n# TYPE ldpsyn_synthetic_bytes_total counter\nldpsyn_synthetic_bytes_total {}",
            self.synthetic_bytes.load(Relaxed)
        );
        if rounds.is_empty() {
            return s;
        }
        let _ = writeln!(
            s,
            "# HELP ldpsyn_collection_round Current round of each collection.\n# TYPE ldpsyn_collection_round gauge"
        );
        for (id, round, _) in rounds {
            let _ = writeln!(s, "ldpsyn_collection_round{{collection=\"{id}\"}} {round}");
        }
        let _ = writeln!(
            s,
            "# HELP ldpsyn_collection_reports Accepted reports of each collection.\n# TYPE ldpsyn_collection_reports gauge"
        );
        for (id, _, n) in rounds {
            let _ = writeln!(s, "ldpsyn_collection_reports{{collection=\"{id}\"}} {n}");
        }
        s
    }
}
