// The demo page: a CodeMirror 6 editor (Python) whose ghost text streams in from `completer
// serve` as chunks arrive, and next-edit suggestions (`next_edit` frames) drawn in place. Query
// parameters: ws (WebSocket URL), token, debounce (ms), max (max_new_tokens), doc (document
// name), lang (language id), guard (ms the accept keys do nothing after a shown ghost was taken
// back, default 300), next (0: no next edits), next_debounce (ms after the last edit before a
// next edit is asked for, default 300). Keys: Tab accepts all (the ghost, else the next edit; one
// outside the view is announced at the cursor's line and Tab jumps to it first), Ctrl+→ a word,
// Ctrl+↓ a line, Esc dismisses; without either they do what they usually do. A transaction with
// userEvent "set" loads a new document: nothing is asked, no edit history.
import { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
import { python } from "@codemirror/lang-python";
import { HighlightStyle, syntaxHighlighting } from "@codemirror/language";
import { EditorState, Prec } from "@codemirror/state";
import { EditorView, drawSelection, highlightActiveLine, keymap, lineNumbers } from "@codemirror/view";
import { ACCEPT_GUARD_MS, AcceptGuard, CompleterClient, alternativeTexts, formatStats, isWarmupTrigger,
  isWithdrawal } from "./client.js";
import { acceptSpec, cycleGhost, ghostDecorations, ghostField, setGhost } from "./ghost.js";
import { EditSnapshot, acceptNextEditSpec, editsToChanges, followJumpSpec, jumpOf, jumpToNextEditSpec, nextEditDecorations,
         nextEditField, nextEditFollowHint, nextEditGutter, nextEditHint, setNextEdit, toCodePoints } from "./nextedit.js";
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
  nextEdit: params.get("next") !== "0",
  nextDebounceMs: Number(params.get("next_debounce") ?? 300),
  // completions per request (the main one and its alternatives, cycled with Alt-] / Alt-[);
  // absent: the server's option `alternatives`
  alternatives: params.has("alternatives") ? Number(params.get("alternatives")) : undefined,
};

const $ = (id) => document.getElementById(id);
const statusEl = $("status");
const latencyEl = $("latency");
const nextLatencyEl = $("next-latency");
const errorsEl = $("errors");
const wsInput = $("ws-url");

/** The request behind the ghost: its id, where it was asked, chunks so far, chars taken, times,
 * and once done the texts to cycle (the completion, then its alternatives). */
const cur = { id: null, at: -1, streamed: "", accepted: 0, t0: 0, tFirst: 0, texts: [] };
let debounceTimer = null;
let client = null;
let retryMs = 500;
let view = null;
const guard = new AcceptGuard(cfg.guardMs);
/** The next-edit request in flight or shown: its id and the text it was asked on. */
const edit = { id: null, text: null, timer: null };
let snapshot = null;

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
  const id = client.complete({ ...context(view.state), maxNewTokens: cfg.maxNewTokens,
                               alternatives: cfg.alternatives });
  if (id === null) return;
  // A type-through remainder stays on screen until the first chunk replaces it.
  Object.assign(cur, { id, at: sel.head, streamed: "", accepted: 0, t0: performance.now(), tFirst: 0, texts: [] });
}

function schedule() {
  clearTimeout(debounceTimer);
  debounceTimer = setTimeout(request, cfg.debounceMs);
}

/** Next/previous-key command: shows the next (`step` 1) or previous (-1) of the texts to cycle, or
 * returns false so the key does its usual (no ghost, or one text only). */
const cycle = (step) => (v) => {
  const ghost = cycleGhost(v.state, cur.at, cur.texts, step);
  if (!ghost) return false;
  showGhost(ghost);
  return true;
};

/** Accept-key command: takes `unit` of the ghost, or returns false so the key does its usual;
 * right after a withdrawal it does nothing (the press was meant for the ghost that went away). */
const accept = (unit) => (v) => {
  if (guard.blocking) return true;
  const a = acceptSpec(v.state, unit);
  if (!a) return false;
  snapshot.changed(v.state.doc.toString());
  v.dispatch(a.spec);
  cur.accepted += a.taken.length;
  if (edit.id !== null) client.cancel(edit.id);
  edit.id = null;
  // All taken: the next edit is asked for at once (chained); a part: after the usual wait.
  askNextEdit(a.rest ? cfg.nextDebounceMs : 0);
  if (!a.rest) {
    client.feedback(cur.id, true, cur.accepted);
    Object.assign(cur, { id: null, at: -1, streamed: "", accepted: 0 });
    schedule();
  }
  return true;
};

/** Tab without a ghost: jumps to the next edit shown outside the view, else applies it (then
 *  asks for the one after it at once). */
function acceptNextEdit(v) {
  const jump = jumpToNextEditSpec(v.state, v.visibleRanges);
  if (jump) {
    v.dispatch(jump);
    return true;
  }
  const follow = followJumpSpec(v.state);
  if (follow) {
    client.feedback(v.state.field(nextEditField).id, true, undefined, "next_edit");
    v.dispatch(follow);
    return true;
  }
  const spec = acceptNextEditSpec(v.state);
  if (!spec) return false;
  const shown = v.state.field(nextEditField);
  const id = shown.id;
  // an edit a jump carried continues the change at the definition: the text before it (the
  // request's `before`) stays the one before that change, so the next answer still follows it
  if (shown.arrived) snapshot.last = snapshot.now();
  else snapshot.changed(v.state.doc.toString());
  v.dispatch(spec);
  client.feedback(id, true, undefined, "next_edit");
  edit.id = null;
  askNextEdit(0);
  return true;
}

/** Drops the next edit shown (reported as rejected) and the request in flight. */
function dropNextEdit(v) {
  clearTimeout(edit.timer);
  const shown = v.state.field(nextEditField);
  if (shown) {
    v.dispatch({ effects: setNextEdit.of(null) });
    client.feedback(shown.id, false, undefined, "next_edit");
  } else if (edit.id !== null) {
    client.cancel(edit.id);
  }
  edit.id = null;
  return Boolean(shown);
}

/** Asks for the next edit `ms` from now (a newer call restarts the wait). */
function askNextEdit(ms) {
  clearTimeout(edit.timer);
  if (!cfg.nextEdit) return;
  edit.timer = setTimeout(() => {
    const state = view.state, text = state.doc.toString();
    if (!client || text === snapshot.text) return; // no edit to go on
    const pos = state.selection.main.head, line = state.doc.lineAt(pos);
    const id = client.nextEdit({ doc: cfg.doc, language: cfg.language, text, before: snapshot.text,
                                 line: line.number - 1, col: toCodePoints(line.text, pos - line.from) });
    Object.assign(edit, { id, text });
  }, ms);
}

function dismiss(v) {
  if (!v.state.field(ghostField) && cur.id === null) return dropNextEdit(v);
  clearTimeout(debounceTimer);
  showGhost(null);
  forget(true);
  return true;
}

/** Side effects of the user's edits and moves (the ghost itself follows in ghostField). */
const onUpdate = EditorView.updateListener.of((u) => {
  const before = u.startState.field(ghostField), after = u.state.field(ghostField);
  document.body.dataset.ghost = after ? "shown" : "none";
  document.body.dataset.nextEdit = u.state.field(nextEditField) ? "shown" : "none";
  if (u.transactions.some((tr) => tr.isUserEvent("set"))) { // a new document (loaded, not typed)
    snapshot = new EditSnapshot(u.state.doc.toString());
    return;
  }
  const applied = u.transactions.some((tr) => tr.isUserEvent("input.nextedit"));
  const dropped = u.docChanged && !applied && u.startState.field(nextEditField);
  if (dropped) client.feedback(dropped.id, false, undefined, "next_edit"); // typed on, or took a ghost instead: rejected
  if (u.transactions.some((tr) => tr.isUserEvent("input.complete") || tr.effects.length) || applied) return;
  if (u.docChanged) {
    if (edit.id !== null) client.cancel(edit.id);
    edit.id = null;
    snapshot.changed(u.startState.doc.toString());
    askNextEdit(cfg.nextDebounceMs);
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
    cur.texts = text ? [text, ...alternativeTexts(stats)] : [];
    const parts = formatStats(stats);
    parts.push(`page: first text ${cur.tFirst ? Math.round(cur.tFirst - cur.t0) : "–"} ms, done ${Math.round(performance.now() - cur.t0)} ms`);
    latencyEl.textContent = parts.join(" · ");
    latencyEl.dataset.request = String(id);  // whose done frame the line shows (timings can repeat)
    if (!text) cur.id = null;
  };
  client.onNextEdit = (id, edits, reason, stats, jumpAt) => {
    if (id !== edit.id) return;
    edit.id = null;
    const parts = formatStats(stats);
    nextLatencyEl.textContent = `next edit: ${edits.length} edit${edits.length === 1 ? "" : "s"}` +
      `${reason ? ` (${reason})` : ""}${parts.length ? " · " + parts.join(" · ") : ""}`;
    // Computed on another text than the one on screen: dropped, never applied.
    if (view.state.doc.toString() !== edit.text) return;
    const changes = editsToChanges(view.state.doc, edits);
    const jump = jumpOf(view.state.doc, jumpAt);
    if (changes === null) showError(id, "client_next_edit", "edits outside the document or overlapping");
    else if (changes.length || jump) view.dispatch({ effects: setNextEdit.of({ id, changes, jump }) });
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
        { key: "Tab", run: (v) => accept("all")(v) || acceptNextEdit(v) },
        { key: "Ctrl-ArrowRight", mac: "Cmd-ArrowRight", run: accept("word") },
        { key: "Ctrl-ArrowDown", mac: "Cmd-ArrowDown", run: accept("line") },
        { key: "Escape", run: dismiss },
        { key: "Alt-]", run: cycle(1) },
        { key: "Alt-[", run: cycle(-1) },
      ])),
      lineNumbers(), history(), drawSelection(), highlightActiveLine(),
      syntaxHighlighting(highlight), python(),
      keymap.of([...defaultKeymap, ...historyKeymap, indentWithTab]),
      ghostField, ghostDecorations, nextEditField, nextEditDecorations, nextEditHint, nextEditGutter,
      nextEditFollowHint, onUpdate,
    ],
  }),
});
window.completerView = view; // for tests and the console
snapshot = new EditSnapshot(view.state.doc.toString());

$("connect").addEventListener("click", () => {
  cfg.ws = wsInput.value.trim();
  connect(cfg.ws);
});
wsInput.value = cfg.ws;
$("doc-name").textContent = `${cfg.doc} (${cfg.language})`;
connect(cfg.ws);
