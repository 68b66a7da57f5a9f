//! ENVI headers as the tools that make real flight lines write them (GDAL and Spectral Python read all
//! of these): the real AVIRIS-NG and EMIT ENVI samples of `../shared/data/formats/` (see its
//! PROVENANCE.md), empty `{}` lists as EMIT's L1B tooling writes them, wavelength units, wavelengths
//! only in the band names, `bbl` with `data ignore value`, keys in any case, and `map info` (with a
//! rotation) and the `coordinate system string` (WKT) carried into the output headers.
//!
//! The real samples are read from `../shared/data/formats/` beside the repository (CI has it): without
//! it those tests say they skipped, unless `HYPERMNF_REQUIRE_FORMATS=1`, which makes them fail.

use std::path::{Path, PathBuf};
use std::process::Command;

use hypermnf::cube::{envi, ByteOrder, Cube, CubeMeta, DataType, Interleave};

mod common;

fn formats_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/formats");
    if dir.join("PROVENANCE.md").is_file() {
        return Some(dir);
    }
    if std::env::var("HYPERMNF_REQUIRE_FORMATS").as_deref() == Ok("1") {
        panic!("HYPERMNF_REQUIRE_FORMATS=1 but {} is missing", dir.display());
    }
    eprintln!("skipped: {} is missing (the real ENVI samples are read from there)", dir.display());
    None
}

/// The header's own list of numbers for `key`, read by hand (an independent reading).
fn header_numbers(text: &str, key: &str) -> Vec<f64> {
    let at = text.find(&format!("\n{key} = {{")).unwrap_or_else(|| panic!("no {key}")) + key.len() + 5;
    let end = at + text[at..].find('}').unwrap();
    text[at..end].split(',').map(|v| v.trim().parse::<f64>().unwrap()).collect()
}

/// The samples of an ENVI data file decoded here, independently of the reader: value at (line, sample,
/// band) in BIP order.
fn decode_by_hand(data: &[u8], dims: (usize, usize, usize), il: Interleave, dtype: DataType) -> Vec<f64> {
    let (lines, samples, bands) = dims;
    let size = dtype.size();
    let mut out = Vec::with_capacity(lines * samples * bands);
    for l in 0..lines {
        for s in 0..samples {
            for b in 0..bands {
                let i = match il {
                    Interleave::Bsq => (b * lines + l) * samples + s,
                    Interleave::Bil => (l * bands + b) * samples + s,
                    Interleave::Bip => (l * samples + s) * bands + b,
                };
                let e = &data[i * size..(i + 1) * size];
                out.push(match dtype {
                    DataType::F32 => f32::from_le_bytes(e.try_into().unwrap()) as f64,
                    DataType::F64 => f64::from_le_bytes(e.try_into().unwrap()),
                    other => panic!("not in the samples: {other:?}"),
                });
            }
        }
    }
    out
}

struct Sample {
    path: &'static str,
    dims: (usize, usize, usize),
    interleave: Interleave,
    dtype: DataType,
    /// (first, last) wavelength in nm, or None where the bands are not spectral.
    wavelengths_nm: Option<(f64, f64)>,
    /// The `wavelength` list itself (and `fwhm`) is in the header: compare with a hand reading.
    wavelength_key: bool,
    bad_bands: Option<Vec<usize>>,
    ignore_value: Option<f64>,
    map_info: bool,
}

/// Every ENVI sample of the shared formats directory reads with its shape, wavelengths (in nm), bad
/// bands and no-data value, and its samples are those of the file.
#[test]
fn real_envi_samples_read_with_shape_wavelengths_bad_bands_and_no_data() {
    let Some(dir) = formats_dir() else { return };
    let emit_bad: Vec<usize> = (127..=141).chain(187..=212).collect();
    let samples = [
        Sample {
            path: "aviris-ng/ang20170323t202244_rdn_7000-7010.hdr",
            dims: (10, 10, 425),
            interleave: Interleave::Bil,
            dtype: DataType::F32,
            wavelengths_nm: Some((376.86, 2500.54)),
            wavelength_key: true,
            bad_bands: None,
            ignore_value: None,
            map_info: false,
        },
        // Orthorectified: BSQ, wavelengths only inside `band names` ("376.44 Nanometers"), -9999,
        // map info and WKT.
        Sample {
            path: "aviris-ng/ang20160910t185702_2rdn_img.hdr",
            dims: (25, 30, 425),
            interleave: Interleave::Bsq,
            dtype: DataType::F32,
            wavelengths_nm: Some((376.44, 2500.12)),
            wavelength_key: false,
            bad_bands: None,
            ignore_value: Some(-9999.0),
            map_info: true,
        },
        Sample {
            path: "aviris-ng/ang20160910t185702_obs_ortdem_mod.hdr",
            dims: (25, 30, 11),
            interleave: Interleave::Bsq,
            dtype: DataType::F64,
            wavelengths_nm: None,
            wavelength_key: false,
            bad_bands: None,
            ignore_value: Some(-9999.0),
            map_info: true,
        },
        Sample {
            path: "aviris-ng/ang20170323t202244_loc_7000-7010.hdr",
            dims: (10, 10, 3),
            interleave: Interleave::Bil,
            dtype: DataType::F64,
            wavelengths_nm: None,
            wavelength_key: false,
            bad_bands: None,
            ignore_value: None,
            map_info: false,
        },
        Sample {
            path: "aviris-ng/ang20170323t202244_obs_7000-7010.hdr",
            dims: (10, 10, 11),
            interleave: Interleave::Bil,
            dtype: DataType::F64,
            wavelengths_nm: None,
            wavelength_key: false,
            bad_bands: None,
            ignore_value: None,
            map_info: false,
        },
        // EMIT L2A reflectance: bbl (the water absorption bands 127-141 and 187-212) with -9999.
        Sample {
            path: "emit/emit20250324t221005_jpl_unmix_ex.hdr",
            dims: (10, 10, 285),
            interleave: Interleave::Bil,
            dtype: DataType::F32,
            wavelengths_nm: Some((381.0055927, 2492.9238809)),
            wavelength_key: true,
            bad_bands: Some(emit_bad),
            ignore_value: Some(-9999.0),
            map_info: false,
        },
    ];
    // Every ENVI header there is in the list.
    let mut listed: Vec<String> = samples.iter().map(|s| s.path.to_string()).collect();
    let mut found = Vec::new();
    for sub in ["aviris-ng", "emit", "enmap", "neon"] {
        for e in std::fs::read_dir(dir.join(sub)).into_iter().flatten().flatten() {
            if e.path().extension().is_some_and(|x| x == "hdr") {
                found.push(format!("{sub}/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    listed.sort();
    found.sort();
    assert_eq!(listed, found, "every ENVI sample is checked");

    for s in &samples {
        let hdr = dir.join(s.path);
        let text = std::fs::read_to_string(&hdr).unwrap();
        let cube = envi::read(&hdr).unwrap_or_else(|e| panic!("{}: {e}", s.path));
        let m = &cube.meta;
        assert_eq!((cube.lines(), cube.samples(), cube.bands()), s.dims, "{}", s.path);
        assert_eq!((cube.dtype(), m.source_interleave), (s.dtype, Some(s.interleave)), "{}", s.path);
        let data = std::fs::read(envi::data_file(&hdr).unwrap()).unwrap();
        assert!(cube.to_f64() == decode_by_hand(&data, s.dims, s.interleave, s.dtype), "{}: samples", s.path);

        match s.wavelengths_nm {
            Some((first, last)) => {
                let nm = m.wavelengths_nm().unwrap_or_else(|| panic!("{}: no wavelengths", s.path));
                assert_eq!(nm.len(), s.dims.2, "{}", s.path);
                assert_eq!((nm[0], nm[nm.len() - 1]), (first, last), "{}", s.path);
                assert!(nm.iter().all(|w| (350.0..2600.0).contains(w)), "{}: wavelengths in nm", s.path);
                assert!(nm.windows(2).all(|w| w[0] < w[1]), "{}: ascending", s.path);
                if s.wavelength_key {
                    assert_eq!(m.wavelength.as_ref(), Some(&header_numbers(&text, "wavelength")), "{}", s.path);
                    assert_eq!(m.fwhm.as_ref(), Some(&header_numbers(&text, "fwhm")), "{}", s.path);
                } else {
                    // Read from the band names, whose unit becomes the units string.
                    assert_eq!(m.wavelength_units.as_deref(), Some("Nanometers"), "{}", s.path);
                    let names = m.band_names.as_ref().unwrap();
                    assert_eq!(names[0], "376.44 Nanometers", "{}: the names stay as written", s.path);
                }
            }
            None => assert_eq!(m.wavelength, None, "{}: these band names are not wavelengths", s.path),
        }
        let bad: Option<Vec<usize>> = m.bbl.as_ref().map(|bbl| (0..bbl.len()).filter(|&b| !bbl[b]).collect());
        assert_eq!(bad, s.bad_bands, "{}: bad bands", s.path);
        assert_eq!(m.ignore_value, s.ignore_value, "{}: no-data", s.path);
        if s.map_info {
            assert!(m.map_info.as_deref().unwrap().trim_start().starts_with("UTM"), "{}", s.path);
            let wkt = m.extra_value("coordinate system string").unwrap();
            assert!(wkt.starts_with("PROJCS[") && wkt.contains("Transverse_Mercator"), "{}: {wkt}", s.path);
        } else {
            assert_eq!(m.map_info, None, "{}", s.path);
        }
    }
}

/// A header in the layout EMIT's L1B radiance tooling writes: list keys given as empty braces
/// (`band names = {}`, `coordinate system string = {}`), `wavelength units = Nanometers`, free-text
/// lists holding `=`, a key with a doubled space. `n` wavelengths from 381 nm in EMIT's 7.4 nm steps.
fn emit_l1b_header(lines: usize, samples: usize, bands: usize) -> String {
    let wl: Vec<String> = (0..bands).map(|b| format!("{:.7}", 381.0055927 + 7.4036 * b as f64)).collect();
    let fwhm: Vec<String> = (0..bands).map(|b| format!("{:.3}", 8.415 + 0.002 * b as f64)).collect();
    format!(
        "ENVI\n\
         description = {{EMIT L1B calibrated spectral radiance (units: uW nm-1 cm-2 sr-1)}}\n\
         samples = {samples}\nlines = {lines}\nbands = {bands}\nheader offset = 0\nfile type = ENVI Standard\n\
         data type = 4\ninterleave = bil\nbyte order = 0\nwavelength units = Nanometers\n\
         wavelength = {{{}}}\nfwhm = {{{}}}\n\
         band names = {{}}\ncoordinate system string = {{}}\n\
         masked pixel noise = 0.0171\n\
         emit pge input files = {{ dark_file=/store/emit/o1234_dark.raw radiometric_coefficient_file=/store/emit/cal.txt}}\n\
         emit pge run command = {{python emitrdn.py --mode default --level INFO in.raw dark.raw config.json out out_rep}}\n\
         flip horizontal  = 0\n",
        wl.join(","),
        fwhm.join(",")
    )
}

/// EMIT's L1B header is accepted by every reader path (file, stored parts, in-memory parts) and the
/// empty lists are absent; the header of the real L2A sample with its lists emptied reads too.
#[test]
fn headers_with_empty_lists_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, samples, bands) = (3, 4, 285);
    let text = emit_l1b_header(lines, samples, bands);
    let values: Vec<f32> = (0..lines * samples * bands).map(|i| (i % 977) as f32 * 0.25).collect();
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let hdr = dir.path().join("EMIT_L1B_RAD_001_20220827T060753_2223904_013.hdr");
    std::fs::write(&hdr, &text).unwrap();
    std::fs::write(hdr.with_extension("img"), &data).unwrap();

    let cube = envi::read(&hdr).unwrap();
    assert_eq!((cube.lines(), cube.samples(), cube.bands()), (lines, samples, bands));
    let m = &cube.meta;
    assert_eq!(m.band_names, None);
    assert_eq!(m.extra_value("coordinate system string"), None);
    assert_eq!(m.wavelength_units.as_deref(), Some("Nanometers"));
    assert_eq!(m.wavelengths_nm().unwrap()[0], 381.0055927);
    assert_eq!(m.fwhm.as_ref().unwrap().len(), bands);
    let keys: Vec<&str> = m.extra.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["masked pixel noise", "emit pge input files", "emit pge run command", "flip horizontal"]);
    assert!(m.extra[1].1.contains("dark_file=/store/emit/o1234_dark.raw"), "a list value holding `=`");
    // The service's readers take the same header.
    let parts = envi::read_parts(&text, &hdr.with_extension("img")).unwrap();
    assert_eq!(parts.to_f64(), cube.to_f64());
    let mut mem = std::io::Cursor::new(data.clone());
    let from = envi::read_parts_from(&text, &mut mem, data.len() as u64, Path::new("mem")).unwrap();
    assert_eq!(from.meta, cube.meta);

    // Every list key empty, with and without white space inside the braces.
    let emptied = "ENVI\nsamples = 4\nlines = 3\nbands = 2\ndata type = 4\ninterleave = bsq\nbyte order = 0\n\
                   wavelength = {}\nfwhm = { }\nbbl = {\n}\nband names = {}\nmap info = {}\ndefault bands = {}\n\
                   data gain values = {}\ncoordinate system string = {}\nspectra names = {}\n";
    let h = envi::parse_header(emptied).unwrap();
    assert_eq!(h.meta, CubeMeta { source_interleave: Some(Interleave::Bsq), ..CubeMeta::default() });

    if let Some(formats) = formats_dir() {
        // The real EMIT L2A header with its band names and bbl written as `{}`.
        let real = std::fs::read_to_string(formats.join("emit/emit20250324t221005_jpl_unmix_ex.hdr")).unwrap();
        let blank = |text: &str, key: &str| {
            let at = text.find(&format!("\n{key} = {{")).unwrap() + 1;
            let end = at + text[at..].find('}').unwrap() + 1;
            format!("{}{key} = {{}}{}", &text[..at], &text[end..])
        };
        let text = blank(&blank(&real, "band names"), "bbl");
        let h = envi::parse_header(&text).unwrap();
        assert_eq!((h.meta.band_names, h.meta.bbl), (None, None));
        assert_eq!(h.meta.wavelength.as_ref().unwrap().len(), 285);
        assert_eq!(h.meta.ignore_value, Some(-9999.0));
    }
}

/// Keys in any case and spacing give the same cube as the lower-case spelling.
#[test]
fn keys_in_any_case() {
    let lower = "ENVI\nsamples = 4\nlines = 3\nbands = 2\nheader offset = 0\ndata type = 4\ninterleave = bil\n\
                 byte order = 0\nwavelength units = Micrometers\nwavelength = {0.45, 0.55}\nfwhm = {0.01, 0.01}\n\
                 bbl = {1, 0}\ndata ignore value = -9999\nband names = {a, b}\ndescription = {d}\n\
                 map info = {UTM, 1, 1, 10, 20, 30, 30, 11, North, WGS-84, rotation=5}\n";
    let upper = "ENVI\nSamples = 4\nLINES = 3\nBands= 2\nHeader Offset = 0\nData Type = 4\nInterleave = BIL\n\
                 BYTE ORDER = 0\nWavelength Units = Micrometers\nWAVELENGTH = {0.45, 0.55}\nFWHM = {0.01, 0.01}\n\
                 BBL = {1, 0}\nData  Ignore  Value = -9999\nBand Names = {a, b}\nDescription = {d}\n\
                 Map Info = {UTM, 1, 1, 10, 20, 30, 30, 11, North, WGS-84, rotation=5}\n";
    let (a, b) = (envi::parse_header(lower).unwrap(), envi::parse_header(upper).unwrap());
    assert_eq!((a.samples, a.lines, a.bands, a.data_type, a.interleave), (b.samples, b.lines, b.bands, b.data_type, b.interleave));
    assert_eq!(a.meta, b.meta);
    assert_eq!(b.meta.wavelengths_nm(), Some(vec![450.0, 550.0]));
    assert_eq!(b.meta.bbl, Some(vec![true, false]));
    assert_eq!(b.meta.ignore_value, Some(-9999.0));
    assert!(b.meta.extra.is_empty());
}

fn hypermnf(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hypermnf")).args(args).output().expect("hypermnf runs")
}

const ROTATION: &str = ", rotation=-12.50000000";

/// The real orthorectified AVIRIS-NG map info with a rotation added, and its WKT (the same text
/// inline where the shared samples are missing).
fn georeferencing() -> (String, String) {
    let (map, wkt) = match formats_dir() {
        Some(dir) => {
            let h = envi::read(&dir.join("aviris-ng/ang20160910t185702_2rdn_img.hdr")).unwrap();
            (h.meta.map_info.clone().unwrap(), h.meta.extra_value("coordinate system string").unwrap().to_string())
        }
        None => (
            "UTM, 1, 1, 353128.751647949, 3813729.76806641, 15, 15, 11, North,WGS-84".to_string(),
            "PROJCS[\"unnamed\",GEOGCS[\"GCS_WGS_1984\",DATUM[\"D_WGS_1984\",SPHEROID[\"WGS_1984\",6378137.0,298.257223563]],\
             PRIMEM[\"Greenwich\",0.0],UNIT[\"Degree\",0.0174532925199433]],PROJECTION[\"Transverse_Mercator\"],\
             PARAMETER[\"False_Easting\",500000.0],PARAMETER[\"False_Northing\",0.0],PARAMETER[\"Central_Meridian\",-117.0],\
             PARAMETER[\"Scale_Factor\",0.9996],PARAMETER[\"Latitude_Of_Origin\",0.0],UNIT[\"Meter\",1.0]]"
                .to_string(),
        ),
    };
    (format!("{map}{ROTATION}"), wkt)
}

/// A float32 cube with a known signal (40 x 40 x 12), its band 3 and 7 marked bad in `bbl`, no-data
/// -9999: at pixel (0, 0) in a good band (masked), at pixel (0, 1) only in a bad band (not masked).
fn flight_line_cube(meta: CubeMeta) -> Cube {
    let mut spec = hypermnf::cube::synthetic::SyntheticSpec::small(40, 40, 12);
    spec.dtype = DataType::F32;
    let c = hypermnf::cube::synthetic::generate(&spec);
    assert_eq!(c.byte_order(), ByteOrder::Little);
    let mut raw = c.raw().to_vec();
    let mut set = |l: usize, s: usize, b: usize, v: f32| {
        let i = ((l * 40 + s) * 12 + b) * 4;
        raw[i..i + 4].copy_from_slice(&v.to_le_bytes());
    };
    set(0, 0, 0, -9999.0);
    set(0, 1, 3, -9999.0);
    Cube::from_raw(40, 40, 12, DataType::F32, ByteOrder::Little, raw, meta).unwrap()
}

fn flight_line_meta(map: &str, wkt: &str) -> CubeMeta {
    CubeMeta {
        bbl: Some((0..12).map(|b| b != 3 && b != 7).collect()),
        ignore_value: Some(-9999.0),
        band_names: Some((0..12).map(|b| format!("{:.2} Nanometers", 400.0 + 150.0 * b as f64)).collect()),
        map_info: Some(map.to_string()),
        extra: vec![("Coordinate System String".into(), format!("{{{wkt}}}"))],
        ..CubeMeta::default()
    }
}

fn header_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.split_once(" = ").filter(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v))
}

/// `hypermnf run --out X.hdr`: `bbl` and `data ignore value` are both honoured (bands 3 and 7 dropped
/// as bad, the one pixel with -9999 in a good band masked, the one with -9999 only in a bad band
/// kept), and the components' and the denoised cube's headers carry the map info verbatim (rotation
/// included) and the WKT; the denoised header also the wavelengths read from the band names.
#[test]
fn bbl_with_ignore_value_and_georeferencing_through_hypermnf_run() {
    let dir = tempfile::tempdir().unwrap();
    let (map, wkt) = georeferencing();
    // Written by the project's writer in BIL, with its header's keys respelled in title case.
    let input = dir.path().join("ang_rdn.hdr");
    envi::write_cube(&input, &flight_line_cube(flight_line_meta(&map, &wkt)), Interleave::Bil, ByteOrder::Little).unwrap();
    let titled: String = std::fs::read_to_string(&input)
        .unwrap()
        .lines()
        .map(|l| match l.split_once(" = ") {
            Some((k, v)) => format!("{} = {v}\n", k.split(' ').map(|w| w[..1].to_uppercase() + &w[1..]).collect::<Vec<_>>().join(" ")),
            None => format!("{l}\n"),
        })
        .collect();
    assert!(titled.contains("Data Ignore Value = -9999") && titled.contains("Map Info = {"), "{titled}");
    std::fs::write(&input, titled).unwrap();
    let back = envi::read(&input).unwrap();
    assert_eq!(back.meta.wavelength.as_ref().unwrap()[11], 2050.0);
    assert_eq!(back.meta.map_info.as_deref(), Some(map.as_str()));

    let out = dir.path().join("mnf.hdr");
    let o = hypermnf(&["run", input.to_str().unwrap(), "--components", "3", "--backend", "cpu", "--inverse", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let md: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join("mnf.json")).unwrap()).unwrap();
    let dropped: Vec<(u64, &str)> = md["dropped_bands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["band"].as_u64().unwrap(), d["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(dropped, [(3, "bad_band_list"), (7, "bad_band_list")], "{md}");
    assert_eq!(md["pixels"]["masked"], 1, "only the pixel with -9999 in a good band: {}", md["pixels"]);
    assert_eq!(md["pixels"]["used"], 40 * 40 - 1);
    assert_eq!(md["pixels"]["ignore_value"], -9999.0);
    assert_eq!(md["source"]["map_info"], map.as_str());
    assert_eq!(md["source"]["coordinate_system_string"], wkt.as_str());

    let components = std::fs::read_to_string(&out).unwrap();
    let denoised = std::fs::read_to_string(dir.path().join("mnf-denoised.hdr")).unwrap();
    for (name, text) in [("components", &components), ("denoised", &denoised)] {
        assert_eq!(header_value(text, "map info"), Some(format!("{{{map}}}").as_str()), "{name}:\n{text}");
        assert!(header_value(text, "map info").unwrap().ends_with(&format!("{ROTATION}}}")), "{name}");
        assert_eq!(header_value(text, "coordinate system string"), Some(format!("{{{wkt}}}").as_str()), "{name}:\n{text}");
        // And an ENVI reader reads them back.
        let hdr = if name == "components" { out.clone() } else { dir.path().join("mnf-denoised.hdr") };
        let read = envi::read(&hdr).unwrap();
        assert_eq!(read.meta.map_info.as_deref(), Some(map.as_str()), "{name}");
        assert_eq!(read.meta.extra_value("coordinate system string"), Some(wkt.as_str()), "{name}");
    }
    assert_eq!(header_value(&components, "wavelength"), None, "components are not the input's bands");
    let read = envi::read(&dir.path().join("mnf-denoised.hdr")).unwrap();
    assert_eq!(read.meta.wavelengths_nm(), back.meta.wavelengths_nm());
    assert_eq!(read.meta.wavelength_units.as_deref(), Some("Nanometers"));
    assert_eq!(read.meta.bbl, back.meta.bbl);
    assert_eq!(read.meta.ignore_value, Some(-9999.0));
}

/// Through the service: an ENVI upload with EMIT's empty lists is accepted, its job succeeds, and the
/// ENVI result's header (`?format=envi`) carries the map info with its rotation and the WKT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_takes_emit_headers_and_carries_the_georeferencing() {
    let dir = tempfile::tempdir().unwrap();
    let srv = common::TestServer::start(hypermnf::config::ServeArgs::with_data_dir(dir.path().join("data"))).await;
    let (map, wkt) = georeferencing();
    let cube = flight_line_cube(CubeMeta::default());
    let files = tempfile::tempdir().unwrap();
    let written = files.path().join("c.hdr");
    envi::write_cube(&written, &cube, Interleave::Bil, ByteOrder::Little).unwrap();
    let data = std::fs::read(files.path().join("c.img")).unwrap();

    // EMIT's header (empty band names and coordinate system string) ...
    let emit = emit_l1b_header(40, 40, 12);
    // ... and one with the georeferencing filled in.
    let georef = emit.replace("coordinate system string = {}", &format!("coordinate system string = {{{wkt}}}\nmap info = {{{map}}}"));
    for (name, header) in [("emit", &emit), ("georeferenced", &georef)] {
        let form = reqwest::multipart::Form::new()
            .text("header", header.clone())
            .part("data", reqwest::multipart::Part::bytes(data.clone()).file_name("c.img"))
            .text("params", r#"{"components": 3}"#);
        let r = srv.client.post(srv.url("/v1/jobs")).multipart(form).send().await.unwrap();
        let status = r.status();
        let j: serde_json::Value = r.json().await.unwrap();
        assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{name}: {j}");
        let id = j["id"].as_str().unwrap().to_string();
        let done = srv.wait(&id).await;
        assert_eq!(done["status"], "succeeded", "{name}: {done}");
        let zip = srv.get_bytes(&format!("/v1/jobs/{id}/result?format=envi")).await;
        assert_eq!(zip.0, reqwest::StatusCode::OK, "{name}");
        let mut z = zip::ZipArchive::new(std::io::Cursor::new(zip.1)).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut z.by_name(&format!("{id}.hdr")).unwrap(), &mut text).unwrap();
        assert!(!text.contains("{}"), "{name}: no empty list is carried on:\n{text}");
        assert!(text.contains("flip horizontal = 0"), "{name}: the other keys go on:\n{text}");
        if name == "georeferenced" {
            assert_eq!(header_value(&text, "map info"), Some(format!("{{{map}}}").as_str()), "{text}");
            assert_eq!(header_value(&text, "coordinate system string"), Some(format!("{{{wkt}}}").as_str()), "{text}");
        } else {
            assert_eq!(header_value(&text, "coordinate system string"), None, "{text}");
        }
    }
    srv.stop().await;
}
