//! The host end of a VM's console and of QEMU's stderr: a task drains each into a
//! fixed-size ring in memory, so a guest that writes its console without end costs the
//! host a few KiB and no disk; error messages show the ring's tail.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt};

/// The last `cap` bytes written to one stream, and how many were written in all.
#[derive(Clone)]
pub struct Ring {
    inner: Arc<RingInner>,
}

struct RingInner {
    cap: usize,
    bytes: Mutex<VecDeque<u8>>,
    total: AtomicU64,
}

impl Ring {
    /// An empty ring keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Ring {
        Ring {
            inner: Arc::new(RingInner {
                cap,
                bytes: Mutex::new(VecDeque::with_capacity(cap)),
                total: AtomicU64::new(0),
            }),
        }
    }

    /// Appends, dropping the oldest bytes beyond the cap.
    pub fn push(&self, data: &[u8]) {
        let cap = self.inner.cap;
        self.inner
            .total
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        let data = &data[data.len().saturating_sub(cap)..];
        let mut bytes = self.inner.bytes.lock().expect("ring lock");
        let over = (bytes.len() + data.len()).saturating_sub(cap);
        bytes.drain(..over);
        bytes.extend(data);
    }

    /// Bytes written in all (kept or dropped).
    pub fn total(&self) -> u64 {
        self.inner.total.load(Ordering::Relaxed)
    }

    /// The last `max` bytes, trimmed, lossily decoded, newlines shown as ` | `.
    pub fn tail(&self, max: usize) -> String {
        let bytes = self.inner.bytes.lock().expect("ring lock");
        let from = bytes.len().saturating_sub(max);
        let tail: Vec<u8> = bytes.range(from..).copied().collect();
        drop(bytes);
        String::from_utf8_lossy(&tail)
            .trim()
            .replace("\r\n", "\n")
            .replace('\n', " | ")
    }

    /// Drains `from` into the ring until EOF or an error (the writer, QEMU, is gone).
    pub fn fill_from(&self, mut from: impl AsyncRead + Unpin + Send + 'static) {
        let ring = self.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n) = from.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                ring.push(&buf[..n]);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_the_last_cap_bytes() {
        let r = Ring::new(8);
        r.push(b"abc\n");
        assert_eq!(r.tail(100), "abc");
        r.push(b"defghijk");
        assert_eq!(r.tail(100), "defghijk");
        r.push(&[b'x'; 1000]);
        assert_eq!(r.tail(3), "xxx");
        assert_eq!(r.total(), 1012);
        assert_eq!(r.inner.bytes.lock().unwrap().len(), 8);
        r.push(b"1\r\n2\n");
        assert_eq!(r.tail(100), "xxx1 | 2");
    }

    #[tokio::test]
    async fn fill_from_drains_a_stream_to_its_end() {
        let (mut w, r) = tokio::io::duplex(64);
        let ring = Ring::new(16);
        ring.fill_from(r);
        for _ in 0..100 {
            tokio::io::AsyncWriteExt::write_all(&mut w, b"0123456789")
                .await
                .unwrap();
        }
        drop(w);
        wait_total(&ring, 1000).await;
        assert_eq!(ring.tail(100).len(), 16);
    }

    async fn wait_total(ring: &Ring, n: u64) {
        for _ in 0..1000 {
            if ring.total() == n {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("ring saw {} bytes, expected {n}", ring.total());
    }
}
