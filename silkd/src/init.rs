//! PID-1 duties, done only when silkd is the VM's init: mount the basic filesystems
//! (cgroup2 included, for per-command cgroups), load the image's kernel modules, bring up
//! `lo`, name the virtio-serial ports, and, for a template with a root disk, switch
//! root into an overlay of that read-only disk and a private tmpfs (`switch_to_disk`).
//! Orphans are reaped by the normal reaper (`proc::reaper`), which collects every child.
//!
//! Every step logs and carries on when it fails: a half-set-up guest that still answers
//! is easier to debug than a kernel panic from init exiting.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// Where the image lists the modules to load, one path per line, in load order.
pub const MODULES_LIST: &str = "/etc/silkd/modules";

/// Where PID 1 mounts cgroup2; silkd's default `--cgroup` as init.
pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// `--disk-mib` when not given: `[sizes.X] disk_mib`'s default.
pub const DEFAULT_DISK_MIB: u64 = 512;
/// Largest `--disk-mib` (1 TiB): a bound on a number that becomes a mount option.
pub const MAX_DISK_MIB: u64 = 1 << 20;
/// In the initramfs: the tmpfs holding the writable layer, and the read-only disk under it.
const LAYERS: &str = "/.layers";
/// In the initramfs: where the overlay is assembled before it becomes `/`.
const NEW_ROOT: &str = "/.root";
/// How long the root disk may take to appear after `virtio_blk` loads (it probes
/// synchronously; this is slack for a slow TCG host, not an expected wait).
const DEVICE_WAIT: Duration = Duration::from_secs(10);

/// The template's root disk, from `--root-disk` and `--disk-mib`.
#[derive(Debug, Clone, Copy)]
pub struct RootDisk<'a> {
    /// The block device holding the erofs image (`/dev/vda`).
    pub device: &'a Path,
    /// Size of the writable layer in MiB.
    pub disk_mib: u64,
}

/// Runs every PID-1 duty, in order. Returns the cgroup2 mount when it succeeded.
pub fn pid1_duties() -> Option<PathBuf> {
    mount_basics();
    let cgroup = mount_cgroup2();
    load_modules(Path::new(MODULES_LIST));
    if let Err(e) = bring_up_loopback() {
        tracing::warn!("bringing up lo: {e}");
    }
    link_virtio_ports();
    cgroup
}

fn mount_cgroup2() -> Option<PathBuf> {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    if let Err(e) = std::fs::create_dir_all(CGROUP_MOUNT) {
        tracing::warn!("mkdir {CGROUP_MOUNT}: {e}");
    }
    match mount(
        Some("cgroup2"),
        CGROUP_MOUNT,
        Some("cgroup2"),
        flags,
        None::<&str>,
    ) {
        Ok(()) => Some(PathBuf::from(CGROUP_MOUNT)),
        Err(e) => {
            tracing::warn!("mount cgroup2 on {CGROUP_MOUNT}: {e}");
            None
        }
    }
}

fn mount_basics() {
    let nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let mounts: [(&str, &str, &str, MsFlags, Option<&str>); 6] = [
        ("proc", "/proc", "proc", nodev, None),
        ("sysfs", "/sys", "sysfs", nodev, None),
        (
            "devtmpfs",
            "/dev",
            "devtmpfs",
            MsFlags::MS_NOSUID,
            Some("mode=0755"),
        ),
        (
            "devpts",
            "/dev/pts",
            "devpts",
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("gid=5,mode=620,ptmxmode=666"),
        ),
        (
            "tmpfs",
            "/tmp",
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=1777"),
        ),
        (
            "tmpfs",
            "/run",
            "tmpfs",
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0755"),
        ),
    ];
    for (src, target, fstype, flags, data) in mounts {
        if let Err(e) = std::fs::create_dir_all(target) {
            tracing::warn!("mkdir {target}: {e}");
        }
        if let Err(e) = mount(Some(src), target, Some(fstype), flags, data) {
            tracing::warn!("mount {fstype} on {target}: {e}");
        }
    }
}

fn load_modules(list: &Path) {
    let text = match std::fs::read_to_string(list) {
        Ok(t) => t,
        Err(e) => {
            tracing::info!("no module list at {}: {e}", list.display());
            return;
        }
    };
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        match load_module(Path::new(line)) {
            Ok(()) => tracing::debug!("loaded {line}"),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => tracing::warn!("loading module {line}: {e}"),
        }
    }
}

fn load_module(path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    let params = CString::default();
    // SAFETY: finit_module takes an open fd, a NUL-terminated parameter string and flags;
    // both outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_finit_module,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            params.as_ptr(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn bring_up_loopback() -> std::io::Result<()> {
    // SAFETY: a plain socket(2) call; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we own.
    let result = unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
    };
    // SAFETY: fd is ours and open.
    unsafe { libc::close(fd) };
    result
}

/// Mounts `disk.device` (erofs) read-only, a tmpfs of `disk.disk_mib` for the writable
/// layer, the overlay of both, moves `/dev` (with `/dev/pts`), `/proc` and `/sys` (with
/// the cgroup2 mount) into it, binds `/usr` read-only, and makes it `/` (move onto `/` and chroot: `pivot_root`
/// refuses the initramfs). `/tmp` and `/run` are the overlay's own, so every write a
/// command can make outside `/dev` counts against the one `disk_mib` bound. silkd is
/// already running from the initramfs, so it keeps serving from memory.
///
/// Unlike the other duties a failure here is returned: a template guest that silently
/// served busybox instead of its tree would be worse than a boot error with the reason
/// on the console.
pub fn switch_to_disk(disk: &RootDisk<'_>) -> std::io::Result<()> {
    let ctx = |what: String| move |e: nix::Error| std::io::Error::other(format!("{what}: {e}"));
    let deadline = Instant::now() + DEVICE_WAIT;
    while !disk.device.exists() {
        if Instant::now() > deadline {
            return Err(std::io::Error::other(format!(
                "root disk {} did not appear within {DEVICE_WAIT:?} (are virtio_blk, or \
                 virtio_pmem and nd_pmem, in the image's module list?)",
                disk.device.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let layers = Path::new(LAYERS);
    std::fs::create_dir_all(layers)?;
    let size = format!("size={}m,mode=0755", disk.disk_mib);
    mount(
        Some("tmpfs"),
        layers,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(size.as_str()),
    )
    .map_err(ctx(format!("mount tmpfs ({size}) on {LAYERS}")))?;
    let (lower, upper, work) = (
        layers.join("lower"),
        layers.join("upper"),
        layers.join("work"),
    );
    for d in [&lower, &upper, &work] {
        std::fs::create_dir(d)?;
    }
    // A virtio-pmem region (the engine's `template_disk = "pmem"`) is mounted with DAX:
    // files are read straight from the host's pages, with no copy in this guest's cache.
    let dax = disk
        .device
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("pmem"));
    let erofs_opts = dax.then_some("dax=always");
    mount(
        Some(disk.device),
        &lower,
        Some("erofs"),
        MsFlags::MS_RDONLY,
        erofs_opts,
    )
    .map_err(ctx(format!(
        "mount erofs {} read-only{}",
        disk.device.display(),
        if dax { " with dax=always" } else { "" }
    )))?;
    std::fs::create_dir_all(NEW_ROOT)?;
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    mount(
        Some("overlay"),
        NEW_ROOT,
        Some("overlay"),
        MsFlags::empty(),
        Some(options.as_str()),
    )
    .map_err(ctx(format!("mount overlay ({options}) on {NEW_ROOT}")))?;
    let new_root = Path::new(NEW_ROOT);
    for dir in ["/tmp", "/run"] {
        // The initramfs's tmpfs here would be a second, unbounded writable place.
        umount2(dir, MntFlags::MNT_DETACH).map_err(ctx(format!("umount {dir}")))?;
        let inside = new_root.join(&dir[1..]);
        std::fs::create_dir_all(&inside)?;
        let mode = if dir == "/tmp" { 0o1777 } else { 0o755 };
        std::fs::set_permissions(&inside, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    }
    // The template's software is the same in every sandbox: /usr stays read-only even to
    // root, as on the process engine; /etc, /var, the homes and /tmp are the private layer.
    let usr = new_root.join("usr");
    if usr.is_dir() {
        mount(
            Some(&usr),
            &usr,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(ctx("binding /usr".into()))?;
        let ro = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY;
        mount(None::<&str>, &usr, None::<&str>, ro, None::<&str>)
            .map_err(ctx("remounting /usr read-only".into()))?;
    }
    for dir in ["/dev", "/proc", "/sys"] {
        let inside = new_root.join(&dir[1..]);
        std::fs::create_dir_all(&inside)?;
        mount(
            Some(dir),
            &inside,
            None::<&str>,
            MsFlags::MS_MOVE,
            None::<&str>,
        )
        .map_err(ctx(format!("moving {dir} into the new root")))?;
    }
    nix::unistd::chdir(new_root).map_err(ctx(format!("chdir {NEW_ROOT}")))?;
    mount(Some("."), "/", None::<&str>, MsFlags::MS_MOVE, None::<&str>)
        .map_err(ctx("moving the new root onto /".into()))?;
    nix::unistd::chroot(".").map_err(ctx("chroot".into()))?;
    nix::unistd::chdir("/").map_err(ctx("chdir /".into()))?;
    tracing::info!(
        device = %disk.device.display(),
        disk_mib = disk.disk_mib,
        "switched root to the template's disk"
    );
    Ok(())
}

/// udev is absent: create `/dev/virtio-ports/<name>` → `/dev/vportNpM` ourselves. Ports
/// appear a few ms after `virtio_console` loads, so the serial listener calls this again
/// while it waits for its port.
pub fn link_virtio_ports() {
    let Ok(dir) = std::fs::read_dir("/sys/class/virtio-ports") else {
        return;
    };
    let _ = std::fs::create_dir_all("/dev/virtio-ports");
    for entry in dir.flatten() {
        let port = entry.file_name();
        let Ok(name) = std::fs::read_to_string(entry.path().join("name")) else {
            continue;
        };
        let name = name.trim();
        if name.is_empty() || name.contains('/') {
            continue;
        }
        let link = Path::new("/dev/virtio-ports").join(name);
        let target = Path::new("/dev").join(&port);
        let _ = std::fs::remove_file(&link);
        if let Err(e) = std::os::unix::fs::symlink(&target, &link) {
            tracing::warn!("linking {}: {e}", link.display());
        }
    }
}

/// Applies a host session's hello: wall clock, fresh entropy (with a forced reseed, so
/// clones of one snapshot stop sharing RNG output) and hostname. Only as PID 1: a
/// silkd running as a normal process must never touch its host's clock.
pub fn apply_hello(hello: &wire::session::Hello) {
    if std::process::id() != 1 {
        tracing::debug!("not PID 1: ignoring the hello's clock, entropy and hostname");
        return;
    }
    let ts = libc::timespec {
        tv_sec: (hello.time_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (hello.time_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: clock_settime reads the timespec we own.
    if unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } != 0 {
        tracing::warn!("setting the clock: {}", std::io::Error::last_os_error());
    }
    if let Err(e) = add_entropy(&hello.entropy) {
        tracing::warn!("adding entropy: {e}");
    }
    if let Err(e) = nix::unistd::sethostname(&hello.hostname) {
        tracing::warn!("setting hostname: {e}");
    }
}

fn add_entropy(bytes: &[u8; 32]) -> std::io::Result<()> {
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    #[repr(C)]
    struct PoolInfo {
        entropy_count: libc::c_int,
        buf_size: libc::c_int,
        buf: [u8; 32],
    }
    const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
    const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
    let info = PoolInfo {
        entropy_count: 256,
        buf_size: 32,
        buf: *bytes,
    };
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    // SAFETY: RNDADDENTROPY reads a rand_pool_info laid out as above; RNDRESEEDCRNG takes
    // no argument.
    unsafe {
        if libc::ioctl(fd, RNDADDENTROPY, &info) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::ioctl(fd, RNDRESEEDCRNG) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
