import { test } from "node:test";
import assert from "node:assert/strict";
import { EditorState } from "@codemirror/state";
import { alternativeTexts } from "../client.js";
import { cycleGhost, ghostField, setGhost } from "../ghost.js";

const doc = "x = ";
const at = doc.length;
const shown = (text) => EditorState.create({ doc, selection: { anchor: at }, extensions: [ghostField] })
  .update({ effects: setGhost.of(text === null ? null : { at, text }) }).state;

test("next and previous cycle through the completion and its alternatives, wrapping around", () => {
  const texts = ["foo(a)", "bar(a)", "baz"];
  assert.deepEqual(cycleGhost(shown("foo(a)"), at, texts, 1), { at, text: "bar(a)" });
  assert.deepEqual(cycleGhost(shown("baz"), at, texts, 1), { at, text: "foo(a)" });
  assert.deepEqual(cycleGhost(shown("foo(a)"), at, texts, -1), { at, text: "baz" });
});

test("nothing to cycle: no ghost, one text, a ghost typed into or elsewhere", () => {
  assert.equal(cycleGhost(shown(null), at, ["a", "b"], 1), null);
  assert.equal(cycleGhost(shown("a"), at, ["a"], 1), null);
  assert.equal(cycleGhost(shown("oo(a)"), at, ["foo(a)", "bar"], 1), null);
  assert.equal(cycleGhost(shown("a"), at + 1, ["a", "b"], 1), null);
});

test("the alternatives' texts come from a done frame's stats, best first", () => {
  assert.deepEqual(alternativeTexts({ alternatives: [{ text: "b", confidence: 0.3 }, { text: "" }, {}, null, { text: "c" }] }),
                   ["b", "c"]);
  assert.deepEqual(alternativeTexts({ ttft_ms: 3 }), []);
  assert.deepEqual(alternativeTexts(undefined), []);
});
