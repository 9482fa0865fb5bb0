// The p2ptrain dashboard: polls the node's /api/status and /api/history once a second and
// renders them. Every value from the swarm goes in as text (textContent), never as markup.
"use strict";

const POLL_MS = 1000;
const state = { status: null, history: null, metric: "rtt", cells: null };


// the smallest and largest of many numbers: Math.min(...values) passes each as an argument,
// and past ~120k (a large swarm's links) the call overflows the stack and the page stops
function extent(values) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return [lo, hi];
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}
const short = (id) => (id ? "…" + id.slice(-8) : "-");
const num = (v, digits) => (v === null || v === undefined ? "-" : Number(v).toFixed(digits));
function bytes(v) {
  if (v === null || v === undefined) return "-";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (v >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return v.toFixed(i ? 1 : 0) + " " + units[i];
}
const sum = (a, b) => (a === null || a === undefined) && (b === null || b === undefined)
  ? null : (a || 0) + (b || 0);

function renderSummary(s, h) {
  const alive = s.peers.filter((p) => p.alive).length;
  const last = h.points.length ? h.points[h.points.length - 1] : null;
  const parts = [
    `run ${s.run || "?"}`, `planner ${short(s.planner)}`, `term ${s.term}`,
    `${alive}/${s.peers.length} peers alive`,
  ];
  if (last) parts.push(`step ${last.step}`, `loss ${last.loss.toFixed(3)}`,
    `${Math.round(last.tokens_per_s)} tok/s`);
  // what the observing node waits for (control/waiting.py); "finished": the last step is trained
  if (s.finished) parts.push("finished");
  else if (s.waiting_for) parts.push(`waiting for ${s.waiting_for}`);
  document.getElementById("summary").textContent = parts.join("   ");
  document.getElementById("updated").textContent =
    "seen by " + short(s.observed_by) + " at " + new Date().toLocaleTimeString();
}

function renderPeers(s) {
  const body = el("tbody");
  for (const p of s.peers) {
    const m = p.metrics || {};
    const device = p.stage_compute ? p.stage_compute.device : (p.hardware.device || "-");
    const reach = p.reachability || p.hardware.reachability || "unknown";
    const row = el("tr", { "data-peer": p.id, title: p.id },
      el("td", {}, short(p.id)), el("td", {}, p.role), el("td", {}, reach), el("td", {}, device),
      el("td", {}, p.alive ? "yes" : "no"),
      el("td", {}, m.stage === null || m.stage === undefined ? "-" : `${m.stage}/${m.replica}`),
      el("td", {}, m.step ?? "-"), el("td", {}, num(m.loss, 3)), el("td", {}, num(m.tokens_per_s, 0)),
      el("td", {}, bytes(sum(m.bytes_sent, m.control_bytes_sent))),
      el("td", {}, bytes(sum(m.bytes_received, m.control_bytes_received))),
      el("td", { class: "started" }, p.started || "-"));
    if (!p.alive) row.classList.add("dead");
    if (p.planner) row.classList.add("planner");
    body.append(row);
  }
  document.getElementById("peers").tBodies[0].replaceWith(body);
}

function renderPlan(s, h) {
  const table = document.getElementById("plan");
  const head = el("thead"), body = el("tbody");
  const plan = s.plan;
  if (!plan) {
    table.tHead.replaceWith(head); table.tBodies[0].replaceWith(body);
    return;
  }
  const layers = plan.stage_layers.length ? plan.stage_layers : null;
  const top = el("tr", {}, el("th", {}, "pipeline"));
  for (let j = 0; j < plan.stages; j++)
    top.append(el("th", {}, `stage ${j}` + (layers ? ` (${layers[j]} blocks)` : "")));
  head.append(top);
  const byId = new Map(s.peers.map((p) => [p.id, p]));
  plan.pipelines.forEach((pipe, r) => {
    const row = el("tr", { "data-pipeline": r }, el("th", {}, `replica ${r}`));
    for (const id of pipe) {
      const peer = byId.get(id);
      const cell = el("td", { "data-peer": id, title: id }, short(id));
      if (peer && !peer.alive) cell.classList.add("slow");
      row.append(cell);
    }
    body.append(row);
  });
  table.tHead.replaceWith(head); table.tBodies[0].replaceWith(body);
  const predicted = plan.predicted_step_s, measured = h.measured_step_s;
  document.getElementById("plan-meta").textContent =
    `term ${plan.term} epoch ${plan.epoch} by ${short(plan.planner)}: ` +
    `${plan.pipelines.length} × ${plan.stages}, cost ${num(plan.cost_s, 3)} s; ` +
    `step predicted ${num(predicted, 2)} s, measured ${num(measured, 2)} s` +
    (plan.reason ? `; reason: ${plan.reason}` : "");
  // the spares' copies of the stages one peer alone holds: what a crash of that peer costs
  // (those made under this plan: a spare keeps its last plan's until it reports again)
  const spares = new Set(plan.spares);
  const underPlan = (m) => m && m.copies && m.copies_plan &&
    m.copies_plan[0] === plan.term && m.copies_plan[1] === plan.epoch;
  const copies = s.peers
    .filter((p) => spares.has(p.id) && underPlan(p.metrics))
    .flatMap((p) => p.metrics.copies.map((c) =>
      `L${c.first}-${c.end} of ${short(c.holder)} ` +
      (c.step === null ? "none yet" : `at step ${c.step}`) + ` on ${short(p.id)}`));
  document.getElementById("spares").textContent =
    (plan.spares.length ? "spares: " + plan.spares.map(short).join(", ") : "") +
    (copies.length ? "; copies: " + copies.join("; ") : "");
}

function planLinks(plan) {
  // pipeline hops and each stage's averaging group: the links a step's traffic crosses
  const used = new Set();
  if (!plan) return used;
  const key = (a, b) => (a < b ? a + " " + b : b + " " + a);
  for (const pipe of plan.pipelines)
    for (let j = 0; j + 1 < pipe.length; j++) used.add(key(pipe[j], pipe[j + 1]));
  for (let j = 0; j < plan.stages; j++)
    for (const a of plan.pipelines) for (const b of plan.pipelines)
      if (a[j] !== b[j]) used.add(key(a[j], b[j]));
  return used;
}

function heatColor(t) {
  // 0 (good) .. 1 (bad): green to yellow to red
  const h = 120 * (1 - Math.max(0, Math.min(1, t)));
  return `hsl(${h}, 70%, 50%)`;
}

function renderHeat(s) {
  const canvas = document.getElementById("heat");
  const ctx = canvas.getContext("2d");
  const ids = s.peers.map((p) => p.id);
  const n = ids.length;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  state.cells = null;
  if (n < 2) return;
  const index = new Map(ids.map((id, i) => [id, i]));
  const size = canvas.width / n;
  const values = [];
  for (const link of s.links) {
    const v = state.metric === "rtt" ? link.rtt_ms : link.bandwidth_mbps;
    if (v !== null && index.has(link.a) && index.has(link.b)) values.push(v);
  }
  const [lo, hi] = extent(values);
  const unit = state.metric === "rtt" ? "ms" : "Mbit/s";
  const [good, bad] = state.metric === "rtt" ? [lo, hi] : [hi, lo];
  const scale = document.getElementById("heat-scale");
  scale.replaceChildren();
  if (values.length)
    scale.append(`${num(good, 1)} ${unit} `, el("span", { class: "legend" }), ` ${num(bad, 1)} ${unit}`);
  const cells = new Map();
  for (const link of s.links) {
    const i = index.get(link.a), j = index.get(link.b);
    if (i === undefined || j === undefined) continue;
    const v = state.metric === "rtt" ? link.rtt_ms : link.bandwidth_mbps;
    let t = values.length && hi > lo ? (v - lo) / (hi - lo) : 0.5;
    if (state.metric === "rate") t = 1 - t;  // a high rate is good
    ctx.fillStyle = v === null ? "#d0d5da" : heatColor(t);
    for (const [x, y] of [[i, j], [j, i]]) {
      ctx.fillRect(x * size, y * size, Math.ceil(size), Math.ceil(size));
      cells.set(x + "," + y, link);
    }
    if (link.estimated) {
      // estimated from coordinates and capacities, not measured: hatched
      ctx.strokeStyle = "rgba(255, 255, 255, 0.8)";
      ctx.lineWidth = 1;
      for (const [x, y] of [[i, j], [j, i]]) {
        ctx.beginPath();
        ctx.moveTo(x * size, (y + 1) * size);
        ctx.lineTo((x + 1) * size, y * size);
        ctx.stroke();
      }
    }
  }
  const numEstimated = s.links.filter((link) => link.estimated).length;
  if (numEstimated) scale.append(` (hatched: ${numEstimated} links estimated, not measured)`);
  const used = planLinks(s.plan);
  ctx.strokeStyle = "#1d2329";
  ctx.lineWidth = Math.min(3, Math.max(1, size / 8));
  for (const k of used) {
    const [a, b] = k.split(" ");
    const i = index.get(a), j = index.get(b);
    if (i === undefined || j === undefined) continue;
    for (const [x, y] of [[i, j], [j, i]])
      ctx.strokeRect(x * size + 1, y * size + 1, size - 2, size - 2);
  }
  state.cells = { cells, size, used, count: n };
  canvas.dataset.peers = String(n);
  canvas.dataset.estimatedLinks = String(numEstimated);
  canvas.dataset.planLinks = String(used.size);
}

function onHeatHover(event) {
  const info = document.getElementById("heat-info");
  if (!state.cells) return;
  const rect = event.target.getBoundingClientRect();
  const x = Math.floor((event.clientX - rect.left) / state.cells.size);
  const y = Math.floor((event.clientY - rect.top) / state.cells.size);
  const link = state.cells.cells.get(x + "," + y);
  if (!link) { info.textContent = ""; return; }
  const inPlan = state.cells.used.has(link.a < link.b ? link.a + " " + link.b : link.b + " " + link.a);
  info.textContent = `${short(link.a)} ↔ ${short(link.b)}: RTT ${num(link.rtt_ms, 1)} ms, ` +
    `${num(link.bandwidth_mbps, 1)} Mbit/s, ` +
    (link.estimated ? `estimated (coordinates ${num(link.age_s, 0)} s old)` :
      `measured ${num(link.age_s, 0)} s ago`) +
    (inPlan ? " (used by the plan)" : "");
}

function chart(id, points, key, label, cls) {
  const w = 600, h = 160, pad = 34;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.dataset.points = String(points.length);
  const text = (x, y, s, anchor) => {
    const t = document.createElementNS(svg.namespaceURI, "text");
    t.setAttribute("x", x); t.setAttribute("y", y);
    if (anchor) t.setAttribute("text-anchor", anchor);
    t.textContent = s; svg.append(t);
  };
  const axis = document.createElementNS(svg.namespaceURI, "path");
  axis.setAttribute("class", "axis");
  axis.setAttribute("d", `M${pad},8 V${h - pad} H${w - 8}`);
  svg.append(axis);
  text(pad, 8, label);
  text(w - 8, h - 6, "seconds (steps at the ends)", "end");
  if (points.length) {
    const t0 = points[0].t;
    const ys = points.map((p) => p[key]), xs = points.map((p) => p.t - t0);
    const [x0, xHi] = extent(xs), [y0, yHi] = extent(ys);
    const x1 = Math.max(xHi, x0 + 1), y1 = Math.max(yHi, y0 + 1e-9);
    const X = (v) => pad + (v - x0) / (x1 - x0) * (w - pad - 8);
    const Y = (v) => h - pad - (v - y0) / (y1 - y0) * (h - pad - 16);
    const line = document.createElementNS(svg.namespaceURI, "polyline");
    line.setAttribute("class", "line " + cls);
    line.setAttribute("points", points.map((p) => `${X(p.t - t0).toFixed(1)},${Y(p[key]).toFixed(1)}`).join(" "));
    svg.append(line);
    text(pad - 4, Y(y1) + 4, y1.toPrecision(3), "end");
    text(pad - 4, Y(y0), y0.toPrecision(3), "end");
    const last = points[points.length - 1];
    text(pad, h - pad + 14, `0 s (step ${points[0].step})`);
    text(w - 8, h - pad + 14, `${Math.round(last.t - t0)} s (step ${last.step})`, "end");
  }
  document.getElementById(id).replaceChildren(svg);
}

function renderEvents(h) {
  const list = el("ul", { id: "events" });
  for (const e of h.events.slice().reverse()) {
    const time = new Date(e.t * 1000).toLocaleTimeString();
    list.append(el("li", { class: e.kind }, `${time}  ${e.text}`));
  }
  document.getElementById("events").replaceWith(list);
}

function render() {
  const s = state.status, h = state.history;
  if (!s || !h) return;
  const started = performance.now();
  renderSummary(s, h);
  renderPeers(s);
  renderPlan(s, h);
  renderHeat(s);
  chart("loss", h.points, "loss", "loss", "loss");
  chart("tokens", h.points, "tokens_per_s", "tokens/s", "tokens");
  renderEvents(h);
  window.p2ptrainRenderMs = performance.now() - started;
  window.p2ptrainRenders = (window.p2ptrainRenders || 0) + 1;
}

async function poll() {
  try {
    const [status, history] = await Promise.all(
      ["/api/status", "/api/history"].map((u) => fetch(u, { cache: "no-store" }).then((r) => r.json())));
    if (status) { state.status = status; state.history = history; render(); }
    else document.getElementById("summary").textContent = "the node has no status yet";
  } catch (err) {
    document.getElementById("summary").textContent = "cannot reach the node: " + err;
  }
  setTimeout(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("link-metric").addEventListener("change", (e) => {
    state.metric = e.target.value; render();
  });
  document.getElementById("heat").addEventListener("mousemove", onHeatHover);
  poll();
});
