//! The host files silkd needs inside a sandbox: its binary and, when it is dynamically
//! linked (a plain `cargo build`), its ELF interpreter and the libraries that interpreter
//! resolves, found once at engine start. They are bound read-only into the sandbox's
//! private `/run/silkd-lib`, and silkd is started through the interpreter with
//! `--library-path`, so any rootfs (busybox, distroless) runs it and the commands it
//! starts see only the rootfs's own libraries. A static silkd (the guest image's
//! `/init`) needs none of this.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// Inside the sandbox: silkd's binary.
pub const SILKD_IN_GUEST: &str = "/run/silkd.bin";
/// Inside the sandbox: the interpreter and libraries of a dynamic silkd.
pub const LIB_DIR_IN_GUEST: &str = "/run/silkd-lib";

/// What to bind for silkd, and how to start it.
#[derive(Debug, Clone)]
pub struct SilkdFiles {
    /// The binary on the host.
    pub binary: PathBuf,
    /// For a dynamic binary: (interpreter, libraries), host paths, symlinks resolved.
    pub dynamic: Option<(PathBuf, Vec<PathBuf>)>,
}

impl SilkdFiles {
    /// Inspects `binary`: static, or dynamic with the interpreter and libraries it loads.
    pub fn resolve(binary: &Path) -> Result<SilkdFiles> {
        let bytes = std::fs::read(binary)
            .map_err(|e| Error::Engine(format!("reading silkd at {}: {e}", binary.display())))?;
        let Some(interp) = elf_interpreter(&bytes) else {
            return Ok(SilkdFiles {
                binary: binary.to_path_buf(),
                dynamic: None,
            });
        };
        // The interpreter itself lists what it would load: exactly what silkd will need.
        let out = Command::new(&interp)
            .arg("--list")
            .arg(binary)
            .output()
            .map_err(|e| Error::Engine(format!("running {} --list: {e}", interp.display())))?;
        if !out.status.success() {
            return Err(Error::Engine(format!(
                "{} --list {}: {}",
                interp.display(),
                binary.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let mut libs = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)"; the vdso has no path.
            if let Some((_, rest)) = line.split_once("=> ") {
                let path = rest.split(" (").next().unwrap_or_default().trim();
                if path.starts_with('/') {
                    libs.push(PathBuf::from(path));
                }
            }
        }
        let real = |p: &Path| {
            p.canonicalize()
                .map_err(|e| Error::Engine(format!("resolving {}: {e}", p.display())))
        };
        let interp = real(&interp)?;
        let libs = libs.iter().map(|l| real(l)).collect::<Result<Vec<_>>>()?;
        Ok(SilkdFiles {
            binary: binary.to_path_buf(),
            dynamic: Some((interp, libs)),
        })
    }

    /// (host file, path inside the sandbox) for every file to bind read-only.
    pub fn binds(&self) -> Vec<(PathBuf, String)> {
        let mut binds = vec![(self.binary.clone(), SILKD_IN_GUEST.to_string())];
        if let Some((interp, libs)) = &self.dynamic {
            for file in std::iter::once(interp).chain(libs) {
                let name = file.file_name().unwrap_or_default().to_string_lossy();
                binds.push((file.clone(), format!("{LIB_DIR_IN_GUEST}/{name}")));
            }
        }
        binds
    }

    /// The argv that starts silkd inside the sandbox, before silkd's own flags.
    pub fn command(&self) -> Vec<String> {
        match &self.dynamic {
            None => vec![SILKD_IN_GUEST.into()],
            Some((interp, _)) => {
                let name = interp.file_name().unwrap_or_default().to_string_lossy();
                vec![
                    format!("{LIB_DIR_IN_GUEST}/{name}"),
                    "--library-path".into(),
                    LIB_DIR_IN_GUEST.into(),
                    SILKD_IN_GUEST.into(),
                ]
            }
        }
    }
}

/// The `PT_INTERP` path of a 64-bit little-endian ELF file, if it has one.
fn elf_interpreter(elf: &[u8]) -> Option<PathBuf> {
    const PT_INTERP: u32 = 3;
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let bytes = |at: usize, n: usize| elf.get(at..at.checked_add(n)?);
    let u16_at = |at: usize| Some(u16::from_le_bytes(bytes(at, 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(bytes(at, 4)?.try_into().ok()?));
    let u64_at =
        |at: usize| usize::try_from(u64::from_le_bytes(bytes(at, 8)?.try_into().ok()?)).ok();
    let (phoff, phentsize, phnum) = (u64_at(0x20)?, u16_at(0x36)?, u16_at(0x38)?);
    for i in 0..usize::from(phnum) {
        let ph = phoff.checked_add(i.checked_mul(usize::from(phentsize))?)?;
        if u32_at(ph)? == PT_INTERP {
            let (offset, size) = (u64_at(ph.checked_add(8)?)?, u64_at(ph.checked_add(32)?)?);
            let raw = bytes(offset, size)?;
            let path = raw.split(|b| *b == 0).next()?;
            return Some(PathBuf::from(String::from_utf8_lossy(path).into_owned()));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_binary_brings_its_interpreter_and_libraries() {
        // The test binary itself is dynamically linked against libc.
        let me = std::env::current_exe().unwrap();
        let files = SilkdFiles::resolve(&me).unwrap();
        let (interp, libs) = files.dynamic.clone().expect("dynamic");
        assert!(interp.is_file(), "{}", interp.display());
        assert!(
            libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
            "{libs:?}"
        );
        assert_eq!(files.binds().len(), 2 + libs.len());
        assert_eq!(files.command().last().unwrap(), SILKD_IN_GUEST);
    }

    #[test]
    fn hostile_or_static_files_have_no_interpreter() {
        assert_eq!(elf_interpreter(b""), None);
        assert_eq!(elf_interpreter(b"#!/bin/sh\n"), None);
        // A header whose program table points far past the end.
        let mut elf = b"\x7fELF\x02\x01".to_vec();
        elf.resize(0x40, 0);
        elf[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        elf[0x36] = 56;
        elf[0x38] = 3;
        assert_eq!(elf_interpreter(&elf), None);
    }
}
