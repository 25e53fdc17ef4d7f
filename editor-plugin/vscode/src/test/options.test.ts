import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { OPTIONS, checkValue, reloads, settingsChange, toInitializationOptions } from "../options";

test("set values map to the server's snake_case names; unset ones are not sent", () => {
  const { options, warnings } = toInitializationOptions({
    target: "/models/t", draft: "/models/d", maxNewTokens: 16, draftLen: 3, topP: 0.9,
    completeInComments: true, device: undefined, seed: undefined, engine: "",
  });
  assert.deepEqual(options, {
    target: "/models/t", draft: "/models/d", max_new_tokens: 16, draft_len: 3, top_p: 0.9,
    complete_in_comments: true,
  });
  assert.deepEqual(warnings, []);
});

test("the table is the schema's: snake_case options, camelCase settings", () => {
  const byOption = new Map(OPTIONS.map((o) => [o.option, o]));
  assert.equal(byOption.get("max_new_tokens")!.setting, "maxNewTokens");
  assert.equal(byOption.get("target")!.default, "", "an optional string's unset value");
  for (const name of ["enable", "debounce_ms", "multiline", "engine", "draft_len"]) assert.ok(byOption.has(name), name);
  assert.ok(!byOption.has("port"), "serve-only options are not the language server's");
  assert.equal(byOption.get("target")!.reload, true);
  assert.equal(byOption.get("max_lines")!.reload, false);
});

test("invalid values are dropped with a warning naming the setting", () => {
  const { options, warnings } = toInitializationOptions({
    maxNewTokens: 0, draftLen: 2.5, topP: 0, temperature: -1, kvBudgetMb: 0, quant: "int3",
    completeInDocstrings: "yes", seed: 7, typo: 1,
  });
  assert.deepEqual(options, { seed: 7 });
  const joined = warnings.join("\n");
  for (const s of ["maxNewTokens", "draftLen", "topP", "temperature", "kvBudgetMb", "quant",
                   "completeInDocstrings", "typo"]) {
    assert.match(joined, new RegExp(`completer\\.${s}`), s);
  }
  assert.equal(warnings.length, 8);
});

test("a settings change sends what changed, defaults for what was unset, and knows what reloads", () => {
  const before = { max_lines: 4, target: "/m/t", debounce_ms: 50 };
  const after = { max_lines: 8, debounce_ms: 50, enable: false };
  const change = settingsChange(before, after);
  assert.deepEqual(change, { max_lines: 8, enable: false, target: null });
  assert.deepEqual(reloads(change), ["target"]);
  assert.deepEqual(reloads(settingsChange(before, { ...before, max_lines: 2 })), []);
  assert.deepEqual(settingsChange(after, after), {});
});

test("bounds: inclusive maximum, exclusive minimum where the server needs > 0", () => {
  const topP = OPTIONS.find((o) => o.option === "top_p")!;
  assert.equal(checkValue(topP, 1).value, 1);
  assert.ok(checkValue(topP, 1.01).error);
  assert.ok(checkValue(topP, 0).error);
  const dl = OPTIONS.find((o) => o.option === "draft_len")!;
  assert.equal(checkValue(dl, 16).value, 16);
  assert.ok(checkValue(dl, 17).error);
  assert.ok(checkValue(dl, Number.NaN).error);
});

test("package.json contributes one setting per row (npm run gen:settings)", () => {
  const pkg = JSON.parse(readFileSync(join(__dirname, "..", "..", "package.json"), "utf8"));
  const props = pkg.contributes.configuration.properties;
  const optionKeys = Object.keys(props).filter((k) => !k.startsWith("completer.server."));
  assert.deepEqual(optionKeys.sort(), OPTIONS.map((o) => `completer.${o.setting}`).sort());
  for (const o of OPTIONS) {
    const p = props[`completer.${o.setting}`];
    assert.equal(p.type, o.type, o.setting);
    assert.deepEqual(p.default, o.default, o.setting);
    assert.deepEqual(p.enum, o.enum, o.setting);
  }
});

test("activation events and the document selector cover the same languages", () => {
  const pkg = JSON.parse(readFileSync(join(__dirname, "..", "..", "package.json"), "utf8"));
  const langs = pkg.activationEvents.map((e: string) => e.replace("onLanguage:", "")).sort();
  assert.deepEqual(langs, ["go", "javascript", "python", "rust", "typescript"]);
  const src = readFileSync(join(__dirname, "..", "..", "src", "extension.ts"), "utf8");
  const m = src.match(/const LANGUAGES = \[([^\]]*)\]/)!;
  assert.deepEqual(JSON.parse(`[${m[1]}]`).sort(), langs);
});
