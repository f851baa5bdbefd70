//! Round-trips every message variant against the exact bytes in `wire/fixtures/`, both
//! ways, so any drift in the encoding fails CI. `WIRE_BLESS=1` rewrites the corpus.

use std::path::PathBuf;

use wire::files::{
    FileEntry, FileKind, FileRead, FileWrite, FsEvent, FsEventKind, List, Mkdir, PathArg, Remove,
    Rename, TarIn, Watch,
};
use wire::{decode_frame, encode_frame, ErrorKind, ProcInfo, ProcState, Request, Response};

fn file_requests() -> Vec<(&'static str, Request)> {
    let user = Some("user".to_string());
    vec![
        (
            "req_file_read",
            Request::FileRead(FileRead {
                path: "/home/user/a.bin".into(),
                offset: 10,
                length: Some(100),
                user: None,
            }),
        ),
        (
            "req_file_write",
            Request::FileWrite(FileWrite {
                path: "out/b.txt".into(),
                mode: Some(0o600),
                append: false,
                parents: true,
                user: user.clone(),
            }),
        ),
        (
            "req_data",
            Request::Data {
                data: vec![0, 0xff, b'x'],
            },
        ),
        ("req_data_end", Request::DataEnd),
        (
            "req_stat",
            Request::Stat(PathArg {
                path: "/etc/hostname".into(),
                user: None,
            }),
        ),
        (
            "req_list",
            Request::List(List {
                path: "/home/user".into(),
                depth: 2,
                user: None,
            }),
        ),
        (
            "req_mkdir",
            Request::Mkdir(Mkdir {
                path: "a/b/c".into(),
                parents: true,
                mode: None,
                user: None,
            }),
        ),
        (
            "req_remove",
            Request::Remove(Remove {
                path: "/tmp/x".into(),
                recursive: true,
                user: None,
            }),
        ),
        (
            "req_rename",
            Request::Rename(Rename {
                from: "/tmp/x".into(),
                to: "/tmp/y".into(),
                user: None,
            }),
        ),
        (
            "req_tar_out",
            Request::TarOut(PathArg {
                path: "/home/user/project".into(),
                user,
            }),
        ),
        (
            "req_tar_in",
            Request::TarIn(TarIn {
                path: "/home/user/project".into(),
                user: None,
            }),
        ),
        (
            "req_watch",
            Request::Watch(Watch {
                path: "/home/user".into(),
                recursive: false,
                user: None,
            }),
        ),
    ]
}

fn file_responses() -> Vec<(&'static str, Response)> {
    vec![
        (
            "resp_stat",
            Response::Stat(FileEntry {
                name: "a.bin".into(),
                kind: FileKind::File,
                size: 1 << 33,
                mode: 0o644,
                mtime: 1_767_225_600,
                target: None,
            }),
        ),
        (
            "resp_entries",
            Response::Entries {
                entries: vec![
                    FileEntry {
                        name: "sub".into(),
                        kind: FileKind::Dir,
                        size: 4096,
                        mode: 0o755,
                        mtime: 0,
                        target: None,
                    },
                    FileEntry {
                        name: "sub/link".into(),
                        kind: FileKind::Symlink,
                        size: 3,
                        mode: 0o777,
                        mtime: -1,
                        target: Some("../x".into()),
                    },
                ],
            },
        ),
        (
            "resp_data",
            Response::Data {
                data: vec![1, 2, 3, 0],
            },
        ),
        (
            "resp_event",
            Response::Event(FsEvent {
                kind: FsEventKind::Rename,
                path: "/home/user/new".into(),
                from: Some("/home/user/old".into()),
            }),
        ),
        (
            "resp_error_no_space",
            Response::error(ErrorKind::NoSpace, "writing /x: No space left on device"),
        ),
    ]
}

fn requests() -> Vec<(&'static str, Request)> {
    vec![
        (
            "req_exec",
            Request::Exec {
                detach: false,
                pty: None,
                argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
                cwd: Some("/tmp".into()),
                env: Some(vec![("LANG".into(), "C.UTF-8".into())]),
                stdin: true,
                timeout_ms: Some(5000),
                user: None,
            },
        ),
        (
            "req_exec_user",
            Request::Exec {
                detach: false,
                pty: None,
                argv: vec!["id".into()],
                cwd: None,
                env: None,
                stdin: false,
                timeout_ms: None,
                user: Some("user".into()),
            },
        ),
        (
            "req_exec_minimal",
            Request::Exec {
                detach: false,
                pty: None,
                argv: vec!["true".into()],
                cwd: None,
                env: None,
                stdin: false,
                timeout_ms: None,
                user: None,
            },
        ),
        (
            "req_stdin",
            Request::Stdin {
                data: vec![0, 1, 2, 0xff, b'\n'],
            },
        ),
        ("req_stdin_close", Request::StdinClose),
        (
            "req_exec_pty",
            Request::Exec {
                detach: false,
                argv: vec!["bash".into(), "-l".into()],
                cwd: None,
                env: None,
                stdin: false,
                timeout_ms: None,
                user: None,
                pty: Some(wire::Pty {
                    rows: 24,
                    cols: 80,
                    term: Some("xterm-256color".into()),
                }),
            },
        ),
        (
            "req_exec_detach",
            Request::Exec {
                argv: vec![
                    "sh".into(),
                    "-c".into(),
                    "while true; do date; sleep 1; done".into(),
                ],
                cwd: None,
                env: None,
                stdin: true,
                timeout_ms: None,
                user: None,
                pty: None,
                detach: true,
            },
        ),
        ("req_attach", Request::Attach { pid: 4242 }),
        (
            "req_resize",
            Request::Resize {
                rows: 50,
                cols: 132,
            },
        ),
        (
            "req_kill",
            Request::Kill {
                pid: 4242,
                signal: Some(15),
            },
        ),
        (
            "req_kill_default",
            Request::Kill {
                pid: 7,
                signal: None,
            },
        ),
        ("req_ps", Request::Ps),
        ("req_info", Request::Info),
        ("req_connect", Request::Connect { port: 8000 }),
    ]
    .into_iter()
    .chain(file_requests())
    .collect()
}

fn responses() -> Vec<(&'static str, Response)> {
    vec![
        ("resp_started", Response::Started { pid: 4242 }),
        (
            "resp_stdout",
            Response::Stdout {
                data: b"hello\n\xff\x00".to_vec(),
            },
        ),
        (
            "resp_stderr",
            Response::Stderr {
                data: b"oops\n".to_vec(),
            },
        ),
        (
            "resp_exit_code",
            Response::Exit {
                code: Some(3),
                signal: None,
                timed_out: false,
            },
        ),
        (
            "resp_exit_signal",
            Response::Exit {
                code: None,
                signal: Some(9),
                timed_out: true,
            },
        ),
        ("resp_done", Response::Done),
        (
            "resp_procs",
            Response::Procs {
                procs: vec![
                    ProcInfo {
                        pid: 10,
                        argv: vec!["sleep".into(), "600".into()],
                        state: ProcState::Running,
                        code: None,
                        signal: None,
                        started_ms: None,
                        detached: false,
                        dropped: None,
                    },
                    ProcInfo {
                        pid: 11,
                        argv: vec!["true".into()],
                        state: ProcState::Exited,
                        code: Some(0),
                        signal: None,
                        started_ms: None,
                        detached: false,
                        dropped: None,
                    },
                ],
            },
        ),
        (
            "resp_procs_detached",
            Response::Procs {
                procs: vec![ProcInfo {
                    pid: 12,
                    argv: vec!["python3".into(), "-m".into(), "http.server".into()],
                    state: ProcState::Running,
                    code: None,
                    signal: None,
                    started_ms: Some(1_796_000_000_000),
                    detached: true,
                    dropped: Some(4096),
                }],
            },
        ),
        (
            "resp_info",
            Response::Info {
                version: "0.1.0".into(),
                proto: 1,
                uptime_ms: 1234,
                procs: 2,
            },
        ),
        (
            "resp_error",
            Response::error(ErrorKind::NotFound, "no process with pid 99"),
        ),
    ]
    .into_iter()
    .chain(file_responses())
    .collect()
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(format!("{name}.bin"))
}

fn check<T>(name: &str, value: &T)
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug + Clone,
{
    let path = fixture(name);
    let encoded = encode_frame(value.clone()).expect("encode");
    if std::env::var_os("WIRE_BLESS").is_some() {
        std::fs::write(&path, &encoded).expect("write fixture");
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "fixture {} missing ({e}); run with WIRE_BLESS=1",
            path.display()
        )
    });
    assert_eq!(
        encoded, expected,
        "{name}: encoding drifted from the fixture"
    );
    let decoded: T = decode_frame(&expected).expect("decode fixture");
    assert_eq!(&decoded, value, "{name}: fixture decodes to another value");
}

#[test]
fn every_request_matches_its_fixture() {
    for (name, req) in requests() {
        check(name, &req);
    }
}

#[test]
fn every_response_matches_its_fixture() {
    for (name, resp) in responses() {
        check(name, &resp);
    }
}

#[test]
fn corpus_has_no_stray_files() {
    let mut names: Vec<String> = requests()
        .iter()
        .map(|(n, _)| n.to_string())
        .chain(responses().iter().map(|(n, _)| n.to_string()))
        .collect();
    names.sort();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    // `hostile/` holds the refused frames (`tests/hostile.rs`), not messages.
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .expect("fixtures dir")
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, names);
}

/// File messages refuse unknown fields inside the wrapped struct, like every message.
#[test]
fn file_messages_refuse_unknown_fields() {
    let mut bytes = encode_frame(Request::Stat(PathArg {
        path: "/x".into(),
        user: None,
    }))
    .unwrap();
    // Swap the field name "path" for "pbth": an unknown field, same length.
    let at = bytes.windows(4).position(|w| w == b"path").unwrap();
    bytes[at + 1] = b'b';
    assert!(decode_frame::<Request>(&bytes).is_err());
}

#[test]
fn payloads_are_messagepack_bin() {
    let bytes = encode_frame(Response::Stdout {
        data: vec![0xAB; 3],
    })
    .unwrap();
    // bin8 marker 0xc4, length 3, then the raw bytes: never an array of integers.
    let needle = [0xc4, 3, 0xAB, 0xAB, 0xAB];
    assert!(
        bytes.windows(needle.len()).any(|w| w == needle),
        "{bytes:02x?}"
    );
}
