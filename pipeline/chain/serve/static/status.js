// The status page of `sluice serve`: polls status.json once a second and renders it.
// No framework and no build step. Every value is written with textContent, never
// innerHTML, so nothing in a stream name or a hash can inject markup.
"use strict";

const POLL_MS = 1000;
const sections = new Map();  // stream name -> its <section>

function $(id) { return document.getElementById(id); }
function field(root, name) { return root.querySelector(`[data-field="${name}"]`); }
function setText(el, text) { if (el.textContent !== text) el.textContent = text; }

function fmtInt(n) { return n == null ? "–" : n.toLocaleString("en-US"); }
function fmtClock(ms) { return ms == null ? "–" : new Date(ms).toLocaleTimeString("en-GB"); }
function fmtDuration(ms) {
  if (ms == null) return "–";
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}
function fmtAge(ms, now) { return ms == null ? "–" : `${fmtDuration(now - ms)} ago`; }
function shortHash(h) { return h ? `${h.slice(0, 10)}…${h.slice(-4)}` : "–"; }
function msOf(id) { return id == null ? null : Number(id.split("-")[0]); }

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function segment(bar, cls, from, to, lo, hi, title) {
  const span = Math.max(1, hi - lo);
  const left = Math.max(0, Math.min(100, ((from - lo) / span) * 100));
  const right = Math.max(0, Math.min(100, ((to - lo) / span) * 100));
  const div = document.createElement("div");
  div.className = `seg ${cls}`;
  div.style.left = `${left}%`;
  if (cls !== "trim") div.style.width = `${Math.max(0, right - left)}%`;
  div.title = title;
  bar.appendChild(div);
}

function sectionFor(name) {
  let section = sections.get(name);
  if (!section) {
    section = $("stream-template").content.firstElementChild.cloneNode(true);
    section.dataset.stream = name;
    setText(field(section, "name"), name);
    $("streams").appendChild(section);
    sections.set(name, section);
  }
  return section;
}

function renderStream(s, now) {
  const root = sectionFor(s.name);
  const cov = s.coverage;
  const hot = s.redis;
  setText(field(root, "served"), s.served ? "served here" : "");
  setText(field(root, "head"), s.head ? fmtInt(s.head.num) : "–");
  setText(field(root, "head-hash"), s.head ? `${shortHash(s.head.hash)} · ${fmtAge(s.head.ms, now)}` : "no blocks yet");
  setText(field(root, "subscribers"), s.subscribers == null ? "–" : String(s.subscribers));
  setText(field(root, "blocks-seen"), `${fmtInt(s.blocks_seen)} blocks seen${s.invalid ? `, ${s.invalid} invalid` : ""}`);
  setText(field(root, "reorgs"), fmtInt(s.reorg_count));
  const last = s.reorgs[0];
  setText(field(root, "last-reorg"), last ? `last: depth ${last.depth} at ${fmtInt(last.new_num)}, ${fmtAge(last.ms, now)}` : "none seen");
  if (hot) {
    setText(field(root, "hot-length"), `${fmtInt(hot.length)} entries`);
    setText(field(root, "hot-span"), hot.first_id ? `${fmtClock(msOf(hot.first_id))} → ${fmtClock(msOf(hot.last_id))}` : "empty");
  } else {
    setText(field(root, "hot-length"), "?");
    setText(field(root, "hot-span"), "redis unavailable");
  }
  // a "run" of coverage is one contiguous archived stretch (not an Airflow run)
  setText(field(root, "archived"), `${cov.run_count} contiguous stretch${cov.run_count === 1 ? "" : "es"}, ${cov.gap_count} gap${cov.gap_count === 1 ? "" : "s"}`);
  setText(field(root, "archived-span"), cov.archived_to_ms == null ? "nothing archived yet"
    : `${fmtInt(cov.blocks)} blocks, ${fmtClock(cov.archived_from_ms)} → ${fmtClock(cov.archived_to_ms)}`);
  setText(field(root, "trim-point"), cov.trim_point_ms == null ? "–" : fmtClock(cov.trim_point_ms));
  setText(field(root, "trimmable"), cov.trimmable_to_ms == null ? "next trim: nothing (oldest entry not archived)"
    : `next trim up to ${fmtClock(cov.trimmable_to_ms)}`);

  // Timeline: from the oldest of (archived, in Redis) to now.
  const starts = [cov.archived_from_ms, cov.trim_point_ms].filter((v) => v != null);
  const lo = starts.length ? Math.min(...starts) : now - 60000;
  const hi = now;
  const lake = field(root, "lake-bar");
  const redisBar = field(root, "redis-bar");
  lake.replaceChildren();
  redisBar.replaceChildren();
  for (const [a, b] of cov.runs) segment(lake, "run", a, b, lo, hi, `archived ${fmtClock(a)} → ${fmtClock(b)}`);
  for (const [a, b] of cov.gaps) segment(lake, "gap", a, b, lo, hi, `gap ${fmtClock(a)} → ${fmtClock(b)}`);
  if (cov.trim_point_ms != null) {
    const top = msOf(hot && hot.last_id) || now;
    segment(redisBar, "hot", cov.trim_point_ms, top, lo, hi, `in Redis ${fmtClock(cov.trim_point_ms)} → ${fmtClock(top)}`);
    if (cov.unarchived_from_ms != null) segment(redisBar, "unarchived", cov.unarchived_from_ms, top, lo, hi, `not archived yet since ${fmtClock(cov.unarchived_from_ms)}`);
    segment(redisBar, "trim", cov.trim_point_ms, cov.trim_point_ms, lo, hi, `trim point ${fmtClock(cov.trim_point_ms)}`);
  }
  setText(field(root, "axis-start"), fmtClock(lo));
  setText(field(root, "axis-end"), `now ${fmtClock(hi)}`);

  const recent = field(root, "recent");
  recent.replaceChildren();
  for (const b of s.recent) {
    const tr = document.createElement("tr");
    if (b.reorg) tr.className = "reorged";
    cell(tr, fmtInt(b.num));
    cell(tr, shortHash(b.hash), "hash");
    cell(tr, shortHash(b.parent), "hash");
    cell(tr, fmtAge(b.ms, now));
    const note = cell(tr, "");
    if (b.reorg) {
      const badge = document.createElement("span");
      badge.className = "badge";
      badge.textContent = `reorg −${b.reorg}`;
      note.appendChild(badge);
    }
    recent.appendChild(tr);
  }
  const reorgs = field(root, "reorg-list");
  reorgs.replaceChildren();
  for (const r of s.reorgs) {
    const tr = document.createElement("tr");
    cell(tr, fmtAge(r.ms, now));
    cell(tr, fmtInt(r.old_head));
    cell(tr, fmtInt(r.new_num));
    cell(tr, String(r.depth));
    reorgs.appendChild(tr);
  }
  if (!s.reorgs.length) {
    const tr = document.createElement("tr");
    cell(tr, "none seen since the server started", "empty").colSpan = 4;
    reorgs.appendChild(tr);
  }
  const gaps = field(root, "gaps");
  gaps.replaceChildren();
  for (const [a, b] of cov.gaps) {
    const li = document.createElement("li");
    li.textContent = `${fmtClock(a)} → ${fmtClock(b)} (${fmtDuration(b - a)})`;
    gaps.appendChild(li);
  }
  if (!cov.gaps.length) {
    const li = document.createElement("li");
    li.className = "empty";
    li.textContent = cov.run_count ? "none: the archive is contiguous" : "nothing archived yet";
    gaps.appendChild(li);
  }
}

function render(data) {
  setText($("version"), `v${data.version}`);
  setText($("served"), data.served_stream);
  setText($("connections"), String(data.connections));
  setText($("subscriptions"), String(data.subscriptions));
  setText($("redis-state"), data.redis.up ? "up" : "down");
  setText($("lake-state"), data.lake.error ? data.lake.error : data.lake.uri);
  setText($("hot-retention"), fmtDuration(data.hot_retention_s * 1000));
  setText($("archive-cron"), data.archive_cron);
  const seen = new Set();
  for (const s of data.streams) {
    seen.add(s.name);
    renderStream(s, data.now_ms);
  }
  for (const [name, section] of sections) {
    if (!seen.has(name)) { section.remove(); sections.delete(name); }
  }
}

function setLive(ok, detail) {
  const live = $("live");
  live.dataset.state = ok ? "live" : "down";
  setText(live, ok ? `live · ${new Date().toLocaleTimeString("en-GB")}` : `disconnected: ${detail}`);
}

// With SLUICE_SERVE_TOKEN set the server wants the token: the page is opened as
// /?token=..., and passes it on as a bearer header (never in the JSON's URL).
const TOKEN = new URLSearchParams(window.location.search).get("token");
const HEADERS = TOKEN ? { Authorization: `Bearer ${TOKEN}` } : {};

async function poll() {
  try {
    const reply = await fetch("status.json", { cache: "no-store", headers: HEADERS });
    if (reply.status === 401) {
      throw new Error(TOKEN
        ? "the token in this page's URL is not the server's (SLUICE_SERVE_TOKEN)"
        : "this server needs its token: open this page as /?token=YOUR_TOKEN");
    }
    if (!reply.ok) throw new Error(`HTTP ${reply.status}`);
    render(await reply.json());
    setLive(true);
  } catch (err) {
    setLive(false, err.message || String(err));
  } finally {
    setTimeout(poll, POLL_MS);  // one request in flight at most, never a pile-up
  }
}

poll();
