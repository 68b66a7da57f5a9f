//! The kernels only the benchmark loads, compiled by NVRTC at first use into modules of their own in
//! the job cache's table's context ([`Device`]), which keeps running the table's own kernels
//! (`ht_insert`, `ht_find`, `ht_erase`, ...) from its module:
//! * [`Kernels`] (`kernels/bench/hashtable_bench.cu`): the find variants measured beside `ht_find`,
//!   the key generators and tallies, the linear-probing table and the device ceilings. They use the
//!   types and device functions of `kernels/hashtable/`, so they are compiled appended to it, with
//!   the options the table was compiled with (its development knobs included).
//! * [`DesignKernels`]: the four kernels of each published design (`kernels/bench/ht_hopscotch.cu`,
//!   `kernels/bench/ht_slab.cu`), programs of their own, compiled with the table's options but
//!   none of its knobs.

use std::sync::OnceLock;

use cudarc::driver::CudaFunction;

use crate::hashtable::gpu::{self, drv, Device};
use crate::hashtable::HashTableError;

const SOURCE: &str = include_str!("../../../kernels/bench/hashtable_bench.cu");

/// A kernel of a loaded module by name (its error: the name and the driver's).
type Function<'a> = &'a dyn Fn(&str) -> Result<CudaFunction, String>;

/// Compiles `source` (called `file` in NVRTC's messages) with `options` once per process into `cell`
/// (one device per process: [`Device::shared`]), loads it into `dev`'s context and lets `build`
/// take its kernels.
fn load_once<K>(
    cell: &'static OnceLock<Result<K, String>>,
    dev: &Device,
    source: &str,
    file: &str,
    options: Vec<String>,
    build: impl FnOnce(Function) -> Result<K, String>,
) -> Result<&'static K, HashTableError> {
    cell.get_or_init(|| {
        let ptx = gpu::compile(source, file, options)
            .map_err(|log| HashTableError::Compile(format!("{file}: {log}")).to_string())?;
        let m = dev.ctx.load_module(ptx).map_err(|e| drv(e).to_string())?;
        build(&|n: &str| m.load_function(n).map_err(|e| format!("{n}: {e:?}")))
    })
    .as_ref()
    .map_err(|e| HashTableError::Compile(e.clone()))
}

pub(super) struct Kernels {
    pub ht_find_nc: CudaFunction,
    pub ht_find_lane: CudaFunction,
    pub ht_find_lane_nc: CudaFunction,
    pub gen_keys: CudaFunction,
    pub gen_mix: CudaFunction,
    pub gen_cache_mix: CudaFunction,
    pub tally: CudaFunction,
    pub lp_insert: CudaFunction,
    pub lp_find: CudaFunction,
    pub lp_erase: CudaFunction,
    pub lp_gen: CudaFunction,
    pub lp_tally: CudaFunction,
    pub ceil_cas128: CudaFunction,
    pub ceil_read: CudaFunction,
    pub fill_u32: CudaFunction,
}

impl Kernels {
    pub(super) fn load(dev: &Device) -> Result<&'static Self, HashTableError> {
        static K: OnceLock<Result<Kernels, String>> = OnceLock::new();
        let source = format!("{}\n// ---- kernels/bench/hashtable_bench.cu\n{SOURCE}", gpu::SOURCE);
        load_once(&K, dev, &source, "hashtable_bench.cu", dev.options.clone(), |f| {
            Ok(Kernels {
                ht_find_nc: f("ht_find_nc")?,
                ht_find_lane: f("ht_find_lane")?,
                ht_find_lane_nc: f("ht_find_lane_nc")?,
                gen_keys: f("gen_keys")?,
                gen_mix: f("gen_mix")?,
                gen_cache_mix: f("gen_cache_mix")?,
                tally: f("tally")?,
                lp_insert: f("lp_insert")?,
                lp_find: f("lp_find")?,
                lp_erase: f("lp_erase")?,
                lp_gen: f("lp_gen")?,
                lp_tally: f("lp_tally")?,
                ceil_cas128: f("ceil_cas128")?,
                ceil_read: f("ceil_read")?,
                fill_u32: f("fill_u32")?,
            })
        })
    }
}

/// The kernels of a design: `{prefix}_insert`, `{prefix}_find`, `{prefix}_erase`, `{prefix}_audit`.
pub(crate) struct DesignKernels {
    pub insert: CudaFunction,
    pub find: CudaFunction,
    pub erase: CudaFunction,
    pub audit: CudaFunction,
}

impl DesignKernels {
    /// The kernels of `source` (the file `file`), compiled at the first call into `cell`.
    pub(crate) fn load(
        cell: &'static OnceLock<Result<Self, String>>,
        dev: &Device,
        source: &str,
        file: &str,
        prefix: &str,
    ) -> Result<&'static Self, HashTableError> {
        load_once(cell, dev, source, file, gpu::base_options(), |f| {
            let f = |n: &str| f(&format!("{prefix}_{n}"));
            Ok(Self {
                insert: f("insert")?,
                find: f("find")?,
                erase: f("erase")?,
                audit: f("audit")?,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::SOURCE;
    use crate::hashtable::gpu;

    /// The benchmark's programs compile with NVRTC as `load_once` compiles them (`gpu::assert_compiles`).
    #[test]
    fn the_bench_kernels_compile_with_nvrtc() {
        let with_table = format!("{}\n{SOURCE}", gpu::SOURCE);
        let programs = [
            (with_table.as_str(), "hashtable_bench.cu"),
            (include_str!("../../../kernels/bench/ht_hopscotch.cu"), "ht_hopscotch.cu"),
            (include_str!("../../../kernels/bench/ht_slab.cu"), "ht_slab.cu"),
        ];
        for (source, file) in programs {
            if !gpu::assert_compiles(source, file) {
                return;
            }
        }
    }
}
