//! Cube formats: the real AVIRIS cubes in tests/data decoded independently of the reader, round trips
//! through every layout, data type and byte order, the result writers, and malformed input.

use std::path::{Path, PathBuf};

use hypermnf::cube::envi::{self, OutputHeader};
use hypermnf::cube::{self, npy, ByteOrder, Cube, CubeError, CubeMeta, DataType, Interleave};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

const LAYOUTS: [Interleave; 3] = [Interleave::Bsq, Interleave::Bil, Interleave::Bip];
const ORDERS: [ByteOrder; 2] = [ByteOrder::Little, ByteOrder::Big];

/// Decodes one sample straight from file bytes (independent of the crate's decoder).
fn decode_sample(bytes: &[u8], dtype: DataType, order: ByteOrder) -> f64 {
    macro_rules! dec {
        ($t:ty) => {{
            let a = bytes.try_into().unwrap();
            match order {
                ByteOrder::Little => <$t>::from_le_bytes(a) as f64,
                ByteOrder::Big => <$t>::from_be_bytes(a) as f64,
            }
        }};
    }
    match dtype {
        DataType::U8 => bytes[0] as f64,
        DataType::I16 => dec!(i16),
        DataType::U16 => dec!(u16),
        DataType::I32 => dec!(i32),
        DataType::U32 => dec!(u32),
        DataType::I64 => dec!(i64),
        DataType::U64 => dec!(u64),
        DataType::F32 => dec!(f32),
        DataType::F64 => dec!(f64),
    }
}

/// Element offset of (line, sample, band) in a file of the given interleave.
fn file_offset(il: Interleave, (lines, samples, bands): (usize, usize, usize), l: usize, s: usize, b: usize) -> usize {
    match il {
        Interleave::Bsq => (b * lines + l) * samples + s,
        Interleave::Bil => (l * bands + b) * samples + s,
        Interleave::Bip => (l * samples + s) * bands + b,
    }
}

/// Encodes one random, finite value of `dtype` in `order`.
fn random_sample(rng: &mut StdRng, dtype: DataType, order: ByteOrder) -> Vec<u8> {
    macro_rules! enc {
        ($v:expr) => {{
            let v = $v;
            match order {
                ByteOrder::Little => v.to_le_bytes().to_vec(),
                ByteOrder::Big => v.to_be_bytes().to_vec(),
            }
        }};
    }
    match dtype {
        DataType::U8 => vec![rng.random::<u8>()],
        DataType::I16 => enc!(rng.random::<i16>()),
        DataType::U16 => enc!(rng.random::<u16>()),
        DataType::I32 => enc!(rng.random::<i32>()),
        DataType::U32 => enc!(rng.random::<u32>()),
        DataType::I64 => enc!(rng.random::<i64>()),
        DataType::U64 => enc!(rng.random::<u64>()),
        DataType::F32 => enc!(rng.random_range(-1.0e4f32..1.0e4)),
        DataType::F64 => enc!(rng.random_range(-1.0e6f64..1.0e6)),
    }
}

fn rich_meta(bands: usize) -> CubeMeta {
    CubeMeta {
        source_interleave: None,
        bbl: Some((0..bands).map(|b| b != 1).collect()),
        ignore_value: Some(-9999.5),
        wavelength: Some((0..bands).map(|b| 400.25 + 10.1 * b as f64).collect()),
        wavelength_units: Some("Nanometers".into()),
        fwhm: Some((0..bands).map(|b| 9.7 + 0.013 * b as f64).collect()),
        band_names: Some((0..bands).map(|b| format!("channel {}", b + 1)).collect()),
        description: Some("round trip test cube".into()),
        map_info: Some("UTM, 1.000, 1.000, 612345.0, 4012345.0, 2.0, 2.0, 11, North, WGS-84".into()),
        extra: vec![
            ("Sensor Type".into(), "AVIRIS".into()),
            ("acquisition time".into(), "{2001-07-12T18:30:00,\n 2001-07-12T18:31:00}".into()),
        ],
    }
}

/// A random, non-zero cube (deterministic seed) in `dtype` and `order`.
fn random_cube(seed: u64, dims: (usize, usize, usize), dtype: DataType, order: ByteOrder, meta: CubeMeta) -> Cube {
    let mut rng = StdRng::seed_from_u64(seed);
    let (l, s, b) = dims;
    let raw: Vec<u8> = (0..l * s * b).flat_map(|_| random_sample(&mut rng, dtype, order)).collect();
    let cube = Cube::from_raw(l, s, b, dtype, order, raw, meta).unwrap();
    assert!(cube.to_f64().iter().filter(|&&v| v != 0.0).count() > l * s * b / 2, "test cube must not be mostly zero");
    cube
}

fn assert_same_samples(a: &Cube, b: &Cube, what: &str) {
    assert_eq!(
        (a.lines(), a.samples(), a.bands(), a.dtype()),
        (b.lines(), b.samples(), b.bands(), b.dtype()),
        "{what}"
    );
    assert_eq!(a.to_f64(), b.to_f64(), "{what}: decoded values");
    assert_eq!(a.content_digest(), b.content_digest(), "{what}: content digest");
}

// ---------------------------------------------------------------- real cubes

struct RealCube {
    name: &'static str,
    dims: (usize, usize, usize),
    dtype: DataType,
    order: ByteOrder,
    interleave: Interleave,
    band_names: Option<usize>,
}

const REAL: [RealCube; 3] = [
    RealCube {
        name: "salinasA_224_bip_be",
        dims: (83, 86, 224),
        dtype: DataType::I16,
        order: ByteOrder::Big,
        interleave: Interleave::Bip,
        band_names: Some(224),
    },
    RealCube {
        name: "jasper_ridge_r198_bil",
        dims: (100, 100, 198),
        dtype: DataType::U16,
        order: ByteOrder::Little,
        interleave: Interleave::Bil,
        band_names: Some(198),
    },
    RealCube {
        name: "abu_beach1_cat_island_bsq",
        dims: (150, 150, 188),
        dtype: DataType::I16,
        order: ByteOrder::Little,
        interleave: Interleave::Bsq,
        band_names: None,
    },
];

#[test]
fn real_cubes_decode_like_an_independent_reader() {
    for rc in &REAL {
        let hdr = data_dir().join(format!("{}.hdr", rc.name));
        let cube = cube::open(&hdr).unwrap_or_else(|e| panic!("{}: {e}", rc.name));
        let (lines, samples, bands) = rc.dims;
        assert_eq!((cube.lines(), cube.samples(), cube.bands()), rc.dims, "{}", rc.name);
        assert_eq!((cube.dtype(), cube.byte_order()), (rc.dtype, rc.order), "{}", rc.name);
        assert_eq!(cube.meta.source_interleave, Some(rc.interleave), "{}", rc.name);
        assert_eq!(cube.meta.band_names.as_ref().map(Vec::len), rc.band_names, "{}", rc.name);
        assert!(cube.meta.description.as_deref().is_some_and(|d| d.contains("AVIRIS")), "{}", rc.name);
        assert!(cube.meta.extra.iter().any(|(k, v)| k == "sensor type" && v == "AVIRIS"), "{}", rc.name);

        let raw = std::fs::read(data_dir().join(format!("{}.img", rc.name))).unwrap();
        let size = rc.dtype.size();
        let got = cube.to_f64();
        let expect_at = |l: usize, s: usize, b: usize| {
            let o = file_offset(rc.interleave, rc.dims, l, s, b) * size;
            decode_sample(&raw[o..o + size], rc.dtype, rc.order)
        };
        // Spot values at corners and interior points, then every sample.
        for &(l, s, b) in &[
            (0, 0, 0),
            (0, 0, bands - 1),
            (lines - 1, samples - 1, bands - 1),
            (lines / 2, 3, 17),
            (7, samples - 2, bands / 2),
        ] {
            assert_eq!(got[(l * samples + s) * bands + b], expect_at(l, s, b), "{} at ({l},{s},{b})", rc.name);
        }
        let mut nonzero = 0;
        for l in 0..lines {
            for s in 0..samples {
                for b in 0..bands {
                    let v = expect_at(l, s, b);
                    nonzero += (v != 0.0) as usize;
                    assert_eq!(got[(l * samples + s) * bands + b], v, "{} at ({l},{s},{b})", rc.name);
                }
            }
        }
        assert!(nonzero > lines * samples * bands / 2, "{}: real data should be mostly non-zero", rc.name);
    }
}

#[test]
fn read_parts_matches_read() {
    let rc = &REAL[1];
    let hdr = data_dir().join(format!("{}.hdr", rc.name));
    let text = std::fs::read_to_string(&hdr).unwrap();
    let parts = envi::read_parts(&text, &data_dir().join(format!("{}.img", rc.name))).unwrap();
    let whole = envi::read(&hdr).unwrap();
    assert_same_samples(&parts, &whole, "read_parts");
    assert_eq!(parts.meta, whole.meta);
}

// ---------------------------------------------------------------- ENVI round trips

#[test]
fn envi_round_trips_every_layout_type_and_byte_order() {
    let dir = tempfile::tempdir().unwrap();
    let dims = (5, 7, 3);
    let mut seed = 1;
    for dtype in DataType::ALL {
        for cube_order in ORDERS {
            seed += 1;
            let cube = random_cube(seed, dims, dtype, cube_order, rich_meta(dims.2));
            for il in LAYOUTS {
                for file_order in ORDERS {
                    let what = format!("{} {:?} cube -> {} {:?}", dtype.name(), cube_order, il.name(), file_order);
                    let hdr = dir.path().join(format!(
                        "rt_{}_{}_{:?}_{:?}.hdr",
                        dtype.name(),
                        il.name(),
                        cube_order,
                        file_order
                    ));
                    envi::write_cube(&hdr, &cube, il, file_order).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let back = envi::read(&hdr).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_same_samples(&back, &cube, &what);
                    assert_eq!(back.byte_order(), file_order, "{what}");
                    assert_eq!(back.meta.source_interleave, Some(il), "{what}");
                    let mut meta = back.meta.clone();
                    meta.source_interleave = None;
                    assert_eq!(meta, cube.meta, "{what}: metadata");

                    // The data file really is in the requested layout and byte order.
                    let raw = std::fs::read(hdr.with_extension("img")).unwrap();
                    let size = dtype.size();
                    let values = cube.to_f64();
                    for &(l, s, b) in &[(0, 0, 1), (4, 6, 2), (2, 3, 0), (3, 1, 2)] {
                        let o = file_offset(il, dims, l, s, b) * size;
                        let v = decode_sample(&raw[o..o + size], dtype, file_order);
                        assert_eq!(v, values[(l * dims.1 + s) * dims.2 + b], "{what}: file sample ({l},{s},{b})");
                    }
                }
            }
        }
    }
}

#[test]
fn header_offset_and_data_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let cube = random_cube(77, (3, 4, 2), DataType::I16, ByteOrder::Little, CubeMeta::default());
    // BSQ raw file with a 16-byte preamble, named `.dat`.
    let mut raw = vec![0xAB; 16];
    let vals = cube.to_f64();
    for b in 0..2 {
        for l in 0..3 {
            for s in 0..4 {
                raw.extend_from_slice(&(vals[(l * 4 + s) * 2 + b] as i16).to_le_bytes());
            }
        }
    }
    let text = "ENVI\nsamples = 4\nlines = 3\nbands = 2\nheader offset = 16\ndata type = 2\ninterleave = bsq\nbyte order = 0\n";
    std::fs::write(dir.path().join("scene.hdr"), text).unwrap();
    std::fs::write(dir.path().join("scene.dat"), &raw).unwrap();
    assert_same_samples(&envi::read(&dir.path().join("scene.hdr")).unwrap(), &cube, "header offset, .dat");
    // `x.bsq.hdr` names its data file `x.bsq`.
    std::fs::write(dir.path().join("other.bsq.hdr"), text).unwrap();
    std::fs::write(dir.path().join("other.bsq"), &raw).unwrap();
    assert_same_samples(&envi::read(&dir.path().join("other.bsq.hdr")).unwrap(), &cube, "x.bsq.hdr");
}

#[test]
fn header_keys_are_case_insensitive_and_extras_keep_their_order() {
    let h = envi::parse_header(
        "ENVI\nSAMPLES = 2\nLines=3\n  Bands   = 2\nData Type = 4\nINTERLEAVE = Bip\nByte  Order = 1\n\
         Zeta Key = 1\n; comment\nalpha key = {x,\n y}\nDescription = {\n  two\n  lines }\nBBL = {1.0, 0.0}\n",
    )
    .unwrap();
    assert_eq!((h.samples, h.lines, h.bands), (2, 3, 2));
    assert_eq!((h.data_type, h.interleave, h.byte_order), (DataType::F32, Interleave::Bip, ByteOrder::Big));
    assert_eq!(h.meta.extra, vec![("Zeta Key".into(), "1".into()), ("alpha key".into(), "{x,\n y}".into())]);
    assert_eq!(h.meta.description.as_deref(), Some("two\n  lines"));
    assert_eq!(h.meta.bbl, Some(vec![true, false]));
    assert_eq!(h.entries.len(), 10);
}

// ---------------------------------------------------------------- .npy round trips

#[test]
fn npy_round_trips_every_type_and_byte_order() {
    let dir = tempfile::tempdir().unwrap();
    let dims = (5, 7, 3);
    for (i, dtype) in DataType::ALL.into_iter().enumerate() {
        for order in ORDERS {
            let what = format!("npy {} {:?}", dtype.name(), order);
            let cube = random_cube(100 + i as u64, dims, dtype, order, CubeMeta::default());
            let path = dir.path().join(format!("{}_{:?}.npy", dtype.name(), order));
            npy::write_cube(&path, &cube).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!((10 + header_len) % 64, 0, "{what}: data aligned to 64 bytes");
            let back = npy::read(&path).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_same_samples(&back, &cube, &what);
            if dtype.size() > 1 {
                assert_eq!(back.byte_order(), order, "{what}");
            }
            assert_eq!(back.meta.source_interleave, Some(Interleave::Bip), "{what}");
        }
    }
}

/// Writes a .npy by hand (independently of the crate's writer).
fn hand_npy(path: &Path, version: u8, dict: &str, data: &[u8]) {
    let pre = if version == 1 { 10 } else { 12 };
    let mut header = dict.as_bytes().to_vec();
    while (pre + header.len() + 1) % 64 != 0 {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

#[test]
fn fortran_order_npy_reads_as_the_same_cube() {
    let dir = tempfile::tempdir().unwrap();
    let (l, s, b) = (5, 7, 3);
    for (dtype, order, descr, version) in [
        (DataType::I16, ByteOrder::Big, ">i2", 1),
        (DataType::F64, ByteOrder::Little, "<f8", 2),
        (DataType::U8, ByteOrder::Little, "|u1", 3),
    ] {
        let cube = random_cube(300 + version as u64, (l, s, b), dtype, order, CubeMeta::default());
        let size = dtype.size();
        // Fortran order: the line index varies fastest, the band index slowest.
        let mut data = Vec::new();
        for bi in 0..b {
            for si in 0..s {
                for li in 0..l {
                    let i = ((li * s + si) * b + bi) * size;
                    data.extend_from_slice(&cube.raw()[i..i + size]);
                }
            }
        }
        let path = dir.path().join(format!("f_{descr}.npy").replace(['<', '>', '|'], "_"));
        let dict = format!("{{'shape': ({l}, {s}, {b}), 'fortran_order': True, 'descr': '{descr}',}}");
        hand_npy(&path, version, &dict, &data);
        let back = npy::read(&path).unwrap_or_else(|e| panic!("{descr}: {e}"));
        assert_same_samples(&back, &cube, &format!("fortran {descr}"));
        assert_eq!(back.meta.source_interleave, Some(Interleave::Bsq));

        // The same values in C order read to the same cube.
        let c_path = dir.path().join(format!("c_{version}.npy"));
        hand_npy(
            &c_path,
            version,
            &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({l}, {s}, {b}), }}"),
            cube.raw(),
        );
        assert_same_samples(&npy::read(&c_path).unwrap(), &back, &format!("C vs Fortran {descr}"));
    }
}

// ---------------------------------------------------------------- result writers

fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-50.0f32..50.0)).collect()
}

/// The items of a `key = {a, b}` list in a header text.
fn header_list(text: &str, key: &str) -> Option<Vec<String>> {
    let start = text.find(&format!("{key} = {{"))? + key.len() + 4;
    let end = start + text[start..].find('}')?;
    Some(text[start..end].split(',').map(|s| s.trim().to_string()).collect())
}

#[test]
fn write_f32_bsq_reads_back_with_names_and_eigenvalues() {
    let dir = tempfile::tempdir().unwrap();
    let (l, s, k) = (5, 7, 4);
    let values = random_f32(l * s * k, 9);
    let eigenvalues = vec![1234.5678901234567, 3.25, 1.0000000001, 0.123456789e-7, 0.5];
    let mut source = rich_meta(6);
    source.extra.push(("default bands".into(), "{3, 2, 1}".into()));
    let names: Vec<String> = (1..=k).map(|i| format!("MNF {i}")).collect();
    let header = OutputHeader {
        description: "MNF components of a test cube".into(),
        band_names: names.clone(),
        eigenvalues: Some(eigenvalues.clone()),
        source: source.clone(),
        keep_spectral: false,
    };
    let hdr = dir.path().join("mnf.hdr");
    envi::write_f32_bsq(&hdr, l, s, k, &values, &header).unwrap();

    let back = envi::read(&hdr).unwrap();
    assert_eq!((back.lines(), back.samples(), back.bands()), (l, s, k));
    assert_eq!(
        (back.dtype(), back.byte_order(), back.meta.source_interleave),
        (DataType::F32, ByteOrder::Little, Some(Interleave::Bsq))
    );
    assert_eq!(back.to_f64(), values.iter().map(|&v| v as f64).collect::<Vec<_>>());
    assert_eq!(back.meta.band_names.as_ref(), Some(&names));
    assert_eq!(back.meta.map_info, source.map_info);
    assert_eq!(back.meta.description.as_deref(), Some("MNF components of a test cube"));
    // Components are not the input's bands: no spectral metadata, no band-keyed extras.
    assert_eq!((back.meta.wavelength.as_ref(), back.meta.bbl.as_ref(), back.meta.ignore_value), (None, None, None));
    assert!(back.meta.extra.iter().any(|(k, v)| k == "Sensor Type" && v == "AVIRIS"));
    assert!(!back.meta.extra.iter().any(|(k, _)| k == "default bands"));
    let text = std::fs::read_to_string(&hdr).unwrap();
    let eig: Vec<f64> = header_list(&text, "mnf eigenvalues").unwrap().iter().map(|v| v.parse().unwrap()).collect();
    assert_eq!(eig, eigenvalues, "eigenvalues at full precision");
    assert_eq!(std::fs::metadata(dir.path().join("mnf.img")).unwrap().len(), (l * s * k * 4) as u64);

    // Denoised output keeps the input's spectral metadata.
    let denoised =
        OutputHeader { band_names: vec![], eigenvalues: None, keep_spectral: true, source: rich_meta(k), ..header };
    let hdr2 = dir.path().join("denoised.hdr");
    envi::write_f32_bsq(&hdr2, l, s, k, &values, &denoised).unwrap();
    let back2 = envi::read(&hdr2).unwrap();
    let mut meta = back2.meta.clone();
    meta.source_interleave = None;
    meta.description = rich_meta(k).description;
    assert_eq!(meta, rich_meta(k));
    assert!(!std::fs::read_to_string(&hdr2).unwrap().contains("mnf eigenvalues"));

    // Mismatched lengths are refused rather than written.
    let err = envi::write_f32_bsq(&hdr2, l, s, k, &values[1..], &denoised).unwrap_err();
    assert!(matches!(err, CubeError::SizeMismatch(_)), "{err}");
}

#[test]
fn write_f32_npy_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let (l, s, k) = (6, 5, 3);
    let values = random_f32(l * s * k, 11);
    let path = dir.path().join("out.npy");
    npy::write_f32(&path, &[l, s, k], &values).unwrap();
    let back = npy::read(&path).unwrap();
    assert_eq!((back.lines(), back.samples(), back.bands(), back.dtype()), (l, s, k, DataType::F32));
    assert_eq!(back.to_f64(), values.iter().map(|&v| v as f64).collect::<Vec<_>>());
    let mut buf = Vec::new();
    npy::write_f32_to(&mut buf, &[l, s, k], &values).unwrap();
    assert_eq!(buf, std::fs::read(&path).unwrap());
    assert!(npy::write_f32_to(&mut Vec::new(), &[l, s, k + 1], &values).is_err());
}

// ---------------------------------------------------------------- malformed input

const GOOD_HDR: &str =
    "ENVI\nsamples = 4\nlines = 3\nbands = 2\nheader offset = 0\ndata type = 2\ninterleave = bsq\nbyte order = 0\n";

/// Writes `x.hdr` (text) and `x.img` (`data_len` bytes of non-zero data), reads it back.
fn read_pair(dir: &Path, name: &str, text: &str, data_len: Option<usize>) -> Result<Cube, CubeError> {
    let hdr = dir.join(format!("{name}.hdr"));
    std::fs::write(&hdr, text).unwrap();
    if let Some(n) = data_len {
        std::fs::write(dir.join(format!("{name}.img")), (0..n).map(|i| (i % 251 + 1) as u8).collect::<Vec<u8>>())
            .unwrap();
    }
    envi::read(&hdr)
}

fn expect_err(result: Result<Cube, CubeError>, variant: &str, needle: &str) {
    let err = result.err().unwrap_or_else(|| panic!("expected a {variant} error mentioning '{needle}', got a cube"));
    let kind = match &err {
        CubeError::Io { .. } => "Io",
        CubeError::Header(_) => "Header",
        CubeError::Unsupported(_) => "Unsupported",
        CubeError::SizeMismatch(_) => "SizeMismatch",
        CubeError::TooLarge(_) => "TooLarge",
        CubeError::Npy(_) => "Npy",
        CubeError::NeedsGdal(_) => "NeedsGdal",
    };
    assert_eq!(kind, variant, "error was: {err}");
    assert!(err.to_string().contains(needle), "'{err}' should mention '{needle}'");
}

#[test]
fn malformed_envi_inputs_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = 4 * 3 * 2 * 2;
    assert!(read_pair(d, "good", GOOD_HDR, Some(good)).is_ok(), "the base case must read");

    expect_err(read_pair(d, "nomagic", &GOOD_HDR.replace("ENVI\n", ""), Some(good)), "Header", "ENVI");
    expect_err(read_pair(d, "nosamples", &GOOD_HDR.replace("samples = 4\n", ""), Some(good)), "Header", "'samples'");
    expect_err(
        read_pair(d, "abc", &GOOD_HDR.replace("samples = 4", "samples = abc"), Some(good)),
        "Header",
        "not an integer",
    );
    expect_err(read_pair(d, "neg", &GOOD_HDR.replace("lines = 3", "lines = -3"), Some(good)), "Header", "positive");
    expect_err(read_pair(d, "zero", &GOOD_HDR.replace("bands = 2", "bands = 0"), Some(good)), "Header", "positive");
    expect_err(read_pair(d, "dt99", &GOOD_HDR.replace("data type = 2", "data type = 99"), Some(good)), "Header", "99");
    expect_err(
        read_pair(d, "complex", &GOOD_HDR.replace("data type = 2", "data type = 6"), Some(good)),
        "Unsupported",
        "complex",
    );
    expect_err(
        read_pair(d, "short", GOOD_HDR, Some(good - 1)),
        "SizeMismatch",
        &format!("truncated: {} bytes, header needs {good}", good - 1),
    );
    expect_err(read_pair(d, "long", GOOD_HDR, Some(good + 5)), "SizeMismatch", "5 bytes longer");
    expect_err(
        read_pair(d, "huge", &GOOD_HDR.replace("lines = 3", "lines = 1000000000000"), Some(good)),
        "TooLarge",
        "1000000000000 lines",
    );
    expect_err(
        read_pair(d, "bbl", &format!("{GOOD_HDR}bbl = {{1, 0, 1}}\n"), Some(good)),
        "Header",
        "bbl has 3 values",
    );
    expect_err(
        read_pair(d, "brace", &format!("{GOOD_HDR}band names = {{a,\n b\n"), Some(good)),
        "Header",
        "unterminated",
    );
    expect_err(
        read_pair(d, "il", &GOOD_HDR.replace("interleave = bsq", "interleave = bsx"), Some(good)),
        "Header",
        "interleave 'bsx'",
    );
    expect_err(read_pair(d, "names", &format!("{GOOD_HDR}band names = {{a}}\n"), Some(good)), "Header", "band names");
    expect_err(read_pair(d, "nodata", GOOD_HDR, None), "Io", "no data file");
    expect_err(envi::read_parts(GOOD_HDR, &d.join("absent.img")), "Io", "absent.img");
}

fn npy_file(dir: &Path, name: &str, version: u8, dict: &str, data_len: usize) -> PathBuf {
    let path = dir.join(name);
    hand_npy(&path, version, dict, &(0..data_len).map(|i| (i % 13 + 1) as u8).collect::<Vec<u8>>());
    path
}

#[test]
fn malformed_npy_inputs_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let dict = "{'descr': '<i2', 'fortran_order': False, 'shape': (3, 4, 2), }";
    assert!(npy::read(&npy_file(d, "good.npy", 1, dict, 48)).is_ok(), "the base case must read");

    let bad_magic = d.join("bad.npy");
    std::fs::write(&bad_magic, b"\x93NUMPX\x01\x00\x10\x00{}").unwrap();
    expect_err(npy::read(&bad_magic), "Npy", "magic");
    let flat = npy_file(d, "flat.npy", 1, &dict.replace("(3, 4, 2)", "(12, 2)"), 48);
    expect_err(npy::read(&flat), "Npy", "(lines, samples, bands), got shape (12, 2)");
    let four = npy_file(d, "four.npy", 1, &dict.replace("(3, 4, 2)", "(3, 4, 2, 1)"), 48);
    expect_err(npy::read(&four), "Npy", "3-D");
    expect_err(npy::read(&npy_file(d, "short.npy", 1, dict, 47)), "SizeMismatch", "truncated: 47 bytes");
    expect_err(npy::read(&npy_file(d, "long.npy", 1, dict, 50)), "SizeMismatch", "2 bytes of data beyond");
    expect_err(npy::read(&npy_file(d, "complex.npy", 1, &dict.replace("<i2", "<c8"), 192)), "Unsupported", "complex");
    expect_err(npy::read(&npy_file(d, "bool.npy", 1, &dict.replace("<i2", "|b1"), 24)), "Unsupported", "bool");
    expect_err(npy::read(&npy_file(d, "f16.npy", 1, &dict.replace("<i2", "<f2"), 48)), "Unsupported", "float16");
    expect_err(npy::read(&npy_file(d, "ver.npy", 4, dict, 48)), "Unsupported", "version 4.0");
    let huge = npy_file(d, "huge.npy", 1, &dict.replace("(3, 4, 2)", "(1000000000000, 1000, 224)"), 48);
    expect_err(npy::read(&huge), "TooLarge", "1000000000000 lines");
    let garbled = npy_file(d, "garbled.npy", 1, "{'descr': '<i2', 'fortran_order': False, 'shape': (3, 4, 2) ", 48);
    expect_err(npy::read(&garbled), "Npy", "header dict");
}

// ---------------------------------------------------------------- no panics on mangled input

mod mangled {
    use super::*;
    use proptest::prelude::*;

    /// Edits (position fraction, replacement text) applied to a valid file.
    fn edits() -> impl Strategy<Value = Vec<(f64, String)>> {
        prop::collection::vec((0.0..1.0f64, "[{}=,;\n 0-9a-z.-]{0,4}"), 1..6)
    }

    fn mangle(base: &[u8], edits: &[(f64, String)]) -> Vec<u8> {
        let mut out = base.to_vec();
        for (at, text) in edits {
            let i = ((out.len() as f64) * at) as usize;
            // Replace as many bytes as inserted (or one, for a deletion).
            let end = (i + text.len().max(1)).min(out.len());
            out.splice(i..end, text.bytes());
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// A mangled header gives a cube or an error, never a panic; when it gives a cube, the cube
        /// agrees with the header.
        #[test]
        fn envi_header_edits_never_panic(e in edits()) {
            let dir = tempfile::tempdir().unwrap();
            let text = String::from_utf8_lossy(&mangle(GOOD_HDR.as_bytes(), &e)).into_owned();
            let data = dir.path().join("x.img");
            std::fs::write(&data, (0..48u8).map(|i| i + 1).collect::<Vec<u8>>()).unwrap();
            if let Ok(h) = envi::parse_header(&text) {
                if let Ok(cube) = envi::read_parts(&text, &data) {
                    prop_assert_eq!((cube.lines(), cube.samples(), cube.bands()), (h.lines, h.samples, h.bands));
                    prop_assert_eq!(h.header_offset + h.data_bytes().unwrap(), 48);
                }
            }
        }

        #[test]
        fn npy_edits_never_panic(e in edits()) {
            let dir = tempfile::tempdir().unwrap();
            let good = dir.path().join("good.npy");
            let cube = random_cube(5, (3, 4, 2), DataType::I16, ByteOrder::Little, CubeMeta::default());
            npy::write_cube(&good, &cube).unwrap();
            let bytes = std::fs::read(&good).unwrap();
            // Mangle the header only (the first 64 bytes), keeping the data.
            let mut mangled = mangle(&bytes[..64], &e);
            mangled.extend_from_slice(&bytes[64..]);
            let path = dir.path().join("mangled.npy");
            std::fs::write(&path, &mangled).unwrap();
            if let Ok(back) = npy::read(&path) {
                let h = npy::read_header(&mut mangled.as_slice()).unwrap();
                prop_assert_eq!(back.raw().len() as u64, mangled.len() as u64 - h.data_offset);
                prop_assert_eq!(h.shape, vec![back.lines() as u64, back.samples() as u64, back.bands() as u64]);
            }
        }
    }
}
