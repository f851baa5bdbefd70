//! `unix:/path` listener: replaces a stale socket file left by an earlier run.

use std::path::Path;

use tokio::net::UnixListener;

use crate::{Error, Result};

pub(super) fn bind(path: &Path) -> Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::io(
                format!("removing stale socket {}", path.display()),
                e,
            ))
        }
    }
    UnixListener::bind(path).map_err(|e| Error::io(format!("binding {}", path.display()), e))
}
