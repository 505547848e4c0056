//! Task tokens (`service::tokens`). Per input, nothing panics and:
//!
//! 1. the input as a token string: whatever `verify` accepts re-signs to that exact string;
//! 2. the input as a token *body*, MAC'd here with the fuzz key so that the body parser sees
//!    arbitrary authenticated bytes (unreachable by forging): never `BadSignature`, and an
//!    accepted body re-signs to the very same token (the encoding is canonical);
//! 3. claims built from the input (factor of 1..=64 indices; `sign` also takes an empty
//!    factor, which `verify` refuses, so none is drawn): the token fits `MAX_TOKEN_CHARS`,
//!    verifies to the same claims, and neither one changed character nor a truncation
//!    verifies.
#![no_main]

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use ldpsyn::Epsilon;
use ldpsyn::mechanism::MechanismKind;
use ldpsyn_service::tokens::{
    MAX_FACTOR_LEN, MAX_TOKEN_CHARS, MAX_TOKEN_CUTS, TaskClaims, TokenError, TokenKey,
};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use sha2::Sha256;

const KEY: [u8; 32] = [42; 32];

fn claims(u: &mut Unstructured) -> Result<TaskClaims> {
    let len = u.int_in_range(1..=MAX_FACTOR_LEN)?;
    let factor = (0..len)
        .map(|_| u.arbitrary::<u16>().map(usize::from))
        .collect::<Result<Vec<usize>>>()?;
    // Bin maps on some claims: up to MAX_TOKEN_CUTS cuts in all, none when all are empty
    // (version 1's canonical form).
    let mut bins: Vec<Vec<u32>> = Vec::new();
    if u.arbitrary::<bool>()? {
        let mut left = MAX_TOKEN_CUTS;
        for _ in 0..factor.len() {
            let n = u.int_in_range(0..=left.min(16))?;
            left -= n;
            bins.push(
                (0..n)
                    .map(|_| u.arbitrary::<u16>().map(u32::from))
                    .collect::<Result<_>>()?,
            );
        }
        if bins.iter().all(Vec::is_empty) {
            bins.clear();
        }
    }
    let kinds = [
        MechanismKind::Grr,
        MechanismKind::Oue,
        MechanismKind::GrrPair,
    ];
    Ok(TaskClaims {
        collection: uuid::Uuid::from_bytes(u.arbitrary()?),
        round: u.arbitrary()?,
        factor,
        mechanism: *u.choose(&kinds)?,
        epsilon: Epsilon::new(u.arbitrary()?).unwrap_or(Epsilon::new(1.0).unwrap()),
        expires_at: u.arbitrary()?,
        nonce: u.arbitrary()?,
        bins,
    })
}

fuzz_target!(|data: &[u8]| {
    let key = TokenKey::new(KEY.to_vec()).expect("32-byte key");

    // 1. Arbitrary string.
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(c) = key.verify(s) {
            assert_eq!(key.sign(&c), s);
        }
    }

    // 2. Arbitrary authenticated body.
    let mut mac = Hmac::<Sha256>::new_from_slice(&KEY).unwrap();
    mac.update(data);
    let mut raw = data.to_vec();
    raw.extend_from_slice(&mac.finalize().into_bytes());
    let token = URL_SAFE_NO_PAD.encode(&raw);
    match key.verify(&token) {
        Ok(c) => assert_eq!(key.sign(&c), token),
        Err(e) => assert_ne!(e, TokenError::BadSignature),
    }

    // 3. Real claims, then one change.
    let mut u = Unstructured::new(data);
    let Ok(claims) = claims(&mut u) else { return };
    let token = key.sign(&claims);
    assert!(token.len() <= MAX_TOKEN_CHARS);
    assert_eq!(key.verify(&token).expect("own token verifies"), claims);
    let (Ok(i), Ok(c), Ok(cut)) = (
        u.choose_index(token.len()),
        u.int_in_range(0x20u8..=0x7e),
        u.choose_index(token.len()),
    ) else {
        return;
    };
    let mut bytes = token.clone().into_bytes();
    if bytes[i] != c {
        bytes[i] = c;
        let s = String::from_utf8(bytes).expect("ASCII");
        assert!(key.verify(&s).is_err(), "changed at {i}: {s}");
    }
    assert!(key.verify(&token[..cut]).is_err(), "truncated to {cut}");
});
