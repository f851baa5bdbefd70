//! `cargo xtask bench [SUITE...] [--quick] [--json FILE]`: every benchmark suite under one
//! entry point. [`SUITES`] is the one table of suites (name, what it measures, how it
//! runs); add a row to add a suite. Each suite is a cargo run of an example whose output
//! streams through; the new-style suites print one table per engine (median, p90, max,
//! n, and the ratio to a floor measured in the same run). `--quick` runs each suite
//! small, in the debug build the test gate already made (a smoke test, no thresholds);
//! `--json` collects the tables' rows with the environment they ran in.
//! docs/benchmarks.md records the figures.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::{bench_env, image, tool, workspace_root, Error, Result};

#[derive(clap::Args, Default)]
pub struct Args {
    /// Suites to run, in the table's order; all of them when none is named.
    pub suites: Vec<String>,
    /// Each suite small, on the debug build (CI's smoke test; no thresholds).
    #[arg(long)]
    pub quick: bool,
    /// Write every table row and the environment (CPU, cores, engines, accelerator,
    /// QEMU, kernel, commit) to this JSON file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// `soak`: no kill -9 + restart halfway.
    #[arg(long)]
    pub no_restart: bool,
}

/// How a suite is run, given `--quick`.
pub struct Ctx {
    pub quick: bool,
    pub no_restart: bool,
}

/// One suite: its name on the command line, what it measures, how to run it.
pub struct Suite {
    pub name: &'static str,
    pub about: &'static str,
    run: fn(&Ctx) -> Result<()>,
}

/// Every suite, in the order a bare `cargo xtask bench` runs them.
pub const SUITES: &[Suite] = &[
    Suite {
        name: "exec",
        about: "`true` by buffered exec, relay on a kept and on a fresh connection, per engine; \
                silkd alone over its socket; floor: host fork+exec+wait",
        run: exec,
    },
    Suite {
        name: "throughput",
        about: "stdout through the relay into the SDK and `sbx` (1 GiB; qemu 256 MiB), 8 MiB \
                buffered; floor: a local pipe",
        run: |c| suite(c, "throughput"),
    },
    Suite {
        name: "claim",
        about: "warm hit and pool miss (process start, clone), client and server time, per \
                engine; floor: host fork+exec+wait",
        run: |c| suite(c, "claim"),
    },
    Suite {
        name: "tti",
        about: "claim + `echo hi` + release from an SDK load generator at concurrency 1, 16, \
                100 and a burst past the pool; buffered and relay",
        run: |c| suite(c, "tti"),
    },
    Suite {
        name: "exec-memory",
        about: "sandboxd's memory under 50 concurrent 8 MiB buffered execs, warm claim time",
        run: |c| example(c, "bench_exec_memory", &[]),
    },
    Suite {
        name: "vm",
        about: "qemu engine: cold boot vs clone, memory and idle CPU per clone, warm claims",
        run: |c| example(c, "bench_vm", &[]),
    },
    Suite {
        name: "templates",
        about: "qemu engine, `default` vs `base`: clone-to-ready, memory, first python3/node",
        run: templates,
    },
    Suite {
        name: "isolation",
        about: "process engine exec round trip with and without seccomp and identity (root)",
        run: |c| example(c, "bench_isolation", &[]),
    },
    Suite {
        name: "restart",
        about: "re-adoption after kill -9: 50 process sandboxes, then 8 VMs (root)",
        run: |c| {
            example(c, "bench_restart", &[])?;
            example(c, "bench_restart_vm", &[])
        },
    },
    Suite {
        name: "soak",
        about: "10,000 buffered execs at concurrency 64, hang-ups, a kill -9 halfway (root)",
        run: |c| {
            let mut args = Vec::new();
            if c.quick {
                args.push("--quick");
            }
            if c.no_restart {
                args.push("--no-restart");
            }
            example(c, "bench_soak", &args)
        },
    },
    Suite {
        name: "files",
        about: "1 GiB and 1,000 small files in and out over HTTP and `sbx cp` (root); floor: \
                local cp and pipe",
        run: |c| example(c, "bench_files", &[]),
    },
    Suite {
        name: "snapshots",
        about: "qemu engine: snapshot time, fork-to-ready next to a golden clone, memory per \
                idle fork, hibernate time and memory freed, wake to first exec",
        run: |c| example(c, "bench_snapshots", &[]),
    },
    Suite {
        name: "cluster",
        about: "three process-engine nodes over a 3-member etcd (root): claim and exec through \
                the owner vs another node, 3 nodes vs 1, time to report a dead node lost",
        run: |c| example(c, "bench_cluster", &[]),
    },
];

/// Names of the suites, in order.
pub fn known() -> Vec<&'static str> {
    SUITES.iter().map(|s| s.name).collect()
}

pub fn run(args: &Args) -> Result<()> {
    let chosen: Vec<&Suite> = if args.suites.is_empty() {
        SUITES.iter().collect()
    } else {
        args.suites
            .iter()
            .map(|name| {
                SUITES
                    .iter()
                    .find(|s| s.name == name)
                    .ok_or_else(|| Error::UnknownBenchmark {
                        name: name.clone(),
                        known: known().join(", "),
                    })
            })
            .collect::<Result<_>>()?
    };
    let ctx = Ctx {
        quick: args.quick,
        no_restart: args.no_restart,
    };
    prepare(&ctx)?;
    let rows = std::env::temp_dir().join(format!("xtask-bench-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&rows);
    // The examples append their rows here (stats.rs in examples/bench_suite).
    std::env::set_var("BENCH_JSON", &rows);
    std::env::set_var("BENCH_QUICK", if ctx.quick { "1" } else { "0" });
    let mut ran = Vec::new();
    let mut failed = Vec::new();
    for s in chosen {
        eprintln!("xtask bench: {} — {}", s.name, s.about);
        let t = Instant::now();
        let outcome = (s.run)(&ctx);
        let secs = t.elapsed().as_secs_f64();
        eprintln!("xtask bench: {} took {secs:.1} s", s.name);
        if let Err(e) = &outcome {
            eprintln!("xtask bench: {} FAILED: {}", s.name, crate::error_chain(e));
            failed.push(s.name);
        }
        ran.push(serde_json::json!({"suite": s.name, "ok": outcome.is_ok(), "seconds": secs}));
    }
    if let Some(out) = &args.json {
        let text = std::fs::read_to_string(&rows).unwrap_or_default();
        let rows: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let doc = serde_json::json!({
            "environment": bench_env::stamp(ctx.quick),
            "suites": ran,
            "rows": rows,
        });
        let pretty = serde_json::to_string_pretty(&doc).expect("JSON values serialize");
        std::fs::write(out, pretty).map_err(Error::io("writing the bench JSON", out))?;
        eprintln!("xtask bench: wrote {}", out.display());
    }
    let _ = std::fs::remove_file(&rows);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "bench suites failed: {}",
            failed.join(", ")
        )))
    }
}

/// The guest image and the binaries the suites start, in the profile they run in: the
/// release build for figures, the debug build (already made by the test gate) for
/// `--quick`.
fn prepare(ctx: &Ctx) -> Result<()> {
    image::run(&image::Args::default())?;
    let mut cmd = tool::cargo();
    cmd.args([
        "build",
        "-p",
        "silkd",
        "-p",
        "sandboxd",
        "-p",
        "sbx",
        "--bins",
        "--examples",
    ])
    .current_dir(workspace_root());
    if !ctx.quick {
        cmd.arg("--release");
    }
    tool::stream("build", &mut cmd)
}

/// `target/{release,debug}/examples/NAME`, as built by [`prepare`].
fn example_path(ctx: &Ctx, name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let target = if target.is_relative() {
        workspace_root().join(target)
    } else {
        target
    };
    let profile = if ctx.quick { "debug" } else { "release" };
    target.join(profile).join("examples").join(name)
}

/// Runs a built example with `args`, its output streaming.
fn example(ctx: &Ctx, name: &str, args: &[&str]) -> Result<()> {
    tool::stream(
        "bench",
        Command::new(example_path(ctx, name))
            .args(args)
            .current_dir(workspace_root()),
    )
}

/// A suite of `examples/bench_suite`.
fn suite(ctx: &Ctx, name: &str) -> Result<()> {
    let mut args = vec![name];
    if ctx.quick {
        args.push("--quick");
    }
    example(ctx, "bench_suite", &args)
}

/// silkd alone over its Unix socket (`silkd/examples/exec_rtt`), then the suite.
fn exec(ctx: &Ctx) -> Result<()> {
    let silkd = example_path(ctx, "exec_rtt")
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("silkd"))
        .unwrap_or_default();
    let n = if ctx.quick { "100" } else { "1000" };
    tool::stream(
        "bench",
        Command::new(example_path(ctx, "exec_rtt"))
            .arg(silkd)
            .arg(n)
            .current_dir(workspace_root()),
    )?;
    suite(ctx, "exec")
}

/// `default` built (the second, cached build timed), then `bench_templates`.
fn templates(ctx: &Ctx) -> Result<()> {
    let default = image::Args {
        template: "default".into(),
        ..image::Args::default()
    };
    image::run(&default)?;
    let t = Instant::now();
    image::run(&default)?;
    println!(
        "bench templates: cached `cargo xtask image --template default`: {:.2} s",
        t.elapsed().as_secs_f64()
    );
    example(ctx, "bench_templates", &[])
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
                "throughput",
                "claim",
                "tti",
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
        let err = run(&Args {
            suites: vec!["nope".into()],
            ..Args::default()
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown benchmark `nope`; known benchmarks: exec, throughput, claim, tti, \
             exec-memory, vm, templates, isolation, restart, soak, files, snapshots, cluster"
        );
    }

    #[test]
    fn every_suite_is_documented() {
        let docs = include_str!("../../docs/benchmarks.md");
        for name in known() {
            assert!(
                docs.contains(&format!("| `{name}` |")),
                "docs/benchmarks.md has no row for suite `{name}`"
            );
        }
    }
}
