//! Bodies of the file routes (`/v1/sandboxes/{id}/files`, `/fs`, `/archive`).

use serde::{Deserialize, Serialize};

/// One path's metadata: `GET /fs` of a file, each row of a directory's listing, the
/// answer to a write, and the `data` of a watch's events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// The last component (`stat`), or the path relative to the listed directory.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, Unix seconds.
    pub mtime: i64,
    /// Where a symlink points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// `GET /fs` of a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    /// The entries, a directory's own first, then each subdirectory's.
    pub entries: Vec<FileEntry>,
}

/// `POST /fs/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    /// The directory.
    pub path: String,
    /// Create missing parents (and succeed when it exists); default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parents: Option<bool>,
    /// Permission bits; 0755 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Who acts; the template's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// `POST /fs/rename`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    /// The current path.
    pub from: String,
    /// The new path.
    pub to: String,
    /// Who acts; the template's user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// One Server-Sent Event of `GET /fs/watch` (its `data:` line).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEvent {
    /// `create`, `modify`, `delete` or `rename`.
    pub kind: String,
    /// The path (absolute in the sandbox).
    pub path: String,
    /// A rename's old path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}
