"""OGC API - Processes against a live `hypermnf serve`, through the real client (OWSLib's
`owslib.ogcapi.processes.Processes`) and raw HTTP for the status codes and exception bodies.

OWSLib 0.35 lists and describes processes and executes them; it has no job calls, so the jobs are
polled and their results fetched with its own request helper (`Processes._request`, which sends
the client's headers), and the result files with requests."""

from __future__ import annotations

import base64
import io
import subprocess
import time
import uuid

import numpy as np
import pytest
import yaml

from conftest import DATA, npy_bytes, salinas

SALINAS_HREF = f"file://{DATA}/salinasA_224_bip_be.hdr"
NO_SUCH_JOB = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/no-such-job"
NO_SUCH_PROCESS = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/no-such-process"
RESULT_NOT_READY = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/result-not-ready"
RESULTS_REL = "http://www.opengis.net/def/rel/ogc/1.0/results"


def wait_job(processes, job_id: str, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        info = processes._request(path=f"jobs/{job_id}")
        assert info["jobID"] == job_id and info["processID"] == "mnf" and info["type"] == "process"
        assert 0 <= info["progress"] <= 100
        if info["status"] in ("successful", "failed", "dismissed"):
            return info
        assert info["status"] in ("accepted", "running"), info
        assert time.monotonic() < deadline, f"job {job_id} still {info['status']} after {timeout} s"
        time.sleep(0.2)


def load_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def assert_problem(resp, status: int, type_: str | None = None, code: str | None = None) -> dict:
    """An exception answer: the status, RFC 7807 / OGC exception members, application/problem+json."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json"), resp.headers
    body = resp.json()
    assert body["status"] == status and body["title"] and body["detail"] and body["type"], body
    if type_ is not None:
        assert body["type"] == type_, body
    if code is not None:
        assert body["code"] == code, body
    return body


def cli_components(binary, tmp_path, *args: str) -> np.ndarray:
    """What `hypermnf run` writes for the same cube and parameters (the service must match it)."""
    out = tmp_path / "cli.npy"
    subprocess.run([str(binary), "run", "--backend", "cpu", "--out", str(out), *args], check=True, capture_output=True)
    return np.load(out)


# ---------------------------------------------------------------------------------------------------
# Discovery

def test_landing_page_conformance_and_api_definition(processes):
    rels = {link["rel"]: link for link in processes.links}
    for rel in ("self", "service-desc", "http://www.opengis.net/def/rel/ogc/1.0/conformance",
                "http://www.opengis.net/def/rel/ogc/1.0/processes", "http://www.opengis.net/def/rel/ogc/1.0/job-list"):
        assert rel in rels, rel
    conforms = processes.conformance()["conformsTo"]
    assert "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/core" in conforms
    assert "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/dismiss" in conforms
    # OWSLib follows the service-desc link and parses the YAML.
    api = processes.api()
    assert api["openapi"].startswith("3.0")
    for path in ("/processes/{processId}/execution", "/jobs/{jobId}/results", "/v1/jobs"):
        assert path in api["paths"], path


def test_processes_and_the_mnf_description(processes):
    listed = processes.processes()
    assert [p["id"] for p in listed] == ["mnf"]
    assert {"async-execute", "sync-execute", "dismiss"} <= set(listed[0]["jobControlOptions"])
    mnf = processes.process("mnf")
    assert mnf["id"] == "mnf" and mnf["version"]
    assert set(mnf["inputs"]) == {"cube", "statistics", "components", "snr", "noise", "inverse", "bad_bands",
                                  "ignore_value", "noise_window", "backend", "ortho"}
    assert mnf["inputs"]["cube"]["minOccurs"] == 1 and mnf["inputs"]["cube"]["maxOccurs"] > 1
    assert mnf["inputs"]["statistics"]["schema"]["enum"] == ["each", "pooled"]
    assert set(mnf["outputs"]) == {"components", "denoised", "metadata"}
    assert mnf["inputs"]["noise"]["schema"]["enum"] == ["mean-filter", "shift-difference"]


# ---------------------------------------------------------------------------------------------------
# Execution

def test_async_execution_on_an_href_under_the_input_root(server, processes, binary, tmp_path):
    info = processes.execute("mnf", inputs={"cube": {"href": SALINAS_HREF}, "components": 4}, async_=True)
    location = processes.response_headers["Location"]
    assert location == f"{server.url}/jobs/{info['jobID']}"
    assert processes.response_headers["Preference-Applied"] == "respond-async"
    assert info["status"] in ("accepted", "running", "successful")
    done = wait_job(processes, info["jobID"])
    assert done["status"] == "successful" and done["progress"] == 100
    assert any(link["rel"] == RESULTS_REL for link in done["links"])

    results = processes._request(path=f"jobs/{info['jobID']}/results")
    assert set(results) == {"components", "metadata"}
    comp = results["components"]
    assert comp["type"] == "application/x-npy"
    got = load_npy(server.get(comp["href"].removeprefix(server.url)).content)
    assert got.shape == (83, 86, 4) and got.dtype == np.float32
    np.testing.assert_array_equal(got, cli_components(binary, tmp_path, "--components", "4", str(DATA / "salinasA_224_bip_be.hdr")))
    meta = results["metadata"]["value"]
    assert meta["components"] == 4 and len(meta["eigenvalues"]) == len(meta["bands_used"])

    # The same job, seen from the native API.
    native = server.get(f"/v1/jobs/{info['jobID']}").json()
    assert native["status"] == "succeeded" and native["params"]["components"] == 4


def test_async_execution_on_an_uploaded_cube(server, processes):
    cube = salinas()
    value = base64.b64encode(npy_bytes(cube)).decode()
    info = processes.execute(
        "mnf",
        inputs={
            "cube": {"value": value, "mediaType": "application/x-npy", "encoding": "base64"},
            "components": 3, "noise": "shift-difference", "bad_bands": [0, 1, 2], "inverse": True,
        },
        async_=True,
    )
    assert processes.response_headers["Location"].endswith(f"/jobs/{info['jobID']}")
    done = wait_job(processes, info["jobID"])
    assert done["status"] == "successful", done
    results = processes._request(path=f"jobs/{info['jobID']}/results")
    assert set(results) == {"components", "denoised", "metadata"}
    components = load_npy(server.get(results["components"]["href"].removeprefix(server.url)).content)
    denoised = load_npy(server.get(results["denoised"]["href"].removeprefix(server.url)).content)
    assert components.shape == (83, 86, 3) and denoised.shape == cube.shape
    meta = results["metadata"]["value"]
    assert meta["params"]["noise"] == "shift-difference"
    dropped = {d["band"]: d["reason"] for d in meta["dropped_bands"]}
    assert all(dropped[b] == "user" for b in (0, 1, 2))
    # The same cube and parameters again: the job cache answers with the same job.
    again = processes.execute("mnf", inputs={
        "cube": {"value": value, "mediaType": "application/x-npy", "encoding": "base64"},
        "components": 3, "noise": "shift-difference", "bad_bands": [0, 1, 2], "inverse": True,
    }, async_=True)
    assert again["jobID"] == info["jobID"] and again["status"] == "successful"


def test_a_job_posted_to_v1_is_an_ogc_job(server, processes):
    r = server.post("/v1/jobs?components=2", data=npy_bytes(salinas()[:40, :40]), headers={"Content-Type": "application/x-npy"})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    done = wait_job(processes, job_id)
    assert done["status"] == "successful"
    listed = processes._request(path="jobs", kwargs={"status": "successful", "limit": 1000})
    assert job_id in [j["jobID"] for j in listed["jobs"]]
    results = processes._request(path=f"jobs/{job_id}/results")
    assert load_npy(server.get(results["components"]["href"].removeprefix(server.url)).content).shape == (40, 40, 2)


def test_sync_execution_returns_the_results(server, processes):
    small = salinas()[:30, :30]
    value = base64.b64encode(npy_bytes(small)).decode()
    cube = {"value": value, "mediaType": "application/x-npy", "encoding": "base64"}
    # OWSLib's default: synchronous, a results document, the outputs by value.
    results = processes.execute("mnf", inputs={"cube": cube, "components": 3})
    assert set(results) == {"components", "metadata"}
    comp = results["components"]
    assert comp["mediaType"] == "application/x-npy" and comp["encoding"] == "base64"
    components = load_npy(base64.b64decode(comp["value"]))
    assert components.shape == (30, 30, 3)
    assert results["metadata"]["value"]["components"] == 3
    monitor = processes.response_headers["Link"]
    assert 'rel="monitor"' in monitor

    # Raw, one output: its bytes.
    body = {"inputs": {"cube": cube, "components": 3}, "outputs": {"components": {}}, "response": "raw"}
    r = server.post("/processes/mnf/execution", json=body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-npy"
    np.testing.assert_array_equal(load_npy(r.content), components)

    # Raw, several outputs: multipart/related, one part each, Content-ID the output id; a reference
    # is an empty part with Content-Location.
    body["outputs"] = {"components": {}, "metadata": {"transmissionMode": "reference"}}
    r = server.post("/processes/mnf/execution", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("multipart/related")
    boundary = r.headers["content-type"].split('boundary="')[1].split('"')[0].encode()
    parts = [p for p in r.content.split(b"--" + boundary) if p.strip(b"\r\n-")]
    assert len(parts) == 2
    head, _, payload = parts[0].partition(b"\r\n\r\n")
    assert b"Content-ID: <components>" in head
    np.testing.assert_array_equal(load_npy(payload[:-2]), components)
    assert b"Content-ID: <metadata>" in parts[1] and b"Content-Location: " + server.url.encode() in parts[1]

    # Raw, every output by reference: 204 with a Link per output.
    body["outputs"] = {"components": {"transmissionMode": "reference"}, "denoised": {"transmissionMode": "reference"}}
    r = server.post("/processes/mnf/execution", json=body)
    assert r.status_code == 204, r.text
    links = r.headers["Link"]
    assert 'title="components"' in links and 'title="denoised"' in links and "product=denoised" in links


def test_sync_execution_of_a_failing_job_answers_its_exception(server, processes):
    # Every band constant: nothing is left to reduce.
    flat = np.full((12, 12, 6), 7, dtype=np.int16)
    body = {"inputs": {"cube": {"value": base64.b64encode(npy_bytes(flat)).decode(), "mediaType": "application/x-npy"}}}
    r = server.post("/processes/mnf/execution", json=body)
    problem = assert_problem(r, 400)
    # The failed job is listed, and its results answer the same exception.
    failed = processes._request(path="jobs", kwargs={"status": "failed"})["jobs"]
    assert failed and failed[0]["message"].startswith(problem["code"])
    assert_problem(server.get(f"/jobs/{failed[0]['jobID']}/results"), 400, code=problem["code"])


def test_dismiss(server, processes):
    # A finished job: dismissed, then gone from both APIs.
    info = processes.execute("mnf", inputs={"cube": {"href": SALINAS_HREF}, "components": 2}, async_=True)
    assert wait_job(processes, info["jobID"])["status"] == "successful"
    r = server.delete(f"/jobs/{info['jobID']}")
    assert r.status_code == 200 and r.json()["status"] == "dismissed"
    assert_problem(server.get(f"/jobs/{info['jobID']}"), 404, NO_SUCH_JOB)
    assert server.get(f"/v1/jobs/{info['jobID']}").status_code == 404

    # A job dismissed before it finished shows as dismissed, with no results.
    info = processes.execute("mnf", inputs={"cube": {"href": f"file://{DATA}/abu_beach1_cat_island_bsq.hdr"},
                                            "components": 6, "inverse": True}, async_=True)
    r = server.delete(f"/jobs/{info['jobID']}")
    assert r.status_code == 200, r.text
    status = r.json()["status"]
    if status == "dismissed" and server.get(f"/jobs/{info['jobID']}").status_code == 200:
        # Canceled while queued or running: the row stays, as dismissed.
        assert wait_job(processes, info["jobID"])["status"] == "dismissed"
        assert_problem(server.get(f"/jobs/{info['jobID']}/results"), 410, code="dismissed")
        assert server.get(f"/v1/jobs/{info['jobID']}").json()["status"] == "canceled"
    else:
        # It had finished already: deleted.
        assert status == "dismissed"
        assert_problem(server.get(f"/jobs/{info['jobID']}"), 404, NO_SUCH_JOB)


def test_an_array_of_cubes_with_pooled_statistics_is_one_job_of_a_batch(server, processes):
    # Two halves of the Salinas-A chip, by reference: one eigen system from both.
    cube = salinas()
    hrefs = []
    for i, part in enumerate((cube[:41], cube[41:])):
        path = server.inputs / f"salinas-half{i}.npy"
        np.save(path, part)
        hrefs.append(path.as_uri())
    info = processes.execute("mnf", inputs={"cube": [{"href": h} for h in hrefs], "statistics": "pooled",
                                            "components": 3, "noise": "shift-difference"}, async_=True)
    batch_id = info["jobID"]
    assert processes.response_headers["Location"] == f"{server.url}/jobs/{batch_id}"
    native = server.get(f"/v1/batches/{batch_id}").json()
    assert native["statistics"] == "pooled" and len(native["jobs"]) == 2, native
    members = [j["id"] for j in native["jobs"]]
    items = [link["href"] for link in info["links"] if link["rel"] == "item"]
    assert items == [f"{server.url}/jobs/{m}" for m in members]

    done = wait_job(processes, batch_id)
    assert done["status"] == "successful" and done["progress"] == 100, done
    assert any(link["rel"] == RESULTS_REL for link in done["links"])
    results = processes._request(path=f"jobs/{batch_id}/results")
    assert set(results) == {"components", "metadata"}
    shapes = [load_npy(server.get(link["href"].removeprefix(server.url)).content).shape for link in results["components"]]
    assert shapes == [(41, 86, 3), (42, 86, 3)]
    metadata = [server.get(link["href"].removeprefix(server.url)).json() for link in results["metadata"]]
    assert [m["statistics"]["source"] for m in metadata] == ["pooled", "pooled"]
    assert metadata[0]["eigenvalues"] == metadata[1]["eigenvalues"], "one system for both cubes"
    # Each member is an OGC job of its own as well.
    assert wait_job(processes, members[1])["status"] == "successful"

    # Dismissing the batch's job removes the batch and its jobs.
    r = server.delete(f"/jobs/{batch_id}")
    assert r.status_code == 200 and r.json()["status"] == "dismissed", r.text
    assert_problem(server.get(f"/jobs/{batch_id}"), 404, NO_SUCH_JOB)
    assert server.get(f"/v1/batches/{batch_id}").status_code == 404
    assert server.get(f"/v1/jobs/{members[0]}").status_code == 404


def test_an_array_of_cubes_is_refused_as_a_batch_is(server):
    a = server.inputs / "refuse-a.npy"
    b = server.inputs / "refuse-b.npy"
    np.save(a, salinas()[:30])
    np.save(b, salinas()[:30, :, :100])

    def execute(inputs):
        return server.post("/processes/mnf/execution", json={"inputs": inputs})

    assert_problem(execute({"cube": [{"href": a.as_uri()}, {"href": b.as_uri()}], "statistics": "pooled"}), 422, code="batch_mismatch")
    assert_problem(execute({"cube": [{"href": a.as_uri()}], "statistics": "most"}), 400, code="invalid_input")
    assert_problem(execute({"cube": [{"href": a.as_uri()}, {"href": "file:///etc/passwd"}]}), 403, code="forbidden_path")


# ---------------------------------------------------------------------------------------------------
# Status codes and exceptions, raw HTTP

def test_results_of_an_unfinished_job_are_not_ready(server, processes):
    info = processes.execute("mnf", inputs={"cube": {"href": f"file://{DATA}/abu_beach1_cat_island_bsq.hdr"},
                                            "components": 5, "noise": "shift-difference"}, async_=True)
    r = server.get(f"/jobs/{info['jobID']}/results")
    if r.status_code == 200:
        # Finished in between: then the status says so.
        assert wait_job(processes, info["jobID"])["status"] == "successful"
    else:
        assert_problem(r, 404, RESULT_NOT_READY)
    assert wait_job(processes, info["jobID"])["status"] == "successful"
    assert server.get(f"/jobs/{info['jobID']}/results").status_code == 200


def test_exceptions(server):
    assert_problem(server.get("/processes/nope"), 404, NO_SUCH_PROCESS)
    assert_problem(server.post("/processes/nope/execution", json={}), 404, NO_SUCH_PROCESS)
    assert_problem(server.get(f"/jobs/{uuid.uuid4()}"), 404, NO_SUCH_JOB)
    assert_problem(server.get("/jobs/not-a-job"), 404, NO_SUCH_JOB)
    assert_problem(server.get(f"/jobs/{uuid.uuid4()}/results"), 404, NO_SUCH_JOB)
    assert_problem(server.delete(f"/jobs/{uuid.uuid4()}"), 404, NO_SUCH_JOB)
    assert_problem(server.get("/jobs?status=succeeded"), 400, code="invalid_query")
    assert_problem(server.get("/jobs?limit=0"), 400, code="invalid_query")
    r = server.post("/processes/mnf/execution", data="{}", headers={"Content-Type": "text/plain"})
    assert_problem(r, 415, code="unsupported_media_type")
    r = server.post("/processes/mnf/execution", data="{not json", headers={"Content-Type": "application/json"})
    assert_problem(r, 400, code="invalid_json")
    execute = lambda inputs, **kw: server.post("/processes/mnf/execution", json={"inputs": inputs, **kw})
    assert_problem(execute({}), 400, code="invalid_input")
    assert_problem(execute({"cube": {"href": SALINAS_HREF}, "colour": "red"}), 400, code="invalid_input")
    # References: a host the server was not started with (--input-host) is refused; plain http never read.
    assert_problem(execute({"cube": {"href": "https://example.org/cube.npy"}}), 403, code="forbidden_reference")
    assert_problem(execute({"cube": {"href": "http://example.org/cube.npy"}}), 400, code="invalid_href")
    assert_problem(execute({"cube": {"value": "not base64!"}}), 400, code="invalid_input")
    assert_problem(execute({"cube": {"value": base64.b64encode(b"not an npy file").decode()}}), 400, code="invalid_npy")
    assert_problem(execute({"cube": {"href": "file:///etc/passwd"}}), 403, code="forbidden_path")
    assert_problem(execute({"cube": {"href": f"file://{DATA}/missing.hdr"}}), 400, code="input_not_found")
    assert_problem(execute({"cube": {"href": SALINAS_HREF}, "components": 0}), 422, code="invalid_params")
    assert_problem(execute({"cube": {"href": SALINAS_HREF}, "components": 2, "snr": 1.0}), 422, code="invalid_params")
    assert_problem(execute({"cube": {"href": SALINAS_HREF}}, subscriber={"successUri": "http://x"}), 400, code="invalid_input")
    assert_problem(server.post("/processes", json={}), 405)


def test_api_keys_hold_on_the_ogc_routes(server, processes):
    info = processes.execute("mnf", inputs={"cube": {"href": SALINAS_HREF}, "components": 3}, async_=True)
    job = info["jobID"]
    # Without a key, or with an unknown one: 401, a problem, and the challenge.
    import requests
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        for r in (requests.get(f"{server.url}/jobs", headers=headers), requests.get(f"{server.url}/jobs/{job}", headers=headers),
                  requests.post(f"{server.url}/processes/mnf/execution", headers=headers, json={"inputs": {}})):
            assert_problem(r, 401, code="unauthorized")
            assert r.headers["WWW-Authenticate"] == "Bearer"
    # Another key does not see it, anywhere.
    assert_problem(server.get(f"/jobs/{job}", who="bob"), 404, NO_SUCH_JOB)
    assert_problem(server.get(f"/jobs/{job}/results", who="bob"), 404, NO_SUCH_JOB)
    assert_problem(server.delete(f"/jobs/{job}", who="bob"), 404, NO_SUCH_JOB)
    assert job not in [j["jobID"] for j in server.get("/jobs?limit=1000", who="bob").json()["jobs"]]
    assert job in [j["jobID"] for j in server.get("/jobs?limit=1000").json()["jobs"]]
    # The discovery documents are public.
    for path in ("/", "/conformance", "/processes", "/processes/mnf", "/api"):
        assert requests.get(server.url + path).status_code == 200, path
    assert yaml.safe_load(requests.get(server.url + "/api").text)["info"]["title"] == "hypermnf"


def test_job_list_filters_and_paging(server, processes):
    for k in (2, 3):
        info = processes.execute("mnf", inputs={"cube": {"href": SALINAS_HREF}, "components": k, "noise": "shift-difference"}, async_=True)
        wait_job(processes, info["jobID"])
    everything = server.get("/jobs?limit=1000").json()["jobs"]
    assert len(everything) >= 2
    assert server.get("/jobs?processID=other").json()["jobs"] == []
    assert server.get("/jobs?type=wps").json()["jobs"] == []
    ok = server.get("/jobs?status=successful&processID=mnf&limit=1000").json()["jobs"]
    assert ok and all(j["status"] == "successful" for j in ok)
    assert server.get("/jobs?datetime=2000-01-01T00:00:00Z/2000-01-02T00:00:00Z").json()["jobs"] == []
    assert len(server.get("/jobs?datetime=2000-01-01T00:00:00Z/..&limit=1000").json()["jobs"]) == len(everything)
    # Paging: the next link carries on where the page ended, newest first, no repeats.
    seen, path = [], "/jobs?limit=1"
    while path:
        page = server.get(path).json()
        seen += [j["jobID"] for j in page["jobs"]]
        nxt = [link["href"] for link in page["links"] if link["rel"] == "next"]
        path = nxt[0].removeprefix(server.url) if nxt else None
    assert seen == [j["jobID"] for j in everything]
