import { test } from "node:test";
import assert from "node:assert/strict";
import { EditorState, Text } from "@codemirror/state";
import { EDIT_PAUSE_MS, EditSnapshot, acceptNextEditSpec, editsToChanges, fromCodePoints, nextEditField, setNextEdit,
         toCodePoints } from "../nextedit.js";

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
