// The kernel optimizer's page: submit a module, follow its job's turns over server-sent
// events, show the result; and the A/B dashboard. Everything the server or the model wrote is
// shown through textContent only (never innerHTML), so model output cannot inject markup.
"use strict";

const TERMINAL = new Set(["done", "finished", "succeeded", "completed", "failed", "error",
                          "cancelled", "canceled"]);
const END_EVENTS = ["done", "result", "end", "finished", "error"];

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function $(id) { return document.getElementById(id); }

// A server started with --api-key wants "Authorization: Bearer <key>" on its /v1 routes; the
// key typed into the page lives in this tab's sessionStorage only.
function apiKey() { return ($("api-key") && $("api-key").value.trim()) || ""; }

function authHeaders(extra) {
  const headers = Object.assign({}, extra || {});
  if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
  return headers;
}

function setStatus(text, isError) {
  const node = $("job-status");
  node.textContent = text;
  node.classList.toggle("error", Boolean(isError));
}

// ---------------------------------------------------------------- tabs

function showTab(name) {
  for (const tab of document.querySelectorAll("nav [role=tab]")) {
    const selected = tab.dataset.panel === name;
    tab.setAttribute("aria-selected", String(selected));
    $(tab.dataset.panel).hidden = !selected;
  }
  if (name === "ab") refreshAB();
}

// ---------------------------------------------------------------- results

// A turn carries either its whole EvalResult (eval_result) or, as the server's turn events
// do, its status and speedup flat on the turn.
function evalOf(turn) {
  if (!turn || typeof turn !== "object") return null;
  const full = turn.eval_result || turn.best_result;
  if (full && typeof full === "object") return full;
  if (typeof turn.status === "string" && turn.role !== undefined) {
    return { status: turn.status, benchmark: { speedup_vs_eager: turn.speedup } };
  }
  return null;
}

// {label, kind}: kind is ok / bad / unknown, for the badge colour.
function describeResult(result) {
  if (!result || typeof result !== "object") return { label: "no kernel", kind: "bad" };
  const status = String(result.status || "");
  if (status === "ok") return { label: "correct", kind: "ok" };
  if (status === "no_gpu") {
    return { label: "compiles (compile-only: not run, no GPU)", kind: "unknown" };
  }
  return { label: status.replace(/_/g, " ") || "unknown", kind: "bad" };
}

function speedupOf(result) {
  const bench = result && result.benchmark;
  const s = bench && bench.speedup_vs_eager;
  return result && result.status === "ok" && typeof s === "number" && s > 0 ? s : null;
}

function turnKey(turn) {
  return String(turn.index !== undefined ? turn.index : turn.turn);
}

function addTurn(turn) {
  const list = $("turns");
  const key = turnKey(turn);
  if (list.querySelector(`li[data-turn="${CSS.escape(key)}"]`)) return;  // replayed event
  const item = el("li");
  item.dataset.turn = key;
  const head = el("div", `Turn ${Number(turn.index ?? list.children.length) + 1}: ` +
                         `${turn.role || "agent"}`, "turn-head");
  const result = evalOf(turn);
  const verdict = describeResult(result);
  head.append(el("span", verdict.label, `badge ${verdict.kind}`));
  const speedup = speedupOf(result);
  if (speedup !== null) head.append(el("span", `${speedup.toFixed(2)}x`, "badge ok"));
  item.append(head);
  if (turn.candidate_source) {
    const details = el("details");
    details.append(el("summary", "Kernel"), el("pre", turn.candidate_source, "kernel"));
    item.append(details);
  } else {
    // a format failure: no kernel was found, so what the model wrote is what explains it
    if (turn.parse_failure) {
      item.append(el("div", `No kernel in the reply (${turn.parse_failure})`, "error"));
    }
    if (typeof turn.text === "string") {
      const details = el("details", undefined, "model-reply");
      details.open = true;
      details.append(el("summary", "What the model wrote (no kernel found in it)"),
                     el("pre", turn.text || "(an empty reply)", "reply"));
      item.append(details);
    }
  }
  if (turn.feedback) {
    item.append(el("div", "Tester's feedback", "hint"), el("pre", turn.feedback, "feedback"));
  }
  list.append(item);
}

function showResult(job) {
  const episode = (job && job.result && typeof job.result === "object") ? job.result : job;
  const best = episode.best_result || null;
  const verdict = episode.best_source ? describeResult(best) : { label: "no kernel", kind: "bad" };
  $("result-status").textContent = job.error ? `${verdict.label}: ${job.error}` : verdict.label;
  const speedup = speedupOf(best);
  $("result-speedup").textContent = speedup !== null ? `${speedup.toFixed(2)}x` : "not measured";
  $("result-arm").textContent = job.arm || "";
  $("result-kernel").textContent = episode.best_source || "";
  for (const turn of episode.turns || []) addTurn(turn);
  $("result").hidden = false;
}

// ---------------------------------------------------------------- jobs

// The server's error shapes: {"error": {"message"}} (OpenAI's) or {"detail"} (FastAPI's).
function errorMessage(body) {
  if (body && body.error && typeof body.error.message === "string") return body.error.message;
  if (body && typeof body.detail === "string") return body.detail;
  return body && body.detail ? JSON.stringify(body.detail) : "";
}

function parseData(text) {
  try { return JSON.parse(text); } catch (_) { return null; }
}

async function fetchJob(id) {
  const response = await fetch(`/v1/kernels/jobs/${encodeURIComponent(id)}`,
                               { headers: authHeaders() });
  if (!response.ok) throw new Error(`job ${id}: HTTP ${response.status}`);
  return response.json();
}

async function waitForJob(id) {
  for (;;) {
    const job = await fetchJob(id);
    for (const turn of job.turns || []) addTurn(turn);
    if (TERMINAL.has(String(job.status))) return job;
    setStatus(`job ${id}: ${job.status}`);
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

// EventSource cannot send an Authorization header: with an API key the page polls instead.
function followEvents(id) {
  if (apiKey()) return Promise.resolve();
  return new Promise((resolve) => {
    const source = new EventSource(`/v1/kernels/jobs/${encodeURIComponent(id)}/events`);
    const finish = () => { source.close(); resolve(); };
    const onData = (event) => {
      const data = parseData(event.data);
      if (!data || typeof data !== "object") return;
      const turn = data.turn && typeof data.turn === "object" ? data.turn : data;
      if (turn.role !== undefined) {
        addTurn(turn);
        setStatus(`job ${id}: turn ${$("turns").children.length} done`);
      } else if (TERMINAL.has(String(data.status))) {
        finish();
      }
    };
    source.onmessage = onData;
    source.addEventListener("turn", onData);
    for (const name of END_EVENTS) source.addEventListener(name, finish);
    // The server closes the stream when the job ends; EventSource would reconnect.
    source.onerror = finish;
  });
}

async function submit(event) {
  event.preventDefault();
  const text = $("source").value;
  if (!text.trim()) { setStatus("paste or upload a module first", true); return; }
  $("turns").replaceChildren();
  $("result").hidden = true;
  $("submit").disabled = true;
  try {
    setStatus("submitting ...");
    const response = await fetch("/v1/kernels/optimize", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify({ module: text, turns: Number($("turns-option").value) || 3 }),
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(errorMessage(body) || `HTTP ${response.status}`);
    const id = body.id || body.job_id;
    setStatus(`job ${id}: running`);
    await followEvents(id);
    const job = await waitForJob(id);
    showResult(job);
    setStatus(`job ${id}: ${job.status}`, TERMINAL.has(job.status) && /fail|error/.test(job.status));
  } catch (err) {
    setStatus(String(err.message || err), true);
  } finally {
    $("submit").disabled = false;
  }
}

// The server's limits bound the page's inputs (GET /v1/kernels/limits).
async function loadLimits() {
  const response = await fetch("/v1/kernels/limits", { headers: authHeaders() });
  if (!response.ok) return;
  const limits = await response.json();
  if (typeof limits.max_job_turns === "number") $("turns-option").max = String(limits.max_job_turns);
}

function loadFile() {
  const file = $("file").files[0];
  if (!file) return;
  file.text().then((text) => { $("source").value = text; });
}

// ---------------------------------------------------------------- A/B dashboard

function pct(x) { return typeof x === "number" ? `${(100 * x).toFixed(1)}%` : "-"; }
function num(x, digits) { return typeof x === "number" ? x.toFixed(digits) : "-"; }
function withCI(value, ci, fmt) {
  if (value === null || value === undefined) return "-";
  return ci ? `${fmt(value)} (${fmt(ci[0])} to ${fmt(ci[1])})` : fmt(value);
}

function verdictText(arm) {
  const test = arm.test || {};
  if (test.verdict === "control") return "control";
  if (test.verdict === "insufficient_data") return "insufficient data";
  const diff = typeof test.difference === "number" ? test.difference : null;
  const ci = test.interval;
  const detail = diff === null ? "" : ` (diff ${pct(diff)}${ci ? `, ${pct(ci[0])} to ${pct(ci[1])}` : ""})`;
  return `${test.verdict}${detail}`;
}

async function refreshAB() {
  const body = $("ab-table").tBodies[0];
  try {
    const response = await fetch("/v1/ab/status", { headers: authHeaders() });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const status = await response.json();
    $("ab-meta").textContent = `${status.arms.length} arm(s), ${status.outcomes} outcome(s); ` +
      `control: ${status.control || "none"}; alpha ${status.alpha}`;
    $("ab-meta").classList.remove("error");
    const rows = status.arms.map((arm) => {
      const tr = el("tr");
      tr.dataset.arm = arm.name;
      const cells = [
        arm.name + (arm.control ? " (control)" : ""),
        `${pct(arm.share)} (weight ${arm.weight})`,
        String(arm.n),
        withCI(arm.compiled_rate, arm.compiled_ci, pct),
        arm.n_known ? `${withCI(arm.correct_rate, arm.correct_ci, pct)} of ${arm.n_known}` : "not measured",
        withCI(arm.speedup_geomean, arm.speedup_ci, (x) => `${num(x, 2)}x`),
        withCI(arm.reward_mean, arm.reward_ci, (x) => num(x, 3)),
        verdictText(arm),
      ];
      for (const text of cells) tr.append(el("td", text));
      return tr;
    });
    body.replaceChildren(...rows);
  } catch (err) {
    $("ab-meta").textContent = `could not read /v1/ab/status: ${err.message || err}`;
    $("ab-meta").classList.add("error");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const tab of document.querySelectorAll("nav [role=tab]")) {
    tab.addEventListener("click", () => showTab(tab.dataset.panel));
  }
  $("optimize-form").addEventListener("submit", submit);
  $("file").addEventListener("change", loadFile);
  $("ab-refresh").addEventListener("click", refreshAB);
  $("api-key").value = sessionStorage.getItem("multiminddev-api-key") || "";
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem("multiminddev-api-key", apiKey());
    loadLimits().catch(() => {});
  });
  loadLimits().catch(() => {});
});
