//! The file verbs spoken to a real silkd over a [`Client`]: whole-file writes and reads,
//! tar streams, and hand-built hostile archives for the refusal tests.

use wire::files::{FileEntry, FileRead, FileWrite, PathArg, TarIn, DATA_CHUNK};
use wire::{ErrorKind, Request, Response};

use crate::silkd::Client;

/// How a file verb ended: its final answer, or the error silkd sent.
pub type Answer<T> = Result<T, (ErrorKind, String)>;

/// Random bytes from a seeded generator (reproducible across runs).
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// A replacing write with parents.
pub fn write_req(path: &str) -> FileWrite {
    FileWrite {
        path: path.into(),
        mode: None,
        append: false,
        parents: true,
        user: None,
    }
}

impl Client {
    /// Sends `data` to a `FileWrite` in chunks, then `data_end`; the final answer.
    pub async fn write_file(&mut self, req: FileWrite, data: &[u8]) -> Answer<FileEntry> {
        self.send(Request::FileWrite(req)).await;
        self.send_data(data).await;
        match self.recv().await {
            Response::Stat(e) => Ok(e),
            Response::Error { kind, message } => Err((kind, message)),
            other => panic!("unexpected {other:?} after a write"),
        }
    }

    /// Sends `data` as `data` frames and `data_end`.
    pub async fn send_data(&mut self, data: &[u8]) {
        for chunk in data.chunks(DATA_CHUNK) {
            self.send(Request::Data {
                data: chunk.to_vec(),
            })
            .await;
        }
        self.send(Request::DataEnd).await;
    }

    /// Reads `[offset, offset + length)` of a file: its `stat` and the bytes.
    pub async fn read_file(
        &mut self,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> Answer<(FileEntry, Vec<u8>)> {
        self.send(Request::FileRead(FileRead {
            path: path.into(),
            offset,
            length,
            user: None,
        }))
        .await;
        let stat = match self.recv().await {
            Response::Stat(e) => e,
            Response::Error { kind, message } => return Err((kind, message)),
            other => panic!("unexpected {other:?} opening a read"),
        };
        let bytes = self.collect_data().await?;
        Ok((stat, bytes))
    }

    /// `data` frames until `done`.
    pub async fn collect_data(&mut self) -> Answer<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            match self.recv().await {
                Response::Data { data } => out.extend_from_slice(&data),
                Response::Done => return Ok(out),
                Response::Error { kind, message } => return Err((kind, message)),
                other => panic!("unexpected {other:?} in a data stream"),
            }
        }
    }

    /// A directory as a tar archive.
    pub async fn tar_out(&mut self, path: &str) -> Answer<Vec<u8>> {
        self.send(Request::TarOut(PathArg {
            path: path.into(),
            user: None,
        }))
        .await;
        self.collect_data().await
    }

    /// Unpacks `archive` into `path`.
    pub async fn tar_in(&mut self, path: &str, archive: &[u8]) -> Answer<()> {
        self.send(Request::TarIn(TarIn {
            path: path.into(),
            user: None,
        }))
        .await;
        self.send_data(archive).await;
        self.done().await
    }

    /// Expects `done` (or an error).
    pub async fn done(&mut self) -> Answer<()> {
        match self.recv().await {
            Response::Done => Ok(()),
            Response::Error { kind, message } => Err((kind, message)),
            other => panic!("expected done, got {other:?}"),
        }
    }
}

/// A one-entry tar whose header names `name` verbatim (the `tar` crate's builders refuse
/// `..`, which is the point of a hostile archive), of type `kind`, linking to `link`.
pub fn raw_tar_entry(name: &str, kind: tar::EntryType, link: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_old();
    {
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(l) = link {
            old.linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
    }
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(body.len() as u64);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(body);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// One archive of several [`raw_tar_entry`] outputs, in order (each one's end-of-archive
/// blocks dropped, one kept at the end): e.g. a symlink, then a file written through it.
pub fn raw_tar(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        out.extend_from_slice(&e[..e.len() - 1024]);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}
