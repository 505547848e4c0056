//! The device privacy-budget ledger.
//!
//! Before a report leaves the device, the ε it spends and the randomized report itself
//! (id, token, payload; never the record) are written to the ledger. The rules, shared by the
//! native client and the WASM client through [`next_step`]:
//!
//! - one randomization per collection, ever: a collection's budget is one report;
//! - a report that is pending (sent, not yet answered) is resent byte-for-byte, without
//!   spending again;
//! - once the server acknowledged it, or refused it permanently (4xx), the budget stays
//!   spent and further submissions fail with `BudgetExhausted`;
//! - with a [`DeviceBudget`] (per ledger: per app or browser origin; both SDKs apply
//!   [`DeviceBudget::DEFAULT`] unless the app sets another), a collection is not randomized
//!   for when the ε spent on all collections within the budget's rolling window plus the
//!   collection's ε would exceed its cap ([`next_step_within`]).
//!
//! Deciding and recording are one step, [`BudgetLedger::transact`] (or [`update`]): the
//! client decides *and randomizes* inside it, on entries read afresh while every other writer
//! of the same storage waits, so two clients sharing a ledger (two processes on one
//! [`FileLedger`] path) cannot both randomize for a collection.
//!
//! ```
//! use ldpsyn::ledger::{BudgetLedger, MemoryLedger, NextStep, next_step};
//! let ledger = MemoryLedger::default();
//! let id = uuid::Uuid::new_v4();
//! assert!(matches!(next_step(ledger.get(id).unwrap().as_ref()), NextStep::Randomize));
//! ```

use std::collections::BTreeMap;
#[cfg(not(target_arch = "wasm32"))]
use std::io::Write as _;
#[cfg(not(target_arch = "wasm32"))]
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::wire::Report;

/// Errors of a ledger's storage.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Reading, writing or locking the ledger file failed.
    #[error("ledger I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The ledger file is not a valid ledger.
    #[error("ledger file is corrupt: {0}")]
    Corrupt(#[from] serde_json::Error),
    /// A storage backend's own error (e.g. the browser's localStorage).
    #[error("ledger storage error: {0}")]
    Storage(String),
}

/// Where a collection's one report stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportState {
    /// Randomized and recorded; not yet answered by the server. Retries resend it as is.
    Pending,
    /// The server answered `accepted` or `duplicate`.
    Acknowledged,
    /// The server refused it permanently; the budget stays spent.
    Refused,
}

/// What the ledger knows of one collection on this device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    /// ε spent on this collection.
    pub epsilon_spent: f64,
    /// The randomized report (id, token, payload), kept to resend identical bytes.
    pub report: Report,
    /// Where the report stands.
    pub state: ReportState,
    /// When the ε was spent (the report randomized), milliseconds since the Unix epoch, on
    /// the device's clock. `None` in entries written before ledgers kept it (they read as
    /// before); a [`DeviceBudget`] counts such an entry in every window, as it counts one
    /// dated in the future (a clock set back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent_at_unix_ms: Option<u64>,
}

/// Cap of [`DeviceBudget::DEFAULT`]: ε = 10 within its window, e.g. two or three collections
/// at ε = 2–4 a month. A collection asking more than this per report is refused under the
/// default; an app that means to spend more sets its own budget.
pub const DEFAULT_DEVICE_MAX_EPSILON: f64 = 10.0;

/// Window of [`DeviceBudget::DEFAULT`]: 30 days.
pub const DEFAULT_DEVICE_WINDOW: Duration = Duration::from_secs(30 * 86_400);

/// Why a [`DeviceBudget`] cannot be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeviceBudgetError {
    /// The cap must be a finite number > 0.
    #[error("device budget: max epsilon must be finite and > 0, got {0}")]
    InvalidEpsilon(f64),
    /// The window must be longer than zero.
    #[error("device budget: the window must be longer than zero")]
    EmptyWindow,
}

/// A device-wide cap on ε across collections: at most `max_epsilon` spent within any rolling
/// `window` (e.g. 8 per 30 days) by the clients of one ledger — one app's ledger file, or
/// one browser origin's `localStorage`. Reports of different collections compose
/// sequentially (ε adds up), so the cap bounds what the collections together learn about
/// the device within a window. The cap may exceed [`crate::MAX_EPSILON`], which bounds one
/// report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceBudget {
    max_epsilon: f64,
    window: Duration,
}

impl DeviceBudget {
    /// The cap both SDKs apply unless the app sets another: [`DEFAULT_DEVICE_MAX_EPSILON`]
    /// within any [`DEFAULT_DEVICE_WINDOW`], so a server that steers an app into many
    /// collections cannot collect their summed ε.
    pub const DEFAULT: Self = Self {
        max_epsilon: DEFAULT_DEVICE_MAX_EPSILON,
        window: DEFAULT_DEVICE_WINDOW,
    };

    /// A cap of `max_epsilon` (finite, > 0) per rolling `window` (> 0).
    /// Errors: [`DeviceBudgetError`].
    pub fn new(max_epsilon: f64, window: Duration) -> Result<Self, DeviceBudgetError> {
        if !max_epsilon.is_finite() || max_epsilon <= 0.0 {
            return Err(DeviceBudgetError::InvalidEpsilon(max_epsilon));
        }
        if window.is_zero() {
            return Err(DeviceBudgetError::EmptyWindow);
        }
        Ok(Self {
            max_epsilon,
            window,
        })
    }

    /// The cap.
    pub fn max_epsilon(&self) -> f64 {
        self.max_epsilon
    }

    /// The rolling window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// ε of every entry spent within the window ending at `now_unix_ms` (ms since the Unix
    /// epoch): spent less than `window` before it, after it (a clock set back), or at an
    /// unknown time (entries from before timestamps). Every state counts: a pending,
    /// acknowledged or refused report spent its ε.
    pub fn spent_in_window(&self, entries: &Entries, now_unix_ms: u64) -> f64 {
        let window_ms = u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX);
        entries
            .values()
            .filter(|e| match e.spent_at_unix_ms {
                None => true,
                Some(t) => now_unix_ms.saturating_sub(t) < window_ms,
            })
            .map(|e| e.epsilon_spent)
            .sum()
    }

    /// Whether spending `epsilon` more now stays within the cap (up to a relative 1e-9, so
    /// that e.g. ten reports at ε = 0.1 fit a cap of 1 despite rounding).
    pub fn allows(&self, entries: &Entries, epsilon: f64, now_unix_ms: u64) -> bool {
        self.spent_in_window(entries, now_unix_ms) + epsilon <= self.max_epsilon * (1.0 + 1e-9)
    }
}

/// Every collection's entry in a ledger, by collection id.
pub type Entries = BTreeMap<Uuid, LedgerEntry>;

/// Storage of per-collection entries.
///
/// Implementations make [`BudgetLedger::transact`] atomic with respect to every other
/// writer of the same storage (other ledgers on the same file, other processes), and durable
/// when it returns; reads go to the storage, never to a snapshot taken earlier.
pub trait BudgetLedger: Send {
    /// Every entry, read from the storage now.
    fn entries(&self) -> Result<Entries, LedgerError>;

    /// The entry of `collection`, if any, read from the storage now.
    fn get(&self, collection: Uuid) -> Result<Option<LedgerEntry>, LedgerError> {
        Ok(self.entries()?.remove(&collection))
    }

    /// The ledger's one read-decide-write step: with every other writer of the same storage
    /// excluded (an exclusive file lock for [`FileLedger`]), reads every entry afresh, calls
    /// `step` exactly once with them, and if it returns an entry stores it, durably, as
    /// `collection`'s before the exclusion ends. `step` must not block on I/O (the lock is
    /// held while it runs): the client randomizes in it, it does not fetch.
    ///
    /// Errors: the storage's (reading, locking, writing); nothing is stored then.
    fn transact(
        &mut self,
        collection: Uuid,
        step: &mut dyn FnMut(&Entries) -> Option<LedgerEntry>,
    ) -> Result<(), LedgerError>;

    /// Stores (replaces) the entry of `collection`, durably (a [`BudgetLedger::transact`]
    /// that always writes, so it never overwrites other collections' newer entries).
    fn put(&mut self, collection: Uuid, entry: LedgerEntry) -> Result<(), LedgerError> {
        let mut entry = Some(entry);
        self.transact(collection, &mut |_| entry.take())
    }
}

/// [`BudgetLedger::transact`] with a result: `step` gets the fresh entries and returns the
/// entry to store for `collection` (or `None`) and a value, which `update` returns once the
/// entry is stored. Errors: the ledger's ([`LedgerError`]); `step`'s value is dropped then.
pub fn update<L: BudgetLedger + ?Sized, T>(
    ledger: &mut L,
    collection: Uuid,
    step: impl FnOnce(&Entries) -> (Option<LedgerEntry>, T),
) -> Result<T, LedgerError> {
    let mut step = Some(step);
    let mut out = None;
    ledger.transact(collection, &mut |entries| {
        // `transact` calls its step once; a second call stores nothing.
        let (entry, value) = step.take()?(entries);
        out = Some(value);
        entry
    })?;
    out.ok_or_else(|| LedgerError::Storage("the ledger did not run the step".into()))
}

/// What the client must do for a collection, given its ledger entry.
#[derive(Debug, Clone, PartialEq)]
pub enum NextStep {
    /// Nothing spent yet: randomize a new report.
    Randomize,
    /// A pending report: resend it, byte for byte, spending nothing.
    Resend(Report),
    /// The budget is spent (acknowledged or refused report): do nothing.
    Exhausted {
        /// ε already spent.
        epsilon_spent: f64,
    },
    /// Nothing spent on this collection, but its ε would take the device above its
    /// [`DeviceBudget`]: do nothing (nothing randomized, nothing sent).
    DeviceBudgetExhausted {
        /// ε spent on every collection within the window.
        spent_in_window: f64,
        /// ε this collection's report would spend.
        requested: f64,
        /// The device's cap.
        max_epsilon: f64,
    },
}

/// The ledger rule (see the module docs).
pub fn next_step(entry: Option<&LedgerEntry>) -> NextStep {
    match entry {
        None => NextStep::Randomize,
        Some(e) if e.state == ReportState::Pending => NextStep::Resend(e.report.clone()),
        Some(e) => NextStep::Exhausted {
            epsilon_spent: e.epsilon_spent,
        },
    }
}

/// The ledger rule with a device-wide cap: [`next_step`] for `collection`'s entry, and a
/// [`NextStep::Randomize`] becomes [`NextStep::DeviceBudgetExhausted`] when `budget` does not
/// allow `epsilon` (the collection's ε per report) more at `now_unix_ms` (ms since the Unix
/// epoch). A pending report is resent whatever the cap: resending spends nothing.
pub fn next_step_within(
    entries: &Entries,
    collection: Uuid,
    epsilon: f64,
    budget: Option<&DeviceBudget>,
    now_unix_ms: u64,
) -> NextStep {
    match (next_step(entries.get(&collection)), budget) {
        (NextStep::Randomize, Some(b)) if !b.allows(entries, epsilon, now_unix_ms) => {
            NextStep::DeviceBudgetExhausted {
                spent_in_window: b.spent_in_window(entries, now_unix_ms),
                requested: epsilon,
                max_epsilon: b.max_epsilon(),
            }
        }
        (step, _) => step,
    }
}

/// ε this device may still spend on `collection` (reports of `epsilon`) under the rules of
/// [`next_step_within`]: `epsilon` if it would randomize now, else 0.
pub fn remaining_budget_within(
    entries: &Entries,
    collection: Uuid,
    epsilon: f64,
    budget: Option<&DeviceBudget>,
    now_unix_ms: u64,
) -> f64 {
    match next_step_within(entries, collection, epsilon, budget, now_unix_ms) {
        NextStep::Randomize => epsilon,
        _ => 0.0,
    }
}

/// ε left for a collection whose reports cost `epsilon`: `epsilon` before the first
/// randomization, 0 after (without a device-wide cap: see [`remaining_budget_within`]).
pub fn remaining_budget(entry: Option<&LedgerEntry>, epsilon: f64) -> f64 {
    if entry.is_some() { 0.0 } else { epsilon }
}

/// A ledger in memory, for simulations and tests (forgotten when dropped).
#[derive(Debug, Clone, Default)]
pub struct MemoryLedger {
    entries: Entries,
}

impl BudgetLedger for MemoryLedger {
    fn entries(&self) -> Result<Entries, LedgerError> {
        Ok(self.entries.clone())
    }
    fn get(&self, collection: Uuid) -> Result<Option<LedgerEntry>, LedgerError> {
        Ok(self.entries.get(&collection).cloned())
    }
    fn transact(
        &mut self,
        collection: Uuid,
        step: &mut dyn FnMut(&Entries) -> Option<LedgerEntry>,
    ) -> Result<(), LedgerError> {
        // `&mut self`: nobody else can reach these entries meanwhile.
        if let Some(entry) = step(&self.entries) {
            self.entries.insert(collection, entry);
        }
        Ok(())
    }
}

#[cfg(not(target_arch = "wasm32"))]
#[derive(Debug, Default, Serialize, Deserialize)]
struct LedgerFile {
    version: u32,
    collections: Entries,
}

/// A ledger in a JSON file, shared safely by every process (and every `FileLedger`) opened on
/// the same path: each [`BudgetLedger::transact`] (so each `put`) takes an exclusive advisory
/// lock on a sidecar file `<path>.lock` (created beside the ledger and left there: removing it
/// while a process holds it would let a second lock on a new file succeed), reads the ledger
/// from disk under it, and rewrites it atomically (temporary file in the same folder, fsync,
/// rename) before unlocking, so a crash leaves either the old or the new ledger. Reads
/// ([`BudgetLedger::entries`], [`BudgetLedger::get`]) go to the disk every time and need no
/// lock (a rename is atomic); nothing is cached in memory.
///
/// The lock is `flock(2)` on Unix and `LockFileEx` on Windows (crate `fd-lock`); it is
/// advisory, so only ldpsyn ledgers respect it. Not available on `wasm32` (no file system:
/// the browser client keeps its ledger in `localStorage`).
#[cfg(not(target_arch = "wasm32"))]
#[derive(Debug)]
pub struct FileLedger {
    path: PathBuf,
    lock: fd_lock::RwLock<std::fs::File>,
}

#[cfg(not(target_arch = "wasm32"))]
impl FileLedger {
    /// Opens the ledger at `path` (an absent file is an empty ledger, written on the first
    /// `put`) and its lock file `<path>.lock` (created if absent). Errors: I/O errors other
    /// than "not found" (the folder must exist and be writable); a corrupt ledger file.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, LedgerError> {
        let path = path.into();
        let mut lock_path = path.clone().into_os_string();
        lock_path.push(".lock");
        let lock_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)?;
        read_ledger(&path)?;
        Ok(Self {
            path,
            lock: fd_lock::RwLock::new(lock_file),
        })
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The ledger file at `path`; an absent file is an empty ledger.
#[cfg(not(target_arch = "wasm32"))]
fn read_ledger(path: &Path) -> Result<LedgerFile, LedgerError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LedgerFile {
            version: 1,
            collections: Entries::new(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Replaces the ledger file at `path` atomically and durably.
#[cfg(not(target_arch = "wasm32"))]
fn write_ledger(path: &Path, file: &LedgerFile) -> Result<(), LedgerError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
    tmp.write_all(&serde_json::to_vec_pretty(file)?)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    // Make the rename itself durable; not every platform can open a directory.
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(not(target_arch = "wasm32"))]
impl BudgetLedger for FileLedger {
    fn entries(&self) -> Result<Entries, LedgerError> {
        Ok(read_ledger(&self.path)?.collections)
    }

    fn transact(
        &mut self,
        collection: Uuid,
        step: &mut dyn FnMut(&Entries) -> Option<LedgerEntry>,
    ) -> Result<(), LedgerError> {
        // Blocks until no other ledger on this path holds the lock; released when `_guard`
        // drops, after the write (or on any error, or if `step` panics).
        let _guard = self.lock.write()?;
        let mut file = read_ledger(&self.path)?;
        if let Some(entry) = step(&file.collections) {
            file.collections.insert(collection, entry);
            write_ledger(&self.path, &file)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Payload;

    fn entry(state: ReportState) -> LedgerEntry {
        LedgerEntry {
            epsilon_spent: 2.0,
            report: Report {
                id: Uuid::new_v4(),
                token: "t".into(),
                payload: Payload::Grr(3),
            },
            state,
            spent_at_unix_ms: Some(1_000_000),
        }
    }

    #[test]
    fn rules() {
        assert_eq!(next_step(None), NextStep::Randomize);
        let p = entry(ReportState::Pending);
        assert_eq!(next_step(Some(&p)), NextStep::Resend(p.report.clone()));
        for s in [ReportState::Acknowledged, ReportState::Refused] {
            assert_eq!(
                next_step(Some(&entry(s))),
                NextStep::Exhausted { epsilon_spent: 2.0 }
            );
        }
        assert_eq!(remaining_budget(None, 2.0), 2.0);
        assert_eq!(remaining_budget(Some(&p), 2.0), 0.0);
    }

    /// Two `FileLedger`s on one path: each sees the other's writes at once (no stale
    /// snapshot) and neither overwrites the other's collections.
    #[test]
    fn file_ledgers_on_one_path_see_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.json");
        let mut a = FileLedger::open(&path).unwrap();
        let mut b = FileLedger::open(&path).unwrap();
        let (c1, c2) = (Uuid::new_v4(), Uuid::new_v4());
        let (e1, e2) = (entry(ReportState::Pending), entry(ReportState::Refused));
        a.put(c1, e1.clone()).unwrap();
        assert_eq!(b.get(c1).unwrap(), Some(e1.clone()));
        b.put(c2, e2.clone()).unwrap();
        let both = FileLedger::open(&path).unwrap().entries().unwrap();
        assert_eq!(both.get(&c1), Some(&e1));
        assert_eq!(both.get(&c2), Some(&e2));
        assert_eq!(a.entries().unwrap(), both);
    }

    /// `transact` holds the file lock from its read to its write: a second ledger on the same
    /// path (here another thread; the two-process test is in `tests/http_client.rs`) that
    /// starts its step while the first is inside its own waits, and then sees the first
    /// one's entry.
    #[test]
    fn file_ledger_transact_excludes_other_ledgers_on_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.json");
        let c = Uuid::new_v4();
        let mut a = FileLedger::open(&path).unwrap();
        let mut b = FileLedger::open(&path).unwrap();
        let (inside_tx, inside_rx) = std::sync::mpsc::channel();
        let first = std::thread::spawn(move || {
            update(&mut a, c, |entries| {
                assert!(entries.is_empty());
                inside_tx.send(()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(300));
                (Some(entry(ReportState::Pending)), ())
            })
            .unwrap();
        });
        inside_rx.recv().unwrap();
        let seen = update(&mut b, c, |entries| (None, entries.get(&c).cloned())).unwrap();
        first.join().unwrap();
        assert_eq!(seen.map(|e| e.state), Some(ReportState::Pending));
    }

    /// `MemoryLedger`: `transact` stores what its step returns, and nothing for `None`.
    #[test]
    fn memory_ledger_transact() {
        let mut l = MemoryLedger::default();
        let c = Uuid::new_v4();
        assert_eq!(update(&mut l, c, |_| (None, 7)).unwrap(), 7);
        assert!(l.entries().unwrap().is_empty());
        let e = entry(ReportState::Pending);
        update(&mut l, c, |_| (Some(e.clone()), ())).unwrap();
        assert_eq!(l.get(c).unwrap(), Some(e));
    }

    fn at(epsilon: f64, spent_at_unix_ms: Option<u64>) -> LedgerEntry {
        LedgerEntry {
            epsilon_spent: epsilon,
            spent_at_unix_ms,
            ..entry(ReportState::Acknowledged)
        }
    }

    /// Issue 13 item 12: the device-wide cap sums ε over every collection within the rolling
    /// window (entries without a time, or dated in the future, count; older ones do not),
    /// refuses a new collection whose ε would exceed it, never refuses a resend, and is
    /// checked when built.
    #[test]
    fn device_budget_caps_epsilon_in_a_rolling_window() {
        const DAY_MS: u64 = 86_400_000;
        let now = 100 * DAY_MS;
        let budget = DeviceBudget::new(5.0, Duration::from_millis(7 * DAY_MS)).unwrap();
        let mut entries = Entries::new();
        entries.insert(Uuid::new_v4(), at(1.5, Some(now - 7 * DAY_MS))); // just outside
        entries.insert(Uuid::new_v4(), at(2.0, Some(now - 7 * DAY_MS + 1))); // inside
        entries.insert(Uuid::new_v4(), at(1.0, None)); // from an older ledger: counted
        entries.insert(Uuid::new_v4(), at(0.5, Some(now + DAY_MS))); // clock set back
        assert_eq!(budget.spent_in_window(&entries, now), 3.5);
        let c = Uuid::new_v4();
        let step =
            |eps: f64, entries: &Entries| next_step_within(entries, c, eps, Some(&budget), now);
        assert_eq!(step(1.5, &entries), NextStep::Randomize);
        assert_eq!(
            step(1.6, &entries),
            NextStep::DeviceBudgetExhausted {
                spent_in_window: 3.5,
                requested: 1.6,
                max_epsilon: 5.0
            }
        );
        assert_eq!(
            remaining_budget_within(&entries, c, 1.5, Some(&budget), now),
            1.5
        );
        assert_eq!(
            remaining_budget_within(&entries, c, 1.6, Some(&budget), now),
            0.0
        );
        // Without a cap, the per-collection rule alone.
        assert_eq!(
            next_step_within(&entries, c, 19.0, None, now),
            NextStep::Randomize
        );
        // A day later the entry at the window's start has aged out too.
        assert_eq!(budget.spent_in_window(&entries, now + DAY_MS), 1.5);
        // A pending report of the collection itself is resent whatever the cap.
        let mut full = entries.clone();
        full.insert(Uuid::new_v4(), at(10.0, Some(now)));
        let pending = entry(ReportState::Pending);
        full.insert(c, pending.clone());
        assert_eq!(step(2.0, &full), NextStep::Resend(pending.report));
        // Rounding: ten reports at 0.1 fit a cap of 1.
        let tenths = DeviceBudget::new(1.0, Duration::from_secs(60)).unwrap();
        let mut ten = Entries::new();
        for _ in 0..9 {
            ten.insert(Uuid::new_v4(), at(0.1, Some(now)));
        }
        assert!(tenths.allows(&ten, 0.1, now));
        assert!(!tenths.allows(&ten, 0.11, now));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(
                DeviceBudget::new(bad, Duration::from_secs(1)).is_err(),
                "{bad}"
            );
        }
        assert_eq!(
            DeviceBudget::new(1.0, Duration::ZERO),
            Err(DeviceBudgetError::EmptyWindow)
        );
    }

    /// A ledger file written before entries had timestamps still opens; its entries read
    /// with no time, and a rewrite keeps them so.
    #[test]
    fn ledger_files_without_timestamps_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.json");
        let c = Uuid::new_v4();
        let old = format!(
            r#"{{"version": 1, "collections": {{"{c}": {{"epsilon_spent": 2.0,
            "report": {{"id": "{}", "token": "t", "payload": {{"grr": 3}}}},
            "state": "acknowledged"}}}}}}"#,
            Uuid::new_v4()
        );
        std::fs::write(&path, old).unwrap();
        let mut l = FileLedger::open(&path).unwrap();
        let e = l.get(c).unwrap().unwrap();
        assert_eq!((e.epsilon_spent, e.spent_at_unix_ms), (2.0, None));
        assert_eq!(
            next_step(Some(&e)),
            NextStep::Exhausted { epsilon_spent: 2.0 }
        );
        let other = Uuid::new_v4();
        l.put(other, entry(ReportState::Pending)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("spent_at_unix_ms").count(), 1, "{text}");
    }

    #[test]
    fn file_ledger_persists_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.json");
        let c = Uuid::new_v4();
        let e = entry(ReportState::Pending);
        {
            let mut l = FileLedger::open(&path).unwrap();
            assert_eq!(l.get(c).unwrap(), None);
            l.put(c, e.clone()).unwrap();
        }
        let mut l = FileLedger::open(&path).unwrap();
        assert_eq!(l.get(c).unwrap(), Some(e.clone()));
        let mut acked = e.clone();
        acked.state = ReportState::Acknowledged;
        l.put(c, acked.clone()).unwrap();
        assert_eq!(
            FileLedger::open(&path).unwrap().get(c).unwrap(),
            Some(acked)
        );
        std::fs::write(&path, b"{not json").unwrap();
        assert!(matches!(
            FileLedger::open(&path),
            Err(LedgerError::Corrupt(_))
        ));
    }
}
