// The status page: polls /api/v1/status and redraws. No libraries.
"use strict";

const $ = (id) => document.getElementById(id);
const fmtBytes = (b) => {
  if (b == null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return b.toFixed(i ? 1 : 0) + " " + u[i];
};
const fmt = (x, d) => (x == null ? "–" : Number(x).toFixed(d));

function cell(tr, text, cls) {
  const td = tr.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function ranks(s) {
  const body = $("ranks").tBodies[0];
  body.replaceChildren();
  for (const r of s.ranks) {
    const tr = body.insertRow();
    tr.dataset.rank = r.rank;
    cell(tr, r.rank);
    const st = cell(tr, r.state, "state " + r.state);
    if (r.reason) st.title = r.reason;
    cell(tr, r.epoch);
    cell(tr, r.batches);
    cell(tr, fmt(r.batch_ms, 1));
    const alive = r.state === "live" || r.state === "joined" || r.state === "ready";
    const age = r.heartbeat_age_seconds;
    cell(tr, age == null ? "–" : fmt(age, 1) + " s", age > 5 ? "stale" : "");
    const res = r.resources;
    const cpu = cell(tr, "", "procs");
    const mem = cell(tr, "", "procs");
    if (res && alive) {
      let cpuSum = 0, memSum = 0;
      for (const p of res.processes || []) {
        cpuSum += p.cpu_percent || 0;
        memSum += p.rss_bytes || 0;
        const who = p.role + (p.name ? " " + p.name : "");
        cpu.insertAdjacentHTML("beforeend", "<small></small>");
        cpu.lastChild.textContent = who + ": " + fmt(p.cpu_percent, 0) + "%";
        mem.insertAdjacentHTML("beforeend", "<small></small>");
        mem.lastChild.textContent = who + ": " + fmtBytes(p.rss_bytes);
      }
      cpu.prepend(fmt(cpuSum, 0) + "%");
      mem.prepend(fmtBytes(memSum));
    }
    const gpus = res && alive ? (res.gpus || []) : [];
    cell(tr, gpus.length ? gpus.map((g) => g.index + ": " + fmt(g.util_percent, 0) + "% " + fmtBytes(g.memory_used_bytes)).join(", ") : "–");
  }
}

// line draws series ([[x, y], ...] each, with a class) into an SVG.
function line(svg, series) {
  const W = 400, H = 160, L = 40, B = 18, T = 6, R = 6;
  const pts = series.flatMap((s) => s.points);
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const el = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text != null) e.textContent = text;
    svg.appendChild(e);
    return e;
  };
  el("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B });
  el("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B });
  if (!pts.length) return;
  let [x0, x1, y0, y1] = [Infinity, -Infinity, Infinity, -Infinity];
  for (const [x, y] of pts) { x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); }
  // The x labels name the data's first and last x, where they are drawn.
  const xs = [x0, x1];
  if (x1 === x0) { x0 -= 0.5; x1 += 0.5; }
  // A flat series (float noise included: 0.1 and 0.1000000001) gets a
  // span of its own, so the noise is not stretched into swings.
  const mag = Math.max(Math.abs(y0), Math.abs(y1));
  if (y1 - y0 <= mag * 1e-6) { const mid = (y0 + y1) / 2, pad = mag * 0.1 || 0.5; y0 = mid - pad; y1 = mid + pad; }
  else { const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad; } // points off the frame's edges
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - B - T);
  // As many digits as the two y labels need to differ.
  let digits = 3;
  while (digits < 12 && y1.toPrecision(digits) === y0.toPrecision(digits)) digits++;
  el("text", { x: 2, y: T + 8 }, y1.toPrecision(digits));
  el("text", { x: 2, y: H - B }, y0.toPrecision(digits));
  for (const x of new Set(xs)) el("text", { x: Math.min(sx(x), W - R - 30), y: H - 4 }, String(x));
  for (const s of series) {
    if (!s.points.length) continue;
    el("polyline", { class: s.cls, "data-points": s.points.length, points: s.points.map(([x, y]) => sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join(" ") });
    // A line through one point draws nothing: mark it.
    if (s.points.length === 1) el("circle", { class: s.cls, r: 3, cx: sx(s.points[0][0]).toFixed(1), cy: sy(s.points[0][1]).toFixed(1) });
  }
}

function curves(s) {
  const ep = s.epoch_curve || [], rd = s.round_curve || [];
  line($("epoch-loss"), [
    { cls: "train", points: ep.map((e) => [e.epoch, e.loss]) },
    { cls: "eval", points: ep.filter((e) => e.eval_loss != null).map((e) => [e.epoch, e.eval_loss]) },
  ]);
  line($("epoch-acc"), [{ cls: "eval", points: ep.filter((e) => e.accuracy != null).map((e) => [e.epoch, e.accuracy]) }]);
  line($("round-loss"), [{ cls: "train", points: rd.filter((r) => r.loss != null).map((r) => [r.round, r.loss]) }]);
  line($("round-ms-curve"), [{ cls: "train", points: rd.map((r) => [r.round, r.seconds * 1000]) }]);
}

// scalars draws one curve per trainer scalar, over the finished epochs.
function scalars(s) {
  const ep = s.epoch_curve || [];
  const names = [...new Set(ep.flatMap((e) => Object.keys(e.scalars || {})))].sort();
  const box = $("scalars");
  if (!names.length) return;
  for (const f of [...box.children]) {
    if (!names.includes(f.dataset.name)) f.remove();
  }
  for (const name of names) {
    let fig = [...box.children].find((f) => f.dataset.name === name);
    if (!fig) {
      fig = document.createElement("figure");
      fig.dataset.name = name;
      const cap = document.createElement("figcaption");
      cap.textContent = name + " per epoch";
      fig.appendChild(cap);
      fig.appendChild(document.createElementNS("http://www.w3.org/2000/svg", "svg")).setAttribute("viewBox", "0 0 400 160");
      box.appendChild(fig);
    }
    line(fig.querySelector("svg"), [{ cls: "train", points: ep.filter((e) => e.scalars && name in e.scalars).map((e) => [e.epoch, e.scalars[name]]) }]);
  }
}

// showList shows a list that has items, else its "none" line: an empty
// list is never an item of itself.
function showList(ol, none) {
  ol.hidden = !ol.children.length;
  none.hidden = !ol.hidden;
}

function decisions(s) {
  const c = s.controller || {};
  $("interval").textContent = c.interval ? c.interval + (c.adaptive ? " (adaptive)" : "") : "–";
  $("lr-scale").textContent = c.lr_scale != null ? fmt(c.lr_scale, 3) + (c.guard ? " (guard)" : "") : "–";
  $("divergence").textContent = fmt(c.divergence_ema, 4);
  const ol = $("decisions");
  ol.replaceChildren();
  for (const d of c.decisions || []) {
    const li = document.createElement("li");
    li.className = d.rule;
    let text = "round " + d.round + " (epoch " + d.epoch + ") " + d.rule + ": ";
    if (d.interval_from !== d.interval_to) text += "interval " + d.interval_from + " → " + d.interval_to + " ";
    if (d.lr_scale_from !== d.lr_scale_to) text += "lr × " + fmt(d.lr_scale_from, 3) + " → " + fmt(d.lr_scale_to, 3) + " ";
    if (d.divergence) text += "(divergence " + fmt(d.divergence, 4) + ")";
    li.textContent = text;
    ol.appendChild(li);
  }
  showList(ol, $("decisions-none"));
}

function timeline(s) {
  const ol = $("timeline");
  ol.replaceChildren();
  for (const m of s.membership || []) {
    const li = document.createElement("li");
    li.className = m.event;
    li.textContent = new Date(m.time).toLocaleTimeString() + " rank " + m.rank + " " + m.event + " in epoch " + m.epoch + ": " + m.reason;
    ol.appendChild(li);
  }
  showList(ol, $("timeline-none"));
}

function render(s) {
  $("run-id").textContent = s.run_id;
  $("status").textContent = s.status;
  $("epoch").textContent = s.epoch + " / " + s.epochs;
  $("live").textContent = s.live + " / " + s.world;
  $("step").textContent = s.global_step;
  $("rate").textContent = fmt(s.samples_per_second, 0);
  $("rounds").textContent = s.totals.rounds;
  $("round-ms").textContent = s.totals.rounds ? fmt((1000 * s.totals.round_seconds) / s.totals.rounds, 1) + " ms" : "–";
  $("bytes").textContent = fmtBytes(s.totals.bytes_averaged);
  $("progress").value = s.epoch_samples_total ? s.epoch_samples_done / s.epoch_samples_total : 0;
  $("error").hidden = !s.error;
  $("error").textContent = s.error || "";
  ranks(s);
  curves(s);
  scalars(s);
  decisions(s);
  timeline(s);
}

async function poll() {
  try {
    const r = await fetch("api/v1/status", { cache: "no-store" });
    if (r.ok) render(await r.json());
  } catch (e) {
    $("status").textContent = "unreachable";
  }
  setTimeout(poll, 500);
}
poll();
