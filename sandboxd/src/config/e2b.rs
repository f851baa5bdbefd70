//! The `[e2b]` section: where the E2B-compatible listener binds and which E2B template
//! names map to this node's templates. Checked by [`E2bConfig::validate`]; the listener
//! itself lives in `crate::e2b`.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use super::TemplateConfig;
use crate::error::{Error, Result};

/// `[e2b]`: the E2B-compatible surface, off when the section is absent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct E2bConfig {
    /// `host:port` (TCP only: the SDK speaks plain HTTP URLs).
    pub listen: String,
    /// E2B template names → this node's template names (`base = "default"`). A name not
    /// listed is looked up as one of ours.
    #[serde(default)]
    pub template_aliases: BTreeMap<String, String>,
}

impl E2bConfig {
    /// The TCP address to bind.
    pub fn listen_addr(&self) -> Result<SocketAddr> {
        self.listen
            .parse()
            .map_err(|e| Error::Config(format!("[e2b] listen {:?}: {e}", self.listen)))
    }

    /// Every alias must name a configured template.
    pub fn validate(&self, templates: &BTreeMap<String, TemplateConfig>) -> Result<()> {
        self.listen_addr()?;
        for (alias, ours) in &self.template_aliases {
            if !templates.contains_key(ours) {
                return Err(Error::Config(format!(
                    "[e2b] template_aliases: {alias:?} names {ours:?}, which is not a [templates] entry"
                )));
            }
        }
        Ok(())
    }

    /// Our template for an E2B template name.
    pub fn template<'a>(&'a self, e2b_name: &'a str) -> &'a str {
        self.template_aliases
            .get(e2b_name)
            .map(String::as_str)
            .unwrap_or(e2b_name)
    }
}
