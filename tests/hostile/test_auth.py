"""Auth: with --api-keys-file a key sees only its own jobs in every route (list, status, result,
metadata, cancel, delete, and the upload de-duplication), requests without a valid key are refused, and
--input-root cannot be escaped with `..`, absolute paths or symlinks (of the file, of a directory on
the way, or of an ENVI header's data file).
"""

from __future__ import annotations

import hashlib
from typing import Dict

import numpy as np
import pytest

from conftest import Server, start_server
from test_hostile import assert_problem, envi_header, npy_of, wait_done

ALICE, BOB, CAROL = "alice-key-7Hq2", "bob-key-Zp91", "an-unnamed-key-4Rt8"
RNG = np.random.default_rng(1818)


def auth(key: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """A server with three keys, and an input root with files that try to lead out of it."""
    work = tmp_path_factory.mktemp("auth")
    keys = work / "keys.txt"
    keys.write_text(f"# test keys\nalice:{ALICE}\nbob:{BOB}\n{CAROL}\n")
    root, outside = work / "root", work / "outside"
    root.mkdir()
    outside.mkdir()
    cube = RNG.normal(size=(8, 9, 4)).astype(np.float32)
    (root / "cube.npy").write_bytes(npy_of(cube))
    (outside / "secret.npy").write_bytes(npy_of(cube * 2))
    (root / "escape.npy").symlink_to(outside / "secret.npy")
    (root / "inside-link.npy").symlink_to(root / "cube.npy")
    (root / "outdir").symlink_to(outside, target_is_directory=True)
    (root / "passwd.npy").symlink_to("/etc/passwd")
    # An ENVI header inside the root whose data file (found beside it) is a symlink out of it.
    data = RNG.integers(0, 1000, size=3 * 4 * 2, dtype=np.int16).tobytes()
    (outside / "stolen.img").write_bytes(data)
    (root / "envi_escape.hdr").write_text(envi_header())
    (root / "envi_escape.img").symlink_to(outside / "stolen.img")
    # Large enough for a noise estimate of its 2 bands (a 3 x 4 image would now be refused at submit).
    (root / "envi_ok.hdr").write_text(envi_header(samples=6, lines=5, bands=2))
    (root / "envi_ok.img").write_bytes(RNG.integers(0, 1000, size=5 * 6 * 2, dtype=np.int16).tobytes())
    server = start_server(work, ["--api-keys-file", str(keys), "--input-root", str(root)])
    yield server, root, outside
    server.stop()


def submit(server: Server, key: str, body: bytes, query: str = "", extra: Dict[str, str] | None = None):
    headers = {"Content-Type": "application/x-npy", **auth(key), **(extra or {})}
    return server.call("POST", "/v1/jobs" + (f"?{query}" if query else ""), data=body, headers=headers)


def test_requests_without_a_valid_key_are_refused(keyed):
    server, root, _ = keyed
    body = npy_of(RNG.normal(size=(5, 5, 3)).astype(np.float32))
    for headers in [{}, auth("wrong"), auth(ALICE.upper()), auth(ALICE[:-1]), auth(ALICE + "x"), {"Authorization": ALICE},
                    {"Authorization": f"Basic {ALICE}"}, auth(f"alice:{ALICE}"), auth("")]:
        for method, path in [("GET", "/v1/jobs"), ("GET", "/v1/info"), ("GET", "/v1/jobs/00000000-0000-0000-0000-000000000000")]:
            r = server.call(method, path, headers=headers)
            assert_problem(r, 401, "unauthorized")
            assert r.headers.get("WWW-Authenticate") == "Bearer"
        r = server.call("POST", "/v1/jobs", data=body, headers={"Content-Type": "application/x-npy", **headers})
        assert_problem(r, 401, "unauthorized")
    # The health routes stay open; every key is accepted on its own.
    assert server.call("GET", "/healthz").status_code == 200
    for key in (ALICE, BOB, CAROL):
        assert server.call("GET", "/v1/jobs", headers=auth(key)).status_code == 200


def test_a_key_sees_only_its_own_jobs(keyed):
    server, root, _ = keyed
    body = npy_of(RNG.normal(size=(12, 13, 5)).astype(np.float32))
    r = submit(server, ALICE, body, "components=2")
    assert r.status_code == 202, r.text
    a = r.json()["id"]
    # Bob may neither cancel nor delete it while it is queued or running (nor see it).
    assert_problem(server.call("DELETE", f"/v1/jobs/{a}", headers=auth(BOB)), 404, "not_found")
    assert wait_done(server_as(server, ALICE), a)["status"] == "succeeded"

    # The same bytes and parameters from Bob are Bob's own job, not a cache hit on Alice's; the same
    # with the digest header that lets a client skip sending the body.
    sha = hashlib.sha256(body).hexdigest()
    r = submit(server, BOB, b"", "components=2", {"X-Content-SHA256": sha, "Content-Length": "0"})
    assert r.status_code != 200 or r.json()["id"] != a, "Bob's digest-only upload answered with Alice's job"
    r = submit(server, BOB, body, "components=2")
    assert r.status_code == 202 and r.json()["id"] != a, r.text
    b = r.json()["id"]
    assert wait_done(server_as(server, BOB), b)["status"] == "succeeded"

    for owner, mine, theirs in [(ALICE, a, b), (BOB, b, a)]:
        h = auth(owner)
        listed = [j["id"] for j in server.call("GET", "/v1/jobs", headers=h).json()["jobs"]]
        assert mine in listed and theirs not in listed, (owner, listed)
        for q in ["status=succeeded", "limit=1000", f"after={theirs}", f"after={mine}"]:
            page = server.call("GET", f"/v1/jobs?{q}", headers=h)
            assert page.status_code == 200 and theirs not in [j["id"] for j in page.json()["jobs"]], (owner, q)
        for path in [f"/v1/jobs/{theirs}", f"/v1/jobs/{theirs}/result", f"/v1/jobs/{theirs}/result?format=envi",
                     f"/v1/jobs/{theirs}/result?product=denoised", f"/v1/jobs/{theirs}/metadata"]:
            assert_problem(server.call("GET", path, headers=h), 404, "not_found")
        assert_problem(server.call("DELETE", f"/v1/jobs/{theirs}", headers=h), 404, "not_found")
        assert_problem(server.call("GET", f"/v1/jobs/{theirs}/preview?component=1", headers=h), 404, "not_found")
        # The same jobs seen through OGC API - Processes: listed, status, results and dismiss.
        ogc_listed = [j["jobID"] for j in server.call("GET", "/jobs?limit=1000", headers=h).json()["jobs"]]
        assert mine in ogc_listed and theirs not in ogc_listed, (owner, ogc_listed)
        for method, path in [("GET", f"/jobs/{theirs}"), ("GET", f"/jobs/{theirs}/results"), ("DELETE", f"/jobs/{theirs}")]:
            r = server.call(method, path, headers=h)
            assert r.status_code == 404 and theirs not in r.text.replace(path, ""), (owner, method, path, r.text)
        assert server.call("GET", f"/jobs/{mine}", headers=h).status_code == 200
        # The owner still sees and downloads their own job.
        assert server.call("GET", f"/v1/jobs/{mine}", headers=h).status_code == 200
        assert server.call("GET", f"/v1/jobs/{mine}/result", headers=h).status_code == 200
        assert server.call("GET", f"/v1/jobs/{mine}/metadata", headers=h).status_code == 200
    # A third key sees neither; the owners can delete their own.
    assert server.call("GET", "/v1/jobs", headers=auth(CAROL)).json()["jobs"] == []
    assert server.call("DELETE", f"/v1/jobs/{a}", headers=auth(ALICE)).status_code == 204
    assert server.call("GET", f"/v1/jobs/{b}", headers=auth(BOB)).status_code == 200
    assert server.healthy()


class server_as:
    """The server seen with one key (for wait_done, which polls without headers of its own)."""

    def __init__(self, server: Server, key: str):
        self.server, self.key = server, key

    def call(self, method: str, path: str, **kw):
        kw.setdefault("headers", {}).update(auth(self.key))
        return self.server.call(method, path, **kw)


def href(server: Server, path: str):
    return server.call("POST", "/v1/jobs", json={"input": {"href": path}}, headers=auth(ALICE))


def test_input_root_cannot_be_escaped(keyed):
    server, root, outside = keyed
    # The root works: a file in it, and a symlink in it to a file in it.
    for ok in [f"file://{root}/cube.npy", f"file://{root}/inside-link.npy", f"file://{root}/envi_ok.hdr", f"file://localhost{root}/cube.npy"]:
        r = href(server, ok)
        assert r.status_code in (200, 202), (ok, r.text)
    refused = [
        (f"file://{root}/../outside/secret.npy", 400, "invalid_href"),
        (f"file://{root}/%2E%2E/outside/secret.npy", 400, "invalid_href"),
        (f"file://{root}/outdir/../../outside/secret.npy", 400, "invalid_href"),
        (f"file://{root}//..//outside/secret.npy", 400, "invalid_href"),
        (f"file://{outside}/secret.npy", 403, "forbidden_path"),
        ("file:///etc/passwd", 403, "forbidden_path"),
        (f"file://{root}/escape.npy", 403, "forbidden_path"),
        (f"file://{root}/outdir/secret.npy", 403, "forbidden_path"),
        (f"file://{root}/passwd.npy", 403, "forbidden_path"),
        (f"file://{root}/envi_escape.hdr", 403, "forbidden_path"),
        (f"file://{root}/envi_escape.img", 403, "forbidden_path"),
        (f"{root}/cube.npy", 400, "invalid_href"),
        (f"file:{root}/cube.npy", 400, "invalid_href"),
        (f"file://other-host{root}/cube.npy", 400, "invalid_href"),
        (f"file://{root}/cube.npy%00.hdr", 400, "input_not_found"),
    ]
    for path, status, code in refused:
        r = href(server, path)
        assert (r.status_code, r.json().get("code")) == (status, code), (path, r.status_code, r.text)
    # None of the refused files was read into a job.
    jobs = server.call("GET", "/v1/jobs?limit=1000", headers=auth(ALICE)).json()["jobs"]
    assert all(str(outside) not in str(j.get("input")) for j in jobs)
    assert server.healthy()


def test_input_root_symlink_swapped_after_the_check_is_still_inside(keyed):
    """The accepted path is the resolved one: replacing a symlink after the job is created does not
    make the job read outside the root (its input is the canonical path of the file it was checked on)."""
    server, root, outside = keyed
    target = root / "swap-target.npy"
    target.write_bytes(npy_of(RNG.normal(size=(8, 9, 4)).astype(np.float32)))  # not seen before: no cache hit
    link = root / "swap.npy"
    link.symlink_to(target)
    r = href(server, f"file://{link}")
    assert r.status_code in (200, 202), r.text
    link.unlink()
    link.symlink_to(outside / "secret.npy")
    job = wait_done(server_as(server, ALICE), r.json()["id"])
    assert job["status"] == "succeeded"
    assert job["input"] and job["input"].get("lines") == 8
    r = href(server, f"file://{link}")
    assert_problem(r, 403, "forbidden_path")
