import { test } from "node:test";
import assert from "node:assert/strict";
import { StatusModel } from "../status";

test("starting → loading with percentage → ready when the load ends", () => {
  const s = new StatusModel();
  assert.equal(s.view().phase, "stopped");
  s.starting();
  assert.equal(s.view().phase, "starting");
  s.progress("load", { kind: "begin", title: "loading models", percentage: 0 });
  s.running();
  assert.equal(s.view().phase, "loading", "initialize finishing does not hide a running load");
  s.progress("load", { kind: "report", message: "target", percentage: 40 });
  const v = s.view();
  assert.equal(v.text, "$(sync~spin) completer 40%");
  assert.equal(v.tooltip, "completer-lsp: loading models: target 40%");
  s.progress("load", { kind: "end" });
  assert.equal(s.view().phase, "ready");
  assert.match(s.view().tooltip, /Tab accepts/);
});

test("two loads: ready only after both end; the latest one is shown", () => {
  const s = new StatusModel();
  s.starting();
  s.progress(1, { kind: "begin", title: "target" });
  s.progress(2, { kind: "begin", title: "draft", percentage: 10 });
  assert.match(s.view().tooltip, /draft 10%/);
  s.progress(2, { kind: "end" });
  assert.equal(s.view().phase, "loading");
  assert.match(s.view().tooltip, /target/);
  s.progress(1, { kind: "end" });
  assert.equal(s.view().phase, "ready");
});

test("a failed start shows the error and ignores later progress", () => {
  const s = new StatusModel();
  s.starting();
  s.failed("spawn completer-lsp ENOENT");
  s.progress("x", { kind: "begin", title: "loading" });
  s.running();
  assert.equal(s.view().phase, "error");
  assert.match(s.view().tooltip, /ENOENT/);
  s.starting();
  s.running();
  assert.equal(s.view().phase, "ready");
});

test("no progress at all: ready as soon as the client runs", () => {
  const s = new StatusModel();
  s.starting();
  s.running();
  assert.equal(s.view().text, "$(check) completer");
  s.stopped();
  assert.equal(s.view().phase, "stopped");
});

test("switched off: once ready the item says so and why; loading still shows the load", () => {
  const s = new StatusModel();
  s.starting();
  s.running();
  assert.equal(s.view("snoozed for 5 min").phase, "off");
  assert.equal(s.view("snoozed for 5 min").text, "$(circle-slash) completer");
  assert.match(s.view("disabled for python").tooltip, /disabled for python/);
  assert.equal(s.view(undefined).phase, "ready");
  s.progress("load", { kind: "begin", title: "loading models", percentage: 10 });
  assert.equal(s.view("disabled").phase, "loading");
});

test("a load that ends failed shows the error", () => {
  const s = new StatusModel();
  s.starting();
  s.progress("load", { kind: "begin", title: "completer", message: "loading models", percentage: 0 });
  s.progress("load", { kind: "end", message: "failed: ModelError: cannot load model /x" });
  assert.equal(s.view().phase, "error");
  assert.match(s.view().tooltip, /failed: ModelError/);
});
