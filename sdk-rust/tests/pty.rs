//! Pseudo-terminal commands through the SDK's relay against a real sandboxd (process
//! engine, real silkd): a controlling terminal, resize, Ctrl-C, the exit code, and what
//! the SDK and the guest refuse.

use sandbox_sdk::{ClaimOptions, Command, Error, ExitStatus};
use testkit::pty::read_process_until;
use testkit::sdk::assert_nothing_runs;
use testkit::{bounded, Setup};

#[tokio::test]
async fn pty_through_the_relay() {
    let d = testkit::sdk::start(Setup::sdk()).await;
    bounded(async {
        let sandbox = d.root().claim(ClaimOptions::new()).await.unwrap();

        let mut shell = sandbox
            .spawn(&Command::new("sh").pty(24, 80).term("vt100"))
            .await
            .unwrap();
        let mut keys = shell.stdin().expect("a pty command always has stdin");
        // Markers are computed by the shell, so the terminal's echo of the typed line
        // cannot satisfy a wait.
        keys.send(b"tty; echo $TERM; stty size; echo m$((0+1))\n")
            .await
            .unwrap();
        let screen = read_process_until(&mut shell, "m1\r\n").await;
        assert!(screen.contains("/dev/pts/"), "{screen:?}");
        assert!(screen.contains("vt100\r\n"), "{screen:?}");
        assert!(screen.contains("24 80\r\n"), "{screen:?}");
        shell.resize(50, 120).await.unwrap();
        keys.send(b"stty size; echo m$((0+2))\n").await.unwrap();
        let screen = read_process_until(&mut shell, "m2\r\n").await;
        assert!(screen.contains("50 120\r\n"), "{screen:?}");
        // What the SDK refuses before sending: the guest would end the command.
        for (rows, cols) in [(0, 80), (24, 5000)] {
            let refused = shell.resize(rows, cols).await;
            assert!(matches!(refused, Err(Error::BadRequest(_))), "{refused:?}");
        }
        keys.send(b"exit 42\n").await.unwrap();
        assert_eq!(shell.wait().await.unwrap(), ExitStatus::Code(42));

        // Ctrl-C is a byte on the terminal; the line discipline makes it SIGINT.
        let mut sleeper = sandbox
            .spawn(&Command::new("sleep").arg("600").pty(24, 80))
            .await
            .unwrap();
        sleeper.stdin().unwrap().send(&[0x03]).await.unwrap();
        assert_eq!(
            sleeper.wait().await.unwrap(),
            ExitStatus::Signal(sandbox_sdk::Signal::Int.number())
        );

        // Hostile sizes and names are the guest's bad_request; nothing starts.
        for cmd in [
            Command::new("true").pty(0, 80),
            Command::new("true").pty(24, u32::MAX),
            Command::new("true").pty(24, 80).term("../../etc/passwd"),
        ] {
            let refused = sandbox.spawn(&cmd).await;
            assert!(matches!(refused, Err(Error::BadRequest(_))), "{refused:?}");
        }
        // No terminal in a buffered exec; no resize without a terminal.
        let refused = sandbox.exec(&Command::new("true").pty(24, 80)).await;
        assert!(matches!(refused, Err(Error::BadRequest(_))), "{refused:?}");
        let plain = sandbox
            .spawn(&Command::new("sleep").arg("600"))
            .await
            .unwrap();
        let refused = plain.resize(24, 80).await;
        assert!(matches!(refused, Err(Error::BadRequest(_))), "{refused:?}");
        drop(plain);
        assert_nothing_runs(&sandbox).await;
        sandbox.release().await.unwrap();
    })
    .await
}
