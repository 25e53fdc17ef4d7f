import { test } from "node:test";
import assert from "node:assert/strict";
import { FeedbackTracker, isWithdrawal, textAfterCursor } from "../feedback";

const U = "file:///w/a.py";

test("the accept command reports the whole item", () => {
  const t = new FeedbackTracker();
  t.offered(U, "a + b", 10);
  t.changed(U, [{ offset: 10, length: 0, text: "a + b" }]);
  assert.deepEqual(t.accepted(U, "a + b"), { uri: U, text: "a + b", accepted: true, acceptedChars: 5 });
  assert.equal(t.beforeRequest(U), undefined, "nothing left pending after an accept");
});

test("an item replaced by the next request without edits is rejected", () => {
  const t = new FeedbackTracker();
  t.offered(U, "return x", 4);
  assert.deepEqual(t.beforeRequest(U), { uri: U, text: "return x", accepted: false });
  assert.equal(t.beforeRequest(U), undefined);
});

test("word-by-word partial accepts add up to acceptedChars", () => {
  const t = new FeedbackTracker();
  t.offered(U, "foo(bar, baz)", 0);
  t.changed(U, [{ offset: 0, length: 0, text: "foo" }]);
  t.changed(U, [{ offset: 3, length: 0, text: "(bar" }]);
  assert.deepEqual(t.beforeRequest(U), { uri: U, text: "foo(bar, baz)", accepted: true, acceptedChars: 7 });
});

test("typing something else stops the count and keeps the offered text", () => {
  const t = new FeedbackTracker();
  t.offered(U, "foo()", 0);
  t.changed(U, [{ offset: 0, length: 0, text: "f" }]);
  t.changed(U, [{ offset: 1, length: 0, text: "x" }]);
  t.changed(U, [{ offset: 2, length: 0, text: "oo" }]);
  assert.deepEqual(t.closed(U), { uri: U, text: "foo()", accepted: true, acceptedChars: 1 });
});

test("deleting into the item or typing a mismatch first is a rejection", () => {
  const t = new FeedbackTracker();
  t.offered(U, "xyz", 5);
  t.changed(U, [{ offset: 4, length: 1, text: "" }]);
  assert.deepEqual(t.beforeRequest(U), { uri: U, text: "xyz", accepted: false });
  t.offered(U, "xyz", 5);
  t.changed(U, [{ offset: 5, length: 0, text: "q" }]);
  assert.equal(t.beforeRequest(U)!.accepted, false);
});

test("edits before the item shift it; edits after it are ignored", () => {
  const t = new FeedbackTracker();
  t.offered(U, "abc", 10);
  t.changed(U, [{ offset: 0, length: 0, text: "12" }]);       // item now at 12
  t.changed(U, [{ offset: 40, length: 3, text: "" }]);
  t.changed(U, [{ offset: 12, length: 0, text: "ab" }]);
  assert.deepEqual(t.closed(U), { uri: U, text: "abc", accepted: true, acceptedChars: 2 });
});

test("documents are tracked separately; empty items are not offers", () => {
  const t = new FeedbackTracker();
  const V = "file:///w/b.py";
  t.offered(U, "u", 0);
  t.offered(V, "", 0);
  assert.equal(t.beforeRequest(V), undefined);
  assert.equal(t.beforeRequest(U)!.text, "u");
});

test("text after the cursor drops what the range repeats", () => {
  assert.equal(textAfterCursor("return a + b", "ret"), "urn a + b");
  assert.equal(textAfterCursor("a + b", ""), "a + b");
  assert.equal(textAfterCursor("other", "xy"), "other");
});

test("a reply that does not continue what is still shown is a withdrawal", () => {
  const t = new FeedbackTracker();
  t.offered(U, "get_name, 'a', '", 10);
  t.changed(U, [{ offset: 10, length: 0, text: "get" }]); // typed through: "_name, 'a', '" still shown
  assert.equal(t.shown(U), "_name, 'a', '");
  assert.equal(isWithdrawal(t.shown(U), "_name"), true, "shorter: taken back");
  assert.equal(isWithdrawal(t.shown(U), ""), true, "nothing: taken back");
  assert.equal(isWithdrawal(t.shown(U), "_name, 'a', 'b')"), false, "continued");
  t.changed(U, [{ offset: 13, length: 0, text: "x" }]); // diverged: VS Code hid it already
  assert.equal(t.shown(U), undefined);
  assert.equal(isWithdrawal(t.shown(U), ""), false);
  assert.equal(isWithdrawal(undefined, "x"), false);
});
