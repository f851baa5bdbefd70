//! Running external programs (cargo, apt-get, dpkg-deb, file, busybox, id) so that every
//! failure names the program, its arguments and, where captured, its stderr.

use std::ffi::OsString;
use std::io;
use std::process::{Command, Stdio};

use crate::{Error, Result};

/// The cargo that started us (cargo sets `CARGO` for `cargo run` and for tests).
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo")))
}

/// Runs `cmd` with the terminal's stdin/stdout/stderr, so its output streams live.
pub fn stream(step: &'static str, cmd: &mut Command) -> Result<()> {
    let command = display(cmd);
    eprintln!("xtask: {step}: {command}");
    let status = cmd
        .status()
        .map_err(|e| spawn_error(cmd, command.clone(), e))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::StepFailed {
            step,
            command,
            status,
        })
    }
}

/// Runs `cmd` to completion and returns its stdout; a failure carries its stderr.
pub fn output(cmd: &mut Command) -> Result<String> {
    let command = display(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| spawn_error(cmd, command.clone(), e))?;
    if !out.status.success() {
        return Err(Error::ToolFailed {
            command,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    String::from_utf8(out.stdout)
        .map_err(|_| Error::Invalid(format!("`{command}` printed output that is not UTF-8")))
}

/// Whether `tool` is a file in one of PATH's directories.
pub fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| dir.join(tool).is_file())
}

/// Fails naming the first of `tools` that is not on PATH.
pub fn require(tools: &[&str]) -> Result<()> {
    for tool in tools {
        if !on_path(tool) {
            return Err(Error::MissingTool {
                tool: tool.to_string(),
                hint: install_hint(tool),
            });
        }
    }
    Ok(())
}

fn spawn_error(cmd: &Command, command: String, source: io::Error) -> Error {
    if source.kind() == io::ErrorKind::NotFound {
        let tool = cmd.get_program().to_string_lossy().into_owned();
        let hint = install_hint(&tool);
        Error::MissingTool { tool, hint }
    } else {
        Error::Spawn { command, source }
    }
}

fn install_hint(tool: &str) -> &'static str {
    match tool {
        "file" | "bwrap" | "mmdebstrap" | "mkfs.erofs" => "`cargo xtask deps` installs it",
        "apt-get" | "apt-cache" | "dpkg-deb" => {
            "the image is built from Debian packages: run on Debian 12"
        }
        "cargo" => "install Rust with rustup",
        _ => "install it; `cargo xtask deps` installs what the tests need",
    }
}

/// The command as a shell-like line, with the environment variables it sets.
fn display(cmd: &Command) -> String {
    let mut parts: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| {
            Some(format!(
                "{}={:?}",
                k.to_string_lossy(),
                v?.to_string_lossy()
            ))
        })
        .collect();
    parts.push(cmd.get_program().to_string_lossy().into_owned());
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_template_tool_names_its_fix() {
        for tool in ["mmdebstrap", "mkfs.erofs"] {
            assert_eq!(install_hint(tool), "`cargo xtask deps` installs it");
        }
        let e = require(&["sh", "silk-no-such-tool"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`silk-no-such-tool` was not found on PATH"),
            "{e}"
        );
    }
}
