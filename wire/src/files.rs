//! The file messages (v1 additions): each file request runs on a stream of its own, its
//! bytes travel as `data` frames of at most [`DATA_CHUNK`] bytes, and a write ends with
//! an explicit `data_end` (a stream that closes before it is an interrupted write).
//!
//! Requests are [`crate::Request`] variants wrapping the structs here, so each keeps its
//! fields by name next to the `type` tag; the same holds for the responses.

use serde::{Deserialize, Serialize};

/// Largest payload silkd and sandboxd put in one `data` frame: well under the frame cap,
/// and large enough that framing costs nothing measurable.
pub const DATA_CHUNK: usize = 256 * 1024;
/// Longest path accepted anywhere (`PATH_MAX`, its NUL included).
pub const MAX_PATH: usize = 4096;
/// Deepest `list` recursion accepted.
pub const MAX_LIST_DEPTH: u32 = 64;
/// Most entries in one `entries` frame (each entry is about a dozen MessagePack values,
/// far under the shape check's cap).
pub const ENTRIES_PER_FRAME: usize = 512;

/// Read a file. Answered by `stat` (the file's, after following links), `data` frames
/// covering `[offset, offset + length)` clamped to the file's end, then `done`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRead {
    /// Absolute, or relative to the template's workdir.
    pub path: String,
    /// First byte to send.
    #[serde(default)]
    pub offset: u64,
    /// Most bytes to send; to the end when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
    /// Who reads (a name or uid); the template's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Write a file from the `data` frames that follow, ended by `data_end`. Answered by
/// `stat` of the written file once it is fsynced and (when replacing) renamed into place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileWrite {
    /// Absolute, or relative to the template's workdir.
    pub path: String,
    /// Permission bits (e.g. `0o644`); a replaced file keeps its own, a new one gets 0644.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Append to the file instead of replacing it (no temp file: an interrupted append
    /// leaves what was appended so far).
    #[serde(default)]
    pub append: bool,
    /// Create missing parent directories.
    #[serde(default)]
    pub parents: bool,
    /// Who writes; the template's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// A request naming one path: `stat`, `tar_out`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathArg {
    /// Absolute, or relative to the template's workdir.
    pub path: String,
    /// Who asks; the template's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// List a directory. Answered by `entries` frames (names relative to `path`), then `done`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct List {
    /// The directory.
    pub path: String,
    /// Levels to descend: 1 lists the directory itself, at most [`MAX_LIST_DEPTH`].
    pub depth: u32,
    /// Who lists; the template's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Create a directory. Answered by `done`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mkdir {
    /// The directory.
    pub path: String,
    /// Create missing parents, and succeed when it exists already (`mkdir -p`).
    #[serde(default)]
    pub parents: bool,
    /// Permission bits; 0755 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Who creates it; the template's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Remove a file, a link or a directory. Answered by `done`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Remove {
    /// What to remove (a link itself, never what it points to).
    pub path: String,
    /// Remove a directory with its contents.
    #[serde(default)]
    pub recursive: bool,
    /// Who removes it; the template's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Rename (move) within the sandbox. Answered by `done`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rename {
    /// The current path.
    pub from: String,
    /// The new path (replaced when it is a file).
    pub to: String,
    /// Who renames; the template's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Unpack the tar archive carried by the `data` frames that follow (ended by `data_end`)
/// into a directory. Answered by `done`. Entries with `..`, absolute paths, links
/// leaving the directory or device files are refused (`bad_request`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TarIn {
    /// The directory; created (with parents) when missing.
    pub path: String,
    /// Who unpacks; the template's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Watch a directory. Answered by `stat` of the directory once the watch is set, then an
/// `event` per change until the stream closes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Watch {
    /// The directory.
    pub path: String,
    /// Watch subdirectories too (those there at the start and those created later).
    #[serde(default)]
    pub recursive: bool,
    /// Who watches; the template's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// What kind of object a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (not followed).
    Symlink,
    /// Anything else (fifo, socket, device).
    Other,
}

/// One file's metadata: the answer to `stat`, and each row of `entries`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// The last path component for `stat`; the path relative to the listed directory
    /// for `entries`.
    pub name: String,
    /// What it is.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: i64,
    /// Where a symlink points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// What changed under a watched directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsEventKind {
    /// Created (or moved in from outside the watch).
    Create,
    /// Written to (reported when the writer closes it, or on each write burst).
    Modify,
    /// Deleted (or moved out of the watch).
    Delete,
    /// Renamed within the watch: `from` holds the old path.
    Rename,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsEvent {
    /// What happened.
    pub kind: FsEventKind,
    /// The path it happened to (absolute, as resolved in the guest).
    pub path: String,
    /// The old path of a rename.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// How many levels below an archive's root the entry `name` sits: the number of its
/// normal components; `None` for an absolute path or one holding `..`. Shared by
/// silkd and the SDK, which both unpack archives the other side built (untrusted).
pub fn inside_depth(name: &std::path::Path) -> Option<usize> {
    use std::path::Component;
    let mut n = 0;
    for c in name.components() {
        match c {
            Component::Normal(_) => n += 1,
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(n)
}
