//! The MNF query parameters.

use super::*;

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
