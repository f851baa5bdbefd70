//! The file verbs against a real silkd (run as root, like PID 1 in a VM): exact round
//! trips, ranges, appends, interrupted writes that leave nothing, listings, tar out and
//! in with modes and links, hostile archives refused, inotify events from an exec, the
//! typed errors, and the user the verbs act as.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use testkit::silkd::Silkd;
use testkit::silkd_files::{random_bytes, raw_tar, raw_tar_entry, write_req};
use testkit::wait_until;
use wire::files::{FileKind, FsEventKind, List, Mkdir, PathArg, Remove, Rename, Watch};
use wire::{ErrorKind, Request, Response};

fn p(dir: &Path, name: &str) -> String {
    dir.join(name).to_string_lossy().into_owned()
}

/// Temp files silkd left in `dir` (`.silkd-*`).
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".silkd-"))
        .collect()
}

#[tokio::test]
async fn files_round_trip_exactly_with_ranges_and_appends() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = silkd.connect().await;
    for (i, len) in [0usize, 1, 8 * 1024 * 1024 + 1].into_iter().enumerate() {
        let data = random_bytes(len, i as u64);
        let path = p(dir.path(), &format!("sub/f{len}"));
        let stat = c.write_file(write_req(&path), &data).await.unwrap();
        assert_eq!(
            (stat.kind, stat.size, stat.mode),
            (FileKind::File, len as u64, 0o644)
        );
        assert!(
            std::fs::read(&path).unwrap() == data,
            "{len} B differs on disk"
        );
        let (st, back) = c.read_file(&path, 0, None).await.unwrap();
        assert_eq!(st.size, len as u64);
        assert!(back == data, "{len} B differs read back");
    }
    let path = p(dir.path(), "sub/f1");
    // Ranges: inside, clamped at the end, past the end.
    let data = random_bytes(100_000, 7);
    c.write_file(write_req(&path), &data).await.unwrap();
    let (_, part) = c.read_file(&path, 10, Some(1000)).await.unwrap();
    assert_eq!(part, &data[10..1010]);
    let (_, tail) = c.read_file(&path, 99_990, Some(1000)).await.unwrap();
    assert_eq!(tail, &data[99_990..]);
    let (_, none) = c.read_file(&path, 200_000, None).await.unwrap();
    assert!(none.is_empty());
    // Append keeps what is there; a mode given is applied; a replace keeps the mode.
    let mut req = write_req(&path);
    req.append = true;
    req.mode = Some(0o600);
    c.write_file(req, b"tail").await.unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(
        (&on_disk[..100_000], &on_disk[100_000..]),
        (&data[..], &b"tail"[..])
    );
    let st = c.write_file(write_req(&path), b"new").await.unwrap();
    assert_eq!((st.size, st.mode), (3, 0o600));
    assert!(leftovers(&dir.path().join("sub")).is_empty());
}

/// A write whose connection ends before `data_end` (or sends garbage) commits nothing and
/// leaves no temp file; the old contents stay.
#[tokio::test]
async fn interrupted_writes_leave_nothing() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let dir = tempfile::tempdir().unwrap();
    let fresh = p(dir.path(), "fresh");
    let kept = p(dir.path(), "kept");
    std::fs::write(&kept, b"old").unwrap();
    for target in [&fresh, &kept] {
        let mut c = silkd.connect().await;
        c.send(Request::FileWrite(write_req(target))).await;
        c.send(Request::Data {
            data: vec![1; 300_000],
        })
        .await;
        drop(c);
        wait_until(Duration::from_secs(20), "temp file removed", async || {
            leftovers(dir.path())
                .is_empty()
                .then_some(())
                .ok_or("still there")
        })
        .await;
    }
    assert!(!Path::new(&fresh).exists());
    assert_eq!(std::fs::read(&kept).unwrap(), b"old");
    // A request in the middle of a write is a protocol fault: answered, connection closed.
    let mut c = silkd.connect().await;
    c.send(Request::FileWrite(write_req(&fresh))).await;
    c.send(Request::Ps).await;
    assert!(matches!(
        c.recv().await,
        Response::Error {
            kind: ErrorKind::BadRequest,
            ..
        }
    ));
    assert!(c.recv_or_close().await.is_none());
    // The write's thread may still be removing its temp file after the close (and an
    // earlier dropped write may have been read only after the wait above): wait for it.
    wait_until(Duration::from_secs(20), "temp files removed", async || {
        leftovers(dir.path())
            .is_empty()
            .then_some(())
            .ok_or("still there")
    })
    .await;
    assert!(!Path::new(&fresh).exists());
}

#[tokio::test]
async fn tree_verbs_and_typed_errors() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut c = silkd.connect().await;
    let mkdir = |path: String, parents| {
        Request::Mkdir(Mkdir {
            path,
            parents,
            mode: Some(0o750),
            user: None,
        })
    };
    assert!(matches!(
        c.rpc(mkdir(p(d, "a/b/c"), true)).await,
        Response::Done
    ));
    assert_eq!(
        std::fs::metadata(d.join("a/b/c")).unwrap().mode() & 0o777,
        0o750
    );
    assert!(matches!(
        c.rpc(mkdir(p(d, "a/b/c"), true)).await,
        Response::Done
    ));
    let e = c.rpc(mkdir(p(d, "x/y"), false)).await;
    assert!(
        matches!(
            e,
            Response::Error {
                kind: ErrorKind::NotFound,
                ..
            }
        ),
        "{e:?}"
    );
    c.write_file(write_req(&p(d, "a/b/c/f")), b"12345")
        .await
        .unwrap();
    std::os::unix::fs::symlink("../..", d.join("a/b/link")).unwrap();
    let list = |depth| {
        Request::List(List {
            path: p(d, "a"),
            depth,
            user: None,
        })
    };
    c.send(list(1)).await;
    let Response::Entries { entries } = c.recv().await else {
        panic!()
    };
    assert_eq!(
        entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["b"]
    );
    assert!(c.done().await.is_ok());
    c.send(list(3)).await;
    let Response::Entries { entries } = c.recv().await else {
        panic!()
    };
    c.done().await.unwrap();
    let names: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        names,
        [
            ("b", FileKind::Dir),
            ("b/c", FileKind::Dir),
            ("b/link", FileKind::Symlink),
            ("b/c/f", FileKind::File),
        ],
        "a directory's entries, then each subdirectory's"
    );
    assert_eq!(entries[2].target.as_deref(), Some("../.."));
    // Rename, stat (links not followed), remove: a dir without recursive is refused.
    let r = c
        .rpc(Request::Rename(Rename {
            from: p(d, "a/b/c/f"),
            to: p(d, "a/g"),
            user: None,
        }))
        .await;
    assert!(matches!(r, Response::Done), "{r:?}");
    let stat = |path| Request::Stat(PathArg { path, user: None });
    let Response::Stat(st) = c.rpc(stat(p(d, "a/g"))).await else {
        panic!()
    };
    assert_eq!((st.name.as_str(), st.size), ("g", 5));
    let Response::Stat(st) = c.rpc(stat(p(d, "a/b/link"))).await else {
        panic!()
    };
    assert_eq!(st.kind, FileKind::Symlink);
    let remove = |path, recursive| {
        Request::Remove(Remove {
            path,
            recursive,
            user: None,
        })
    };
    let e = c.rpc(remove(p(d, "a"), false)).await;
    assert!(
        matches!(
            e,
            Response::Error {
                kind: ErrorKind::BadRequest,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(matches!(
        c.rpc(remove(p(d, "a"), true)).await,
        Response::Done
    ));
    assert!(
        !d.join("a").exists() && d.exists(),
        "the link was not followed"
    );
    // Missing paths are not_found; bad paths and bad depths bad_request; reading a
    // directory or a FIFO is refused rather than hung.
    for (req, kind) in [
        (stat(p(d, "nope")), ErrorKind::NotFound),
        (stat(String::new()), ErrorKind::BadRequest),
        (stat("a\0b".into()), ErrorKind::BadRequest),
        (stat("/x".repeat(3000)), ErrorKind::BadRequest),
        (list(0), ErrorKind::BadRequest),
        (list(65), ErrorKind::BadRequest),
    ] {
        let mut c = silkd.connect().await;
        let e = c.rpc(req.clone()).await;
        assert!(
            matches!(&e, Response::Error { kind: k, .. } if *k == kind),
            "{req:?}: {e:?}"
        );
    }
    nix::unistd::mkfifo(
        &d.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    for path in [p(d, "fifo"), p(d, ""), p(d, "nope")] {
        let mut c = silkd.connect().await;
        let e = c.read_file(&path, 0, None).await.unwrap_err();
        let want = if path.ends_with("nope") {
            ErrorKind::NotFound
        } else {
            ErrorKind::BadRequest
        };
        assert_eq!(e.0, want, "{path}: {e:?}");
    }
}

#[tokio::test]
async fn directories_travel_as_tar_with_modes_and_links() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let src = tempfile::tempdir().unwrap();
    let s = src.path();
    std::fs::create_dir_all(s.join("n/m")).unwrap();
    std::fs::write(s.join("n/m/run.sh"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(s.join("n/m/run.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
    let big = random_bytes(3 * 1024 * 1024 + 7, 3);
    std::fs::write(s.join("big"), &big).unwrap();
    std::os::unix::fs::symlink("m/run.sh", s.join("n/link")).unwrap();
    let mut c = silkd.connect().await;
    let tar = c.tar_out(&s.to_string_lossy()).await.unwrap();
    let dst = tempfile::tempdir().unwrap();
    let target = dst.path().join("new/tree");
    c.tar_in(&target.to_string_lossy(), &tar).await.unwrap();
    assert_eq!(std::fs::read(target.join("big")).unwrap(), big);
    let m = std::fs::metadata(target.join("n/m/run.sh")).unwrap();
    assert_eq!(m.mode() & 0o777, 0o750);
    assert_eq!(
        std::fs::read_link(target.join("n/link")).unwrap(),
        Path::new("m/run.sh")
    );
    assert!(leftovers(&dst.path().join("new")).is_empty());
    // Into an existing directory: merged.
    c.tar_in(&target.join("n").to_string_lossy(), &tar)
        .await
        .unwrap();
    assert!(target.join("n/big").exists() && target.join("n/m/run.sh").exists());
}

/// Archives that would write outside the directory are refused with `bad_request`;
/// nothing is left at a fresh target and nothing lands outside.
#[tokio::test]
async fn hostile_archives_are_refused() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    use tar::EntryType::*;
    let cases = [
        raw_tar_entry("../evil", Regular, None, b"x"),
        raw_tar_entry("./a/../../evil", Regular, None, b"x"),
        raw_tar_entry("/evil", Regular, None, b"x"),
        // A symlink may point anywhere, but nothing is written through one.
        raw_tar(&[
            raw_tar_entry("link", Symlink, Some(".."), b""),
            raw_tar_entry("link/evil", Regular, None, b"x"),
        ]),
        raw_tar(&[
            raw_tar_entry("a/link", Symlink, Some(&d.to_string_lossy()), b""),
            raw_tar_entry("a/link/evil", Regular, None, b"x"),
        ]),
        raw_tar(&[
            raw_tar_entry("sub/", Directory, None, b""),
            raw_tar_entry("in", Symlink, Some("sub"), b""),
            raw_tar_entry("in/evil", Regular, None, b"x"),
        ]),
        raw_tar(&[
            raw_tar_entry("link", Symlink, Some(&d.to_string_lossy()), b""),
            raw_tar_entry("hard", Link, Some("link/evil"), b""),
        ]),
        raw_tar_entry("hard", Link, Some("../evil"), b""),
        raw_tar_entry("dev", Char, None, b""),
    ];
    for (i, tar) in cases.iter().enumerate() {
        let mut c = silkd.connect().await;
        let target = d.join(format!("t{i}/in"));
        let e = c.tar_in(&target.to_string_lossy(), tar).await.unwrap_err();
        assert_eq!(e.0, ErrorKind::BadRequest, "case {i}: {e:?}");
        assert!(!target.exists(), "case {i}: the target was left");
        assert!(leftovers(&d.join(format!("t{i}"))).is_empty(), "case {i}");
        assert!(!d.join("evil").exists() && !d.join(format!("t{i}/evil")).exists());
    }
    // A symlink already in an existing target is not written through either.
    std::fs::create_dir(d.join("merge")).unwrap();
    std::os::unix::fs::symlink(d, d.join("merge/link")).unwrap();
    let mut c = silkd.connect().await;
    let tar = raw_tar_entry("link/evil", Regular, None, b"x");
    let e = c.tar_in(&p(d, "merge"), &tar).await.unwrap_err();
    assert_eq!(e.0, ErrorKind::BadRequest, "{e:?}");
    assert!(!d.join("evil").exists());
    // Absolute and upward symlinks as entries are kept as they are (a venv's python).
    let mut c = silkd.connect().await;
    let venv = raw_tar(&[
        raw_tar_entry("bin/", Directory, None, b""),
        raw_tar_entry("bin/python", Symlink, Some("/usr/bin/python3"), b""),
        raw_tar_entry("up", Symlink, Some("../.."), b""),
        raw_tar_entry("bin/tool", Regular, None, b"#!/bin/sh\n"),
    ]);
    c.tar_in(&p(d, "venv"), &venv).await.unwrap();
    assert_eq!(
        std::fs::read_link(d.join("venv/bin/python")).unwrap(),
        Path::new("/usr/bin/python3")
    );
    assert_eq!(
        std::fs::read_link(d.join("venv/up")).unwrap(),
        Path::new("../..")
    );
    assert_eq!(
        std::fs::read(d.join("venv/bin/tool")).unwrap(),
        b"#!/bin/sh\n"
    );
    // A truncated archive (connection gone mid-entry) leaves nothing either.
    let mut c = silkd.connect().await;
    let good = raw_tar_entry("f", Regular, None, &[7; 4096]);
    c.send(Request::TarIn(wire::files::TarIn {
        path: p(d, "cut/in"),
        user: None,
    }))
    .await;
    c.send(Request::Data {
        data: good[..1000].to_vec(),
    })
    .await;
    drop(c);
    wait_until(Duration::from_secs(20), "staging removed", async || {
        (d.join("cut").exists() && leftovers(&d.join("cut")).is_empty())
            .then_some(())
            .ok_or("staging still there")
    })
    .await;
    assert!(!d.join("cut/in").exists());
}

#[tokio::test]
async fn a_watch_sees_an_execs_create_write_and_delete() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let dir = tempfile::tempdir().unwrap();
    let mut w = silkd.connect().await;
    w.send(Request::Watch(Watch {
        path: dir.path().to_string_lossy().into_owned(),
        recursive: true,
        user: None,
    }))
    .await;
    assert!(matches!(w.recv().await, Response::Stat(_)));
    let sub = p(dir.path(), "sub");
    let out = silkd.connect().await.run(&["mkdir", &sub]).await;
    assert_eq!(out.code, Some(0));
    // The subdirectory's watch is in place before its create event is sent.
    let Response::Event(e) = w.recv().await else {
        panic!()
    };
    assert_eq!(
        (e.kind, e.path.as_str()),
        (FsEventKind::Create, sub.as_str())
    );
    let f = p(dir.path(), "sub/f");
    let script = format!("echo a > {f} && echo b >> {f} && mv {f} {f}2 && rm {f}2");
    let out = silkd.connect().await.run(&["sh", "-c", &script]).await;
    assert_eq!(out.code, Some(0));
    let mut seen: Vec<(FsEventKind, String)> = Vec::new();
    while seen.last().map(|(k, _)| *k) != Some(FsEventKind::Delete) {
        match w.recv().await {
            // Writes in separate inotify reads are separate events: keep one per run.
            Response::Event(e) if seen.last() == Some(&(e.kind, e.path.clone())) => {}
            Response::Event(e) => seen.push((e.kind, e.path)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        seen,
        [
            (FsEventKind::Create, f.clone()),
            (FsEventKind::Modify, f.clone()),
            (FsEventKind::Rename, format!("{f}2")),
            (FsEventKind::Delete, format!("{f}2")),
        ]
    );
    // The peer leaving ends the watch: silkd's thread notices without an event.
    drop(w);
}

/// As root with `--user nobody`, the verbs act as nobody: files it creates are its own,
/// and a root-only directory refuses it (`permission_denied`); `user: root` overrides.
#[tokio::test]
async fn verbs_act_as_the_templates_user() {
    let silkd = Silkd::start_with(env!("CARGO_BIN_EXE_silkd"), &["--user", "nobody"]).await;
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut c = silkd.connect().await;
    let st = c.write_file(write_req(&p(&open, "mine")), b"x").await;
    assert!(st.is_ok(), "{st:?}");
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    assert_eq!(
        std::fs::metadata(open.join("mine")).unwrap().uid(),
        nobody.uid.as_raw()
    );
    std::fs::write(dir.path().join("secret"), b"root only").unwrap();
    std::fs::set_permissions(
        dir.path().join("secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let e = c
        .read_file(&p(dir.path(), "secret"), 0, None)
        .await
        .unwrap_err();
    assert_eq!(e.0, ErrorKind::PermissionDenied, "{e:?}");
    let e = c
        .write_file(write_req(&p(dir.path(), "x")), b"x")
        .await
        .unwrap_err();
    assert_eq!(e.0, ErrorKind::PermissionDenied, "{e:?}");
    let mut c = silkd.connect().await;
    let mut req = write_req(&p(dir.path(), "x"));
    req.user = Some("root".into());
    assert_eq!(c.write_file(req, b"x").await.unwrap().size, 1);
    let mut c = silkd.connect().await;
    let mut req = write_req(&p(dir.path(), "y"));
    req.user = Some("no-such-user".into());
    assert_eq!(
        c.write_file(req, b"x").await.unwrap_err().0,
        ErrorKind::BadRequest
    );
}
