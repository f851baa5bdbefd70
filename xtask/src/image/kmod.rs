//! Kernel modules for the guest: find the `.ko` files of an unpacked kernel package,
//! read each one's `depends=` from its `.modinfo` ELF section, and order them so that
//! every module comes after the modules it needs (the `.deb` ships no modules.dep).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// What the guest loads, in this order before dependencies are resolved: the
/// virtio-mmio transport (`-M microvm`), the virtio-pci transport (`-M q35`), the
/// virtio-serial console that carries silkd's channel, and the balloon.
pub const WANTED: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "virtio_console",
    "virtio_balloon",
];

/// Added for templates with a root disk (`rootfs.erofs`): the read-only virtio-blk disk,
/// its filesystem, and the overlay that puts each sandbox's writable layer on top; and
/// virtio-pmem with its pmem block driver, for sandboxd's `[qemu] template_disk = "pmem"`
/// (the image as a DAX-mapped memory region). `base` (no disk) leaves them out, so its
/// boot stage stays as it was.
pub const DISK: &[&str] = &["virtio_blk", "erofs", "overlay", "virtio_pmem", "nd_pmem"];

/// One module ready to copy into the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// Canonical name, `-` folded to `_` as the kernel does.
    pub name: String,
    /// Path below `lib/modules/<release>/`, e.g. `kernel/drivers/virtio/virtio.ko`.
    pub rel_path: PathBuf,
    pub depends: Vec<String>,
}

/// `wanted` plus everything they depend on, each after its dependencies.
pub fn load_order(modules_dir: &Path, wanted: &[&str]) -> Result<Vec<Module>> {
    let mut index = BTreeMap::new();
    index_modules(modules_dir, modules_dir, &mut index)?;
    let mut order = Vec::new();
    let mut done = BTreeSet::new();
    for name in wanted {
        visit(
            &canonical(name),
            modules_dir,
            &index,
            &mut Vec::new(),
            &mut done,
            &mut order,
        )?;
    }
    Ok(order)
}

fn visit(
    name: &str,
    modules_dir: &Path,
    index: &BTreeMap<String, PathBuf>,
    stack: &mut Vec<String>,
    done: &mut BTreeSet<String>,
    order: &mut Vec<Module>,
) -> Result<()> {
    if done.contains(name) {
        return Ok(());
    }
    if stack.iter().any(|n| n == name) {
        return Err(Error::Invalid(format!(
            "kernel modules depend on each other in a cycle: {} -> {name}",
            stack.join(" -> ")
        )));
    }
    let rel_path = index.get(name).ok_or_else(|| {
        Error::Invalid(format!(
            "kernel module `{name}` not found under {}{}",
            modules_dir.display(),
            match stack.last() {
                Some(parent) => format!(" (needed by `{parent}`)"),
                None => String::new(),
            }
        ))
    })?;
    let path = modules_dir.join(rel_path);
    let bytes = fs::read(&path).map_err(Error::io("reading kernel module", &path))?;
    let depends: Vec<String> = modinfo(&bytes)
        .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?
        .into_iter()
        .filter(|(key, _)| key == "depends")
        .flat_map(|(_, value)| {
            value
                .split(',')
                .filter(|d| !d.is_empty())
                .map(canonical)
                .collect::<Vec<_>>()
        })
        .collect();
    stack.push(name.to_string());
    for dep in &depends {
        visit(dep, modules_dir, index, stack, done, order)?;
    }
    stack.pop();
    done.insert(name.to_string());
    order.push(Module {
        name: name.to_string(),
        rel_path: rel_path.clone(),
        depends,
    });
    Ok(())
}

/// Maps every module name under `dir` to its path relative to `base`.
fn index_modules(base: &Path, dir: &Path, index: &mut BTreeMap<String, PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(Error::io("listing kernel modules", dir))? {
        let path = entry
            .map_err(Error::io("listing kernel modules", dir))?
            .path();
        let file_name = path.file_name().unwrap_or_default().to_string_lossy();
        if path.is_dir() {
            index_modules(base, &path, index)?;
        } else if let Some(stem) = file_name.strip_suffix(".ko") {
            let rel = path.strip_prefix(base).unwrap_or(&path).to_path_buf();
            index.insert(canonical(stem), rel);
        } else if file_name.contains(".ko.") {
            return Err(Error::Invalid(format!(
                "compressed kernel module {} is not supported (the cloud kernel ships plain .ko files)",
                path.display()
            )));
        }
    }
    Ok(())
}

fn canonical(name: &str) -> String {
    name.replace('-', "_")
}

/// The `key=value` strings of a module's `.modinfo` section (little-endian ELF64).
pub fn modinfo(elf: &[u8]) -> std::result::Result<Vec<(String, String)>, String> {
    let u16_at = |off: usize| -> std::result::Result<usize, String> {
        elf.get(off..off + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
            .ok_or_else(|| format!("ELF truncated at byte {off}"))
    };
    let u32_at = |off: usize| -> std::result::Result<usize, String> {
        elf.get(off..off + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| format!("ELF truncated at byte {off}"))
    };
    let u64_at = |off: usize| -> std::result::Result<usize, String> {
        elf.get(off..off + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
            .ok_or_else(|| format!("ELF truncated at byte {off}"))
    };
    if elf.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return Err("not a little-endian 64-bit ELF file".into());
    }
    let sh_off = u64_at(0x28)?;
    let sh_entsize = u16_at(0x3a)?;
    let sh_num = u16_at(0x3c)?;
    let sh_strndx = u16_at(0x3e)?;
    let section = |i: usize| -> std::result::Result<(usize, usize, usize), String> {
        let header = sh_off + i * sh_entsize;
        Ok((
            u32_at(header)?,
            u64_at(header + 0x18)?,
            u64_at(header + 0x20)?,
        ))
    };
    let bytes = |offset: usize, size: usize| {
        elf.get(offset..offset.saturating_add(size))
            .ok_or_else(|| format!("section at {offset}+{size} lies outside the file"))
    };
    let (_, names_off, names_size) = section(sh_strndx)?;
    let names = bytes(names_off, names_size)?;
    for i in 0..sh_num {
        let (name_off, offset, size) = section(i)?;
        let name = names
            .get(name_off..)
            .and_then(|rest| rest.split(|&b| b == 0).next())
            .unwrap_or_default();
        if name == b".modinfo" {
            return Ok(bytes(offset, size)?
                .split(|&b| b == 0)
                .filter_map(|entry| {
                    let entry = String::from_utf8_lossy(entry);
                    let (key, value) = entry.split_once('=')?;
                    Some((key.to_string(), value.to_string()))
                })
                .collect());
        }
    }
    Err("no .modinfo section".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 file whose only real section is `.modinfo` holding `info`.
    fn fake_module(info: &[&str]) -> Vec<u8> {
        let mut modinfo: Vec<u8> = Vec::new();
        for entry in info {
            modinfo.extend_from_slice(entry.as_bytes());
            modinfo.push(0);
        }
        let shstrtab = b"\0.shstrtab\0.modinfo\0";
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        let shstrtab_off = elf.len();
        elf.extend_from_slice(shstrtab);
        let modinfo_off = elf.len();
        elf.extend_from_slice(&modinfo);
        let sh_off = elf.len();
        elf[0x28..0x30].copy_from_slice(&(sh_off as u64).to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        for (name, off, size) in [
            (0u32, 0usize, 0usize),
            (1, shstrtab_off, shstrtab.len()),
            (11, modinfo_off, modinfo.len()),
        ] {
            let mut header = [0u8; 64];
            header[..4].copy_from_slice(&name.to_le_bytes());
            header[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
            header[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            elf.extend_from_slice(&header);
        }
        elf
    }

    #[test]
    fn modinfo_reads_key_value_pairs() {
        let elf = fake_module(&[
            "license=GPL",
            "depends=virtio,virtio_ring",
            "name=virtio_mmio",
        ]);
        let info = modinfo(&elf).unwrap();
        assert_eq!(
            info,
            [
                ("license".to_string(), "GPL".to_string()),
                ("depends".to_string(), "virtio,virtio_ring".to_string()),
                ("name".to_string(), "virtio_mmio".to_string()),
            ]
        );
        assert!(modinfo(b"not an elf").is_err());
        assert!(modinfo(&elf[..80]).is_err());
    }

    #[test]
    fn load_order_puts_dependencies_first_and_names_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let write = |rel: &str, depends: &str| {
            let path = dir.path().join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, fake_module(&[&format!("depends={depends}")])).unwrap();
        };
        write("kernel/a/top.ko", "mid-one,mid_two");
        write("kernel/b/mid-one.ko", "base");
        write("kernel/b/mid_two.ko", "base");
        write("kernel/c/base.ko", "");
        write("kernel/c/broken.ko", "absent");

        let order = load_order(dir.path(), &["top"]).unwrap();
        let names: Vec<&str> = order.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["base", "mid_one", "mid_two", "top"]);
        assert_eq!(order[1].rel_path, Path::new("kernel/b/mid-one.ko"));
        assert_eq!(order[3].depends, ["mid_one", "mid_two"]);

        let err = load_order(dir.path(), &["broken"]).unwrap_err().to_string();
        assert!(
            err.contains("`absent` not found") && err.contains("needed by `broken`"),
            "{err}"
        );
    }
}
