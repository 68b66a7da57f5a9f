//! Which CUDA devices to use (`--devices all|0,2`), and one backend per device.
//!
//! A list is checked against the devices the driver reports before anything runs: a device that does
//! not exist, a duplicate, an empty entry or a word that is not a number is an error at start, never a
//! panic nor a silent fallback. Without a usable driver the CPU backend runs and the list is ignored
//! (with a log line), so that the same command line works on a machine without a GPU.

use std::sync::Arc;

use super::{cpu, cuda, Backend, BackendError};
use crate::mnf::BackendChoice;

/// `all`, or the listed device ordinals in the order given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceSelection {
    #[default]
    All,
    List(Vec<usize>),
}

impl std::str::FromStr for DeviceSelection {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("all") {
            return Ok(DeviceSelection::All);
        }
        if s.is_empty() {
            return Err("the device list is empty: give `all` or ordinals such as 0,2".into());
        }
        let mut list = Vec::new();
        for item in s.split(',') {
            let item = item.trim();
            if item.is_empty() {
                return Err(format!("the device list {s:?} has an empty entry"));
            }
            let d: usize = item
                .parse()
                .map_err(|_| format!("{item:?} is not a device ordinal (use `all` or numbers such as 0,2)"))?;
            if list.contains(&d) {
                return Err(format!("device {d} is listed twice in {s:?}"));
            }
            list.push(d);
        }
        Ok(DeviceSelection::List(list))
    }
}

impl std::fmt::Display for DeviceSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSelection::All => f.write_str("all"),
            DeviceSelection::List(l) => {
                let s: Vec<String> = l.iter().map(|d| d.to_string()).collect();
                f.write_str(&s.join(","))
            }
        }
    }
}

impl DeviceSelection {
    /// The ordinals on a host with `count` devices.
    pub fn resolve(&self, count: usize) -> Result<Vec<usize>, BackendError> {
        if count == 0 {
            return Err(BackendError::Unavailable("the CUDA driver reports no device".into()));
        }
        match self {
            DeviceSelection::All => Ok((0..count).collect()),
            DeviceSelection::List(list) => {
                if let Some(&bad) = list.iter().find(|&&d| d >= count) {
                    return Err(BackendError::Invalid(format!(
                        "--devices names device {bad}, but this host has {count} CUDA device{} (0..={})",
                        if count == 1 { "" } else { "s" },
                        count - 1
                    )));
                }
                Ok(list.clone())
            }
        }
    }
}

/// One backend per selected device for `choice` (the CPU backend alone for `cpu`, and for `auto`
/// where no CUDA device is usable). A bad list is an error for `auto` too: falling back to the CPU
/// there would hide a typo on a GPU host.
pub fn select_devices(choice: BackendChoice, devices: &DeviceSelection) -> Result<Vec<Arc<dyn Backend>>, BackendError> {
    let route = match choice {
        BackendChoice::Cpu => {
            if *devices != DeviceSelection::All {
                tracing::info!(devices = %devices, "--devices is ignored by the CPU backend");
            }
            return Ok(vec![Arc::new(cpu::CpuBackend::new())]);
        }
        BackendChoice::Cuda | BackendChoice::Auto => cuda::Route::Kernels,
        BackendChoice::CudaCublas => cuda::Route::Cublas,
    };
    let count = match cuda::device_count() {
        Ok(0) => Err(BackendError::Unavailable("the CUDA driver reports no device".into())),
        other => other,
    };
    let count = match count {
        Ok(n) => n,
        Err(e) if choice == BackendChoice::Auto => {
            tracing::info!("no usable CUDA device ({e}); using the CPU backend, --devices {devices} ignored");
            return Ok(vec![Arc::new(cpu::CpuBackend::new())]);
        }
        Err(e) => return Err(e),
    };
    let ordinals = devices.resolve(count)?;
    let mut out: Vec<Arc<dyn Backend>> = Vec::with_capacity(ordinals.len());
    for d in ordinals {
        match cuda::CudaBackend::on_device(d, route) {
            Ok(b) => {
                tracing::info!(ordinal = d, device = %b.device(), route = b.name(), "CUDA backend ready");
                out.push(Arc::new(b));
            }
            // As `select`: `auto` falls back to the CPU when the first device cannot run (no NVRTC, say).
            Err(e) if choice == BackendChoice::Auto && out.is_empty() => {
                tracing::info!("no usable CUDA device ({e}); using the CPU backend");
                return Ok(vec![Arc::new(cpu::CpuBackend::new())]);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<DeviceSelection, String> {
        s.parse()
    }

    #[test]
    fn lists_parse_in_the_order_given() {
        assert_eq!(parse("all").unwrap(), DeviceSelection::All);
        assert_eq!(parse(" ALL ").unwrap(), DeviceSelection::All);
        assert_eq!(parse("0").unwrap(), DeviceSelection::List(vec![0]));
        assert_eq!(parse("2, 0").unwrap(), DeviceSelection::List(vec![2, 0]));
        assert_eq!(parse("2,0").unwrap().to_string(), "2,0");
    }

    #[test]
    fn bad_lists_are_errors_that_say_why() {
        assert!(parse("").unwrap_err().contains("empty"));
        assert!(parse("  ").unwrap_err().contains("empty"));
        assert!(parse("0,,1").unwrap_err().contains("empty entry"));
        assert!(parse("0,").unwrap_err().contains("empty entry"));
        assert!(parse("x").unwrap_err().contains("not a device ordinal"));
        assert!(parse("-1").unwrap_err().contains("not a device ordinal"));
        assert!(parse("1,0,1").unwrap_err().contains("listed twice"));
    }

    #[test]
    fn a_device_the_host_lacks_is_an_error() {
        let one = parse("7").unwrap().resolve(1).unwrap_err();
        assert_eq!(one.code(), "invalid_input");
        assert!(one.to_string().contains("device 7") && one.to_string().contains("1 CUDA device "), "{one}");
        assert_eq!(parse("1,0").unwrap().resolve(2).unwrap(), vec![1, 0]);
        assert_eq!(DeviceSelection::All.resolve(3).unwrap(), vec![0, 1, 2]);
        assert_eq!(DeviceSelection::All.resolve(0).unwrap_err().code(), "backend_unavailable");
    }

    /// CI has no GPU: `auto` runs the CPU backend whatever the list, `cpu` ignores it, and `cuda` is a
    /// clean error. Skipped where a driver is present.
    #[test]
    fn without_a_driver_the_list_is_ignored_for_the_cpu() {
        // SAFETY: only tries to dlopen libcuda.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            eprintln!("a CUDA driver is present; the no-driver path is not exercised here");
            return;
        }
        let list = parse("0,3").unwrap();
        let auto = select_devices(BackendChoice::Auto, &list).unwrap();
        assert_eq!(auto.len(), 1);
        assert_eq!(auto[0].name(), "cpu");
        assert_eq!(select_devices(BackendChoice::Cpu, &list).unwrap()[0].name(), "cpu");
        let e = select_devices(BackendChoice::Cuda, &list).err().expect("no driver");
        assert_eq!(e.code(), "backend_unavailable");
    }
}
