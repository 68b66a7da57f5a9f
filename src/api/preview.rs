//! `GET /v1/jobs/{id}/preview?component=N`: a quicklook of one MNF component as a greyscale PNG,
//! linearly stretched between its 2nd and 98th percentiles (the usual quicklook stretch: a few
//! extreme pixels do not wash the image out). For the web page; the numbers are in `/result`.

use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::auth::Caller;
use super::error::{ApiResult, Error};
use super::job_view::{owned_job, require_succeeded};
use super::ApiContext;
use crate::cube::npy;
use crate::cube::{ByteOrder, DataType};
use crate::jobs::product;

/// The stretch's percentiles.
const LOW: f64 = 0.02;
const HIGH: f64 = 0.98;

pub async fn preview(State(ctx): State<ApiContext>, caller: Caller, UrlPath(id): UrlPath<String>, RawQuery(query): RawQuery) -> ApiResult<Response> {
    let mut component = 0usize;
    let bad = |m: String| Error::bad_request("invalid_query", m);
    for (k, v) in form_urlencoded::parse(query.as_deref().unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "component" => component = v.parse().map_err(|_| bad(format!("component must be a 0-based component number, not {v:?}")))?,
            other => return Err(bad(format!("unknown query parameter {other:?} (component)"))),
        }
    }
    let job = owned_job(&ctx, &caller, &id).await?;
    require_succeeded(&job)?;
    let key = job.results.get(product::COMPONENTS_NPY).ok_or_else(|| Error::internal(anyhow::anyhow!("job {id} lacks its components")))?;
    let bytes = ctx.runner.storage.get_bytes(key).await?;
    let png = tokio::task::spawn_blocking(move || render(&bytes, component)).await.map_err(Error::internal)??;
    let mut r = png.into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("image/png"));
    // A job's results never change; the key decides who may see them, so only the browser keeps it.
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("private, max-age=86400"));
    Ok(r)
}

/// The PNG of component `component` of a components `.npy` (float32, (lines, samples, k), C order,
/// as the worker writes it).
pub fn render(file: &[u8], component: usize) -> ApiResult<Vec<u8>> {
    let h = npy::read_header(&mut &file[..]).map_err(Error::internal)?;
    let [lines, samples, k] = h.shape[..] else {
        return Err(Error::internal(anyhow::anyhow!("components of shape {:?}", h.shape)));
    };
    if h.dtype != DataType::F32 || h.byte_order != ByteOrder::Little || h.fortran_order {
        return Err(Error::internal(anyhow::anyhow!("components stored as {:?} {:?}", h.dtype, h.byte_order)));
    }
    let (lines, samples, k) = (lines as usize, samples as usize, k as usize);
    if component >= k {
        return Err(Error::bad_request("invalid_query", format!("component must be below {k} (this job kept {k} components)")));
    }
    let data = &file[h.data_offset as usize..];
    if data.len() < lines * samples * k * 4 {
        return Err(Error::internal(anyhow::anyhow!("components file is short")));
    }
    let plane: Vec<f32> = (0..lines * samples)
        .map(|p| {
            let at = (p * k + component) * 4;
            f32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
        })
        .collect();
    let grey = stretch(&plane);
    encode_png(&grey, samples as u32, lines as u32)
}

/// Maps the values to 0..=255 between their LOW and HIGH percentiles; no-data (NaN) is black. A flat
/// plane is mid-grey.
fn stretch(values: &[f32]) -> Vec<u8> {
    let mut finite: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return vec![0; values.len()];
    }
    let mut at = |q: f64| {
        let i = ((finite.len() - 1) as f64 * q).round() as usize;
        *finite.select_nth_unstable_by(i, f32::total_cmp).1
    };
    let (lo, hi) = (at(LOW), at(HIGH));
    values
        .iter()
        .map(|&v| match v {
            v if !v.is_finite() => 0,
            _ if hi <= lo => 128,
            v => (((v - lo) / (hi - lo)) * 255.0).round().clamp(0.0, 255.0) as u8,
        })
        .collect()
}

fn encode_png(grey: &[u8], width: u32, height: u32) -> ApiResult<Vec<u8>> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, width, height);
    enc.set_color(png::ColorType::Grayscale);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(Error::internal)?;
    w.write_image_data(grey).map_err(Error::internal)?;
    w.finish().map_err(Error::internal)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretches_between_the_percentiles() {
        // 0..=99 and one outlier: the outlier saturates, the rest spreads over the range.
        let mut v: Vec<f32> = (0..100).map(|i| i as f32).collect();
        v.push(1e6);
        v.push(f32::NAN);
        let g = stretch(&v);
        assert_eq!(g[100], 255);
        assert_eq!(g[101], 0);
        assert_eq!(g[0], 0);
        assert!(g[50] > 100 && g[50] < 155, "{}", g[50]);
        assert_eq!(stretch(&[3.0; 4]), vec![128; 4]);
    }

    #[test]
    fn renders_the_asked_component() {
        let (lines, samples, k) = (3usize, 4usize, 2usize);
        // Component 0 rises along the samples, component 1 is flat.
        let values: Vec<f32> = (0..lines * samples).flat_map(|p| [(p % samples) as f32, 5.0]).collect();
        let mut file = Vec::new();
        npy::write_f32_to(&mut file, &[lines, samples, k], &values).unwrap();
        let png_bytes = render(&file, 0).unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(png_bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height, info.color_type), (4, 3, png::ColorType::Grayscale));
        assert_eq!(&buf[..4], &[0, 85, 170, 255]);
        assert_eq!(render(&file, 2).unwrap_err().code(), "invalid_query");
    }
}
