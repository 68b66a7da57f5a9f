"""A reduction with its metadata (:class:`Reduction`), the source header's metadata, and the eigenvalue plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

import numpy as np

from ._metadata import SOURCE_KEYS, band_values, merge_source, metadata_of, source_of

if TYPE_CHECKING:  # pragma: no cover
    import matplotlib.axes
    import xarray

__all__ = ["SOURCE_KEYS", "Reduction", "band_values", "merge_source", "metadata_of", "plot_eigenvalues", "source_of"]

@dataclass
class Reduction:
    """What ``Client.reduce(..., full=True)`` returns: the array asked for and everything known about it.

    Attributes:
        components: float32 (lines, samples, k): the MNF components (``None`` for ``product="denoised"``).
        denoised: float32 (lines, samples, bands): the denoised cube, for ``product="denoised"`` (else ``None``).
        eigenvalues: every eigenvalue, largest first (λ = 1 + SNR; ≈ 1 means noise only); the first k are
            those of the components.
        snr: λ − 1 for every eigenvalue.
        bands_used: the 0-based input bands the transform used (bad, constant and excluded bands left out).
        wavelengths: the wavelengths of ``bands_used`` (from the source's header), or ``None`` when the source
            gave none.
        metadata: the whole metadata document (``GET /v1/jobs/{id}/metadata``).
        job_id: the job that computed it.
    """

    components: Optional[np.ndarray]
    eigenvalues: np.ndarray
    snr: np.ndarray
    bands_used: List[int]
    wavelengths: Optional[np.ndarray]
    metadata: Dict[str, Any] = field(repr=False)
    job_id: str = ""
    denoised: Optional[np.ndarray] = None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], array: np.ndarray, product: str = "components", job_id: str = "") -> "Reduction":
        meta = dict(metadata)
        eigenvalues = np.asarray(meta["eigenvalues"], dtype=np.float64)
        snr = np.asarray(meta["snr"], dtype=np.float64) if "snr" in meta else eigenvalues - 1.0
        bands_used = [int(b) for b in meta["bands_used"]]
        wavelengths = band_values(meta, "wavelength")
        if wavelengths is not None:
            wavelengths = np.asarray(wavelengths, dtype=np.float64)[bands_used]
        components, denoised = (array, None) if product == "components" else (None, array)
        return cls(components, eigenvalues, snr, bands_used, wavelengths, meta, job_id, denoised)

    @property
    def k(self) -> int:
        """The number of components kept."""
        return int(self.metadata.get("components", 0 if self.components is None else self.components.shape[-1]))

    @property
    def source(self) -> Dict[str, Any]:
        """The source header's metadata (:data:`SOURCE_KEYS`; ``None`` for what it did not say)."""
        return source_of(self.metadata)

    def to_xarray(self) -> "xarray.DataArray":
        """The array asked for as an ``xarray.DataArray``, as :func:`hypermnf.to_xarray` makes it."""
        from .interop import to_xarray

        return to_xarray(self)


def plot_eigenvalues(job_or_metadata: Any, ax: "Optional[matplotlib.axes.Axes]" = None, log: bool = True) -> "matplotlib.axes.Axes":
    """Draws the eigenvalue curve of a result with matplotlib and returns the Axes.

    ``job_or_metadata`` is a :class:`~hypermnf.Job` (or an ``AsyncJob`` whose metadata was fetched), a
    :class:`Reduction` or the metadata dict. The curve is every eigenvalue against its component number
    (1-based), on a log scale unless ``log=False`` (or an eigenvalue is not positive), with the noise level
    λ = 1 and the number of components kept marked.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'hypermnf[plot]'``).
    """
    metadata = metadata_of(job_or_metadata)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError(
            "hypermnf.plot_eigenvalues needs matplotlib, which is not installed: pip install 'hypermnf[plot]' (or pip install matplotlib)"
        ) from None
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(6, 3.5))
    eigenvalues = np.asarray(metadata["eigenvalues"], dtype=np.float64)
    number = np.arange(1, eigenvalues.size + 1)
    ax.plot(number, eigenvalues, marker=".", linewidth=1, label="eigenvalue")
    if log and eigenvalues.size and np.all(eigenvalues > 0):
        ax.set_yscale("log")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="noise only (λ = 1)")
    k = metadata.get("components")
    if isinstance(k, int) and k > 0:
        ax.axvline(k + 0.5, color="tab:red", linestyle="--", linewidth=1, label=f"{k} kept")
    ax.set_xlabel("component")
    ax.set_ylabel("eigenvalue (1 + SNR)")
    noise = metadata.get("noise")
    estimator = noise.get("estimator") if isinstance(noise, Mapping) else None
    ax.set_title("MNF eigenvalues" + (f" ({estimator})" if estimator else ""))
    ax.legend(loc="upper right", fontsize="small")
    return ax
