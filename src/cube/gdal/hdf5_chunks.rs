//! The fast path for the big 3-D array of a NetCDF-4 or HDF5 input (EMIT's `radiance`, NEON's
//! `Reflectance_Data`, PRISMA's cubes): HDF5 hands over each chunk's stored bytes (its direct chunk
//! read, `H5Dread_chunk`, HDF5 1.10.2 and later), under the library lock and nothing more, and the
//! filters are undone here, outside the lock, on every core: deflate (libdeflate) and byte shuffle.
//!
//! Why: through GDAL, netCDF-C and HDF5 inflate every chunk with zlib on one thread, under the library
//! lock (Debian builds them without thread safety), about 170 MB/s of samples: the read of an EMIT
//! granule then takes as long as the MNF that follows it.
//!
//! Taken only where it gives exactly what GDAL gives, else the caller reads through GDAL and the debug log
//! says why: a chunked array of a plain integer or IEEE float type, filters among {shuffle, deflate} (a
//! chunk whose filter mask skips one is undone without it), every chunk stored (an unstored chunk reads
//! as the fill value), and any HDF5 or decoding error. The samples go into the cube through the same
//! [`Lines::put`] as GDAL's blocks (band map, scale and offset, fill kept), so the cube is the same bit for
//! bit.
//!
//! HDF5 is reached through the process's symbols (libgdal loaded it): the same library instance GDAL and
//! netCDF-C use, so the one lock covers all three, and the crate links nothing more than GDAL. Nothing
//! here parses HDF5: HDF5 finds the chunks.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};

use super::library::{library, Library};
use super::md::Placement;
use super::samples::{with_sample_type, CubeBuilder, Lines, Sample};
use crate::cube::{ByteOrder, DataType};

/// Which way the last 3-D array read on this thread was read (for the tests, which must tell the fast
/// path from a silent fall back to GDAL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadPath {
    /// HDF5's direct chunk reads, decompressed here.
    DirectChunks,
    /// GDAL's multidimensional API, and why the direct chunk reads were not used.
    Gdal(String),
}

thread_local!(static LAST_PATH: RefCell<Option<ReadPath>> = const { RefCell::new(None) });

/// The path that read the last 3-D NetCDF/HDF5 array on this thread.
pub fn last_read_path() -> Option<ReadPath> {
    LAST_PATH.with(|p| p.borrow().clone())
}

pub(super) fn record(path: ReadPath) {
    LAST_PATH.with(|p| *p.borrow_mut() = Some(path));
}

/// The most decoded bytes one block of chunks (a chunk's lines across the whole array) may take: the
/// block is decoded before it is placed, so beyond this the cube would be held twice over (an array
/// stored as one chunk); GDAL reads those.
const MAX_BLOCK_BYTES: usize = 512 << 20;

type Hid = i64;
type Herr = c_int;
type Hsize = u64;

const H5P_DEFAULT: Hid = 0;
const H5F_ACC_RDONLY: c_uint = 0;
const H5D_CHUNKED: c_int = 2;
const H5T_INTEGER: c_int = 0;
const H5T_FLOAT: c_int = 1;
const H5T_ORDER_LE: c_int = 0;
const H5T_ORDER_BE: c_int = 1;
const H5T_SGN_NONE: c_int = 0;
const H5T_SGN_2: c_int = 1;
const H5Z_FILTER_DEFLATE: c_int = 1;
const H5Z_FILTER_SHUFFLE: c_int = 2;

/// Declares [`Api`], HDF5's functions used here, each looked up by name in the process.
macro_rules! hdf5_api {
    ($($field:ident = $sym:literal: fn($($arg:ty),*) -> $ret:ty;)*) => {
        struct Api {
            $($field: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl Api {
            fn load() -> Result<Api, String> {
                Ok(Api {
                    $($field: {
                        // SAFETY: dlsym with a NUL-terminated name; the symbol, when found, is HDF5's
                        // function of that name, whose C signature (HDF5 1.10 and later: hid_t is
                        // int64_t, hsize_t uint64_t, herr_t int) is the field's.
                        unsafe {
                            let f = libc::dlsym(libc::RTLD_DEFAULT, concat!($sym, "\0").as_ptr().cast());
                            if f.is_null() {
                                return Err(format!("HDF5's {} is not in the process (HDF5 older than 1.10.5?)", $sym));
                            }
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(f)
                        }
                    },)*
                })
            }
        }
    };
}

hdf5_api! {
    open = "H5open": fn() -> Herr;
    fopen = "H5Fopen": fn(*const c_char, c_uint, Hid) -> Hid;
    fclose = "H5Fclose": fn(Hid) -> Herr;
    dopen = "H5Dopen2": fn(Hid, *const c_char, Hid) -> Hid;
    dclose = "H5Dclose": fn(Hid) -> Herr;
    dget_type = "H5Dget_type": fn(Hid) -> Hid;
    dget_space = "H5Dget_space": fn(Hid) -> Hid;
    dget_create_plist = "H5Dget_create_plist": fn(Hid) -> Hid;
    dget_num_chunks = "H5Dget_num_chunks": fn(Hid, Hid, *mut Hsize) -> Herr;
    dget_chunk_storage_size = "H5Dget_chunk_storage_size": fn(Hid, *const Hsize, *mut Hsize) -> Herr;
    dread_chunk = "H5Dread_chunk": fn(Hid, Hid, *const Hsize, *mut u32, *mut c_void) -> Herr;
    tget_class = "H5Tget_class": fn(Hid) -> c_int;
    tget_size = "H5Tget_size": fn(Hid) -> usize;
    tget_order = "H5Tget_order": fn(Hid) -> c_int;
    tget_sign = "H5Tget_sign": fn(Hid) -> c_int;
    tget_precision = "H5Tget_precision": fn(Hid) -> usize;
    tget_offset = "H5Tget_offset": fn(Hid) -> c_int;
    tget_fields = "H5Tget_fields": fn(Hid, *mut usize, *mut usize, *mut usize, *mut usize, *mut usize) -> Herr;
    tget_ebias = "H5Tget_ebias": fn(Hid) -> usize;
    tclose = "H5Tclose": fn(Hid) -> Herr;
    sget_ndims = "H5Sget_simple_extent_ndims": fn(Hid) -> c_int;
    sget_dims = "H5Sget_simple_extent_dims": fn(Hid, *mut Hsize, *mut Hsize) -> c_int;
    sclose = "H5Sclose": fn(Hid) -> Herr;
    pget_layout = "H5Pget_layout": fn(Hid) -> c_int;
    pget_chunk = "H5Pget_chunk": fn(Hid, c_int, *mut Hsize) -> c_int;
    pget_nfilters = "H5Pget_nfilters": fn(Hid) -> c_int;
    pget_filter2 = "H5Pget_filter2": fn(Hid, c_uint, *mut c_uint, *mut usize, *mut c_uint, usize, *mut c_char, *mut c_uint) -> c_int;
    pclose = "H5Pclose": fn(Hid) -> Herr;
}

/// HDF5's functions, looked up once (and `H5open` called), or why they cannot be.
fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let api = Api::load()?;
        // SAFETY: H5open takes no arguments; the caller holds the library lock.
        if unsafe { (api.open)() } < 0 {
            return Err("H5open failed".into());
        }
        Ok(api)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// One filter of the array's pipeline, as the writer applied them.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Filter {
    Deflate,
    /// HDF5's byte shuffle of elements of this many bytes.
    Shuffle(usize),
}

/// What the chunks hold and how they tile the array.
#[derive(Debug)]
struct Layout {
    shape: [usize; 3],
    chunk: [usize; 3],
    /// Chunks along each dimension.
    grid: [usize; 3],
    size: usize,
    order: ByteOrder,
    /// In the order the writer applied them (undone in reverse).
    filters: Vec<Filter>,
}

impl Layout {
    fn chunk_bytes(&self) -> usize {
        self.chunk.iter().product::<usize>() * self.size
    }
}

/// The open file and dataset (closed under the library lock by [`Open::close`]).
struct Open {
    file: Hid,
    dset: Hid,
}

impl Open {
    fn new(api: &Api, path: &Path, full_name: &str) -> Result<Open, String> {
        use std::os::unix::ffi::OsStrExt;
        let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| "a path with a NUL byte".to_string())?;
        let cname = CString::new(full_name).map_err(|_| "an array name with a NUL byte".to_string())?;
        // SAFETY: NUL-terminated strings; the caller holds the library lock.
        let file = unsafe { (api.fopen)(cpath.as_ptr(), H5F_ACC_RDONLY, H5P_DEFAULT) };
        if file < 0 {
            return Err("HDF5 cannot open the file".into());
        }
        // SAFETY: as above; `file` is open.
        let dset = unsafe { (api.dopen)(file, cname.as_ptr(), H5P_DEFAULT) };
        if dset < 0 {
            // SAFETY: `file` is open and closed once.
            unsafe { (api.fclose)(file) };
            return Err(format!("HDF5 cannot open {full_name}"));
        }
        Ok(Open { file, dset })
    }

    fn close(self, api: &Api) {
        // SAFETY: both are open and closed once; the caller holds the library lock.
        unsafe {
            (api.dclose)(self.dset);
            (api.fclose)(self.file);
        }
    }
}

/// Reads the 3-D array `full_name` of `path` (`shape` as GDAL gave it, of cube type `dtype`) into `cube`
/// as [`Placement`] says, through HDF5's direct chunk reads; Err(why not) when it cannot, with nothing
/// promised about the cube (the caller then reads it all through GDAL). `library` is held on entry and
/// on return.
pub(super) fn read(
    path: &Path,
    full_name: &str,
    dtype: DataType,
    shape: [usize; 3],
    cube: &mut CubeBuilder,
    place: &Placement,
    library: &mut Library,
) -> Result<(), String> {
    let api = api()?;
    let open = Open::new(api, path, full_name)?;
    let result = layout(api, open.dset, shape, dtype).and_then(|layout| {
        tracing::debug!(array = full_name, ?layout, "reading through HDF5's direct chunk reads");
        with_sample_type!(dtype, T => library.unlocked(|| pipeline::<T>(api, open.dset, &layout, cube, place)))
    });
    open.close(api);
    result
}

/// The array's layout, or why the fast path cannot read it.
fn layout(api: &Api, dset: Hid, shape: [usize; 3], dtype: DataType) -> Result<Layout, String> {
    // SAFETY: `dset` is open; every id obtained here is closed here; the caller holds the library lock.
    unsafe {
        let space = (api.dget_space)(dset);
        if space < 0 {
            return Err("HDF5 cannot give the dataspace".into());
        }
        let mut dims = [0 as Hsize; 3];
        let ndims = (api.sget_ndims)(space);
        let ok = ndims == 3 && (api.sget_dims)(space, dims.as_mut_ptr(), std::ptr::null_mut()) == 3;
        (api.sclose)(space);
        if !ok || dims.iter().zip(&shape).any(|(&d, &s)| d as usize != s) {
            return Err(format!("HDF5 gives a shape ({ndims} dims, {dims:?}) other than GDAL's {shape:?}"));
        }

        let (size, order) = sample_type(api, dset, dtype)?;

        let plist = (api.dget_create_plist)(dset);
        if plist < 0 {
            return Err("HDF5 cannot give the creation properties".into());
        }
        let chunking = chunking(api, plist, size);
        (api.pclose)(plist);
        let (chunk, filters) = chunking?;
        let grid: [usize; 3] = std::array::from_fn(|d| shape[d].div_ceil(chunk[d]));
        let layout = Layout { shape, chunk, grid, size, order, filters };
        let block_bytes = [chunk[0], shape[1], shape[2], size].iter().try_fold(1usize, |a, &b| a.checked_mul(b));
        let chunk_bytes = chunk.iter().try_fold(size, |a, &b| a.checked_mul(b));
        if block_bytes.is_none_or(|b| b > MAX_BLOCK_BYTES) || chunk_bytes.is_none_or(|b| b > MAX_BLOCK_BYTES) {
            return Err(format!("chunks of {chunk:?} samples: a block of them across the array is more than {} MB at once", MAX_BLOCK_BYTES >> 20));
        }
        // HDF5 1.10 wants the dataset's dataspace here (later versions also take H5S_ALL).
        let space = (api.dget_space)(dset);
        let mut stored: Hsize = 0;
        let counted = space >= 0 && (api.dget_num_chunks)(dset, space, &mut stored) >= 0;
        if space >= 0 {
            (api.sclose)(space);
        }
        if !counted {
            return Err("HDF5 cannot count the stored chunks".into());
        }
        let all: usize = grid.iter().product();
        if stored as usize != all {
            return Err(format!("{stored} of its {all} chunks are stored (the others read as the fill value)"));
        }
        Ok(layout)
    }
}

/// The size and byte order of the array's samples, when they are exactly `dtype` (GDAL's reading of
/// the type): a plain integer, or an IEEE float.
unsafe fn sample_type(api: &Api, dset: Hid, dtype: DataType) -> Result<(usize, ByteOrder), String> {
    let t = (api.dget_type)(dset);
    if t < 0 {
        return Err("HDF5 cannot give the data type".into());
    }
    let class = (api.tget_class)(t);
    let size = (api.tget_size)(t);
    let order = (api.tget_order)(t);
    let precision = (api.tget_precision)(t);
    let offset = (api.tget_offset)(t);
    let sign = (api.tget_sign)(t);
    let (mut spos, mut epos, mut esize, mut mpos, mut msize) = (0, 0, 0, 0, 0);
    let fields = (class == H5T_FLOAT).then(|| {
        let ok = (api.tget_fields)(t, &mut spos, &mut epos, &mut esize, &mut mpos, &mut msize) >= 0;
        (ok, (spos, epos, esize, mpos, msize), (api.tget_ebias)(t))
    });
    (api.tclose)(t);
    let order = match order {
        H5T_ORDER_LE => ByteOrder::Little,
        H5T_ORDER_BE => ByteOrder::Big,
        _ => return Err(format!("a sample byte order HDF5 numbers {order}")),
    };
    if precision != size * 8 || offset != 0 {
        return Err(format!("samples of {precision} bits at bit {offset} in {size} bytes"));
    }
    let found = match (class, size, sign) {
        (H5T_INTEGER, 1, H5T_SGN_NONE) => DataType::U8,
        (H5T_INTEGER, 2, H5T_SGN_2) => DataType::I16,
        (H5T_INTEGER, 2, H5T_SGN_NONE) => DataType::U16,
        (H5T_INTEGER, 4, H5T_SGN_2) => DataType::I32,
        (H5T_INTEGER, 4, H5T_SGN_NONE) => DataType::U32,
        (H5T_INTEGER, 8, H5T_SGN_2) => DataType::I64,
        (H5T_INTEGER, 8, H5T_SGN_NONE) => DataType::U64,
        (H5T_FLOAT, 4, _) if fields == Some((true, (31, 23, 8, 0, 23), 127)) => DataType::F32,
        (H5T_FLOAT, 8, _) if fields == Some((true, (63, 52, 11, 0, 52), 1023)) => DataType::F64,
        _ => return Err(format!("a sample type (HDF5 class {class}, {size} bytes) it does not decode")),
    };
    if found != dtype {
        return Err(format!("HDF5's sample type {} is not GDAL's {}", found.name(), dtype.name()));
    }
    Ok((size, order))
}

/// The chunk shape and the filters of a dataset creation property list.
unsafe fn chunking(api: &Api, plist: Hid, size: usize) -> Result<([usize; 3], Vec<Filter>), String> {
    if (api.pget_layout)(plist) != H5D_CHUNKED {
        return Err("not chunked".into());
    }
    let mut c = [0 as Hsize; 3];
    if (api.pget_chunk)(plist, 3, c.as_mut_ptr()) != 3 || c.contains(&0) {
        return Err("HDF5 gives no 3-D chunk shape".into());
    }
    let chunk = c.map(|n| n as usize);
    let n = (api.pget_nfilters)(plist);
    if n < 0 {
        return Err("HDF5 cannot list the filters".into());
    }
    let mut filters = Vec::new();
    for idx in 0..n as c_uint {
        let (mut flags, mut config) = (0, 0);
        let mut values = [0 as c_uint; 8];
        let mut nvalues = values.len();
        let id = (api.pget_filter2)(plist, idx, &mut flags, &mut nvalues, values.as_mut_ptr(), 0, std::ptr::null_mut(), &mut config);
        filters.push(match id {
            H5Z_FILTER_DEFLATE => Filter::Deflate,
            // HDF5 stores the element size as the shuffle's first value (its "set local" step).
            H5Z_FILTER_SHUFFLE => Filter::Shuffle(if nvalues >= 1 && values[0] > 0 { values[0] as usize } else { size }),
            3 => return Err("the fletcher32 checksum filter".into()),
            4 => return Err("the szip filter".into()),
            5 => return Err("the n-bit filter".into()),
            6 => return Err("the scale-offset filter".into()),
            32000 => return Err("the LZF filter".into()),
            other => return Err(format!("HDF5 filter {other}")),
        });
    }
    // Two deflates would leave the size of the inner stream unknown; no writer does that.
    if filters.iter().filter(|f| **f == Filter::Deflate).count() > 1 {
        return Err("deflate twice".into());
    }
    Ok((chunk, filters))
}

/// One chunk's stored bytes.
struct RawChunk {
    /// Its index along dimensions 1 and 2.
    at: [usize; 2],
    /// HDF5's filter mask: bit i set when filter i of the pipeline was skipped for this chunk.
    mask: u32,
    bytes: Vec<u8>,
}

/// The stored chunks of one block of lines (chunk index `index` along the first dimension).
struct RawBlock {
    index: usize,
    chunks: Vec<RawChunk>,
}

/// Reads the stored chunks of block `index` (the caller holds the library lock), into buffers from
/// `pool` (those of blocks already decoded) where there are any.
fn read_block(api: &Api, dset: Hid, layout: &Layout, index: usize, pool: &mut Vec<Vec<u8>>) -> Result<RawBlock, String> {
    let mut chunks = Vec::with_capacity(layout.grid[1] * layout.grid[2]);
    for j in 0..layout.grid[1] {
        for k in 0..layout.grid[2] {
            let offset = [index * layout.chunk[0], j * layout.chunk[1], k * layout.chunk[2]].map(|v| v as Hsize);
            let mut stored: Hsize = 0;
            // SAFETY: `dset` is open, `offset` holds 3 values (the rank); the library lock is held.
            if unsafe { (api.dget_chunk_storage_size)(dset, offset.as_ptr(), &mut stored) } < 0 || stored == 0 {
                return Err(format!("HDF5 gives no stored chunk at {offset:?}"));
            }
            let mut bytes = pool.pop().unwrap_or_default();
            bytes.clear();
            bytes.resize(stored as usize, 0);
            let mut mask = 0u32;
            // SAFETY: as above; `bytes` holds the chunk's stored size, all H5Dread_chunk writes.
            if unsafe { (api.dread_chunk)(dset, H5P_DEFAULT, offset.as_ptr(), &mut mask, bytes.as_mut_ptr().cast()) } < 0 {
                return Err(format!("HDF5 cannot read the chunk at {offset:?}"));
            }
            chunks.push(RawChunk { at: [j, k], mask, bytes });
        }
    }
    Ok(RawBlock { index, chunks })
}

/// Blocks read ahead of the decoding (each holds one block of chunks as stored).
const READ_AHEAD: usize = 1;

/// Reads the array's chunks a block of lines at a time on one thread, under the library lock, while the
/// blocks already read are decoded and placed on as many threads as rayon's pool has, each block into
/// its own lines of the cube.
///
/// The decoders are threads of their own, not rayon's: a decoder waits for the reader, which waits for
/// the library lock, and another read may hold that lock while it waits for rayon's pool (the GeoTIFF
/// reader places its planes there). Rayon workers waiting here would close that circle.
fn pipeline<T: Sample>(api: &Api, dset: Hid, layout: &Layout, cube: &mut CubeBuilder, place: &Placement) -> Result<(), String> {
    let blocks: Vec<Mutex<Option<Lines>>> = cube.line_blocks(layout.chunk[0]).into_iter().map(|b| Mutex::new(Some(b))).collect();
    if blocks.len() != layout.grid[0] {
        return Err(format!("{} blocks of lines for {} chunks down the array", blocks.len(), layout.grid[0]));
    }
    let decoders = rayon::current_num_threads().clamp(1, layout.grid[0].max(1));
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<String>> = Mutex::new(None);
    let fail = |e: String| {
        first_error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
        failed.store(true, Ordering::SeqCst);
    };
    // The stored chunks' buffers go back to the reader rather than being allocated (and faulted in)
    // again for every block; all are freed when the read ends.
    let (give_back, given_back) = mpsc::channel::<Vec<u8>>();
    let (tx, rx) = mpsc::sync_channel::<RawBlock>(READ_AHEAD);
    let rx = Mutex::new(rx);
    let (failed, fail, blocks, rx) = (&failed, &fail, &blocks, &rx);
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut pool = Vec::new();
            for index in 0..layout.grid[0] {
                if failed.load(Ordering::SeqCst) {
                    break;
                }
                pool.extend(given_back.try_iter());
                let block = {
                    let _library = library();
                    read_block(api, dset, layout, index, &mut pool)
                };
                match block {
                    Ok(block) => {
                        if tx.send(block).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        fail(e);
                        break;
                    }
                }
            }
            // `tx` dropped here: the decoders' receive ends once they have taken what was sent.
        });
        for _ in 0..decoders {
            let give_back = give_back.clone();
            s.spawn(move || {
                let mut scratch = Scratch::default();
                loop {
                    let Ok(block) = rx.lock().unwrap_or_else(|e| e.into_inner()).recv() else { break };
                    // After a failure the rest is only drained, so that the reader is never left waiting.
                    if !failed.load(Ordering::SeqCst) {
                        let mut lines = blocks[block.index].lock().unwrap_or_else(|e| e.into_inner()).take().expect("each block is read once");
                        if let Err(e) = place_block::<T>(layout, &block, &mut lines, place, &mut scratch) {
                            fail(format!("block {} of lines: {e}", block.index));
                        }
                    }
                    for chunk in block.chunks {
                        // The reader may have finished: the buffer is then dropped.
                        let _ = give_back.send(chunk.bytes);
                    }
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Decodes one block of lines from its stored chunks into `lines`, as [`Lines::put`] places GDAL's
/// samples. A block of one chunk that the cube takes as it is (the whole array's width, samples in
/// the cube's type, no band map or scale) is decoded straight into the cube.
fn place_block<T: Sample>(layout: &Layout, block: &RawBlock, lines: &mut Lines, place: &Placement, scratch: &mut Scratch) -> Result<(), String> {
    let [_, n1, n2] = layout.shape;
    let [c0, c1, c2] = layout.chunk;
    let (size, count) = (layout.size, lines.count());
    if block.chunks.len() == 1 && c1 == n1 && c2 == n2 && count == c0 {
        if let Some(dst) = lines.plain_bytes::<T>(place.order, place.band_map, place.linear) {
            unfilter_into(layout, &block.chunks[0], scratch, dst)?;
            if layout.order != super::samples::native_order() {
                for sample in dst.chunks_exact_mut(size) {
                    sample.reverse();
                }
            }
            return Ok(());
        }
    }
    let mut out = vec![T::default(); count * n1 * n2];
    let mut decoded = std::mem::take(&mut scratch.chunk);
    decoded.resize(layout.chunk_bytes(), 0);
    for chunk in &block.chunks {
        unfilter_into(layout, chunk, scratch, &mut decoded).map_err(|e| format!("chunk {:?}: {e}", chunk.at))?;
        // The chunk's part inside the array (edge chunks are stored whole, beyond the array's end too).
        let (j0, k0) = (chunk.at[0] * c1, chunk.at[1] * c2);
        let (nj, nk) = (c1.min(n1 - j0), c2.min(n2 - k0));
        for l in 0..count {
            for j in 0..nj {
                let src = &decoded[(l * c1 + j) * c2 * size..][..nk * size];
                let dst = &mut out[(l * n1 + j0 + j) * n2 + k0..][..nk];
                match layout.order {
                    ByteOrder::Little => dst.iter_mut().zip(src.chunks_exact(size)).for_each(|(d, s)| *d = T::from_bytes(s, ByteOrder::Little)),
                    ByteOrder::Big => dst.iter_mut().zip(src.chunks_exact(size)).for_each(|(d, s)| *d = T::from_bytes(s, ByteOrder::Big)),
                }
            }
        }
    }
    scratch.chunk = decoded;
    lines.put(&out, place.order, place.band_map.len(), place.band_map, place.linear, place.fill);
    Ok(())
}

/// Buffers reused from chunk to chunk: two for the filters' intermediate outputs (each filter reads
/// the other's), one for a decoded chunk.
#[derive(Default)]
struct Scratch {
    buffers: [Vec<u8>; 2],
    chunk: Vec<u8>,
    inflater: Option<libdeflater::Decompressor>,
}

/// Writes a chunk's samples into `dst` (`chunk_bytes` long): its stored bytes with its filters undone, in
/// reverse of the order they were applied, those its mask skips left out.
fn unfilter_into(layout: &Layout, chunk: &RawChunk, scratch: &mut Scratch, dst: &mut [u8]) -> Result<(), String> {
    let want = layout.chunk_bytes();
    if dst.len() != want {
        return Err(format!("a destination of {} bytes for a chunk of {want}", dst.len()));
    }
    let active: Vec<Filter> =
        layout.filters.iter().enumerate().rev().filter(|(i, _)| *i >= 32 || chunk.mask & (1 << i) == 0).map(|(_, f)| *f).collect();
    let Some(last) = active.len().checked_sub(1) else {
        if chunk.bytes.len() != want {
            return Err(format!("{} bytes stored unfiltered, not the chunk's {want}", chunk.bytes.len()));
        }
        dst.copy_from_slice(&chunk.bytes);
        return Ok(());
    };
    let Scratch { buffers, inflater, .. } = scratch;
    // The buffer holding the bytes so far (None: the stored bytes).
    let mut current: Option<usize> = None;
    for (step, filter) in active.iter().enumerate() {
        let (first, second) = buffers.split_at_mut(1);
        let (buffer, other, into) = if current == Some(0) { (&mut second[0], &first[0], 1) } else { (&mut first[0], &second[0], 0) };
        let input: &[u8] = if current.is_some() { other } else { &chunk.bytes };
        // The one deflate has only shuffles (which keep the length) before it, so it gives the chunk's
        // full size; a shuffle gives its input's.
        let len = if *filter == Filter::Deflate { want } else { input.len() };
        let out: &mut [u8] = if step == last {
            if len != want {
                return Err(format!("{len} bytes after the filters, not the chunk's {want}"));
            }
            &mut *dst
        } else {
            buffer.resize(len, 0);
            buffer
        };
        match *filter {
            Filter::Deflate => {
                let inflater = inflater.get_or_insert_with(libdeflater::Decompressor::new);
                let n = inflater.zlib_decompress(input, out).map_err(|e| format!("inflating: {e:?}"))?;
                if n != want {
                    return Err(format!("inflated to {n} bytes, not the chunk's {want}"));
                }
            }
            Filter::Shuffle(element) => unshuffle(input, out, element),
        }
        current = Some(into);
    }
    Ok(())
}

/// Undoes HDF5's byte shuffle of elements of `element` bytes: `src` holds the first byte of every
/// element, then every second byte, ...; bytes beyond the last whole element are left in place.
fn unshuffle(src: &[u8], dst: &mut [u8], element: usize) {
    let n = src.len() / element.max(1);
    match element {
        0 | 1 => dst.copy_from_slice(src),
        2 => unshuffle_2(src, dst, n),
        4 => unshuffle_4(src, dst, n),
        8 => unshuffle_n::<8>(src, dst, n),
        _ => {
            for (i, out) in dst[..n * element].chunks_exact_mut(element).enumerate() {
                for (b, o) in out.iter_mut().enumerate() {
                    *o = src[b * n + i];
                }
            }
        }
    }
    let whole = n * element.max(1);
    dst[whole..].copy_from_slice(&src[whole..]);
}

fn unshuffle_n<const N: usize>(src: &[u8], dst: &mut [u8], n: usize) {
    let streams: [&[u8]; N] = std::array::from_fn(|b| &src[b * n..(b + 1) * n]);
    for (i, out) in dst[..n * N].chunks_exact_mut(N).enumerate() {
        for (o, stream) in out.iter_mut().zip(&streams) {
            *o = stream[i];
        }
    }
}

/// [`unshuffle_n`] for 2 and 4 bytes, as zipped streams (twice as fast: no bounds checks).
fn unshuffle_2(src: &[u8], dst: &mut [u8], n: usize) {
    let (s0, s1) = src[..2 * n].split_at(n);
    for ((o, a), b) in dst[..2 * n].chunks_exact_mut(2).zip(s0).zip(s1) {
        o.copy_from_slice(&[*a, *b]);
    }
}

fn unshuffle_4(src: &[u8], dst: &mut [u8], n: usize) {
    let (s0, rest) = src[..4 * n].split_at(n);
    let (s1, rest) = rest.split_at(n);
    let (s2, s3) = rest.split_at(n);
    for ((((o, a), b), c), d) in dst[..4 * n].chunks_exact_mut(4).zip(s0).zip(s1).zip(s2).zip(s3) {
        o.copy_from_slice(&[*a, *b, *c, *d]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HDF5's shuffle, as its filter writes it.
    fn shuffle(src: &[u8], element: usize) -> Vec<u8> {
        let n = src.len() / element;
        let mut out = Vec::with_capacity(src.len());
        for b in 0..element {
            out.extend((0..n).map(|i| src[i * element + b]));
        }
        out.extend_from_slice(&src[n * element..]);
        out
    }

    #[test]
    fn unshuffle_undoes_the_shuffle_for_every_element_size_with_leftover_bytes() {
        let data: Vec<u8> = (0..103u32).map(|i| (i * 37 + 11) as u8).collect();
        for element in [1, 2, 3, 4, 8, 16] {
            let shuffled = shuffle(&data, element);
            if element > 1 {
                assert_ne!(shuffled, data, "element {element}");
            }
            let mut back = vec![0; data.len()];
            unshuffle(&shuffled, &mut back, element);
            assert_eq!(back, data, "element {element}");
        }
    }

    fn layout(filters: Vec<Filter>) -> Layout {
        Layout { shape: [2, 3, 4], chunk: [2, 3, 4], grid: [1, 1, 1], size: 4, order: ByteOrder::Little, filters }
    }

    fn deflated(bytes: &[u8]) -> Vec<u8> {
        let mut c = libdeflater::Compressor::new(libdeflater::CompressionLvl::new(1).unwrap());
        let mut out = vec![0; c.zlib_compress_bound(bytes.len())];
        let n = c.zlib_compress(bytes, &mut out).unwrap();
        out.truncate(n);
        out
    }

    #[test]
    fn filters_are_undone_in_reverse_and_a_masked_filter_is_skipped() {
        let samples: Vec<u8> = (0..96u32).map(|i| (i * 7) as u8).collect();
        let l = layout(vec![Filter::Shuffle(4), Filter::Deflate]);
        let mut scratch = Scratch::default();
        let mut got = vec![0; samples.len()];
        let both = RawChunk { at: [0, 0], mask: 0, bytes: deflated(&shuffle(&samples, 4)) };
        unfilter_into(&l, &both, &mut scratch, &mut got).unwrap();
        assert_eq!(got, samples);
        // The shuffle skipped for this chunk (bit 0): deflate alone.
        let no_shuffle = RawChunk { at: [0, 0], mask: 1, bytes: deflated(&samples) };
        got.fill(0);
        unfilter_into(&l, &no_shuffle, &mut scratch, &mut got).unwrap();
        assert_eq!(got, samples);
        // Both skipped: the bytes as stored.
        let raw = RawChunk { at: [0, 0], mask: 3, bytes: samples.clone() };
        got.fill(0);
        unfilter_into(&l, &raw, &mut scratch, &mut got).unwrap();
        assert_eq!(got, samples);
        // Shuffle alone (deflate skipped: bit 1).
        let shuffled = RawChunk { at: [0, 0], mask: 2, bytes: shuffle(&samples, 4) };
        got.fill(0);
        unfilter_into(&l, &shuffled, &mut scratch, &mut got).unwrap();
        assert_eq!(got, samples);
    }

    #[test]
    fn a_chunk_that_inflates_to_another_size_is_an_error() {
        let l = layout(vec![Filter::Deflate]);
        let mut got = vec![0; 96];
        for bytes in [deflated(&[1u8; 95]), deflated(&[1u8; 97]), vec![7u8; 40]] {
            let chunk = RawChunk { at: [0, 0], mask: 0, bytes };
            assert!(unfilter_into(&l, &chunk, &mut Scratch::default(), &mut got).is_err());
        }
    }
}
