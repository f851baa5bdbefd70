//! Commands as a user through a real silkd run as root: `--user`, `--workdir`, `--env`
//! defaults, a request's `user` (name or uid), supplementary groups, the environment
//! each user gets, and unknown users answered `bad_request`. Accounts come from the
//! host's /etc/passwd here (silkd reads its root's, which in a sandbox is the template's).

use testkit::silkd::Silkd;
use wire::{ErrorKind, Request, Response};

fn as_user(argv: &[&str], user: Option<&str>, env: &[(&str, &str)]) -> Request {
    Request::Exec {
        detach: false,
        pty: None,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: None,
        env: Some(
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        stdin: false,
        timeout_ms: None,
        user: user.map(Into::into),
    }
}

fn text(out: &testkit::silkd::Outcome) -> String {
    assert_eq!(
        out.code,
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[tokio::test]
async fn template_defaults_and_requested_users() {
    let silkd = Silkd::start_with(
        env!("CARGO_BIN_EXE_silkd"),
        &[
            "--user",
            "nobody",
            "--workdir",
            "/tmp",
            "--env",
            "FROM_TEMPLATE=t",
            "--env",
            "SHARED=template",
        ],
    )
    .await;
    let mut c = silkd.connect().await;
    // The template's user, workdir and env, and the environment that goes with the user.
    let script = "id -u; id -g; pwd; echo $HOME $USER $LOGNAME $LANG $FROM_TEMPLATE $SHARED";
    let out = c
        .exec(as_user(
            &["sh", "-c", script],
            None,
            &[("SHARED", "request")],
        ))
        .await;
    assert_eq!(
        text(&out),
        "65534\n65534\n/tmp\n/nonexistent nobody nobody C.UTF-8 t request\n"
    );
    // A request's user by name and by uid; root gets its home and its groups.
    for who in ["root", "0"] {
        let out = c
            .exec(as_user(
                &["sh", "-c", "id -u; echo $HOME $USER"],
                Some(who),
                &[],
            ))
            .await;
        assert_eq!(text(&out), "0\n/root root\n", "{who}");
    }
    let out = c.exec(as_user(&["id", "-u"], Some("65534"), &[])).await;
    assert_eq!(text(&out), "65534\n");
}

/// Supplementary groups are the user's from /etc/group (initgroups), not silkd's.
#[tokio::test]
async fn supplementary_groups_follow_etc_group() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    let out = c.exec(as_user(&["id", "-G"], Some("nobody"), &[])).await;
    let want = String::from_utf8(
        std::process::Command::new("id")
            .args(["-G", "nobody"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(text(&out), want);
}

/// Unknown users and hostile names are `bad_request`, and silkd serves on.
#[tokio::test]
async fn unknown_and_hostile_users_are_bad_requests() {
    let silkd = Silkd::start(env!("CARGO_BIN_EXE_silkd")).await;
    let mut c = silkd.connect().await;
    for who in ["no-such-user-here", "4000000000", "", "root:x", "a\nb"] {
        match c.rpc(as_user(&["true"], Some(who), &[])).await {
            Response::Error { kind, message } => {
                assert_eq!(kind, ErrorKind::BadRequest, "{who:?}: {message}")
            }
            other => panic!("{who:?}: {other:?}"),
        }
    }
    let out = c.exec(as_user(&["true"], None, &[])).await;
    assert_eq!(out.code, Some(0));
}

/// A template naming a user its tree lacks stops silkd at start, naming the user.
#[test]
fn an_unknown_default_user_stops_silkd() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_silkd"))
        .args([
            "--listen",
            "unix:/nonexistent/s.sock",
            "--user",
            "no-such-user-here",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-user-here"), "{err}");
}
