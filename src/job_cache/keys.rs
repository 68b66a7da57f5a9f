//! The digests the cache levels are keyed on. Each is a SHA-256 over a tag naming the level (and its
//! version) and exactly the inputs that decide what the level stores: two requests with the same key
//! get interchangeable entries, and anything that could change a single bit of the stored thing is in
//! the key.

use sha2::{Digest as _, Sha256};

use super::Digest;
use crate::mnf::MnfParams;

/// Result level: one owner's job of a given job digest (decoded cube + canonical parameters). The
/// owner is part of the key because a job is only ever shown to its owner.
pub fn result_key(job_digest: &str, owner: &str) -> Digest {
    let mut h = Sha256::new();
    h.update(b"hypermnf-result-key-v1");
    field(&mut h, job_digest.as_bytes());
    field(&mut h, owner.as_bytes());
    h.finalize().into()
}

/// Statistics level: what the statistics passes and the eigen system depend on, and nothing else.
///
/// * `content`: [`crate::cube::Cube::content_digest`] (samples, shape, data type, and the header's
///   `bbl` and `data ignore value`);
/// * the noise estimator and window, the user's bad bands (as a set: their order and repeats do not
///   change the selection), the request's no-data value;
/// * `backend`: the name of the backend that runs the job (`cpu`, `cuda`, `cuda-cublas`), because
///   backends sum in different orders: a hit must be bit-identical to a cold run on the same backend.
///
/// Left out on purpose: `components`, `snr`, `inverse` (they only shape the projection).
pub fn statistics_key(content: &Digest, params: &MnfParams, backend: &str) -> Digest {
    let mut h = Sha256::new();
    h.update(b"hypermnf-statistics-key-v1");
    h.update(content);
    field(&mut h, params.noise.name().as_bytes());
    let mut bad = params.bad_bands.clone();
    bad.sort_unstable();
    bad.dedup();
    h.update((bad.len() as u64).to_le_bytes());
    for b in bad {
        h.update((b as u64).to_le_bytes());
    }
    match params.ignore_value {
        Some(v) => {
            h.update([1]);
            // Every NaN is the same no-data value ("nan" from JSON, -nan from a command line).
            let v = if v.is_nan() { f64::NAN } else { v };
            h.update(v.to_bits().to_le_bytes());
        }
        None => h.update([0]),
    }
    match params.noise_window {
        Some(w) => {
            h.update([1]);
            for v in [w.x0, w.y0, w.x1, w.y1] {
                h.update((v as u64).to_le_bytes());
            }
        }
        None => h.update([0]),
    }
    field(&mut h, backend.as_bytes());
    h.finalize().into()
}

/// Device level: one decoded cube prepared by one backend. `input_header` is a digest of the input's
/// header bytes (the `.npy` header or the ENVI `.hdr` text): with the content digest it fixes the
/// decoded cube exactly, byte order and header metadata (wavelengths, band names) included, which the
/// content digest alone does not, and which the result files carry.
pub fn device_key(content: &Digest, input_header: &Digest, backend: &str) -> Digest {
    let mut h = Sha256::new();
    h.update(b"hypermnf-device-key-v1");
    h.update(content);
    h.update(input_header);
    field(&mut h, backend.as_bytes());
    h.finalize().into()
}

/// A length-prefixed field, so that adjacent fields cannot run into each other.
fn field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The 32 bytes of a 64-digit hex digest (as the job rows store them).
pub fn parse_hex(s: &str) -> Option<Digest> {
    let bytes = hex::decode(s).ok()?;
    bytes.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mnf::{NoiseEstimator, Window};

    fn params(json: &str) -> MnfParams {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn statistics_key_ignores_the_projection_parameters_only() {
        let c = [3u8; 32];
        let base = statistics_key(&c, &params("{}"), "cpu");
        for same in [r#"{"components": 3}"#, r#"{"snr": 2.5}"#, r#"{"inverse": true}"#] {
            assert_eq!(statistics_key(&c, &params(same), "cpu"), base, "{same}");
        }
        // Bad bands are a set.
        assert_eq!(
            statistics_key(&c, &params(r#"{"bad_bands": [4, 1, 4]}"#), "cpu"),
            statistics_key(&c, &params(r#"{"bad_bands": [1, 4]}"#), "cpu")
        );
        let mut seen = vec![base];
        let mut other = |k: Digest| {
            assert!(!seen.contains(&k), "two different requests share a statistics key");
            seen.push(k);
        };
        other(statistics_key(&[4u8; 32], &params("{}"), "cpu"));
        other(statistics_key(&c, &params("{}"), "cuda"));
        other(statistics_key(&c, &params(r#"{"noise": "shift-difference"}"#), "cpu"));
        other(statistics_key(&c, &params(r#"{"bad_bands": [1]}"#), "cpu"));
        other(statistics_key(&c, &params(r#"{"bad_bands": [1, 4]}"#), "cpu"));
        other(statistics_key(&c, &params(r#"{"ignore_value": 0}"#), "cpu"));
        other(statistics_key(&c, &params(r#"{"ignore_value": -9999}"#), "cpu"));
        other(statistics_key(&c, &params(r#"{"noise_window": [0, 0, 5, 5]}"#), "cpu"));
        other(statistics_key(&c, &params(r#"{"noise_window": [0, 0, 5, 6]}"#), "cpu"));
        let p = MnfParams { noise: NoiseEstimator::MeanFilter, noise_window: Some(Window::from([0, 0, 6, 5])), ..Default::default() };
        other(statistics_key(&c, &p, "cpu"));
    }

    #[test]
    fn result_and_device_keys_separate_their_inputs() {
        assert_ne!(result_key("ab", "alice"), result_key("ab", "bob"));
        // Length prefixes: moving a character from one field to the next changes the key.
        assert_ne!(result_key("abc", "d"), result_key("ab", "cd"));
        let (c, hdr) = ([1u8; 32], [2u8; 32]);
        assert_ne!(device_key(&c, &hdr, "cuda"), device_key(&c, &hdr, "cuda-cublas"));
        assert_ne!(device_key(&c, &hdr, "cuda"), device_key(&c, &[9u8; 32], "cuda"));
        assert_eq!(parse_hex(&hex::encode(c)), Some(c));
        assert_eq!(parse_hex("zz"), None);
        assert_eq!(parse_hex(&hex::encode([1u8; 31])), None);
    }
}
