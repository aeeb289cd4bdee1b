// The transport race: one lab workload (served by the server, the same one `tether bench` runs)
// played over HTTP with the full history resent every turn, and over WebSocket mode with
// previous_response_id + only the new items, side by side. The agent loop is the lab's
// (tether_lab/transports/base.py): send, stream the turn to its end, answer each tool call with
// the workload's output, repeat until the model answers in text.

import { authHeaders, el, fmt, getJson, kib, openSocket, utf8, wsFrameBytes } from "./api.js";
import { drawLines } from "./chart.js";

const $ = (id) => document.getElementById(id);
const SERVER_TIMING = "tether:server_timing";
const TERMINAL = new Set(["response.completed", "response.failed", "response.incomplete"]);

let workloads = [];

export async function initRace() {
  $("r-run").addEventListener("click", () => run().catch((err) => setStatus(`failed: ${err.message}`, "bad")));
  $("r-workload").addEventListener("change", describe);
  $("r-speed").addEventListener("input", describe);
}

export async function loadWorkloads() {
  workloads = (await getJson("/console/api/workloads")).data;
  const select = $("r-workload");
  const keep = select.value;
  select.replaceChildren(...workloads.map((w) => el("option", { value: w.name }, `${w.name} (${w.turns} turns)`)));
  if (keep) select.value = keep;
  describe();
}

function describe() {
  const w = workloads.find((x) => x.name === $("r-workload").value);
  $("r-desc").textContent = w ? `${w.description}. ${w.turns} model turns, ${w.tool_calls} tool calls; ` +
    `the simulated model plays it as the model tether-lab/${w.name}@${$("r-speed").value.trim() || "1000"}, ` +
    "the script tether bench runs for that workload and speed." : "";
}

function setStatus(text, cls = "") {
  $("r-status").textContent = text;
  $("r-status").className = `status ${cls}`;
}

function requestBody(wl, input, previous) {
  const body = { model: wl.model, instructions: wl.instructions, tools: wl.tools, input, store: false, include: [SERVER_TIMING] };
  if (previous) body.previous_response_id = previous;
  return body;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One HTTP turn: POST /v1/responses with stream=true, read the SSE stream to its terminal event.
async function httpTurn(body) {
  const text = JSON.stringify({ ...body, stream: true });
  const headers = { ...authHeaders(), "Content-Type": "application/json" };
  const bodyBytes = utf8.encode(text).length;
  // What the page writes: request line, its own headers (+ Content-Length), blank line, body.
  let sent = "POST /v1/responses HTTP/1.1\r\n".length + 2 + bodyBytes + `Content-Length: ${bodyBytes}\r\n`.length;
  for (const [k, v] of Object.entries(headers)) sent += k.length + v.length + 4;
  const t0 = performance.now();
  const resp = await fetch("/v1/responses", { method: "POST", headers, body: text, cache: "no-store" });
  if (!resp.ok) throw new Error(`HTTP ${resp.status}: ${(await resp.text()).slice(0, 200)}`);
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "", ttft = null, final = null, events = 0;
  while (!final) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let cut;
    while (!final && (cut = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (!data || data === "[DONE]") continue;  // [DONE] follows the terminal event (the spec's framing)
      const ev = JSON.parse(data);
      events += 1;
      if (ttft === null && ev.type.endsWith(".delta")) ttft = performance.now() - t0;
      if (ev.type === "error") throw new Error(`${ev.code || ev.error?.code}: ${ev.message || ev.error?.message}`);
      if (TERMINAL.has(ev.type)) final = ev.response;
    }
  }
  await reader.cancel().catch(() => {});
  if (!final) throw new Error("the stream ended without a terminal event");
  return { response: final, ttft, sent, events };
}

// WebSocket mode: one socket per rollout; each turn is one response.create frame.
class WsRollout {
  async open() {
    this.ws = await openSocket();
    this.waiting = null;
    this.ws.addEventListener("message", (m) => {
      const ev = JSON.parse(m.data);
      if (this.waiting) this.waiting(ev);
    });
  }

  turn(body) {
    const text = JSON.stringify({ type: "response.create", ...body });
    const sent = wsFrameBytes(utf8.encode(text).length);
    const t0 = performance.now();
    let ttft = null, events = 0;
    return new Promise((resolve, reject) => {
      this.waiting = (ev) => {
        events += 1;
        if (ttft === null && ev.type.endsWith(".delta")) ttft = performance.now() - t0;
        if (ev.type === "error") reject(new Error(`${ev.error?.code}: ${ev.error?.message}`));
        else if (TERMINAL.has(ev.type)) resolve({ response: ev.response, ttft, sent, events });
      };
      this.ws.send(text);
    });
  }

  close() {
    this.ws?.close(1000);
  }
}

function callsOf(r) {
  return (r.output || []).filter((i) => i.type === "function_call");
}

// The agent loop, once for both transports (mode "full" or "chained").
async function rollout(wl, mode, onTurn) {
  const ws = mode === "chained" ? new WsRollout() : null;
  const t0 = performance.now();
  if (ws) await ws.open();
  const connectMs = performance.now() - t0;
  let history = [], input = [wl.user_message], previous = null;
  try {
    for (let index = 0; index < wl.turns; index++) {
      const body = mode === "full" ? requestBody(wl, history.concat(input), null) : requestBody(wl, input, previous);
      const started = performance.now();
      const out = ws ? await ws.turn(body) : await httpTurn(body);
      const r = out.response;
      const calls = callsOf(r);
      onTurn({
        index, ms: performance.now() - started, ttft: out.ttft, sent: out.sent,
        cached: r.usage?.input_tokens_details?.cached_tokens ?? null, inputTokens: r.usage?.input_tokens ?? null,
        overhead: r.server_timing?.overhead_ms ?? null, id: r.id,
      });
      if (r.status !== "completed") throw new Error(`turn ${index}: response ${r.id} ended ${r.status}`);
      if (!calls.length) {
        if (index !== wl.turns - 1) throw new Error(`the model answered at turn ${index}; the workload has ${wl.turns} turns`);
        return { e2e: performance.now() - t0, connectMs };
      }
      const step = wl.steps[index];
      const got = calls.map((c) => c.name).join(","), want = step.calls.join(",");
      if (got !== want) throw new Error(`turn ${index}: the model called ${got}, the workload says ${want}`);
      const outputs = calls.map((c, j) => ({ type: "function_call_output", call_id: c.call_id, output: step.outputs[j] }));
      if (step.tool_ms) await sleep(step.tool_ms);
      if (mode === "full") history = history.concat(input, r.output);
      previous = r.id;
      input = outputs;
    }
    throw new Error(`no final answer after ${wl.turns} turns`);
  } finally {
    ws?.close();
  }
}

const sum = (xs) => xs.reduce((a, b) => a + b, 0);

function renderLane(box, wl, turns, done, error) {
  const ttfts = turns.map((t) => t.ttft).filter((x) => x !== null);
  const over = turns.map((t) => t.overhead).filter((x) => x !== null);
  const last = turns[turns.length - 1];
  box.replaceChildren(el("dl", {},
    el("dt", {}, "state"), el("dd", { class: "state" }, error ? `failed: ${error}` : done ? "done" : `turn ${turns.length}/${wl.turns}`),
    el("dt", {}, "end to end"), el("dd", { class: "e2e" }, done ? `${fmt(done.e2e / 1000, 2)} s` : "–"),
    el("dt", {}, "sum of turn times"), el("dd", {}, `${fmt(sum(turns.map((t) => t.ms)) / 1000, 2)} s`),
    el("dt", {}, "bytes sent"), el("dd", { class: "bytes" }, kib(sum(turns.map((t) => t.sent)))),
    el("dt", {}, "mean TTFT"), el("dd", {}, ttfts.length ? `${fmt(sum(ttfts) / ttfts.length, 1)} ms` : "–"),
    el("dt", {}, "server overhead (sum)"), el("dd", {}, over.length ? `${fmt(sum(over), 2)} ms` : "–"),
    el("dt", {}, "last turn cached_tokens"), el("dd", {}, last ? `${fmt(last.cached, 0)} of ${fmt(last.inputTokens, 0)}` : "–")));
}

async function run() {
  const name = $("r-workload").value;
  const speed = $("r-speed").value.trim() || "1000";
  $("r-run").disabled = true;
  setStatus("running…");
  try {
    const wl = await getJson(`/console/api/workloads/${encodeURIComponent(name)}?speed=${encodeURIComponent(speed)}`);
    const lanes = { full: [], chained: [] };
    const draw = () => {
      const series = (key) => [
        { name: "HTTP full", cls: "http", points: lanes.full.map((t) => t[key]) },
        { name: "WebSocket", cls: "ws", points: lanes.chained.map((t) => t[key]) },
      ];
      drawLines($("r-chart-time"), series("ms"), { yLabel: "ms" });
      drawLines($("r-chart-bytes"), series("sent"), { yLabel: "bytes" });
    };
    const boxes = { full: $("r-http"), chained: $("r-ws") };
    const results = {};
    const one = async (mode) => {
      renderLane(boxes[mode], wl, [], null, null);
      try {
        results[mode] = await rollout(wl, mode, (t) => {
          lanes[mode].push(t);
          renderLane(boxes[mode], wl, lanes[mode], null, null);
          draw();
        });
        renderLane(boxes[mode], wl, lanes[mode], results[mode], null);
      } catch (err) {
        renderLane(boxes[mode], wl, lanes[mode], null, err.message);
        throw err;
      }
    };
    await Promise.all([one("full"), one("chained")]);
    const h = results.full.e2e, w = results.chained.e2e;
    const bh = sum(lanes.full.map((t) => t.sent)), bw = sum(lanes.chained.map((t) => t.sent));
    setStatus(`done: WebSocket ${fmt(Math.abs(100 * (h - w)) / h, 1)}% ${w <= h ? "faster" : "slower"}, ` +
      `${fmt(bh / Math.max(1, bw), 1)}× fewer bytes sent`, "ok");
    document.body.dataset.raceDone = "1";
  } finally {
    $("r-run").disabled = false;
  }
}
