//! Cubes: the data model (`model`), the ENVI format (`envi`), NumPy `.npy` (`npy`) and synthetic
//! cubes with a known signal subspace (`synthetic`). NetCDF, HDF5 and GeoTIFF products (EMIT, NEON,
//! PRISMA, EnMAP, DESIS) are read through GDAL (`gdal`, behind the cargo feature of that name; `sniff`
//! tells them apart either way).

mod bytes;
pub mod digest;
pub mod envi;
mod error;
#[cfg(feature = "gdal")]
pub mod gdal;
pub mod layout;
pub mod model;
pub mod npy;
mod npy_header;
mod open;
pub mod sample_type;
pub mod sniff;
pub mod synthetic;

pub use error::CubeError;
pub use model::{Cube, CubeMeta};
pub use open::{input_files, map, needs_gdal, open};
pub use sample_type::{ByteOrder, DataType, Interleave};

