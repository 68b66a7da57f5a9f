// The hypermnf page: the job list (polled from /v1/jobs), the batches with their jobs (/v1/batches),
// one job's eigenvalue plot, component quicklooks, dropped bands, timings and downloads, and uploads
// with a progress bar. No framework and
// nothing fetched from elsewhere: it works offline. Data from the server goes into the page as text
// (textContent, SVG attributes), never as markup.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
// cached: jobs an upload was answered with (same cube and parameters as before); reused: jobs whose
// metadata says the eigen system came from the job cache.
const state = { jobs: [], batches: [], selected: null, shown: null, cached: new Set(), reused: new Set(), timer: null, info: "" };

// ---- the API key (kept in this browser only) and requests ------------------------------------------

const keyInput = $("api-key");
keyInput.value = localStorage.getItem("hypermnf-api-key") || "";
keyInput.addEventListener("change", () => {
  localStorage.setItem("hypermnf-api-key", keyInput.value.trim());
  refresh();
});

function authHeaders() {
  const key = keyInput.value.trim();
  return key ? { Authorization: "Bearer " + key } : {};
}

async function api(path, method) {
  const r = await fetch(path, { method: method || "GET", headers: authHeaders() });
  if (!r.ok) {
    let detail = r.status + " " + r.statusText;
    try { const e = await r.json(); detail = (e.code || "") + ": " + (e.message || e.detail || ""); } catch (_) { /* not JSON */ }
    throw new Error(detail);
  }
  return r;
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

function seconds(ms) {
  return ms < 1000 ? Math.round(ms) + " ms" : (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
}

function runTime(job) {
  if (!job.started_at) return "";
  const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
  return seconds(end - Date.parse(job.started_at));
}

// ---- the job list ------------------------------------------------------------------------------------

async function refresh() {
  clearTimeout(state.timer);
  let live = false;
  try {
    const body = await (await api("/v1/jobs?limit=100")).json();
    state.jobs = body.jobs;
    renderJobs();
    // After the jobs: a refused key is reported once, by the job list.
    state.batches = (await (await api("/v1/batches?limit=50")).json()).batches;
    renderBatches();
    const busy = (s) => s === "queued" || s === "running";
    live = state.jobs.some((j) => busy(j.status)) || state.batches.some((b) => busy(b.status));
    if (state.selected) await renderDetail(await selectedJob());
    $("server-info").textContent = state.info;
    $("server-info").classList.remove("error");
  } catch (e) {
    $("server-info").textContent = "cannot list the jobs: " + e.message;
    $("server-info").classList.add("error");
  }
  state.timer = setTimeout(refresh, live ? 700 : 4000);
}

function renderJobs() {
  const tbody = $("job-table").querySelector("tbody");
  tbody.replaceChildren();
  $("no-jobs").hidden = state.jobs.length > 0;
  for (const job of state.jobs) {
    const tr = el("tr");
    tr.dataset.id = job.id;
    tr.dataset.status = job.status;
    if (job.id === state.selected) tr.classList.add("selected");
    // The end of the id: its start is a timestamp (UUID v7), the same for jobs made close together.
    const short = el("td", "…" + job.id.slice(-8));
    short.title = job.id;
    tr.append(short);
    tr.append(el("td", job.status, "status " + job.status));
    const bar = el("progress");
    bar.max = 1;
    bar.value = job.progress;
    const td = el("td");
    td.append(bar, " " + Math.round(job.progress * 100) + " %");
    tr.append(td);
    tr.append(el("td", job.stage || ""));
    tr.append(el("td", state.cached.has(job.id) ? "existing job" : state.reused.has(job.id) ? "statistics" : ""));
    const i = job.input;
    tr.append(el("td", `${i.lines} × ${i.samples} × ${i.bands} ${i.data_type} ${i.interleave}`));
    tr.append(el("td", new Date(job.created_at).toLocaleString()));
    tr.append(el("td", runTime(job)));
    tr.addEventListener("click", () => select(job.id));
    tbody.append(tr);
  }
}

async function select(id) {
  state.selected = id;
  state.shown = null;
  renderJobs();
  renderDetail(await selectedJob());
}

// The selected job's document: from the list, or (a batch's job beyond the list's first page) fetched.
async function selectedJob() {
  const listed = state.jobs.find((j) => j.id === state.selected);
  if (listed || !state.selected) return listed;
  try {
    return await (await api("/v1/jobs/" + encodeURIComponent(state.selected))).json();
  } catch (_) {
    return undefined; // deleted meanwhile
  }
}

// ---- batches -----------------------------------------------------------------------------------------

function countsText(counts) {
  return ["succeeded", "running", "queued", "failed", "canceled"].filter((s) => counts[s]).map((s) => counts[s] + " " + s).join(", ");
}

function renderBatches() {
  const tbody = $("batch-table").querySelector("tbody");
  tbody.replaceChildren();
  $("no-batches").hidden = state.batches.length > 0;
  for (const batch of state.batches) {
    const tr = el("tr", null, "batch");
    tr.dataset.id = batch.id;
    tr.dataset.status = batch.status;
    const short = el("td", "…" + batch.id.slice(-8));
    short.title = batch.id;
    tr.append(short, el("td", batch.statistics), el("td", batch.status, "status " + batch.status));
    const bar = el("progress");
    bar.max = 1;
    bar.value = batch.progress;
    const td = el("td");
    td.append(bar, " " + Math.round(batch.progress * 100) + " %");
    tr.append(td, el("td", batch.jobs.length + ": " + countsText(batch.counts)), el("td", new Date(batch.created_at).toLocaleString()));
    const del = el("button", "Delete", "delete-batch");
    del.type = "button";
    del.title = "cancel what still runs, and delete the batch, its jobs and their files";
    del.addEventListener("click", () => deleteBatch(batch));
    const last = el("td");
    last.append(del);
    tr.append(last);
    tbody.append(tr);
    // The member jobs, in the order of the cubes: each opens the job's view.
    const members = el("tr", null, "members");
    members.dataset.batch = batch.id;
    const cell = el("td");
    cell.colSpan = 7;
    batch.jobs.forEach((job, i) => {
      const a = el("a", `cube ${i}: …${job.id.slice(-8)} ${job.status}`, "member status " + job.status);
      a.href = "#job-" + job.id;
      a.dataset.job = job.id;
      a.title = job.id;
      a.addEventListener("click", (ev) => { ev.preventDefault(); select(job.id); });
      cell.append(a);
    });
    members.append(cell);
    tbody.append(members);
  }
}

async function deleteBatch(batch) {
  if (!confirm(`Delete batch …${batch.id.slice(-8)}, its ${batch.jobs.length} jobs and their results?`)) return;
  try {
    await api("/v1/batches/" + encodeURIComponent(batch.id), "DELETE");
    $("batch-status").textContent = `batch …${batch.id.slice(-8)} deleted`;
    $("batch-status").classList.remove("error");
    if (batch.jobs.some((j) => j.id === state.selected)) state.selected = null;
  } catch (e) {
    $("batch-status").textContent = "cannot delete the batch: " + e.message;
    $("batch-status").classList.add("error");
  }
  refresh();
}

// ---- one job -----------------------------------------------------------------------------------------

async function renderDetail(job) {
  const section = $("detail");
  if (!job) { section.hidden = true; return; }
  section.hidden = false;
  $("detail-id").textContent = job.id;
  const status = $("detail-status");
  status.textContent = job.status + (job.status === "running" ? " (" + (job.stage || "") + ")" : "");
  status.className = "status " + job.status;
  $("detail-error").hidden = !job.error;
  if (job.error) $("detail-error").textContent = job.error.code + ": " + job.error.message;
  // The finished job's results are drawn once.
  const key = job.id + ":" + job.status;
  if (state.shown === key) return;
  state.shown = key;
  $("detail-body").hidden = true;
  if (job.status !== "succeeded") return;
  const meta = await (await api(job.links.metadata)).json();
  if (meta.statistics && meta.statistics.reused && !state.reused.has(job.id)) {
    state.reused.add(job.id);
    renderJobs();
  }
  plot(meta);
  previews(job, meta.components);
  dropped(meta.dropped_bands);
  timings(meta);
  downloads(job, meta);
  $("detail-body").hidden = false;
}

// The eigenvalues on a log scale, the k kept in the accent colour left of the dashed line, and the
// noise level (eigenvalue 1) dotted.
function plot(meta) {
  const values = meta.eigenvalues.map((v) => Math.max(v, 1e-6));
  const k = meta.components;
  const W = 680, H = 300, L = 56, R = 16, T = 14, B = 40;
  const lo = Math.floor(Math.log10(Math.min(...values, 1)));
  const hi = Math.ceil(Math.log10(Math.max(...values, 10)));
  const x = (i) => L + (values.length === 1 ? 0.5 : i / (values.length - 1)) * (W - L - R);
  const y = (v) => T + (1 - (Math.log10(v) - lo) / (hi - lo || 1)) * (H - T - B);
  const s = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", id: "eigen-plot",
                         "aria-label": `eigenvalues, ${k} of ${values.length} kept` });
  for (let p = lo; p <= hi; p++) {
    s.append(svg("line", { x1: L, x2: W - R, y1: y(10 ** p), y2: y(10 ** p), class: "grid" }));
    s.append(svg("text", { x: L - 6, y: y(10 ** p) + 4, "text-anchor": "end" }, p === 0 ? "1" : `1e${p}`));
  }
  s.append(svg("line", { x1: L, x2: W - R, y1: y(1), y2: y(1), class: "noise" }));
  s.append(svg("polyline", { class: "series", points: values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ") }));
  values.forEach((v, i) => {
    const dot = svg("circle", { cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: i < k ? 3.2 : 2, class: i < k ? "kept" : "rest" });
    dot.append(svg("title", {}, `component ${i + 1}: ${v.toPrecision(4)}`));
    s.append(dot);
  });
  const kx = (x(k - 1) + x(Math.min(k, values.length - 1))) / 2;
  s.append(svg("line", { x1: kx, x2: kx, y1: T, y2: H - B, class: "kline" }));
  s.append(svg("text", { x: kx + 4, y: T + 10, class: "klabel" }, `k = ${k}`));
  for (const i of new Set([0, k - 1, values.length - 1])) {
    s.append(svg("text", { x: x(i), y: H - B + 14, "text-anchor": "middle" }, String(i + 1)));
  }
  s.append(svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, "component"));
  $("plot").replaceChildren(s);
}

async function previews(job, k) {
  const box = $("previews");
  box.replaceChildren();
  for (let c = 0; c < Math.min(k, 4); c++) {
    const fig = el("figure");
    const img = el("img");
    img.id = "preview-" + c;
    img.alt = "component " + (c + 1);
    fig.append(img, el("figcaption", "component " + (c + 1)));
    box.append(fig);
    // Fetched (with the key, if any) rather than linked: an <img> cannot send a header.
    api(`/v1/jobs/${job.id}/preview?component=${c}`)
      .then((r) => r.blob())
      .then((b) => { img.src = URL.createObjectURL(b); })
      .catch((e) => { fig.append(el("p", e.message, "error")); });
  }
}

function dropped(list) {
  const box = $("dropped");
  if (!list.length) { box.replaceChildren(el("p", "none", "muted")); return; }
  const t = el("table");
  t.id = "dropped-table";
  const head = el("tr");
  head.append(el("th", "band"), el("th", "reason"));
  t.append(head);
  for (const d of list) {
    const tr = el("tr");
    tr.append(el("td", d.band), el("td", d.reason.replace(/_/g, " ")));
    t.append(tr);
  }
  box.replaceChildren(t);
}

function timings(meta) {
  const t = el("table");
  for (const [stage, ms] of Object.entries(meta.timings_ms || {})) {
    const tr = el("tr");
    tr.append(el("td", stage), el("td", seconds(ms)));
    t.append(tr);
  }
  if (meta.statistics && meta.statistics.reused) {
    const tr = el("tr");
    tr.append(el("td", "statistics"), el("td", "reused (" + meta.statistics.source + ")"));
    t.append(tr);
  }
  $("timings").replaceChildren(t);
}

function downloads(job, meta) {
  const ul = $("downloads");
  ul.replaceChildren();
  const items = [
    ["components (.npy)", job.links.result, job.id + ".npy"],
    ["components (ENVI, zip)", job.links.result + "?format=envi", job.id + ".zip"],
    ["metadata (.json)", job.links.metadata, job.id + ".json"],
  ];
  if (meta.inverse) {
    items.push(["denoised cube (.npy)", job.links.result + "?product=denoised", job.id + "-denoised.npy"]);
    items.push(["denoised cube (ENVI, zip)", job.links.result + "?product=denoised&format=envi", job.id + "-denoised.zip"]);
  }
  for (const [label, href, name] of items) {
    const a = el("a", label);
    a.href = href;
    a.download = name;
    // With a key, the file is fetched with it and handed to the browser as a blob.
    a.addEventListener("click", async (ev) => {
      if (!keyInput.value.trim()) return;
      ev.preventDefault();
      const blob = await (await api(href)).blob();
      const tmp = document.createElement("a");
      tmp.href = URL.createObjectURL(blob);
      tmp.download = name;
      tmp.click();
      setTimeout(() => URL.revokeObjectURL(tmp.href), 10000);
    });
    const li = el("li");
    li.append(a);
    ul.append(li);
  }
}

// ---- upload --------------------------------------------------------------------------------------------

// Files of at least this many bytes go up resumably (tus 1.0, /v1/uploads, with tus-js-client): in one
// PATCH that is resumed from the server's offset after a dropped connection, or after a reload of the
// page (tus-js-client remembers the upload in this browser). Smaller ones go in one POST /v1/jobs.
// localStorage "hypermnf-tus-threshold" (bytes) overrides the threshold.
const TUS_THRESHOLD = Number(localStorage.getItem("hypermnf-tus-threshold")) || 64 * 1048576;

function uploadStatus(text, error) {
  const status = $("upload-status");
  status.textContent = text;
  status.classList.toggle("error", !!error);
}

function mib(n) {
  return (n / 1048576).toFixed(1);
}

// The answer to a job request: select the job, or say why it was refused.
function jobAnswered(status, job, statusText) {
  $("upload-button").disabled = false;
  if (status === 200 || status === 201 || status === 202) {
    $("upload-progress").value = 1;
    if (job.cached) state.cached.add(job.id);
    uploadStatus(job.cached ? "the same cube and parameters ran before: here is that job" : "uploaded; the job is queued");
    state.selected = job.id;
    state.shown = null;
    refresh();
  } else {
    uploadStatus("refused: " + (job && job.code ? job.code + ": " + job.message : status + " " + statusText), true);
  }
}

// One file up with tus; resolves to the upload's id.
function tusUpload(file, onProgress) {
  return new Promise((resolve, reject) => {
    const upload = new tus.Upload(file, {
      endpoint: location.origin + "/v1/uploads",
      headers: authHeaders(),
      metadata: { filename: file.name, filetype: file.type || "application/octet-stream" },
      retryDelays: [0, 1000, 3000, 5000, 10000, 20000],
      removeFingerprintOnSuccess: true,
      onProgress,
      onSuccess: () => resolve(upload.url.split("/").pop()),
      onError: (e) => {
        let detail = e.message || String(e);
        try { const body = JSON.parse(e.originalResponse.getBody()); detail = body.code + ": " + body.message; } catch (_) { /* no JSON answer */ }
        reject(new Error(detail));
      },
    });
    // An upload of this file left unfinished in this browser (a lost connection, a reload) goes on.
    upload.findPreviousUploads().then((previous) => {
      if (previous.length) upload.resumeFromPreviousUpload(previous[0]);
      upload.start();
    }, reject);
  });
}

async function resumableJob(data, header, params) {
  const bar = $("upload-progress");
  const upload = await tusUpload(data, (sent, total) => {
    bar.value = sent / total;
    uploadStatus(`uploading (resumable): ${mib(sent)} of ${mib(total)} MiB`);
  });
  const body = { upload, params };
  if (header) body.header_upload = await tusUpload(header, () => {});
  const r = await fetch("/v1/jobs", {
    method: "POST",
    headers: Object.assign({ "Content-Type": "application/json" }, authHeaders()),
    body: JSON.stringify(body),
  });
  let job = null;
  try { job = await r.json(); } catch (_) { /* not JSON */ }
  jobAnswered(r.status, job, r.statusText);
}

$("upload-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const files = Array.from($("files").files);
  const params = { components: Number($("components").value) || 10, noise: $("noise").value, inverse: $("inverse").checked };
  const npy = files.filter((f) => /\.npy$/i.test(f.name));
  const hdr = files.filter((f) => /\.hdr$/i.test(f.name));
  let data, header = null;
  if (files.length === 1 && npy.length === 1) {
    data = npy[0];
  } else if (files.length === 2 && hdr.length === 1) {
    header = hdr[0];
    data = files.find((f) => f !== header);
  } else {
    uploadStatus("choose one .npy file, or an ENVI .hdr with its data file", true);
    return;
  }
  const bar = $("upload-progress");
  bar.value = 0;
  $("upload-button").disabled = true;
  if (data.size >= TUS_THRESHOLD) {
    uploadStatus("uploading (resumable) …");
    resumableJob(data, header, params).catch((e) => {
      $("upload-button").disabled = false;
      uploadStatus("the upload failed: " + e.message, true);
    });
    return;
  }
  let body, query = "";
  if (header) {
    body = new FormData();
    // The parameters before the data: the server then sends the data to the device while it arrives.
    body.append("header", header);
    body.append("params", JSON.stringify(params));
    body.append("data", data);
  } else {
    body = data;
    query = "?" + new URLSearchParams({ components: params.components, noise: params.noise, inverse: params.inverse });
  }
  const xhr = new XMLHttpRequest();
  xhr.open("POST", "/v1/jobs" + query);
  for (const [k, v] of Object.entries(authHeaders())) xhr.setRequestHeader(k, v);
  if (!header) xhr.setRequestHeader("Content-Type", "application/x-npy");
  xhr.upload.onprogress = (e) => {
    if (e.lengthComputable) {
      bar.value = e.loaded / e.total;
      uploadStatus(`uploading: ${mib(e.loaded)} of ${mib(e.total)} MiB`);
    }
  };
  xhr.onload = () => {
    let job = null;
    try { job = JSON.parse(xhr.responseText); } catch (_) { /* not JSON */ }
    jobAnswered(xhr.status, job, xhr.statusText);
  };
  xhr.onerror = () => {
    $("upload-button").disabled = false;
    uploadStatus("the upload failed (connection lost)", true);
  };
  uploadStatus("uploading …");
  xhr.send(body);
});

fetch("/readyz").then((r) => r.json()).then((r) => {
  if (r.backend) state.info = `backend ${r.backend} (${r.device})`;
  if (!$("server-info").classList.contains("error")) $("server-info").textContent = state.info;
}).catch(() => {});
refresh();
