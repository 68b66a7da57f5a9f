# shellcheck shell=bash
# GDAL for the `gdal` feature's tests (tests/formats_gdal/): Debian's libgdal-dev (the library the
# crate links), gdal-bin, and the Python modules that write the round-trip layouts and validate the COG
# outputs (python3-gdal, python3-netcdf4, python3-h5py, used through /usr/bin/python3). Installed with
# apt-get only when something is missing.
hypermnf_gdal_install() {
  if pkg-config --exists gdal 2>/dev/null && command -v gdalinfo >/dev/null \
    && /usr/bin/python3 -c 'import osgeo.gdal, netCDF4, h5py' 2>/dev/null; then
    echo "GDAL $(pkg-config --modversion gdal) and its Python modules are installed"
    return 0
  fi
  echo "installing libgdal-dev gdal-bin python3-gdal python3-netcdf4 python3-h5py (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    libgdal-dev gdal-bin python3-gdal python3-netcdf4 python3-h5py pkg-config >/dev/null
}
