//! Kernel sources, compiled by NVRTC at first use for the device's architecture, with the PTX cached on
//! disk by source hash and architecture (a cache that cannot be read or written is only a slower start).

use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule};
use cudarc::nvrtc::{CompileOptions, Ptx};
use sha2::{Digest, Sha256};

use super::device::cuda;
use crate::backend::BackendError;

const COMMON: &str = include_str!("../../../kernels/common.cuh");
const NOISE: &str = include_str!("../../../kernels/noise.cu");
const COVARIANCE: &str = include_str!("../../../kernels/covariance.cu");
const TRANSFORM: &str = include_str!("../../../kernels/transform.cu");
const REORDER: &str = include_str!("../../../kernels/reorder.cu");
const EIGEN: &str = include_str!("../../../kernels/eigen.cu");

/// The whole program as NVRTC sees it: common.cuh first, then the kernels with their
/// `#include "common.cuh"` lines removed (NVRTC is given no include path).
pub(crate) fn program_source() -> String {
    let mut src = String::with_capacity(COMMON.len() + NOISE.len() + COVARIANCE.len() + TRANSFORM.len() + REORDER.len() + 256);
    src.push_str(&COMMON.replace("#pragma once", ""));
    for (name, body) in [
        ("noise.cu", NOISE),
        ("covariance.cu", COVARIANCE),
        ("transform.cu", TRANSFORM),
        ("reorder.cu", REORDER),
    ] {
        src.push_str(&format!("\n// ---- kernels/{name}\n"));
        for line in body.lines() {
            if line.trim_start().starts_with("#include \"common.cuh\"") {
                continue;
            }
            src.push_str(line);
            src.push('\n');
        }
    }
    src
}

fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-default-device".into(),
    ]
}

/// Where compiled PTX is kept: $HYPERMNF_CACHE_DIR, else $XDG_CACHE_HOME/hypermnf, else ~/.cache/hypermnf.
fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("HYPERMNF_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("hypermnf"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("hypermnf"))
}

/// The cache file for this program's source and architecture.
fn cache_path(program: &str, src: &str, arch: &str) -> Option<PathBuf> {
    let mut h = Sha256::new();
    h.update(src.as_bytes());
    for o in options(arch) {
        h.update([0u8]);
        h.update(o.as_bytes());
    }
    let digest = hex::encode(&h.finalize()[..12]);
    cache_dir().map(|d| d.join(format!("{program}-{arch}-{digest}.ptx")))
}

/// Where the PTX came from (for logs and the benchmark's cold/warm start note).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PtxOrigin {
    Cache,
    Compiled,
}

/// The NVRTC programs: the pipeline's kernels, and the eigen step's own (kernels/eigen.cu), a program
/// of their own, loaded only where a solve uses them, so the pipeline's compile does not grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Program {
    Pipeline,
    Eigen,
}

impl Program {
    fn ptx(self, arch: &str) -> Result<(Ptx, PtxOrigin, Option<PathBuf>), BackendError> {
        match self {
            Program::Pipeline => load_program_ptx("kernels", &program_source(), arch),
            Program::Eigen => load_program_ptx("eigen", EIGEN, arch),
        }
    }
}

/// `program` compiled for `ctx`'s device (or from the PTX cache) and loaded; a cached PTX the driver
/// refuses (stale or damaged) is forgotten and compiled afresh. Also says where the PTX came from.
pub(crate) fn load_module(ctx: &Arc<CudaContext>, program: Program) -> Result<(Arc<CudaModule>, PtxOrigin), BackendError> {
    let (major, minor) = ctx.compute_capability().map_err(cuda("cuDeviceGetAttribute"))?;
    let arch = format!("compute_{major}{minor}");
    let (ptx, origin, path) = program.ptx(&arch)?;
    match ctx.load_module(ptx) {
        Ok(m) => Ok((m, origin)),
        Err(e) if origin == PtxOrigin::Cache => {
            tracing::warn!(?program, "cached PTX did not load ({e}); recompiling");
            if let Some(p) = &path {
                forget(p);
            }
            let (ptx, _, _) = program.ptx(&arch)?;
            Ok((ctx.load_module(ptx).map_err(cuda("cuModuleLoadData"))?, PtxOrigin::Compiled))
        }
        Err(e) => Err(BackendError::Cuda(format!("cuModuleLoadData: {e}"))),
    }
}

/// PTX of one program (`name` keys its cache files) from the cache or compiled.
fn load_program_ptx(name: &str, src: &str, arch: &str) -> Result<(Ptx, PtxOrigin, Option<PathBuf>), BackendError> {
    let path = cache_path(name, src, arch);
    if let Some(p) = &path {
        if let Ok(text) = std::fs::read_to_string(p) {
            if text.contains(".entry") {
                return Ok((Ptx::from_src(text), PtxOrigin::Cache, path));
            }
        }
    }
    let ptx = compile(src, arch)?;
    if let Some(p) = &path {
        store(p, &ptx.to_src());
    }
    Ok((ptx, PtxOrigin::Compiled, path))
}

/// Compiles without the cache (also used when a cached PTX fails to load).
pub(crate) fn compile(src: &str, arch: &str) -> Result<Ptx, BackendError> {
    let opts = CompileOptions {
        options: options(arch),
        ..Default::default()
    };
    // NVRTC is loaded dynamically; a missing libnvrtc panics inside cudarc, which we turn into an error.
    let src = src.to_owned();
    match std::panic::catch_unwind(move || cudarc::nvrtc::compile_ptx_with_opts(src, opts)) {
        Ok(Ok(ptx)) => Ok(ptx),
        Ok(Err(e)) => Err(BackendError::Cuda(format!("NVRTC could not compile kernels/*.cu: {e}"))),
        Err(_) => Err(BackendError::Unavailable("NVRTC (libnvrtc) could not be loaded".into())),
    }
}

/// Writes the PTX next to its final name and renames it, so a concurrent reader never sees half a file.
/// Failures are logged and otherwise ignored: the cache only saves start-up time.
fn store(path: &std::path::Path, text: &str) {
    let result = (|| -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        tracing::debug!(path = %path.display(), "PTX cache not written: {e}");
    }
}

/// Removes a cached PTX that the driver refused (stale or corrupt).
fn forget(path: &std::path::Path) {
    let _ = std::fs::remove_file(path);
}

/// Whether a test that needs NVRTC must fail, rather than skip, where libnvrtc cannot be loaded
/// (`HYPERMNF_REQUIRE_NVRTC=1`: CI installs NVIDIA's NVRTC wheel and sets it).
#[cfg(test)]
pub(crate) fn nvrtc_required() -> bool {
    std::env::var("HYPERMNF_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both programs compile with NVRTC for Hopper (compute_90, the devices measured) and Ampere
    /// (compute_80: the cluster kernel compiles to an empty body there and is never launched). CI has
    /// no GPU, so this is where a kernel that does not compile shows before a GPU host runs it.
    #[test]
    fn every_program_compiles_with_nvrtc() {
        for arch in ["compute_90", "compute_80"] {
            for (name, src) in [("kernels", program_source()), ("eigen", EIGEN.to_string())] {
                match compile(&src, arch) {
                    Ok(ptx) => assert!(ptx.to_src().contains(".entry"), "{name} for {arch}: no kernel in the PTX"),
                    Err(BackendError::Unavailable(m)) if !nvrtc_required() => {
                        eprintln!("skipped: {m} (HYPERMNF_REQUIRE_NVRTC=1 makes this a failure)");
                        return;
                    }
                    Err(e) => panic!("{name} for {arch}: {e}"),
                }
            }
        }
    }

    #[test]
    fn program_has_every_kernel_and_no_includes() {
        let src = program_source();
        assert!(
            !src.lines().any(|l| l.trim_start().starts_with("#include")),
            "NVRTC gets no include path"
        );
        for k in [
            "pixel_mask",
            "noise_mean_filter",
            "noise_shift_difference",
            "convert_shifted",
            "col_sums",
            "cov_lower",
            "cov_lower_dmma",
            "reduce_parts",
            "widen_f64",
            "cov_pair_from_sums",
            "project_px1",
            "project_px16",
            "project_global",
            "pass_through",
            "convert_centred_used",
        ] {
            // project_px{KP} are instances of the PROJECT_PX(KP) macro.
            let found = src.contains(&format!("void __launch_bounds__(256) {k}("))
                || k.strip_prefix("project_px").is_some_and(|kp| src.contains(&format!("PROJECT_PX({kp})")));
            assert!(found, "kernel {k} missing");
        }
        for size in [1, 2, 4, 8] {
            assert!(src.contains(&format!("REORDER(reorder_to_bip{size}, ")), "reorder_to_bip{size} missing");
        }
    }

    #[test]
    fn cache_key_depends_on_program_source_and_arch() {
        let a = cache_path("kernels", "x", "compute_90");
        let b = cache_path("kernels", "y", "compute_90");
        let c = cache_path("kernels", "x", "compute_80");
        let d = cache_path("eigen", "x", "compute_90");
        if a.is_some() {
            assert_ne!(a, b);
            assert_ne!(a, c);
            assert_ne!(a, d);
        }
    }

    #[test]
    fn the_eigen_program_has_its_kernels_and_no_includes() {
        for k in ["eig_tridiagonalize", "eig_tridiagonalize_cluster", "eig_bisect", "eig_vectors", "eig_bt_gram", "eig_back_transform"] {
            assert!(EIGEN.contains(&format!("void {k}(")) || EIGEN.contains(&format!(") {k}(")), "{k} missing from kernels/eigen.cu");
        }
        assert!(!EIGEN.lines().any(|l| l.trim_start().starts_with("#include")), "NVRTC is given no include path");
    }
}
