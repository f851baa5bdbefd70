//! What the E2B surface keeps with a claim, durably (`e2b_sandboxes` in the state
//! database, deleted with the claim): the E2B template name, metadata, sandbox-wide env
//! vars and the start time; and the node's E2B secret, from which each sandbox's
//! `envdAccessToken` is derived.
//!
//! Why a derived token rather than the claim's own: E2B's `connect` hands the agent token
//! to any client holding the API key, long after the create, and the node keeps only a
//! digest of claim tokens. HMAC(secret, id) can be recomputed at any time, survives
//! restarts with the secret, and is compared in constant time.

use std::collections::{BTreeMap, HashMap};

use rusqlite::{params, OptionalExtension};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{Error, Result};
use crate::store::Store;

/// The `settings` row holding the secret (hex).
const SECRET_KEY: &str = "e2b_secret";

/// One sandbox's E2B facts.
#[derive(Debug, Clone, Default)]
pub struct E2bRecord {
    /// The template name the client asked for (an alias, or one of ours).
    pub template_id: String,
    /// Client metadata, filterable in the list.
    pub metadata: BTreeMap<String, String>,
    /// Env vars every command in the sandbox gets.
    pub env_vars: BTreeMap<String, String>,
    /// When it was created, ms since the Unix epoch.
    pub started_ms: u64,
}

/// Records `rec` for sandbox `id`.
pub fn put(store: &Store, id: &str, rec: &E2bRecord) -> Result<()> {
    let metadata = serde_json::to_string(&rec.metadata).expect("a string map serializes");
    let env = serde_json::to_string(&rec.env_vars).expect("a string map serializes");
    store
        .with(|c| {
            c.execute(
                "INSERT OR REPLACE INTO e2b_sandboxes (id, template_id, metadata, env_vars, started_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id, rec.template_id, metadata, env, rec.started_ms as i64],
            )
        })
        .map(drop)
}

/// Every recorded sandbox's facts, by id.
pub fn all(store: &Store) -> Result<HashMap<String, E2bRecord>> {
    select(store, None)
}

/// One sandbox's facts; `None` for a sandbox claimed through the native API.
pub fn get(store: &Store, id: &str) -> Result<Option<E2bRecord>> {
    Ok(select(store, Some(id))?.remove(id))
}

fn select(store: &Store, id: Option<&str>) -> Result<HashMap<String, E2bRecord>> {
    let rows = store.with(|c| {
        let mut stmt = c.prepare(
            "SELECT id, template_id, metadata, env_vars, started_ms FROM e2b_sandboxes
             WHERE ?1 IS NULL OR id = ?1",
        )?;
        let rows = stmt.query_map([id], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
    })?;
    Ok(rows
        .into_iter()
        .map(|(id, template_id, metadata, env, started)| {
            let rec = E2bRecord {
                template_id,
                // Written by `put` from string maps; a damaged row reads as empty rather
                // than hiding the sandbox.
                metadata: serde_json::from_str(&metadata).unwrap_or_default(),
                env_vars: serde_json::from_str(&env).unwrap_or_default(),
                started_ms: started.max(0) as u64,
            };
            (id, rec)
        })
        .collect())
}

/// The node's E2B secret: read from the database, or made and stored on first use.
pub fn secret(store: &Store) -> Result<[u8; 32]> {
    let have: Option<String> = store.with(|c| {
        c.query_row(
            "SELECT value FROM settings WHERE key = ?1",
            [SECRET_KEY],
            |r| r.get(0),
        )
        .optional()
    })?;
    if let Some(hexed) = have {
        let raw =
            hex::decode(hexed.trim()).map_err(|e| Error::Config(format!("{SECRET_KEY}: {e}")))?;
        return raw
            .try_into()
            .map_err(|_| Error::Config(format!("{SECRET_KEY} is not 32 bytes")));
    }
    let mut raw = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut raw);
    store.with(|c| {
        c.execute(
            "INSERT INTO settings (key, value) VALUES (?1, ?2)",
            params![SECRET_KEY, hex::encode(raw)],
        )
    })?;
    Ok(raw)
}

/// `envdAccessToken` of sandbox `id`: hex HMAC-SHA256(secret, id).
pub fn access_token(secret: &[u8; 32], id: &str) -> String {
    hex::encode(hmac_sha256(secret, id.as_bytes()))
}

/// Whether `given` is sandbox `id`'s access token (constant time).
pub fn token_matches(secret: &[u8; 32], id: &str, given: &str) -> bool {
    bool::from(access_token(secret, id).as_bytes().ct_eq(given.as_bytes()))
}

/// RFC 2104 over SHA-256 (a 32-byte key fits one block, so it is padded, never hashed).
fn hmac_sha256(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..32].copy_from_slice(key);
    let pad = |b: u8| block.map(|k| k ^ b);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_case_2_shape() {
        // RFC 4231 test case 1 uses a 20-byte key of 0x0b; padded to 32 bytes with zeros it
        // is the same HMAC key (keys shorter than a block are zero-padded).
        let mut key = [0u8; 32];
        key[..20].fill(0x0b);
        assert_eq!(
            hex::encode(hmac_sha256(&key, b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert!(token_matches(&key, "sb-1", &access_token(&key, "sb-1")));
        assert!(!token_matches(&key, "sb-2", &access_token(&key, "sb-1")));
        assert!(!token_matches(&key, "sb-1", ""));
    }

    #[test]
    fn records_and_the_secret_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let rec = E2bRecord {
            template_id: "base".into(),
            metadata: [("k".to_string(), "v".to_string())].into(),
            env_vars: [("A".to_string(), "1".to_string())].into(),
            started_ms: 7,
        };
        let s1 = {
            let store = Store::open(dir.path()).unwrap();
            put(&store, "sb-1", &rec).unwrap();
            secret(&store).unwrap()
        };
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(secret(&store).unwrap(), s1);
        let got = get(&store, "sb-1").unwrap().unwrap();
        assert_eq!(
            (got.metadata, got.env_vars, got.started_ms),
            (rec.metadata, rec.env_vars, 7)
        );
        store.delete_claim("sb-1").unwrap();
        assert!(get(&store, "sb-1").unwrap().is_none());
        assert!(all(&store).unwrap().is_empty());
    }
}
