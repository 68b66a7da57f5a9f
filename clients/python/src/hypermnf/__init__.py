"""Python client for hypermnf, the Maximum Noise Fraction service for hyperspectral cubes.

    >>> import hypermnf
    >>> client = hypermnf.Client("http://127.0.0.1:8080")
    >>> job = client.submit(cube, components=10)       # ndarray, xarray.DataArray, Spectral Python image, ENVI path, file:// href
    >>> job.wait()                                     # progress bar; raises JobFailed / JobCanceled / TimeoutError
    >>> components = job.result()                      # float32 (lines, samples, 10)
    >>> job.eigenvalues, job.snr, job.bands_used
    >>> r = client.reduce(cube, components=10, full=True)   # a Reduction: components, eigenvalues, wavelengths, metadata
    >>> hypermnf.to_xarray(r)                          # line/sample (and x/y, CRS) coordinates
    >>> hypermnf.plot_eigenvalues(job)                 # matplotlib Axes
    >>> system = client.system(job.id)                 # its eigen system (hypermnf.System); client.apply(system, cubes)
    >>> batch = client.batch([Path("/data/a.hdr"), "s3://bucket/b.hdr"], statistics="pooled")   # several cubes, one system
    >>> batch.wait(); batch.components()               # one progress bar; one array per cube

``hypermnf.AsyncClient`` offers the same methods as coroutines.
"""

from .aio import AsyncBatch, AsyncClient, AsyncJob
from .batches import Batch
from .client import Client
from .errors import APIError, ConnectionError, HyperMNFError, JobCanceled, JobFailed, TimeoutError
from .interop import cog_to_xarray, to_xarray
from .job import Job
from .results import Reduction, plot_eigenvalues
from .systems import System

from ._version import __version__

__all__ = [
    "Client",
    "AsyncClient",
    "Job",
    "AsyncJob",
    "Batch",
    "AsyncBatch",
    "Reduction",
    "System",
    "to_xarray",
    "cog_to_xarray",
    "plot_eigenvalues",
    "HyperMNFError",
    "APIError",
    "ConnectionError",
    "TimeoutError",
    "JobFailed",
    "JobCanceled",
    "__version__",
]
