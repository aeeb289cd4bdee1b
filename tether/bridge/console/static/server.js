// The server view (admin keys only): polls GET /console/api/server every second and shows the
// engine's own metrics; rates come from the difference between two snapshots.

import { ApiError, el, fmt, getJson } from "./api.js";
import { drawLines } from "./chart.js";

const $ = (id) => document.getElementById(id);
const PERIOD_MS = 1000;
let timer = null;
let prev = null;
const rates = [];

function status(text, cls = "") {
  $("v-status").textContent = text;
  $("v-status").className = `status ${cls}`;
}

export function startServerView() {
  if (timer) return;
  prev = null;
  poll();
  timer = setInterval(poll, PERIOD_MS);
}

export function stopServerView() {
  clearInterval(timer);
  timer = null;
}

function card(label, value, id) {
  return el("div", { class: "card" }, el("div", { class: "value", id }, value), el("div", { class: "label" }, label));
}

async function poll() {
  let snap;
  try {
    snap = await getJson("/console/api/server");
  } catch (err) {
    status(err instanceof ApiError && err.status === 403 ? "this key is not an admin key: the server view is for admin keys only" : `unavailable: ${err.message}`, "bad");
    stopServerView();
    return;
  }
  const dt = prev ? snap.time - prev.time : 0;
  const turnsPerS = prev && dt > 0 ? (snap.turns_total - prev.turns_total) / dt : null;
  if (turnsPerS !== null) {
    rates.push(turnsPerS);
    if (rates.length > 60) rates.shift();
  }
  const conns = Object.entries(snap.connections);
  const open = conns.reduce((a, [, v]) => a + v, 0);
  const errors = Object.values(snap.errors).reduce((a, b) => a + b, 0);
  status(`live, every ${PERIOD_MS / 1000} s · ${new Date(snap.time * 1000).toLocaleTimeString()}`, "ok");
  $("v-cards").replaceChildren(
    card(`connections (${conns.map(([k, v]) => `${k || "?"} ${v}`).join(", ") || "none"})`, fmt(open, 0), "v-connections"),
    card("active responses", fmt(snap.active_responses, 0), "v-active"),
    card("cache hit ratio", snap.cache.hit_ratio === null ? "–" : `${fmt(100 * snap.cache.hit_ratio, 1)}%`, "v-hit"),
    card("turns/s (last second)", fmt(turnsPerS, 1), "v-rate"),
    card("turns (completed / all)", `${fmt(snap.turns.completed || 0, 0)} / ${fmt(snap.turns_total, 0)}`, "v-turns"),
    card("errors", fmt(errors, 0), "v-errors-total"),
    card("resident memory", snap.process.resident_bytes ? `${fmt(snap.process.resident_bytes / 2 ** 20, 0)} MiB` : "–", "v-rss"));
  $("v-stages").replaceChildren(...Object.entries(snap.stages).map(([stage, s]) => {
    const p = prev?.stages?.[stage];
    const dc = p ? s.count - p.count : 0;
    const recent = dc > 0 ? (1000 * (s.sum_s - p.sum_s)) / dc : null;
    return el("tr", {}, el("td", {}, stage), el("td", {}, fmt(recent, 3)), el("td", {}, fmt(s.mean_ms, 3)), el("td", {}, fmt(s.count, 0)));
  }));
  const codes = Object.entries(snap.errors).sort((a, b) => b[1] - a[1]);
  $("v-errors").replaceChildren(...(codes.length ? codes.map(([code, n]) => el("tr", {}, el("td", {}, code), el("td", {}, fmt(n, 0))))
    : [el("tr", {}, el("td", { class: "muted" }, "none"), el("td", {}, ""))]));
  drawLines($("v-chart"), [{ name: "turns/s", cls: "ws", points: rates }], { yLabel: "turns/s", xLabel: "second" });
  prev = snap;
}
