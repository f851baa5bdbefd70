//! silkd entry point: parse flags, do PID-1 duties when we are init, then serve.

use std::io::Write;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let mut args = silkd::Args::parse();
    silkd::init_logging();
    if std::process::id() == 1 {
        if let Some(cgroup) = silkd::init::pid1_duties() {
            args.cgroup.get_or_insert(cgroup);
        }
        if let Some(device) = args.root_disk.as_deref() {
            let disk = silkd::init::RootDisk {
                device,
                disk_mib: args.disk_mib,
            };
            if let Err(e) = silkd::init::switch_to_disk(&disk) {
                // Init exiting panics the kernel: the boot fails with this on the console.
                let _ = writeln!(
                    std::io::stderr(),
                    "silkd: switching root to {}: {e}",
                    device.display()
                );
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    match silkd::serve_blocking(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Not eprintln!: it panics when stderr cannot be written (a full disk).
            let _ = writeln!(std::io::stderr(), "silkd: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
