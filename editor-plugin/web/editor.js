// The demo page: a CodeMirror 6 editor (Python) whose ghost text streams in from `completer
// serve` as chunks arrive. Query parameters: ws (WebSocket URL), token, debounce (ms), max
// (max_new_tokens), doc (document name), lang (language id), guard (ms the accept keys do nothing
// after a shown ghost was taken back, default 300). Keys: Tab accepts all, Ctrl+→ a word, Ctrl+↓
// a line, Esc dismisses; without ghost text they do what they usually do.
import { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
import { python } from "@codemirror/lang-python";
import { HighlightStyle, syntaxHighlighting } from "@codemirror/language";
import { EditorState, Prec } from "@codemirror/state";
import { EditorView, drawSelection, highlightActiveLine, keymap, lineNumbers } from "@codemirror/view";
import { ACCEPT_GUARD_MS, AcceptGuard, CompleterClient, formatStats, isWarmupTrigger, isWithdrawal } from "./client.js";
import { acceptSpec, ghostDecorations, ghostField, setGhost } from "./ghost.js";
import { tags as t } from "@lezer/highlight";

/** Syntax colours for the page's dark background. */
const highlight = HighlightStyle.define([
  { tag: [t.keyword, t.controlKeyword, t.definitionKeyword, t.operatorKeyword], color: "#c792ea" },
  { tag: [t.string, t.docString], color: "#c3e88d" },
  { tag: [t.number, t.bool, t.null], color: "#f78c6c" },
  { tag: t.comment, color: "#7f8590", fontStyle: "italic" },
  { tag: [t.function(t.definition(t.variableName)), t.function(t.variableName)], color: "#82aaff" },
  { tag: t.className, color: "#ffcb6b" },
]);

const params = new URLSearchParams(location.search);
const cfg = {
  ws: params.get("ws") || "ws://127.0.0.1:7421/ws",
  token: params.get("token") || "",
  debounceMs: Number(params.get("debounce") ?? 120),
  maxNewTokens: params.has("max") ? Number(params.get("max")) : undefined,
  doc: params.get("doc") || "demo.py",
  language: params.get("lang") || "python",
  guardMs: Number(params.get("guard") ?? ACCEPT_GUARD_MS),
};

const $ = (id) => document.getElementById(id);
const statusEl = $("status");
const latencyEl = $("latency");
const errorsEl = $("errors");
const wsInput = $("ws-url");

/** The request behind the ghost: its id, where it was asked, chunks so far, chars taken, times. */
const cur = { id: null, at: -1, streamed: "", accepted: 0, t0: 0, tFirst: 0 };
let debounceTimer = null;
let client = null;
let retryMs = 500;
let view = null;
const guard = new AcceptGuard(cfg.guardMs);

function setState(state, text) {
  document.body.dataset.state = state;
  statusEl.textContent = text;
}

function showError(id, code, message) {
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()}  ${code}${id !== null ? ` (request ${id})` : ""}: ${message}`;
  errorsEl.prepend(li);
  while (errorsEl.children.length > 6) errorsEl.lastChild.remove();
}

/** Ends the current request: cancels it if running and reports how much was taken (0: rejected). */
function forget(shown) {
  if (cur.id !== null) {
    client.cancel(cur.id);
    if (shown || cur.accepted) client.feedback(cur.id, cur.accepted > 0, cur.accepted);
  }
  Object.assign(cur, { id: null, at: -1, streamed: "", accepted: 0 });
}

function showGhost(ghost) {
  view.dispatch({ effects: setGhost.of(ghost) });
  document.body.dataset.ghost = ghost ? "shown" : "none";
}

/** The ghost as the server's frames say (null: none). Replacing a ghost the user saw by one that
 * does not extend it is a withdrawal: the accept keys then do nothing for a moment. */
function serverGhost(ghost) {
  const shown = view.state.field(ghostField);
  const next = ghost && shown && ghost.at === shown.at ? ghost.text : null;
  if (isWithdrawal(shown && shown.text, next)) guard.withdrawn();
  showGhost(ghost);
}

function context(state) {
  const pos = state.selection.main.head;
  return { doc: cfg.doc, language: cfg.language, prefix: state.doc.sliceString(0, pos),
           suffix: state.doc.sliceString(pos) };
}

function request() {
  debounceTimer = null;
  const sel = view.state.selection.main;
  if (!sel.empty || !client) return;
  const id = client.complete({ ...context(view.state), maxNewTokens: cfg.maxNewTokens });
  if (id === null) return;
  // A type-through remainder stays on screen until the first chunk replaces it.
  Object.assign(cur, { id, at: sel.head, streamed: "", accepted: 0, t0: performance.now(), tFirst: 0 });
}

function schedule() {
  clearTimeout(debounceTimer);
  debounceTimer = setTimeout(request, cfg.debounceMs);
}

/** Accept-key command: takes `unit` of the ghost, or returns false so the key does its usual;
 * right after a withdrawal it does nothing (the press was meant for the ghost that went away). */
const accept = (unit) => (v) => {
  if (guard.blocking) return true;
  const a = acceptSpec(v.state, unit);
  if (!a) return false;
  v.dispatch(a.spec);
  cur.accepted += a.taken.length;
  if (!a.rest) {
    client.feedback(cur.id, true, cur.accepted);
    Object.assign(cur, { id: null, at: -1, streamed: "", accepted: 0 });
    schedule();
  }
  return true;
};

function dismiss(v) {
  if (!v.state.field(ghostField) && cur.id === null) return false;
  clearTimeout(debounceTimer);
  showGhost(null);
  forget(true);
  return true;
}

/** Side effects of the user's edits and moves (the ghost itself follows in ghostField). */
const onUpdate = EditorView.updateListener.of((u) => {
  const before = u.startState.field(ghostField), after = u.state.field(ghostField);
  document.body.dataset.ghost = after ? "shown" : "none";
  if (u.transactions.some((tr) => tr.isUserEvent("input.complete") || tr.effects.length)) return;
  if (u.docChanged) {
    if (before && after) client.cancel(cur.id); // typed through: keep the rest, ask again
    else forget(Boolean(before));
    let inserted = null;
    u.changes.iterChanges((_a, _b, _c, _d, text) => { inserted = text.toString(); });
    if (isWarmupTrigger(inserted)) client.warmup(context(u.state));
    schedule();
  } else if (u.selectionSet && (before || cur.id !== null) && !after) {
    clearTimeout(debounceTimer);
    forget(Boolean(before));
  }
});

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
      Object.assign(cur, { id: null, at: -1, streamed: "", accepted: 0 });
      serverGhost(null);
      const me = client;
      setTimeout(() => { if (client === me) connect(url); }, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    }
  };
  client.onChunk = (id, delta) => {
    if (id !== cur.id) return;
    if (!cur.tFirst) cur.tFirst = performance.now();
    cur.streamed += delta;
    serverGhost({ at: cur.at, text: cur.streamed });
  };
  client.onDone = (id, text, cancelled, stats) => {
    if (id !== cur.id || cancelled) return;
    // The final text starts with the chunks (the server streams only settled text); it wins.
    if (!cur.tFirst && text) cur.tFirst = performance.now();
    serverGhost(text ? { at: cur.at, text } : null);
    const parts = formatStats(stats);
    parts.push(`page: first text ${cur.tFirst ? Math.round(cur.tFirst - cur.t0) : "–"} ms, done ${Math.round(performance.now() - cur.t0)} ms`);
    latencyEl.textContent = parts.join(" · ");
    latencyEl.dataset.request = String(id);  // whose done frame the line shows (timings can repeat)
    if (!text) cur.id = null;
  };
  client.onError = (id, code, message) => {
    showError(id, code, message);
    if (id !== null && id === cur.id) {
      cur.id = null;
      serverGhost(null);
    }
  };
  client.connect();
}

const START = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n';

view = new EditorView({
  parent: $("editor"),
  state: EditorState.create({
    doc: START,
    extensions: [
      Prec.highest(keymap.of([
        { key: "Tab", run: accept("all") },
        { key: "Ctrl-ArrowRight", mac: "Cmd-ArrowRight", run: accept("word") },
        { key: "Ctrl-ArrowDown", mac: "Cmd-ArrowDown", run: accept("line") },
        { key: "Escape", run: dismiss },
      ])),
      lineNumbers(), history(), drawSelection(), highlightActiveLine(),
      syntaxHighlighting(highlight), python(),
      keymap.of([...defaultKeymap, ...historyKeymap, indentWithTab]),
      ghostField, ghostDecorations, onUpdate,
    ],
  }),
});
window.completerView = view; // for tests and the console

$("connect").addEventListener("click", () => {
  cfg.ws = wsInput.value.trim();
  connect(cfg.ws);
});
wsInput.value = cfg.ws;
$("doc-name").textContent = `${cfg.doc} (${cfg.language})`;
connect(cfg.ws);
