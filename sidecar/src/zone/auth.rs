//! A zone's key and the proofs that stand in for `SO_PEERCRED` over TCP (`tcp`,
//! `upstream::zone_tcp`). Each zone has its own key: at least [`KEY_LEN`] random bytes, kept in
//! a file as hex digits (`openssl rand -hex 32`; surrounding whitespace is ignored). The key
//! never crosses the wire: each end proves it holds it by an HMAC-SHA256 over the other end's
//! fresh nonce, the label of its role and the zone's server name.

use std::{fmt, path::Path, sync::Arc};

use aws_lc_rs::hmac;

/// The shortest key accepted, in bytes.
pub const KEY_LEN: usize = 32;
/// Bytes of a nonce; also of a proof (an HMAC-SHA256).
pub const NONCE_LEN: usize = 32;
/// What the proxy's proof covers after the zone's nonce.
pub const PROXY_LABEL: &[u8] = b"orchestrator-zone/v1";
/// What the zone's proof covers after the proxy's nonce (another label, so neither end can
/// have the other answer its own challenge).
pub const ZONE_LABEL: &[u8] = b"orchestrator-zone/v1 zone";

/// A zone's key. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct ZoneKey(Arc<hmac::Key>);

impl fmt::Debug for ZoneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ZoneKey(..)")
    }
}

/// Why a key is refused (the key's bytes are never part of it).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error(
        "the key is {0} bytes; a zone key is at least {KEY_LEN} random bytes, written as \
         {digits} hex digits (e.g. `openssl rand -hex {KEY_LEN}`)", digits = KEY_LEN * 2
    )]
    TooShort(usize),
    #[error(
        "the key is not hex digits (character {0} is not 0-9, a-f or A-F); write it with \
         `openssl rand -hex {KEY_LEN}`"
    )]
    NotHex(usize),
    #[error("the key has an odd number of hex digits ({0})")]
    OddLength(usize),
}

impl ZoneKey {
    /// A key from its raw bytes (at least [`KEY_LEN`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        if bytes.len() < KEY_LEN {
            return Err(KeyError::TooShort(bytes.len()));
        }
        Ok(Self(Arc::new(hmac::Key::new(hmac::HMAC_SHA256, bytes))))
    }

    /// A key from the contents of a key file: hex digits, whitespace around them ignored.
    pub fn from_hex(text: &[u8]) -> Result<Self, KeyError> {
        let text = text.trim_ascii();
        if let Some(at) = text.iter().position(|b| !b.is_ascii_hexdigit()) {
            return Err(KeyError::NotHex(at + 1));
        }
        if text.len() % 2 == 1 {
            return Err(KeyError::OddLength(text.len()));
        }
        let bytes = decode_hex(text).ok_or(KeyError::NotHex(1))?;
        Self::from_bytes(&bytes)
    }

    /// Reads a key file; the error names `flag` and the file.
    pub fn from_file(flag: &str, path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("{flag} {}: cannot read it: {e}", path.display()))?;
        Self::from_hex(&text).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))
    }

    /// The proof of holding this key for `nonce`, under `label`, for the zone of `server`.
    pub fn proof(&self, nonce: &[u8], label: &[u8], server: &str) -> [u8; NONCE_LEN] {
        let mut context = hmac::Context::with_key(&self.0);
        context.update(nonce);
        context.update(label);
        context.update(server.as_bytes());
        let mut proof = [0u8; NONCE_LEN];
        proof.copy_from_slice(context.sign().as_ref());
        proof
    }

    /// Whether `proof` is [`ZoneKey::proof`] of the same inputs (compared in constant time).
    pub fn verify(&self, nonce: &[u8], label: &[u8], server: &str, proof: &[u8]) -> bool {
        let mut message = Vec::with_capacity(nonce.len() + label.len() + server.len());
        message.extend_from_slice(nonce);
        message.extend_from_slice(label);
        message.extend_from_slice(server.as_bytes());
        hmac::verify(&self.0, &message, proof).is_ok()
    }
}

/// A fresh nonce from the system's random source.
pub fn nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut nonce = [0u8; NONCE_LEN];
    aws_lc_rs::rand::fill(&mut nonce)
        .map_err(|_| std::io::Error::other("the system's random source failed"))?;
    Ok(nonce)
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        text.push(char::from(DIGITS[usize::from(b >> 4)]));
        text.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    text
}

/// The bytes of `text`, hex digits of either case; `None` if it is not.
pub fn decode_hex(text: &[u8]) -> Option<Vec<u8>> {
    if text.len() % 2 == 1 {
        return None;
    }
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    text.chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn keys_are_hex_of_at_least_32_bytes_and_errors_say_the_fix_without_the_key() {
        assert!(ZoneKey::from_hex(format!("  {KEY}\n").as_bytes()).is_ok());
        assert!(ZoneKey::from_hex(KEY.to_uppercase().as_bytes()).is_ok());
        let short = ZoneKey::from_hex(b"00010203").expect_err("too short");
        assert_eq!(short, KeyError::TooShort(4));
        assert_eq!(
            short.to_string(),
            "the key is 4 bytes; a zone key is at least 32 random bytes, written as 64 hex digits \
             (e.g. `openssl rand -hex 32`)"
        );
        let raw = ZoneKey::from_hex(&[0xffu8; 32]).expect_err("raw bytes are not hex");
        assert_eq!(raw, KeyError::NotHex(1));
        assert_eq!(
            ZoneKey::from_hex(&KEY.as_bytes()[1..]).expect_err("odd"),
            KeyError::OddLength(63)
        );
        assert_eq!(
            format!("{:?}", ZoneKey::from_hex(KEY.as_bytes())),
            "Ok(ZoneKey(..))"
        );

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key");
        std::fs::write(&path, "abcd\n").expect("written");
        let error = ZoneKey::from_file("--key-file", &path).expect_err("short");
        assert_eq!(
            error.to_string(),
            format!(
                "--key-file {}: the key is 2 bytes; a zone key is at least 32 random bytes, \
                 written as 64 hex digits (e.g. `openssl rand -hex 32`)",
                path.display()
            )
        );
        let missing = ZoneKey::from_file("--key-file", &dir.path().join("nope")).expect_err("x");
        assert!(missing.to_string().contains("cannot read it"), "{missing}");
    }

    #[test]
    fn a_proof_holds_for_its_nonce_label_server_and_key_only() {
        let key = ZoneKey::from_hex(KEY.as_bytes()).expect("key");
        let other = ZoneKey::from_bytes(&[7u8; 32]).expect("key");
        let nonce = nonce().expect("random");
        assert_ne!(
            nonce,
            super::nonce().expect("random"),
            "every nonce is fresh"
        );
        let proof = key.proof(&nonce, PROXY_LABEL, "git");
        assert!(key.verify(&nonce, PROXY_LABEL, "git", &proof));
        assert!(
            !other.verify(&nonce, PROXY_LABEL, "git", &proof),
            "another key"
        );
        assert!(
            !key.verify(&nonce, PROXY_LABEL, "memory", &proof),
            "another server"
        );
        assert!(
            !key.verify(&nonce, ZONE_LABEL, "git", &proof),
            "the other role"
        );
        let fresh = super::nonce().expect("random");
        assert!(!key.verify(&fresh, PROXY_LABEL, "git", &proof), "a replay");
        assert!(
            !key.verify(&nonce, PROXY_LABEL, "git", &proof[..31]),
            "a prefix"
        );
        assert_eq!(
            decode_hex(hex(&proof).as_bytes()).as_deref(),
            Some(&proof[..])
        );
        assert_eq!(decode_hex(b"0g"), None);
    }
}
