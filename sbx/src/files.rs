//! `sbx cp` and `sbx ls ID:PATH`: a sandbox's files from the terminal, through the SDK's
//! files API. A remote path is written `ID:PATH` (as scp does); a local path holding a
//! colon is written `./a:b`.

use std::path::{Path, PathBuf};

use sandbox_sdk::{Client, Error, FileEntry, FileKind};

/// One side of a copy.
#[derive(Debug, PartialEq, Eq)]
pub enum Place {
    /// A path on this machine.
    Local(PathBuf),
    /// A sandbox id and a path in it.
    Remote(String, String),
}

/// `ID:PATH` is remote when `ID` is non-empty and has no `/`; anything else is local.
pub fn place(arg: &str) -> Place {
    match arg.split_once(':') {
        Some((id, path)) if !id.is_empty() && !id.contains('/') && !path.is_empty() => {
            Place::Remote(id.to_string(), path.to_string())
        }
        _ => Place::Local(PathBuf::from(arg)),
    }
}

/// `sbx cp SRC DST`: one side local, the other `ID:PATH`; files and directories
/// (directories as a tar stream, modes and symlinks kept). DST is the path the copy
/// gets; an existing directory DST is merged into a directory, or receives a file under
/// its own name.
pub async fn cp_cmd(
    client: &Client,
    src: &str,
    dst: &str,
    user: Option<String>,
) -> Result<(), Error> {
    let files = |id: &str| {
        let f = client.sandbox(id.to_string()).files();
        match &user {
            Some(u) => f.as_user(u.clone()),
            None => f,
        }
    };
    match (place(src), place(dst)) {
        (Place::Local(from), Place::Remote(id, to)) => {
            let files = files(&id);
            let meta = std::fs::metadata(&from)
                .map_err(|e| Error::Local(format!("{}: {e}", from.display())))?;
            if meta.is_dir() {
                return files.upload_dir(&from, &to).await;
            }
            let to = match files.stat(&to).await {
                Ok(e) if e.kind == FileKind::Dir => join_remote(&to, &from)?,
                Ok(_) | Err(Error::NotFound { .. }) => to,
                Err(e) => return Err(e),
            };
            let file = tokio::fs::File::open(&from)
                .await
                .map_err(|e| Error::Local(format!("{}: {e}", from.display())))?;
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            files.write_from(&to, file, Some(mode)).await.map(drop)
        }
        (Place::Remote(id, from), Place::Local(to)) => {
            let files = files(&id);
            let entry = files.stat(&from).await?;
            if entry.kind == FileKind::Dir {
                return files.download_dir(&from, &to).await;
            }
            let to = if to.is_dir() {
                to.join(entry.name.rsplit('/').next().unwrap_or(&entry.name))
            } else {
                to
            };
            download_file(&files, &from, &to, entry.mode).await
        }
        (Place::Remote(..), Place::Remote(..)) => Err(Error::BadRequest(
            "both sides are in sandboxes; one must be local".into(),
        )),
        (Place::Local(..), Place::Local(..)) => Err(Error::BadRequest(
            "neither side is in a sandbox; write one as ID:PATH".into(),
        )),
    }
}

/// A remote file into a temp file beside `to`, renamed into place once whole, so `to`
/// never holds half a file.
async fn download_file(
    files: &sandbox_sdk::Files,
    from: &str,
    to: &Path,
    mode: u32,
) -> Result<(), Error> {
    let local = |e: std::io::Error| Error::Local(format!("{}: {e}", to.display()));
    let name = to
        .file_name()
        .ok_or_else(|| Error::Local(format!("{} names no file", to.display())))?;
    let tmp = to.with_file_name(format!(
        ".{}.sbx-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let mut out = tokio::fs::File::create(&tmp).await.map_err(local)?;
    let copied = files.read_to(from, &mut out).await;
    let synced = out.sync_all().await.map_err(local);
    let done = copied.map(drop).and(synced).and_then(|()| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode & 0o777))
            .and_then(|()| std::fs::rename(&tmp, to))
            .map_err(local)
    });
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// `dir/` + the local file's name.
fn join_remote(dir: &str, file: &Path) -> Result<String, Error> {
    let name = file
        .file_name()
        .ok_or_else(|| Error::Local(format!("{} names no file", file.display())))?;
    Ok(format!(
        "{}/{}",
        dir.trim_end_matches('/'),
        name.to_string_lossy()
    ))
}

/// `sbx ls ID:PATH`: a directory's entries (or one file's), a line each: type, mode,
/// size, mtime, name (`-> target` for a link); `--json` prints them as a JSON array.
pub async fn ls_files_cmd(client: &Client, target: &str, json: bool) -> Result<(), Error> {
    let Place::Remote(id, path) = place(target) else {
        return Err(Error::BadRequest(format!(
            "{target:?} is not ID:PATH (plain `sbx ls` lists sandboxes)"
        )));
    };
    let files = client.sandbox(id).files();
    let entry = files.stat(&path).await?;
    let entries = if entry.kind == FileKind::Dir {
        files.list(&path).await?
    } else {
        vec![entry]
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&entries).expect("serializes")
        );
    } else {
        for e in &entries {
            println!("{}", line(e));
        }
    }
    Ok(())
}

/// One entry as `sbx ls ID:PATH` and the MCP `list_directory` tool print it.
pub fn line(e: &FileEntry) -> String {
    let kind = match e.kind {
        FileKind::File => '-',
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::Other => '?',
    };
    let target = e
        .target
        .as_ref()
        .map(|t| format!(" -> {t}"))
        .unwrap_or_default();
    format!(
        "{kind} {:04o} {:>12} {:>10} {}{target}",
        e.mode, e.size, e.mtime, e.name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_remote_only_as_id_colon_path() {
        assert_eq!(
            place("sb-1:/home/user/x"),
            Place::Remote("sb-1".into(), "/home/user/x".into())
        );
        assert_eq!(
            place("sb-1:rel"),
            Place::Remote("sb-1".into(), "rel".into())
        );
        assert_eq!(place("./a:b"), Place::Local("./a:b".into()));
        assert_eq!(place("/abs/a:b"), Place::Local("/abs/a:b".into()));
        assert_eq!(place(":x"), Place::Local(":x".into()));
        assert_eq!(place("sb-1:"), Place::Local("sb-1:".into()));
        assert_eq!(place("plain"), Place::Local("plain".into()));
    }
}
