// deployd dashboard: renders what the dashboard process pushes over
// server-sent events (snapshot, update, events, logs). Read-only; every
// value from the agent goes into the page as text, never as markup.
"use strict";

const MAX_EVENTS = 500, MAX_LOG = 200;
const S = { agent: null, apps: new Map(), order: [], samples: new Map(), error: "", poll: 1000, seen: new Set() };
const $ = (id) => document.getElementById(id);
const sections = new Map(); // app name -> {root, head, notes, workers, log}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmtBytes(b) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : String(b)) + " " + u[i];
}

function fmtDur(s) {
  s = Math.max(0, Math.floor(s));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  if (s < 172800) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  return Math.floor(s / 86400) + "d";
}

function fmtTime(ms) {
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}

const SVGNS = "http://www.w3.org/2000/svg";
// plot draws samples (oldest first) of one reading as a line over the
// last window milliseconds; lo..hi is the vertical range.
function plot(samples, key, lo, hi, window) {
  const svg = document.createElementNS(SVGNS, "svg");
  svg.setAttribute("viewBox", "0 0 100 20");
  svg.setAttribute("preserveAspectRatio", "none");
  if (samples.length > 0) {
    const end = samples[samples.length - 1].t, span = Math.max(hi - lo, 1e-9);
    const pts = samples.filter((s) => s.t >= end - window).map((s) => {
      const x = 100 - ((end - s.t) / window) * 100;
      const y = 19 - ((s[key] - lo) / span) * 18;
      return x.toFixed(2) + "," + y.toFixed(2);
    });
    if (pts.length === 1) pts.unshift("99," + pts[0].split(",")[1]);
    const line = document.createElementNS(SVGNS, "polyline");
    line.setAttribute("points", pts.join(" "));
    svg.appendChild(line);
  }
  return svg;
}

function section(name) {
  let s = sections.get(name);
  if (s) return s;
  const root = el("section", "app");
  root.dataset.app = name;
  const head = el("div", "app-head");
  const notes = el("div");
  const workers = el("div", "workers");
  const det = el("details", "logs");
  det.open = true;
  det.appendChild(el("summary", "", "log (stdout, stderr in red)"));
  const log = el("div", "log");
  log.dataset.app = name;
  det.appendChild(log);
  root.append(head, notes, workers, det);
  s = { root, head, notes, workers, log };
  sections.set(name, s);
  return s;
}

function renderApps() {
  const box = $("apps");
  $("noapps").hidden = S.order.length > 0;
  if (S.agent && S.agent.pid && S.order.length === 0) $("noapps").textContent = "no apps configured";
  for (const [name, s] of sections) {
    if (!S.apps.has(name)) { s.root.remove(); sections.delete(name); }
  }
  let prev = $("noapps");
  for (const name of S.order) {
    const a = S.apps.get(name);
    if (!a) continue;
    const s = section(name);
    // The agent's order; a section is moved only when out of place
    // (moving it would reset its log's scroll position).
    if (prev.nextSibling !== s.root) box.insertBefore(s.root, prev.nextSibling);
    prev = s.root;
    renderApp(a, s);
  }
}

function renderApp(a, s) {
  const now = performance.now();
  const head = [el("h2", "", a.name), el("span", "badge st-" + a.state, a.state)];
  head[1].dataset.role = "app-state";
  const n = a.workers ? a.workers.length : 0;
  let meta = "release " + (a.release || "none") + " · " + a.instances + " instances";
  if (a.scaled) meta += " (scaled to " + a.scaled + ")";
  meta += " · " + a.restarts + " restarts";
  if (a.listen && a.listen.length) meta += " · " + a.listen.join(", ");
  head.push(el("span", "muted", meta));
  s.head.replaceChildren(...head);

  const notes = [];
  if (a.canary) {
    const c = a.canary;
    const held = (Date.now() - Date.parse(c.since)) / 1000;
    let t = "canary " + c.release + " on slot" + (c.slots.length > 1 ? "s " : " ") + c.slots.join(", ") +
      " beside " + (c.previous || "none") + ", held " + fmtDur(held);
    if (c.timeout_seconds) t += " of " + fmtDur(c.timeout_seconds) + " (then " + (c.action || "abort") + ")";
    if (c.ending) t += " — " + c.ending;
    const d = el("div", "note", t);
    d.dataset.role = "canary";
    notes.push(d);
  } else if (a.last_canary) {
    const c = a.last_canary;
    notes.push(el("div", "note", "last canary " + c.release + ": " + c.outcome + " by " + c.by + (c.reason ? " (" + c.reason + ")" : "")));
  }
  for (const w of a.warnings || []) notes.push(el("div", "note bad", "listener " + w));
  if (a.state === "errored" && a.last_exit) {
    notes.push(el("div", "note bad", "crashed too often; last exit: " + a.last_exit +
      (a.last_lines ? "\n" + a.last_lines.join("\n") : "") + "\nfix it, then `deployd restart " + a.name + "`"));
  }
  s.notes.replaceChildren(...notes);

  const cards = [];
  for (const w of a.workers || []) cards.push(workerCard(a, w, now));
  if (n === 0) cards.push(el("div", "muted", a.state === "stopped" ? "stopped" : "no workers"));
  s.workers.replaceChildren(...cards);
}

// plotWindow is the time every plot spans: since the oldest sample, at
// least a minute, at most the history the dashboard keeps.
function plotWindow() {
  let oldest = Infinity, newest = 0;
  for (const arr of S.samples.values()) {
    if (arr.length) { oldest = Math.min(oldest, arr[0].t); newest = Math.max(newest, arr[arr.length - 1].t); }
  }
  const span = isFinite(oldest) ? newest - oldest : 0;
  return Math.min(Math.max(span, 60000), 300 * S.poll);
}

function workerCard(a, w, now) {
  const card = el("div", "worker w-" + w.state);
  card.dataset.pid = w.pid;
  card.dataset.slot = w.slot;
  card.dataset.state = w.state;
  if (!S.seen.has(w.pid)) { S.seen.add(w.pid); if (S.primed) card.classList.add("new"); }
  const head = el("div", "w-head");
  head.append(el("b", "", "#" + w.slot), el("span", "pid", "pid " + w.pid), el("span", "badge st-" + w.state, w.state));
  const up = w.uptime_seconds + (now - a._recv) / 1000;
  let meta = (w.release || "no release") + " · up " + fmtDur(up) + " · " + w.restarts + " restart" + (w.restarts === 1 ? "" : "s");
  if (w.status && w.state !== "ready") meta += " · " + w.status;
  if (w.health_error) meta += " · health: " + w.health_error;
  if (w.recycle_in_seconds !== undefined) {
    const left = w.recycle_in_seconds - (now - a._recv) / 1000;
    meta += left > 0 ? " · recycled in " + fmtDur(left) : " · recycling";
  }
  const samples = S.samples.get(String(w.pid)) || [];
  const window = plotWindow();
  const last = samples.length ? samples[samples.length - 1] : { c: w.cpu_percent, r: w.rss_bytes };
  let cmax = 5, rmin = Infinity, rmax = 0;
  for (const s of samples) { cmax = Math.max(cmax, s.c); rmin = Math.min(rmin, s.r); rmax = Math.max(rmax, s.r); }
  if (!isFinite(rmin)) rmin = 0;
  const pad = Math.max((rmax - rmin) * 0.1, 512 * 1024);
  const cpu = el("div", "plot cpu");
  cpu.title = "CPU, last " + fmtDur(window / 1000) + " (top: " + cmax.toFixed(0) + "%)";
  cpu.append(el("span", "", "CPU " + last.c.toFixed(1) + "%"), plot(samples, "c", 0, cmax, window));
  const rss = el("div", "plot rss");
  rss.title = "RSS, last " + fmtDur(window / 1000);
  rss.append(el("span", "", "RSS " + fmtBytes(last.r)), plot(samples, "r", Math.max(0, rmin - pad), rmax + pad, window));
  card.append(head, el("div", "w-meta", meta), cpu, rss);
  return card;
}

function addEvents(evs, initial) {
  const tl = $("timeline");
  for (const e of evs) {
    const li = el("li", "ev k-" + e.kind);
    li.dataset.kind = e.kind;
    if (e.pid) li.dataset.pid = e.pid;
    if (e.app) li.dataset.app = e.app;
    li.append(el("time", "", fmtTime(e.t)));
    if (e.app) li.append(el("b", "", e.app));
    li.append(document.createTextNode(e.text));
    tl.insertBefore(li, tl.firstChild);
  }
  while (tl.childNodes.length > MAX_EVENTS) tl.removeChild(tl.lastChild);
}

function addLogs(lines) {
  // Whether each log box was scrolled to its end is read before the lines
  // go in: a box at its end follows the new lines, one scrolled up stays.
  const stick = new Map();
  for (const l of lines) {
    const s = sections.get(l.app);
    if (!s) continue;
    if (!stick.has(s)) stick.set(s, s.log.scrollTop + s.log.clientHeight >= s.log.scrollHeight - 4);
    const d = el("div", "ll s-" + l.s);
    d.dataset.stream = l.s;
    if (l.s !== "skip") d.append(el("span", "tag", l.s));
    d.append(document.createTextNode(l.line));
    s.log.appendChild(d);
  }
  for (const [s, end] of stick) {
    while (s.log.childNodes.length > MAX_LOG) s.log.removeChild(s.log.firstChild);
    if (end) s.log.scrollTop = s.log.scrollHeight;
  }
}

function setAgent(agent, error) {
  S.agent = agent;
  S.error = error || "";
  if (agent && agent.pid) {
    $("agent").textContent = "agent " + agent.version + " · pid " + agent.pid + " · rss " + fmtBytes(agent.rss_bytes);
  }
  const b = $("error");
  b.hidden = !S.error;
  b.textContent = S.error ? "agent unreachable: " + S.error + " (showing the last status; retrying every second)" : "";
}

function onSnapshot(snap) {
  S.poll = snap.poll_ms || 1000;
  S.apps.clear();
  S.samples.clear();
  const now = performance.now();
  for (const a of snap.apps || []) { a._recv = now; S.apps.set(a.name, a); }
  S.order = (snap.apps || []).map((a) => a.name);
  for (const [pid, s] of Object.entries(snap.samples || {})) S.samples.set(pid, s);
  setAgent(snap.agent, snap.error);
  for (const s of sections.values()) s.log.replaceChildren();
  renderApps();
  $("timeline").replaceChildren();
  addEvents(snap.events || [], true);
  for (const ls of Object.values(snap.logs || {})) addLogs(ls);
  S.primed = true;
}

function onUpdate(u) {
  const now = performance.now();
  setAgent(u.agent, u.error);
  if (u.error) return;
  S.order = u.order || [];
  for (const a of u.apps || []) { a._recv = now; S.apps.set(a.name, a); }
  for (const name of [...S.apps.keys()]) if (!S.order.includes(name)) S.apps.delete(name);
  const live = new Set();
  for (const [pid, s] of Object.entries(u.samples || {})) {
    live.add(pid);
    let arr = S.samples.get(pid);
    if (!arr) { arr = []; S.samples.set(pid, arr); }
    arr.push(s);
    if (arr.length > 300) arr.shift();
  }
  for (const pid of [...S.samples.keys()]) if (!live.has(pid)) S.samples.delete(pid);
  // Uptimes of apps that were not sent again go on from when they were.
  renderApps();
}

function connect() {
  const conn = $("conn");
  const es = new EventSource("events");
  const on = (name, fn) => es.addEventListener(name, (m) => fn(JSON.parse(m.data)));
  on("snapshot", onSnapshot);
  on("update", onUpdate);
  on("events", (evs) => addEvents(evs, false));
  on("logs", addLogs);
  es.onopen = () => { conn.textContent = "live"; conn.className = "conn on"; };
  es.onerror = () => { conn.textContent = "reconnecting…"; conn.className = "conn off"; };
}

connect();
