//! The process engine's seccomp filter: the syscalls a sandbox never needs, compiled once
//! to BPF with `seccompiler` and handed to bwrap (`--add-seccomp-fd`), which loads it after
//! setting no_new_privs, right before it execs silkd; every command silkd starts inherits
//! it. It is a denylist on top of what namespaces, dropped capabilities and the
//! unprivileged uid already forbid: it closes kernel surface those leave open to any user.
//!
//! Denied calls fail with EPERM, so programs print a clear error instead of dying;
//! `clone3` fails with ENOSYS, because its flags sit in memory a filter cannot read and
//! libc falls back to `clone` (whose flags it can) only on ENOSYS. Any other architecture
//! (32-bit `int 0x80` calls) kills the process: seccompiler's arch check.

use std::collections::BTreeMap;
use std::io::{Seek, Write};
use std::os::fd::OwnedFd;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::error::{Error, Result};

/// Denied outright, each with why a sandbox has no business calling it.
pub const DENIED: &[(&str, i64, &str)] = &[
    ("init_module", libc::SYS_init_module, "kernel modules"),
    ("finit_module", libc::SYS_finit_module, "kernel modules"),
    ("delete_module", libc::SYS_delete_module, "kernel modules"),
    ("kexec_load", libc::SYS_kexec_load, "replacing the kernel"),
    (
        "kexec_file_load",
        libc::SYS_kexec_file_load,
        "replacing the kernel",
    ),
    ("reboot", libc::SYS_reboot, "the host's power"),
    (
        "bpf",
        libc::SYS_bpf,
        "eBPF: a large, often exploited surface",
    ),
    (
        "perf_event_open",
        libc::SYS_perf_event_open,
        "perf events leak host data",
    ),
    (
        "add_key",
        libc::SYS_add_key,
        "the kernel keyring is not namespaced",
    ),
    (
        "request_key",
        libc::SYS_request_key,
        "the kernel keyring is not namespaced",
    ),
    (
        "keyctl",
        libc::SYS_keyctl,
        "the kernel keyring is not namespaced",
    ),
    (
        "userfaultfd",
        libc::SYS_userfaultfd,
        "a staple of kernel exploits",
    ),
    (
        "io_uring_setup",
        libc::SYS_io_uring_setup,
        "io_uring: a frequent source of kernel exploits",
    ),
    ("io_uring_enter", libc::SYS_io_uring_enter, "io_uring"),
    ("io_uring_register", libc::SYS_io_uring_register, "io_uring"),
    ("mount", libc::SYS_mount, "sandboxes never mount"),
    ("umount2", libc::SYS_umount2, "sandboxes never mount"),
    ("pivot_root", libc::SYS_pivot_root, "sandboxes never mount"),
    ("move_mount", libc::SYS_move_mount, "sandboxes never mount"),
    ("open_tree", libc::SYS_open_tree, "sandboxes never mount"),
    ("fsopen", libc::SYS_fsopen, "sandboxes never mount"),
    ("fsconfig", libc::SYS_fsconfig, "sandboxes never mount"),
    ("fsmount", libc::SYS_fsmount, "sandboxes never mount"),
    ("fspick", libc::SYS_fspick, "sandboxes never mount"),
    (
        "mount_setattr",
        libc::SYS_mount_setattr,
        "sandboxes never mount",
    ),
    ("setns", libc::SYS_setns, "joining other namespaces"),
    ("swapon", libc::SYS_swapon, "the host's swap"),
    ("swapoff", libc::SYS_swapoff, "the host's swap"),
    ("acct", libc::SYS_acct, "process accounting"),
    ("quotactl", libc::SYS_quotactl, "disk quotas"),
    ("quotactl_fd", libc::SYS_quotactl_fd, "disk quotas"),
    ("iopl", libc::SYS_iopl, "raw I/O ports"),
    ("ioperm", libc::SYS_ioperm, "raw I/O ports"),
    (
        "lookup_dcookie",
        libc::SYS_lookup_dcookie,
        "profiling internals",
    ),
    ("syslog", libc::SYS_syslog, "the host's kernel log"),
    ("settimeofday", libc::SYS_settimeofday, "the host's clock"),
    ("clock_settime", libc::SYS_clock_settime, "the host's clock"),
    ("clock_adjtime", libc::SYS_clock_adjtime, "the host's clock"),
    ("adjtimex", libc::SYS_adjtimex, "the host's clock"),
    // The pid namespace and the sandbox's own uid already keep ptrace inside its tree;
    // denied anyway because sandboxes rarely need a debugger and tracing widens the
    // kernel surface (process_vm_* read and write other processes' memory).
    ("ptrace", libc::SYS_ptrace, "tracing processes"),
    (
        "process_vm_readv",
        libc::SYS_process_vm_readv,
        "other processes' memory",
    ),
    (
        "process_vm_writev",
        libc::SYS_process_vm_writev,
        "other processes' memory",
    ),
    (
        "open_by_handle_at",
        libc::SYS_open_by_handle_at,
        "opens files past mounts",
    ),
    (
        "name_to_handle_at",
        libc::SYS_name_to_handle_at,
        "file handles (see open_by_handle_at)",
    ),
    ("uselib", libc::SYS_uselib, "obsolete"),
    ("nfsservctl", libc::SYS_nfsservctl, "obsolete"),
    ("_sysctl", libc::SYS__sysctl, "obsolete"),
    ("vhangup", libc::SYS_vhangup, "the host's terminals"),
];

/// Namespace flags `clone` and `unshare` may not carry: no new user namespace (the one
/// door to capabilities for an unprivileged process), nor any other.
const NAMESPACE_FLAGS: [(&str, i32); 7] = [
    ("CLONE_NEWUSER", libc::CLONE_NEWUSER),
    ("CLONE_NEWNS", libc::CLONE_NEWNS),
    ("CLONE_NEWPID", libc::CLONE_NEWPID),
    ("CLONE_NEWNET", libc::CLONE_NEWNET),
    ("CLONE_NEWUTS", libc::CLONE_NEWUTS),
    ("CLONE_NEWIPC", libc::CLONE_NEWIPC),
    ("CLONE_NEWCGROUP", libc::CLONE_NEWCGROUP),
];

/// x32 ABI calls are the same calls with this bit set in the number and pass the x86_64
/// arch check; each denied number is denied with it too.
const X32_SYSCALL_BIT: i64 = 0x4000_0000;

/// Both compiled programs, as the bytes bwrap reads (`struct sock_filter` in order).
pub struct Filters {
    programs: [Vec<u8>; 2],
}

impl Filters {
    /// Compiles the filters for x86_64, the only architecture the engine runs on.
    pub fn compile() -> Result<Filters> {
        let fail = |e: seccompiler::BackendError| Error::Engine(format!("seccomp filter: {e}"));
        let mut denied: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        for (_, nr, _) in DENIED {
            denied.insert(*nr, Vec::new());
        }
        for (nr, arg) in [(libc::SYS_clone, 0), (libc::SYS_unshare, 0)] {
            let rules = NAMESPACE_FLAGS
                .iter()
                .map(|(_, flag)| {
                    let flag = u64::from(*flag as u32);
                    SeccompRule::new(vec![SeccompCondition::new(
                        arg,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::MaskedEq(flag),
                        flag,
                    )?])
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(fail)?;
            denied.insert(nr, rules);
        }
        let eperm =
            compile(with_x32(denied), SeccompAction::Errno(libc::EPERM as u32)).map_err(fail)?;
        let clone3 = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
        let enosys =
            compile(with_x32(clone3), SeccompAction::Errno(libc::ENOSYS as u32)).map_err(fail)?;
        Ok(Filters {
            programs: [to_bytes(&eperm), to_bytes(&enosys)],
        })
    }

    /// One memfd per program, at offset 0, for bwrap's `--add-seccomp-fd` (bwrap reads
    /// each to its end, so every sandbox gets fresh ones).
    pub fn memfds(&self) -> std::io::Result<Vec<OwnedFd>> {
        self.programs
            .iter()
            .map(|bytes| {
                let fd = nix::sys::memfd::memfd_create(
                    c"sandbox-seccomp",
                    nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
                )?;
                let mut file = std::fs::File::from(fd);
                file.write_all(bytes)?;
                file.rewind()?;
                Ok(OwnedFd::from(file))
            })
            .collect()
    }
}

fn with_x32(rules: BTreeMap<i64, Vec<SeccompRule>>) -> BTreeMap<i64, Vec<SeccompRule>> {
    let x32: Vec<_> = rules
        .iter()
        .map(|(nr, r)| (nr | X32_SYSCALL_BIT, r.clone()))
        .collect();
    rules.into_iter().chain(x32).collect()
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    on_match: SeccompAction,
) -> std::result::Result<BpfProgram, seccompiler::BackendError> {
    SeccompFilter::new(rules, SeccompAction::Allow, on_match, TargetArch::x86_64)?.try_into()
}

/// `struct sock_filter { u16 code; u8 jt; u8 jf; u32 k; }` in native byte order.
fn to_bytes(program: &BpfProgram) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for ins in program {
        bytes.extend_from_slice(&ins.code.to_ne_bytes());
        bytes.extend_from_slice(&[ins.jt, ins.jf]);
        bytes.extend_from_slice(&ins.k.to_ne_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_for_x86_64_with_every_denied_call() {
        let filters = Filters::compile().unwrap();
        let [eperm, enosys] = &filters.programs;
        assert_eq!(eperm.len() % 8, 0);
        assert!(!enosys.is_empty());
        // Every denied number (and its x32 twin) appears as a jump target constant.
        let constants: Vec<u32> = eperm
            .chunks(8)
            .map(|c| u32::from_ne_bytes(c[4..8].try_into().unwrap()))
            .collect();
        for (name, nr, _) in DENIED {
            assert!(constants.contains(&(*nr as u32)), "{name} missing");
            assert!(
                constants.contains(&((nr | X32_SYSCALL_BIT) as u32)),
                "{name} x32"
            );
        }
        for nr in [libc::SYS_clone, libc::SYS_unshare] {
            assert!(constants.contains(&(nr as u32)));
        }
        // The basics a sandbox needs are not in the list.
        for nr in [
            libc::SYS_read,
            libc::SYS_execve,
            libc::SYS_kill,
            libc::SYS_setsid,
        ] {
            assert!(!DENIED.iter().any(|(_, d, _)| *d == nr));
        }
    }

    /// The filter really denies: loaded in a forked child (seccomp is per process and
    /// permanent), `unshare(CLONE_NEWUSER)` and `mount` fail with EPERM, `clone3` with
    /// ENOSYS, and `unshare(CLONE_FS)` and `getpid` still work.
    #[test]
    fn loaded_it_answers_eperm_and_enosys() {
        let filters = Filters::compile().unwrap();
        let program = |bytes: &Vec<u8>| -> BpfProgram {
            bytes
                .chunks(8)
                .map(|c| seccompiler::sock_filter {
                    code: u16::from_ne_bytes([c[0], c[1]]),
                    jt: c[2],
                    jf: c[3],
                    k: u32::from_ne_bytes(c[4..8].try_into().unwrap()),
                })
                .collect()
        };
        let (eperm, enosys) = (program(&filters.programs[0]), program(&filters.programs[1]));
        // SAFETY: the child only makes raw syscalls and exits with _exit; the parent waits.
        match unsafe { libc::fork() } {
            0 => {
                let code = (|| {
                    // SAFETY: plain syscalls with valid arguments.
                    unsafe {
                        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                            return 10;
                        }
                        if seccompiler::apply_filter(&eperm).is_err()
                            || seccompiler::apply_filter(&enosys).is_err()
                        {
                            return 11;
                        }
                        let errno = || *libc::__errno_location();
                        if libc::unshare(libc::CLONE_NEWUSER) != -1 || errno() != libc::EPERM {
                            return 12;
                        }
                        let m = libc::mount(
                            c"none".as_ptr(),
                            c"/".as_ptr(),
                            c"tmpfs".as_ptr(),
                            0,
                            std::ptr::null(),
                        );
                        if m != -1 || errno() != libc::EPERM {
                            return 13;
                        }
                        if libc::syscall(libc::SYS_clone3, 0, 0) != -1 || errno() != libc::ENOSYS {
                            return 14;
                        }
                        if libc::unshare(libc::CLONE_FS) != 0 || libc::getpid() <= 0 {
                            return 15;
                        }
                    }
                    0
                })();
                // SAFETY: leaving the forked child without running the test harness's code.
                unsafe { libc::_exit(code) }
            }
            pid if pid > 0 => {
                let mut status = 0;
                // SAFETY: waiting for our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                assert!(libc::WIFEXITED(status), "child status {status}");
                assert_eq!(libc::WEXITSTATUS(status), 0, "failed check (see codes)");
            }
            _ => panic!("fork failed"),
        }
    }
}
