// How the page talks to the server. The API key lives only in this module's memory (never in a
// URL, cookie or page storage): it authenticates the page's HTTP calls, and each WebSocket gets
// a short-lived token from POST /console/token, offered as a subprotocol (browsers cannot set
// Authorization on a WebSocket handshake).

let apiKey = "";

export function setKey(key) {
  apiKey = key.trim();
}

export function authHeaders() {
  return apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function errorOf(resp) {
  let code = "", message = `HTTP ${resp.status}`;
  try {
    const body = await resp.json();
    if (body && body.error) {
      code = body.error.code || "";
      message = body.error.message || message;
    }
  } catch (_) { /* not JSON */ }
  return new ApiError(resp.status, code, message);
}

export async function getJson(path) {
  const resp = await fetch(path, { headers: authHeaders(), cache: "no-store" });
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

export async function postJson(path, body) {
  const resp = await fetch(path, {
    method: "POST",
    headers: { ...authHeaders(), "Content-Type": "application/json" },
    body: body === undefined ? "" : JSON.stringify(body),
    cache: "no-store",
  });
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

export async function token() {
  return postJson("/console/token");
}

export function wsUrl() {
  return `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/v1/responses`;
}

// A WebSocket in Responses WebSocket mode, authenticated with a fresh console token.
export async function openSocket() {
  const minted = await token();
  const ws = new WebSocket(wsUrl(), minted.subprotocols);
  await new Promise((resolve, reject) => {
    ws.addEventListener("open", resolve, { once: true });
    ws.addEventListener("error", () => reject(new Error("the WebSocket handshake failed (see the server's answer in the network log)")), { once: true });
  });
  return ws;
}

// Bytes a client writes for one WebSocket text frame of `payload` bytes (client frames are masked).
export function wsFrameBytes(payload) {
  const len = payload < 126 ? 0 : payload < 65536 ? 2 : 8;
  return 2 + len + 4 + payload;
}

export const utf8 = new TextEncoder();

// Build an element; children are nodes or strings (set as text, never parsed as HTML).
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

export function fmt(x, digits = 1) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return Number(x).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
}

export function kib(bytes) {
  return bytes >= 1024 ? `${fmt(bytes / 1024, 1)} KiB` : `${bytes} B`;
}
