//! The keys of `--api-keys-file` (see `auth`): one per line, `key` or `name:key`, with `#` comments.

use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// Key digests and their owner names. Keys are kept only as SHA-256 digests, so that a memory dump
/// does not show them, and a presented key is compared in constant time (see `owner`).
#[derive(Debug, Default)]
pub struct ApiKeys {
    owners: Vec<([u8; 32], String)>,
}

impl ApiKeys {
    pub fn load(path: &Path) -> anyhow::Result<ApiKeys> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read the API keys file {}: {e}", path.display()))?;
        let keys = ApiKeys::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        if keys.owners.is_empty() {
            anyhow::bail!("the API keys file {} holds no key", path.display());
        }
        Ok(keys)
    }

    pub fn parse(text: &str) -> Result<ApiKeys, String> {
        let mut owners: Vec<([u8; 32], String)> = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (name, key) = match line.split_once(':') {
                Some((name, key)) => (name.trim().to_string(), key.trim()),
                // An unnamed key is named by a short digest, stable across restarts.
                None => (format!("key-{}", &hex::encode(Sha256::digest(line.as_bytes()))[..12]), line),
            };
            if key.is_empty() || name.is_empty() || key.chars().any(char::is_whitespace) {
                return Err(format!("line {}: expected `key` or `name:key`", n + 1));
            }
            let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
            if owners.iter().any(|(d, _)| *d == digest) {
                return Err(format!("line {}: the same key appears twice", n + 1));
            }
            owners.push((digest, name));
        }
        Ok(ApiKeys { owners })
    }

    /// The owner of `key`, if it is one of the keys. Why constant time: a comparison that stops at the
    /// first differing byte, or a hash-table probe, answers faster or slower depending on how much of
    /// the presented key's digest matches a stored one; measured over many requests, that would say
    /// something about the stored digests. So the digest is compared with every stored digest, each
    /// comparison in constant time (`subtle`), without an early exit, and the match selected without a
    /// branch: the time depends only on the number of keys.
    pub fn owner(&self, key: &str) -> Option<&str> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let mut found = subtle::Choice::from(0u8);
        let mut index = 0u64;
        for (i, (stored, _)) in self.owners.iter().enumerate() {
            let eq = stored.ct_eq(&digest);
            index = u64::conditional_select(&index, &(i as u64), eq);
            found |= eq;
        }
        bool::from(found).then(|| self.owners[index as usize].1.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_named_and_unnamed_keys() {
        let k = ApiKeys::parse("# team keys\nalice:s3cret\n\n  b0bkey  # bob\n").unwrap();
        assert_eq!(k.owner("s3cret"), Some("alice"));
        assert!(k.owner("b0bkey").unwrap().starts_with("key-"));
        assert_eq!(k.owner("nope"), None);
        assert_eq!(k.owner("alice:s3cret"), None);
    }

    #[test]
    fn refuses_bad_lines() {
        assert!(ApiKeys::parse("alice:").is_err());
        assert!(ApiKeys::parse("a:k\nb:k").is_err());
        assert!(ApiKeys::parse("two words").is_err());
    }
}
