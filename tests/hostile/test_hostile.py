"""The hostile HTTP corpus (issue #18): requests a stranger could send, each answered by a 4xx JSON problem
with a stable `code` (or, for inputs that are valid if odd, a job that ends succeeded or failed with a
reason), the server healthy after each, and at the end no 5xx answer, no panic in the server log and no
request that hung.
"""

from __future__ import annotations

import io
import json
import socket
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import urlsplit

import numpy as np
import pytest
import requests

from conftest import DATA, RECORDER, SERVERS, Server

# ---------------------------------------------------------------------------------------------------
# Building inputs


def envi_header(samples=4, lines=3, bands=2, dtype=2, interleave="bsq", byte_order=0, offset=None, extra="", magic="ENVI") -> str:
    text = f"{magic}\nsamples = {samples}\nlines = {lines}\nbands = {bands}\ndata type = {dtype}\n"
    if interleave is not None:
        text += f"interleave = {interleave}\n"
    if byte_order is not None:
        text += f"byte order = {byte_order}\n"
    if offset is not None:
        text += f"header offset = {offset}\n"
    return text + extra


def part(name: Optional[str], body: Union[str, bytes], filename: Optional[str] = None, ctype: Optional[str] = None) -> bytes:
    disp = "Content-Disposition: form-data"
    if name is not None:
        disp += f'; name="{name}"'
    if filename:
        disp += f'; filename="{filename}"'
    head = disp + "\r\n" + (f"Content-Type: {ctype}\r\n" if ctype else "") + "\r\n"
    return head.encode() + (body.encode() if isinstance(body, str) else body)


BOUNDARY = "hostile-corpus-boundary"


def multipart(parts: Sequence[bytes], boundary: str = BOUNDARY, close: bool = True) -> Dict:
    body = b"".join(b"--" + boundary.encode() + b"\r\n" + p + b"\r\n" for p in parts)
    if close:
        body += b"--" + boundary.encode() + b"--\r\n"
    return {"data": body, "headers": {"Content-Type": f"multipart/form-data; boundary={boundary}"}}


def envi_upload(header: Union[str, bytes], data: bytes, extra_parts: Sequence[bytes] = ()) -> Dict:
    return multipart([part("header", header, "cube.hdr"), part("data", data, "cube.img", "application/octet-stream"), *extra_parts])


def npy_raw(descr: str, shape: str, body_len: int, version: int = 1, fortran: str = "False", header_len: Optional[int] = None) -> bytes:
    """A .npy file written by hand (so that its header can say anything)."""
    d = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}"
    pre = 10 if version == 1 else 12
    d += " " * ((-(pre + len(d) + 1)) % 64) + "\n"
    n = len(d) if header_len is None else header_len
    out = b"\x93NUMPY" + bytes([version, 0]) + (struct.pack("<H", n) if version == 1 else struct.pack("<I", n))
    return out + d.encode("latin-1") + bytes(body_len)


def npy_of(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def npy_upload(body: bytes, query: str = "", headers: Optional[Dict] = None) -> Tuple[str, Dict]:
    h = {"Content-Type": "application/x-npy"}
    h.update(headers or {})
    return "/v1/jobs" + (f"?{query}" if query else ""), {"data": body, "headers": h}


RNG = np.random.default_rng(18)
# A small valid cube: 8 lines x 9 samples x 5 bands of float32 noise.
SMALL = npy_of(RNG.normal(size=(8, 9, 5)).astype(np.float32))
SMALL_ENVI_DATA = RNG.integers(0, 1000, size=3 * 4 * 2, dtype=np.int16).tobytes()


def href(path: str) -> Dict:
    return {"data": json.dumps({"input": {"href": path}}), "headers": {"Content-Type": "application/json"}}


# ---------------------------------------------------------------------------------------------------
# The corpus: requests that must be refused


@dataclass
class Case:
    name: str
    method: str
    path: str
    kwargs: Callable[[], Dict]
    status: int
    code: str


def post(name: str, status: int, code: str, kwargs: Callable[[], Dict], path: str = "/v1/jobs") -> Case:
    return Case(name, "POST", path, kwargs, status, code)


def npy_case(name: str, status: int, code: str, body: Callable[[], bytes], query: str = "", headers: Optional[Dict] = None) -> Case:
    def kw():
        return npy_upload(body(), query, headers)[1]
    return Case(name, "POST", npy_upload(b"", query)[0], kw, status, code)


def param_case(name: str, query: str) -> Case:
    return npy_case(f"params: {name}", 422, "invalid_params", lambda: SMALL, query)


BIG = 1 << 40
CASES: List[Case] = [
    # --- ENVI headers (multipart uploads)
    post("envi: 2^40 x 2^40 x 224", 413, "too_large", lambda: envi_upload(envi_header(BIG, BIG, 224), SMALL_ENVI_DATA)),
    post("envi: product overflows u64", 413, "too_large", lambda: envi_upload(envi_header(1 << 32, 1 << 32, 1 << 10), SMALL_ENVI_DATA)),
    post("envi: dimension past i64", 400, "invalid_header", lambda: envi_upload(envi_header(samples=9223372036854775808), SMALL_ENVI_DATA)),
    post("envi: negative dimension", 400, "invalid_header", lambda: envi_upload(envi_header(lines=-3), SMALL_ENVI_DATA)),
    post("envi: zero-sized axis", 400, "invalid_header", lambda: envi_upload(envi_header(bands=0), SMALL_ENVI_DATA)),
    post("envi: dimension not a number", 400, "invalid_header", lambda: envi_upload(envi_header(samples="4x"), SMALL_ENVI_DATA)),
    post("envi: header offset past the end", 400, "size_mismatch", lambda: envi_upload(envi_header(offset=1 << 20), SMALL_ENVI_DATA)),
    post("envi: header offset near i64 max", 413, "too_large", lambda: envi_upload(envi_header(offset=9223372036854775807), SMALL_ENVI_DATA)),
    post("envi: negative header offset", 400, "invalid_header", lambda: envi_upload(envi_header(offset=-48), SMALL_ENVI_DATA)),
    post("envi: data shorter than the header says", 400, "size_mismatch", lambda: envi_upload(envi_header(), SMALL_ENVI_DATA[:-1])),
    post("envi: data longer than the header says", 400, "size_mismatch", lambda: envi_upload(envi_header(), SMALL_ENVI_DATA + b"\0\0")),
    post("envi: empty data part", 400, "size_mismatch", lambda: envi_upload(envi_header(), b"")),
    post("envi: 10 MB header", 413, "too_large", lambda: envi_upload(envi_header(extra="description = {" + "x" * (10 << 20) + "}\n"), SMALL_ENVI_DATA)),
    post("envi: binary garbage in the header", 400, "invalid_header", lambda: envi_upload(envi_header().encode() + b"\xff\xfe\x00\x81\n", SMALL_ENVI_DATA)),
    post("envi: non-UTF-8 dimension", 400, "invalid_header", lambda: envi_upload(envi_header().encode().replace(b"samples = 4", b"samples = 4\xe9"), SMALL_ENVI_DATA)),
    post("envi: complex data type 6", 422, "unsupported", lambda: envi_upload(envi_header(dtype=6), SMALL_ENVI_DATA)),
    post("envi: complex data type 9", 422, "unsupported", lambda: envi_upload(envi_header(dtype=9), SMALL_ENVI_DATA)),
    post("envi: unknown data type", 400, "invalid_header", lambda: envi_upload(envi_header(dtype=99), SMALL_ENVI_DATA)),
    post("envi: no ENVI magic", 400, "invalid_header", lambda: envi_upload(envi_header(magic="NOT ENVI"), SMALL_ENVI_DATA)),
    post("envi: empty header", 400, "invalid_header", lambda: envi_upload("", SMALL_ENVI_DATA)),
    post("envi: interleave missing", 400, "invalid_header", lambda: envi_upload(envi_header(interleave=None), SMALL_ENVI_DATA)),
    post("envi: unknown interleave", 400, "invalid_header", lambda: envi_upload(envi_header(interleave="bsx"), SMALL_ENVI_DATA)),
    post("envi: byte order 2", 400, "invalid_header", lambda: envi_upload(envi_header(byte_order=2), SMALL_ENVI_DATA)),
    post("envi: compressed", 422, "unsupported", lambda: envi_upload(envi_header(extra="file compression = 1\n"), SMALL_ENVI_DATA)),
    post("envi: bbl of the wrong length", 400, "invalid_header", lambda: envi_upload(envi_header(extra="bbl = {1, 1, 1}\n"), SMALL_ENVI_DATA)),
    post("envi: samples given twice", 400, "invalid_header", lambda: envi_upload(envi_header(extra="samples = 5\n"), SMALL_ENVI_DATA)),
    post("envi: unterminated brace", 400, "invalid_header", lambda: envi_upload(envi_header(extra="description = {never closed\n"), SMALL_ENVI_DATA)),
    # --- multipart structure
    post("multipart: header part missing", 400, "invalid_multipart", lambda: multipart([part("data", SMALL_ENVI_DATA)])),
    post("multipart: data part missing", 400, "invalid_multipart", lambda: multipart([part("header", envi_header())])),
    post("multipart: header part twice", 400, "invalid_multipart", lambda: multipart([part("header", envi_header()), part("header", envi_header()), part("data", SMALL_ENVI_DATA)])),
    post("multipart: data part twice", 400, "invalid_multipart", lambda: multipart([part("header", envi_header()), part("data", SMALL_ENVI_DATA), part("data", SMALL_ENVI_DATA)])),
    post("multipart: unknown part", 400, "invalid_multipart", lambda: envi_upload(envi_header(), SMALL_ENVI_DATA, [part("colour", "red")])),
    post("multipart: part without a name", 400, "invalid_multipart", lambda: multipart([part(None, envi_header()), part("data", SMALL_ENVI_DATA)])),
    post("multipart: no parts", 400, "invalid_multipart", lambda: multipart([])),
    post("multipart: no boundary in the content type", 400, "invalid_multipart",
         lambda: {"data": envi_upload(envi_header(), SMALL_ENVI_DATA)["data"], "headers": {"Content-Type": "multipart/form-data"}}),
    post("multipart: another boundary than the body's", 400, "invalid_multipart",
         lambda: {"data": envi_upload(envi_header(), SMALL_ENVI_DATA)["data"], "headers": {"Content-Type": "multipart/form-data; boundary=elsewhere"}}),
    post("multipart: garbage body", 400, "invalid_multipart",
         lambda: {"data": b"\x00\x01 this is not multipart \xff" * 50, "headers": {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}}),
    post("multipart: body cut before the closing boundary", 400, "incomplete_body",
         lambda: multipart([part("header", envi_header()), part("data", SMALL_ENVI_DATA)], close=False)),
    post("multipart: params part not JSON", 422, "invalid_params", lambda: envi_upload(envi_header(), SMALL_ENVI_DATA, [part("params", "{components: 3")])),
    post("multipart: params part and query both", 422, "invalid_params",
         lambda: envi_upload(envi_header(), SMALL_ENVI_DATA, [part("params", '{"components": 1}')]), path="/v1/jobs?components=1"),
    # --- .npy bodies
    npy_case("npy: complex64", 422, "unsupported", lambda: npy_raw("<c8", "(3, 4, 2)", 3 * 4 * 2 * 8)),
    npy_case("npy: complex128 from numpy", 422, "unsupported", lambda: npy_of(np.zeros((3, 4, 2), dtype=np.complex128))),
    npy_case("npy: object dtype", 422, "unsupported", lambda: npy_raw("|O", "(3, 4, 2)", 3 * 4 * 2 * 8)),
    npy_case("npy: unicode strings", 422, "unsupported", lambda: npy_of(np.full((2, 2, 2), "ab"))),
    npy_case("npy: structured dtype", 422, "unsupported", lambda: npy_of(np.zeros((2, 2, 2), dtype=[("a", "<i4"), ("b", "<f4")]))),
    npy_case("npy: float16", 422, "unsupported", lambda: npy_of(np.zeros((2, 2, 2), dtype=np.float16))),
    npy_case("npy: bool", 422, "unsupported", lambda: npy_of(np.zeros((2, 2, 2), dtype=bool))),
    npy_case("npy: 1-D array", 400, "invalid_npy", lambda: npy_of(np.zeros(24, dtype=np.float32))),
    npy_case("npy: 2-D array", 400, "invalid_npy", lambda: npy_of(np.zeros((4, 6), dtype=np.float32))),
    npy_case("npy: 4-D array", 400, "invalid_npy", lambda: npy_of(np.zeros((2, 3, 2, 2), dtype=np.float32))),
    npy_case("npy: 0-D array", 400, "invalid_npy", lambda: npy_of(np.float32(1.0).reshape(()))),
    npy_case("npy: zero-sized axis", 400, "invalid_npy", lambda: npy_of(np.zeros((0, 4, 5), dtype=np.float32))),
    npy_case("npy: 2^40 x 2^40 x 224", 413, "too_large", lambda: npy_raw("<f4", f"({BIG}, {BIG}, 224)", 64)),
    npy_case("npy: shape product overflows", 413, "too_large", lambda: npy_raw("<f8", "(18446744073709551615, 2, 2)", 64)),
    npy_case("npy: dimension past u64", 400, "invalid_npy", lambda: npy_raw("<f4", "(18446744073709551616, 2, 2)", 64)),
    npy_case("npy: negative dimension", 400, "invalid_npy", lambda: npy_raw("<f4", "(-3, 2, 2)", 48)),
    npy_case("npy: body shorter than the shape", 400, "size_mismatch", lambda: npy_raw("<f4", "(3, 4, 2)", 95)),
    npy_case("npy: body longer than the shape", 400, "size_mismatch", lambda: npy_raw("<f4", "(3, 4, 2)", 97)),
    npy_case("npy: bad magic", 400, "invalid_npy", lambda: b"PK\x03\x04" + SMALL[4:]),
    npy_case("npy: version 9.0", 422, "unsupported", lambda: SMALL[:6] + b"\x09\x00" + SMALL[8:]),
    npy_case("npy: header length past the end", 400, "invalid_npy", lambda: npy_raw("<f4", "(3, 4, 2)", 0, header_len=60000)),
    npy_case("npy: header of 4 GiB claimed (v2)", 400, "invalid_npy", lambda: npy_raw("<f4", "(3, 4, 2)", 96, version=2, header_len=0xFFFFFFFF)),
    npy_case("npy: empty body", 400, "invalid_npy", lambda: b""),
    npy_case("npy: version 3.0 header not UTF-8", 400, "invalid_npy", lambda: npy_raw("<f4", "(3, 4, 2)", 96, version=3).replace(b"'descr'", b"'d\xe9scr'")),
    npy_case("npy: fortran_order not a bool", 400, "invalid_npy", lambda: npy_raw("<f4", "(3, 4, 2)", 96, fortran="'yes'")),
    npy_case("npy: X-Content-SHA256 not hex", 400, "invalid_digest", lambda: SMALL, headers={"X-Content-SHA256": "z" * 64}),
    npy_case("npy: X-Content-SHA256 of other bytes", 400, "digest_mismatch", lambda: SMALL, headers={"X-Content-SHA256": "0" * 64}),
    npy_case("npy: X-Cube-Digest not hex", 400, "invalid_digest", lambda: SMALL, headers={"X-Cube-Digest": "g" * 64}),
    npy_case("npy: X-Cube-Digest too short", 400, "invalid_digest", lambda: SMALL, headers={"X-Cube-Digest": "0" * 63}),
    npy_case("npy: X-Cube-Digest of another cube", 400, "digest_mismatch", lambda: SMALL, headers={"X-Cube-Digest": "0" * 64}),
    # --- content types and JSON bodies
    post("content type text/plain", 415, "unsupported_media_type", lambda: {"data": SMALL, "headers": {"Content-Type": "text/plain"}}),
    post("no content type", 415, "unsupported_media_type", lambda: {"data": SMALL}),
    post("content type image/png", 415, "unsupported_media_type", lambda: {"data": SMALL, "headers": {"Content-Type": "image/png"}}),
    post("json: not JSON", 400, "invalid_json", lambda: {"data": b"{not json", "headers": {"Content-Type": "application/json"}}),
    post("json: unknown member", 400, "invalid_json", lambda: {"data": b'{"input": {"href": "file:///x.npy"}, "colour": 1}', "headers": {"Content-Type": "application/json"}}),
    post("json: a .npy body sent as JSON", 400, "invalid_json", lambda: {"data": SMALL, "headers": {"Content-Type": "application/json"}}),
    post("json: body over 1 MiB", 413, "too_large", lambda: {"data": b'{"input": {"href": "' + b"a" * (2 << 20) + b'"}}', "headers": {"Content-Type": "application/json"}}),
    post("href: not a file URL", 400, "invalid_href", lambda: href("http://169.254.169.254/latest/meta-data")),
    post("href: relative path", 400, "invalid_href", lambda: href("file://etc/passwd")),
    post("href: with ..", 400, "invalid_href", lambda: href(f"file://{DATA}/../../../etc/passwd")),
    post("href: percent-encoded ..", 400, "invalid_href", lambda: href(f"file://{DATA}/%2E%2E/%2E%2E/etc/passwd")),
    post("href: outside the input root", 403, "forbidden_path", lambda: href("file:///etc/passwd")),
    post("href: missing file", 400, "input_not_found", lambda: href(f"file://{DATA}/no-such-cube.npy")),
    post("href: a directory", 400, "input_not_found", lambda: href(f"file://{DATA}")),
    post("href: not a cube file", 422, "unsupported", lambda: href(f"file://{DATA}/README.md")),
    # --- parameters
    param_case("components=0", "components=0"),
    param_case("components=-1", "components=-1"),
    param_case("components=1e9", "components=1e9"),
    param_case("components=10^9", "components=1000000000"),
    param_case("components past u64", "components=18446744073709551616"),
    param_case("snr=NaN", "snr=NaN"),
    param_case("snr=inf", "snr=inf"),
    param_case("snr=-1", "snr=-1"),
    param_case("components and snr", "components=2&snr=1"),
    param_case("noise window outside", "noise_window=0,0,100,100"),
    param_case("noise window inverted", "noise_window=5,5,1,1"),
    param_case("noise window empty", "noise_window=2,2,2,2"),
    param_case("noise window of 3 numbers", "noise_window=1,2,3"),
    param_case("noise window negative", "noise_window=-1,0,4,4"),
    param_case("bad band out of range", "bad_bands=5"),
    param_case("bad band far out of range", "bad_bands=0,1,99999999999"),
    param_case("bad band negative", "bad_bands=-1"),
    param_case("unknown parameter", "colour=red"),
    param_case("parameter given twice", "components=1&components=2"),
    param_case("unknown noise estimator", "noise=median"),
    param_case("unknown backend", "backend=tpu"),
    param_case("inverse=maybe", "inverse=maybe"),
    param_case("ignore_value=inf", "ignore_value=inf"),
    # --- requests that could only fail as jobs are refused at submit, with the job's codes
    param_case("every band a bad band", "bad_bands=0,1,2,3,4"),
    npy_case("params: a noise window of 4 residuals for 5 bands", 422, "degenerate_input", lambda: SMALL, "noise_window=0,0,3,3"),
    npy_case("params: backend=cuda on a server without a GPU", 422, "backend_unavailable", lambda: SMALL, "backend=cuda"),
    param_case("NUL in a name", "components%00=1"),
    # --- job ids and routes
    Case("job id not a UUID", "GET", "/v1/jobs/not-a-uuid", dict, 404, "not_found"),
    Case("job id path traversal (encoded)", "GET", "/v1/jobs/..%2F..%2F..%2Fetc%2Fpasswd", dict, 404, "not_found"),
    Case("job id path traversal in result", "GET", "/v1/jobs/..%2F..%2Fhypermnf.db/result", dict, 404, "not_found"),
    Case("job id with a NUL", "GET", "/v1/jobs/%00", dict, 404, "not_found"),
    Case("job id of 10 000 characters", "GET", "/v1/jobs/" + "a" * 10000, dict, 404, "not_found"),
    Case("unknown job (a UUID)", "GET", f"/v1/jobs/{uuid.uuid4()}", dict, 404, "not_found"),
    Case("result of an unknown job", "GET", f"/v1/jobs/{uuid.uuid4()}/result", dict, 404, "not_found"),
    Case("metadata of an unknown job", "GET", f"/v1/jobs/{uuid.uuid4()}/metadata", dict, 404, "not_found"),
    Case("delete a job id not a UUID", "DELETE", "/v1/jobs/../../etc", dict, 404, "not_found"),
    Case("delete an unknown job", "DELETE", f"/v1/jobs/{uuid.uuid4()}", dict, 404, "not_found"),
    Case("list: limit=0", "GET", "/v1/jobs?limit=0", dict, 400, "invalid_query"),
    Case("list: unknown status", "GET", "/v1/jobs?status=exploded", dict, 400, "invalid_query"),
    Case("list: limit past 1000", "GET", "/v1/jobs?limit=100000", dict, 400, "invalid_query"),
    Case("list: after not a job id", "GET", "/v1/jobs?after=../../x", dict, 400, "invalid_query"),
    Case("list: unknown parameter", "GET", "/v1/jobs?owner=alice", dict, 400, "invalid_query"),
    Case("unknown route", "GET", "/v1/../admin", dict, 404, "not_found"),
    Case("wrong method", "PUT", "/v1/jobs", dict, 405, "method_not_allowed"),
    # --- the upload limit
    npy_case("npy over --max-upload-bytes (Content-Length)", 413, "too_large", lambda: npy_of(np.zeros((64, 64, 600), dtype=np.float64))),
    post("multipart over --max-upload-bytes", 413, "too_large", lambda: envi_upload(envi_header(512, 512, 40), bytes(512 * 512 * 40 * 2))),
    npy_case("npy header claiming more than the limit", 413, "too_large", lambda: npy_raw("<f8", "(1024, 1024, 64)", 64)),
]


def send(server: Server, case: Case) -> requests.Response:
    return server.call(case.method, case.path, **case.kwargs())


def assert_problem(r: requests.Response, status: int, code: str) -> None:
    assert r.headers.get("Content-Type", "").startswith("application/json"), (r.status_code, r.headers, r.text[:300])
    body = r.json()
    assert isinstance(body.get("code"), str) and isinstance(body.get("message"), str) and body["message"], body
    assert (r.status_code, body["code"]) == (status, code), f"answered {r.status_code} {body}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_refused_with_a_problem(server: Server, case: Case):
    r = send(server, case)
    assert_problem(r, case.status, case.code)
    assert server.healthy(), "the server is not healthy after the request"


def test_corpus_is_large_enough():
    assert len(CASES) >= 50


def test_chunked_upload_over_the_limit(server: Server):
    """A body without Content-Length, streamed past the limit: refused while it streams."""
    chunk = bytes(1 << 20)
    header = npy_raw("<f8", "(2048, 2048, 1)", 0)  # claims 32 MiB: refused from the header alone

    def body():
        yield header
        for _ in range(40):
            yield chunk

    r = server.call("POST", "/v1/jobs", data=body(), headers={"Content-Type": "application/x-npy"})
    assert_problem(r, 413, "too_large")

    def envi_body():
        data = multipart([part("header", envi_header(2048, 2048, 1, dtype=5)), part("data", b"")])["data"]
        head, tail = data.split(b"\r\n--" + BOUNDARY.encode() + b"--")[0], b"\r\n--" + BOUNDARY.encode() + b"--\r\n"
        yield head
        for _ in range(40):
            yield chunk
        yield tail

    r = server.call("POST", "/v1/jobs", data=envi_body(), headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"})
    assert_problem(r, 413, "too_large")
    assert server.healthy()


def test_raw_path_traversal(server: Server):
    """Paths with literal `..` segments, sent as written (a client library would normalise them)."""
    u = urlsplit(server.url)
    for path in ["/v1/jobs/../../etc/passwd", "/v1/jobs/%2e%2e/%2e%2e/etc/passwd", "/v1/jobs/..\\..\\windows"]:
        with socket.create_connection((u.hostname, u.port), timeout=30) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            raw = b""
            while chunk := s.recv(65536):
                raw += chunk
        status = int(raw.split(b" ", 2)[1])
        RECORDER.answers += 1
        if status >= 500:
            RECORDER.server_errors.append(f"GET {path} -> {status}")
        assert status in (400, 404), raw[:300]
        assert b'"code"' in raw, raw[:300]
    assert server.healthy()


def test_garbage_on_the_socket(server: Server):
    """Not HTTP at all, and a request line with no end: the connection is closed, the server lives."""
    u = urlsplit(server.url)
    for payload in [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(200), b"GET /" + b"a" * 100000, b"\r\n\r\n\r\n"]:
        with socket.create_connection((u.hostname, u.port), timeout=30) as s:
            try:
                s.sendall(payload)
                s.shutdown(socket.SHUT_WR)
                while s.recv(65536):
                    pass
            except (ConnectionResetError, BrokenPipeError):
                pass
    assert server.healthy()


# ---------------------------------------------------------------------------------------------------
# Valid but odd cubes: accepted, and the job ends (succeeded, or failed with a reason), never stuck


def wait_done(server: Server, job_id: str, timeout_s: float = 180.0) -> Dict:
    deadline = time.monotonic() + timeout_s
    while True:
        r = server.call("GET", f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        job = r.json()
        if job["status"] in ("succeeded", "failed", "canceled"):
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['status']} after {timeout_s} s"
        time.sleep(0.2)


def one_band_nan() -> np.ndarray:
    a = RNG.normal(size=(10, 11, 4)).astype(np.float32)
    a[3, 4, 2] = np.nan
    return a


# Cubes that are valid input but odd, and how their job must end: succeeded, or failed with this
# code and a message that names the actual reason.
EDGE_CUBES = {
    "1x1x1": (np.ones((1, 1, 1), dtype=np.float32), "degenerate_input", "has 1 pixel"),
    "1x1x5": (RNG.normal(size=(1, 1, 5)).astype(np.float32), "degenerate_input", "has 1 pixel"),
    "1x40x3 (one line)": (RNG.normal(size=(1, 40, 3)).astype(np.float32), "degenerate_input", "3 × 3 neighbourhoods"),
    "2x2x2": (RNG.normal(size=(2, 2, 2)).astype(np.float32), "degenerate_input", "3 × 3 neighbourhoods"),
    "constant": (np.full((6, 7, 4), 42, dtype=np.int16), "degenerate_input", "every band is constant"),
    "constant but one band": (np.concatenate([np.full((6, 7, 3), 7.0), RNG.normal(size=(6, 7, 1))], axis=2).astype(np.float32), None, None),
    # NaN and ±Inf are no-data in float cubes: left out, as an ignore value would be.
    "NaN everywhere": (np.full((6, 7, 4), np.nan, dtype=np.float32), "degenerate_input", "only 0 valid pixel"),
    "Inf here and there": (np.where(RNG.random((20, 21, 4)) < 0.01, np.inf, RNG.normal(size=(20, 21, 4))).astype(np.float32), None, None),
    "one NaN sample": (one_band_nan(), None, None),
    # 10 x 10 pixels cannot estimate 425 bands' covariances: refused at submit, saying so.
    "too few pixels for the bands": (RNG.normal(size=(10, 10, 425)).astype(np.float32), "degenerate_input", "too few pixels for the number of bands"),
    "values whose squares overflow (f64 1e300)": ((RNG.normal(size=(6, 7, 4)) * 1e300).astype(np.float64), "degenerate_input", "too large to square"),
    # Near 2^64 float64 cannot tell these apart (its spacing there is 4096): constant once widened.
    "u64 near the top": (np.uint64(2**64 - 1) - RNG.integers(0, 1000, size=(6, 7, 4)).astype(np.uint64), "degenerate_input", "constant"),
    "big-endian f8": (RNG.normal(size=(6, 7, 4)).astype(">f8"), None, None),
    "fortran order": (np.asfortranarray(RNG.normal(size=(6, 7, 4)).astype(np.float32)), None, None),
}


@pytest.mark.parametrize("name", list(EDGE_CUBES))
def test_odd_cubes_end_cleanly(server: Server, name: str):
    cube, code, reason = EDGE_CUBES[name]
    r = server.call("POST", "/v1/jobs", data=npy_of(cube), headers={"Content-Type": "application/x-npy"})
    if r.status_code == 422:
        # What the shape alone dooms is refused at submit, with the code the job would have failed with.
        assert code is not None, r.text
        assert r.json()["code"] == code and reason in r.json()["message"], r.text
        assert server.healthy()
        return
    assert r.status_code in (200, 202), r.text
    job = wait_done(server, r.json()["id"])
    print(f"{name}: {job['status']} {job['error']}")
    if code is None:
        assert job["status"] == "succeeded", job
        assert server.call("GET", f"/v1/jobs/{job['id']}/metadata").status_code == 200
    else:
        assert job["status"] == "failed", job
        assert job["error"]["code"] == code and reason in job["error"]["message"], job["error"]
    assert server.healthy()


def test_latin1_header_is_read_as_the_reader_reads_it(server: Server):
    """A Latin-1 description (not UTF-8) does not make a header unacceptable: the service reads header
    text lossily, as the ENVI reader (and so the command line) does."""
    data = RNG.normal(size=(6, 7, 3)).astype("<f4").tobytes()
    header = envi_header(samples=7, lines=6, bands=3, dtype=4).encode() + b"description = {Caf\xe9 de la Pr\xe9fecture}\n"
    r = server.call("POST", "/v1/jobs", **envi_upload(header, data))
    assert r.status_code == 202, r.text
    assert wait_done(server, r.json()["id"])["status"] == "succeeded"


def test_downloads_of_a_job_without_a_result(server: Server):
    """A failed job's result and metadata, bad download queries, and deleting it twice."""
    # A constant cube: accepted (its shape allows an MNF) and failed by the job (every band constant).
    r = server.call("POST", "/v1/jobs", data=npy_of(np.full((6, 7, 4), 3, dtype=np.int16)), headers={"Content-Type": "application/x-npy"})
    assert r.status_code in (200, 202), r.text
    job = wait_done(server, r.json()["id"])
    assert job["status"] == "failed"
    base = f"/v1/jobs/{job['id']}"
    assert_problem(server.call("GET", base + "/result"), 409, "no_result")
    assert_problem(server.call("GET", base + "/metadata"), 409, "no_result")
    assert_problem(server.call("GET", base + "/result?format=zip"), 400, "invalid_query")
    assert_problem(server.call("GET", base + "/result?product=../../etc"), 400, "invalid_query")
    assert server.call("DELETE", base).status_code == 204
    assert_problem(server.call("DELETE", base), 404, "not_found")
    assert_problem(server.call("GET", base), 404, "not_found")
    assert server.healthy()


def test_all_no_data(server: Server):
    """Every pixel holds the ignore value: the job fails with a reason (or is refused), never 5xx."""
    a = np.full((6, 7, 4), -9999, dtype=np.int16)
    r = server.call("POST", "/v1/jobs?ignore_value=-9999", data=npy_of(a), headers={"Content-Type": "application/x-npy"})
    if r.status_code >= 400:
        assert 400 <= r.status_code < 500 and r.json()["code"], r.text
        return
    job = wait_done(server, r.json()["id"])
    assert job["status"] == "failed" and job["error"]["code"] not in (None, "internal"), job
    # Through the header's `data ignore value` too.
    data = np.full((3, 4, 2), -9999, dtype=np.int16).tobytes()
    r = server.call("POST", "/v1/jobs", **envi_upload(envi_header(extra="data ignore value = -9999\n"), data))
    if r.status_code < 400:
        job = wait_done(server, r.json()["id"])
        assert job["status"] == "failed" and job["error"]["code"] not in (None, "internal"), job
    else:
        assert 400 <= r.status_code < 500 and r.json()["code"], r.text


def test_all_bands_bad(server: Server):
    a = RNG.normal(size=(6, 7, 3)).astype(np.float32)
    r = server.call("POST", "/v1/jobs?bad_bands=0,1,2", data=npy_of(a), headers={"Content-Type": "application/x-npy"})
    if r.status_code >= 400:
        assert 400 <= r.status_code < 500 and r.json()["code"], r.text
        return
    job = wait_done(server, r.json()["id"])
    assert job["status"] == "failed" and job["error"]["code"] not in (None, "internal"), job


# ---------------------------------------------------------------------------------------------------
# The summary: zero 5xx, zero panics, zero hangs over every request of the run


def test_summary_no_5xx_no_panics_no_hangs(server: Server):
    """Over every test of this directory (conftest runs this one last)."""
    panics = sum(s.panics() for s in SERVERS)
    print(
        f"\nhostile corpus: {len(CASES)} refusal cases; over all {RECORDER.answers} answers of the run: "
        f"5xx: {len(RECORDER.server_errors)}, panics in the server log: {panics}, hangs: {len(RECORDER.hangs)}"
    )
    assert RECORDER.answers > 0
    assert RECORDER.server_errors == []
    assert RECORDER.hangs == []
    assert panics == 0, "\n".join(line for s in SERVERS for line in s.log_text().splitlines() if "panicked" in line)
