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

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Cursor;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::FromRequest;
use bytes::Bytes;
use hypermnf::api::error::Error as ApiError;
use hypermnf::api::{params, upload};
use hypermnf::cube::layout::{Axis, FileOrder};
use hypermnf::cube::{envi, npy, ByteOrder, Cube, CubeError, DataType, Interleave};
use hypermnf::mnf::MnfError;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use sha2::{Digest, Sha256};

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

// ------------------------------------------------------------------------------------------------
// ENVI headers

const REAL_HEADERS: [&str; 3] = [
    include_str!("data/salinasA_224_bip_be.hdr"),
    include_str!("data/jasper_ridge_r198_bil.hdr"),
    include_str!("data/abu_beach1_cat_island_bsq.hdr"),
];

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

/// A header built from hostile values: every interpreted key may be missing, repeated or absurd.
fn hostile_envi_text() -> impl Strategy<Value = String> {
    let entry = |k: &'static str, v: BoxedStrategy<String>| {
        prop_oneof![8 => v.prop_map(move |v| vec![format!("{k} = {v}")]), 1 => Just(vec![]), 1 => Just(vec![format!("{k} = 2"), format!("{k} = 3")])]
    };
    let list = prop_oneof![
        Just("{1, 0}".to_string()),
        Just("{".to_string()),
        Just("{1,\n0,".to_string()),
        Just("{}".to_string()),
        Just("{,}".to_string()),
        Just("{1} trailing".to_string()),
        Just("}{".to_string()),
        (1usize..400).prop_map(|n| format!("{{{}}}", vec!["1"; n].join(","))),
        "[{},0-9a-z. \n-]{0,30}",
    ];
    (
        (
            entry("samples", hostile_int().boxed()),
            entry("lines", hostile_int().boxed()),
            entry("bands", hostile_int().boxed()),
            entry("data type", prop_oneof![Just("1".to_string()), Just("2".to_string()), Just("4".to_string()), Just("6".to_string()), Just("9".to_string()), hostile_int()].boxed()),
            entry("interleave", prop::sample::select(vec!["bsq", "bil", "bip", "BIP", "bsq bil", "", "{bil}", "xyz"]).prop_map(String::from).boxed()),
            entry("byte order", prop_oneof![Just("0".to_string()), Just("1".to_string()), hostile_int()].boxed()),
            entry("header offset", hostile_int().boxed()),
        ),
        (
            entry("bbl", list.clone().boxed()),
            entry("wavelength", list.clone().boxed()),
            entry("band names", list.boxed()),
            entry("data ignore value", prop::sample::select(vec!["-9999", "nan", "NaN", "inf", "x", "1e400", "{0}"]).prop_map(String::from).boxed()),
            entry("file compression", prop::sample::select(vec!["0", "1", "{0}"]).prop_map(String::from).boxed()),
        ),
        prop_oneof![4 => Just("ENVI".to_string()), 1 => Just("envi".to_string()), 1 => Just("".to_string()), 1 => Just("\u{feff}ENVI".to_string())],
        any::<u64>(),
    )
        .prop_map(|((a, b, c, d, e, f, g), (h, i, j, k, l), magic, seed)| {
            let mut lines: Vec<String> = [a, b, c, d, e, f, g, h, i, j, k, l].into_iter().flatten().collect();
            let mut x = seed | 1;
            for n in (1..lines.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                lines.swap(n, (x % (n as u64 + 1)) as usize);
            }
            format!("{magic}\n{}\n", lines.join("\n"))
        })
}

/// Header text: hostile parts, or a real or valid header mutated byte by byte (read lossily, as the
/// reader reads header files).
fn any_envi_text() -> impl Strategy<Value = String> {
    let seed = prop_oneof![
        prop::sample::select(REAL_HEADERS.to_vec()).prop_map(String::from),
        envi_spec().prop_map(|s| s.render()),
    ];
    prop_oneof![
        2 => hostile_envi_text(),
        3 => (seed, edits()).prop_map(|(s, e)| String::from_utf8_lossy(&apply_edits(s.as_bytes(), &e)).into_owned()),
    ]
}

/// What a parsed header must satisfy whatever the input was.
fn check_header(h: &envi::EnviHeader) -> Result<(), TestCaseError> {
    prop_assert!(h.lines > 0 && h.samples > 0 && h.bands > 0);
    for len in [h.meta.bbl.as_ref().map(Vec::len), h.meta.wavelength.as_ref().map(Vec::len), h.meta.band_names.as_ref().map(Vec::len)]
        .into_iter()
        .flatten()
    {
        prop_assert_eq!(len, h.bands);
    }
    match h.data_bytes() {
        Ok(n) => prop_assert_eq!(n, (h.lines * h.samples * h.bands * h.data_type.size()) as u64),
        Err(e) => prop_assert!(matches!(e, CubeError::TooLarge(_)), "{e}"),
    }
    Ok(())
}

#[test]
fn fuzz_envi_header() {
    let strategy = prop_oneof![1 => envi_spec().prop_map(|s| (s.render(), Some(s))), 3 => any_envi_text().prop_map(|t| (t, None))];
    fuzz("envi_header", strategy, |(text, spec)| {
        reset_peak();
        let parsed = envi::parse_header(&text);
        check_peak(text.len(), "parse_header")?;
        let outcome = parsed.as_ref().map_or_else(CubeError::code, |_| "ok");
        match (&parsed, spec) {
            (Ok(h), None) => check_header(h)?,
            (Err(_), None) => {}
            (Ok(h), Some(s)) => {
                check_header(h)?;
                prop_assert_eq!((h.lines, h.samples, h.bands), (s.lines, s.samples, s.bands));
                prop_assert_eq!((h.data_type, h.interleave, h.byte_order), (s.dtype, s.interleave, s.byte_order));
                prop_assert_eq!(h.header_offset, s.offset as u64);
                prop_assert_eq!(&h.meta.bbl, &s.bbl);
                prop_assert_eq!(h.meta.band_names.is_some(), s.band_names);
            }
            (Err(e), Some(_)) => prop_assert!(false, "a valid header was refused: {e}\n{text}"),
        }
        Ok(outcome)
    });
}

// ------------------------------------------------------------------------------------------------
// ENVI data: sizes and offsets

/// A header (valid, or claiming absurd sizes) and a data file whose length is off by `delta`.
#[derive(Debug, Clone)]
struct EnviData {
    spec: EnviSpec,
    /// Replaces the valid dimensions by absurd ones (then only an error is acceptable).
    absurd: Option<(String, String, String)>,
    delta: i64,
    seed: u64,
}

fn envi_data() -> impl Strategy<Value = EnviData> {
    let absurd = prop_oneof![
        6 => Just(None),
        1 => Just(Some(("1099511627776".to_string(), "1099511627776".to_string(), "224".to_string()))),
        1 => (hostile_int(), hostile_int(), hostile_int()).prop_map(Some),
    ];
    let delta = prop_oneof![4 => Just(0i64), 1 => Just(-1i64), 1 => Just(1i64), 1 => -5000i64..5000, 1 => Just(i64::MIN)];
    (envi_spec(), absurd, delta, any::<u64>()).prop_map(|(spec, absurd, delta, seed)| EnviData { spec, absurd, delta, seed })
}

#[test]
fn fuzz_envi_data() {
    fuzz("envi_data", envi_data(), |d| {
        let mut text = d.spec.render();
        if let Some((l, s, b)) = &d.absurd {
            text = text
                .lines()
                .map(|line| {
                    let k = line.trim_start_matches('\u{feff}').to_ascii_lowercase();
                    let k = k.split_whitespace().collect::<Vec<_>>().join(" ");
                    if k.starts_with("lines =") {
                        format!("lines = {l}")
                    } else if k.starts_with("samples =") {
                        format!("samples = {s}")
                    } else if k.starts_with("bands =") {
                        format!("bands = {b}")
                    } else {
                        line.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
        }
        let exact = d.spec.offset + d.spec.data_bytes();
        // i64::MIN stands for "no data at all".
        let len = if d.delta == i64::MIN { 0 } else { (exact as i64 + d.delta).clamp(0, exact as i64 + 5000) as usize };
        let data = filler(d.seed, len);
        reset_peak();
        let got = envi::read_parts_from(&text, &mut Cursor::new(&data), len as u64, Path::new("fuzz.img"));
        check_peak(text.len() + len, "read_parts_from")?;
        let outcome = got.as_ref().map_or_else(CubeError::code, |_| "ok");
        let valid = d.absurd.is_none() || envi::parse_header(&text).is_ok_and(|h| h.data_bytes().ok().and_then(|n| n.checked_add(h.header_offset)) == Some(len as u64));
        match got {
            Ok(cube) => {
                prop_assert!(valid, "a cube from a header that does not match {len} bytes of data");
                let h = envi::parse_header(&text).unwrap();
                prop_assert_eq!((cube.lines(), cube.samples(), cube.bands()), (h.lines, h.samples, h.bands));
                prop_assert_eq!(cube.raw().len() as u64, h.data_bytes().unwrap());
                check_samples(&cube, &data, h.header_offset as usize, FileOrder::of(h.interleave))?;
            }
            Err(e) => {
                prop_assert!(!(d.absurd.is_none() && len == exact), "valid header and data refused: {e}");
                if d.absurd.is_none() {
                    prop_assert!(matches!(e, CubeError::SizeMismatch(_)), "expected a size mismatch, got {e}");
                }
            }
        }
        Ok(outcome)
    });
}

// ------------------------------------------------------------------------------------------------
// .npy header and body

/// A `.npy` file described by its parts; `valid` says whether the parts are all acceptable.
#[derive(Debug, Clone)]
struct NpySpec {
    version: u8,
    descr: String,
    fortran: String,
    shape: String,
    /// The key order, quotes and spacing of the dict.
    key_order: u8,
    double_quotes: bool,
    trailing_comma: bool,
    pad: usize,
    /// The header length field: right, or some other number.
    header_len: Option<u32>,
    delta: i64,
    seed: u64,
    /// (dtype, byte order, fortran, shape) when every part is valid.
    expect: Option<NpyExpect>,
}

/// What a valid `.npy` file decodes to: (dtype, byte order, fortran order, shape).
type NpyExpect = (DataType, ByteOrder, bool, [usize; 3]);

fn descr_of(dtype: DataType, order: ByteOrder) -> String {
    let kind = match dtype {
        DataType::F32 | DataType::F64 => 'f',
        DataType::I16 | DataType::I32 | DataType::I64 => 'i',
        _ => 'u',
    };
    let prefix = match (dtype.size(), order) {
        (1, _) => '|',
        (_, ByteOrder::Little) => '<',
        (_, ByteOrder::Big) => '>',
    };
    format!("{prefix}{kind}{}", dtype.size())
}

fn npy_spec() -> impl Strategy<Value = NpySpec> {
    let valid = (dtype(), byte_order(), any::<bool>(), (1usize..6, 1usize..6, 1usize..6), any::<bool>())
        .prop_map(|(dt, bo, f, (a, b, c), long)| {
            let shape = if long { format!("({a}L, {b}L, {c}L)") } else { format!("({a}, {b}, {c},)") };
            (descr_of(dt, bo), if f { "True" } else { "False" }.to_string(), shape, Some((dt, if dt.size() == 1 { ByteOrder::Little } else { bo }, f, [a, b, c])))
        });
    let dim = prop_oneof![4 => (1u64..6).prop_map(|v| v.to_string()), 1 => prop::sample::select(vec!["0", "1099511627776", "18446744073709551615", "18446744073709551616", "-1", "x", "2L", "1.0"]).prop_map(String::from)];
    let hostile = (
        prop_oneof![
            2 => (dtype(), byte_order()).prop_map(|(d, b)| descr_of(d, b)),
            1 => prop::sample::select(vec!["<c8", "<c16", "|O", "O", "<U3", "|S5", "|V8", "<M8[ns]", "|b1", "|i1", "<f2", "<f16", "|i2", "", "<", "f4", "=i4", "B", "<q"]).prop_map(String::from),
        ],
        prop_oneof![Just("True".to_string()), Just("False".to_string()), Just("true".to_string()), Just("'False'".to_string()), Just("0".to_string())],
        prop_oneof![
            prop::collection::vec(dim, 0..6).prop_map(|d| format!("({})", d.join(", "))),
            Just("[3, 4, 5]".to_string()),
            Just("(3, 4, 5".to_string()),
            Just("()".to_string()),
            Just("(,)".to_string()),
        ],
    )
        .prop_map(|(d, f, s)| (d, f, s, None));
    (
        prop_oneof![3 => valid, 2 => hostile],
        prop_oneof![6 => Just(1u8), 2 => Just(2u8), 2 => Just(3u8), 1 => any::<u8>()],
        (0u8..6, any::<bool>(), any::<bool>(), 0usize..80),
        prop_oneof![6 => Just(None), 1 => any::<u32>().prop_map(Some), 1 => (0u32..300).prop_map(Some)],
        prop_oneof![4 => Just(0i64), 1 => Just(-1i64), 1 => Just(1i64), 1 => -3000i64..3000],
        any::<u64>(),
    )
        .prop_map(|((descr, fortran, shape, expect), version, (key_order, double_quotes, trailing_comma, pad), header_len, delta, seed)| {
            let known = matches!(version, 1..=3);
            NpySpec {
                version,
                descr,
                fortran,
                shape,
                key_order,
                double_quotes,
                trailing_comma,
                pad,
                header_len,
                delta,
                seed,
                expect: expect.filter(|_| known && header_len.is_none() && delta == 0),
            }
        })
}

impl NpySpec {
    /// The file: header and `need + delta` bytes of samples (need from `expect`, else a guess).
    fn render(&self) -> Vec<u8> {
        let q = if self.double_quotes { '"' } else { '\'' };
        let mut items = [
            format!("{q}descr{q}: {q}{}{q}", self.descr),
            format!("{q}fortran_order{q}: {}", self.fortran),
            format!("{q}shape{q}: {}", self.shape),
        ];
        items.rotate_left((self.key_order % 3) as usize);
        if self.key_order >= 3 {
            items.swap(0, 1);
        }
        let mut dict = format!("{{{}{}}}", items.join(", "), if self.trailing_comma { ", " } else { "" });
        dict.push_str(&" ".repeat(self.pad));
        dict.push('\n');
        let mut out = b"\x93NUMPY".to_vec();
        out.extend_from_slice(&[self.version, 0]);
        let len = self.header_len.unwrap_or(dict.len() as u32);
        if self.version == 1 {
            out.extend_from_slice(&(len as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&len.to_le_bytes());
        }
        out.extend_from_slice(dict.as_bytes());
        let need = match self.expect {
            Some((dt, _, _, [a, b, c])) => a * b * c * dt.size(),
            None => (self.seed % 400) as usize,
        };
        let body = (need as i64 + self.delta).max(0) as usize;
        out.extend_from_slice(&filler(self.seed, body));
        out
    }
}

/// A `.npy` file: from its parts, or a valid one mutated byte by byte.
fn npy_input() -> impl Strategy<Value = (Vec<u8>, Option<NpyExpect>)> {
    prop_oneof![
        3 => npy_spec().prop_map(|s| (s.render(), s.expect)),
        2 => (npy_spec(), edits()).prop_map(|(s, e)| {
            let file = s.render();
            // Mutate the header only, mostly: the samples are opaque.
            let head = (file.len()).min(12 + 40 + s.pad + 40);
            let mut out = apply_edits(&file[..head], &e);
            out.extend_from_slice(&file[head..]);
            (out, None)
        }),
    ]
}

#[test]
fn fuzz_npy_file() {
    fuzz("npy_file", npy_input(), |(file, expect)| {
        reset_peak();
        let got = npy::read_from(&mut Cursor::new(&file), file.len() as u64, Path::new("fuzz.npy"));
        check_peak(file.len(), "npy::read_from")?;
        let outcome = got.as_ref().map_or_else(CubeError::code, |_| "ok");
        match (got, expect) {
            (Ok(cube), _) => {
                let h = npy::read_header(&mut file.as_slice()).map_err(|e| TestCaseError::fail(format!("header re-read: {e}")))?;
                prop_assert_eq!(h.shape.clone(), vec![cube.lines() as u64, cube.samples() as u64, cube.bands() as u64]);
                prop_assert_eq!(cube.raw().len() as u64, file.len() as u64 - h.data_offset);
                let order = if h.fortran_order { FileOrder::FORTRAN } else { FileOrder::BIP };
                check_samples(&cube, &file, h.data_offset as usize, order)?;
                if let Some((dt, bo, f, shape)) = expect {
                    prop_assert_eq!((cube.dtype(), cube.byte_order(), h.fortran_order), (dt, bo, f));
                    prop_assert_eq!([cube.lines(), cube.samples(), cube.bands()], shape);
                }
            }
            (Err(e), Some(_)) => prop_assert!(false, "a valid .npy was refused: {e}"),
            (Err(_), None) => {}
        }
        Ok(outcome)
    });
}

// ------------------------------------------------------------------------------------------------
// .npy uploads: the body streamed in chunks through the upload path, header checked on the way

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

#[test]
fn fuzz_npy_upload() {
    let rt = runtime();
    let dir = scratch();
    let strategy = (npy_input(), 1usize..3000, prop_oneof![3 => Just(1u64 << 20), 1 => 0u64..2000]);
    fuzz("npy_upload", strategy, |((file, _), chunk, limit)| {
        let chunks: Vec<Result<Bytes, std::io::Error>> = file.chunks(chunk).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let expected = npy::read_from(&mut Cursor::new(&file), file.len() as u64, Path::new("fuzz.npy"));
        reset_peak();
        let got = rt.block_on(async {
            let mut budget = upload::Budget::new(limit);
            let mut check = |prefix: &[u8]| upload::npy_claim(prefix, limit);
            // The body's SHA-256 is asked for on odd chunk sizes only: both ways are fuzzed.
            upload::receive(futures::stream::iter(chunks), dir.path().join("cube.npy"), &mut budget, Some(&mut check), None, chunk % 2 == 1).await
        });
        check_peak(file.len(), "upload::receive")?;
        let outcome = got.as_ref().map_or_else(ApiError::code, |_| "ok");
        match (&got, &expected) {
            (Ok(r), Ok(cube)) => {
                prop_assert!(file.len() as u64 <= limit);
                prop_assert_eq!(r.bytes, file.len() as u64);
                prop_assert_eq!(r.sha256, (chunk % 2 == 1).then(|| <[u8; 32]>::from(Sha256::digest(&file))));
                prop_assert_eq!(std::fs::read(&r.path).unwrap(), file.clone());
                if let Some(d) = r.content_digest {
                    prop_assert_eq!(d, cube.content_digest());
                }
            }
            (Ok(_), Err(e)) => prop_assert!(false, "the upload path took a .npy the reader refuses: {e}"),
            (Err(e), Ok(_)) => {
                check_refusal(e)?;
                prop_assert!(file.len() as u64 > limit, "a valid .npy within the limit was refused: {e}");
                prop_assert_eq!(e.code(), "too_large");
            }
            (Err(e), Err(_)) => check_refusal(e)?,
        }
        Ok(outcome)
    });
}

// ------------------------------------------------------------------------------------------------
// Multipart uploads

#[derive(Debug, Clone)]
enum PartBody {
    /// A valid header (rendered spec), its data part of the right size (`delta` 0) or not.
    Header(EnviSpec),
    Data(i64),
    Params(String),
    Raw(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Part {
    name: Option<String>,
    filename: bool,
    content_type: bool,
    body: PartBody,
}

#[derive(Debug, Clone)]
struct MultipartCase {
    parts: Vec<Part>,
    spec: EnviSpec,
    boundary: String,
    /// How the request's Content-Type names the boundary: right, quoted, missing or wrong.
    content_type: u8,
    /// Byte edits of the rendered body.
    edits: Vec<Edit>,
    lf_only: bool,
    limit: u64,
    seed: u64,
}

fn params_json() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("{}".to_string()),
        Just("{\"components\": 1}".to_string()),
        Just("{\"components\": 0}".to_string()),
        Just("{\"components\": -1}".to_string()),
        Just("{\"components\": 1e9}".to_string()),
        Just("{\"snr\": \"NaN\"}".to_string()),
        Just("{\"noise_window\": [5, 5, 1, 1]}".to_string()),
        Just("{\"colour\": 1}".to_string()),
        Just("[1, 2]".to_string()),
        Just("{\"components\":".to_string()),
        Just("null".to_string()),
        "[{}\":,a-z0-9 ]{0,20}",
    ]
}

fn multipart_case() -> impl Strategy<Value = MultipartCase> {
    // None: the part's usual name; Some("<none>"): no name at all.
    let name = prop_oneof![8 => Just(None), 1 => prop::sample::select(vec!["header", "data", "params", "", "Header", "extra", "data\"; x=\"y", "<none>"]).prop_map(|s| Some(s.to_string()))];
    let part = (name, any::<bool>(), any::<bool>(), prop_oneof![4 => Just(0i64), 1 => -50i64..50], params_json(), prop::collection::vec(any::<u8>(), 0..64));
    // The usual parts, in the usual order, most of the time; anything else the rest.
    let parts = prop_oneof![
        3 => Just(vec![0u8, 1]),
        1 => Just(vec![0u8, 1, 2]),
        1 => Just(vec![1u8, 0]),
        1 => prop::collection::vec(0u8..4, 0..6),
    ];
    (
        envi_spec(),
        parts,
        prop::collection::vec(part, 6),
        prop_oneof![4 => Just("XyZzYboundary".to_string()), 1 => "[a-zA-Z0-9'()+_,./:=? -]{1,70}"],
        prop_oneof![6 => Just(0u8), 1 => 1u8..5],
        prop_oneof![4 => Just(vec![]), 1 => edits()],
        prop::bool::weighted(0.1),
        prop_oneof![4 => Just(1u64 << 20), 1 => 0u64..3000],
        any::<u64>(),
    )
        .prop_map(|(spec, kinds, part_pool, boundary, content_type, edits, lf_only, limit, seed)| {
            let parts = kinds
                .iter()
                .zip(part_pool)
                .map(|(&kind, (name, filename, ctype, delta, params, raw))| {
                    let (default_name, body) = match kind {
                        0 => ("header", PartBody::Header(spec.clone())),
                        1 => ("data", PartBody::Data(delta)),
                        2 => ("params", PartBody::Params(params)),
                        _ => ("raw", PartBody::Raw(raw)),
                    };
                    let name = name.unwrap_or_else(|| default_name.to_string());
                    Part { name: (name != "<none>").then_some(name), filename, content_type: ctype, body }
                })
                .collect();
            MultipartCase { parts, spec, boundary, content_type, edits, lf_only, limit, seed }
        })
}

impl MultipartCase {
    fn part_bytes(&self, p: &Part) -> Vec<u8> {
        match &p.body {
            PartBody::Header(s) => s.render().into_bytes(),
            PartBody::Data(delta) => {
                let exact = (self.spec.offset + self.spec.data_bytes()) as i64;
                filler(self.seed, (exact + delta).max(0) as usize)
            }
            PartBody::Params(t) => t.clone().into_bytes(),
            PartBody::Raw(b) => b.clone(),
        }
    }

    fn body(&self) -> Vec<u8> {
        let nl: &[u8] = if self.lf_only { b"\n" } else { b"\r\n" };
        let mut out = Vec::new();
        for p in &self.parts {
            out.extend_from_slice(b"--");
            out.extend_from_slice(self.boundary.as_bytes());
            out.extend_from_slice(nl);
            out.extend_from_slice(b"Content-Disposition: form-data");
            if let Some(n) = &p.name {
                out.extend_from_slice(format!("; name=\"{n}\"").as_bytes());
            }
            if p.filename {
                out.extend_from_slice(b"; filename=\"cube.img\"");
            }
            out.extend_from_slice(nl);
            if p.content_type {
                out.extend_from_slice(b"Content-Type: application/octet-stream");
                out.extend_from_slice(nl);
            }
            out.extend_from_slice(nl);
            out.extend_from_slice(&self.part_bytes(p));
            out.extend_from_slice(nl);
        }
        out.extend_from_slice(b"--");
        out.extend_from_slice(self.boundary.as_bytes());
        out.extend_from_slice(b"--");
        out.extend_from_slice(nl);
        apply_edits(&out, &self.edits)
    }

    fn content_type(&self) -> String {
        match self.content_type {
            0 => format!("multipart/form-data; boundary={}", self.boundary),
            1 => format!("multipart/form-data; boundary=\"{}\"", self.boundary),
            2 => "multipart/form-data".to_string(),
            3 => "multipart/form-data; boundary=other".to_string(),
            _ => format!("multipart/mixed; boundary={}", self.boundary),
        }
    }

    /// True when the request is a well-formed upload that must be accepted: header then data of the
    /// right size, optional valid params, within the limit, written cleanly.
    fn must_accept(&self) -> bool {
        let names: Vec<Option<&str>> = self.parts.iter().map(|p| p.name.as_deref()).collect();
        let shape_ok = names == [Some("header"), Some("data")] || names == [Some("header"), Some("data"), Some("params")];
        let bodies_ok = self.parts.iter().all(|p| match &p.body {
            PartBody::Header(_) => true,
            PartBody::Data(d) => *d == 0,
            PartBody::Params(t) => serde_json::from_str(t).ok().is_some_and(|v| params::from_json(v).is_ok()),
            PartBody::Raw(_) => false,
        });
        let kinds_ok = self.parts.iter().zip(["header", "data", "params"]).all(|(p, n)| {
            matches!((&p.body, n), (PartBody::Header(_), "header") | (PartBody::Data(_), "data") | (PartBody::Params(_), "params"))
        });
        let total: usize = self.parts.iter().map(|p| self.part_bytes(p).len()).sum();
        // The boundary must not occur in the parts (random data could hold it: then no promise).
        let body = self.body();
        let boundary_safe = self.parts.iter().all(|p| !contains(&self.part_bytes(p), self.boundary.as_bytes()));
        shape_ok
            && bodies_ok
            && kinds_ok
            && self.edits.is_empty()
            && self.content_type <= 1
            && !self.lf_only
            && total as u64 <= self.limit
            && boundary_safe
            && self.boundary.bytes().all(|c| c.is_ascii_alphanumeric())
            && !body.is_empty()
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn fuzz_multipart() {
    let rt = runtime();
    let dir = scratch();
    fuzz("multipart", multipart_case(), |case| {
        let body = case.body();
        let content_type = case.content_type();
        let must_accept = case.must_accept();
        let _ = std::fs::remove_file(dir.path().join("cube.img"));
        let _ = std::fs::remove_file(dir.path().join("cube.hdr"));
        reset_peak();
        let got = rt.block_on(async {
            let req = axum::http::Request::builder()
                .method("POST")
                .uri("/v1/jobs")
                .header("content-type", &content_type)
                .body(axum::body::Body::from(body.clone()))
                .unwrap();
            let mut multipart = match axum::extract::Multipart::from_request(req, &()).await {
                Ok(m) => m,
                Err(e) => return Err(ApiError::bad_request("invalid_multipart", e.body_text())),
            };
            upload::receive_multipart(&mut multipart, dir.path(), case.limit, None).await
        });
        check_peak(body.len(), "receive_multipart")?;
        let outcome = got.as_ref().map_or_else(ApiError::code, |_| "ok");
        match got {
            Ok(up) => {
                // Whatever was accepted is what was sent: the header parses, the data file holds the
                // data part's bytes.
                prop_assert!(envi::parse_header(&up.header_text).is_ok());
                prop_assert_eq!(std::fs::read_to_string(dir.path().join("cube.hdr")).unwrap(), up.header_text.clone());
                let data = std::fs::read(&up.data.path).unwrap();
                prop_assert_eq!(data.len() as u64, up.data.bytes);
                // Nothing asks for the data part's SHA-256 (its content digest is the decoded cube's).
                prop_assert_eq!(up.data.sha256, None);
                if must_accept {
                    let sent = case.part_bytes(&case.parts[1]);
                    prop_assert_eq!(data, sent);
                    prop_assert_eq!(up.header_text, case.spec.render());
                }
            }
            Err(e) => {
                check_refusal(&e)?;
                prop_assert!(!must_accept, "a well-formed upload was refused: {} {e}", e.code());
            }
        }
        Ok(outcome)
    });
}

// ------------------------------------------------------------------------------------------------
// Query parameters

fn query_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (0u64..12).prop_map(|v| v.to_string()),
        2 => prop::sample::select(vec![
            "", "0", "-1", "1e9", "1000000000", "18446744073709551615", "18446744073709551616", "NaN", "nan", "inf",
            "-inf", "1.5", "-0", "true", "false", "maybe", "0,1,2", "1,2,3,4", "4,3,2,1", "0,0,1000000,1000000",
            "a,b", ",,,", "1,,2", "mean-filter", "shift-difference", "median", "cpu", "cuda", "tpu", "%FF", "%00",
            "%E2%82%AC", "+", "1%2C2",
        ])
        .prop_map(String::from),
        1 => "[ -~]{0,12}",
    ]
}

fn query() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        6 => prop::sample::select(vec!["components", "snr", "noise", "inverse", "bad_bands", "ignore_value", "noise_window", "backend", "ortho"]).prop_map(String::from),
        1 => prop::sample::select(vec!["colour", "", "components%00", "COMPONENTS", "components[]", "snr "]).prop_map(String::from),
        1 => "[a-z_%0-9]{1,10}",
    ];
    prop_oneof![
        5 => prop::collection::vec((key, query_value()), 0..5).prop_map(|kv| kv.into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")),
        1 => "[ -~]{0,40}",
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

#[test]
fn fuzz_query_params() {
    let strategy = (query(), (1usize..50, 1usize..50, 1usize..300));
    fuzz("query_params", strategy, |(q, (lines, samples, bands))| {
        reset_peak();
        let got = params::from_query(Some(&q));
        check_peak(q.len(), "params::from_query")?;
        let outcome = match &got {
            Ok(p) if p.validate(lines, samples, bands).is_ok() => "ok",
            Ok(_) => "refused by validate",
            Err(e) => e.code(),
        };
        match got {
            Ok(p) => {
                // The canonical text reads back to the same parameters (it is what jobs store and the
                // cache key hashes); compared as canonical text, since a NaN no-data value is not
                // equal to itself.
                let back = params::from_json(serde_json::from_str(&params::canonical(&p)).unwrap());
                prop_assert_eq!(back.ok().map(|b| params::canonical(&b)), Some(params::canonical(&p)));
                prop_assert_eq!(p.ignore_value.is_some_and(f64::is_nan), params::canonical(&p).contains(r#""ignore_value":"nan""#));
                match p.validate(lines, samples, bands) {
                    Ok(()) => {
                        prop_assert!(p.components.is_none_or(|k| k >= 1 && k <= bands));
                        prop_assert!(p.snr.is_none_or(|s| s.is_finite() && s >= 0.0));
                        prop_assert!(p.bad_bands.iter().all(|&b| b < bands));
                        prop_assert!(p.noise_window.is_none_or(|w| w.x0 < w.x1 && w.x1 <= samples && w.y0 < w.y1 && w.y1 <= lines));
                    }
                    Err(e) => prop_assert!(matches!(e, MnfError::InvalidParams(_)), "{e}"),
                }
            }
            Err(e) => {
                prop_assert_eq!(e.code(), "invalid_params");
                prop_assert_eq!(e.status().as_u16(), 422);
            }
        }
        Ok(outcome)
    });
}

/// Queries built from valid values for the cube must be accepted with exactly those values.
#[test]
fn fuzz_query_params_valid() {
    let strategy = (1usize..40, 1usize..40, 2usize..300).prop_flat_map(|(lines, samples, bands)| {
        (
            Just((lines, samples, bands)),
            prop::option::of(1..=bands),
            prop::collection::vec(0..bands, 0..4),
            prop::option::of((0..samples, 0..lines)),
            any::<bool>(),
        )
    });
    fuzz("query_params_valid", strategy, |((lines, samples, bands), components, bad_bands, window, inverse)| {
        let mut q = vec![format!("inverse={inverse}"), "noise=shift-difference".to_string()];
        if let Some(k) = components {
            q.push(format!("components={k}"));
        }
        if !bad_bands.is_empty() {
            q.push(format!("bad_bands={}", bad_bands.iter().map(usize::to_string).collect::<Vec<_>>().join("%2C")));
        }
        if let Some((x0, y0)) = window {
            q.push(format!("noise_window={x0},{y0},{samples},{lines}"));
        }
        let q = q.join("&");
        let p = params::from_query(Some(&q)).map_err(|e| TestCaseError::fail(format!("{q}: {e}")))?;
        prop_assert_eq!(p.components, components);
        prop_assert_eq!(&p.bad_bands, &bad_bands);
        prop_assert_eq!(p.inverse, inverse);
        prop_assert!(p.validate(lines, samples, bands).is_ok(), "{}", q);
        let outcome = "ok";
        Ok(outcome)
    });
}
