import { test } from "node:test";
import assert from "node:assert/strict";
import { EditorState, Text } from "@codemirror/state";
import { EDIT_PAUSE_MS, EditSnapshot, acceptNextEditSpec, editsToChanges, farEdit, followHint, followJumpSpec, fromCodePoints, jumpHint, jumpOf,
         jumpToNextEditSpec, nextEditField, setNextEdit, toCodePoints } from "../nextedit.js";

const DOC = "def area(width, height):\n    total = width * height\n    return size\n";
const edit = (sl, sc, el, ec, text) => ({ start_line: sl, start_col: sc, end_line: el, end_col: ec, text });

test("columns: UTF-16 units ↔ code points, past astral characters", () => {
  const line = "s = '😀é' + x";
  assert.equal(toCodePoints(line, 7), 6, "the emoji is 2 units, 1 code point");
  assert.equal(fromCodePoints(line, 6), 7);
  assert.equal(fromCodePoints(line, [...line].length), line.length, "the line's end");
  assert.equal(fromCodePoints(line, 99), -1);
  for (let cp = 0; cp <= [...line].length; cp++) assert.equal(toCodePoints(line, fromCodePoints(line, cp)), cp);
});

test("server edits become sorted document changes; bad ones are refused", () => {
  const doc = Text.of(DOC.split("\n"));
  assert.deepEqual(editsToChanges(doc, [edit(2, 11, 2, 15, "total")]), [{ from: 63, to: 67, insert: "total" }]);
  assert.equal(doc.sliceString(63, 67), "size");
  const astral = Text.of(["x = '😀' + y", ""]);
  assert.deepEqual(editsToChanges(astral, [edit(0, 10, 0, 11, "z")]), [{ from: 11, to: 12, insert: "z" }]);
  // An insertion after the final newline, two edits out of order.
  assert.deepEqual(editsToChanges(doc, [edit(3, 0, 3, 0, "print(1)\n"), edit(0, 4, 0, 8, "size")]),
                   [{ from: 4, to: 8, insert: "size" }, { from: doc.length, to: doc.length, insert: "print(1)\n" }]);
  assert.equal(editsToChanges(doc, [edit(9, 0, 9, 0, "x")]), null, "past the last line");
  assert.equal(editsToChanges(doc, [edit(0, 99, 0, 99, "x")]), null, "past a line's end");
  assert.equal(editsToChanges(doc, [edit(1, 5, 1, 2, "x")]), null, "ends before it starts");
  assert.equal(editsToChanges(doc, [edit(0, 0, 0, 5, "a"), edit(0, 3, 0, 4, "b")]), null, "overlapping");
  assert.equal(editsToChanges(doc, [{ start_line: 0 }]), null, "malformed");
});

function shown(doc, changes) {
  const s = EditorState.create({ doc, selection: { anchor: 10 }, extensions: [nextEditField] });
  return s.update({ effects: setNextEdit.of({ id: 7, changes }) }).state;
}

test("Tab's transaction applies every change and puts the cursor after the last", () => {
  const s = shown(DOC, [{ from: 4, to: 8, insert: "surface" }, { from: 63, to: 67, insert: "total" }]);
  const t = s.update(acceptNextEditSpec(s)).state;
  assert.equal(t.doc.toString(), "def surface(width, height):\n    total = width * height\n    return total\n");
  assert.equal(t.doc.sliceString(0, t.selection.main.head), "def surface(width, height):\n    total = width * height\n    return total");
  assert.equal(t.field(nextEditField), null);
});

test("any change to the document drops the suggestion; a cursor move keeps it", () => {
  const s = shown(DOC, [{ from: 63, to: 67, insert: "total" }]);
  assert.ok(s.update({ selection: { anchor: 0 } }).state.field(nextEditField));
  const typed = s.update({ changes: { from: 0, insert: "#" } }).state;
  assert.equal(typed.field(nextEditField), null, "stale: its offsets were on the old text");
  assert.equal(acceptNextEditSpec(typed), null, "nothing to apply: Tab does its usual");
});

test("the snapshot is the text before the first change after a pause", () => {
  let now = 0;
  const snap = new EditSnapshot("v0", () => now);
  snap.changed("v0");
  now += 200;
  snap.changed("v1");
  assert.equal(snap.text, "v0", "one burst of typing");
  now += EDIT_PAUSE_MS;
  snap.changed("v2");
  assert.equal(snap.text, "v2", "a pause began a new burst");
});

test("a suggestion outside the visible ranges: announced, Tab jumps to its start, then applies", () => {
  const doc = Array.from({ length: 200 }, (_, i) => `x${i + 1} = ${i + 1}`).join("\n") + "\n";
  const at = doc.indexOf("x150 ");
  const s = shown(doc, [{ from: at, to: at + 4, insert: "y150" }]);
  const top = [{ from: 0, to: 1200 }]; // what the view draws: the first lines (and a margin)
  assert.deepEqual(farEdit(s, top), { pos: at, line: 150, down: true });
  const hint = jumpHint(s, top).iter();
  assert.equal(hint.from, s.doc.lineAt(10).to, "at the end of the cursor's line");
  assert.equal(hint.value.spec.widget.line, 150);
  const jumped = s.update(jumpToNextEditSpec(s, top)).state;
  assert.equal(jumped.selection.main.head, at, "the cursor at the edit's start");
  assert.ok(jumped.field(nextEditField), "still shown: the jump is not the apply");
  const view = [{ from: at - 500, to: at + 500 }]; // scrolled there
  assert.equal(farEdit(jumped, view), null);
  assert.equal(jumpToNextEditSpec(jumped, view), null, "in view: the next Tab applies");
  assert.equal(jumpHint(jumped, view).size, 0, "and nothing is announced");
  assert.ok(acceptNextEditSpec(jumped).changes);
  const above = shown(doc, [{ from: 4, to: 6, insert: "one" }]);
  const lower = above.update({ selection: { anchor: at } }).state;
  assert.deepEqual(farEdit(lower, [{ from: at - 300, to: at + 300 }]), { pos: 4, line: 1, down: false }, "above: ↑");
  assert.equal(farEdit(EditorState.create({ doc, extensions: [nextEditField] }), top), null, "nothing shown");
});

test("an edit that reaches into the view is not far, even when it starts above it", () => {
  const doc = Array.from({ length: 200 }, (_, i) => `x${i + 1} = ${i + 1}`).join("\n") + "\n";
  const s = shown(doc, [{ from: 0, to: 3, insert: "a" }, { from: 900, to: 905, insert: "b" }]);
  assert.equal(farEdit(s, [{ from: 880, to: 2000 }]), null);
});

// The server's jump past the region (issue 39): a gutter mark at its line, a hint at the cursor;
// Tab goes there and shows the edit it carried, Tab again applies it.
const FAR = "def fetch_all(url):\n    return url\n\n\nx = fetch(1)\n";

test("a jump becomes a place and its changes on the document; outside it, nothing", () => {
  const doc = Text.of(FAR.split("\n"));
  const j = jumpOf(doc, { start_line: 4, start_col: 4, end_line: 4, end_col: 9, edits: [edit(4, 4, 4, 9, "fetch_all")] });
  assert.deepEqual(j, { pos: 41, line: 5, changes: [{ from: 41, to: 46, insert: "fetch_all" }] });
  assert.equal(doc.sliceString(41, 46), "fetch");
  assert.equal(jumpOf(doc, { start_line: 40, start_col: 0, edits: [] }), null);
  assert.equal(jumpOf(doc, null), null);
});

test("Tab on a jump: the cursor there with its edit shown (not applied); Tab again applies it", () => {
  const doc = Text.of(FAR.split("\n"));
  const jump = jumpOf(doc, { start_line: 4, start_col: 4, end_line: 4, end_col: 9, edits: [edit(4, 4, 4, 9, "fetch_all")] });
  let state = EditorState.create({ doc, selection: { anchor: 5 }, extensions: [nextEditField] });
  state = state.update({ effects: setNextEdit.of({ id: 3, changes: [], jump }) }).state;
  assert.equal(acceptNextEditSpec(state), null, "nothing to apply here");
  const hint = followHint(state);
  const texts = [];
  hint.between(0, state.doc.length, (from, to, d) => { texts.push([from, d.spec.widget.text]); });
  assert.deepEqual(texts, [[19, "⇥ Tab to jump: line 5 → fetch_all"]], "at the end of the cursor's line");
  state = state.update(followJumpSpec(state)).state;
  assert.equal(state.selection.main.head, 41, "the cursor at the place");
  assert.equal(state.doc.toString(), FAR, "nothing applied by the first Tab");
  assert.deepEqual(state.field(nextEditField).changes, jump.changes);
  state = state.update(acceptNextEditSpec(state)).state;
  assert.equal(state.doc.toString(), "def fetch_all(url):\n    return url\n\n\nx = fetch_all(1)\n");
  // a place that needs the user's own edit: the cursor goes there, nothing is shown or applied
  let s2 = EditorState.create({ doc, extensions: [nextEditField] });
  s2 = s2.update({ effects: setNextEdit.of({ id: 4, changes: [], jump: { pos: 41, line: 5, changes: [] } }) }).state;
  s2 = s2.update(followJumpSpec(s2)).state;
  assert.equal(s2.selection.main.head, 41);
  assert.equal(s2.field(nextEditField), null);
});

test("a jump is dropped with the text it was computed on", () => {
  const doc = Text.of(FAR.split("\n"));
  const jump = jumpOf(doc, { start_line: 4, start_col: 4, end_line: 4, end_col: 9, edits: [edit(4, 4, 4, 9, "fetch_all")] });
  let state = EditorState.create({ doc, extensions: [nextEditField] });
  state = state.update({ effects: setNextEdit.of({ id: 3, changes: [], jump }) }).state;
  state = state.update({ changes: { from: 0, insert: "# x\n" } }).state;
  assert.equal(state.field(nextEditField), null);
  assert.equal(followJumpSpec(state), null);
});
