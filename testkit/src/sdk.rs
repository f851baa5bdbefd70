//! For the SDK and `sbx` tests: the prebuilt sandboxd binary with [`Setup::sdk`]-style
//! limits, clients for it, and what runs in a sandbox, asked with a wire `Ps` through the
//! SDK's relay.

use std::time::Duration;

use sandbox_sdk::{Client, ProcState, Sandbox};

use crate::bins;
use crate::daemon::DaemonProcess;
use crate::setup::{Listen, Setup, ROOT};
use crate::wait::{empty, wait_until};

/// sandboxd on a Unix socket with `setup`.
pub async fn start(setup: Setup) -> DaemonProcess {
    DaemonProcess::start_temp(bins::sandboxd(), &setup, Listen::Unix).await
}

/// sandboxd on TCP (port 0) with `setup`.
pub async fn start_tcp(setup: Setup) -> DaemonProcess {
    DaemonProcess::start_temp(bins::sandboxd(), &setup, Listen::Tcp).await
}

impl DaemonProcess {
    /// Its URL as the SDK and `sbx` take it.
    pub fn url(&self) -> String {
        self.endpoint.url()
    }

    /// A client with no token.
    pub fn client(&self) -> Client {
        Client::new(&self.url()).unwrap()
    }

    /// A client with the root token.
    pub fn root(&self) -> Client {
        self.client().with_token(ROOT)
    }
}

/// Pids of the commands still running in the sandbox.
pub async fn running(sandbox: &Sandbox) -> Vec<u32> {
    sandbox
        .processes()
        .await
        .expect("ps over the relay")
        .into_iter()
        .filter(|p| p.state == ProcState::Running)
        .map(|p| p.pid)
        .collect()
}

/// Waits until nothing runs in the sandbox; fails with what still runs.
pub async fn assert_nothing_runs(sandbox: &Sandbox) {
    let what = format!("nothing running in {}", sandbox.id());
    wait_until(Duration::from_secs(10), &what, async || {
        empty(running(sandbox).await)
    })
    .await
}
