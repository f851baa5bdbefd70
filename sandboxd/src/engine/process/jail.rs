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
//!
//! The stage also mounts the sandbox's one writable tmpfs (`disk_mib` in all, owned by
//! its namespace's root) and binds its subdirectories at `/home`, `/root`, `/tmp`, `/run`
//! and `/dev/shm`: bwrap's `--tmpfs` would give each its own `disk_mib`, and bwrap binds
//! only from host paths, never from a tmpfs it mounted itself.

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
/// Directories each sandbox writes: subdirectories of its one writable tmpfs when staged
/// (else a size-capped tmpfs each), with their modes.
const TMPFS: [(&str, u32); 5] = [
    ("/dev/shm", 0o1777),
    ("/tmp", 0o1777),
    ("/run", 0o755),
    ("/home", 0o755),
    ("/root", 0o700),
];
/// In the writable tmpfs: the directory a HOME outside [`TMPFS`] is bound from.
const OWN_HOME: &str = "own-home";
/// Capabilities silkd keeps inside a sandbox with a uid block, in the sandbox's own user
/// namespace only (none in the host's): what root commands need to act as root on the
/// sandbox's files and processes, and to switch users. Never CAP_SYS_ADMIN (mounts,
/// namespaces), CAP_NET_ADMIN/RAW, CAP_SYS_PTRACE or CAP_MKNOD. A capability in a user
/// namespace covers only objects of that namespace and files owned by its mapped ids.
const ROOT_CAPS: [&str; 9] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_NET_BIND_SERVICE",
];
/// Of those, the ones seeded from the template's tree.
const SEEDED: [&str; 2] = ["home", "root"];
/// The fds bwrap reads its info and seccomp programs from, in the child.
pub const INFO_FD: i32 = 3;
pub const SECCOMP_FDS: [i32; 2] = [4, 5];
/// The fd bwrap joins the sandbox's prepared user namespace from (`--userns`).
pub const USERNS_FD: i32 = 6;
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
    /// Size of the sandbox's writable tmpfs in bytes (of each one, when not staged).
    pub tmpfs_bytes: u64,
    /// The first unprivileged host uid/gid of the sandbox's block: bwrap runs as it, in
    /// the user namespace at [`USERNS_FD`] that maps the block (see `userns.rs`). `None`
    /// runs as sandboxd's own user.
    pub identity: Option<(u32, u32)>,
    pub seccomp: bool,
    /// The sandbox's delegated cgroup2 directory: bound at [`CGROUP_DIR`] and given to
    /// silkd (`--cgroup`), which runs each command in a child cgroup of it.
    pub cgroup2: Option<&'a Path>,
    /// The template's user, workdir and env.
    pub meta: &'a TemplateMeta,
    /// The template's `detach_ring_bytes` (silkd's `--detach-ring`).
    pub detach_ring: Option<u64>,
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
    /// The writable tmpfs: where, its mount options, and its subdirectories with modes.
    rw: CString,
    rw_opts: CString,
    rw_dirs: Vec<(CString, u32)>,
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
            rw: CString::default(),
            rw_opts: CString::new(format!(
                "size={},mode=0755,uid={uid},gid={gid}",
                inp.tmpfs_bytes
            ))
            .expect("no NUL"),
            rw_dirs: Vec::new(),
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
                for sub in ["root", "sock", "files", "cgroup", "rw"] {
                    st.dirs.push(c_path(&base.join(sub))?);
                }
                st.rw = c_path(&base.join("rw"))?;
                for (inside, mode) in TMPFS {
                    st.rw_dirs
                        .push((c_path(&base.join("rw").join(rw_name(inside)))?, mode));
                }
                if !under_tmpfs(inp.meta.home()) {
                    st.rw_dirs
                        .push((c_path(&base.join("rw").join(OWN_HOME))?, 0o755));
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
        a.push(["--new-session"]);
        if inp.identity.is_some() {
            // The prepared user namespace mapping the sandbox's block (its root is the
            // block's first uid, never the host's root); silkd runs as its root with
            // ROOT_CAPS there and switches to the template's user per command. No
            // further user namespaces: the seccomp filter denies CLONE_NEWUSER, and the
            // namespace's max_user_namespaces is 0 (userns.rs; bwrap's --disable-userns
            // needs --unshare-user). Nothing holds CAP_SYS_ADMIN.
            a.push(["--userns", &USERNS_FD.to_string()]);
            a.push(["--unshare-ipc", "--unshare-pid", "--unshare-net"]);
            a.push(["--unshare-uts", "--unshare-cgroup"]);
            a.push(["--cap-drop", "ALL"]);
            for cap in ROOT_CAPS {
                a.push(["--cap-add", cap]);
            }
        } else {
            a.push(["--unshare-all", "--cap-drop", "ALL"]);
        }
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
        let rw = stage.as_ref().map(|_| base.join("rw"));
        for (inside, mode) in TMPFS {
            match &rw {
                // One tmpfs for all: disk_mib bounds what the sandbox writes in total.
                Some(rw) => {
                    let src = rw.join(rw_name(inside));
                    a.push([OsStr::new("--bind"), src.as_os_str(), OsStr::new(inside)]);
                }
                // /tmp and /dev/shm sticky and world-writable, as on any system.
                None => {
                    let perms = format!("{mode:04o}");
                    a.push(["--perms", &perms, "--size", &size, "--tmpfs", inside]);
                }
            }
        }
        // HOME is always writable: under one of the directories above, or its own.
        if !under_tmpfs(home) {
            match &rw {
                Some(rw) => {
                    let src = rw.join(OWN_HOME);
                    a.push([OsStr::new("--bind"), src.as_os_str(), OsStr::new(home)]);
                }
                None => {
                    a.push(["--size", &size, "--tmpfs", home]);
                }
            }
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
        flags.extend(crate::template::detach_ring_args(inp.detach_ring));
        // silkd (root in the namespace) seeds and bwrap makes these as root: the
        // template's user gets its home, and a workdir elsewhere in the writable tree.
        if stage.is_some() && inp.meta.user.as_ref().is_some_and(|u| u.uid != 0) {
            flags.extend(["--own".to_string(), home.to_string()]);
            if under_tmpfs(workdir) && !Path::new(workdir).starts_with(home) {
                flags.extend(["--own".to_string(), workdir.to_string()]);
            }
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
            check(libc::mount(
                c"sandbox-rw".as_ptr(),
                self.rw.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                self.rw_opts.as_ptr().cast(),
            ))?;
            // Owned by the block's first uid: root inside the sandbox.
            for (dir, mode) in &self.rw_dirs {
                check(libc::mkdir(dir.as_ptr(), 0o700))?;
                check(libc::chown(dir.as_ptr(), self.uid, self.gid))?;
                check(libc::chmod(dir.as_ptr(), *mode))?;
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

/// True when `p` is one of [`TMPFS`] or below one.
fn under_tmpfs(p: &str) -> bool {
    TMPFS
        .iter()
        .any(|(t, _)| p == *t || p.strip_prefix(t).is_some_and(|r| r.starts_with('/')))
}

/// The writable tmpfs's subdirectory for one of [`TMPFS`]: its last component.
fn rw_name(inside: &str) -> &str {
    inside.rsplit('/').next().unwrap_or(inside)
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
