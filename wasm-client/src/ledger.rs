//! The device budget ledger of the browser: entries in `localStorage` (one key per
//! collection), or, where there is none (node), in memory for the life of the WASM instance.
//!
//! The rules are `ldpsyn::ledger`'s ([`ldpsyn::ledger::next_step_within`], the device-wide
//! cap summing every entry of the origin); this module only stores entries. Only the
//! randomized report, its ε and the time it was spent are stored, never the record.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use js_sys::{Function, Promise, Reflect};
use ldpsyn::ledger::{BudgetLedger, Entries, LedgerEntry, LedgerError};
use uuid::Uuid;
use wasm_bindgen::JsCast;
use wasm_bindgen::JsValue;
use wasm_bindgen::closure::Closure;
use wasm_bindgen_futures::JsFuture;

/// Prefix of the `localStorage` keys: `ldpsyn.ledger.v1.<collection id>`.
pub const KEY_PREFIX: &str = "ldpsyn.ledger.v1.";

/// Name of the Web Lock every page of an origin takes around a ledger transaction.
pub const LOCK_NAME: &str = "ldpsyn.ledger.v1";

thread_local! {
    /// The in-memory store, shared by every client of this WASM instance, so that connecting
    /// again does not forget what was spent.
    static MEMORY: RefCell<BTreeMap<Uuid, LedgerEntry>> = const { RefCell::new(BTreeMap::new()) };
}

/// Where the entries live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// `window.localStorage`, persistent across page loads.
    LocalStorage,
    /// Memory of this WASM instance (node, or when asked for).
    Memory,
}

impl Storage {
    /// The name used in the JS options (`"localStorage"`, `"memory"`).
    pub fn name(self) -> &'static str {
        match self {
            Storage::LocalStorage => "localStorage",
            Storage::Memory => "memory",
        }
    }
}

/// A [`BudgetLedger`] over `localStorage` or the in-memory store. It holds no JS object
/// (the storage is looked up on every call), so it is `Send` as the trait asks.
#[derive(Debug, Clone)]
pub struct DeviceLedger {
    storage: Storage,
}

fn local_storage() -> Result<Option<web_sys::Storage>, LedgerError> {
    // No `window` (node, workers): no localStorage.
    let Some(window) = web_sys::window() else {
        return Ok(None);
    };
    // `localStorage` throws when storage is disabled (e.g. some private modes).
    window.local_storage().map_err(storage_error)
}

fn storage_error(e: JsValue) -> LedgerError {
    LedgerError::Storage(crate::describe_js_error(&e))
}

/// Whether this environment has a usable `localStorage`.
pub fn local_storage_available() -> bool {
    matches!(local_storage(), Ok(Some(_)))
}

impl DeviceLedger {
    /// A ledger in `storage`. Errors: `localStorage` asked for but not available.
    pub fn new(storage: Storage) -> Result<Self, LedgerError> {
        if storage == Storage::LocalStorage && local_storage()?.is_none() {
            return Err(LedgerError::Storage(
                "localStorage is not available here".into(),
            ));
        }
        Ok(Self { storage })
    }

    /// Where this ledger keeps its entries.
    pub fn storage(&self) -> Storage {
        self.storage
    }

    fn key(collection: Uuid) -> String {
        format!("{KEY_PREFIX}{collection}")
    }

    fn local(&self) -> Result<web_sys::Storage, LedgerError> {
        local_storage()?.ok_or_else(|| LedgerError::Storage("localStorage went away".into()))
    }
}

impl BudgetLedger for DeviceLedger {
    fn entries(&self) -> Result<Entries, LedgerError> {
        match self.storage {
            Storage::Memory => Ok(MEMORY.with(|m| m.borrow().clone())),
            Storage::LocalStorage => {
                let local = self.local()?;
                let mut entries = Entries::new();
                for i in 0..local.length().map_err(storage_error)? {
                    let Some(key) = local.key(i).map_err(storage_error)? else {
                        continue;
                    };
                    // Other keys of the origin are not ours.
                    let Some(id) = key.strip_prefix(KEY_PREFIX) else {
                        continue;
                    };
                    let Ok(collection) = id.parse::<Uuid>() else {
                        continue;
                    };
                    if let Some(json) = local.get_item(&key).map_err(storage_error)? {
                        entries.insert(collection, serde_json::from_str(&json)?);
                    }
                }
                Ok(entries)
            }
        }
    }

    fn get(&self, collection: Uuid) -> Result<Option<LedgerEntry>, LedgerError> {
        match self.storage {
            Storage::Memory => Ok(MEMORY.with(|m| m.borrow().get(&collection).cloned())),
            Storage::LocalStorage => {
                let item = self
                    .local()?
                    .get_item(&Self::key(collection))
                    .map_err(storage_error)?;
                match item {
                    None => Ok(None),
                    Some(json) => Ok(Some(serde_json::from_str(&json)?)),
                }
            }
        }
    }

    /// Reads, decides and writes synchronously, with no `await` in between: nothing else runs
    /// in this page (JS is single-threaded) meanwhile. Other pages of the origin share
    /// `localStorage`: the client runs this inside [`with_origin_lock`], so they take turns.
    fn transact(
        &mut self,
        collection: Uuid,
        step: &mut dyn FnMut(&Entries) -> Option<LedgerEntry>,
    ) -> Result<(), LedgerError> {
        if let Some(entry) = step(&self.entries()?) {
            self.store(collection, entry)?;
        }
        Ok(())
    }
}

impl DeviceLedger {
    fn store(&mut self, collection: Uuid, entry: LedgerEntry) -> Result<(), LedgerError> {
        match self.storage {
            Storage::Memory => {
                MEMORY.with(|m| m.borrow_mut().insert(collection, entry));
                Ok(())
            }
            Storage::LocalStorage => {
                let json = serde_json::to_string(&entry)?;
                // `setItem` is synchronous: the entry is stored when it returns (or it throws,
                // e.g. quota exceeded, and then the report is not sent).
                self.local()?
                    .set_item(&Self::key(collection), &json)
                    .map_err(storage_error)
            }
        }
    }
}

/// Runs the future `f` returns while this page holds the origin-wide Web Lock [`LOCK_NAME`]
/// (`navigator.locks.request`, W3C Web Locks API), so pages of one origin that share
/// `localStorage` submit one at a time: two tabs cannot both read "nothing spent" and both
/// randomize. The lock is held until the future completes (the lock callback returns its
/// promise), so a submission's ledger write, upload and settlement all happen before another
/// page reads the ledger: Chromium propagates a `localStorage` write to other pages
/// asynchronously, and a page that took the lock right after the write could still read
/// the entry before it (seen as two reports from two tabs, one "ledger lost the pending
/// report"); the upload's round trip leaves that write time to arrive. Where there is no Web
/// Locks API (node, whose ledger is in memory of one instance; very old browsers) the future
/// runs at once. Errors: the request's own JS error (e.g. a document that is not fully
/// active).
pub async fn with_origin_lock<T: 'static, F: Future<Output = T> + 'static>(
    f: impl FnOnce() -> F + 'static,
) -> Result<T, JsValue> {
    let locks = Reflect::get(&js_sys::global(), &"navigator".into())
        .ok()
        .filter(|n| n.is_object())
        .and_then(|n| Reflect::get(&n, &"locks".into()).ok())
        .filter(JsValue::is_object);
    let Some(locks) = locks else {
        return Ok(f().await);
    };
    let request: Function = Reflect::get(&locks, &"request".into())?.dyn_into()?;
    let out = Rc::new(RefCell::new(None));
    let slot = Rc::clone(&out);
    let callback = Closure::once(move |_lock: JsValue| -> Promise {
        let work = f();
        wasm_bindgen_futures::future_to_promise(async move {
            let value = work.await;
            *slot.borrow_mut() = Some(value);
            Ok(JsValue::UNDEFINED)
        })
    });
    let granted: Promise = request
        .call2(&locks, &LOCK_NAME.into(), callback.as_ref())?
        .dyn_into()?;
    JsFuture::from(granted).await?;
    drop(callback);
    let result = out.borrow_mut().take();
    result.ok_or_else(|| JsValue::from_str("the Web Lock callback did not run"))
}
