import { test } from "node:test";
import assert from "node:assert/strict";
import { EditorState } from "@codemirror/state";
import { nextLine } from "../client.js";
import { acceptSpec, ghostField, setGhost } from "../ghost.js";

/** A document with the cursor at its end and `ghost` shown there. */
function withGhost(doc, ghost) {
  const s = EditorState.create({ doc, selection: { anchor: doc.length }, extensions: [ghostField] });
  return s.update({ effects: setGhost.of({ at: doc.length, text: ghost }) }).state;
}

const type = (s, text) => s.update({ changes: { from: s.selection.main.head, insert: text },
                                     selection: { anchor: s.selection.main.head + text.length } }).state;

test("typing the ghost's next characters keeps the rest; typing anything else drops it", () => {
  let s = withGhost("x = ", "foo(a, b)");
  s = type(s, "fo");
  assert.deepEqual(s.field(ghostField), { at: 6, text: "o(a, b)" });
  s = type(s, "x");
  assert.equal(s.field(ghostField), null);
});

test("moving the cursor or editing elsewhere drops the ghost", () => {
  const s = withGhost("x = 1\ny = ", "2");
  assert.equal(s.update({ selection: { anchor: 0 } }).state.field(ghostField), null);
  assert.equal(s.update({ changes: { from: 0, insert: "#" } }).state.field(ghostField), null);
  assert.deepEqual(s.update({ selection: { anchor: s.doc.length } }).state.field(ghostField), { at: 10, text: "2" });
});

test("accept takes all, a word or a line, and leaves the rest shown after the cursor", () => {
  const s = withGhost("def f(", "a, b):\n    return a + b");
  const word = acceptSpec(s, "word");
  assert.equal(word.taken, "a");
  let t = s.update(word.spec).state;
  assert.equal(t.doc.toString(), "def f(a");
  assert.deepEqual(t.field(ghostField), { at: 7, text: ", b):\n    return a + b" });
  assert.equal(t.selection.main.head, 7);
  const line = acceptSpec(t, "line");
  assert.equal(line.taken, ", b):");
  t = t.update(line.spec).state;
  assert.equal(acceptSpec(t, "line").taken, "\n    return a + b");
  t = t.update(acceptSpec(t, "all").spec).state;
  assert.equal(t.doc.toString(), "def f(a, b):\n    return a + b");
  assert.equal(t.field(ghostField), null);
  assert.equal(acceptSpec(t, "all"), null, "nothing to accept: the key does its usual");
});

test("nextLine: the rest of the line, or a line break with the next line", () => {
  assert.equal(nextLine("abc\ndef"), "abc");
  assert.equal(nextLine("\n  x\ny"), "\n  x");
  assert.equal(nextLine(""), "");
});
