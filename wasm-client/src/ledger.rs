//! The device budget ledger of the browser: entries in `localStorage` (one key per
//! collection), or in memory for the life of the WASM instance (node, or a page that asks for
//! `storage: "memory"`; [`choose_storage`] decides, and fails closed in a browser).
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
    /// Memory of this WASM instance (node, or when asked for). Forgotten on reload: see
    /// [`StorageChoice::Memory`].
    Memory,
}

/// The app's `options.storage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageChoice {
    /// `"auto"` (the default): `localStorage`; in memory only outside a browser (node).
    Auto,
    /// `"localStorage"`: `localStorage` or nothing.
    LocalStorage,
    /// `"memory"`: memory of this WASM instance, also in a browser. The cost: the ledger is
    /// forgotten on every reload, so a page that is reloaded and submits the same record again
    /// randomizes it again for the same collection, and the server can average the noises of
    /// those reports away (k reports at ε compose to k·ε). Only for apps that make sure a
    /// person submits once per collection by other means.
    Memory,
}

impl StorageChoice {
    /// Parses `options.storage` (`None` is `"auto"`). Errors: an unknown name, as text.
    pub fn parse(name: Option<&str>) -> Result<Self, String> {
        match name {
            None | Some("auto") => Ok(Self::Auto),
            Some("localStorage") => Ok(Self::LocalStorage),
            Some("memory") => Ok(Self::Memory),
            Some(other) => Err(format!("unknown `{other}`")),
        }
    }
}

/// What the JS environment offers a ledger, probed when a client connects ([`Environment::probe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Environment {
    /// A browser page or worker (`window`, `document` or `WorkerGlobalScope` is defined), where
    /// a reload starts a new WASM instance; false under node.
    pub browser: bool,
    /// `localStorage` exists and takes a write (it throws when blocked, e.g. by a privacy setting).
    pub local_storage: bool,
    /// `navigator.locks` (Web Locks API; only in secure contexts: https and localhost).
    pub web_locks: bool,
}

impl Environment {
    /// Probes the running environment (writes and removes one `localStorage` key).
    pub fn probe() -> Self {
        let global = js_sys::global();
        let defined = |name: &str| {
            Reflect::get(&global, &name.into()).is_ok_and(|v| !v.is_undefined() && !v.is_null())
        };
        Environment {
            browser: defined("window") || defined("document") || defined("WorkerGlobalScope"),
            local_storage: local_storage_available(),
            web_locks: web_locks().is_some(),
        }
    }
}

/// Why no ledger can be opened; the client refuses to connect (`LdpError` code
/// `ledger-unavailable`) rather than spend ε without a ledger that outlives the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerUnavailable {
    /// A browser without a usable `localStorage` and the app did not ask for `"memory"`.
    NoLocalStorageInBrowser,
    /// `storage: "localStorage"` asked for, and there is none that takes a write.
    NoLocalStorage,
    /// A `localStorage` ledger needs the Web Locks API (`navigator.locks`) so that pages of the
    /// origin take turns; without it (e.g. a page served over plain http) two tabs could both
    /// randomize for a collection.
    NoWebLocks,
}

impl std::fmt::Display for LedgerUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NoLocalStorageInBrowser => {
                "localStorage is blocked or missing in this browser; the budget ledger would not \
                 survive a reload (pass storage: \"memory\" to accept that)"
            }
            Self::NoLocalStorage => "localStorage is not available here",
            Self::NoWebLocks => {
                "the Web Locks API (navigator.locks) is missing (it needs a secure context: \
                 https or localhost); without it pages of this origin could both randomize"
            }
        })
    }
}

impl std::error::Error for LedgerUnavailable {}

/// Where the ledger of a client with `choice` lives in `env`, failing closed: in a browser
/// `"auto"` is `localStorage` or an error, never memory; a `localStorage` ledger needs Web
/// Locks. `"memory"` is honoured everywhere (its cost: [`StorageChoice::Memory`]); it needs no
/// lock, as no other page sees this instance's memory.
/// Errors: [`LedgerUnavailable`].
pub fn choose_storage(
    choice: StorageChoice,
    env: Environment,
) -> Result<Storage, LedgerUnavailable> {
    let storage = match choice {
        StorageChoice::Memory => return Ok(Storage::Memory),
        StorageChoice::Auto if env.local_storage => Storage::LocalStorage,
        StorageChoice::Auto if env.browser => {
            return Err(LedgerUnavailable::NoLocalStorageInBrowser);
        }
        StorageChoice::Auto => return Ok(Storage::Memory),
        StorageChoice::LocalStorage if env.local_storage => Storage::LocalStorage,
        StorageChoice::LocalStorage => return Err(LedgerUnavailable::NoLocalStorage),
    };
    if lock_required(storage) && !env.web_locks {
        return Err(LedgerUnavailable::NoWebLocks);
    }
    Ok(storage)
}

/// Whether submissions over a ledger in `storage` must hold the origin's Web Lock: yes for
/// `localStorage`, which every page of the origin shares.
pub fn lock_required(storage: Storage) -> bool {
    storage == Storage::LocalStorage
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

/// Key written and removed by [`local_storage_available`].
const PROBE_KEY: &str = "ldpsyn.ledger.v1.probe";

/// Whether this environment has a `localStorage` that takes a write (some browsers expose one
/// that throws on `setItem`, e.g. with a zero quota).
pub fn local_storage_available() -> bool {
    let Ok(Some(local)) = local_storage() else {
        return false;
    };
    local.set_item(PROBE_KEY, "1").is_ok() && local.remove_item(PROBE_KEY).is_ok()
}

/// `navigator.locks`, when the environment has the Web Locks API.
fn web_locks() -> Option<JsValue> {
    Reflect::get(&js_sys::global(), &"navigator".into())
        .ok()
        .filter(|n| n.is_object())
        .and_then(|n| Reflect::get(&n, &"locks".into()).ok())
        .filter(JsValue::is_object)
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
/// report"); the upload's round trip leaves that write time to arrive. Without the Web Locks
/// API the future runs at once only when `required` is false (a memory ledger, which no other
/// page sees: [`lock_required`]).
/// Errors: `required` and no Web Locks API (an `LdpError` `ledger-unavailable`; `f` is not
/// called), or the request's own JS error (e.g. a document that is not fully active).
pub async fn with_origin_lock<T: 'static, F: Future<Output = T> + 'static>(
    required: bool,
    f: impl FnOnce() -> F + 'static,
) -> Result<T, JsValue> {
    let Some(locks) = web_locks() else {
        if required {
            let detail = LedgerUnavailable::NoWebLocks.to_string();
            return Err(crate::usage_error(
                ldpsyn::wire::ProblemType::LedgerUnavailable,
                detail,
            ));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(browser: bool, local_storage: bool, web_locks: bool) -> Environment {
        Environment {
            browser,
            local_storage,
            web_locks,
        }
    }

    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    fn auto_in_a_browser_without_local_storage_fails_closed() {
        for locks in [false, true] {
            assert_eq!(
                choose_storage(StorageChoice::Auto, env(true, false, locks)),
                Err(LedgerUnavailable::NoLocalStorageInBrowser)
            );
            // The app may accept the cost explicitly.
            assert_eq!(
                choose_storage(StorageChoice::Memory, env(true, false, locks)),
                Ok(Storage::Memory)
            );
        }
        // Node (no browser): memory, as before.
        assert_eq!(
            choose_storage(StorageChoice::Auto, env(false, false, false)),
            Ok(Storage::Memory)
        );
    }

    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    fn local_storage_without_web_locks_is_refused() {
        for browser in [false, true] {
            for choice in [StorageChoice::Auto, StorageChoice::LocalStorage] {
                assert_eq!(
                    choose_storage(choice, env(browser, true, false)),
                    Err(LedgerUnavailable::NoWebLocks)
                );
                assert_eq!(
                    choose_storage(choice, env(browser, true, true)),
                    Ok(Storage::LocalStorage)
                );
            }
            assert_eq!(
                choose_storage(StorageChoice::LocalStorage, env(browser, false, true)),
                Err(LedgerUnavailable::NoLocalStorage)
            );
        }
        assert!(lock_required(Storage::LocalStorage));
        assert!(!lock_required(Storage::Memory));
    }

    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    fn storage_option_names() {
        assert_eq!(StorageChoice::parse(None), Ok(StorageChoice::Auto));
        assert_eq!(StorageChoice::parse(Some("auto")), Ok(StorageChoice::Auto));
        assert_eq!(
            StorageChoice::parse(Some("memory")),
            Ok(StorageChoice::Memory)
        );
        assert_eq!(
            StorageChoice::parse(Some("localStorage")),
            Ok(StorageChoice::LocalStorage)
        );
        assert!(StorageChoice::parse(Some("sessionStorage")).is_err());
    }
}
