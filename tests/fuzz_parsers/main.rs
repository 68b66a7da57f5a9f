//! Structured fuzzing of the parsers that read what strangers send: the ENVI header, the ENVI data size
//! and offset checks, the `.npy` header and body (from a file and streamed as an upload), the multipart
//! upload and the MNF query parameters. Stable toolchain, so proptest rather than cargo-fuzz.
//!
//! Inputs are generated two ways: valid inputs built from their parts (random dimensions, data types,
//! byte orders, layouts, offsets, key orders and spellings), whose expected result is known, and hostile
//! ones (the same generators fed absurd values, and the real headers of tests/data or valid files
//! mutated byte by byte). The invariants, for every input:
//! - an error value or a valid result, never a panic (proptest reports a panic as a failure, shrunk);
//! - a valid input gives exactly the expected result (so a parser that refuses everything fails);
//! - no single allocation larger than the input allows: a global allocator records the largest
//!   request made while one input is parsed, and it must stay within `alloc_bound` of the input's size
//!   (a header claiming 2^40 x 2^40 x 224 must be refused from its numbers, not by a failed allocation).
//!
//! Inputs per parser: HYPERMNF_FUZZ_CASES (default 2000: a few seconds for all of them in a debug
//! build); `scripts/fuzz.sh` runs 10^6 per parser. PROPTEST_RNG_SEED fixes the seed.
//!
//! One test binary, so that the allocation peak is one counter for one process: the targets are in
//! tests/fuzz_parsers/ by parser; the allocator, the runner and the shared generators are here.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Cursor;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;
use hypermnf::api::error::Error as ApiError;
use hypermnf::api::multipart_body::MultipartBody;
use hypermnf::api::{multipart, params, upload};
use hypermnf::cube::layout::{Axis, FileOrder};
use hypermnf::cube::{envi, npy, ByteOrder, Cube, CubeError, DataType, Interleave};
use hypermnf::mnf::MnfError;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sha2::{Digest, Sha256};

mod envi_files;
mod multipart_bodies;
mod npy_files;
mod query_strings;

// ------------------------------------------------------------------------------------------------
// The largest single allocation while one input is parsed

struct PeakAlloc;

/// Largest allocation (or reallocation) size requested since the last `reset_peak`. Recorded before
/// the request is passed on, so that a huge request that fails still counts.
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        PEAK.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        PEAK.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        PEAK.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: PeakAlloc = PeakAlloc;

/// The peak is one counter for the process: the fuzz tests run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// What a parser may allocate at once for an input of `input_len` bytes: the decoded cube is at most
/// the input's size, growing buffers may double once, and a fixed allowance covers the small tables,
/// messages and the runtime's own buffers (tokio's blocking pool and channels in the upload paths,
/// measured at well under 64 KiB). A claim in a header is never a reason to allocate more.
fn alloc_bound(input_len: usize) -> usize {
    const FIXED: usize = 256 << 10;
    2 * input_len + FIXED
}

fn check_peak(input_len: usize, what: &str) -> Result<(), TestCaseError> {
    let peak = PEAK.load(Ordering::Relaxed);
    prop_assert!(
        peak <= alloc_bound(input_len),
        "{what}: allocated {peak} bytes at once for an input of {input_len} bytes (bound {})",
        alloc_bound(input_len)
    );
    Ok(())
}

fn reset_peak() {
    PEAK.store(0, Ordering::Relaxed);
}

// ------------------------------------------------------------------------------------------------
// Running a fuzz target

fn cases() -> u32 {
    std::env::var("HYPERMNF_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

/// What one input came to: "ok", or the error's code. Tallied, so that a run shows that the generators
/// reach both the valid and the refused paths.
type Outcome = &'static str;

/// Runs `test` over `cases()` inputs from `strategy`, without persistence files, and prints how many
/// inputs were run, how long it took and what they came to (scripts/fuzz.sh collects these lines).
fn fuzz<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<Outcome, TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_iters: 2000,
        max_global_rejects: u32::MAX,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let count = AtomicUsize::new(0);
    let tally = Mutex::new(std::collections::BTreeMap::<Outcome, usize>::new());
    let t = Instant::now();
    let result = runner.run(&strategy, |input| {
        count.fetch_add(1, Ordering::Relaxed);
        let outcome = test(input)?;
        *tally.lock().unwrap().entry(outcome).or_default() += 1;
        Ok(())
    });
    let secs = t.elapsed().as_secs_f64();
    let n = count.load(Ordering::Relaxed);
    let tally: Vec<String> = tally.into_inner().unwrap().into_iter().map(|(k, v)| format!("{k} {v}")).collect();
    eprintln!("fuzz {name}: {n} inputs in {secs:.1} s ({})", tally.join(", "));
    if let Err(e) = result {
        panic!("fuzz {name}: {e}");
    }
}

// ------------------------------------------------------------------------------------------------
// Shared generators

/// Deterministic filler bytes (cheaper than a proptest vector, and shrinking them teaches nothing).
fn filler(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn dtype() -> impl Strategy<Value = DataType> {
    prop::sample::select(DataType::ALL.to_vec())
}

fn byte_order() -> impl Strategy<Value = ByteOrder> {
    prop_oneof![Just(ByteOrder::Little), Just(ByteOrder::Big)]
}

/// Integers as a hostile header writes them: small valid ones, limits, overflows, and not numbers.
fn hostile_int() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (1u64..7).prop_map(|v| v.to_string()),
        2 => prop::sample::select(vec![
            "0", "-1", "1099511627776", "4294967296", "4294967297", "9223372036854775807",
            "9223372036854775808", "18446744073709551615", "18446744073709551616", "-9223372036854775808",
            "abc", "1e3", "0x10", " 7 ", "{3}", "{}", "", "+5", "3.0", "\u{0663}", "1 2", "NaN", "inf",
        ])
        .prop_map(String::from),
        1 => any::<i64>().prop_map(|v| v.to_string()),
        1 => (0u32..64).prop_map(|e| (1u64 << e).to_string()),
    ]
}

/// Byte-level edits of a seed: insertions, deletions, replacements, truncation, line duplication.
#[derive(Debug, Clone)]
enum Edit {
    Insert(f64, Vec<u8>),
    Replace(f64, Vec<u8>),
    Delete(f64, usize),
    Truncate(f64),
    DuplicateLine(f64),
}

fn edit_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => "[{}=,;:()'\"\n\r\t 0-9a-zA-Z.<>|-]{1,6}".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 1..6),
        1 => prop::sample::select(vec![
            "\u{feff}", "\u{fffd}", "é", "\0", "\r\n", "}\n", "{\n", " = ", "99999999999999999999",
            "-1", "1099511627776",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
    ]
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let one = prop_oneof![
        3 => (0.0..1.0f64, edit_bytes()).prop_map(|(a, b)| Edit::Insert(a, b)),
        3 => (0.0..1.0f64, edit_bytes()).prop_map(|(a, b)| Edit::Replace(a, b)),
        2 => (0.0..1.0f64, 1usize..16).prop_map(|(a, n)| Edit::Delete(a, n)),
        1 => (0.0..1.0f64).prop_map(Edit::Truncate),
        1 => (0.0..1.0f64).prop_map(Edit::DuplicateLine),
    ];
    prop::collection::vec(one, 1..8)
}

fn apply_edits(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut out = seed.to_vec();
    let at = |f: f64, len: usize| ((len as f64) * f) as usize;
    for e in edits {
        match e {
            Edit::Insert(f, b) => {
                let i = at(*f, out.len());
                out.splice(i..i, b.iter().copied());
            }
            Edit::Replace(f, b) => {
                let i = at(*f, out.len());
                let end = (i + b.len()).min(out.len());
                out.splice(i..end, b.iter().copied());
            }
            Edit::Delete(f, n) => {
                let i = at(*f, out.len());
                let end = (i + n).min(out.len());
                out.drain(i..end);
            }
            Edit::Truncate(f) => out.truncate(at(*f, out.len())),
            Edit::DuplicateLine(f) => {
                let i = at(*f, out.len());
                let start = out[..i].iter().rposition(|&c| c == b'\n').map_or(0, |p| p + 1);
                let end = out[i..].iter().position(|&c| c == b'\n').map_or(out.len(), |p| i + p + 1);
                let line = out[start..end].to_vec();
                out.splice(end..end, line);
            }
        }
    }
    out
}

/// Where element (line, sample, band) of a cube lies in a file of the given order, in elements.
fn file_index(order: FileOrder, (l, s, b): (usize, usize, usize), (nl, ns, nb): (usize, usize, usize)) -> usize {
    let extent = |a: Axis| match a {
        Axis::Line => nl,
        Axis::Sample => ns,
        Axis::Band => nb,
    };
    let index = |a: Axis| match a {
        Axis::Line => l,
        Axis::Sample => s,
        Axis::Band => b,
    };
    let [o, m, i] = order.0;
    (index(o) * extent(m) + index(m)) * extent(i) + index(i)
}

/// Every sample of `cube` equals the one at its place in `data` (stored in `order` after `offset`).
fn check_samples(cube: &Cube, data: &[u8], offset: usize, order: FileOrder) -> Result<(), TestCaseError> {
    let (nl, ns, nb, n) = (cube.lines(), cube.samples(), cube.bands(), cube.dtype().size());
    for l in 0..nl {
        for s in 0..ns {
            for b in 0..nb {
                let bip = ((l * ns + s) * nb + b) * n;
                let at = offset + file_index(order, (l, s, b), (nl, ns, nb)) * n;
                prop_assert_eq!(&cube.raw()[bip..bip + n], &data[at..at + n], "sample ({}, {}, {})", l, s, b);
            }
        }
    }
    Ok(())
}
/// A valid header, described by its parts and rendered with varied spelling.
#[derive(Debug, Clone)]
struct EnviSpec {
    lines: usize,
    samples: usize,
    bands: usize,
    dtype: DataType,
    interleave: Interleave,
    byte_order: ByteOrder,
    offset: usize,
    /// Optional extras, each rendered only when set: band names, bbl, wavelength, a multi-line
    /// description, an unknown key, a comment.
    band_names: bool,
    bbl: Option<Vec<bool>>,
    wavelength: bool,
    description: bool,
    unknown: bool,
    comment: bool,
    /// Spelling: key case and spacing, CRLF line ends, a BOM, entry order.
    shout_keys: bool,
    crlf: bool,
    bom: bool,
    order_seed: u64,
}

fn envi_spec() -> impl Strategy<Value = EnviSpec> {
    (
        (1usize..6, 1usize..6, 1usize..6, dtype(), 0usize..3, byte_order(), prop_oneof![3 => Just(0usize), 1 => 0usize..40]),
        (any::<bool>(), prop::collection::vec(any::<bool>(), 6), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<u64>()),
    )
        .prop_map(|((lines, samples, bands, dtype, il, byte_order, offset), (band_names, bbl, use_bbl, wavelength, description, unknown, comment), (shout_keys, crlf, bom, order_seed))| {
            EnviSpec {
                lines,
                samples,
                bands,
                dtype,
                interleave: [Interleave::Bsq, Interleave::Bil, Interleave::Bip][il],
                byte_order,
                offset,
                band_names,
                bbl: use_bbl.then(|| bbl[..bands].to_vec()),
                wavelength,
                description,
                unknown,
                comment,
                shout_keys,
                crlf,
                bom,
                order_seed,
            }
        })
}

impl EnviSpec {
    fn render(&self) -> String {
        let key = |k: &str| if self.shout_keys { k.to_uppercase().replace(' ', "   ") } else { k.to_string() };
        let mut entries = vec![
            format!("{} = {}", key("samples"), self.samples),
            format!("{} = {}", key("lines"), self.lines),
            format!("{} = {}", key("bands"), self.bands),
            format!("{} = {}", key("data type"), self.dtype.envi_code()),
            format!("{} = {}", key("interleave"), if self.shout_keys { self.interleave.name().to_uppercase() } else { self.interleave.name().to_string() }),
            format!("{} = {}", key("byte order"), self.byte_order.envi_code()),
            format!("{} = {}", key("header offset"), self.offset),
        ];
        if self.band_names {
            let names: Vec<String> = (0..self.bands).map(|b| format!("band {b}")).collect();
            entries.push(format!("band names = {{\n {}}}", names.join(",\n ")));
        }
        if let Some(bbl) = &self.bbl {
            entries.push(format!("bbl = {{{}}}", bbl.iter().map(|&g| if g { "1" } else { "0" }).collect::<Vec<_>>().join(", ")));
        }
        if self.wavelength {
            entries.push(format!("wavelength = {{{}}}", (0..self.bands).map(|b| format!("{}.5", 400 + b)).collect::<Vec<_>>().join(",")));
        }
        if self.description {
            entries.push("description = {a scene = with an equals sign,\n  over two lines}".into());
        }
        if self.unknown {
            entries.push("sensor type = {AVIRIS}".into());
        }
        // Shuffle the entries (ENVI does not fix their order).
        let mut x = self.order_seed | 1;
        for i in (1..entries.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            entries.swap(i, (x % (i as u64 + 1)) as usize);
        }
        if self.comment {
            entries.insert(entries.len() / 2, "; samples = 999 (a comment)".into());
        }
        let nl = if self.crlf { "\r\n" } else { "\n" };
        let mut text = String::new();
        if self.bom {
            text.push('\u{feff}');
        }
        text.push_str("ENVI");
        for e in entries {
            text.push_str(nl);
            text.push_str(&e.replace('\n', nl));
        }
        text.push_str(nl);
        text
    }

    fn data_bytes(&self) -> usize {
        self.lines * self.samples * self.bands * self.dtype.size()
    }
}

// ------------------------------------------------------------------------------------------------
// The upload paths (npy and multipart)

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Scratch space for the upload paths: in memory where the machine has /dev/shm (each upload ends
/// with an fsync, which costs nothing there).
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// Codes an upload may be refused with: all client errors.
const UPLOAD_CODES: [&str; 9] = [
    "invalid_npy", "invalid_header", "unsupported", "size_mismatch", "too_large", "invalid_multipart", "invalid_params",
    "incomplete_body", "invalid_request",
];

fn check_refusal(e: &ApiError) -> Result<(), TestCaseError> {
    prop_assert!(e.status().is_client_error(), "answered {} ({}): {e}", e.status(), e.code());
    prop_assert!(UPLOAD_CODES.contains(&e.code()), "unexpected code {}: {e}", e.code());
    Ok(())
}
