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

#[cfg(test)]
mod tests {
    use super::*;

    fn templates() -> BTreeMap<String, TemplateConfig> {
        let t: TemplateConfig = toml::from_str("rootfs = \"/srv/rootfs\"").unwrap();
        [("default".to_string(), t)].into()
    }

    #[test]
    fn aliases_and_listen_are_checked() {
        let ok: E2bConfig = toml::from_str(
            "listen = \"127.0.0.1:3000\"\ntemplate_aliases = { base = \"default\" }",
        )
        .unwrap();
        ok.validate(&templates()).unwrap();
        assert_eq!(
            (ok.template("base"), ok.template("default")),
            ("default", "default")
        );
        let dangling: E2bConfig =
            toml::from_str("listen = \"127.0.0.1:3000\"\ntemplate_aliases = { base = \"nope\" }")
                .unwrap();
        assert!(dangling.validate(&templates()).is_err());
        let unix: E2bConfig = toml::from_str("listen = \"unix:/run/x.sock\"").unwrap();
        assert!(unix.validate(&templates()).is_err());
        assert!(toml::from_str::<E2bConfig>("listen = \"127.0.0.1:1\"\nextra = 1").is_err());
    }
}
