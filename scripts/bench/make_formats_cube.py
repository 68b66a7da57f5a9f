"""One synthetic float32 cube in three files, for `hypermnf bench formats`: an ENVI BIL twin (the
reference), a band-interleaved GeoTIFF (EnMAP's layout) and an EMIT-layout NetCDF-4 (zlib level 1,
chunks of 32 lines, EMIT's own choice of compression). Usage: make_formats_cube.py DIR LINES SAMPLES BANDS.
Needs numpy, GDAL's Python bindings and netCDF4 (Debian: python3-gdal python3-netcdf4)."""
import os
import sys

import netCDF4
import numpy as np
from osgeo import gdal

gdal.UseExceptions()


def main(out, lines, samples, bands):
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    # A few smooth spectra mixed per pixel, plus noise: a cube MNF has something to find in.
    wl = np.linspace(400.0, 2500.0, bands)
    ends = np.stack([np.exp(-((wl - c) / w) ** 2) for c, w in ((600, 300), (1200, 500), (2000, 400), (900, 150))])
    envi = open(f"{out}/cube.img", "wb")
    tif = gdal.GetDriverByName("GTiff").Create(f"{out}/cube.tif", samples, lines, bands, gdal.GDT_Float32,
                                               ["INTERLEAVE=BAND", "BIGTIFF=YES", "TILED=NO"])
    tif.SetGeoTransform((500000.0, 30.0, 0.0, 4000000.0, 0.0, -30.0))
    nc = netCDF4.Dataset(f"{out}/cube.nc", "w", format="NETCDF4")
    nc.createDimension("downtrack", lines)
    nc.createDimension("crosstrack", samples)
    nc.createDimension("bands", bands)
    rad = nc.createVariable("radiance", "f4", ("downtrack", "crosstrack", "bands"), zlib=True, complevel=1,
                            chunksizes=(32, samples, bands), fill_value=-9999.0)
    sbp = nc.createGroup("sensor_band_parameters")
    sbp.createVariable("wavelengths", "f4", ("bands",))[:] = wl
    step = 64
    for y in range(0, lines, step):
        n = min(step, lines - y)
        ab = rng.random((n, samples, ends.shape[0]))
        block = (ab @ ends + 0.01 * rng.standard_normal((n, samples, bands))).astype(np.float32)  # (n, s, b)
        envi.write(np.ascontiguousarray(np.transpose(block, (0, 2, 1))).tobytes())  # BIL
        tif.WriteRaster(0, y, samples, n, np.ascontiguousarray(np.transpose(block, (2, 0, 1))).tobytes(),
                        band_list=list(range(1, bands + 1)))
        rad[y:y + n, :, :] = block
    envi.close()
    tif = None
    nc.close()
    with open(f"{out}/cube.hdr", "w") as h:
        h.write(f"ENVI\nsamples = {samples}\nlines = {lines}\nbands = {bands}\nheader offset = 0\n"
                "file type = ENVI Standard\ndata type = 4\ninterleave = bil\nbyte order = 0\n"
                "wavelength units = Nanometers\nwavelength = {" + ", ".join(f"{w:.3f}" for w in wl) + "}\n")


if __name__ == "__main__":
    main(sys.argv[1], *(int(v) for v in sys.argv[2:5]))
