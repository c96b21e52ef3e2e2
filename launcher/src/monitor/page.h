// The live page MonitorServer serves at /: one HTML file with its style and script inline, which
// polls /api/state every half second and draws the job from it (textContent only: a rank's
// output can never become markup). It loads nothing from anywhere else.
#pragma once

namespace trainrun::launcher::monitor {

inline constexpr char kPage[] = R"PAGE(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>trainrun</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#1d2330;background:#f7f8fa}
h1{font-size:18px;margin:0 0 4px} .sub{color:#5b6474;margin-bottom:12px}
.line{padding:6px 10px;border-radius:6px;margin:6px 0;font-family:ui-monospace,monospace;font-size:13px;white-space:pre-wrap}
#straggler{background:#fff3cd;border:1px solid #e0b400} #stall{background:#fde2e1;border:1px solid #d9534f}
#summary{background:#eceff4;border:1px solid #9aa4b5}
table{border-collapse:collapse;width:100%;background:#fff;margin-bottom:14px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #e3e6eb;font-size:13px}
th{background:#eef1f5;font-weight:600} td.num{text-align:right;font-variant-numeric:tabular-nums}
td.out{font-family:ui-monospace,monospace;max-width:420px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
tr.straggler{background:#fff3cd} tr.straggler td.rank::after{content:" straggler";color:#b07d00;font-weight:600}
.state-stalled{color:#c9302c;font-weight:700} .state-running{color:#2e7d32} .state-waiting{color:#b07d00}
.state-exited{color:#5b6474} .host{font-weight:600;margin:10px 0 4px}
svg{background:#fff;border:1px solid #e3e6eb} .legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}
a{color:#2a5bd7}
</style></head><body>
<h1 id="title">trainrun</h1><div class="sub" id="sub">connecting…</div>
<div id="straggler" class="line" hidden></div><div id="stall" class="line" hidden></div>
<div id="summary" class="line" hidden></div>
<div id="hosts"></div>
<h2 style="font-size:15px">Timeline <span class="legend"><span style="background:#4f7bd9"></span>in collectives<span style="background:#f0a030"></span>waiting for the last rank<span style="background:#d9534f"></span>arrived last</span></h2>
<svg id="timeline" width="900" height="40"></svg>
<p><a href="trace.json" download>Download the whole trace</a> (Chrome/Perfetto JSON, when trainrun runs with --timeline-filename)</p>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
function el(tag, cls, text) { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; }
function bytes(n) { const u = ["B","KiB","MiB","GiB","TiB"]; let i = 0; while (n >= 1024 && i < 4) { n /= 1024; i++; } return (i ? n.toFixed(1) : n.toFixed(0)) + " " + u[i]; }
function pct(x) { return (100 * x).toFixed(0) + "%"; }
function stateClass(s) { if (s === "stalled") return "state-stalled"; if (s.startsWith("waiting")) return "state-waiting"; if (s === "running") return "state-running"; return "state-exited"; }
function show(id, text) { const e = $(id); e.hidden = !text; e.textContent = text || ""; }
let failures = 0;
function draw(s) {
  document.title = "trainrun " + s.job.id;
  $("title").textContent = "trainrun job " + s.job.id + ": " + s.job.command;
  $("sub").textContent = s.job.size + " ranks" + (s.job.ended ? ", ended" : ", running for " + s.job.now.toFixed(0) + " s") +
      (s.job.restarts ? ", restarted " + s.job.restarts + "×" : "") + (s.job.membership_changes ? ", " + s.job.membership_changes + " membership changes" : "");
  show("straggler", s.job.straggler); show("stall", s.job.stall); show("summary", s.job.summary);
  const byHost = new Map();
  for (const r of s.ranks) { if (!byHost.has(r.host)) byHost.set(r.host, []); byHost.get(r.host).push(r); }
  const hosts = el("div"); hosts.id = "hosts";
  for (const [host, ranks] of byHost) {
    hosts.appendChild(el("div", "host", "host " + host));
    const t = el("table"); const head = el("tr");
    const gpus = ranks.some(r => r.gpu >= 0);
    for (const h of ["rank","state","coll/s","bytes/s","waiting","last to arrive","CPU","RSS"].concat(gpus ? ["GPU","GPU memory"] : [], ["last line"])) head.appendChild(el("th", "", h));
    t.appendChild(head);
    for (const r of ranks) {
      const tr = el("tr", "rank" + (s.job.straggler_ranks.includes(r.rank) ? " straggler" : "")); tr.id = "rank-" + r.rank; tr.dataset.state = r.state;
      tr.appendChild(el("td", "rank", String(r.rank)));
      tr.appendChild(el("td", "state " + stateClass(r.state), r.state));
      tr.appendChild(el("td", "num", r.collectives_per_s.toFixed(0)));
      tr.appendChild(el("td", "num", bytes(r.bytes_per_s) + "/s"));
      tr.appendChild(el("td", "num", pct(r.wait_share)));
      tr.appendChild(el("td", "num", pct(r.last_share)));
      tr.appendChild(el("td", "num", pct(r.cpu)));
      tr.appendChild(el("td", "num", bytes(r.rss)));
      if (gpus) { tr.appendChild(el("td", "num gpu", r.gpu >= 0 ? pct(r.gpu) : "-")); tr.appendChild(el("td", "num", r.gpu >= 0 ? bytes(r.gpu_memory) : "-")); }
      tr.appendChild(el("td", "out", r.line));
      t.appendChild(tr);
    }
    hosts.appendChild(t);
  }
  $("hosts").replaceWith(hosts);
  drawTimeline(s);
}
function drawTimeline(s) {
  const svg = $("timeline"), ns = "http://www.w3.org/2000/svg", track = 18, left = 60, width = 840, span = 60;
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  svg.setAttribute("height", String(s.ranks.length * track + 4));
  const now = s.job.now;
  for (const r of s.ranks) {
    const y = 2 + r.rank * track;
    const label = document.createElementNS(ns, "text"); label.setAttribute("x", "4"); label.setAttribute("y", String(y + 13)); label.setAttribute("font-size", "12");
    label.textContent = "rank " + r.rank; svg.appendChild(label);
    let prev = null;
    for (const [t, busy, waited, last] of r.timeline) {
      const t0 = prev === null ? t - 1 : prev; prev = t;
      if (t < now - span) continue;
      const x0 = left + width * Math.max(0, (t0 - (now - span)) / span), x1 = left + width * ((t - (now - span)) / span), w = Math.max(1, x1 - x0);
      const bar = (h, color, yy) => { const b = document.createElementNS(ns, "rect"); b.setAttribute("x", x0.toFixed(1)); b.setAttribute("width", w.toFixed(1)); b.setAttribute("y", yy.toFixed(1)); b.setAttribute("height", h.toFixed(1)); b.setAttribute("fill", color); svg.appendChild(b); };
      bar((track - 4) * busy, "#4f7bd9", y + (track - 4) * (1 - busy));
      bar((track - 4) * waited, "#f0a030", y + (track - 4) * (1 - waited));
      if (last > 0.5) bar(3, "#d9534f", y);
    }
  }
}
async function poll() {
  try {
    const res = await fetch("api/state", {cache: "no-store", credentials: "same-origin"});
    if (!res.ok) throw new Error(await res.text());
    failures = 0; const s = await res.json(); draw(s);
    setTimeout(poll, s.job.ended ? 5000 : 500);
  } catch (e) {
    failures++; $("sub").textContent = failures > 2 ? "trainrun is not answering (the job may have ended): " + e.message : "reconnecting…";
    setTimeout(poll, 1000);
  }
}
poll();
</script></body></html>
)PAGE";

}  // namespace trainrun::launcher::monitor
