// npm run gen:settings — the server options' settings from the option schema the Python CLI
// prints (`completer options --json-schema`): writes src/schema.json (the options completer-lsp
// reads: scopes engine, client, syntax, lsp, workspace) and package.json's contributes.configuration, as
// camelCased `completer.*` settings, and capabilities.untrustedWorkspaces: the settings VS Code
// ignores in a workspace's own settings until the user trusts it (the options the schema marks
// `x-trust`, as completer-lsp refuses them from a project's .completer.toml, plus the server
// executable and its arguments). Both outputs are committed; tests/test_editor_vscode.py checks
// them against the CLI. COMPLETER=/path/to/completer overrides the executable.
import { execFileSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const exe = process.env.COMPLETER ?? join(root, "..", "..", ".venv", "bin", "completer");
const LSP_SCOPES = ["engine", "client", "syntax", "lsp", "workspace"];

const schema = JSON.parse(execFileSync(exe, ["options", "--json-schema"], { encoding: "utf8" }));
const options = {};
for (const [name, p] of Object.entries(schema.properties)) {
  if (!LSP_SCOPES.includes(p["x-scope"])) continue;
  const types = Array.isArray(p.type) ? p.type : [p.type];
  const row = { type: types.find((t) => t !== "null"), nullable: types.includes("null"), default: p.default,
                description: p.description, scope: p["x-scope"], reload: p["x-reload"] === true };
  // A bound past 2^53 (an int64's) is no bound to a JavaScript number: left out.
  for (const k of ["enum", "minimum", "maximum", "exclusiveMinimum"]) {
    if (p[k] !== undefined && !(Math.abs(p[k]) > Number.MAX_SAFE_INTEGER)) row[k] = p[k];
  }
  options[name] = row;
}
writeFileSync(join(root, "src", "schema.json"), JSON.stringify(options, null, 2) + "\n");

const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
const pkgPath = join(root, "package.json");
const pkg = JSON.parse(readFileSync(pkgPath, "utf8"));
const props = pkg.contributes.configuration.properties;
for (const key of Object.keys(props)) if (!key.startsWith("completer.server.")) delete props[key];
for (const [name, o] of Object.entries(options)) {
  const p = { type: o.type, default: o.nullable && o.default === null ? "" : o.default };
  const note = o.reload ? " Changing it reloads the models." : "";
  p.markdownDescription = o.description.charAt(0).toUpperCase() + o.description.slice(1) + "." + note;
  for (const k of ["enum", "minimum", "maximum", "exclusiveMinimum"]) if (o[k] !== undefined) p[k] = o[k];
  // `enable` also switches completions per language ("[python]": {"completer.enable": false}).
  if (name === "enable") p.scope = "language-overridable";
  props[`completer.${camel(name)}`] = p;
}
const restricted = ["completer.server.path", "completer.server.args",
                    ...Object.keys(options).filter((n) => schema.properties[n]["x-trust"]).map((n) => `completer.${camel(n)}`)];
pkg.capabilities = {
  ...pkg.capabilities,
  untrustedWorkspaces: {
    supported: "limited",
    description: "In an untrusted workspace its own settings cannot choose the language server, the engine, " +
      "the models or the API key: " + restricted.join(", ") + " are read from your user settings only.",
    restrictedConfigurations: restricted,
  },
};
writeFileSync(pkgPath, JSON.stringify(pkg, null, 2) + "\n");
console.log(`gen:settings: ${Object.keys(options).length} options from ${exe}`);
