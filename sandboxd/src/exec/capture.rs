//! One exec's captured output: counted against the node-wide memory [`Budget`], spilled
//! to an unlinked temp file once the budget says no, and checked for UTF-8 validity as
//! it arrives. Knows nothing of HTTP or of the guest.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::error::{Error, Result};
use crate::metrics::Metrics;

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
        if self.spill.is_none() && self.budget.try_take(n) {
            self.charged += n;
            self.memory.push_back(data);
            return Ok(());
        }
        if self.spill.is_none() {
            let file = tempfile::tempfile_in(&self.spill_dir).map_err(Error::io(format!(
                "spill file in {}",
                self.spill_dir.display()
            )))?;
            self.spill = Some(tokio::fs::File::from_std(file));
        }
        let file = self.spill.as_mut().expect("spill file just set");
        file.write_all(&data)
            .await
            .map_err(Error::io("writing spill file"))?;
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
                let freed = front.len() as u64;
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

#[cfg(test)]
mod tests {
    use super::*;

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
