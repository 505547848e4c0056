//! Uploads sized by bytes as well as by count: a batch of reports (or a party's records) is
//! cut into consecutive request bodies, each holding at most a given number of items and at
//! most a given number of bytes, so that a server's [`UploadLimits`] are never exceeded. An
//! OUE report over a large pair domain is tens of kilobytes, so a count limit alone does not
//! keep a body under the server's byte limit.
//!
//! ```
//! use ldpsyn::upload::{Envelope, Piece, split_json};
//! let items = ["aaaa", "bb", "cccccc", "d"];
//! // At most 12 bytes per body: ["aaaa","bb"] is 13, so each body holds what fits.
//! let pieces = split_json(&items, Envelope::ARRAY, 10, 12).unwrap();
//! let bodies: Vec<&[u8]> = pieces.iter().map(|p| match p {
//!     Piece::Body { body, .. } => &body[..],
//!     Piece::TooLarge { .. } => unreachable!(),
//! }).collect();
//! assert_eq!(bodies, [&br#"["aaaa"]"#[..], br#"["bb"]"#, br#"["cccccc"]"#, br#"["d"]"#]);
//! ```

use std::ops::Range;

use serde::Serialize;

use crate::wire::UploadLimits;

/// The bytes around the comma-separated items of a body: its compact JSON before the first
/// item and after the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    /// Bytes before the first item.
    pub prefix: &'static [u8],
    /// Bytes after the last item.
    pub suffix: &'static [u8],
}

impl Envelope {
    /// A JSON array, as `POST …/reports` takes: `[r1,r2,…]`.
    pub const ARRAY: Envelope = Envelope {
        prefix: b"[",
        suffix: b"]",
    };
    /// A party upload, `{"records":[…]}` (the compact JSON of
    /// [`crate::vertical::PartyUpload`]).
    pub const PARTY_RECORDS: Envelope = Envelope {
        prefix: br#"{"records":["#,
        suffix: b"]}",
    };
}

/// One piece of a split, in item order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// A request body holding the items `items` (a non-empty range of the input), in order.
    Body {
        /// The items this body holds.
        items: Range<usize>,
        /// The body: envelope prefix, the items' compact JSON separated by commas, suffix.
        body: Vec<u8>,
    },
    /// Item `index` alone, in its envelope, takes `bytes` bytes: more than the split allows.
    /// No body holds it; it can never be sent under these limits.
    TooLarge {
        /// The item's index in the input.
        index: usize,
        /// The size of the smallest body holding it, bytes.
        bytes: usize,
    },
}

/// Cuts `items` into consecutive bodies of at most `max_items` items (at least 1 is used) and
/// at most `max_bytes` bytes each, greedily: a body takes the next item while both limits
/// allow. Every item appears exactly once, in order, either in a [`Piece::Body`] or as a
/// [`Piece::TooLarge`] (when it does not fit `max_bytes` even alone); the bodies hold each
/// item's compact JSON exactly as `serde_json::to_vec` writes it, so a body of consecutive
/// items equals `serde_json::to_vec` of that slice in its envelope.
///
/// Errors: an item that does not serialize.
pub fn split_json<T: Serialize>(
    items: &[T],
    envelope: Envelope,
    max_items: usize,
    max_bytes: usize,
) -> Result<Vec<Piece>, serde_json::Error> {
    let max_items = max_items.max(1);
    let frame = envelope.prefix.len() + envelope.suffix.len();
    let mut pieces = Vec::new();
    let mut body: Vec<u8> = envelope.prefix.to_vec();
    let mut start = 0;
    let mut held = 0;
    let flush = |pieces: &mut Vec<Piece>, body: &mut Vec<u8>, start: usize, held: usize| {
        if held > 0 {
            let mut done = std::mem::replace(body, envelope.prefix.to_vec());
            done.extend_from_slice(envelope.suffix);
            pieces.push(Piece::Body {
                items: start..start + held,
                body: done,
            });
        }
    };
    for (i, item) in items.iter().enumerate() {
        let bytes = serde_json::to_vec(item)?;
        if frame + bytes.len() > max_bytes {
            flush(&mut pieces, &mut body, start, held);
            pieces.push(Piece::TooLarge {
                index: i,
                bytes: frame + bytes.len(),
            });
            (start, held) = (i + 1, 0);
            continue;
        }
        // The body with this item, closed: what is already held, a comma, the item, suffix.
        let with = body.len() + usize::from(held > 0) + bytes.len() + envelope.suffix.len();
        if held == max_items || with > max_bytes {
            flush(&mut pieces, &mut body, start, held);
            (start, held) = (i, 0);
        }
        if held > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&bytes);
        held += 1;
    }
    flush(&mut pieces, &mut body, start, held);
    Ok(pieces)
}

/// [`split_json`] of reports for `POST …/reports` under a server's `limits`: at most
/// [`UploadLimits::reports_per_upload`] reports and [`UploadLimits::body_budget`] bytes per
/// body.
pub fn split_reports<T: Serialize>(
    reports: &[T],
    limits: &UploadLimits,
) -> Result<Vec<Piece>, serde_json::Error> {
    split_json(
        reports,
        Envelope::ARRAY,
        limits.reports_per_upload(),
        limits.body_budget(),
    )
}

/// The upload limits a collection's public view (the JSON of `GET /v1/collections/{id}`)
/// publishes under `upload_limits`; [`UploadLimits::default`] when it has none (a server
/// from before they were published). Errors: an `upload_limits` that is not of that shape.
pub fn published_limits(view: &serde_json::Value) -> Result<UploadLimits, serde_json::Error> {
    match view.get("upload_limits") {
        None | Some(serde_json::Value::Null) => Ok(UploadLimits::default()),
        Some(v) => serde_json::from_value(v.clone()),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The items each piece holds, flattened, with the too-large ones marked.
    fn covered(pieces: &[Piece]) -> Vec<(usize, bool)> {
        pieces
            .iter()
            .flat_map(|p| match p {
                Piece::Body { items, .. } => items.clone().map(|i| (i, true)).collect::<Vec<_>>(),
                Piece::TooLarge { index, .. } => vec![(*index, false)],
            })
            .collect()
    }

    proptest! {
        /// Every body is within both limits and parses back to exactly its items, the items
        /// come out once each in order, an item is too large only when it cannot fit alone,
        /// and the split is greedy (a body ended because the next item would not fit).
        #[test]
        fn split_respects_limits_and_preserves_order(
            items in prop::collection::vec("[a-z\"\\\\é]{0,40}", 0..60),
            max_items in 1usize..8,
            max_bytes in 0usize..120,
            party in any::<bool>(),
        ) {
            let envelope = if party { Envelope::PARTY_RECORDS } else { Envelope::ARRAY };
            let pieces = split_json(&items, envelope, max_items, max_bytes).unwrap();
            let order = covered(&pieces);
            prop_assert_eq!(order.iter().map(|x| x.0).collect::<Vec<_>>(),
                            (0..items.len()).collect::<Vec<_>>());
            let frame = envelope.prefix.len() + envelope.suffix.len();
            let alone = |i: usize| frame + serde_json::to_vec(&items[i]).unwrap().len();
            for (k, p) in pieces.iter().enumerate() {
                match p {
                    Piece::Body { items: r, body } => {
                        prop_assert!(!r.is_empty() && r.len() <= max_items);
                        prop_assert!(body.len() <= max_bytes);
                        let expected = if party {
                            serde_json::to_vec(&serde_json::json!({"records": &items[r.clone()]}))
                        } else {
                            serde_json::to_vec(&items[r.clone()])
                        }.unwrap();
                        prop_assert_eq!(body, &expected);
                        // Greedy: the next item, when it went to the next body, did not fit.
                        if let Some(Piece::Body { items: next, .. }) = pieces.get(k + 1) {
                            let grown = body.len() + 1 + alone(next.start) - frame;
                            prop_assert!(r.len() == max_items || grown > max_bytes);
                        }
                    }
                    Piece::TooLarge { index, bytes } => {
                        prop_assert_eq!(*bytes, alone(*index));
                        prop_assert!(*bytes > max_bytes);
                    }
                }
            }
        }
    }

    /// The published limits are read from a view, and default when absent.
    #[test]
    fn limits_come_from_the_view_or_default() {
        let view = serde_json::json!({"id": "x", "upload_limits":
            {"max_body_bytes": 1000, "max_reports_per_upload": 7}});
        let l = published_limits(&view).unwrap();
        assert_eq!((l.max_body_bytes, l.reports_per_upload()), (1000, 7));
        assert_eq!(l.body_budget(), 1000 - 15);
        assert_eq!(
            published_limits(&serde_json::json!({"id": "x"})).unwrap(),
            UploadLimits::default()
        );
        assert!(published_limits(&serde_json::json!({"upload_limits": 3})).is_err());
    }
}
