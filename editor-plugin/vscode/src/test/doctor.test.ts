import { test } from "node:test";
import assert from "node:assert/strict";
import { DoctorReport, doctorLines, doctorNotice } from "../doctor";

// The shape of `completer doctor --json` (tests/test_doctor.py checks the server's side).
const down: DoctorReport = {
  usable: false,
  checks: [
    { name: "config", status: "ok", message: "no config files", fix: "" },
    { name: "engine", status: "fail", message: "cannot reach llama-server at http://127.0.0.1:9", fix: "start the server" },
    { name: "model", status: "skip", message: "not checked: no engine", fix: "" },
    { name: "editor", status: "ok", message: "vscode attached; position encoding utf-16; 1 open documents", fix: "" },
  ],
  first_problem: { name: "engine", status: "fail", message: "cannot reach llama-server at http://127.0.0.1:9", fix: "start the server" },
};

test("one line per check with its mark, names aligned, then the verdict and the fix", () => {
  assert.deepEqual(doctorLines(down), [
    "[ok]   config  no config files",
    "[FAIL] engine  cannot reach llama-server at http://127.0.0.1:9",
    "[skip] model   not checked: no engine",
    "[ok]   editor  vscode attached; position encoding utf-16; 1 open documents",
    "not usable; first problem: engine: cannot reach llama-server at http://127.0.0.1:9",
    "  fix: start the server",
  ]);
});

test("the notification's level says whether the setup is usable", () => {
  assert.deepEqual(doctorNotice(down), {
    level: "error", text: "completer doctor: engine: cannot reach llama-server at http://127.0.0.1:9 (fix: start the server)",
  });
  const quiet: DoctorReport = {
    usable: true,
    checks: [{ name: "trial", status: "warn", message: "nothing shown: the confidence rule dropped it", fix: "lower min_confidence" }],
    first_problem: { name: "trial", status: "warn", message: "nothing shown: the confidence rule dropped it", fix: "lower min_confidence" },
  };
  assert.equal(doctorNotice(quiet).level, "warning");
  assert.equal(doctorLines(quiet).at(-2), "usable; to look at: trial: nothing shown: the confidence rule dropped it");
  const fine: DoctorReport = { usable: true, checks: [{ name: "config", status: "ok", message: "x", fix: "" }], first_problem: null };
  assert.deepEqual(doctorNotice(fine), { level: "info", text: "completer doctor: every check passed" });
  assert.deepEqual(doctorLines(fine), ["[ok]   config  x", "usable"]);
});
