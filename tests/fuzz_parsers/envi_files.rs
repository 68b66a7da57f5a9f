//! ENVI headers, and ENVI data sizes and offsets.

use super::*;

const REAL_HEADERS: [&str; 3] = [
    include_str!("../data/salinasA_224_bip_be.hdr"),
    include_str!("../data/jasper_ridge_r198_bil.hdr"),
    include_str!("../data/abu_beach1_cat_island_bsq.hdr"),
];

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
