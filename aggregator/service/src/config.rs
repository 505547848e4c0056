//! Options of `ldpsyn-aggregator serve`. Every option also reads an environment variable;
//! units are in the names; secrets are hidden from `Debug`, `--help` and logs.

use std::net::SocketAddr;

/// A secret string: `Debug` and `Display` print `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself (only to use it, never to log it).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::str::FromStr for Secret {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() < 8 {
            return Err("a secret needs at least 8 characters".into());
        }
        Ok(Secret(s.to_owned()))
    }
}

/// A database URL, which may hold a password: `Debug` prints only its scheme.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    /// The URL itself (only to connect, never to log it).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = self.0.split_once(':').map_or("", |(s, _)| s);
        write!(f, "{scheme}:<redacted>")
    }
}

impl std::str::FromStr for DatabaseUrl {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(DatabaseUrl(s.to_owned()))
    }
}

/// `serve` options.
#[derive(Debug, Clone, clap::Parser)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "LDPSYN_BIND", default_value = "127.0.0.1:8080")]
    pub bind: SocketAddr,
    /// Database: `sqlite://path` (file created if missing) or `postgres://…`. May hold a
    /// password: hidden from `--help` (the environment's value) and `Debug`.
    #[arg(
        long,
        env = "LDPSYN_DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://ldpsyn.db"
    )]
    pub database_url: DatabaseUrl,
    /// Bearer token of the admin routes (required).
    #[arg(long, env = "LDPSYN_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Secret,
    /// Task-token signing key (≥ 32 bytes); else one is generated once and stored in the
    /// database, shared by every process.
    #[arg(long, env = "LDPSYN_TOKEN_KEY", hide_env_values = true)]
    pub token_key: Option<Secret>,
    /// Lifetime of a task token, seconds.
    #[arg(long, env = "LDPSYN_TASK_TTL_SECS", default_value_t = 86_400)]
    pub task_ttl_secs: i64,
    /// Most reports in one upload (413 above).
    #[arg(long, env = "LDPSYN_MAX_REPORTS_PER_UPLOAD", default_value_t = ldpsyn::wire::DEFAULT_MAX_REPORTS_PER_UPLOAD)]
    pub max_reports_per_upload: usize,
    /// Largest request body, bytes (413 above).
    #[arg(long, env = "LDPSYN_MAX_BODY_BYTES", default_value_t = ldpsyn::wire::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Request timeout until the response starts, milliseconds.
    #[arg(long, env = "LDPSYN_REQUEST_TIMEOUT_MS", default_value_t = 30_000)]
    pub request_timeout_ms: u64,
    /// Most time a connection may take to send a request's complete headers, counted from
    /// when it waits for a request (so it also bounds a keep-alive connection's wait for the
    /// next request), milliseconds; the connection is closed when it expires.
    #[arg(long, env = "LDPSYN_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000)]
    pub header_read_timeout_ms: u64,
    /// A connection on which no byte moved for this long is closed (after the response of a
    /// request in flight), milliseconds.
    #[arg(long, env = "LDPSYN_IDLE_TIMEOUT_MS", default_value_t = 60_000)]
    pub idle_timeout_ms: u64,
    /// Requests served at once; more are shed with 503.
    #[arg(long, env = "LDPSYN_MAX_IN_FLIGHT_REQUESTS", default_value_t = 4096)]
    pub max_in_flight_requests: usize,
    /// Requests of one client served at once on the rate-limited routes (a client is an IPv4
    /// address or an IPv6 /64, as for `--rate-limit-per-ip`); more are refused 429 at once,
    /// so that slow clients of a few addresses cannot hold every place of
    /// `--max-in-flight-requests`. 0 disables the cap.
    #[arg(long, env = "LDPSYN_MAX_IN_FLIGHT_PER_IP", default_value_t = 64)]
    pub max_in_flight_per_ip: usize,
    /// Slowest a request body may arrive, bytes per second on average after
    /// `--body-grace-ms`: a body behind that pace is cut and answered 408
    /// `request-timeout` (the SDKs send it again). 0 disables the check.
    #[arg(long, env = "LDPSYN_MIN_BODY_BYTES_PER_SEC", default_value_t = 4096)]
    pub min_body_bytes_per_sec: u64,
    /// Time a request body has before `--min-body-bytes-per-sec` applies, milliseconds
    /// (slow starts on mobile networks).
    #[arg(long, env = "LDPSYN_BODY_GRACE_MS", default_value_t = 5_000)]
    pub body_grace_ms: u64,
    /// Requests per second per client on each route that may cost a database query without
    /// an admin token, in four buckets (burst twice the rate each): report uploads, task
    /// requests, lookups (`GET /v1/collections/{id}`, `/healthz`) and party uploads; a
    /// client is an IPv4 address or an IPv6 /64. 0 disables every limit.
    #[arg(long, env = "LDPSYN_RATE_LIMIT_PER_IP", default_value_t = 10)]
    pub rate_limit_per_ip: u32,
    /// Reverse proxies (IP addresses, comma-separated) whose `X-Forwarded-For` / `Forwarded`
    /// headers name the client; from any other peer those headers are ignored.
    #[arg(long, env = "LDPSYN_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// Browser origins allowed by CORS, comma-separated, e.g. the sites that embed the web
    /// SDK; `*` for any (no cookies are used: admin calls carry a bearer token). Default none:
    /// the dashboard is served from the same origin and needs no CORS.
    #[arg(long, env = "LDPSYN_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,
    /// Most rows of one synthetic download.
    #[arg(long, env = "LDPSYN_MAX_SYNTHETIC_ROWS", default_value_t = 10_000_000)]
    pub max_synthetic_rows: u64,
    /// Database connections (SQLite: 2 to 4; the committer keeps one).
    #[arg(long, env = "LDPSYN_DB_MAX_CONNECTIONS", default_value_t = 8)]
    pub db_max_connections: u32,
    /// Uploads queued for the committer before requests wait.
    #[arg(long, env = "LDPSYN_COMMIT_QUEUE_LEN", default_value_t = 8192)]
    pub commit_queue_len: usize,
    /// PostgreSQL: how often to pick up other processes' transitions, milliseconds.
    #[arg(long, env = "LDPSYN_REFRESH_INTERVAL_MS", default_value_t = 500)]
    pub refresh_interval_ms: u64,
    /// How often the upkeep pass runs, seconds (also once at startup): it closes rounds whose
    /// quota was reached with no close stored, deletes the raw reports of collections past
    /// their `retain_reports_days` and finalizes collections that reached their target but
    /// are not finalized yet.
    #[arg(long, env = "LDPSYN_MAINTENANCE_INTERVAL_SECS", default_value_t = 3600)]
    pub maintenance_interval_secs: u64,
    /// Provisional estimates (`?provisional=true` before finalize): a cached refit answers
    /// requests for this long after its fit finished, milliseconds; then the next request
    /// refits from the reports so far (one refit at a time per collection). A refit that saw
    /// every report accepted so far answers whatever its age. 0: refit whenever reports came.
    #[arg(long, env = "LDPSYN_PROVISIONAL_REFRESH_MS", default_value_t = 5_000)]
    pub provisional_refresh_ms: u64,
    /// Models refitted at once in the background: at startup (and, on PostgreSQL, when a
    /// collection another process finalized is loaded) the finalized collections' models
    /// are refitted from their stored reports while the API already serves; until its model
    /// is back a collection's model routes answer 409 `model-not-ready`.
    #[arg(long, env = "LDPSYN_REFIT_CONCURRENCY", default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..=64))]
    pub refit_concurrency: u32,
    /// Tests only: the pool background refits take their permits from, instead of one of
    /// `refit_concurrency` permits; a pool of no permits holds every refit until permits
    /// are added. No option of the command line.
    #[arg(skip)]
    pub refit_pool: Option<std::sync::Arc<tokio::sync::Semaphore>>,
    /// Simulations only: draw tasks from one stream seeded by this (in the order the task
    /// requests arrive) instead of the operating system's randomness, so that a simulation
    /// that asks for tasks in a fixed order (`demo`) hands out the same tasks every run.
    /// Which task a person gets does not depend on their data, so this costs no privacy, but
    /// it is no option of the command line: only code that builds the config sets it.
    #[arg(skip)]
    pub task_seed: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn secrets_are_redacted() {
        let c = ServeConfig::parse_from([
            "serve",
            "--admin-token",
            "very-secret-admin",
            "--token-key",
            "k3y-k3y-k3y-k3y-k3y-k3y-k3y-k3y-k3y",
        ]);
        let s = format!("{c:?}");
        assert!(
            !s.contains("very-secret-admin") && !s.contains("k3y"),
            "{s}"
        );
        assert_eq!(c.admin_token.expose(), "very-secret-admin");
    }

    /// Issue 33 item 10: a database URL's password reaches neither `Debug` nor `--help`
    /// (clap prints the environment's value there unless told not to).
    #[test]
    fn database_url_is_redacted() {
        use clap::CommandFactory;
        let url = "postgres://ldpsyn:hunter2-password@db.internal/ldpsyn";
        let c = ServeConfig::parse_from([
            "serve",
            "--admin-token",
            "very-secret-admin",
            "--database-url",
            url,
        ]);
        assert_eq!(c.database_url.expose(), url);
        let s = format!("{c:?}");
        assert!(!s.contains("hunter2") && !s.contains("db.internal"), "{s}");
        assert!(s.contains("postgres:<redacted>"), "{s}");
        let command = ServeConfig::command();
        let arg = command
            .get_arguments()
            .find(|a| a.get_id() == "database_url")
            .unwrap();
        assert!(arg.is_hide_env_values_set());
    }

    /// Issue 33 item 12: no cross-origin access unless asked for.
    #[test]
    fn cors_origins_default_to_none() {
        let c = ServeConfig::parse_from(["serve", "--admin-token", "very-secret-admin"]);
        assert!(c.cors_origins.is_empty(), "{:?}", c.cors_origins);
        let c = ServeConfig::parse_from([
            "serve",
            "--admin-token",
            "very-secret-admin",
            "--cors-origins",
            "https://a.example,https://b.example",
        ]);
        assert_eq!(c.cors_origins, ["https://a.example", "https://b.example"]);
    }
}
