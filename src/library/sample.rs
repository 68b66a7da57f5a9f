//! Between `ndarray` and the crate's cube model: the sample types a view may hold ([`Sample`]), a view
//! seen as a [`Cube`] (borrowed when its memory is already in the cube's order), and a cube read back
//! into an array ([`cube_to_array`]).
//!
//! The cube model keeps raw samples in BIP order, line by line, sample by sample, band by band: exactly
//! the memory of a C-contiguous (standard layout) `(lines, samples, bands)` array in native byte order.
//! Such a view is handed to the pipeline as it is. Any other view (a slice that skips bands or samples,
//! permuted axes, negative strides, Fortran order) is first copied into standard layout, once, in its
//! own sample type (the pipeline reads by whole lines, which such a view does not have in one piece).

use ndarray::{Array3, ArrayView3};

use super::Error;
use crate::cube::{ByteOrder, Cube, CubeMeta, DataType};

mod sealed {
    /// Keeps [`Sample`](super::Sample) to the primitive types below, for which reading their memory
    /// as bytes is sound (no padding, every bit pattern valid), and carries their decoding.
    pub trait Sealed: Copy {
        /// One sample from its `size_of::<Self>()` bytes in the given byte order.
        fn decode(bytes: &[u8], big_endian: bool) -> Self;
        /// The value widened to f64, as the pipeline widens it.
        fn to_f64(self) -> f64;
    }
}

/// A sample type a cube may hold: the integer and float types of ENVI files and `.npy` arrays that
/// hypermnf reads (`u8`, `i16`, `u16`, `i32`, `u32`, `i64`, `u64`, `f32`, `f64`). Sealed: the library
/// reads the view's memory directly, which is sound for these types only.
pub trait Sample: sealed::Sealed + Send + Sync + 'static {
    /// The cube model's data type of this sample type.
    const DATA_TYPE: DataType;
}

macro_rules! sample {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn decode(bytes: &[u8], big_endian: bool) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(bytes);
                if big_endian { <$t>::from_be_bytes(a) } else { <$t>::from_le_bytes(a) }
            }
        }
        impl Sample for $t {
            const DATA_TYPE: DataType = DataType::$d;
        }
    )*};
}

sample!(u8 => U8, i16 => I16, u16 => U16, i32 => I32, u32 => U32, i64 => I64, u64 => U64, f32 => F32, f64 => F64);

/// The byte order of this machine: an array's samples are in it.
fn native_order() -> ByteOrder {
    if cfg!(target_endian = "big") {
        ByteOrder::Big
    } else {
        ByteOrder::Little
    }
}

fn as_bytes<T: Sample>(samples: &[T]) -> &[u8] {
    // SAFETY: `T` is one of the primitive integer and float types (`Sample` is sealed): no padding, so
    // every byte of the slice is initialised; `u8` has alignment 1 and the byte length is the same
    // memory; the borrow of `samples` covers the result.
    unsafe { std::slice::from_raw_parts(samples.as_ptr().cast::<u8>(), std::mem::size_of_val(samples)) }
}

/// `(lines, samples, bands)` of a view, or [`Error::EmptyAxis`].
pub(super) fn checked_dim<T>(view: &ArrayView3<'_, T>) -> Result<(usize, usize, usize), Error> {
    let (lines, samples, bands) = view.dim();
    if lines == 0 || samples == 0 || bands == 0 {
        return Err(Error::EmptyAxis { lines, samples, bands });
    }
    Ok((lines, samples, bands))
}

/// Runs `f` on `view` as a cube: its own memory when the view is in standard layout (C-contiguous),
/// a standard-layout copy otherwise (see the module doc).
pub(super) fn with_cube<T: Sample, R>(view: ArrayView3<'_, T>, f: impl FnOnce(&Cube) -> R) -> Result<R, Error> {
    let (lines, samples, bands) = checked_dim(&view)?;
    // Borrows when already standard, copies otherwise.
    let standard = view.as_standard_layout();
    let owned_copy;
    let samples_slice: &[T] = match standard.as_slice() {
        Some(s) => s,
        // Not reached (a standard-layout array is contiguous); copied in logical order if it were.
        None => {
            owned_copy = standard.iter().copied().collect::<Vec<T>>();
            &owned_copy
        }
    };
    let bytes = as_bytes(samples_slice);
    Ok(Cube::with_borrowed(lines, samples, bands, T::DATA_TYPE, native_order(), bytes, CubeMeta::default(), f)?)
}

/// The samples of `cube` as a `(lines, samples, bands)` array of its own sample type `T` (a cube read
/// with `hypermnf::cube::open` from ENVI or `.npy`, in whatever byte order the file had).
/// [`Error::DataTypeMismatch`] when `T` is not the cube's type (see [`Cube::dtype`]).
///
/// ```
/// use hypermnf::cube::synthetic::{generate, SyntheticSpec};
/// use hypermnf::library::cube_to_array;
///
/// let cube = generate(&SyntheticSpec::small(4, 5, 6)); // int16
/// let array = cube_to_array::<i16>(&cube).unwrap();
/// assert_eq!(array.dim(), (4, 5, 6));
/// assert!(cube_to_array::<f32>(&cube).is_err());
/// ```
pub fn cube_to_array<T: Sample>(cube: &Cube) -> Result<Array3<T>, Error> {
    if cube.dtype() != T::DATA_TYPE {
        return Err(Error::DataTypeMismatch { expected: T::DATA_TYPE, got: cube.dtype() });
    }
    let big = cube.byte_order() == ByteOrder::Big;
    let size = std::mem::size_of::<T>();
    let values: Vec<T> = cube.raw().chunks_exact(size).map(|b| T::decode(b, big)).collect();
    let shape = (cube.lines(), cube.samples(), cube.bands());
    Ok(Array3::from_shape_vec(shape, values).expect("a cube holds lines x samples x bands samples"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{s, Array3, ShapeBuilder};

    fn pointer_seen<T: Sample>(view: ArrayView3<'_, T>) -> *const u8 {
        with_cube(view, |c| c.raw().as_ptr()).unwrap()
    }

    #[test]
    fn a_standard_layout_view_is_not_copied_and_others_are() {
        let a = Array3::from_shape_fn((4, 5, 6), |(l, s, b)| (l * 100 + s * 10 + b) as i16);
        assert_eq!(pointer_seen(a.view()), a.as_ptr().cast::<u8>(), "the whole array");
        // Whole lines from the second one on: still one contiguous block in BIP order.
        let lines = a.slice(s![1.., .., ..]);
        assert_eq!(pointer_seen(lines), lines.as_ptr().cast::<u8>(), "a range of lines");
        let bands = a.slice(s![.., .., 1..4]);
        assert_ne!(pointer_seen(bands), bands.as_ptr().cast::<u8>(), "a range of bands is copied");
        let f = Array3::from_shape_vec((4, 5, 6).f(), (0..120).map(|v| v as i16).collect()).unwrap();
        assert_ne!(pointer_seen(f.view()), f.as_ptr().cast::<u8>(), "Fortran order is copied");
    }

    #[test]
    fn a_copied_view_holds_the_views_values_in_bip_order() {
        let a = Array3::from_shape_fn((3, 4, 5), |(l, s, b)| (l * 100 + s * 10 + b) as f64);
        let permuted = a.view().permuted_axes([0, 1, 2]); // identity: no copy
        let reversed = a.slice(s![..;-1, .., ..]);
        let got = with_cube(reversed, |c| c.to_f64()).unwrap();
        let want: Vec<f64> = reversed.iter().copied().collect();
        assert_eq!(got, want);
        assert_eq!(with_cube(permuted, |c| c.to_f64()).unwrap(), a.iter().copied().collect::<Vec<_>>());
    }

    #[test]
    fn every_sample_type_round_trips_through_a_cube() {
        fn round_trip<T: Sample + PartialEq + std::fmt::Debug>(f: impl Fn(usize) -> T) {
            let a = Array3::from_shape_fn((2, 3, 4), |(l, s, b)| f(l * 12 + s * 4 + b));
            let back = with_cube(a.view(), |c| {
                assert_eq!(c.dtype(), T::DATA_TYPE);
                cube_to_array::<T>(c).unwrap()
            })
            .unwrap();
            assert_eq!(back, a);
        }
        round_trip(|i| i as u8);
        round_trip(|i| i as i16 - 7);
        round_trip(|i| i as u16 * 1000);
        round_trip(|i| i as i32 - 100_000);
        round_trip(|i| i as u32 * 100_000);
        round_trip(|i| (i as i64 - 5) << 40);
        round_trip(|i| (i as u64) << 50);
        round_trip(|i| i as f32 * 0.25 - 1.0);
        round_trip(|i| i as f64 / 3.0);
    }

    #[test]
    fn an_empty_axis_is_an_error() {
        let a = Array3::<f32>::zeros((3, 0, 2));
        let r = with_cube(a.view(), |_| ());
        assert!(matches!(r, Err(Error::EmptyAxis { lines: 3, samples: 0, bands: 2 })), "{r:?}");
    }
}
