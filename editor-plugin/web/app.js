// The demo page: a textarea with a mirror layer underneath that draws the ghost text at the
// cursor. Query parameters: ws (WebSocket URL), token, debounce (ms), max (max_new_tokens),
// doc (document name), lang (language id).
import { CompleterClient, formatStats, isWarmupTrigger, nextWord, typeThrough } from "./client.js";

const params = new URLSearchParams(location.search);
const cfg = {
  ws: params.get("ws") || "ws://127.0.0.1:7421/ws",
  token: params.get("token") || "",
  debounceMs: Number(params.get("debounce") ?? 120),
  maxNewTokens: params.has("max") ? Number(params.get("max")) : undefined,
  doc: params.get("doc") || "demo.py",
  language: params.get("lang") || "python",
};

const $ = (id) => document.getElementById(id);
const editor = $("editor");
const mirror = $("mirror");
const statusEl = $("status");
const latencyEl = $("latency");
const errorsEl = $("errors");
const wsInput = $("ws-url");

/** The completion on screen (or being requested): request id, cursor offset, ghost text. */
const cur = { id: null, at: -1, ghost: "", streamed: "", accepted: 0, t0: 0, tFirst: 0 };
let debounceTimer = null;
let client = null;
let retryMs = 500;

function setState(state, text) {
  document.body.dataset.state = state;
  statusEl.textContent = text;
}

function render() {
  const v = editor.value;
  const at = cur.ghost ? cur.at : v.length;
  mirror.replaceChildren(
    document.createTextNode(v.slice(0, at)),
    Object.assign(document.createElement("span"), { id: "ghost", className: "ghost", textContent: cur.ghost }),
    // A trailing newline in a <pre> collapses; the space keeps the last line's height.
    document.createTextNode(v.slice(at) + " "),
  );
  mirror.scrollTop = editor.scrollTop;
  mirror.scrollLeft = editor.scrollLeft;
  document.body.dataset.ghost = cur.ghost ? "shown" : "none";
}

function showError(id, code, message) {
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()}  ${code}${id !== null ? ` (request ${id})` : ""}: ${message}`;
  errorsEl.prepend(li);
  while (errorsEl.children.length > 6) errorsEl.lastChild.remove();
}

/** Drop the ghost; tells the server how much of it was taken (0: rejected). */
function dismiss() {
  if (cur.id !== null) {
    client.cancel(cur.id);
    if (cur.ghost || cur.accepted) client.feedback(cur.id, cur.accepted > 0, cur.accepted);
  }
  Object.assign(cur, { id: null, at: -1, ghost: "", accepted: 0 });
  render();
}

function context() {
  const pos = editor.selectionStart;
  return { doc: cfg.doc, language: cfg.language,
           prefix: editor.value.slice(0, pos), suffix: editor.value.slice(pos) };
}

function request() {
  debounceTimer = null;
  if (editor.selectionStart !== editor.selectionEnd) return;
  const ctx = context();
  const id = client.complete({ ...ctx, maxNewTokens: cfg.maxNewTokens });
  if (id === null) return;
  // A type-through remainder stays on screen until the first chunk replaces it.
  Object.assign(cur, { id, at: editor.selectionStart, streamed: "", accepted: 0,
                       t0: performance.now(), tFirst: 0 });
}

function schedule() {
  clearTimeout(debounceTimer);
  debounceTimer = setTimeout(request, cfg.debounceMs);
}

function insertAtCursor(text) {
  const pos = editor.selectionStart;
  editor.setRangeText(text, pos, editor.selectionEnd, "end");
}

editor.addEventListener("input", (ev) => {
  const inserted = ev.inputType === "insertLineBreak" ? "\n" : ev.inputType === "insertText" ? ev.data : null;
  const rest = typeThrough(cur.ghost, inserted);
  if (rest !== null && cur.at + inserted.length === editor.selectionStart) {
    // Typed what the ghost showed: keep the rest on screen while the next request runs.
    client.cancel(cur.id);
    Object.assign(cur, { at: editor.selectionStart, ghost: rest });
  } else {
    dismiss();
  }
  if (isWarmupTrigger(inserted)) client.warmup(context());
  render();
  schedule();
});

editor.addEventListener("keydown", (ev) => {
  if (ev.key === "Tab" && !ev.shiftKey && !ev.ctrlKey && !ev.altKey) {
    ev.preventDefault();
    if (cur.ghost && editor.selectionStart === cur.at) {
      const id = cur.id, taken = cur.accepted + cur.ghost.length;
      insertAtCursor(cur.ghost);
      client.feedback(id, true, taken);
      Object.assign(cur, { id: null, at: -1, ghost: "", accepted: 0 });
    } else {
      dismiss();
      insertAtCursor("    ");
    }
    render();
    schedule();
  } else if (ev.key === "Escape") {
    if (cur.ghost || cur.id !== null) {
      ev.preventDefault();
      clearTimeout(debounceTimer);
      dismiss();
    }
  } else if (ev.key === "ArrowRight" && ev.ctrlKey && cur.ghost && editor.selectionStart === cur.at) {
    ev.preventDefault();
    const piece = nextWord(cur.ghost);
    insertAtCursor(piece);
    cur.accepted += piece.length;
    cur.ghost = cur.ghost.slice(piece.length);
    cur.at = editor.selectionStart;
    if (!cur.ghost) {
      client.feedback(cur.id, true, cur.accepted);
      Object.assign(cur, { id: null, at: -1, ghost: "", accepted: 0 });
      schedule();
    }
    render();
  }
});

// Moving the cursor away (arrows, clicks) leaves the ghost behind: dismiss it.
for (const type of ["keyup", "mouseup"]) {
  editor.addEventListener(type, () => {
    if ((cur.ghost || cur.id !== null) && (editor.selectionStart !== cur.at || editor.selectionEnd !== cur.at)) {
      clearTimeout(debounceTimer);
      dismiss();
    }
  });
}
editor.addEventListener("scroll", render);

function connect(url) {
  if (client) client.close();
  client = new CompleterClient(url, { token: cfg.token });
  client.onState = (state, detail) => {
    if (state === "ready" || (state === "open" && detail && detail.type === "hello")) {
      retryMs = 500;
      const model = detail.model ? ` · ${detail.model.target ?? detail.model.name ?? JSON.stringify(detail.model)}` : "";
      setState(detail.ready === false ? "loading" : "ready",
               `connected to ${detail.server ?? "server"} ${detail.version ?? ""}${model}${detail.ready === false ? " · loading models" : ""}`);
    } else if (state === "connecting") {
      setState("connecting", `connecting to ${url}…`);
    } else if (state === "closed") {
      setState("closed", `disconnected (${detail}); retrying in ${retryMs / 1000} s`);
      Object.assign(cur, { id: null, at: -1, ghost: "", accepted: 0 });
      render();
      const me = client;
      setTimeout(() => { if (client === me) connect(url); }, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    }
  };
  client.onChunk = (id, delta) => {
    if (id !== cur.id) return;
    if (!cur.tFirst) cur.tFirst = performance.now();
    cur.streamed += delta;
    cur.ghost = cur.streamed;
    render();
  };
  client.onDone = (id, text, cancelled, stats) => {
    if (id !== cur.id || cancelled) return;
    // The final text may differ from the streamed chunks (post-processing): it wins.
    cur.ghost = text;
    const t = performance.now();
    const parts = formatStats(stats);
    parts.push(`page: first chunk ${cur.tFirst ? Math.round(cur.tFirst - cur.t0) : "–"} ms, done ${Math.round(t - cur.t0)} ms`);
    latencyEl.textContent = parts.join(" · ");
    if (!text) cur.id = null;
    render();
  };
  client.onError = (id, code, message) => {
    showError(id, code, message);
    if (id !== null && id === cur.id) Object.assign(cur, { id: null, ghost: "" });
    render();
  };
  client.connect();
}

$("connect").addEventListener("click", () => {
  cfg.ws = wsInput.value.trim();
  connect(cfg.ws);
});

wsInput.value = cfg.ws;
$("doc-name").textContent = `${cfg.doc} (${cfg.language})`;
render();
connect(cfg.ws);
