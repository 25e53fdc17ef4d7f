import { test } from "node:test";
import assert from "node:assert/strict";
import { SwitchState, allowed, menuItems, offReason } from "../switches";

const base: SwitchState = { enabled: true, language: "python", languageEnabled: true, now: 1_000_000 };

test("completions are asked for only when on globally, for the language, and not snoozed", () => {
  assert.equal(allowed(base), true);
  assert.equal(offReason(base), undefined);
  assert.equal(allowed({ ...base, enabled: false }), false);
  assert.equal(offReason({ ...base, enabled: false }), "disabled");
  assert.equal(allowed({ ...base, languageEnabled: false }), false);
  assert.equal(offReason({ ...base, languageEnabled: false }), "disabled for python");
  const snoozed = { ...base, snoozedUntil: base.now + 5 * 60_000 };
  assert.equal(allowed(snoozed), false);
  assert.equal(offReason(snoozed), "snoozed for 5 min");
  assert.equal(allowed({ ...snoozed, now: snoozed.snoozedUntil }), true, "a snooze ends by itself");
});

test("the menu offers the opposite of each switch, snooze or resume, the doctor, stats and restart", () => {
  const kinds = (s: SwitchState) => menuItems(s).map((i) => i.action);
  assert.deepEqual(kinds(base), [
    { kind: "enable", on: false }, { kind: "language", language: "python", on: false },
    { kind: "snooze", minutes: 5 }, { kind: "snooze", minutes: 30 }, { kind: "doctor" }, { kind: "stats" },
    { kind: "restart" },
  ]);
  const off = kinds({ ...base, enabled: false, languageEnabled: false, snoozedUntil: base.now + 1 });
  assert.deepEqual(off.slice(0, 3), [
    { kind: "enable", on: true }, { kind: "language", language: "python", on: true }, { kind: "snooze", minutes: 0 },
  ]);
  assert.equal(menuItems({ ...base, language: undefined }).some((i) => i.action.kind === "language"), false);
  assert.match(menuItems({ ...base, snoozedUntil: base.now + 60_000 })[2].label, /Resume/);
});
