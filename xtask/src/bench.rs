//! `cargo xtask bench <name>`: one subcommand per benchmark, each a cargo build or run
//! of an example whose output streams through. Add a variant to [`Bench`] and an arm to
//! [`run`]; any other name is refused with the known list. docs/benchmarks.md records
//! the figures.

use clap::Subcommand;

use crate::{image, tool, workspace_root, Error, Result};

#[derive(Subcommand)]
pub enum Bench {
    /// silkd's exec round trip over its Unix socket next to a local fork+exec+wait (ratio).
    Exec,
    /// sandboxd's memory under 50 concurrent 8 MiB buffered execs, and warm claim time.
    ExecMemory,
    /// Real VMs through sandboxd (qemu engine); builds the guest image first.
    Vm,
    /// Templates on the qemu engine: `default` (root disk) vs `base`: clone-to-ready,
    /// memory per idle clone, first python3/node with and without a warmup, and the
    /// cached build time of `default`; builds both images first.
    Templates,
    /// The process engine's exec round trip with and without its seccomp filter and
    /// per-sandbox identity (as root); builds the guest image first.
    Isolation,
    /// Re-adoption after `kill -9` and restart, against a restart with none: 50 claimed
    /// process-engine sandboxes (as root), then 8 claimed VMs (qemu engine); builds the
    /// guest image first.
    Restart,
    /// Soak (process engine): 10,000 buffered execs at concurrency 64 over 8 sandboxes, 5%
    /// of clients hanging up, one sandboxd `kill -9` + restart halfway; prints the counts.
    Soak {
        /// 500 execs instead of 10,000.
        #[arg(long)]
        quick: bool,
        /// No kill -9 + restart.
        #[arg(long)]
        no_restart: bool,
    },
    /// A 1 GiB file in and out of a process-engine sandbox over HTTP and with `sbx cp`,
    /// against a local `cp` and pipe; 1,000 small files as a directory (as root); builds
    /// the guest image first.
    Files,
    /// Snapshots on the qemu engine: snapshot time, fork-to-ready next to a golden
    /// clone, memory per idle fork, hibernate time and memory freed, wake to first exec;
    /// builds the guest image first.
    Snapshots,
    /// Three process-engine nodes over a 3-member etcd (as root): claim and exec latency
    /// through the owner vs another node, claim throughput of 3 nodes vs 1, and the time
    /// to report a `kill -9`ed node's sandbox lost; builds the guest image first.
    Cluster,
    /// Any name that is not a known benchmark.
    #[command(external_subcommand)]
    Unknown(Vec<String>),
}

pub fn run(which: Bench) -> Result<()> {
    let root = workspace_root();
    match which {
        Bench::Exec => {
            tool::stream(
                "build",
                tool::cargo()
                    .args(["build", "--release", "-p", "silkd", "--bins", "--examples"])
                    .current_dir(&root),
            )?;
            tool::stream(
                "bench exec",
                std::process::Command::new(root.join("target/release/examples/exec_rtt"))
                    .arg(root.join("target/release/silkd"))
                    .arg("1000")
                    .current_dir(&root),
            )
        }
        Bench::ExecMemory => {
            image::run(&image::Args::default())?;
            run_example("bench exec-memory", "bench_exec_memory")
        }
        Bench::Isolation | Bench::Restart | Bench::Files | Bench::Cluster => {
            image::run(&image::Args::default())?;
            tool::stream(
                "build",
                tool::cargo()
                    .args([
                        "build",
                        "--release",
                        "-p",
                        "silkd",
                        "-p",
                        "sandboxd",
                        "-p",
                        "sbx",
                        "--bins",
                    ])
                    .current_dir(&root),
            )?;
            match which {
                Bench::Restart => {
                    run_example("bench restart", "bench_restart")?;
                    run_example("bench restart (qemu)", "bench_restart_vm")
                }
                Bench::Files => run_example("bench files", "bench_files"),
                Bench::Cluster => run_example("bench cluster", "bench_cluster"),
                _ => run_example("bench isolation", "bench_isolation"),
            }
        }
        Bench::Vm => {
            image::run(&image::Args::default())?;
            run_example("bench vm", "bench_vm")
        }
        Bench::Snapshots => {
            image::run(&image::Args::default())?;
            run_example("bench snapshots", "bench_snapshots")
        }
        Bench::Templates => {
            image::run(&image::Args::default())?;
            let default = image::Args {
                template: "default".into(),
                ..image::Args::default()
            };
            // The first run builds (cold or not); the second is the cached case.
            image::run(&default)?;
            let t = std::time::Instant::now();
            image::run(&default)?;
            println!(
                "bench templates: cached `cargo xtask image --template default`: {:.2} s",
                t.elapsed().as_secs_f64()
            );
            run_example("bench templates", "bench_templates")
        }
        Bench::Soak { quick, no_restart } => {
            image::run(&image::Args::default())?;
            tool::stream(
                "build",
                tool::cargo()
                    .args([
                        "build",
                        "--release",
                        "-p",
                        "silkd",
                        "-p",
                        "sandboxd",
                        "--bins",
                    ])
                    .current_dir(&root),
            )?;
            let mut cmd = tool::cargo();
            cmd.args([
                "run",
                "--release",
                "-p",
                "sandboxd",
                "--example",
                "bench_soak",
                "--",
            ])
            .current_dir(&root);
            if quick {
                cmd.arg("--quick");
            }
            if no_restart {
                cmd.arg("--no-restart");
            }
            tool::stream("bench soak", &mut cmd)
        }
        Bench::Unknown(args) => Err(Error::UnknownBenchmark {
            name: args.first().cloned().unwrap_or_default(),
            known: known().join(", "),
        }),
    }
}

/// `cargo run --release -p sandboxd --example NAME`.
fn run_example(step: &'static str, example: &str) -> Result<()> {
    tool::stream(
        step,
        tool::cargo()
            .args(["run", "--release", "-p", "sandboxd", "--example", example])
            .current_dir(workspace_root()),
    )
}

/// Names of the benchmarks [`Bench`] defines.
pub fn known() -> Vec<String> {
    Bench::augment_subcommands(clap::Command::new("bench"))
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .filter(|name| name != "help")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_documented_ones_and_others_are_refused() {
        assert_eq!(
            known(),
            [
                "exec",
                "exec-memory",
                "vm",
                "templates",
                "isolation",
                "restart",
                "soak",
                "files",
                "snapshots",
                "cluster"
            ]
        );
        let err = run(Bench::Unknown(vec!["nope".into()])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown benchmark `nope`; known benchmarks: exec, exec-memory, vm, templates, isolation, \
             restart, soak, files, snapshots, cluster"
        );
    }
}
