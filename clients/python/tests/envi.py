"""A small ENVI reader for the tests: the repo's cubes as (lines, samples, bands) arrays, so that the test
can submit the very same values as a NumPy array. Independent of the service's own reader on purpose."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict

import numpy as np

_DTYPES = {1: "u1", 2: "i2", 3: "i4", 4: "f4", 5: "f8", 12: "u2", 13: "u4", 14: "i8", 15: "u8"}


def read_header(path: Path) -> Dict[str, str]:
    text = path.read_text()
    fields: Dict[str, str] = {}
    for match in re.finditer(r"^\s*([^=\n]+?)\s*=\s*(\{[^}]*\}|[^\n]*)", text, re.MULTILINE):
        fields[match.group(1).strip().lower()] = match.group(2).strip()
    return fields


def read_cube(header: Path) -> np.ndarray:
    """The cube as stored (file dtype and byte order), shaped (lines, samples, bands)."""
    h = read_header(header)
    lines, samples, bands = int(h["lines"]), int(h["samples"]), int(h["bands"])
    order = ">" if h.get("byte order", "0").strip() == "1" else "<"
    dtype = np.dtype(order + _DTYPES[int(h["data type"])])
    raw = np.fromfile(header.with_suffix(".img"), dtype=dtype, offset=int(h.get("header offset", "0")))
    assert raw.size == lines * samples * bands, f"{header}: {raw.size} values for {lines}x{samples}x{bands}"
    interleave = h["interleave"].lower()
    if interleave == "bsq":
        return raw.reshape(bands, lines, samples).transpose(1, 2, 0)
    if interleave == "bil":
        return raw.reshape(lines, bands, samples).transpose(0, 2, 1)
    return raw.reshape(lines, samples, bands)
