//! The MNF from Rust on an ndarray cube, without a server or files: a synthetic int16 cube with a
//! 5-dimensional signal plus white noise, fitted, its eigenvalues and SNR printed, the components and
//! the denoised cube checked.
//!
//! Run with `cargo run --example mnf_ndarray` (the CPU backend unless a CUDA device is found; pass
//! `cpu` or `cuda` as the first argument to choose). Exits non-zero if the fit does not find the signal.

use hypermnf::cube::synthetic::{generate, SyntheticSpec};
use hypermnf::library::cube_to_array;
use hypermnf::{Backend, Mnf, NoiseEstimator};
use ndarray::{s, Array3};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = match std::env::args().nth(1).as_deref() {
        None | Some("auto") => Backend::Auto,
        Some(name) => name.parse()?,
    };
    // 96 lines × 80 samples × 48 bands, int16 like AVIRIS radiance, as an Array3 (lines, samples, bands).
    let spec = SyntheticSpec::small(96, 80, 48);
    let cube: Array3<i16> = cube_to_array(&generate(&spec))?;
    println!("cube: {:?} {}", cube.dim(), std::any::type_name::<i16>());

    let fit = Mnf::new()
        .components(spec.signal_dims)
        .noise(NoiseEstimator::ShiftDifference)
        .inverse(true)
        .backend(backend)
        .fit(cube.view())?;

    println!("backend: {}", fit.backend_name());
    println!("components: {:?} (lines, samples, k)", fit.components().dim());
    println!("transform: {:?} (bands used, k)", fit.transform_matrix().dim());
    println!("{:>9} {:>12} {:>12}", "component", "eigenvalue", "SNR");
    for (i, (l, snr)) in fit.eigenvalues().iter().zip(fit.snr()).enumerate().take(8) {
        println!("{:>9} {l:>12.4} {snr:>12.4}", i + 1);
    }

    // Another scene of the same sensor: the lower half, projected with the fitted system.
    let lower = cube.slice(s![48.., .., ..]);
    let z = fit.transform(lower)?;
    println!("transform of lines 48..96: {:?}", z.dim());

    // The denoised cube keeps only the 5 signal components, so it differs from the input by about the
    // noise (σ = 10 in every band; a little less, since the noise inside the signal subspace stays).
    let denoised = fit.inverse()?;
    let rms = (denoised.iter().zip(cube.iter()).map(|(d, &x)| (*d as f64 - x as f64).powi(2)).sum::<f64>()
        / cube.len() as f64)
        .sqrt();
    println!("denoised: {:?}, RMS change {rms:.2} (noise σ {})", denoised.dim(), spec.noise_sigma);

    // The signal is 5-dimensional: the 5 leading components stand far above the noise, the next does not.
    let snr = fit.snr();
    let k = spec.signal_dims;
    let signal_found = snr[k - 1] > 10.0 * snr[k].abs().max(1.0);
    let noise_removed = rms > 0.5 * spec.noise_sigma && rms < 1.5 * spec.noise_sigma;
    if !(signal_found && noise_removed) {
        return Err(format!("unexpected fit: SNR {snr}, RMS change {rms}").into());
    }
    println!("ok: {k} signal components found");
    Ok(())
}
