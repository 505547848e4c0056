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
//!   spent and further submissions fail with `BudgetExhausted`.
//!
//! ```
//! use ldpsyn::ledger::{BudgetLedger, MemoryLedger, NextStep, next_step};
//! let ledger = MemoryLedger::default();
//! let id = uuid::Uuid::new_v4();
//! assert!(matches!(next_step(ledger.get(id).unwrap().as_ref()), NextStep::Randomize));
//! ```

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::protocol::Report;

/// Errors of a ledger's storage.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Reading or writing the ledger file failed.
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
}

/// Storage of per-collection entries. `put` must be durable when it returns.
pub trait BudgetLedger: Send {
    /// The entry of `collection`, if any.
    fn get(&self, collection: Uuid) -> Result<Option<LedgerEntry>, LedgerError>;
    /// Stores (replaces) the entry of `collection`, durably.
    fn put(&mut self, collection: Uuid, entry: LedgerEntry) -> Result<(), LedgerError>;
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

/// ε left for a collection whose reports cost `epsilon`: `epsilon` before the first
/// randomization, 0 after.
pub fn remaining_budget(entry: Option<&LedgerEntry>, epsilon: f64) -> f64 {
    if entry.is_some() { 0.0 } else { epsilon }
}

/// A ledger in memory, for simulations and tests (forgotten when dropped).
#[derive(Debug, Clone, Default)]
pub struct MemoryLedger {
    entries: BTreeMap<Uuid, LedgerEntry>,
}

impl BudgetLedger for MemoryLedger {
    fn get(&self, collection: Uuid) -> Result<Option<LedgerEntry>, LedgerError> {
        Ok(self.entries.get(&collection).cloned())
    }
    fn put(&mut self, collection: Uuid, entry: LedgerEntry) -> Result<(), LedgerError> {
        self.entries.insert(collection, entry);
        Ok(())
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LedgerFile {
    version: u32,
    collections: BTreeMap<Uuid, LedgerEntry>,
}

/// A ledger in a JSON file, rewritten atomically on every `put` (temporary file in the same
/// folder, fsync, rename), so a crash leaves either the old or the new ledger.
#[derive(Debug)]
pub struct FileLedger {
    path: PathBuf,
    file: LedgerFile,
}

impl FileLedger {
    /// Opens the ledger at `path`, or starts an empty one if the file does not exist.
    /// Errors: I/O errors other than "not found"; a corrupt file.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, LedgerError> {
        let path = path.into();
        let file = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => LedgerFile {
                version: 1,
                collections: BTreeMap::new(),
            },
            Err(e) => return Err(e.into()),
        };
        Ok(Self { path, file })
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self) -> Result<(), LedgerError> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
        tmp.write_all(&serde_json::to_vec_pretty(&self.file)?)?;
        tmp.as_file().sync_all()?;
        tmp.persist(&self.path).map_err(|e| e.error)?;
        // Make the rename itself durable; not every platform can open a directory.
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl BudgetLedger for FileLedger {
    fn get(&self, collection: Uuid) -> Result<Option<LedgerEntry>, LedgerError> {
        Ok(self.file.collections.get(&collection).cloned())
    }
    fn put(&mut self, collection: Uuid, entry: LedgerEntry) -> Result<(), LedgerError> {
        let previous = self.file.collections.insert(collection, entry);
        if let Err(e) = self.write() {
            // Keep memory equal to disk.
            match previous {
                Some(p) => self.file.collections.insert(collection, p),
                None => self.file.collections.remove(&collection),
            };
            return Err(e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Payload;

    fn entry(state: ReportState) -> LedgerEntry {
        LedgerEntry {
            epsilon_spent: 2.0,
            report: Report {
                id: Uuid::new_v4(),
                token: "t".into(),
                payload: Payload::Grr(3),
            },
            state,
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
