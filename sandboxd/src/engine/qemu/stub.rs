//! The kernel a restoring QEMU gets: the image's bzImage cut to its setup header, in a
//! sealed memfd. It must not be used to boot anything.
//!
//! A QEMU started with `-incoming` never boots: its guest's kernel is already in the
//! restored RAM. It still needs a `-kernel`, because that decides its option ROM (the
//! Linux loader's), a RAM block the migration stream carries. Given the whole image,
//! QEMU keeps a heap copy of it (and of the initramfs) for its firmware config: 13.9 MiB
//! of dirty private memory in every idle clone (`/proc/PID/smaps`: an anonymous block of
//! exactly the vmlinuz size), which the header alone avoids. A clone that resets exits
//! (`-no-reboot`), so the cut kernel is never run.

use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

use crate::error::{Error, Result};

/// Where the bzImage header's `setup_sects` byte is (Linux boot protocol).
const SETUP_SECTS: usize = 0x1f1;
/// Where its `HdrS` magic is.
const MAGIC_AT: usize = 0x202;
/// Bytes of the protected-mode kernel kept after the setup code, so QEMU finds a
/// non-empty kernel behind the header.
const PAYLOAD_KEPT: usize = 512;

/// A sealed memfd with the first bytes of `kernel` that QEMU's Linux loader reads, or
/// `None` when `kernel` is not a bzImage (then the caller passes the whole file).
pub fn kernel_stub(kernel: &File) -> Result<Option<File>> {
    let mut header = [0u8; MAGIC_AT + 4];
    if kernel.read_exact_at(&mut header, 0).is_err() {
        return Ok(None);
    }
    let Some(len) = stub_len(&header) else {
        return Ok(None);
    };
    let mut bytes = vec![0u8; len];
    kernel
        .read_exact_at(&mut bytes, 0)
        .map_err(Error::io("reading the kernel header"))?;
    let memfd = |e: std::io::Error| Error::Engine(format!("kernel stub memfd: {e}"));
    // SAFETY: memfd_create with a NUL-terminated name returns a new fd or -1.
    let fd = unsafe {
        libc::memfd_create(
            c"kernel-stub".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(memfd(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by memfd_create and nothing else owns it.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.write_all(&bytes).map_err(memfd)?;
    // Read-only for good: QEMU (another uid) reopens it through /proc/self/fd.
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: F_ADD_SEALS on an fd we own.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } < 0 {
        return Err(memfd(std::io::Error::last_os_error()));
    }
    Ok(Some(file))
}

/// How many bytes of a bzImage beginning with `header` the stub keeps: the boot sector
/// and setup code (`setup_sects + 1` sectors, 0 meaning 4), then [`PAYLOAD_KEPT`].
fn stub_len(header: &[u8]) -> Option<usize> {
    if header.get(MAGIC_AT..MAGIC_AT + 4)? != b"HdrS" {
        return None;
    }
    let sects = match *header.get(SETUP_SECTS)? {
        0 => 4,
        n => usize::from(n),
    };
    Some((sects + 1) * 512 + PAYLOAD_KEPT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(sects: u8) -> Vec<u8> {
        let mut h = vec![0u8; 0x206];
        h[SETUP_SECTS] = sects;
        h[MAGIC_AT..MAGIC_AT + 4].copy_from_slice(b"HdrS");
        h
    }

    #[test]
    fn the_stub_keeps_the_setup_sectors_and_a_little_more() {
        assert_eq!(stub_len(&header(33)), Some(34 * 512 + PAYLOAD_KEPT));
        assert_eq!(
            stub_len(&header(0)),
            Some(5 * 512 + PAYLOAD_KEPT),
            "0 means 4"
        );
        let mut elf = header(33);
        elf[MAGIC_AT..MAGIC_AT + 4].copy_from_slice(b"\x7fELF");
        assert_eq!(stub_len(&elf), None, "not a bzImage: no stub");
        assert_eq!(stub_len(&[0u8; 16]), None, "too short");
    }

    #[test]
    fn the_stub_is_the_kernel_s_first_bytes_sealed() {
        let mut image = header(2);
        image.resize(64 * 1024, 0xab);
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&image).unwrap();
        let mut stub = kernel_stub(&f).unwrap().expect("a bzImage");
        let mut got = vec![0u8; 3 * 512 + PAYLOAD_KEPT];
        stub.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(got, image[..got.len()]);
        assert_eq!(stub.metadata().unwrap().len() as usize, got.len());
        assert!(stub.write_all(b"x").is_err(), "sealed against writes");
        let plain = tempfile::tempfile().unwrap();
        assert!(
            kernel_stub(&plain).unwrap().is_none(),
            "empty file: no stub"
        );
    }
}
