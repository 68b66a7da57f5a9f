"""Failures surface as this package's exceptions with the server's code and message."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np
import pytest

import hypermnf
from conftest import API_KEYS, CUBES, Server, free_port
from test_jobs import textured_cube

CUBE = textured_cube(24, 20, 10, seed=7)


# Each case twice: for the 24 × 20 × 10 array (query string) and for the 150 × 150 × 188 ENVI cube on the
# server's disk (JSON).
BAD_PARAMS = [
    ({"components": 0}, {"components": 0}),
    ({"components": 11}, {"components": 189}),  # more than the bands
    ({"noise": "gaussian"}, {"noise": "gaussian"}),
    ({"components": 3, "bad_bands": [10]}, {"components": 3, "bad_bands": [188]}),  # out of range
    ({"components": 3, "noise_window": (5, 5, 5, 9)}, {"components": 3, "noise_window": (5, 5, 5, 9)}),  # empty
    ({"components": 3, "noise_window": (0, 0, 21, 10)}, {"components": 3, "noise_window": (0, 0, 151, 10)}),  # past the samples
    ({"snr": -1.0}, {"snr": -1.0}),
    ({"components": 3, "backend": "quantum"}, {"components": 3, "backend": "quantum"}),
    ({"components": 3, "snr": 1.0}, {"components": 3, "snr": 1.0}),  # exclusive
]


@pytest.mark.parametrize("form", ["array", "json"])
@pytest.mark.parametrize("cases", BAD_PARAMS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c[0].items()))
def test_bad_parameters_are_api_errors(client: hypermnf.Client, cases: tuple, form: str) -> None:
    if form == "array":
        cube, params = CUBE, cases[0]
    else:
        cube, params = next(c for c in CUBES if c.stem.startswith("abu")).resolve().as_uri(), cases[1]
    with pytest.raises(hypermnf.APIError) as info:
        client.submit(cube, **params)
    error = info.value
    assert error.status == 422, error
    assert error.code == "invalid_params", error
    assert error.message
    assert error.message in str(error) and str(error.status) in str(error)


def test_garbage_npy_body_is_an_api_error(client: hypermnf.Client) -> None:
    with pytest.raises(hypermnf.APIError) as info:
        client._request("POST", "/v1/jobs", expect=(202,), content=b"\x93NUMPY nonsense",
                        headers={"Content-Type": "application/x-npy"})
    assert info.value.status in (400, 422)


def test_href_outside_the_input_roots_is_refused(client: hypermnf.Client, tmp_path: Path) -> None:
    outside = tmp_path / "x.hdr"
    outside.write_text(CUBES[0].read_text())
    with pytest.raises(hypermnf.APIError) as info:
        client.submit(outside.as_uri())
    assert info.value.status in (400, 403, 404, 422)
    with pytest.raises(hypermnf.APIError):
        client.submit((CUBES[0].parent / ".." / ".." / "Cargo.toml").as_uri())


def test_local_argument_errors_need_no_server() -> None:
    client = hypermnf.Client("http://127.0.0.1:9")
    with pytest.raises(TypeError):
        client.submit([[1, 2], [3, 4]])
    with pytest.raises(ValueError):
        client.submit(np.ones((4, 4), dtype=np.int16))
    with pytest.raises(TypeError):
        client.submit(np.array([["a"]], dtype=object).reshape(1, 1, 1))
    with pytest.raises(FileNotFoundError):
        client.submit("/no/such/cube.hdr")
    with pytest.raises(ValueError):
        client.submit("s3://bucket/cube.hdr")
    with pytest.raises(ValueError, match="with its .hdr beside it"):
        client.submit(Path(__file__))  # neither a header, nor a data file with one beside it, nor a .npy
    with pytest.raises(ValueError):
        client.submit(CUBE, noise_window=(1, 2, 3))
    with pytest.raises(TypeError):
        client.submit(CUBE, components="ten")
    with pytest.raises(ValueError):
        client.submit(CUBE, snr=float("nan"))
    with pytest.raises(TypeError):
        client.submit(CUBE, ignore_value="none")
    with pytest.raises(ValueError):
        client.job("../healthz")
    with pytest.raises(ValueError):
        hypermnf.Client("localhost:8080")


def test_envi_header_without_data_file(tmp_path: Path) -> None:
    lonely = tmp_path / "lonely.hdr"
    lonely.write_text(CUBES[0].read_text())
    with pytest.raises(FileNotFoundError, match="no ENVI data file"):
        hypermnf.Client("http://127.0.0.1:9").submit(lonely)


def test_server_down_is_a_clear_connection_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = hypermnf.Client(url, timeout=5)
    for call in (client.health, client.info, client.jobs, lambda: client.job("x"), lambda: client.submit(CUBE)):
        with pytest.raises(hypermnf.ConnectionError) as info:
            call()
        assert str(info.value).startswith(f"cannot reach hypermnf at {url}: ")
        assert isinstance(info.value, hypermnf.HyperMNFError) and isinstance(info.value, ConnectionError)
        assert info.value.__suppress_context__, "no chained traceback from the HTTP library"


def test_server_that_does_not_answer_is_a_timeout() -> None:
    # A socket that accepts connections (backlog) but never answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        client = hypermnf.Client(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.5)
        with pytest.raises(hypermnf.TimeoutError, match="did not answer"):
            client.info()


def test_api_keys(keyed_server: Server) -> None:
    with keyed_server.client() as anonymous:
        with pytest.raises(hypermnf.APIError) as info:
            anonymous.jobs()
        assert info.value.status == 401 and info.value.code
        assert anonymous.health(), "/healthz needs no key"
    with keyed_server.client(api_key="wrong-key") as wrong:
        with pytest.raises(hypermnf.APIError) as info:
            wrong.submit(CUBE, components=2)
        assert info.value.status == 401
    with keyed_server.client(api_key=API_KEYS["alice"]) as alice, keyed_server.client(api_key=API_KEYS["bob"]) as bob:
        job = alice.submit(CUBE, components=2).wait(timeout=120, progress=False)
        assert job.result().shape == (24, 20, 2)
        assert job.id in {j.id for j in alice.jobs()}
        assert job.id not in {j.id for j in bob.jobs()}
        with pytest.raises(hypermnf.APIError) as info:
            bob.job(job.id)
        assert info.value.status == 404, "another key's job is not even shown to exist"
        # The same cube and parameters from bob is bob's own job, not a cache hit on alice's.
        theirs = bob.submit(CUBE, components=2)
        assert theirs.id != job.id


def test_api_key_from_the_environment(keyed_server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERMNF_URL", keyed_server.url)
    monkeypatch.setenv("HYPERMNF_API_KEY", API_KEYS["bob"])
    with hypermnf.Client() as client:
        assert client.url == keyed_server.url
        assert isinstance(client.jobs(), list)


def _flaky_server(drops: int, body: bytes) -> "_RawServer":
    """Closes the first `drops` connections without answering, then answers every request with `body`."""
    ok = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
          b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return _RawServer([b""] * drops + [ok])


def test_a_get_that_meets_a_closed_connection_is_sent_again() -> None:
    flaky = _flaky_server(drops=1, body=b'{"version": "x"}')
    assert hypermnf.Client(flaky.url, timeout=5).info() == {"version": "x"}
    assert flaky.requests == ["GET /v1/info HTTP/1.1"] * 2
    flaky = _flaky_server(drops=2, body=b"{}")
    with pytest.raises(hypermnf.ConnectionError, match="cannot reach hypermnf"):
        hypermnf.Client(flaky.url, timeout=5).info()
    assert len(flaky.requests) == 2, "sent twice at most"


def test_a_cancel_is_never_sent_twice() -> None:
    # A DELETE repeated after a cancel that did reach the server would delete the job.
    flaky = _flaky_server(drops=1, body=b"")
    job = hypermnf.Job(hypermnf.Client(flaky.url, timeout=5), {"id": "j1", "status": "running"})
    with pytest.raises(hypermnf.ConnectionError):
        job.cancel()
    assert flaky.requests == ["DELETE /v1/jobs/j1 HTTP/1.1"]


def test_a_submission_that_meets_a_closed_connection_is_sent_again() -> None:
    flaky = _flaky_server(drops=1, body=b'{"id": "j2", "status": "queued", "cached": true}')
    job = hypermnf.Client(flaky.url, timeout=5).submit(CUBE, components=2)
    assert job.id == "j2" and job.cached
    assert [r.split("?")[0] for r in flaky.requests] == ["POST /v1/jobs"] * 2


class _RawServer:
    """Answers the n-th connection with the n-th of ``answers`` (raw HTTP bytes; b"": close without
    answering; the last repeats), then closes it, after ``hold`` seconds."""

    def __init__(self, answers: list, hold: float = 0.0) -> None:
        import threading

        self.answers, self.hold, self.requests = answers, hold, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.requests.append(conn.recv(65536).split(b"\r\n", 1)[0].decode())
                answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
                if answer:
                    conn.sendall(answer)
                time.sleep(self.hold)


def _npy_answer(body: bytes, content_length: int | None) -> bytes:
    length = b"" if content_length is None else b"Content-Length: %d\r\n" % content_length
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/x-npy\r\nConnection: close\r\n" + length + b"\r\n" + body


RESULT = np.arange(40 * 30 * 4, dtype=np.float32).reshape(40, 30, 4)


def _result_body() -> bytes:
    import io

    saved = io.BytesIO()
    np.save(saved, RESULT)
    return saved.getvalue()


def _job_on(url: str) -> hypermnf.Job:
    return hypermnf.Job(hypermnf.Client(url, timeout=5), {"id": "j1", "status": "succeeded"})


def test_result_cut_off_is_a_connection_error_saying_how_much_arrived() -> None:
    body = _result_body()
    cut = _RawServer([_npy_answer(body[:5000], len(body))])  # the connection drops after 5000 bytes
    with pytest.raises(hypermnf.ConnectionError, match=rf"cut off after 5000 of {len(body)} bytes") as info:
        _job_on(cut.url).result()
    assert info.value.__suppress_context__
    # Without a Content-Length the end of the connection ends the body: the .npy header tells it is short.
    short = _RawServer([_npy_answer(body[:5000], None)])
    with pytest.raises(hypermnf.ConnectionError, match=rf"ended after 5000 of {len(body)} bytes"):
        _job_on(short.url).result()


def test_result_that_stalls_is_a_timeout() -> None:
    body = _result_body()
    stalled = _RawServer([_npy_answer(body[:5000], len(body))], hold=3.0)
    job = hypermnf.Job(hypermnf.Client(stalled.url, timeout=0.5), {"id": "j1", "status": "succeeded"})
    with pytest.raises(hypermnf.TimeoutError, match=rf"sent 5000 of {len(body)} bytes of the result, then nothing"):
        job.result()


def test_result_longer_or_shorter_than_announced_is_refused() -> None:
    body = _result_body()
    with pytest.raises(ValueError, match="more than"):
        _job_on(_RawServer([_npy_answer(body + b"extra", None)]).url).result()
    with pytest.raises(ValueError, match="promises"):
        _job_on(_RawServer([_npy_answer(body + b"extra", len(body) + 5)]).url).result()
    with pytest.raises(ValueError, match="not a .npy"):
        _job_on(_RawServer([_npy_answer(b"<html>oops</html>", 17)]).url).result()


def test_result_get_that_meets_a_closed_connection_is_sent_again() -> None:
    body = _result_body()
    flaky = _RawServer([b"", _npy_answer(body, len(body))])
    got = _job_on(flaky.url).result()
    np.testing.assert_array_equal(got, RESULT)
    assert flaky.requests == ["GET /v1/jobs/j1/result HTTP/1.1"] * 2
    with pytest.raises(hypermnf.ConnectionError, match="cannot reach hypermnf"):
        _job_on(_RawServer([b""]).url).result()


def test_upload_over_the_servers_limit(binary: Path, tmp_path: Path) -> None:
    from conftest import start_server, stop_server

    small = start_server(binary, tmp_path, ["--max-upload-bytes", "100000"])
    try:
        with small.client() as client:
            with pytest.raises(hypermnf.APIError) as info:
                client.submit(textured_cube(100, 100, 20, seed=8), components=2)  # 400 kB
            assert info.value.status == 413 and info.value.code == "too_large"
            with pytest.raises(hypermnf.APIError) as info:
                client.submit(CUBES[0], components=2)  # multipart: 8.5 MB
            assert info.value.status == 413
            assert client.submit(CUBE, components=2).wait(timeout=60, progress=False).result().shape == (24, 20, 2)
    finally:
        stop_server(small)
