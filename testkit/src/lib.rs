//! Test support for the workspace's integration tests: everything a test needs to run
//! the real binaries and clean up after them, in one place.
//!
//! # Layout
//! - [`bins`]: where the prebuilt `silkd`, `sandboxd`, `sbx` and examples are; tests
//!   never build anything themselves.
//! - [`wait`]: [`wait_until`], the one bounded polling loop, and [`bounded`].
//! - [`guard`]: [`ChildGuard`], a spawned process that is stopped, reaped and swept up
//!   when the test ends, even by a panic.
//! - [`procs`]: reading `/proc`: processes by command line or group, states, signals.
//! - [`prometheus`]: reading `/metrics`: one series' value, a histogram's buckets checked.
//! - [`host`]: host objects seen from outside: cgroup limits, reading as another
//!   user, mapped files.
//! - [`hostile`]: misbehaving clients over raw TCP (idle, slow headers, unfinished
//!   bodies, unread answers) and what to observe them by.
//! - [`http`]: one HTTP/1.1 request to a sandboxd, over TCP or a Unix socket.
//! - [`files_http`]: the file routes with binary bodies, and an upload cut off halfway.
//! - [`files_stream`]: 1 GiB transfers generated and hashed on the fly, `/fs/watch`'s
//!   Server-Sent Events, and what watches cost silkd (threads, inotify fds).
//! - [`relay`]: asking sandboxd for a relay (the upgrade) on a raw connection.
//! - [`ports`]: port tunnels from a client: an HTTP GET over any byte stream, and
//!   `sbx port-forward` running with the address it listens on.
//! - [`setup`]: the test node's config and tokens.
//! - [`daemon`]: a real sandboxd, in-process ([`Daemon`]) or as the binary
//!   ([`DaemonProcess`]), and its HTTP API ([`Api`]).
//! - [`etcd`]: a real etcd cluster on loopback: members killed and restarted one by one.
//! - [`cluster`]: sandboxd nodes in one cluster (`[cluster]` over a test etcd), and what
//!   a test reads off it.
//! - [`silkd`]: a real silkd on a Unix socket and a frame client for it.
//! - [`restart`]: the restart tests' view of a daemon's state database (records, engine
//!   handles, tampering as an attacker or a crash would), processes by start time, and a
//!   relayed `Info`.
//! - [`silkd_files`]: the file verbs spoken to a real silkd, random contents, hostile tars.
//! - [`trees`]: local trees with many files, modes and symlinks, compared exactly.
//! - [`sdk`]: the SDK tests' daemon and what runs in a sandbox, asked through the SDK.
//! - [`detach`]: detached commands through the SDK: the counter re-attached, a small ring.
//! - [`vm`]: what the VM tests need from the host (QEMU, the guest image).
//! - [`leftovers`]: counting a process-engine daemon's processes, sandbox dirs, sockets
//!   and cgroups before and after an attack.
//! - [`cgroup2`]: a fresh cgroup2 directory for one test, removed with its contents.
//! - [`tmpfs`]: a small tmpfs of a test's own, and a filler that makes it full.
//! - [`overlay_root`]: a shell script chrooted into a throwaway overlay of `/`, to
//!   install packages without touching the host.
#![deny(missing_docs)]

pub mod bins;
pub mod certs;
pub mod cgroup2;
pub mod cluster;
pub mod daemon;
pub mod detach;
pub mod e2b;
pub mod etcd;
pub mod files_http;
pub mod files_stream;
pub mod guard;
pub mod host;
pub mod hostile;
pub mod http;
pub mod images;
pub mod leftovers;
pub mod overlay_root;
pub mod ports;
pub mod procs;
pub mod prometheus;
pub mod pty;
pub mod relay;
pub mod restart;
pub mod sdk;
pub mod setup;
pub mod silkd;
pub mod silkd_files;
pub mod snapshots;
pub mod tmpfs;
pub mod tmux;
pub mod trees;
pub mod vm;
pub mod vm_disk;
pub mod vm_leftovers;
pub mod wait;

pub use daemon::{Api, Daemon, DaemonProcess};
pub use guard::ChildGuard;
pub use http::{call, try_call, Endpoint, Resp};
pub use setup::{Listen, Setup, ROOT, TENANT_A, TENANT_B};
pub use silkd::Silkd;
pub use wait::{bounded, wait_until};
