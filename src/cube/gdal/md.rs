//! GDAL's multidimensional API (NetCDF-4 and HDF5 as groups, arrays and attributes), as the EMIT,
//! NEON and PRISMA readers use it: opening, attributes read whatever type the writer gave them, small
//! 1-D arrays, and a 3-D array read a block of lines at a time into a [`CubeBuilder`].

use std::path::Path;

use gdal::cpl::CslStringList;
use gdal::raster::{Attribute, Group, MDArray};
use gdal::{Dataset, DatasetOptions, GdalOpenFlags};

use super::hdf5_chunks::{self, ReadPath};
use super::library::Library;
use super::samples::{with_sample_type, BlockOrder, CubeBuilder, Linear, Sample};
use crate::cube::{CubeError, DataType};

/// The largest 1-D metadata array read (wavelengths, fwhm, band flags): no sensor has more bands.
const MAX_BANDS: usize = 1 << 16;

/// Opens `path` as a multidimensional dataset with one of `drivers`; a file GDAL cannot open (not
/// NetCDF/HDF5, truncated) is a header error that says so.
pub(super) fn open(path: &Path, drivers: &[&str], what: &str) -> Result<Dataset, CubeError> {
    let opts = DatasetOptions {
        // VERBOSE_ERROR: GDAL then says why a file cannot be opened ("not recognized", "truncated").
        open_flags: GdalOpenFlags::GDAL_OF_MULTIDIM_RASTER | GdalOpenFlags::GDAL_OF_READONLY | GdalOpenFlags::GDAL_OF_VERBOSE_ERROR,
        allowed_drivers: Some(drivers),
        ..Default::default()
    };
    Dataset::open_ex(path, opts).map_err(|e| {
        CubeError::Header(format!("{}: not a readable {what} file (GDAL: {})", path.display(), message(&e)))
    })
}

/// A GDAL error as a header error about `path`.
pub(super) fn gdal_error<'p>(path: &'p Path, what: &str) -> impl Fn(gdal::errors::GdalError) -> CubeError + 'p {
    let what = what.to_string();
    move |e| CubeError::Header(format!("{}: {what}: {}", path.display(), message(&e)))
}

/// GDAL's own message in a GDAL error, on one line (the crate's wrapper names the C function).
pub(super) fn message(e: &gdal::errors::GdalError) -> String {
    use gdal::errors::GdalError;
    let msg = match e {
        GdalError::NullPointer { msg, .. } | GdalError::CplError { msg, .. } => msg.clone(),
        other => other.to_string(),
    };
    let msg = one_line(&msg);
    if msg.is_empty() {
        "no message".into()
    } else {
        msg
    }
}

/// GDAL's messages may span lines; the API's errors are one line.
pub(super) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub(super) fn no_options() -> CslStringList {
    CslStringList::new()
}

/// A sub-group, or None when it is absent.
pub(super) fn group<'a>(parent: &Group<'a>, name: &str) -> Option<Group<'a>> {
    if !parent.group_names(no_options()).iter().any(|g| g == name) {
        return None;
    }
    parent.open_group(name, no_options()).ok()
}

/// An array of `parent`, or None when it is absent.
pub(super) fn array<'a>(parent: &'a Group, name: &str) -> Option<MDArray<'a>> {
    if !parent.array_names(no_options()).iter().any(|a| a == name) {
        return None;
    }
    parent.open_md_array(name, no_options()).ok()
}

/// The values of a numeric attribute, or of a text attribute that holds numbers (HDF5 writers store
/// NEON's `Data_Ignore_Value` either way); None when absent or not numbers.
pub(super) fn attr_f64s(attr: &Attribute) -> Option<Vec<f64>> {
    let class = attr.datatype().class();
    if class.is_numeric() {
        return Some(attr.read_as_f64_array());
    }
    if class.is_string() {
        let text = attr.read_as_string_array().join(" ");
        let parts: Result<Vec<f64>, _> = text
            .split(|c: char| c == ',' || c.is_whitespace() || c == '[' || c == ']')
            .filter(|p| !p.is_empty())
            .map(str::parse::<f64>)
            .collect();
        return parts.ok().filter(|v| !v.is_empty());
    }
    None
}

/// The single number an attribute holds.
pub(super) fn attr_f64(attr: &Attribute) -> Option<f64> {
    attr_f64s(attr).filter(|v| v.len() == 1).map(|v| v[0])
}

/// A text attribute.
pub(super) fn attr_text(attr: &Attribute) -> Option<String> {
    attr.datatype().class().is_string().then(|| attr.read_as_string_array().join("\n"))
}

/// The values of a 1-D numeric array of at most [`MAX_BANDS`] elements.
pub(super) fn read_f64s(path: &Path, a: &MDArray, name: &str) -> Result<Vec<f64>, CubeError> {
    if a.num_dimensions() != 1 || !a.datatype().class().is_numeric() {
        return Err(CubeError::Header(format!("{}: {name} must be a 1-D numeric array", path.display())));
    }
    let n = a.num_elements() as usize;
    if n > MAX_BANDS {
        return Err(CubeError::Header(format!("{}: {name} holds {n} values, more than any sensor has bands", path.display())));
    }
    a.read_as::<f64>(vec![0], vec![n]).map_err(gdal_error(path, name))
}

/// The values of a 1-D (or scalar) text array.
pub(super) fn read_strings(path: &Path, a: &MDArray, name: &str) -> Result<Vec<String>, CubeError> {
    if a.num_elements() as usize > MAX_BANDS || !a.datatype().class().is_string() {
        return Err(CubeError::Header(format!("{}: {name} must be a text array", path.display())));
    }
    a.read_as_string_array().map_err(gdal_error(path, name))
}

/// The names and sizes of an array's dimensions.
pub(super) fn dims(path: &Path, a: &MDArray, name: &str) -> Result<Vec<(String, usize)>, CubeError> {
    let d = a.dimensions().map_err(gdal_error(path, name))?;
    Ok(d.iter().map(|d| (d.name(), d.size())).collect())
}

/// The cube data type of a numeric array.
pub(super) fn numeric_type(path: &Path, a: &MDArray, name: &str) -> Result<DataType, CubeError> {
    let t = a.datatype();
    if !t.class().is_numeric() {
        return Err(CubeError::Unsupported(format!("{}: {name} is not numeric", path.display())));
    }
    super::samples::data_type_of(t.numeric_datatype(), &format!("{}: {name}", path.display()))
}

/// How one 3-D array of samples goes into the cube.
pub(super) struct Placement<'p> {
    /// The array's axes: (lines, samples, bands) for Bip, (lines, bands, samples) for Bil.
    pub order: BlockOrder,
    /// Cube band of each array band (None: left out).
    pub band_map: &'p [Option<usize>],
    /// Per array band.
    pub linear: &'p [Linear],
    pub fill: Option<f64>,
    /// Lines per chunk of the array as the file stores it ([`chunk_lines`]), when known.
    pub chunk_lines: Option<usize>,
    /// The array's path in the file (`/radiance`), for HDF5's direct chunk reads.
    pub full_name: &'p str,
}

/// Lines per chunk (the extent of the first dimension of a storage block) of the array `full_name`
/// (`/radiance`, `/SITE/Reflectance/Reflectance_Data`) of `ds`, or None when the file does not say
/// (contiguous storage) or the array is not there.
///
/// Why: a compressed chunk is decoded whole whenever a read touches it, and HDF5's chunk cache (1 MB
/// per dataset unless the file or netCDF-C sets it larger) does not hold a chunk of many lines of a
/// whole swath, so a block of lines that ends inside a chunk decodes that chunk again for the next one. The gdal crate does not
/// expose `GDALMDArrayGetBlockSize`, hence gdal-sys.
pub(super) fn chunk_lines(ds: &Dataset, full_name: &str) -> Option<usize> {
    let name = std::ffi::CString::new(full_name).ok()?;
    // SAFETY: the handles come from GDAL and are released here once; GDALMDArrayGetBlockSize returns
    // `count` values that the caller frees with VSIFree (CPLFree).
    unsafe {
        let root = gdal_sys::GDALDatasetGetRootGroup(ds.c_dataset());
        if root.is_null() {
            return None;
        }
        let array = gdal_sys::GDALGroupOpenMDArrayFromFullname(root, name.as_ptr(), std::ptr::null_mut());
        gdal_sys::GDALGroupRelease(root);
        if array.is_null() {
            return None;
        }
        let mut count = 0usize;
        let sizes = gdal_sys::GDALMDArrayGetBlockSize(array, &mut count);
        let first = (!sizes.is_null() && count > 0).then(|| *sizes);
        gdal_sys::VSIFree(sizes as *mut std::ffi::c_void);
        gdal_sys::GDALMDArrayRelease(array);
        first.filter(|&n| n > 0).and_then(|n| usize::try_from(n).ok())
    }
}

/// Lines per read: about [`block_lines`](super::samples::block_lines)' 32 MB, in whole chunks so that
/// every read starts and ends on a chunk boundary (one chunk, however large, when a chunk is larger,
/// up to [`MAX_CHUNK_READ`]; beyond that the 32 MB blocks, decoding a chunk more than once).
fn lines_per_read(per_block: usize, chunk_lines: Option<usize>, line_bytes: usize) -> usize {
    match chunk_lines {
        Some(c) if c <= per_block => per_block - per_block % c,
        Some(c) if c.saturating_mul(line_bytes) <= MAX_CHUNK_READ => c,
        _ => per_block,
    }
}

/// The largest block of lines read at once to cover a whole chunk.
const MAX_CHUNK_READ: usize = 512 << 20;

/// Reads the 3-D array `a` (of cube type `dtype`) into `cube`: through HDF5's direct chunk reads where
/// they give exactly GDAL's samples ([`hdf5_chunks`]), else through GDAL a block of lines at a time.
/// `library` is held on entry and on return (released while chunks are decoded).
#[allow(clippy::too_many_arguments)] // the array, where its samples go, and the lock the fast path lets go of
pub(super) fn read_cube(
    path: &Path,
    a: &MDArray,
    name: &str,
    dtype: DataType,
    cube: &mut CubeBuilder,
    place: &Placement,
    library: &mut Library,
) -> Result<(), CubeError> {
    let d = dims(path, a, name)?;
    let [(_, lines), (_, n1), (_, n2)] = d.as_slice() else {
        return Err(CubeError::Header(format!("{}: {name} has {} dimensions, not 3", path.display(), d.len())));
    };
    let (lines, n1, n2) = (*lines, *n1, *n2);
    let (samples, bands) = match place.order {
        BlockOrder::Bip => (n1, n2),
        BlockOrder::Bil => (n2, n1),
    };
    if lines != cube.lines() || place.band_map.len() != bands {
        return Err(CubeError::Header(format!("{}: {name} is {lines} x {n1} x {n2}, which does not match the cube", path.display())));
    }
    match hdf5_chunks::read(path, place.full_name, dtype, [lines, n1, n2], cube, place, library) {
        Ok(()) => {
            tracing::debug!(array = name, "read through HDF5's direct chunk reads");
            hdf5_chunks::record(ReadPath::DirectChunks);
            return Ok(());
        }
        Err(why) => {
            tracing::debug!(array = name, why = %why, "read through GDAL: HDF5's direct chunk reads do not apply");
            hdf5_chunks::record(ReadPath::Gdal(why));
        }
    }
    with_sample_type!(dtype, T => read_blocks::<T>(path, a, name, (lines, n1, n2), samples, bands, cube, place))
}

#[allow(clippy::too_many_arguments)] // the array, its shape, and where its blocks go
fn read_blocks<T: Sample>(
    path: &Path,
    a: &MDArray,
    name: &str,
    shape: (usize, usize, usize),
    samples: usize,
    bands: usize,
    cube: &mut CubeBuilder,
    place: &Placement,
) -> Result<(), CubeError> {
    let (lines, n1, n2) = shape;
    let size = std::mem::size_of::<T>();
    let per_block = lines_per_read(super::samples::block_lines(samples, bands, size), place.chunk_lines, samples * bands * size);
    tracing::debug!(array = name, lines_per_read = per_block, chunk_lines = ?place.chunk_lines, "reading a 3-D array");
    let mut buf: Vec<T> = Vec::new();
    let mut first = 0;
    while first < lines {
        let count = per_block.min(lines - first);
        buf.resize(count * n1 * n2, T::default());
        a.read_into_slice(&mut buf, vec![first as u64, 0, 0], vec![count, n1, n2])
            .map_err(gdal_error(path, &format!("reading {name} lines {first}..{}", first + count)))?;
        cube.put(first, count, &buf, place.order, bands, place.band_map, place.linear, place.fill);
        first += count;
    }
    Ok(())
}
