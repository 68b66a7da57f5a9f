"""The web page in a real browser (Debian's Chromium, headless, through chromium-driver and Selenium)
against a live `hypermnf serve` with an API key: the page is served for the browser at `/`, the key is
typed in, a real AVIRIS cube (an ENVI pair) and a .npy are uploaded through the page, and once the jobs
succeed the eigenvalue plot and the component quicklooks must be drawn (non-blank pixels). Screenshots
go to tests/web/artifacts/ (git-ignored)."""

from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
ARTIFACTS = Path(os.environ.get("WEB_TEST_ARTIFACTS", REPO / "tests" / "web" / "artifacts"))
KEY = "web-test-key-0123456789"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")


def find_binary() -> Path:
    env = os.environ.get("HYPERMNF_BIN")
    if env:
        return Path(env)
    found = [p for p in (REPO / "target" / d / "hypermnf" for d in ("release", "debug")) if p.is_file()]
    if not found:
        pytest.exit("no hypermnf binary: run `cargo build` or set HYPERMNF_BIN", returncode=2)
    return max(found, key=lambda p: p.stat().st_mtime)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("web-server")
    (work / "keys.txt").write_text(f"tester:{KEY}\n")
    out, log = work / "stdout", work / "server.log"
    with open(out, "w") as o, open(log, "w") as e:
        proc = subprocess.Popen([str(find_binary()), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(work / "data"),
                                 "--input-root", str(DATA), "--backend", "cpu", "--api-keys-file", str(work / "keys.txt")],
                                stdout=o, stderr=e)
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None:
            lines = [line for line in out.read_text().splitlines() if line.startswith("listening on ")]
            if lines:
                url = lines[0].removeprefix("listening on ").strip()
            elif proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the server did not start:\n" + log.read_text(errors="replace"))
            else:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert "panicked" not in log.read_text(errors="replace")


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1180,1500",
                "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_script_timeout(30)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def wait(driver, what, timeout=120.0, message=""):
    # The page re-renders the job table as jobs progress: an element found a moment before may be gone
    # by the time it is read (a stale reference), which only means "look again".
    return WebDriverWait(driver, timeout, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: what(d), message
    )


def image_stats(driver, element_id: str) -> dict:
    """Draws the <img> onto a canvas in the page and counts its pixels: size, how many are not black,
    and how many distinct grey levels."""
    return driver.execute_script(
        """
        const img = document.getElementById(arguments[0]);
        if (!img || !img.complete || !img.naturalWidth) return null;
        const c = document.createElement("canvas");
        c.width = img.naturalWidth; c.height = img.naturalHeight;
        const g = c.getContext("2d");
        g.drawImage(img, 0, 0);
        const d = g.getImageData(0, 0, c.width, c.height).data;
        const levels = new Set();
        let lit = 0;
        for (let i = 0; i < d.length; i += 4) { levels.add(d[i]); if (d[i] > 0) lit++; }
        return {width: c.width, height: c.height, lit: lit, levels: levels.size};
        """,
        element_id,
    )


def selected_job(driver, timeout=180.0) -> str:
    """Waits for the selected job's row to show success and its detail to be drawn; its id."""
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#job-table tr.selected[data-status='succeeded']"), timeout,
         "the uploaded job did not succeed: " + driver.find_element(By.ID, "job-table").text)
    wait(driver, lambda d: d.find_element(By.ID, "detail-body").is_displayed(), 30, "the job's detail was not shown")
    return driver.find_element(By.CSS_SELECTOR, "#job-table tr.selected").get_attribute("data-id")


def check_detail(driver, server: str, job_id: str) -> dict:
    meta = requests.get(f"{server}/v1/jobs/{job_id}/metadata", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()
    k = meta["components"]
    # The plot: one point per eigenvalue, the k kept marked, and the marker's label.
    plot = driver.find_element(By.ID, "eigen-plot")
    assert len(plot.find_elements(By.CSS_SELECTOR, "circle")) == len(meta["eigenvalues"])
    assert len(plot.find_elements(By.CSS_SELECTOR, "circle.kept")) == k
    assert plot.find_element(By.CSS_SELECTOR, "text.klabel").text == f"k = {k}"
    points = plot.find_element(By.CSS_SELECTOR, "polyline").get_attribute("points").split()
    assert len(points) == len(meta["eigenvalues"])
    ys = [float(p.split(",")[1]) for p in points]
    assert ys == sorted(ys), "eigenvalues descend, so their y coordinates rise"
    # The quicklooks: decoded, the cube's size, and not blank.
    for c in range(min(k, 4)):
        stats = wait(driver, lambda d: image_stats(d, f"preview-{c}"), 30, f"preview {c} did not load")
        assert (stats["width"], stats["height"]) == (meta["input"]["samples"], meta["input"]["lines"]), stats
        assert stats["lit"] > stats["width"] * stats["height"] // 4 and stats["levels"] > 32, stats
    # Dropped bands and downloads.
    dropped = driver.find_element(By.ID, "dropped").text
    for d in meta["dropped_bands"]:
        assert d["reason"].replace("_", " ") in dropped
    links = driver.find_elements(By.CSS_SELECTOR, "#downloads a")
    assert len(links) == (5 if meta["inverse"] else 3)
    return meta


def test_upload_through_the_page_and_see_the_results(server, browser):
    # API clients still get the OGC landing page's JSON at the same address.
    assert requests.get(server + "/", timeout=10).json()["links"]
    browser.get(server + "/")
    assert browser.title == "hypermnf"
    # Before the key is in, the server refuses the page's first listing (401, shown on the page);
    # nothing else may have failed.
    wait(browser, lambda d: "unauthorized" in d.find_element(By.ID, "server-info").text, 20)
    before = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert before and all("/v1/jobs" in m and "401" in m for m in before), before
    key = browser.find_element(By.ID, "api-key")
    key.send_keys(KEY, Keys.TAB)

    # A real AVIRIS cube, as an ENVI pair, with the inverse.
    hdr, img = DATA / "jasper_ridge_r198_bil.hdr", DATA / "jasper_ridge_r198_bil.img"
    browser.find_element(By.ID, "files").send_keys(f"{hdr}\n{img}")
    comps = browser.find_element(By.ID, "components")
    comps.clear()
    comps.send_keys("6")
    browser.find_element(By.ID, "inverse").click()
    browser.find_element(By.ID, "upload-button").click()
    wait(browser, lambda d: "uploaded" in d.find_element(By.ID, "upload-status").text, 60,
         "the upload did not finish: " + browser.find_element(By.ID, "upload-status").text)
    assert float(browser.find_element(By.ID, "upload-progress").get_attribute("value")) == 1.0
    job = selected_job(browser)
    meta = check_detail(browser, server, job)
    assert meta["components"] == 6 and meta["inverse"] and meta["input"]["bands"] == 198
    browser.save_screenshot(str(ARTIFACTS / "web-page.png"))
    browser.find_element(By.ID, "detail").screenshot(str(ARTIFACTS / "web-job-detail.png"))

    # A .npy through the page: the Salinas-A chip, 60 x 60.
    cube = np.fromfile(DATA / "salinasA_224_bip_be.img", dtype=">i2").reshape(83, 86, 224)[:60, :60]
    npy = ARTIFACTS / "salinas-60x60.npy"
    buf = io.BytesIO()
    np.save(buf, cube)
    npy.write_bytes(buf.getvalue())
    browser.find_element(By.ID, "files").clear()
    browser.find_element(By.ID, "files").send_keys(str(npy))
    browser.find_element(By.ID, "inverse").click()  # off again
    browser.find_element(By.ID, "upload-button").click()
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#job-table tr.selected").get_attribute("data-id") != job, 60,
         "the second upload did not become the selected job")
    second = selected_job(browser)
    meta = check_detail(browser, server, second)
    assert (meta["input"]["lines"], meta["input"]["samples"]) == (60, 60) and not meta["inverse"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#job-table tbody tr")) == 2

    # The same cube again: the existing job, shown as such.
    browser.find_element(By.ID, "files").clear()
    browser.find_element(By.ID, "files").send_keys(str(npy))
    browser.find_element(By.ID, "upload-button").click()
    wait(browser, lambda d: "ran before" in d.find_element(By.ID, "upload-status").text, 60)
    wait(browser, lambda d: "existing job" in d.find_element(By.CSS_SELECTOR, "#job-table tr.selected").text, 10)
    # The top of the page: upload and job list.
    browser.set_window_size(1180, 505)
    browser.save_screenshot(str(ARTIFACTS / "web-jobs.png"))
    browser.set_window_size(1180, 1500)

    # No script errors, no blocked requests (a CSP violation would show here).
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, "\n".join(e["message"] for e in severe)


def test_a_wrong_key_is_reported_on_the_page(server, browser):
    browser.get(server + "/?f=html")
    key = browser.find_element(By.ID, "api-key")
    key.clear()
    key.send_keys("not-the-key", Keys.TAB)
    wait(browser, lambda d: "unauthorized" in d.find_element(By.ID, "server-info").text, 20)
    browser.execute_script("localStorage.clear()")


def test_large_files_go_up_resumably_with_tus(server, browser):
    """With the page's tus threshold set low, the ENVI pair and a .npy go up through /v1/uploads
    (tus-js-client's POST and PATCH requests) and make the same jobs a plain upload does."""
    browser.get(server + "/?f=html")
    browser.execute_script("localStorage.setItem('hypermnf-api-key', arguments[0]);"
                           "localStorage.setItem('hypermnf-tus-threshold', '1000');", KEY)
    browser.refresh()
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#job-table tbody tr") or d.find_element(By.ID, "no-jobs").is_displayed(),
         20, "the job list did not load")
    # The log so far (the wrong key of the test before, the page before the key was set) is read and
    # dropped: what follows must log no error.
    browser.get_log("browser")

    def tus_requests():
        return browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('/v1/uploads'))")

    def selected():
        rows = browser.find_elements(By.CSS_SELECTOR, "#job-table tr.selected")
        return rows[0].get_attribute("data-id") if rows else None

    def choose(paths, components):
        browser.find_element(By.ID, "files").clear()
        browser.find_element(By.ID, "files").send_keys("\n".join(str(p) for p in paths))
        comps = browser.find_element(By.ID, "components")
        comps.clear()
        comps.send_keys(str(components))
        browser.execute_script("document.getElementById('inverse').checked = false")

    hdr, img = DATA / "jasper_ridge_r198_bil.hdr", DATA / "jasper_ridge_r198_bil.img"
    choose([hdr, img], 4)
    before = selected()
    browser.find_element(By.ID, "upload-button").click()
    wait(browser, lambda d: "uploaded" in d.find_element(By.ID, "upload-status").text, 60,
         "the resumable upload did not finish: " + browser.find_element(By.ID, "upload-status").text)
    assert float(browser.find_element(By.ID, "upload-progress").get_attribute("value")) == 1.0
    # The creations and the uploads of both files (data and header) went to /v1/uploads.
    names = tus_requests()
    assert any(n.endswith("/v1/uploads") for n in names), names
    assert len({n for n in names if not n.endswith("/v1/uploads")}) == 2, names
    wait(browser, lambda d: selected() not in (None, before), 30, "the new job was not selected")
    job = selected_job(browser)
    meta = check_detail(browser, server, job)
    assert meta["components"] == 4 and meta["input"]["bands"] == 198 and meta["input"]["interleave"] == "bil"

    # A .npy the same way (the Salinas-A chip of the first test: its job answers if that test ran).
    cube = np.fromfile(DATA / "salinasA_224_bip_be.img", dtype=">i2").reshape(83, 86, 224)[:60, :60]
    npy = ARTIFACTS / "salinas-60x60-tus.npy"
    buf = io.BytesIO()
    np.save(buf, cube)
    npy.write_bytes(buf.getvalue())
    browser.execute_script("performance.clearResourceTimings()")
    choose([npy], 6)
    browser.find_element(By.ID, "upload-button").click()
    wait(browser, lambda d: any(t in d.find_element(By.ID, "upload-status").text for t in ("uploaded", "ran before")), 60,
         "the .npy sent resumably made no job: " + browser.find_element(By.ID, "upload-status").text)
    assert len({n for n in tus_requests() if not n.endswith("/v1/uploads")}) == 1
    job = selected_job(browser)
    meta = check_detail(browser, server, job)
    assert (meta["input"]["lines"], meta["input"]["samples"], meta["components"]) == (60, 60, 6)
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, "\n".join(e["message"] for e in severe)
    browser.execute_script("localStorage.clear()")


def test_batches_are_listed_with_their_jobs_and_deleted_from_the_page(server, browser):
    """A batch made through the API shows on the page with its progress, counts and member jobs; a
    member opens the job's view; the Delete button removes the batch and its jobs."""
    auth = {"Authorization": f"Bearer {KEY}"}
    hrefs = [f"file://{DATA}/salinasA_224_bip_be.hdr", f"file://{DATA}/jasper_ridge_r198_bil.hdr"]
    r = requests.post(f"{server}/v1/batches", json={"inputs": [{"href": h} for h in hrefs], "statistics": "each",
                                                   "params": {"components": 3}}, headers=auth, timeout=30)
    assert r.status_code == 201, r.text
    batch = r.json()
    members = [j["id"] for j in batch["jobs"]]
    browser.get(server + "/?f=html")
    browser.execute_script("localStorage.setItem('hypermnf-api-key', arguments[0]);", KEY)
    browser.refresh()
    browser.get_log("browser")  # what the page logged before the key was set

    row = f"#batch-table tr.batch[data-id='{batch['id']}']"
    wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, row + "[data-status='succeeded']"), 120,
         "the batch did not show as succeeded: " + browser.find_element(By.ID, "batch-table").text)
    text = wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, row).text, 10)
    assert "each" in text and "100 %" in text and "2: 2 succeeded" in text, text
    links = browser.find_elements(By.CSS_SELECTOR, f"#batch-table tr.members[data-batch='{batch['id']}'] a.member")
    assert [a.get_attribute("data-job") for a in links] == members
    assert [a.text.split(":")[0] for a in links] == ["cube 0", "cube 1"]
    browser.find_element(By.ID, "batches").screenshot(str(ARTIFACTS / "web-batches.png"))

    # A member opens the job's view, as a job of the job list does.
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, f"a.member[data-job='{members[1]}']").click() or True, 10)
    wait(browser, lambda d: d.find_element(By.ID, "detail-id").text == members[1], 20, "the member's job was not shown")
    wait(browser, lambda d: d.find_element(By.ID, "detail-body").is_displayed(), 30, "the member's results were not drawn")
    meta = check_detail(browser, server, members[1])
    assert meta["components"] == 3 and meta["input"]["bands"] == 198

    # Delete, confirmed in the page's dialog.
    wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, row + " button.delete-batch").click() or True, 10)
    alert = WebDriverWait(browser, 10).until(expected_conditions.alert_is_present())
    assert "its 2 jobs" in alert.text
    alert.accept()
    wait(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, row), 20, "the batch stayed on the page")
    assert "deleted" in browser.find_element(By.ID, "batch-status").text
    assert requests.get(f"{server}/v1/batches/{batch['id']}", headers=auth, timeout=10).status_code == 404
    for job in members:
        assert requests.get(f"{server}/v1/jobs/{job}", headers=auth, timeout=10).status_code == 404
        assert not browser.find_elements(By.CSS_SELECTOR, f"#job-table tr[data-id='{job}']")
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, "\n".join(e["message"] for e in severe)
    browser.execute_script("localStorage.clear()")
