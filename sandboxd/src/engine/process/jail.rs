//! What one sandbox is made of, before bwrap runs: bwrap's arguments (the filesystem the
//! sandbox sees, its namespaces, sizes, seccomp) and the steps the launcher's child takes
//! between fork and exec (join the cgroups, stage the host files bwrap must bind, become
//! the sandbox's unprivileged identity). Nothing here spawns or waits.
//!
//! Why staging: bwrap runs as the sandbox's uid, which cannot traverse `data_dir` (0700)
//! nor, often, the directories above a template's rootfs; and bwrap resolves every bind
//! source by path as that uid. So the child, still root, enters a private mount namespace
//! (nothing propagates back to the host), mounts a small tmpfs on [`STAGE_MOUNT`] and
//! binds there exactly what this sandbox may see: the rootfs, its own socket directory,
//! silkd's files. bwrap then binds from that staging tree, and the sandbox's uid never
//! needs a path into the node.

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::silkd_files::SilkdFiles;
use crate::template::TemplateMeta;

/// An empty, world-traversable directory; each launcher mounts its own private staging
/// tmpfs on it (inside its own mount namespace, so launchers never see each other's).
pub const STAGE_MOUNT: &str = "/run/sandboxd-stage";
/// Inside the sandbox: the directory holding silkd's socket, and the socket.
pub const SOCK_DIR: &str = "/run/silkd";
pub const SOCK_NAME: &str = "silkd.sock";
/// Inside the sandbox: the work directory of a template without metadata (a plain rootfs,
/// `base`), on the size-capped `/home`.
pub const WORK_DIR: &str = "/home/sandbox";
/// Inside the sandbox: where the template's own `/home` and `/root` are bound read-only
/// for silkd to seed the fresh tmpfs ones from (`--seed`).
pub const SEED_DIR: &str = "/run/sandboxd-seed";
/// Directories each sandbox gets as its own size-capped tmpfs.
const TMPFS: [&str; 5] = ["/dev/shm", "/tmp", "/run", "/home", "/root"];
/// Of those, the ones seeded from the template's tree.
const SEEDED: [&str; 2] = ["home", "root"];
/// The fds bwrap reads its info and seccomp programs from, in the child.
pub const INFO_FD: i32 = 3;
pub const SECCOMP_FDS: [i32; 2] = [4, 5];
/// Inside the sandbox: where its delegated cgroup2 directory is bound.
pub const CGROUP_DIR: &str = "/sys/fs/cgroup";
/// Rootfs entries the sandbox gets its own of instead (fresh proc, dev and tmpfs; `/sys`
/// holds only the delegated cgroup, never the host's sysfs).
const OWN_MOUNTS: [&str; 7] = ["proc", "dev", "tmp", "run", "home", "root", "sys"];
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Everything that decides one sandbox's bwrap command.
pub struct Inputs<'a> {
    pub id: &'a str,
    /// The sandbox's directory on the host (`data_dir/sandboxes/ID`).
    pub dir: &'a Path,
    pub rootfs: &'a Path,
    pub silkd: &'a SilkdFiles,
    /// Size of each tmpfs the sandbox writes, in bytes.
    pub tmpfs_bytes: u64,
    /// The unprivileged host uid/gid to run as; `None` runs as sandboxd's own user.
    pub identity: Option<(u32, u32)>,
    pub seccomp: bool,
    /// The sandbox's delegated cgroup2 directory: bound at [`CGROUP_DIR`] and given to
    /// silkd (`--cgroup`), which runs each command in a child cgroup of it.
    pub cgroup2: Option<&'a Path>,
    /// The template's user, workdir and env.
    pub meta: &'a TemplateMeta,
    /// Whether sandboxd runs as root (without a user namespace of its own, silkd can
    /// then still switch to the template's user).
    pub root: bool,
}

/// bwrap's arguments, and what the child does before exec.
pub struct Plan {
    pub args: Vec<OsString>,
    pub stage: Option<Stage>,
}

/// The pre-exec steps, with every path already a C string: between fork and exec the
/// child may only make syscalls, never allocate.
pub struct Stage {
    dirs: Vec<CString>,
    files: Vec<CString>,
    /// (source, target, recursive).
    binds: Vec<(CString, CString, bool)>,
    mount: CString,
    uid: u32,
    gid: u32,
}

impl Plan {
    /// Builds the plan; reads the rootfs's top-level entries (once per sandbox: a template's
    /// tree may change between sandboxes).
    pub fn new(inp: &Inputs) -> std::io::Result<Plan> {
        let sock = inp.dir.join("sock");
        let mut stage: Option<Stage> = inp.identity.map(|(uid, gid)| Stage {
            dirs: Vec::new(),
            files: Vec::new(),
            binds: Vec::new(),
            mount: CString::new(STAGE_MOUNT).expect("no NUL"),
            uid,
            gid,
        });
        // Where bwrap finds the rootfs, the socket dir and silkd's files: the host paths
        // themselves, or their staged binds. The staging tree repeats the sandbox's host
        // path so the launcher's command line still names it (tests and sweeps find a
        // sandbox's processes by its data_dir).
        let base = Path::new(STAGE_MOUNT).join(inp.dir.strip_prefix("/").unwrap_or(inp.dir));
        let (root_src, sock_src, file_srcs, cgroup_src) = match &mut stage {
            None => (
                inp.rootfs.to_path_buf(),
                sock.clone(),
                inp.silkd
                    .binds()
                    .into_iter()
                    .map(|(host, _)| host)
                    .collect(),
                inp.cgroup2.map(Path::to_path_buf),
            ),
            Some(st) => {
                let mut at = PathBuf::from(STAGE_MOUNT);
                for part in base.strip_prefix(STAGE_MOUNT).unwrap_or(&base).components() {
                    at.push(part);
                    st.dirs.push(c_path(&at)?);
                }
                for sub in ["root", "sock", "files", "cgroup"] {
                    st.dirs.push(c_path(&base.join(sub))?);
                }
                if let Some(cg) = inp.cgroup2 {
                    st.binds
                        .push((c_path(cg)?, c_path(&base.join("cgroup"))?, false));
                }
                st.binds
                    .push((c_path(inp.rootfs)?, c_path(&base.join("root"))?, true));
                st.binds
                    .push((c_path(&sock)?, c_path(&base.join("sock"))?, false));
                let mut srcs = Vec::new();
                for (i, (host, _)) in inp.silkd.binds().into_iter().enumerate() {
                    let staged = base.join("files").join(i.to_string());
                    st.files.push(c_path(&staged)?);
                    st.binds.push((c_path(&host)?, c_path(&staged)?, false));
                    srcs.push(staged);
                }
                let cgroup_src = inp.cgroup2.map(|_| base.join("cgroup"));
                (base.join("root"), base.join("sock"), srcs, cgroup_src)
            }
        };

        let mut a = Args::default();
        // No `--die-with-parent`: sandboxes outlive sandboxd (a restart re-adopts them);
        // cleanup goes through the sandbox's cgroup and recorded pids instead.
        a.push(["--new-session", "--unshare-all"]);
        // Who silkd (and so every command) is inside: the template's user, else root.
        let (uid, gid) = inp.meta.user.as_ref().map_or((0, 0), |u| (u.uid, u.gid));
        if inp.identity.is_some() {
            // A user namespace of its own mapping exactly one id, the sandbox's host uid,
            // to the template's user (root without one, as in a VM); no capabilities, no
            // further user namespaces (the seccomp filter denies them too). One id means
            // silkd cannot switch users here: a request for another user is a 400 (a
            // per-sandbox uid block would lift that; see docs/templates.md).
            a.push(["--unshare-user", "--disable-userns"]);
            a.push(["--uid", &uid.to_string(), "--gid", &gid.to_string()]);
        }
        a.push(["--cap-drop", "ALL"]);
        // The rootfs, read-only, entry by entry onto bwrap's own root, so the mount points
        // below need not exist in it and `--remount-ro /` seals the rest.
        let mut entries: Vec<_> = std::fs::read_dir(inp.rootfs)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name();
            if OWN_MOUNTS.iter().any(|m| OsStr::new(m) == name) {
                continue;
            }
            let inside = Path::new("/").join(&name);
            if e.file_type()?.is_symlink() {
                let target = std::fs::read_link(e.path())?;
                a.push([
                    OsStr::new("--symlink"),
                    target.as_os_str(),
                    inside.as_os_str(),
                ]);
            } else {
                let src = root_src.join(&name);
                a.push([OsStr::new("--ro-bind"), src.as_os_str(), inside.as_os_str()]);
            }
        }
        let size = inp.tmpfs_bytes.to_string();
        a.push(["--proc", "/proc", "--dev", "/dev"]);
        let home = inp.meta.home();
        let under_tmpfs = |p: &str| {
            TMPFS
                .iter()
                .any(|t| p == *t || p.strip_prefix(t).is_some_and(|r| r.starts_with('/')))
        };
        for tmpfs in TMPFS {
            // /tmp and /dev/shm sticky and world-writable, as on any system: whoever
            // commands run as can use them.
            let perms = if matches!(tmpfs, "/tmp" | "/dev/shm") {
                "1777"
            } else {
                "0755"
            };
            a.push(["--perms", perms, "--size", &size, "--tmpfs", tmpfs]);
        }
        // HOME is always writable: under one of the tmpfs above, or a tmpfs of its own.
        if !under_tmpfs(home) {
            a.push(["--size", &size, "--tmpfs", home]);
        }
        let workdir = match (&inp.meta.workdir, &inp.meta.user) {
            (Some(w), _) => w.as_str(),
            (None, Some(_)) => home,
            (None, None) => WORK_DIR,
        };
        a.push(["--remount-ro", "/dev", "--dir", home]);
        if under_tmpfs(workdir) {
            a.push(["--dir", workdir]);
        }
        let mut seeds = Vec::new();
        for name in SEEDED {
            if inp.rootfs.join(name).is_dir() {
                let inside = format!("{SEED_DIR}/{name}");
                a.push([
                    OsStr::new("--ro-bind"),
                    root_src.join(name).as_os_str(),
                    OsStr::new(&inside),
                ]);
                seeds.push(format!("{inside}:/{name}"));
            }
        }
        a.push([
            OsStr::new("--bind"),
            sock_src.as_os_str(),
            OsStr::new(SOCK_DIR),
        ]);
        if let Some(src) = &cgroup_src {
            a.push([
                OsStr::new("--bind"),
                src.as_os_str(),
                OsStr::new(CGROUP_DIR),
            ]);
        }
        for (src, (_, inside)) in file_srcs.iter().zip(inp.silkd.binds()) {
            a.push([
                OsStr::new("--ro-bind"),
                src.as_os_str(),
                OsStr::new(&inside),
            ]);
        }
        let hostname = format!("sbx-{}", &inp.id[..inp.id.len().min(12)]);
        a.push(["--remount-ro", "/", "--hostname", &hostname]);
        a.push(["--chdir", workdir, "--setenv", "HOME", home]);
        a.push(["--setenv", "PATH", PATH, "--info-fd", &INFO_FD.to_string()]);
        if inp.seccomp {
            for fd in SECCOMP_FDS {
                a.push(["--add-seccomp-fd", &fd.to_string()]);
            }
        }
        a.push(["--"]);
        a.push(inp.silkd.command());
        a.push(["--listen", &format!("unix:{SOCK_DIR}/{SOCK_NAME}")]);
        if cgroup_src.is_some() {
            a.push(["--cgroup", CGROUP_DIR]);
        }
        for seed in &seeds {
            a.push(["--seed", seed]);
        }
        // The template user's flags only where silkd runs as that user (its namespace
        // maps it) or may become it (root); otherwise every command would be refused.
        let mut flags = inp.meta.silkd_args();
        if inp.identity.is_none() && !inp.root {
            if let Some(i) = flags.iter().position(|f| f == "--user") {
                flags.drain(i..i + 2);
            }
        }
        if inp.meta.workdir.is_none() {
            flags.extend(["--workdir".to_string(), workdir.to_string()]);
        }
        a.push(flags);
        Ok(Plan { args: a.0, stage })
    }
}

impl Stage {
    /// In the forked child, as root: a private mount namespace with the staging tree,
    /// then the sandbox's identity (no supplementary groups). Syscalls only.
    pub fn enter(&self) -> std::io::Result<()> {
        let check = |r: libc::c_int| {
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        };
        // SAFETY: plain syscalls on C strings built before the fork; nothing allocates.
        unsafe {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Private first, so nothing mounted below propagates to the host.
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"sandboxd-stage".as_ptr(),
                self.mount.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0755,size=1m".as_ptr().cast(),
            ))?;
            for dir in &self.dirs {
                check(libc::mkdir(dir.as_ptr(), 0o755))?;
            }
            for file in &self.files {
                let fd = libc::open(
                    file.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                );
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            for (src, dst, recursive) in &self.binds {
                let rec = if *recursive { libc::MS_REC } else { 0 };
                check(libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | rec,
                    std::ptr::null(),
                ))?;
            }
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setresgid(self.gid, self.gid, self.gid))?;
            check(libc::setresuid(self.uid, self.uid, self.uid))?;
        }
        Ok(())
    }
}

/// bwrap's argument list under construction.
#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn push<S: AsRef<OsStr>>(&mut self, items: impl IntoIterator<Item = S>) -> &mut Self {
        self.0
            .extend(items.into_iter().map(|s| s.as_ref().to_os_string()));
        self
    }
}

fn c_path(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in a path"))
}
