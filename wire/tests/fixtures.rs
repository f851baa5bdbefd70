//! Round-trips every message variant against the exact bytes in `wire/fixtures/`, both
//! ways, so any drift in the encoding fails CI. `WIRE_BLESS=1` rewrites the corpus.

use std::path::PathBuf;

use wire::{decode_frame, encode_frame, ErrorKind, ProcInfo, ProcState, Request, Response};

fn requests() -> Vec<(&'static str, Request)> {
    vec![
        (
            "req_exec",
            Request::Exec {
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
    ]
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
                    },
                    ProcInfo {
                        pid: 11,
                        argv: vec!["true".into()],
                        state: ProcState::Exited,
                        code: Some(0),
                        signal: None,
                    },
                ],
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
