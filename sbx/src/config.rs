//! Where the URL and token come from: flag or environment, else the config file
//! `${XDG_CONFIG_HOME:-$HOME/.config}/sbx/config.toml`, else the defaults.

use std::path::PathBuf;

/// `${XDG_CONFIG_HOME:-$HOME/.config}/sbx/config.toml`, as `cargo xtask up` writes it.
#[derive(Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    url: Option<String>,
    token: Option<String>,
}

/// The URL and token to use: the flag or environment variable (clap has merged the two;
/// empty counts as unset), else the config file's, else the default URL and no token. The
/// file is read only when something is missing; a file that is absent is not an error.
pub fn resolve(
    url: Option<String>,
    token: Option<String>,
) -> Result<(String, Option<String>), String> {
    let given = |v: Option<String>| v.filter(|s| !s.is_empty());
    let (url, token) = (given(url), given(token));
    let file = match (&url, &token, config_path()) {
        (Some(_), Some(_), _) | (_, _, None) => ConfigFile::default(),
        (_, _, Some(path)) => read_config(&path)?,
    };
    let url = url
        .or(given(file.url))
        .unwrap_or_else(|| sandbox_sdk::DEFAULT_URL.to_string());
    Ok((url, token.or(given(file.token))))
}

fn config_path() -> Option<PathBuf> {
    let dir = |var| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    dir("XDG_CONFIG_HOME")
        .or_else(|| dir("HOME").map(|home| home.join(".config")))
        .map(|config| config.join("sbx/config.toml"))
}

fn read_config(path: &std::path::Path) -> Result<ConfigFile, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => toml::from_str(&text).map_err(|e| {
            // toml's own rendering spans several lines; an sbx error is one.
            let line = e
                .span()
                .map_or(1, |at| text[..at.start].matches('\n').count() + 1);
            let message: Vec<&str> = e.message().lines().map(str::trim).collect();
            format!("{}: line {line}: {}", path.display(), message.join("; "))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ConfigFile::default()),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}
