//! `.npy` files, and `.npy` uploads: the body streamed in chunks through the upload path, header
//! checked on the way.

use super::*;

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
