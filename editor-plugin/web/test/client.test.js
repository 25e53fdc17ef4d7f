import { test } from "node:test";
import assert from "node:assert/strict";
import { decode, encode } from "@msgpack/msgpack";
import { ACCEPT_GUARD_MS, AcceptGuard, CompleterClient, formatStats, isWarmupTrigger, isWithdrawal, nextWord, typeThrough,
         withToken } from "../client.js";

/** A stand-in for the browser WebSocket: records sent frames, lets the test play the server. */
class FakeSocket {
  static last = null;
  constructor(url) { this.url = url; this.readyState = 0; this.sent = []; FakeSocket.last = this; }
  send(bytes) { this.sent.push(decode(bytes)); }
  close() { this.readyState = 3; this.onclose?.({ code: 1000, reason: "" }); }
  open() { this.readyState = 1; this.onopen(); }
  serve(frame) {
    const b = encode(frame); // a browser hands over exactly the frame's bytes as an ArrayBuffer
    this.onmessage({ data: b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength) });
  }
}

function connected(opts = {}) {
  const c = new CompleterClient("ws://127.0.0.1:7421/ws", { WebSocketImpl: FakeSocket, ...opts });
  const events = [];
  c.onState = (s, d) => events.push(["state", s, d]);
  c.onChunk = (id, t) => events.push(["chunk", id, t]);
  c.onDone = (id, t, cancelled, stats) => events.push(["done", id, t, cancelled, stats]);
  c.onError = (id, code, msg) => events.push(["error", id, code, msg]);
  c.connect();
  const ws = FakeSocket.last;
  ws.open();
  return { c, ws, events };
}

test("hello first, with the token; the server's hello makes the client ready", () => {
  const { ws, events } = connected({ token: "s3cret" });
  assert.equal(ws.url, "ws://127.0.0.1:7421/ws?token=s3cret");
  assert.equal(ws.binaryType, "arraybuffer");
  assert.deepEqual(ws.sent[0], { type: "hello", client: "web-demo", token: "s3cret" });
  ws.serve({ type: "hello", server: "completer", version: "0.1.0", model: { target: "t" }, ready: true });
  assert.deepEqual(events.at(-1)[1], "ready");
  assert.equal(events.at(-1)[2].model.target, "t");
});

test("a server still loading reports open, not ready, and is asked again", async () => {
  const { ws, events } = connected({ helloRetryMs: 5 });
  ws.serve({ type: "hello", server: "completer", version: "0.1.0", model: {}, ready: false });
  assert.equal(events.at(-1)[1], "open");
  assert.equal(ws.sent.length, 1);
  await new Promise((r) => setTimeout(r, 30));
  assert.equal(ws.sent.length, 2);
  assert.equal(ws.sent[1].type, "hello");
  ws.serve({ type: "hello", server: "completer", version: "0.1.0", model: {}, ready: true });
  assert.equal(events.at(-1)[1], "ready");
  await new Promise((r) => setTimeout(r, 30));
  assert.equal(ws.sent.length, 2, "no more hellos once ready");
});

test("complete streams chunks then done; ids increase", () => {
  const { c, ws, events } = connected();
  const id = c.complete({ doc: "a.py", prefix: "def f(", suffix: "", language: "python" });
  const id2 = c.complete({ doc: "a.py", prefix: "x", suffix: "", language: "python", maxNewTokens: 8 });
  assert.equal(id2, id + 1);
  assert.deepEqual(ws.sent[1], { type: "complete", id, doc: "a.py", prefix: "def f(", suffix: "",
                                 language: "python", stream: true });
  assert.equal(ws.sent[2].max_new_tokens, 8);
  ws.serve({ type: "chunk", id, text: "x" });
  ws.serve({ type: "chunk", id, text: ", y" });
  ws.serve({ type: "done", id, text: "x, y):", cancelled: false, stats: { ttft_ms: 9.5 } });
  assert.deepEqual(events.slice(-3), [
    ["chunk", id, "x"], ["chunk", id, ", y"], ["done", id, "x, y):", false, { ttft_ms: 9.5 }]]);
});

test("cancel is sent only for a request still running", () => {
  const { c, ws } = connected();
  const id = c.complete({ doc: "a.py", prefix: "", suffix: "" });
  assert.equal(c.cancel(id), true);
  assert.deepEqual(ws.sent.at(-1), { type: "cancel", id });
  assert.equal(c.cancel(id), false, "twice is a no-op");
  const id2 = c.complete({ doc: "a.py", prefix: "", suffix: "" });
  ws.serve({ type: "done", id: id2, text: "", cancelled: false, stats: {} });
  const before = ws.sent.length;
  assert.equal(c.cancel(id2), false);
  assert.equal(ws.sent.length, before);
});

test("warmup and feedback frames", () => {
  const { c, ws } = connected();
  c.warmup({ doc: "a.py", prefix: "p", suffix: "s", language: "python" });
  assert.deepEqual(ws.sent.at(-1), { type: "warmup", doc: "a.py", prefix: "p", suffix: "s", language: "python" });
  c.feedback(3, true, 5);
  assert.deepEqual(ws.sent.at(-1), { type: "feedback", id: 3, accepted: true, accepted_chars: 5 });
});

test("error frames, undecodable frames and unknown types reach onError or are ignored", () => {
  const { c, ws, events } = connected();
  const id = c.complete({ doc: "a.py", prefix: "", suffix: "" });
  ws.serve({ type: "error", id, code: "overloaded", message: "queue full" });
  assert.deepEqual(events.at(-1), ["error", id, "overloaded", "queue full"]);
  assert.equal(c.cancel(id), false, "an errored request is no longer in flight");
  ws.serve({ type: "error", id: null, code: "bad_frame", message: "expected a map" });
  assert.deepEqual(events.at(-1), ["error", null, "bad_frame", "expected a map"]);
  ws.onmessage({ data: new Uint8Array([0xc1]).buffer });
  assert.equal(events.at(-1)[2], "client_decode");
  const n = events.length;
  ws.serve({ type: "future-thing" });
  ws.serve({ type: "pong" });
  assert.equal(events.length, n);
});

test("nothing is sent while closed; close is reported", () => {
  const c = new CompleterClient("ws://h/ws", { WebSocketImpl: FakeSocket });
  assert.equal(c.complete({ doc: "a", prefix: "", suffix: "" }), null);
  const states = [];
  c.onState = (s) => states.push(s);
  c.connect();
  FakeSocket.last.open();
  FakeSocket.last.onclose({ code: 1006, reason: "" });
  assert.deepEqual(states, ["connecting", "open", "closed"]);
});

test("warmup triggers", () => {
  for (const s of ["\n", "(", "=", ":", "foo("]) assert.equal(isWarmupTrigger(s), true, s);
  for (const s of ["a", " ", ")", "", null]) assert.equal(isWarmupTrigger(s), false, String(s));
});

test("word-by-word accept pieces cover the ghost exactly", () => {
  assert.equal(nextWord("foo(bar)"), "foo");
  assert.equal(nextWord("(bar)"), "(");
  assert.equal(nextWord("  return x"), "  return");
  assert.equal(nextWord("\n    y = 1"), "\n");
  assert.equal(nextWord("    \n"), "    \n");
  assert.equal(nextWord("): "), "):");
  const ghost = "x + y)\n    return z  # done";
  let rest = ghost, pieces = [];
  while (rest) { const p = nextWord(rest); assert.ok(p.length > 0); pieces.push(p); rest = rest.slice(p.length); }
  assert.equal(pieces.join(""), ghost);
  assert.deepEqual(pieces.slice(0, 4), ["x", " +", " y", ")"]);
});

test("type-through keeps the rest of the ghost only when the typing matches", () => {
  assert.equal(typeThrough("return x", "re"), "turn x");
  assert.equal(typeThrough("return x", "x"), null);
  assert.equal(typeThrough("", "a"), null);
  assert.equal(typeThrough("ab", null), null);
});

test("token goes into the query, keeping other parameters", () => {
  assert.equal(withToken("ws://h:1/ws?a=1", "t k"), "ws://h:1/ws?a=1&token=t+k");
  assert.equal(withToken("ws://h:1/ws", ""), "ws://h:1/ws");
});

test("latency line from flat or nested stats", () => {
  assert.deepEqual(formatStats({ ttft_ms: 12.4, total_ms: 80.6, new_tokens: 3, accepted_per_forward: 1.5 }),
                   ["TTFT 12 ms", "total 81 ms", "3 tokens", "τ 1.50"]);
  assert.deepEqual(formatStats({ engine_ttft_ms: 16, total_ms: 34, engine: { new_tokens: 1, accepted_per_forward: 1, ttft_ms: 99 } }),
                   ["TTFT 16 ms", "total 34 ms", "1 token", "τ 1.00"]);
  assert.deepEqual(formatStats({}), []);
});

test("a ghost replaced by one that does not extend it is a withdrawal", () => {
  assert.equal(isWithdrawal("get_name, 'a', '", "get_name"), true);
  assert.equal(isWithdrawal("get_name", null), true);
  assert.equal(isWithdrawal("get_name", "get_name()"), false, "extended: nothing taken back");
  assert.equal(isWithdrawal("", "x"), false, "nothing was shown");
  assert.equal(isWithdrawal(null, null), false);
});

test("after a withdrawal the accept keys are held for the guard's time, then free again", () => {
  let now = 1000;
  const g = new AcceptGuard(ACCEPT_GUARD_MS, () => now);
  assert.equal(g.blocking, false, "no withdrawal yet");
  g.withdrawn();
  now += 299;
  assert.equal(g.blocking, true);
  now += 1;
  assert.equal(g.blocking, false);
});

test("next_edit: the request carries text, before and the cursor; the reply reaches onNextEdit", () => {
  const { c, ws } = connected();
  const got = [];
  c.onNextEdit = (id, edits, reason, stats, jump) => got.push([id, edits, reason, stats, jump]);
  const id = c.nextEdit({ doc: "a.py", text: "b = 1\n", before: "a = 1\n", line: 0, col: 1, language: "python" });
  assert.deepEqual(ws.sent.at(-1), { type: "next_edit", id, text: "b = 1\n", line: 0, col: 1, before: "a = 1\n",
                                     path: "a.py", language: "python" });
  const edits = [{ start_line: 1, start_col: 0, end_line: 1, end_col: 1, text: "b" }];
  ws.serve({ type: "next_edit", id, edits, stats: { total_ms: 5 } });
  assert.deepEqual(got, [[id, edits, null, { total_ms: 5 }, null]]);
  assert.equal(c.cancel(id), false, "answered: no longer in flight");
  ws.serve({ type: "next_edit", id: id + 1 });
  assert.deepEqual(got.at(-1)[1], [], "no edits field: nothing to suggest");
  const jump = { start_line: 9, start_col: 4, end_line: 9, end_col: 9, edits };
  ws.serve({ type: "next_edit", id: id + 2, edits: [], jump, stats: { source: "rename" } });
  assert.deepEqual(got.at(-1).slice(3), [{ source: "rename" }, jump], "the jump beside edits, not in stats");
});

test("feedback on a next edit says so", () => {
  const { c, ws } = connected();
  c.feedback(4, false, undefined, "next_edit");
  assert.deepEqual(ws.sent.at(-1), { type: "feedback", id: 4, accepted: false, kind: "next_edit" });
});
