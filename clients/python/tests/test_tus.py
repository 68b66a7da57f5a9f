"""Resumable uploads (tus 1.0, ``/v1/uploads``) against a real server of their own: cubes above the client's
``tus_threshold`` go up resumably and give the CLI's results; a connection cut mid-upload by a TCP proxy is
resumed from the server's offset; and tuspy, the tus project's own Python client, uploads to the server too.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Iterator, List

import numpy as np
import pytest

import hypermnf
from conftest import DATA, Server, assert_same, start_server, stop_server
from test_jobs import textured_cube

THRESHOLD = 4096  # bytes: every cube here is larger


@pytest.fixture(scope="module")
def tus_server(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of this module's own, so that its upload directory can be looked at and no other
    module's jobs answer these requests."""
    s = start_server(binary, tmp_path_factory.mktemp("tus"), [])
    yield s
    stop_server(s)


def uploads_left(server: Server) -> List[Path]:
    root = server.data_dir / "tus"
    return sorted(root.iterdir()) if root.exists() else []


def test_an_array_above_the_threshold_goes_up_resumably(tus_server: Server, cli, tmp_path: Path) -> None:
    cube = textured_cube(60, 50, 16, seed=21)
    with hypermnf.Client(tus_server.url, tus_threshold=THRESHOLD) as client:
        job = client.submit(cube, components=4, progress=False)
        assert client.last_upload is not None, "the cube did not go through /v1/uploads"
        assert job.cached is False
        result = job.wait(timeout=300, progress=False).result()
    assert uploads_left(tus_server) == [], "the upload is gone once its job exists"
    path = tmp_path / "cube.npy"
    np.save(path, cube)
    assert_same(result, cli(path, "--components", "4").components)
    # The same array in one request is the same cube: the job made from the upload answers.
    with hypermnf.Client(tus_server.url, tus_threshold=None) as plain:
        again = plain.submit(cube, components=4)
        assert plain.last_upload is None
    assert (again.id, again.cached) == (job.id, True)
    # And above the threshold again: asked for by its digest first, so nothing is uploaded.
    with hypermnf.Client(tus_server.url, tus_threshold=THRESHOLD) as client:
        third = client.submit(cube, components=4, progress=False)
        assert client.last_upload is None
    assert third.id == job.id


def test_an_envi_pair_and_a_npy_file_go_up_resumably(tus_server: Server, cli, tmp_path: Path) -> None:
    header = DATA / "jasper_ridge_r198_bil.hdr"
    with hypermnf.Client(tus_server.url, tus_threshold=THRESHOLD) as client:
        job = client.submit(header, components=7, backend="cpu", progress=False)
        assert client.last_upload is not None
        assert job.document["input"]["interleave"] == "bil"
        assert_same(job.wait(timeout=300, progress=False).result(), cli(header, "--components", "7").components)
        # A .npy file, big-endian as it is on disk.
        path = tmp_path / "salinas.npy"
        np.save(path, np.fromfile(DATA / "salinasA_224_bip_be.img", dtype=">i2").reshape(83, 86, 224)[:40])
        client.last_upload = None
        job = client.submit(path, components=3, progress=False)
        assert client.last_upload is not None
        assert_same(job.wait(timeout=300, progress=False).result(), cli(path, "--components", "3").components)
    assert uploads_left(tus_server) == []


class CuttingProxy:
    """A TCP proxy in front of the server that cuts the connection carrying byte ``cut_at`` of what the
    client sends (counted over all connections), once; everything else passes through. With
    ``every_patch``, it cuts every PATCH instead, a few bytes into its body."""

    def __init__(self, target: str, cut_at: int = 0, every_patch: bool = False) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.cut_at, self.every_patch, self.sent, self.cuts = cut_at, every_patch, 0, 0
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counted: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if counted and self.every_patch and b"PATCH /v1/uploads/" in data:
                    with self.lock:
                        self.cuts += 1
                    dst.sendall(data[: data.index(b"PATCH /v1/uploads/") + 1000])
                    break
                if counted and not self.every_patch:
                    with self.lock:
                        before, self.sent = self.sent, self.sent + len(data)
                        cut = self.cuts == 0 and before < self.cut_at <= self.sent
                        if cut:
                            self.cuts += 1
                    if cut:
                        dst.sendall(data[: self.cut_at - before])
                        break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()


def test_a_connection_cut_mid_upload_is_resumed(tus_server: Server, cli, tmp_path: Path) -> None:
    cube = textured_cube(160, 120, 24, seed=22)  # 921 KB as int16
    proxy = CuttingProxy(tus_server.url, cut_at=400_000)
    try:
        with hypermnf.Client(proxy.url, tus_threshold=THRESHOLD) as client:
            job = client.submit(cube, components=5, progress=False)
            assert proxy.cuts == 1, "the proxy did not cut the upload"
            assert client.last_upload is not None and client.last_upload.resumed >= 1, "the upload was not resumed"
            result = job.wait(timeout=300, progress=False).result()
    finally:
        proxy.close()
    # Resumed, not sent again: the server received about the cube once (plus requests' heads).
    assert proxy.sent < cube.nbytes + 200_000, proxy.sent
    path = tmp_path / "cube.npy"
    np.save(path, cube)
    assert_same(result, cli(path, "--components", "5").components)
    assert uploads_left(tus_server) == []


def test_retries_are_bounded(tus_server: Server) -> None:
    cube = textured_cube(40, 40, 16, seed=23)
    # Every PATCH cut: the upload gives up after its retries (each one resumed from the server's offset).
    proxy = CuttingProxy(tus_server.url, every_patch=True)
    try:
        with hypermnf.Client(proxy.url, tus_threshold=THRESHOLD, tus_retries=2) as client:
            with pytest.raises(hypermnf.ConnectionError, match="failed 3 times in a row"):
                client.submit(cube, components=3, progress=False)
            assert client.last_upload is not None and client.last_upload.resumed == 2
    finally:
        proxy.close()
    assert proxy.cuts == 3


def test_tuspy_uploads_to_the_server(tus_server: Server, cli, tmp_path: Path) -> None:
    tusclient = pytest.importorskip("tusclient.client")
    path = tmp_path / "tuspy.npy"
    cube = textured_cube(140, 80, 16, seed=24)  # 358 KB
    np.save(path, cube)
    size = path.stat().st_size
    client = tusclient.TusClient(tus_server.url + "/v1/uploads")
    # Part of it, in chunks of 32 KiB; then a new uploader resumes the same URL (its HEAD) to the end.
    first = client.uploader(file_path=str(path), chunk_size=32 << 10, metadata={"filename": path.name})
    first.upload(stop_at=100_000)
    assert 100_000 <= first.offset < size
    resumed = client.uploader(file_path=str(path), chunk_size=32 << 10, url=first.url)
    assert resumed.offset == first.offset, "tuspy's HEAD read another offset"
    resumed.upload()
    assert resumed.offset == size
    upload_id = first.url.rstrip("/").rsplit("/", 1)[-1]
    with hypermnf.Client(tus_server.url) as ours:
        response = ours._request("POST", "/v1/jobs", expect=(202,), json={"upload": upload_id, "params": {"components": 3}})
        job = hypermnf.Job(ours, response.json())
        assert_same(job.wait(timeout=300, progress=False).result(), cli(path, "--components", "3").components)
    assert uploads_left(tus_server) == []
