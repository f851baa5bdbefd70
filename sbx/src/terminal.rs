//! Our own terminal during `sbx shell` / `sbx exec -t`: raw mode behind a guard that puts
//! the saved settings back however sbx leaves (return, error, panic, a signal turned into
//! a return), and the window size to pass on.

use std::io::IsTerminal;
use std::os::fd::BorrowedFd;
use std::sync::Mutex;

use nix::sys::termios::{self, SetArg, Termios};

/// The settings to restore, for the panic hook (which cannot reach the guard).
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

fn stdin_fd() -> BorrowedFd<'static> {
    // SAFETY: fd 0 stays open for the whole life of sbx.
    unsafe { BorrowedFd::borrow_raw(libc::STDIN_FILENO) }
}

/// Raw mode on our stdin until dropped. Keystrokes (Ctrl-C included: ISIG is off, so
/// the byte goes to the sandbox's terminal, not a signal to sbx) pass through untouched.
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    /// Saves the current settings and switches to raw mode; fails when stdin is not a
    /// terminal.
    pub fn enter() -> std::io::Result<RawMode> {
        if !std::io::stdin().is_terminal() {
            return Err(std::io::Error::other(
                "stdin is not a terminal (a pty session needs one)",
            ));
        }
        let saved = termios::tcgetattr(stdin_fd()).map_err(std::io::Error::from)?;
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved.clone());
        install_panic_hook();
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(stdin_fd(), SetArg::TCSAFLUSH, &raw).map_err(std::io::Error::from)?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // TCSADRAIN: the remote's last bytes reach the screen before the modes change.
        let _ = termios::tcsetattr(stdin_fd(), SetArg::TCSADRAIN, &self.saved);
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A panic restores the terminal before the message is printed, so the message is
/// readable and the shell behind sbx is usable even under `panic = "abort"`.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(saved) = SAVED.lock().unwrap_or_else(|e| e.into_inner()).take() {
                let _ = termios::tcsetattr(stdin_fd(), SetArg::TCSANOW, &saved);
            }
            previous(info);
        }));
    });
}

/// Our window's size as (rows, cols); 24 x 80 when it cannot be read or is zero
/// (a terminal that never set it).
pub fn window_size() -> (u32, u32) {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    for fd in [libc::STDIN_FILENO, libc::STDOUT_FILENO] {
        // SAFETY: TIOCGWINSZ writes one winsize into a pointer valid for the call.
        let r = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
        if r == 0 && ws.ws_row > 0 && ws.ws_col > 0 {
            return (ws.ws_row.into(), ws.ws_col.into());
        }
    }
    (24, 80)
}
