//! API keys: `--api-keys-file` holds one key per line, `key` or `name:key`, with `#` comments. Each key
//! is an owner; a key sees only the jobs it created. Without a keys file every caller is `anonymous`.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

pub use super::api_keys::ApiKeys;
use super::error::Error;
use super::ApiContext;

/// The authenticated caller: whose jobs a request may see.
#[derive(Debug, Clone)]
pub struct Caller {
    pub owner: String,
}

pub const ANONYMOUS: &str = "anonymous";

impl FromRequestParts<ApiContext> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, ctx: &ApiContext) -> Result<Caller, Error> {
        let Some(keys) = &ctx.keys else {
            return Ok(Caller { owner: ANONYMOUS.to_string() });
        };
        let header = parts.headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let key = header.and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer "))).map(str::trim);
        match key.and_then(|k| keys.owner(k)) {
            Some(owner) => Ok(Caller { owner: owner.to_string() }),
            None => Err(Error::unauthorized()),
        }
    }
}
