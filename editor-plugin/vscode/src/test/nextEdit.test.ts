import { test } from "node:test";
import assert from "node:assert/strict";
import {
  Host, NextEditController, NextEditFeedback, Pos, Suggestion, TextEdit, Timers, applyEdits, checkEdits, draw, jumpLabel,
} from "../nextEdit";

const DOC = "def f(count):\n    total = count + 1\n    return count * 2\n";
const at = (line: number, character: number): Pos => ({ line, character });
const edit = (l1: number, c1: number, l2: number, c2: number, newText: string): TextEdit =>
  ({ range: { start: at(l1, c1), end: at(l2, c2) }, newText });
// The user renamed the parameter count → n; the suggestion carries it to the next two uses.
const RENAME = [edit(1, 12, 1, 17, "n"), edit(2, 11, 2, 16, "n")];
const everywhere = () => true;

test("edits apply to the text; the cursor lands after the last one", () => {
  const r = applyEdits(DOC, RENAME)!;
  assert.equal(r.text, "def f(count):\n    total = n + 1\n    return n * 2\n");
  assert.equal(r.text.slice(0, r.cursor), "def f(count):\n    total = n + 1\n    return n");
  // Inserting lines, deleting a line, in UTF-16 columns past an astral character.
  assert.equal(applyEdits("a😀b\nc\n", [edit(0, 3, 0, 3, "X\nY"), edit(1, 0, 2, 0, "")])!.text, "a😀X\nYb\n");
  assert.equal(applyEdits("ab\n", [edit(0, 5, 0, 5, "x")]), null, "past the end of a line");
  assert.equal(applyEdits("ab\n", [edit(3, 0, 3, 0, "x")]), null, "past the last line");
});

test("malformed replies are refused with a reason; edits come back sorted", () => {
  assert.match(checkEdits({ id: "1", edits: [] }).error!, /expected/);
  assert.match(checkEdits({ id: "1", version: 1, edits: [{ newText: "x" }] }).error!, /bad edit/);
  assert.match(checkEdits({ id: "1", version: 1, edits: [edit(2, 0, 1, 0, "")] }).error!, /bad edit/);
  assert.match(checkEdits({ id: "1", version: 1, edits: [edit(0, 0, 0, 4, ""), edit(0, 2, 0, 3, "")] }).error!,
               /overlapping/);
  assert.deepEqual(checkEdits({ id: "1", version: 1, edits: [RENAME[1], RENAME[0]] }).edits, RENAME);
});

test("drawing: removed text struck through, new text as ghost after it, the result in the hover", () => {
  const d = draw(DOC, RENAME, at(0, 11), everywhere, "python")!;
  assert.deepEqual(d.deletes, RENAME.map((e) => e.range));
  assert.deepEqual(d.inserts, [{ at: at(1, 17), text: "n" }, { at: at(2, 16), text: "n" }]);
  assert.deepEqual(d.hover.range, { start: at(1, 0), end: at(2, 20) });
  assert.match(d.hover.markdown, /```python\n {4}total = n \+ 1\n {4}return n \* 2\n```$/);
  assert.equal(d.jump, undefined);
  // A pure insertion has nothing struck; a multi-line one is drawn on one line, in full in the hover.
  const ins = draw(DOC, [edit(2, 0, 2, 0, "    print(n)\n")], at(1, 0), everywhere)!;
  assert.deepEqual(ins.deletes, []);
  assert.deepEqual(ins.inserts, [{ at: at(2, 0), text: "    print(n)⏎" }]);
  assert.match(ins.hover.markdown, /\n {4}print\(n\)\n {4}return count \* 2\n```$/);
  const long = draw(DOC, [edit(0, 0, 0, 0, "x".repeat(200))], at(0, 0), everywhere)!;
  assert.equal(long.inserts[0].text.length, 80);
});

test("an edit out of view is announced at the end of the cursor's line", () => {
  const d = draw(DOC, RENAME, at(0, 3), (p) => p.line === 0)!;
  assert.deepEqual(d.jump, { at: at(0, 13), text: "  ⇥ line 2: total = n + 1" });
  assert.equal(draw(DOC, [edit(9, 0, 9, 0, "x")], at(0, 0), everywhere), null, "an edit outside the document");
});

/** Timers the test fires by hand, and a host that records what the controller did. */
class FakeTimers implements Timers {
  pending = new Map<number, { fn: () => void; ms: number }>();
  private next = 1;
  set(fn: () => void, ms: number) { const h = this.next++; this.pending.set(h, { fn, ms }); return h; }
  clear(h: unknown) { this.pending.delete(h as number); }
  fire() { const all = [...this.pending.values()]; this.pending.clear(); all.forEach((t) => t.fn()); return all.map((t) => t.ms); }
}

function setup(opts: { enabled?: boolean } = {}) {
  const asked: { uri: string; signal: AbortSignal; resolve: (r: unknown) => void }[] = [];
  const shown: (Suggestion | undefined)[] = [];
  const feedback: NextEditFeedback[] = [];
  const warnings: string[] = [];
  const doc = { version: 5, others: {} as Record<string, number> };  // others: other documents' versions
  const host: Host = {
    ask: (uri, signal) => new Promise((resolve) => asked.push({ uri, signal, resolve })),
    version: (uri) => doc.others[uri] ?? doc.version,
    show: (_uri, s) => shown.push(s),
    feedback: (p) => feedback.push(p),
    enabled: () => opts.enabled ?? true,
    debounceMs: () => 300,
    warn: (m) => warnings.push(m),
  };
  const timers = new FakeTimers();
  return { c: new NextEditController(host, timers), timers, asked, shown, feedback, warnings, doc };
}

const tick = () => new Promise((r) => setImmediate(r));
const U = "file:///a.py";

test("asks after the debounce from the last change; a newer change restarts the wait", async () => {
  const t = setup();
  t.c.changed(U);
  t.c.changed(U);
  assert.equal(t.timers.pending.size, 1, "one wait per document");
  assert.deepEqual(t.timers.fire(), [300]);
  assert.equal(t.asked.length, 1);
  t.asked[0].resolve({ id: "s1", version: 5, edits: RENAME });
  await tick();
  assert.deepEqual(t.c.suggestion(U)?.edits, RENAME);
  assert.equal(t.shown.at(-1)?.id, "s1");
});

test("switched off (next_edit false, completions off or snoozed): no request at all", () => {
  const t = setup({ enabled: false });
  t.c.changed(U);
  t.c.chained(U);
  assert.equal(t.timers.pending.size, 0);
});

test("a change aborts the request in flight; its late reply is not shown", async () => {
  const t = setup();
  t.c.changed(U);
  t.timers.fire();
  const first = t.asked[0];
  t.doc.version = 6;
  t.c.changed(U);
  assert.equal(first.signal.aborted, true);
  first.resolve({ id: "late", version: 5, edits: RENAME });
  await tick();
  assert.equal(t.c.suggestion(U), undefined);
});

test("a reply computed on another version is dropped; empty and malformed ones show nothing", async () => {
  const t = setup();
  assert.equal(t.c.offer(U, { id: "a", version: 4, edits: RENAME }), false, "stale");
  assert.equal(t.c.offer(U, { id: "b", version: 5, edits: [] }), false, "nothing to suggest");
  assert.equal(t.c.offer(U, null), false);
  assert.equal(t.c.offer(U, { id: "c", version: 5, edits: [{ range: "x" }] }), false);
  assert.match(t.warnings[0], /bad edit/);
  assert.equal(t.shown.length, 0);
  assert.equal(t.feedback.length, 0);
});

test("Tab applies an edit in view, reports it accepted, and asks for the next one at once", () => {
  const t = setup();
  t.c.offer(U, { id: "s1", version: 5, edits: RENAME });
  assert.deepEqual(t.c.tab(U, everywhere), { kind: "apply", edits: RENAME });
  assert.deepEqual(t.feedback, [{ id: "s1", kind: "nextEdit", accepted: true }]);
  assert.equal(t.shown.at(-1), undefined, "cleared");
  t.doc.version = 6;
  t.c.changed(U); // the apply's own change: no debounce, not a rejection
  assert.equal(t.timers.pending.size, 0);
  t.c.applied(U, true);
  assert.deepEqual(t.timers.fire(), [0], "chained: asked at once");
  assert.equal(t.asked.length, 1);
  assert.deepEqual(t.c.tab(U, everywhere), { kind: "none" }, "nothing shown: Tab does its usual");
});

test("Tab first jumps to an edit out of view, then applies it", () => {
  const t = setup();
  t.c.offer(U, { id: "s1", version: 5, edits: RENAME });
  assert.deepEqual(t.c.tab(U, () => false), { kind: "jump", to: at(1, 12) });
  assert.ok(t.c.suggestion(U), "still shown after the jump");
  assert.equal(t.c.tab(U, everywhere).kind, "apply");
});

test("a suggestion whose document changed is never applied", () => {
  const t = setup();
  t.c.offer(U, { id: "s1", version: 5, edits: RENAME });
  t.doc.version = 7; // changed without a change event reaching the controller yet
  assert.deepEqual(t.c.tab(U, everywhere), { kind: "stale" });
  assert.deepEqual(t.feedback, [{ id: "s1", kind: "nextEdit", accepted: false }]);
  assert.equal(t.c.suggestion(U), undefined);
});

test("Esc, a new edit, a replacing reply and closing dismiss as rejected, once each", () => {
  const t = setup();
  t.c.offer(U, { id: "s1", version: 5, edits: RENAME });
  assert.equal(t.c.escape(U), true);
  assert.equal(t.c.escape(U), false, "nothing left: Esc does its usual");
  t.c.offer(U, { id: "s2", version: 5, edits: RENAME });
  t.c.offer(U, { id: "s3", version: 5, edits: RENAME });
  t.doc.version = 6;
  t.c.changed(U);
  t.c.offer(U, { id: "s4", version: 6, edits: RENAME });
  t.c.closed(U);
  assert.deepEqual(t.feedback.map((f) => [f.id, f.accepted]), [["s1", false], ["s2", false], ["s3", false], ["s4", false]]);
  assert.equal(t.timers.pending.size, 0, "closing ends the wait too");
});

test("an apply the editor refused is not taken for the user's change", () => {
  const t = setup();
  t.c.offer(U, { id: "s1", version: 5, edits: RENAME });
  t.c.tab(U, everywhere);
  t.c.applied(U, false);
  t.c.changed(U);
  assert.deepEqual(t.timers.fire(), [300]);
});

test("a request that fails is logged, not shown", async () => {
  const t = setup();
  t.c.chained(U);
  t.timers.fire();
  t.asked[0].resolve(Promise.reject(new Error("boom")));
  await tick();
  assert.match(t.warnings[0], /boom/);
});

// The server's jump (issue 39): the next place past the region, here in another file.
const B = "file:///pkg/b.py";
const JUMP = { uri: B, range: { start: at(2, 0), end: at(2, 5) }, version: 3, edits: [edit(2, 0, 2, 5, "fetch_all")] };

test("a jump-only reply is shown as 'Tab to jump' with where it goes and what it changes there", () => {
  const t = setup();
  assert.equal(t.c.offer(U, { id: "j1", version: 5, edits: [], jump: JUMP, left: 3 }), true);
  const label = jumpLabel(t.c.suggestion(U)!, DOC, at(0, 2))!;
  assert.deepEqual(label.at, at(0, 13), "at the end of the cursor's line");
  assert.equal(label.text, "  ⇥ Tab to jump: b.py:3 → fetch_all");
  assert.equal(label.status, "$(arrow-right) Tab to jump: b.py:3 · 3 left");
  // in the same file: the line alone; a call that needs an argument: no edit, said so
  const same = { ...JUMP, uri: U, edits: [] };
  t.c.offer(U, { id: "j2", version: 5, edits: [], jump: same });
  assert.equal(jumpLabel(t.c.suggestion(U)!, DOC, at(0, 0))!.text, "  ⇥ Tab to jump: 3 (needs your edit)");
  // with edits in the region the edits are shown (the jump comes after they are applied)
  t.c.offer(U, { id: "j3", version: 5, edits: RENAME, jump: JUMP });
  assert.equal(jumpLabel(t.c.suggestion(U)!, DOC, at(0, 0)), null);
});

test("Tab on a jump goes to its file and place, then asks there at once; the next Tab applies that answer", () => {
  const t = setup();
  t.c.offer(U, { id: "j1", version: 5, edits: [], jump: JUMP });
  t.doc.others[B] = 3;
  assert.deepEqual(t.c.tab(U, everywhere), { kind: "go", uri: B, to: at(2, 0) });
  assert.deepEqual(t.feedback, [{ id: "j1", kind: "nextEdit", accepted: true }]);
  t.c.arrived(B);
  assert.deepEqual(t.timers.fire(), [0]);
  assert.equal(t.asked[0].uri, B);
  assert.equal(t.c.offer(B, { id: "s2", version: 3, edits: JUMP.edits }), true);
  assert.deepEqual(t.c.tab(B, everywhere), { kind: "apply", edits: JUMP.edits });
});

test("a jump whose open target changed since the answer is refused, not followed", () => {
  const t = setup();
  t.c.offer(U, { id: "j1", version: 5, edits: [], jump: JUMP });
  t.doc.others[B] = 4;
  assert.deepEqual(t.c.tab(U, everywhere), { kind: "stale" });
  assert.deepEqual(t.feedback, [{ id: "j1", kind: "nextEdit", accepted: false }]);
  // a closed target (no version in the jump) is opened: the answer there is made for its text then
  t.c.offer(U, { id: "j2", version: 5, edits: [], jump: { ...JUMP, version: undefined } });
  assert.equal(t.c.tab(U, everywhere).kind, "go");
});

test("a malformed jump is refused with a reason", () => {
  const t = setup();
  assert.equal(t.c.offer(U, { id: "j", version: 5, edits: [], jump: { uri: 3, range: {}, edits: [] } }), false);
  assert.match(t.warnings[0], /bad jump/);
});

test("apply everywhere: the region's edits and every listed place by document, unless an open target changed", () => {
  const t = setup();
  const C = "file:///pkg/c.py";
  const locations = [JUMP, { uri: B, range: { start: at(5, 0), end: at(5, 5) }, version: 3, edits: [edit(5, 0, 5, 5, "fetch_all")] },
                     { uri: C, range: { start: at(0, 0), end: at(0, 5) }, edits: [edit(0, 0, 0, 5, "fetch_all")] }];
  t.doc.others[B] = 3;
  t.c.offer(U, { id: "j1", version: 5, edits: RENAME, jump: JUMP, locations });
  const got = t.c.everywhere(U);
  assert.equal(got.kind, "everywhere");
  const edits = (got as { edits: Map<string, TextEdit[]> }).edits;
  assert.deepEqual([...edits.keys()], [U, B, C]);
  assert.deepEqual(edits.get(U), RENAME);
  assert.deepEqual(edits.get(B)!.map((e) => e.range.start.line), [2, 5]);
  assert.deepEqual(t.feedback, [{ id: "j1", kind: "nextEdit", accepted: true }]);
  t.c.offer(U, { id: "j2", version: 5, edits: [], jump: JUMP, locations });
  t.doc.others[B] = 4;
  assert.deepEqual(t.c.everywhere(U), { kind: "stale" });
  assert.deepEqual(t.c.everywhere(U), { kind: "none" }, "dropped");
});
