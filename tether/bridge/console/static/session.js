// The session view: one WebSocket-mode connection, turns sent by hand, every event on a timeline.

import { el, fmt, openSocket } from "./api.js";

const SAMPLE_TOOLS = [
  {
    type: "function", name: "get_weather", description: "Current weather for a city.",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
  {
    type: "function", name: "read_file", description: "Read a file of the project.",
    parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
  },
];
// The tool calls a response can make, each with the item type that answers it (function calls
// and custom (freeform) tool calls, as tether/protocol/calls.py has them).
const CALL_OUTPUT = { function_call: "function_call_output", custom_tool_call: "custom_tool_call_output" };
const TERMINAL = new Set(["response.completed", "response.failed", "response.incomplete"]);
const MAX_ROWS = 600;

const $ = (id) => document.getElementById(id);

let ws = null;
const lanes = new Map(); // lane -> {last: response id, started: ms of its turn's create, first: bool}
const chain = []; // [{id, prev, lane, status}]

export function initSession() {
  $("s-tools").value = JSON.stringify(SAMPLE_TOOLS, null, 1);
  $("ws-connect").addEventListener("click", () => (ws ? disconnect() : connect()));
  $("s-send").addEventListener("click", () => sendTurn(userInput()));
}

function status(text, cls = "") {
  const s = $("ws-status");
  s.textContent = text;
  s.className = `status ${cls}`;
}

async function connect() {
  status("connecting…");
  try {
    ws = await openSocket();
  } catch (err) {
    ws = null;
    status(`not connected: ${err.message}`, "bad");
    return;
  }
  status(`connected (${ws.protocol})`, "ok");
  $("ws-connect").textContent = "Disconnect";
  $("s-send").disabled = false;
  ws.addEventListener("message", (m) => onEvent(JSON.parse(m.data)));
  ws.addEventListener("close", (e) => {
    ws = null;
    status(`closed (${e.code}${e.reason ? ` ${e.reason}` : ""})`, e.code === 1000 ? "" : "bad");
    $("ws-connect").textContent = "Connect";
    $("s-send").disabled = true;
  });
}

function disconnect() {
  if (ws) ws.close(1000);
}

function laneName() {
  return $("s-lane").value.trim();
}

function userInput() {
  const text = $("s-input").value;
  return [{ type: "message", role: "user", content: [{ type: "input_text", text }] }];
}

// `continuing`: tool outputs always continue the lane's chain (they answer its last response).
export function sendTurn(input, continuing = false) {
  if (!ws) return;
  const lane = laneName();
  const state = lanes.get(lane) || { last: null };
  const body = {
    type: "response.create",
    model: $("s-model").value.trim() || "tether-sim",
    input,
    store: $("s-store").checked,
    include: ["tether:server_timing"],
  };
  if (lane) body.stream_id = lane;
  if ((continuing || $("s-continue").checked) && state.last) body.previous_response_id = state.last;
  if ($("s-use-tools").checked) {
    try {
      body.tools = JSON.parse($("s-tools").value || "[]");
    } catch (err) {
      status(`tools are not valid JSON: ${err.message}`, "bad");
      return;
    }
  }
  state.started = performance.now();
  state.first = true;
  lanes.set(lane, state);
  $("s-calls").replaceChildren();
  ws.send(JSON.stringify(body));
  addRow(lane, "→ response.create", body.previous_response_id ? `previous_response_id=${body.previous_response_id}` : "new chain", "");
}

function detailOf(ev) {
  switch (ev.type) {
    case "response.output_text.delta":
    case "response.reasoning_text.delta":
    case "response.function_call_arguments.delta":
    case "response.custom_tool_call_input.delta":
      return JSON.stringify(ev.delta);
    case "response.custom_tool_call_input.done":
      return JSON.stringify(ev.input);
    case "response.output_item.added":
    case "response.output_item.done":
      return `${ev.item.type}${ev.item.name ? ` ${ev.item.name}` : ""}${ev.item.call_id ? ` ${ev.item.call_id}` : ""}`;
    case "response.created":
    case "response.in_progress":
      return ev.response.id;
    case "error":
      return `${ev.error?.code ?? ""}: ${ev.error?.message ?? ""}`;
    default:
      if (TERMINAL.has(ev.type)) return `${ev.response.id} ${ev.response.status}`;
      return "";
  }
}

function addRow(lane, type, detail, cls, ms = 0) {
  const body = $("s-events");
  body.append(el("tr", { class: cls }, el("td", {}, fmt(ms, 1)), el("td", {}, lane || "default"),
    el("td", {}, type), el("td", { class: "detail" }, detail)));
  while (body.rows.length > MAX_ROWS) body.deleteRow(0);
  body.lastChild.scrollIntoView({ block: "nearest" });
}

function onEvent(ev) {
  const lane = ev.stream_id || "";
  const state = lanes.get(lane) || { started: performance.now(), first: false };
  const ms = performance.now() - state.started;
  let cls = "";
  if (ev.type.endsWith(".delta") && state.first) {
    cls = "first"; // time to first token
    state.first = false;
  }
  if (TERMINAL.has(ev.type)) cls = "terminal";
  if (ev.type === "error") cls = "error";
  addRow(lane, ev.type, detailOf(ev), cls, ms);
  if (TERMINAL.has(ev.type)) finished(lane, state, ev.response);
}

function finished(lane, state, r) {
  state.last = r.id;
  lanes.set(lane, state);
  chain.push({ id: r.id, prev: r.previous_response_id, lane, status: r.status });
  $("s-chain").append(el("li", {}, `${r.id}`, el("span", { class: "muted" },
    `  ← ${r.previous_response_id || "(start)"} · lane ${lane || "default"} · ${r.status}`)));
  const usage = r.usage || {};
  const cached = usage.input_tokens_details?.cached_tokens;
  const timing = r.server_timing || null;
  const stages = timing ? Object.entries(timing.stages_ms || {}).map(([k, v]) => `${k} ${fmt(v, 2)}`).join(" · ") : "–";
  const text = (r.output || []).filter((i) => i.type === "message")
    .flatMap((i) => i.content || []).filter((c) => c.type === "output_text").map((c) => c.text).join("\n");
  $("s-summary").className = "summary";
  $("s-summary").replaceChildren(
    el("dl", {},
      el("dt", {}, "response"), el("dd", {}, r.id),
      el("dt", {}, "previous_response_id"), el("dd", {}, r.previous_response_id || "–"),
      el("dt", {}, "lane"), el("dd", {}, lane || "default"),
      el("dt", {}, "status"), el("dd", { id: "s-status" }, r.status),
      el("dt", {}, "input tokens"), el("dd", {}, fmt(usage.input_tokens, 0)),
      el("dt", {}, "cached_tokens"), el("dd", { id: "s-cached" }, fmt(cached, 0)),
      el("dt", {}, "output tokens"), el("dd", {}, fmt(usage.output_tokens, 0)),
      el("dt", {}, "server overhead"), el("dd", {}, timing ? `${fmt(timing.overhead_ms, 2)} ms` : "–"),
      el("dt", {}, "stages (ms)"), el("dd", { id: "s-stages" }, stages)),
    text ? el("div", { class: "answer", id: "s-answer" }, text) : "");
  const calls = (r.output || []).filter((i) => Object.hasOwn(CALL_OUTPUT, i.type));
  if (calls.length) showCalls(calls);
}

// What the model sent: a function's JSON arguments, a custom tool's input text.
function callText(call) {
  return call.type === "custom_tool_call" ? call.input : call.arguments;
}

function canned(call) {
  const sent = call.type === "custom_tool_call" ? { input: call.input } : { arguments: safeParse(call.arguments) };
  return JSON.stringify({ ok: true, tool: call.name, ...sent, result: `canned output for ${call.name}` });
}

function safeParse(text) {
  try {
    return JSON.parse(text);
  } catch (_) {
    return text;
  }
}

function showCalls(calls) {
  const box = $("s-calls");
  const outputs = calls.map((call) => {
    const area = el("textarea", { rows: 2, class: "call-output", "data-call-id": call.call_id, spellcheck: "false" });
    const fill = el("button", { class: "secondary", type: "button", onclick: () => { area.value = canned(call); } }, "canned output");
    box.append(el("div", { class: "call" }, el("div", {}, el("strong", {}, call.name), " ", el("code", {}, callText(call)),
      el("span", { class: "muted" }, ` ${call.call_id}`)), area, fill));
    return { call, area };
  });
  const send = el("button", {
    id: "s-send-outputs", type: "button",
    onclick: () => sendTurn(outputs.map(({ call, area }) => ({
      type: CALL_OUTPUT[call.type], call_id: call.call_id, output: area.value || canned(call),
    })), true),
  }, "Send tool outputs");
  const all = el("button", { class: "secondary", type: "button", onclick: () => outputs.forEach(({ call, area }) => { area.value = canned(call); }) }, "fill all canned");
  box.append(el("div", { class: "row" }, send, all));
}
