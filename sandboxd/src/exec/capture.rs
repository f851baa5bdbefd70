//! One exec's captured output: counted against the node-wide memory [`Budget`] on what it
//! holds (allocations and their bookkeeping, not only payload bytes: a guest sending a
//! million one-byte frames must not hold 40 MiB while charged 1 MiB), spilled to an
//! unlinked temp file once the budget says no, and checked for UTF-8 validity as it
//! arrives. Knows nothing of HTTP or of the guest.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Output chunks smaller than this are gathered into shared buffers of this size, so many
/// tiny frames cost one allocation per buffer instead of one per frame.
pub const GATHER: usize = 4096;
/// What one held chunk costs beyond its capacity: its queue slot and the allocator's
/// header, rounded up.
pub const CHUNK_OVERHEAD: u64 = 64;

/// What holding `chunk` costs the budget. Fixed once it is queued: chunks only grow
/// within their capacity.
fn cost(chunk: &[u8], capacity: usize) -> u64 {
    debug_assert!(chunk.len() <= capacity);
    capacity as u64 + CHUNK_OVERHEAD
}

/// Node-wide bytes of buffered output allowed in memory.
pub struct Budget {
    limit: u64,
    used: AtomicU64,
    metrics: Arc<Metrics>,
}

impl Budget {
    /// A budget of `limit` bytes, reported in `metrics`.
    pub fn new(limit: u64, metrics: Arc<Metrics>) -> Budget {
        Budget {
            limit,
            used: AtomicU64::new(0),
            metrics,
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }

    fn try_take(&self, n: u64) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u + n <= self.limit).then_some(u + n)
            })
            .is_ok();
        if taken {
            self.metrics.exec_buffered_bytes.inc_by(n as i64);
        }
        taken
    }

    fn give(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::SeqCst);
        self.metrics.exec_buffered_bytes.dec_by(n as i64);
    }
}

/// One stream's output: a prefix in memory (charged to the budget), the rest in an unlinked
/// temp file once the budget said no. Tracks UTF-8 validity as bytes arrive.
pub struct Captured {
    budget: Arc<Budget>,
    spill_dir: PathBuf,
    memory: VecDeque<Vec<u8>>,
    /// Bytes of `memory.front()` already handed out.
    front_offset: usize,
    charged: u64,
    spill: Option<tokio::fs::File>,
    utf8: Utf8Check,
}

impl Captured {
    /// Nothing captured yet; spill files go under `spill_dir`.
    pub fn new(budget: Arc<Budget>, spill_dir: PathBuf) -> Captured {
        Captured {
            budget,
            spill_dir,
            memory: VecDeque::new(),
            front_offset: 0,
            charged: 0,
            spill: None,
            utf8: Utf8Check::default(),
        }
    }

    /// Appends raw output.
    pub async fn push(&mut self, data: Vec<u8>, metrics: &Metrics) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.utf8.push(&data);
        let n = data.len() as u64;
        // Once spilling, keep spilling so the order of bytes is memory prefix, file rest.
        let data = if self.spill.is_none() {
            // A small chunk joins the last buffer when it has room: already charged.
            if let Some(tail) = self.memory.back_mut() {
                if data.len() < GATHER && tail.capacity() - tail.len() >= data.len() {
                    tail.extend_from_slice(&data);
                    return Ok(());
                }
            }
            let chunk = if data.len() < GATHER {
                let mut buffer = Vec::with_capacity(GATHER);
                buffer.extend_from_slice(&data);
                buffer
            } else {
                data
            };
            let c = cost(&chunk, chunk.capacity());
            if self.budget.try_take(c) {
                self.charged += c;
                self.memory.push_back(chunk);
                return Ok(());
            }
            chunk
        } else {
            data
        };
        if self.spill.is_none() {
            let file = tempfile::tempfile_in(&self.spill_dir).map_err(|e| {
                spill_error(e, format!("spill file in {}", self.spill_dir.display()))
            })?;
            self.spill = Some(tokio::fs::File::from_std(file));
        }
        let file = self.spill.as_mut().expect("spill file just set");
        file.write_all(&data)
            .await
            .map_err(|e| spill_error(e, "writing spill file".into()))?;
        metrics.exec_spilled_bytes.inc_by(n);
        Ok(())
    }

    /// True when every byte so far is valid UTF-8 and no sequence is left incomplete.
    pub fn is_utf8(&self) -> bool {
        self.utf8.is_valid()
    }

    /// Prepares reading back from the first byte.
    pub async fn rewind(&mut self) -> Result<()> {
        if let Some(file) = &mut self.spill {
            file.flush()
                .await
                .map_err(Error::io("flushing spill file"))?;
            file.seek(std::io::SeekFrom::Start(0))
                .await
                .map_err(Error::io("rewinding spill file"))?;
        }
        Ok(())
    }

    /// Up to `max` next raw bytes; empty at the end. Memory is returned to the budget as
    /// it is handed out.
    pub async fn next_chunk(&mut self, max: usize) -> Result<Vec<u8>> {
        if let Some(front) = self.memory.front() {
            let end = (self.front_offset + max).min(front.len());
            let chunk = front[self.front_offset..end].to_vec();
            self.front_offset = end;
            if end == front.len() {
                let freed = cost(front, front.capacity());
                self.memory.pop_front();
                self.front_offset = 0;
                self.charged -= freed;
                self.budget.give(freed);
            }
            return Ok(chunk);
        }
        let Some(file) = &mut self.spill else {
            return Ok(Vec::new());
        };
        let mut buf = vec![0u8; max];
        let n = file
            .read(&mut buf)
            .await
            .map_err(Error::io("reading spill file"))?;
        buf.truncate(n);
        Ok(buf)
    }
}

impl Drop for Captured {
    fn drop(&mut self) {
        self.budget.give(self.charged);
    }
}

/// Incremental UTF-8 validation across chunk boundaries.
#[derive(Default)]
struct Utf8Check {
    invalid: bool,
    /// An incomplete sequence at the end of the bytes seen so far.
    pending: Vec<u8>,
}

impl Utf8Check {
    fn push(&mut self, mut data: &[u8]) {
        if self.invalid {
            return;
        }
        if !self.pending.is_empty() {
            let need = match self.pending[0] {
                0xC2..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            } - self.pending.len();
            let take = need.min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if take < need {
                return;
            }
            if std::str::from_utf8(&self.pending).is_err() {
                self.invalid = true;
                return;
            }
            self.pending.clear();
        }
        if let Err(e) = std::str::from_utf8(data) {
            if e.error_len().is_some() {
                self.invalid = true;
            } else {
                self.pending = data[e.valid_up_to()..].to_vec();
            }
        }
    }

    fn is_valid(&self) -> bool {
        !self.invalid && self.pending.is_empty()
    }
}

/// A spill that failed because `data_dir` is full is the node out of a resource for now
/// (503, retry later), not an internal error: the command is killed like any give-up.
fn spill_error(e: std::io::Error, context: String) -> Error {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        Error::Busy {
            reason: "data_dir is full: output past the memory budget cannot spill".into(),
            retry_after: 5,
        }
    } else {
        Error::io(context)(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tiny_chunks_are_gathered_and_charged_for_what_they_hold() {
        let metrics = Arc::new(Metrics::new());
        let budget = Arc::new(Budget::new(1 << 20, metrics.clone()));
        let dir = tempfile::tempdir().unwrap();
        let mut c = Captured::new(budget.clone(), dir.path().to_path_buf());
        for i in 0..10_000u32 {
            c.push(vec![i as u8], &metrics).await.unwrap();
        }
        // 10 000 bytes in 3 buffers of 4 KiB, not 10 000 allocations.
        assert_eq!(c.memory.len(), 3);
        assert_eq!(budget.used(), 3 * (GATHER as u64 + CHUNK_OVERHEAD));
        // A large chunk is kept as it came, charged with its overhead.
        c.push(vec![7; 10_000], &metrics).await.unwrap();
        assert_eq!(
            budget.used(),
            3 * (GATHER as u64 + CHUNK_OVERHEAD) + 10_000 + CHUNK_OVERHEAD
        );
        c.rewind().await.unwrap();
        let mut out = Vec::new();
        loop {
            let chunk = c.next_chunk(1000).await.unwrap();
            if chunk.is_empty() {
                break;
            }
            out.extend_from_slice(&chunk);
        }
        assert_eq!(out.len(), 20_000);
        assert!(out[..10_000].iter().enumerate().all(|(i, b)| *b == i as u8));
        assert!(out[10_000..].iter().all(|b| *b == 7));
        assert_eq!(budget.used(), 0, "everything handed out is given back");
    }

    #[test]
    fn utf8_check_across_boundaries() {
        let text = "héllo → 😀 done".as_bytes();
        for split in 0..text.len() {
            let mut c = Utf8Check::default();
            c.push(&text[..split]);
            c.push(&text[split..]);
            assert!(c.is_valid(), "split at {split}");
        }
        for split in 0..4 {
            let mut c = Utf8Check::default();
            let emoji = "😀".as_bytes();
            c.push(&emoji[..split]);
            if split > 0 {
                assert!(!c.is_valid(), "incomplete sequence at end is not valid");
            }
        }
        let mut c = Utf8Check::default();
        c.push(b"ok\xff");
        assert!(!c.is_valid());
        let mut c = Utf8Check::default();
        c.push(b"\xe2\x82");
        c.push(b"A");
        assert!(!c.is_valid());
    }
}
