"""Writes one cube in the layouts of today's missions, for tests/formats_gdal/.

Input: an ENVI cube (read with GDAL, as any user would) and a JSON file with its wavelengths and fwhm.
Output, in OUT_DIR:
  emit_rdn.nc        EMIT L1B radiance layout (NetCDF-4, netCDF4): root `radiance` (downtrack,
                     crosstrack, bands) with _FillValue -9999, sensor_band_parameters/{wavelengths, fwhm,
                     good_wavelengths}, location/{lat, lon, elev, glt_x, glt_y}, global geotransform and
                     spatial_ref. The GLT maps a north-up grid one cell larger than the cube on every side.
  emit_rfl.nc        the same as EMIT L2A reflectance (`reflectance`).
  neon_refl.h5       NEON AOP reflectance layout (HDF5, h5py): SITE/Reflectance/Reflectance_Data with
                     Scale_Factor 1 and Data_Ignore_Value -9999, Metadata/Spectral_Data/{Wavelength, FWHM},
                     Metadata/Coordinate_System/{Map_Info, EPSG Code}.
  cube.tif           a band-interleaved GeoTIFF (GDAL) with per-band wavelength/fwhm/bbl metadata, nodata.
  prisma_l2d.he5     PRISMA L2D layout (HDF-EOS5, h5py) from the published specification, with
  prisma_expected.npy  the float32 cube the reader must return (VNIR + SWIR joined, overlap resolved).
  bad_*              files that must be refused.
"""
import json
import sys

import h5py
import netCDF4
import numpy as np
from osgeo import gdal, osr

gdal.UseExceptions()


def main(envi_data, meta_json, out):
    ds = gdal.Open(envi_data)
    cube = np.transpose(ds.ReadAsArray(), (1, 2, 0)).astype(np.float32)  # (lines, samples, bands)
    lines, samples, bands = cube.shape
    gt = ds.GetGeoTransform()
    wkt = ds.GetProjection()
    srs = osr.SpatialReference(wkt=wkt)
    # The chip's WKT (ESRI style) names no EPSG code; NEON and PRISMA give one: that of its UTM zone.
    zone = srs.GetUTMZone()
    epsg = 32600 + zone if zone > 0 else 32700 - zone
    meta = json.load(open(meta_json))
    wl = np.array(meta["wavelength"], dtype=np.float32)
    # fwhm may be absent (the AVIRIS-NG chip has none): then the layouts carry none either.
    fwhm = None if meta.get("fwhm") is None else np.array(meta["fwhm"], dtype=np.float32)

    for var, name in (("radiance", "emit_rdn.nc"), ("reflectance", "emit_rfl.nc")):
        write_emit(f"{out}/{name}", var, cube, wl, fwhm, gt, wkt)
    write_neon(f"{out}/neon_refl.h5", cube, wl, fwhm, meta["map_info"], epsg)
    write_geotiff(f"{out}/cube.tif", cube, wl, fwhm, gt, wkt)
    write_prisma(f"{out}/prisma_l2d.he5", f"{out}/prisma_expected.npy", cube, wl, fwhm, gt, epsg)
    write_bad(out, cube)


def write_emit(path, var, cube, wl, fwhm, gt, wkt):
    lines, samples, bands = cube.shape
    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        nc.createDimension("downtrack", lines)
        nc.createDimension("crosstrack", samples)
        nc.createDimension("bands", bands)
        v = nc.createVariable(var, "f4", ("downtrack", "crosstrack", "bands"), zlib=True, fill_value=-9999.0)
        v[:] = cube
        sbp = nc.createGroup("sensor_band_parameters")
        sbp.createVariable("wavelengths", "f4", ("bands",))[:] = wl
        if fwhm is not None:
            sbp.createVariable("fwhm", "f4", ("bands",))[:] = fwhm
        sbp.createVariable("good_wavelengths", "f4", ("bands",))[:] = np.ones(bands, np.float32)
        loc = nc.createGroup("location")
        rows, cols = lines + 2, samples + 2
        nc.createDimension("ortho_y", rows)
        nc.createDimension("ortho_x", cols)
        for k in ("lat", "lon", "elev"):
            loc.createVariable(k, "f8", ("downtrack", "crosstrack"), fill_value=-9999.0)[:] = np.zeros((lines, samples))
        # The grid is the cube's pixels shifted one cell down and right; the border has no pixel (0).
        glt_x = np.zeros((rows, cols), np.int32)
        glt_y = np.zeros((rows, cols), np.int32)
        glt_x[1:-1, 1:-1] = np.arange(1, samples + 1)[None, :]
        glt_y[1:-1, 1:-1] = np.arange(1, lines + 1)[:, None]
        loc.createVariable("glt_x", "i4", ("ortho_y", "ortho_x"))[:] = glt_x
        loc.createVariable("glt_y", "i4", ("ortho_y", "ortho_x"))[:] = glt_y
        nc.geotransform = np.array([gt[0] - gt[1], gt[1], 0.0, gt[3] - gt[5], 0.0, gt[5]])
        nc.spatial_ref = wkt


def write_neon(path, cube, wl, fwhm, map_info, epsg):
    with h5py.File(path, "w") as f:
        refl = f.create_group("SITE/Reflectance")
        d = refl.create_dataset("Reflectance_Data", data=cube, compression="gzip")
        d.attrs["Scale_Factor"] = np.float32(1.0)
        d.attrs["Data_Ignore_Value"] = np.float32(-9999.0)
        refl.create_dataset("Metadata/Spectral_Data/Wavelength", data=wl.astype(np.float64))
        if fwhm is not None:
            refl.create_dataset("Metadata/Spectral_Data/FWHM", data=fwhm.astype(np.float64))
        refl.create_dataset("Metadata/Coordinate_System/Map_Info", data=np.array([map_info.encode()]))
        refl.create_dataset("Metadata/Coordinate_System/EPSG Code", data=np.array([str(epsg).encode()]))


def write_geotiff(path, cube, wl, fwhm, gt, wkt):
    lines, samples, bands = cube.shape
    drv = gdal.GetDriverByName("GTiff")
    ds = drv.Create(path, samples, lines, bands, gdal.GDT_Float32, ["INTERLEAVE=BAND", "COMPRESS=DEFLATE"])
    ds.SetGeoTransform(gt)
    ds.SetProjection(wkt)
    for b in range(bands):
        band = ds.GetRasterBand(b + 1)
        band.WriteArray(cube[:, :, b])
        band.SetNoDataValue(-9999.0)
        band.SetDescription(f"band {b + 1} ({wl[b]:g} Nanometers)")
        md = {"wavelength": f"{wl[b]:.9g}", "wavelength_units": "Nanometers", "bbl": "1"}
        if fwhm is not None:
            md["fwhm"] = f"{fwhm[b]:.9g}"
        band.SetMetadata(md)
    ds = None


def write_prisma(path, expected_path, cube, wl, fwhm, gt, epsg):
    """PRISMA L2D: VNIR = the bands below 1000 nm, SWIR = those above 900 nm (an overlap, as PRISMA has),
    each stored in decreasing wavelength as uint16 DN with L2Scale*Min/Max, and one unused band (wavelength
    0, flag 0) in each list."""
    lines, samples, bands = cube.shape
    fwhm = np.zeros(bands, np.float32) if fwhm is None else fwhm
    vnir = [b for b in range(bands) if wl[b] < 1000.0][::-1]
    swir = [b for b in range(bands) if wl[b] > 900.0][::-1]
    lo, hi = 0.0, 50.0
    dn = np.clip(np.round((np.nan_to_num(cube, nan=0.0) - lo) / (hi - lo) * 65535.0), 0, 65535).astype(np.uint16)
    with h5py.File(path, "w") as f:
        fields = f.create_group("HDFEOS/SWATHS/PRS_L2D_HCO/Data Fields")
        for name, sel, key in (("VNIR_Cube", vnir, "Vnir"), ("SWIR_Cube", swir, "Swir")):
            # (lines, bands, samples), plus an unused band (all zeros) at the end.
            data = np.concatenate([np.transpose(dn[:, :, sel], (0, 2, 1)), np.zeros((lines, 1, samples), np.uint16)], axis=1)
            fields.create_dataset(name, data=data, compression="gzip")
            f.attrs[f"List_Cw_{key}"] = np.concatenate([wl[sel], [0.0]]).astype(np.float32)
            f.attrs[f"List_Fwhm_{key}"] = np.concatenate([fwhm[sel], [0.0]]).astype(np.float32)
            f.attrs[f"List_Cw_{key}_Flags"] = np.concatenate([np.ones(len(sel)), [0]]).astype(np.int8)
            f.attrs[f"L2Scale{key}Min"] = np.float32(lo)
            f.attrs[f"L2Scale{key}Max"] = np.float32(hi)
        f.attrs["Processing_Level"] = np.bytes_(b"2D")
        f.attrs["Epsg_Code"] = np.int32(int(epsg))
        f.attrs["Product_ULcorner_easting"] = np.float64(gt[0])
        f.attrs["Product_ULcorner_northing"] = np.float64(gt[3])
    # Expected: VNIR bands, then SWIR bands above the longest VNIR wavelength, increasing.
    vmax = max(wl[b] for b in vnir)
    keep = sorted(vnir) + sorted(b for b in swir if wl[b] > vmax)
    lo32, hi32 = np.float32(lo), np.float32(hi)
    scale = (float(hi32) - float(lo32)) / 65535.0
    expected = (dn[:, :, keep].astype(np.float64) * scale + float(lo32)).astype(np.float32)
    np.save(expected_path, expected)
    json.dump({"wavelength": [float(wl[b]) for b in keep]}, open(expected_path + ".json", "w"))


def write_bad(out, cube):
    lines, samples, bands = cube.shape
    good = open(f"{out}/emit_rdn.nc", "rb").read()
    open(f"{out}/bad_truncated.nc", "wb").write(good[: len(good) // 2])
    good = open(f"{out}/neon_refl.h5", "rb").read()
    open(f"{out}/bad_truncated.h5", "wb").write(good[: len(good) // 2])
    with netCDF4.Dataset(f"{out}/bad_rank.nc", "w", format="NETCDF4") as nc:
        nc.createDimension("downtrack", lines)
        nc.createDimension("crosstrack", samples)
        nc.createVariable("radiance", "f4", ("downtrack", "crosstrack"))[:] = cube[:, :, 0]
    ds = gdal.GetDriverByName("GTiff").Create(f"{out}/bad_one_band.tif", samples, lines, 1, gdal.GDT_Float32)
    ds.GetRasterBand(1).WriteArray(cube[:, :, 0])
    ds = None
    open(f"{out}/bad_not_raster.tif", "w").write("this is not a raster\n" * 10)


if __name__ == "__main__":
    main(*sys.argv[1:4])
