//! A pool's golden: its state for `/v1/info`, the stamp (a hash of everything the golden
//! depends on, kept beside it so a restart reuses a golden whose inputs did not change),
//! and the build: boot, `Info`, warmup (bounded), seal, then the stamp.

use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::targets::write_atomic;
use super::{PoolKey, Pools};
use crate::engine::GuestSpec;
use crate::error::{Error, Result};
use crate::guest;
use crate::metrics::PoolLabel;

/// Where a pool's golden stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GoldenState {
    Missing,
    Building,
    Ready,
    Failed,
}

impl GoldenState {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            GoldenState::Missing => "missing",
            GoldenState::Building => "building",
            GoldenState::Ready => "ready",
            GoldenState::Failed => "failed",
        }
    }
}

impl Pools {
    pub(super) fn stamp_path(&self, key: &PoolKey) -> PathBuf {
        self.config
            .data_dir
            .join("goldens")
            .join(format!("{}.{}.stamp", key.template, key.size))
    }

    /// The hash of everything the golden depends on.
    pub(super) fn stamp(&self, spec: &GuestSpec, warmup: &Option<Vec<String>>) -> Result<String> {
        let inputs = serde_json::json!({
            "engine": self.engine.info().name,
            "engine_inputs": self.engine.golden_inputs(spec)?,
            "template": spec.template,
            "size": spec.size,
            "cpus": spec.size_config.cpus,
            "memory_mib": spec.size_config.memory_mib,
            "max_pids": spec.size_config.max_pids,
            "warmup": warmup,
            "no_balloon": spec.no_balloon,
        });
        Ok(hex::encode(Sha256::digest(inputs.to_string().as_bytes())))
    }

    /// The stamp of a golden that can be reused as it is: its stamp on disk matches the
    /// inputs and the engine still has its artifacts.
    pub(super) fn reusable_stamp(
        &self,
        key: &PoolKey,
        spec: &GuestSpec,
        warmup: &Option<Vec<String>>,
    ) -> Option<String> {
        let expected = self.stamp(spec, warmup).ok()?;
        let on_disk = std::fs::read_to_string(self.stamp_path(key)).ok()?;
        (on_disk.trim() == expected && self.engine.golden_present(spec)).then_some(expected)
    }

    /// Builds a pool's golden: boot, `Info`, warmup (bounded), seal, then the stamp. The
    /// outcome is recorded for `/v1/info`; a failure also removes any old stamp.
    pub(super) async fn build_golden(&self, key: &PoolKey) -> Result<()> {
        let Some((spec, warmup)) = self.with_pool(key, |p| {
            p.golden = GoldenState::Building;
            p.builds += 1;
            (p.spec.clone(), p.warmup.clone())
        }) else {
            return Ok(());
        };
        self.metrics
            .golden_builds
            .get_or_create(&PoolLabel {
                pool: key.to_string(),
            })
            .inc();
        let stamp_path = self.stamp_path(key);
        let started = std::time::Instant::now();
        let outcome = async {
            let stamp = self.stamp(&spec, &warmup)?;
            let _ = std::fs::remove_file(&stamp_path);
            let golden = self.engine.boot_golden(&spec).await?;
            let boot = Duration::from_secs(self.config.boot_timeout_seconds);
            let warm = Duration::from_secs(self.config.warmup_timeout_seconds);
            let warmed = async {
                guest::info(&*golden, boot).await?;
                if let Some(argv) = &warmup {
                    guest::run_checked(&*golden, argv, warm)
                        .await
                        .map_err(|e| Error::Engine(format!("warmup {e}")))?;
                }
                Ok::<_, Error>(())
            }
            .await;
            if let Err(e) = warmed {
                golden.destroy().await;
                return Err(e);
            }
            self.engine.seal_golden(&spec, golden).await?;
            write_atomic(&stamp_path, stamp.as_bytes())?;
            Ok(stamp)
        }
        .await;
        self.metrics
            .golden_build_seconds
            .get_or_create(&PoolLabel {
                pool: key.to_string(),
            })
            .observe(started.elapsed().as_secs_f64());
        self.with_pool(key, |p| match &outcome {
            Ok(stamp) => {
                p.golden = GoldenState::Ready;
                p.stamp = Some(stamp.clone());
                p.golden_error = None;
            }
            Err(e) => {
                p.golden = GoldenState::Failed;
                p.stamp = None;
                p.golden_error = Some(e.to_string());
            }
        });
        match outcome {
            Ok(stamp) => {
                tracing::info!(pool = %key, %stamp, "golden built");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(pool = %key, "golden build failed: {e}");
                Err(e)
            }
        }
    }
}
