// The demo page's logic without the DOM: the WebSocket client for `completer serve`
// (hello, complete with streamed chunks, next_edit, warmup, cancel, feedback, error frames) and the
// ghost-text rules (triggers, word and line accept, type-through, the accept guard after a ghost
// is taken back). editor.js wires it to the page.
import { decode, encode as encodeAll } from "@msgpack/msgpack";

/** Frames leave out absent fields (undefined) rather than sending nil. */
const encode = (frame) => encodeAll(frame, { ignoreUndefined: true });

/** Characters after which the server is asked to prefill (warmup) before the request comes. */
export const WARMUP_TRIGGERS = ["\n", "(", "=", ":"];

/** True when an edit that inserted `inserted` should send a warmup frame. */
export function isWarmupTrigger(inserted) {
  return typeof inserted === "string" && inserted.length > 0 &&
    WARMUP_TRIGGERS.includes(inserted[inserted.length - 1]);
}

/**
 * The next piece a word-by-word accept takes from `ghost`: leading whitespace plus one word, or
 * one run of punctuation; a newline ends a piece so a line break is accepted on its own.
 */
export function nextWord(ghost) {
  const m = ghost.match(/^[ \t]*(?:\n|[A-Za-z0-9_]+|[^A-Za-z0-9_\s]+)?/);
  const piece = m ? m[0] : "";
  return piece.length > 0 ? piece : ghost.slice(0, 1);
}

/**
 * The next piece a line-by-line accept takes from `ghost`: the rest of the current line, or,
 * when the ghost starts with a line break, the break and the next line.
 */
export function nextLine(ghost) {
  const m = ghost.match(/^\n?[^\n]*/);
  return m[0];
}

/**
 * Ghost text after the user typed `inserted` at the ghost's position: the rest of the ghost
 * when the typing matches its start (type-through), else null (the ghost is stale).
 */
export function typeThrough(ghost, inserted) {
  if (!ghost || !inserted || !ghost.startsWith(inserted)) return null;
  return ghost.slice(inserted.length);
}

/**
 * True when replacing the ghost text `shown` by `next` (null: none) takes back something the
 * user saw: the new ghost does not extend the old one. The server never does this on its own
 * (its `done` text starts with its chunks), but an error, a lost connection or a type-through
 * remainder replaced by a new reply still can.
 */
export function isWithdrawal(shown, next) {
  return Boolean(shown) && !(next && next.startsWith(shown));
}

/** How long accept keys do nothing after a ghost was taken back (ms). */
export const ACCEPT_GUARD_MS = 300;

/**
 * After a withdrawal, the key the user pressed to accept what they saw must not edit: for
 * `ms` the accept keys are swallowed (no ghost taken, no indent). `now` is the clock (ms).
 */
export class AcceptGuard {
  constructor(ms = ACCEPT_GUARD_MS, now = () => performance.now()) {
    this.ms = ms;
    this.now = now;
    this.at = -Infinity;
  }

  withdrawn() { this.at = this.now(); }

  get blocking() { return this.now() - this.at < this.ms; }
}

/**
 * Latency line parts from a done frame's stats. The server reports the whole request
 * (`total_ms`) and the engine's part either flat (`engine_ttft_ms`) or nested (`engine.{...}`).
 */
export function formatStats(stats) {
  const eng = stats && typeof stats.engine === "object" && stats.engine !== null ? stats.engine : {};
  const pick = (...vals) => vals.find((v) => typeof v === "number");
  const ttft = pick(stats.ttft_ms, stats.engine_ttft_ms, eng.ttft_ms);
  const total = pick(stats.total_ms, eng.total_ms);
  const tokens = pick(stats.new_tokens, eng.new_tokens);
  const tau = pick(stats.accepted_per_forward, eng.accepted_per_forward);
  const parts = [];
  if (ttft !== undefined) parts.push(`TTFT ${Math.round(ttft)} ms`);
  if (total !== undefined) parts.push(`total ${Math.round(total)} ms`);
  if (tokens !== undefined) parts.push(`${tokens} token${tokens === 1 ? "" : "s"}`);
  if (tau !== undefined) parts.push(`τ ${tau.toFixed(2)}`);
  return parts;
}

/** The alternatives' texts in a done frame's stats (the server's `alternatives`: best first). */
export function alternativeTexts(stats) {
  const alts = stats && Array.isArray(stats.alternatives) ? stats.alternatives : [];
  return alts.map((a) => a && a.text).filter((t) => typeof t === "string" && t !== "");
}

/** ws URL with `?token=` added for browsers (they cannot set headers on a WebSocket). */
export function withToken(url, token) {
  if (!token) return url;
  const u = new URL(url);
  u.searchParams.set("token", token);
  return u.toString();
}

/**
 * One connection to `completer serve`. Events (set as properties):
 *   onState(state, detail)  state: "connecting" | "open" | "ready" | "closed"
 *   onChunk(id, delta), onDone(id, text, cancelled, stats), onError(id, code, message),
 *   onNextEdit(id, edits, reason, stats, jump)  edits: [{start_line, start_col, end_line, end_col, text}];
 *     jump: the next place past the region, {start_line, start_col, end_line, end_col, edits}, or null
 * Frames for requests other than the latest are still passed on: the caller decides by id.
 */
export class CompleterClient {
  constructor(url, { token, WebSocketImpl = globalThis.WebSocket, clientName = "web-demo",
                     helloRetryMs = 1000 } = {}) {
    this.url = withToken(url, token);
    this.token = token;
    this.clientName = clientName;
    this.helloRetryMs = helloRetryMs;
    this.WebSocketImpl = WebSocketImpl;
    this.nextId = 1;
    this.inflight = new Set();
    this.server = null;
    this.ws = null;
    this.onState = () => {};
    this.onChunk = () => {};
    this.onDone = () => {};
    this.onError = () => {};
    this.onNextEdit = () => {};
  }

  connect() {
    this.onState("connecting", this.url);
    const ws = new this.WebSocketImpl(this.url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    ws.onopen = () => {
      this.onState("open", this.url);
      this.hello();
    };
    ws.onmessage = (ev) => this.receive(ev.data);
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.inflight.clear();
      this.onState("closed", ev && ev.reason ? ev.reason : `code ${ev ? ev.code : "?"}`);
    };
    ws.onerror = () => {};
  }

  hello() {
    return this.send({ type: "hello", client: this.clientName, token: this.token || undefined });
  }

  close() {
    const ws = this.ws;
    this.ws = null;
    if (ws) ws.close();
  }

  get isOpen() {
    return this.ws !== null && this.ws.readyState === 1;
  }

  send(frame) {
    if (!this.isOpen) return false;
    this.ws.send(encode(frame));
    return true;
  }

  receive(data) {
    let msg;
    try {
      msg = decode(data instanceof ArrayBuffer ? new Uint8Array(data) : data);
    } catch (e) {
      this.onError(null, "client_decode", `undecodable frame from the server: ${e.message}`);
      return;
    }
    if (msg === null || typeof msg !== "object") {
      this.onError(null, "client_decode", "frame is not a map");
      return;
    }
    switch (msg.type) {
      case "hello": {
        this.server = msg;
        this.onState(msg.ready === false ? "open" : "ready", msg);
        // The server refuses completions while its models load; ask again until it is ready.
        const ws = this.ws;
        if (msg.ready === false) setTimeout(() => { if (this.ws === ws) this.hello(); }, this.helloRetryMs);
        break;
      }
      case "chunk":
        this.onChunk(msg.id, msg.text ?? "");
        break;
      case "done":
        this.inflight.delete(msg.id);
        this.onDone(msg.id, msg.text ?? "", Boolean(msg.cancelled), msg.stats ?? {});
        break;
      case "error":
        if (msg.id !== null && msg.id !== undefined) this.inflight.delete(msg.id);
        this.onError(msg.id ?? null, msg.code ?? "error", msg.message ?? "");
        break;
      case "next_edit":
        this.inflight.delete(msg.id);
        this.onNextEdit(msg.id, Array.isArray(msg.edits) ? msg.edits : [], msg.reason ?? null, msg.stats ?? {},
                        msg.jump ?? null);
        break;
      case "pong":
        break;
      default:
        // A server newer than this page may send more types; the page has nothing to do with them.
        break;
    }
  }

  /** Ask for a completion; returns its id, or null when not connected. */
  complete({ doc, prefix, suffix, language, maxNewTokens, alternatives }) {
    const id = this.nextId++;
    const ok = this.send({ type: "complete", id, doc, prefix, suffix, language,
                           max_new_tokens: maxNewTokens, alternatives, stream: true });
    if (!ok) return null;
    this.inflight.add(id);
    return id;
  }

  /**
   * Ask for the next edit in `text` (cursor at 0-based `line`, `col` in code points) given the
   * same document `before` the recent edits; returns its id, or null when not connected.
   */
  nextEdit({ doc, text, line, col, before, language }) {
    const id = this.nextId++;
    if (!this.send({ type: "next_edit", id, text, line, col, before, path: doc, language })) return null;
    this.inflight.add(id);
    return id;
  }

  warmup({ doc, prefix, suffix, language }) {
    return this.send({ type: "warmup", doc, prefix, suffix, language });
  }

  /** Cancel a request still running; a no-op for finished ones. */
  cancel(id) {
    if (id === null || !this.inflight.has(id)) return false;
    this.inflight.delete(id);
    return this.send({ type: "cancel", id });
  }

  /** What happened to a completion, or (kind "next_edit") to a next-edit suggestion. */
  feedback(id, accepted, acceptedChars, kind) {
    return this.send({ type: "feedback", id, accepted, accepted_chars: acceptedChars, kind });
  }
}
