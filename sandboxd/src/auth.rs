//! Who is calling: the root token, a tenant token, or a sandbox's own token. Every token is
//! compared in constant time. Route rules (which caller may do what, and whether a refusal
//! is 401, 403 or 404) live here as small functions the API handlers call.

use hyper::header::{HeaderMap, AUTHORIZATION};
use subtle::ConstantTimeEq;

use crate::claims::Claims;
use crate::config::Config;
use crate::error::{Error, Result};

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The node's `api_token`.
    Root,
    /// A configured tenant, by name.
    Tenant(String),
    /// The holder of one sandbox's token, by sandbox id.
    Sandbox(String),
}

/// The node's static tokens.
pub struct Auth {
    root: Option<Vec<u8>>,
    tenants: Vec<(String, Vec<u8>)>,
}

impl Auth {
    /// Takes the tokens from the config.
    pub fn new(config: &Config) -> Auth {
        Auth {
            root: config.api_token.as_ref().map(|t| t.as_bytes().to_vec()),
            tenants: config
                .tenants
                .iter()
                .map(|t| (t.name.clone(), t.token.as_bytes().to_vec()))
                .collect(),
        }
    }

    /// Identifies the bearer of `Authorization`. Missing or unknown → 401.
    pub fn identify(&self, headers: &HeaderMap, claims: &Claims) -> Result<Caller> {
        let token = bearer(headers).ok_or(Error::Unauthorized)?;
        let given = token.as_bytes();
        if let Some(root) = &self.root {
            if bool::from(root.as_slice().ct_eq(given)) {
                return Ok(Caller::Root);
            }
        }
        // Compare against every tenant without stopping early.
        let mut found = None;
        for (name, t) in &self.tenants {
            if bool::from(t.as_slice().ct_eq(given)) {
                found = Some(name.clone());
            }
        }
        if let Some(name) = found {
            return Ok(Caller::Tenant(name));
        }
        claims
            .id_for_token(token)
            .map(Caller::Sandbox)
            .ok_or(Error::Unauthorized)
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

/// Root-only routes: anyone else authenticated gets 403.
pub fn require_root(caller: &Caller) -> Result<()> {
    match caller {
        Caller::Root => Ok(()),
        _ => Err(Error::Forbidden),
    }
}

/// Claim and list: root or a tenant. Returns the tenant's name when it is one.
pub fn require_claimer(caller: &Caller) -> Result<Option<&str>> {
    match caller {
        Caller::Root => Ok(None),
        Caller::Tenant(name) => Ok(Some(name)),
        Caller::Sandbox(_) => Err(Error::Forbidden),
    }
}

/// Release, renew, relay, exec: the sandbox's own token or root. Another sandbox's token
/// gets 404 exactly like an unknown id, so tokens reveal nothing about other ids.
pub fn require_sandbox(caller: &Caller, id: &str) -> Result<()> {
    match caller {
        Caller::Root => Ok(()),
        Caller::Sandbox(own) if own == id => Ok(()),
        Caller::Sandbox(_) => Err(Error::NotFound),
        Caller::Tenant(_) => Err(Error::Forbidden),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert(AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }

    #[test]
    fn route_rules() {
        let sb = Caller::Sandbox("a".into());
        let tenant = Caller::Tenant("t".into());
        assert!(require_sandbox(&sb, "a").is_ok());
        assert!(matches!(require_sandbox(&sb, "b"), Err(Error::NotFound)));
        assert!(matches!(
            require_sandbox(&tenant, "a"),
            Err(Error::Forbidden)
        ));
        assert!(require_sandbox(&Caller::Root, "a").is_ok());
        assert!(matches!(require_root(&tenant), Err(Error::Forbidden)));
        assert_eq!(require_claimer(&tenant).unwrap(), Some("t"));
        assert!(matches!(require_claimer(&sb), Err(Error::Forbidden)));
    }
}
