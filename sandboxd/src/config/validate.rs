//! The config's rules, in one place: [`Config::validate`] (run by `parse`/`load` and by
//! `run`), and the pool-key and warm-target checks that `PUT /v1/pools` shares with it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::{Config, EngineKind, ListenAddr};
use crate::error::{Error, Result};

impl Config {
    /// Checks everything other modules rely on. The one place config rules live.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(msg));
        let listen = self.listen_addr()?;
        if let Some(e2b) = &self.e2b {
            e2b.validate(&self.templates)?;
        }
        if let Some(cluster) = &self.cluster {
            cluster.validate(matches!(listen, ListenAddr::Unix(_)))?;
        }
        if self.data_dir.as_os_str().is_empty() {
            return bad("data_dir is empty".into());
        }
        if let Some(token) = &self.api_token {
            if token.len() < 16 {
                return bad("api_token must be at least 16 characters".into());
            }
        }
        if self.default_ttl_seconds == 0 || self.max_ttl_seconds == 0 {
            return bad("default_ttl_seconds and max_ttl_seconds must be positive".into());
        }
        if self.default_ttl_seconds > self.max_ttl_seconds {
            return bad("default_ttl_seconds exceeds max_ttl_seconds".into());
        }
        if self.refill_concurrency == 0 || self.boot_timeout_seconds == 0 {
            return bad("refill_concurrency and boot_timeout_seconds must be positive".into());
        }
        if self.warmup_timeout_seconds == 0 {
            return bad("warmup_timeout_seconds must be positive".into());
        }
        let mut names = HashSet::new();
        let mut tokens: HashSet<&str> = self.api_token.iter().map(String::as_str).collect();
        for t in &self.tenants {
            if t.name.is_empty() || !names.insert(t.name.as_str()) {
                return bad(format!("tenant name {:?} is empty or repeated", t.name));
            }
            if t.token.len() < 16 || !tokens.insert(t.token.as_str()) {
                return bad(format!(
                    "tenant {:?}: token must be at least 16 characters and unique",
                    t.name
                ));
            }
        }
        if self.templates.is_empty() || self.sizes.is_empty() {
            return bad("at least one template and one size are needed".into());
        }
        for name in self.templates.keys().chain(self.sizes.keys()) {
            // Names become file names (golden stamps) and metric labels.
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return bad(format!(
                    "template/size name {name:?} must be letters, digits, '-' or '_'"
                ));
            }
        }
        for (name, t) in &self.templates {
            t.check_silkd_keys(name)?;
            if self.engine == EngineKind::Qemu {
                let Some(image) = &t.image else {
                    return bad(format!(
                        "template {name:?}: the qemu engine needs `image` (built by `cargo xtask image`)"
                    ));
                };
                for file in ["vmlinuz", "initramfs.cpio.gz", "manifest.json"] {
                    if !image.join(file).is_file() {
                        return bad(format!(
                            "template {name:?}: {}/{file} is missing; run `cargo xtask image`",
                            image.display()
                        ));
                    }
                }
                continue;
            }
            if t.rootfs.as_os_str().is_empty() {
                return bad(format!("template {name:?}: set rootfs or image"));
            }
            if !t.rootfs.is_absolute() {
                return bad(format!(
                    "template {name:?}: rootfs must be an absolute path"
                ));
            }
            if !t.rootfs.is_dir() {
                return bad(format!(
                    "template {name:?}: rootfs {} is not a directory",
                    t.rootfs.display()
                ));
            }
            self.check_rootfs_hides(name, &t.rootfs, &self.data_dir, "data_dir")?;
        }
        let q = &self.qemu;
        if q.uid_count < 2 || q.uid_base == 0 || q.uid_base.checked_add(q.uid_count).is_none() {
            return bad(format!(
                "[qemu] uid_base {} / uid_count {}: need a non-root base and at least 2 ids \
                 that fit in 32 bits",
                q.uid_base, q.uid_count
            ));
        }
        // Measured on QEMU 10: microvm places a virtio-pmem region at guest address 0 (it
        // has no device-memory area), and the guest's nd_pmem fails ("could not reserve
        // region [mem 0x00000000-...]", error -16): no /dev/pmem0.
        if q.template_disk == super::TemplateDisk::Pmem && q.machine != super::QemuMachine::Q35 {
            return bad(
                "[qemu] template_disk = \"pmem\" needs machine = \"q35\": on microvm QEMU \
                 puts the virtio-pmem region at guest address 0 and the guest cannot map it"
                    .into(),
            );
        }
        let p = &self.process;
        // uid 0 would make sandboxes root on the host; u32::MAX is "no uid" to the kernel.
        if p.uid_base == 0
            || p.uid_count == 0
            || u64::from(p.uid_base) + u64::from(p.uid_count) > u64::from(u32::MAX)
        {
            return bad(format!(
                "[process] uid_base {} and uid_count {} must give a non-empty range of \
                 uids above 0 and below 4294967295",
                p.uid_base, p.uid_count
            ));
        }
        if p.uid_block == 0 || p.uid_block > p.uid_count {
            return bad(format!(
                "[process] uid_block {} must be at least 1 and at most uid_count {}",
                p.uid_block, p.uid_count
            ));
        }
        if self.engine == EngineKind::Process {
            for (name, t) in &self.templates {
                // Its user namespace maps ids 0 .. uid_block: the template's user must be
                // one of them, or no command could run as it.
                if let Some(u) = t
                    .meta
                    .user
                    .as_ref()
                    .filter(|u| u.uid.max(u.gid) >= p.uid_block)
                {
                    return bad(format!(
                        "template {name:?}: its user {:?} (uid {}, gid {}) is outside the                          ids 0..{} a sandbox maps; raise [process] uid_block",
                        u.name, u.uid, u.gid, p.uid_block
                    ));
                }
            }
        }
        // On qemu the writable layer of a template with a root disk is a tmpfs in guest
        // RAM: at or near memory_mib, filling it would starve the guest's kernel and the
        // page cache the template's programs run from instead of giving ENOSPC.
        if self.engine == EngineKind::Qemu && self.templates.values().any(has_root_disk) {
            for (name, s) in &self.sizes {
                if s.disk_mib.saturating_mul(2) > s.memory_mib {
                    return bad(format!(
                        "size {name:?}: disk_mib {} must be at most half of memory_mib {} on                          the qemu engine (a template's writable layer lives in guest RAM)",
                        s.disk_mib, s.memory_mib
                    ));
                }
            }
        }
        for (name, s) in &self.sizes {
            if s.cpus == 0 || s.memory_mib == 0 || s.max_pids == 0 || s.disk_mib == 0 {
                return bad(format!(
                    "size {name:?}: cpus, memory_mib, max_pids and disk_mib must be positive"
                ));
            }
        }
        self.check_targets(&self.pool_targets())
            .map_err(|e| Error::Config(e.to_string()))?;
        for p in &self.pools {
            if let Some(w) = &p.warmup {
                if w.is_empty() || w[0].is_empty() {
                    return bad(format!(
                        "pool {}/{}: warmup argv is empty",
                        p.template, p.size
                    ));
                }
            }
        }
        let (template, size) = self.default_key();
        if template.is_empty() || size.is_empty() {
            return bad("no default template/size: set default_template and default_size".into());
        }
        self.check_pool_key(&template, &size)
            .map_err(|e| Error::Config(format!("default pool: {e}")))?;
        let e = &self.exec;
        if e.max_output_bytes == 0
            || e.memory_budget_bytes == 0
            || e.max_in_flight == 0
            || e.max_in_flight_per_sandbox == 0
            || e.max_in_flight_per_tenant == 0
        {
            return bad("exec limits must be positive".into());
        }
        let h = &self.http;
        if h.max_connections == 0
            || h.header_timeout_seconds == 0
            || h.body_timeout_seconds == 0
            || h.idle_timeout_seconds == 0
            || h.write_timeout_seconds == 0
            || h.max_relays_per_sandbox == 0
        {
            return bad("[http] limits and timeouts must be positive".into());
        }
        // Every relay holds one stream of the sandbox's guest channel and every buffered
        // exec up to two (its own and the Kill on give-up). Half the channel's limit keeps
        // streams the guest has not yet collected from ever reaching it: at the limit,
        // yamux on the guest side ends the whole channel.
        let streams =
            u64::from(h.max_relays_per_sandbox) + 2 * u64::from(e.max_in_flight_per_sandbox);
        let ceiling = wire::session::MAX_STREAMS as u64 / 2;
        if streams > ceiling {
            return bad(format!(
                "[http] max_relays_per_sandbox + 2 x [exec] max_in_flight_per_sandbox is \
                 {streams}, over {ceiling} (half the guest channel's {} streams)",
                wire::session::MAX_STREAMS
            ));
        }
        Ok(())
    }

    /// The `warm_max` ceiling of a pool: its `[[pools]]` entry's, or the default for a pool
    /// the config file does not list. `PUT /v1/pools` may not raise a pool above it.
    pub fn warm_max_for(&self, template: &str, size: &str) -> u32 {
        self.pools
            .iter()
            .find(|p| p.template == template && p.size == size)
            .map_or_else(super::warm_max, |p| p.warm_max)
    }

    /// Errors when a process-engine template's rootfs holds `node_path` (the data dir, the
    /// config file): every sandbox would see the node's own files, tokens included.
    /// `[process] unsafe_host_rootfs = true` is the operator's explicit, loud opt-in.
    pub(super) fn check_rootfs_hides(
        &self,
        template: &str,
        rootfs: &Path,
        node_path: &Path,
        what: &str,
    ) -> Result<()> {
        if self.engine != EngineKind::Process || self.process.unsafe_host_rootfs {
            return Ok(());
        }
        let (Some(tree), Some(inner)) = (real_path(rootfs), real_path(node_path)) else {
            return Ok(());
        };
        if inner.starts_with(&tree) {
            return Err(Error::Config(format!(
                "template {template:?}: rootfs {} contains the node's {what} ({}), so every \
                 sandbox could read it (tokens included); use an image's rootfs (cargo xtask \
                 image builds target/images/base/rootfs), or set [process] \
                 unsafe_host_rootfs = true to accept this",
                rootfs.display(),
                node_path.display()
            )));
        }
        Ok(())
    }

    /// Errors unless both names are configured ([`Error::UnknownName`], a 400 on the API).
    pub fn check_pool_key(&self, template: &str, size: &str) -> Result<()> {
        if !self.templates.contains_key(template) {
            return Err(Error::UnknownName {
                kind: "template",
                name: template.into(),
            });
        }
        if !self.sizes.contains_key(size) {
            return Err(Error::UnknownName {
                kind: "size",
                name: size.into(),
            });
        }
        Ok(())
    }

    /// The one check of a list of warm targets, for the config file's `[[pools]]` and for
    /// `PUT /v1/pools` alike: known template and size, no pool twice, `warm <= warm_max`,
    /// `warm_max` within the config's ([`Config::warm_max_for`]), and the warm targets
    /// together within `max_claims`: an idle sandbox costs the host what a claimed one
    /// does, and `max_claims` is what the operator sized the node for.
    /// Errors are the API's (unknown name or bad request); the config wraps them.
    pub fn check_targets(&self, targets: &[api::PoolTarget]) -> Result<()> {
        let mut seen = HashSet::new();
        let mut total: u64 = 0;
        for t in targets {
            self.check_pool_key(&t.template, &t.size)?;
            if !seen.insert((t.template.as_str(), t.size.as_str())) {
                return Err(Error::BadRequest(format!(
                    "pool {}/{} appears twice",
                    t.template, t.size
                )));
            }
            let ceiling = self.warm_max_for(&t.template, &t.size);
            if t.warm_max > ceiling {
                return Err(Error::BadRequest(format!(
                    "pool {}/{}: warm_max {} exceeds the config's warm_max {ceiling} for it",
                    t.template, t.size, t.warm_max
                )));
            }
            if t.warm > t.warm_max {
                return Err(Error::BadRequest(format!(
                    "pool {}/{}: warm {} exceeds warm_max {}",
                    t.template, t.size, t.warm, t.warm_max
                )));
            }
            total += u64::from(t.warm);
        }
        if total > u64::from(self.max_claims) {
            return Err(Error::BadRequest(format!(
                "warm targets add up to {total}, over the node's max_claims {}",
                self.max_claims
            )));
        }
        Ok(())
    }

    /// The config file's own `[[pools]]` as warm targets (config-owned fields left out).
    pub fn pool_targets(&self) -> Vec<api::PoolTarget> {
        self.pools
            .iter()
            .map(|p| api::PoolTarget {
                template: p.template.clone(),
                size: p.size.clone(),
                warm: p.warm,
                warm_max: p.warm_max,
            })
            .collect()
    }
}

/// True when the template's image has a root disk (`template.rootfs_image`) for qemu.
fn has_root_disk(t: &super::TemplateConfig) -> bool {
    t.image
        .as_deref()
        .is_some_and(|i| matches!(crate::engine::qemu::root_disk(i), Ok(Some(_))))
}

/// `path` with symlinks resolved; for a path that does not exist yet (a fresh data_dir),
/// its nearest existing ancestor resolved plus the rest.
fn real_path(path: &Path) -> Option<PathBuf> {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        if let Ok(real) = at.canonicalize() {
            return Some(rest.iter().rev().fold(real, |p, c| p.join(c)));
        }
        rest.push(at.file_name()?);
        at = at.parent()?;
    }
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
