import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { OPTIONS, checkValue, configurationProperties, toInitializationOptions } from "../options";

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

test("every server option has exactly one row", () => {
  const names = OPTIONS.map((o) => o.option).sort();
  assert.deepEqual(names, [
    "complete_in_comments", "complete_in_docstrings", "complete_in_strings", "debounce_ms", "device",
    "draft", "draft_len", "drafter", "dtype", "engine", "kv_budget_mb", "max_lines", "max_new_tokens",
    "multiline", "quant", "quant_groups", "seed", "target", "temperature", "top_p", "warmup",
  ]);
});

test("invalid values are dropped with a warning naming the setting", () => {
  const { options, warnings } = toInitializationOptions({
    maxNewTokens: 0, draftLen: 2.5, topP: 0, temperature: -1, kvBudgetMb: 0, quant: "int4",
    device: "gpu", engine: "http://localhost:7421", completeInDocstrings: "yes", seed: 7, typo: 1,
  });
  assert.deepEqual(options, { seed: 7 });
  const joined = warnings.join("\n");
  for (const s of ["maxNewTokens", "draftLen", "topP", "temperature", "kvBudgetMb", "quant", "device",
                   "engine", "completeInDocstrings", "typo"]) {
    assert.match(joined, new RegExp(`completer\\.${s}`), s);
  }
  assert.equal(warnings.length, 10);
});

test("device accepts cuda:N beside the enum; engine needs ws:// or wss://", () => {
  const dev = OPTIONS.find((o) => o.option === "device")!;
  assert.equal(checkValue(dev, "cuda:1").value, "cuda:1");
  assert.equal(checkValue(dev, "cpu").value, "cpu");
  assert.ok(checkValue(dev, "cuda:").error);
  const eng = OPTIONS.find((o) => o.option === "engine")!;
  assert.equal(checkValue(eng, " ws://127.0.0.1:7421 ").value, "ws://127.0.0.1:7421");
  assert.equal(checkValue(eng, "wss://host/ws").value, "wss://host/ws");
  assert.ok(checkValue(eng, "127.0.0.1:7421").error);
});

test("bounds: inclusive maximum, exclusive minimum where the server needs > 0", () => {
  const topP = OPTIONS.find((o) => o.option === "top_p")!;
  assert.equal(checkValue(topP, 1).value, 1);
  assert.ok(checkValue(topP, 1.01).error);
  assert.ok(checkValue(topP, 0).error);
  const dl = OPTIONS.find((o) => o.option === "draft_len")!;
  assert.equal(checkValue(dl, 8).value, 8);
  assert.ok(checkValue(dl, 9).error);
  assert.ok(checkValue(dl, Number.NaN).error);
});

test("package.json contributes exactly the table's settings", () => {
  const pkg = JSON.parse(readFileSync(join(__dirname, "..", "..", "package.json"), "utf8"));
  const props = pkg.contributes.configuration.properties;
  const fromTable = configurationProperties();
  const optionKeys = Object.keys(props).filter((k) => !k.startsWith("completer.server."));
  assert.deepEqual(optionKeys.sort(), Object.keys(fromTable).sort());
  for (const [k, v] of Object.entries(fromTable)) assert.deepEqual(props[k], v, k);
});

test("each settings pattern agrees with the validator", () => {
  for (const o of OPTIONS.filter((x) => x.type === "string")) {
    const p = configurationProperties()[`completer.${o.setting}`];
    const samples = ["", "auto", "cpu", "cuda", "cuda:0", "cuda:x", "ws://h:1", "http://h", "int8", "bogus"];
    // An empty string means "unset" to the validator; only free-form settings offer it in the UI.
    for (const s of samples.filter((x) => x !== "" || !o.enum)) {
      const schemaOk = p.pattern ? new RegExp(p.pattern as string).test(s)
        : p.enum ? (p.enum as string[]).includes(s) : true;
      const validatorOk = s === "" || checkValue(o, s).error === undefined;
      assert.equal(schemaOk, validatorOk, `${o.setting}: ${JSON.stringify(s)}`);
    }
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
