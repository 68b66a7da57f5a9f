//! MNF parameters from a query string or JSON, with the same names either way. Both end up as an
//! `MnfParams` deserialised from JSON, so unknown names and wrong types are refused the same way.

use serde_json::{Map, Value};

use super::error::Error;
use crate::mnf::MnfParams;

/// Parses query pairs (`components=5&noise=shift-difference&bad_bands=0,5,7&noise_window=0,0,10,10`).
/// Pairs in `skip` are left out (they belong to the endpoint, not to the MNF).
pub fn from_query(query: Option<&str>) -> Result<MnfParams, Error> {
    let mut map = Map::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let value = match k.as_ref() {
            "components" => number(&k, &v, true)?,
            // NaN is a no-data value (float products written by GDAL, xarray and rasterio use it).
            "ignore_value" if v.eq_ignore_ascii_case("nan") => Value::String("nan".into()),
            "snr" | "ignore_value" => number(&k, &v, false)?,
            "inverse" | "ortho" => match v.as_ref() {
                "true" | "1" => Value::Bool(true),
                "false" | "0" => Value::Bool(false),
                _ => return Err(invalid(format!("{k} must be true or false, not {v:?}"))),
            },
            "bad_bands" | "noise_window" => {
                let items: Result<Vec<Value>, Error> =
                    v.split(',').filter(|s| !s.trim().is_empty()).map(|s| number(&k, s.trim(), true)).collect();
                Value::Array(items?)
            }
            _ => Value::String(v.to_string()),
        };
        if map.insert(k.to_string(), value).is_some() {
            return Err(invalid(format!("parameter {k} is given twice")));
        }
    }
    from_json(Value::Object(map))
}

/// Parses a JSON object of parameters.
pub fn from_json(v: Value) -> Result<MnfParams, Error> {
    if !v.is_object() && !v.is_null() {
        return Err(invalid("params must be a JSON object".into()));
    }
    let v = if v.is_null() { Value::Object(Map::new()) } else { v };
    if v.get("statistics_sha256").is_some() {
        return Err(invalid("statistics_sha256 is set by the server from statistics_from; leave it out".into()));
    }
    serde_json::from_value(v).map_err(|e| invalid(e.to_string()))
}

/// The canonical text of the parameters: what the job stores and the cache key hashes.
pub fn canonical(p: &MnfParams) -> String {
    serde_json::to_string(p).expect("MnfParams serialises")
}

fn number(key: &str, v: &str, integer: bool) -> Result<Value, Error> {
    if integer {
        v.parse::<u64>().map(Value::from).map_err(|_| invalid(format!("{key} must be a non-negative integer, not {v:?}")))
    } else {
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(Value::from(x)),
            _ => Err(invalid(format!("{key} must be a finite number, not {v:?}"))),
        }
    }
}

fn invalid(message: String) -> Error {
    Error::unprocessable("invalid_params", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mnf::{NoiseEstimator, Window};

    #[test]
    fn query_names_match_json_names() {
        let q = from_query(Some("components=5&noise=shift-difference&inverse=true&bad_bands=0,3&noise_window=1,2,30,40&ignore_value=-9999")).unwrap();
        assert_eq!(q.components, Some(5));
        assert_eq!(q.noise, NoiseEstimator::ShiftDifference);
        assert!(q.inverse);
        assert_eq!(q.bad_bands, vec![0, 3]);
        assert_eq!(q.noise_window, Some(Window { x0: 1, y0: 2, x1: 30, y1: 40 }));
        assert_eq!(q.ignore_value, Some(-9999.0));
        let j = from_json(serde_json::json!({"components": 5, "noise": "shift-difference", "inverse": true,
            "bad_bands": [0, 3], "noise_window": [1, 2, 30, 40], "ignore_value": -9999})).unwrap();
        assert_eq!(q, j);
    }

    #[test]
    fn refuses_bad_parameters() {
        for q in ["components=-1", "components=x", "snr=nan", "inverse=maybe", "noise=median", "colour=red",
                  "noise_window=1,2,3", "components=1&components=2", "backend=tpu"] {
            let e = from_query(Some(q)).unwrap_err();
            assert_eq!(e.code(), "invalid_params", "{q}");
        }
        assert!(from_json(serde_json::json!([1])).is_err());
    }
}
