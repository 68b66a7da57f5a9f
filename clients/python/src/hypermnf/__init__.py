"""Python client for hypermnf, the Maximum Noise Fraction service for hyperspectral cubes.

    >>> import hypermnf
    >>> client = hypermnf.Client("http://127.0.0.1:8080")
    >>> job = client.submit(cube, components=10)       # cube: ndarray (lines, samples, bands), .hdr path or file:// href
    >>> job.wait()                                     # progress bar; raises JobFailed / JobCanceled / TimeoutError
    >>> components = job.result()                      # float32 (lines, samples, 10)
    >>> job.eigenvalues, job.snr, job.bands_used
"""

from .client import Client
from .errors import APIError, ConnectionError, HyperMNFError, JobCanceled, JobFailed, TimeoutError
from .interop import to_xarray
from .job import Job

from ._version import __version__

__all__ = [
    "Client",
    "Job",
    "to_xarray",
    "HyperMNFError",
    "APIError",
    "ConnectionError",
    "TimeoutError",
    "JobFailed",
    "JobCanceled",
    "__version__",
]
