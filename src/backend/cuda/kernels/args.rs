//! The typed arguments of the kernel launchers: device pointers with their extents, pixel runs, the
//! noise kernels' geometry, and one kernel argument as it is pushed.

use std::marker::PhantomData;

use crate::backend::cuda::device::{DevBuf, Sized_};
use crate::cube::{ByteOrder, DataType};

/// Geometry passed to the noise kernels: which lines the raw buffer holds and which to compute.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NoiseArgs {
    pub lines: i32,
    pub samples: i32,
    pub bands: i32,
    pub buf_l0: i32,
    pub buf_lines: i32,
    pub out_l0: i32,
    pub out_l1: i32,
    /// x0, x1, y0, y1 of the noise window (the whole image when none was given).
    pub window: [i32; 4],
}

/// `len` elements of `T` in device memory from address `addr`: what a kernel's `T*` parameter takes.
/// It records an address and an extent, not a borrow: the caller keeps the buffer alive until the
/// stream has run the kernels that use it, as for any device address (see `Kernels::launch`).
pub(crate) struct DevPtr<T> {
    addr: u64,
    len: usize,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevPtr<T> {}

impl<T> std::fmt::Debug for DevPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevPtr<{}>({:#x}, {})", std::any::type_name::<T>(), self.addr, self.len)
    }
}

impl<T> DevPtr<T> {
    /// All of `buf` as elements of T (a pooled buffer may be larger than was asked for).
    pub(crate) fn of(buf: &DevBuf) -> Self {
        DevPtr {
            addr: buf.ptr(),
            len: buf.size() / size_of::<T>(),
            _t: PhantomData,
        }
    }
    /// `buf` from byte `offset` on, as elements of T.
    pub(crate) fn at(buf: &DevBuf, offset: usize) -> Self {
        debug_assert_eq!(offset % size_of::<T>(), 0, "element-aligned offset");
        Self::of(buf).skip(offset / size_of::<T>())
    }
    /// The elements from `n` on.
    pub(crate) fn skip(self, n: usize) -> Self {
        debug_assert!(n <= self.len, "{self:?} has no element {n}");
        DevPtr {
            addr: self.addr + (n * size_of::<T>()) as u64,
            len: self.len - n,
            _t: PhantomData,
        }
    }
    pub(crate) fn addr(self) -> u64 {
        self.addr
    }
    /// `len` elements at device address `addr` (a place inside a buffer the caller holds).
    pub(crate) fn raw(addr: u64, len: usize) -> Self {
        DevPtr { addr, len, _t: PhantomData }
    }
}

/// Where a launch may check, in debug builds, that a buffer holds what the kernel will touch.
pub(super) trait Extent {
    fn holds(self, n: usize);
}
impl<T> Extent for DevPtr<T> {
    fn holds(self, n: usize) {
        debug_assert!(n <= self.len, "{self:?} is shorter than the {n} elements the kernel uses");
    }
}
/// None is a null pointer: the kernel does not touch it.
impl<T> Extent for Option<DevPtr<T>> {
    fn holds(self, n: usize) {
        if let Some(p) = self {
            p.holds(n);
        }
    }
}

/// `npix` pixels of `bands` samples of type `t` from `raw`, with their valid flags (None: all valid): what
/// the conversion and projection kernels read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pixels {
    pub raw: DevPtr<u8>,
    pub valid: Option<DevPtr<u8>>,
    pub npix: i64,
    pub bands: i32,
    pub t: RawType,
}

impl Pixels {
    pub(super) fn check(&self) {
        self.raw.holds(self.npix as usize * self.bands as usize * self.t.size);
        self.valid.holds(self.npix as usize);
    }
    /// These kernels' arguments: raw, valid, npix, bands, dtype, swap, then `rest`.
    pub(super) fn args(&self, rest: &[Arg]) -> Vec<Arg> {
        let mut v = vec![
            self.raw.into(),
            self.valid.into(),
            self.npix.into(),
            self.bands.into(),
            self.t.code.into(),
            self.t.swap.into(),
        ];
        v.extend_from_slice(rest);
        v
    }
}

/// One kernel argument, by value as the kernel takes it (a pointer as its address, null for None).
#[derive(Debug, Clone, Copy)]
pub(super) enum Arg {
    I32(i32),
    I64(i64),
    F64(f64),
    Ptr(u64),
}
impl From<i32> for Arg {
    fn from(v: i32) -> Arg {
        Arg::I32(v)
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::I64(v)
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Arg {
        Arg::F64(v)
    }
}
impl<T> From<DevPtr<T>> for Arg {
    fn from(p: DevPtr<T>) -> Arg {
        Arg::Ptr(p.addr)
    }
}
impl<T> From<Option<DevPtr<T>>> for Arg {
    fn from(p: Option<DevPtr<T>>) -> Arg {
        Arg::Ptr(p.map_or(0, |p| p.addr))
    }
}

/// How the kernels read the raw samples of one cube.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawType {
    /// DT_* code of common.cuh.
    pub code: i32,
    /// 1 when the samples must be byte-swapped (big-endian file on this little-endian device).
    pub swap: i32,
    /// Bytes per sample as uploaded.
    pub size: usize,
}

impl RawType {
    /// The device-side type of a cube. i64 / u64 have no device conversion: the host widens them to
    /// f64 (little-endian) before upload, so they read as f64.
    pub(crate) fn of(dtype: DataType, order: ByteOrder) -> RawType {
        let swap = (order == ByteOrder::Big && dtype.size() > 1) as i32;
        match dtype {
            DataType::U8 => RawType {
                code: 0,
                swap: 0,
                size: 1,
            },
            DataType::I16 => RawType { code: 1, swap, size: 2 },
            DataType::U16 => RawType { code: 2, swap, size: 2 },
            DataType::I32 => RawType { code: 3, swap, size: 4 },
            DataType::U32 => RawType { code: 4, swap, size: 4 },
            DataType::F32 => RawType { code: 5, swap, size: 4 },
            DataType::F64 => RawType { code: 6, swap, size: 8 },
            DataType::I64 | DataType::U64 => RawType {
                code: 6,
                swap: 0,
                size: 8,
            },
        }
    }
    /// True when the host must convert the cube before upload (i64 / u64).
    pub(crate) fn host_converted(dtype: DataType) -> bool {
        matches!(dtype, DataType::I64 | DataType::U64)
    }
}
