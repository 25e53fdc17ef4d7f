/**
 * Settings → `initializationOptions` for completer-lsp.
 *
 * Owns the table of server options (one row per option of the schema `completer options
 * --json-schema` prints, kept in src/schema.json by `npm run gen:settings`, which also writes
 * package.json's `contributes.configuration`) and the validation that turns user settings into
 * the options object. The server validates again; this gives the warning in the editor.
 */

import schema = require("./schema.json");

export type OptionType = "string" | "integer" | "number" | "boolean";

export interface OptionSpec {
  /** Setting key under `completer.` (camelCase, as VS Code settings are). */
  setting: string;
  /** initializationOptions key (the option's name in the schema, snake_case). */
  option: string;
  type: OptionType;
  /** The server's default ("" for an unset string); only for the settings UI, never sent. */
  default: string | number | boolean;
  description: string;
  enum?: string[];
  minimum?: number;
  maximum?: number;
  /** Bounds are exclusive rather than inclusive. */
  exclusiveMinimum?: boolean;
  /** Changing it makes the server load the models again. */
  reload: boolean;
}

interface SchemaRow {
  type: OptionType; nullable: boolean; default: string | number | boolean | null; description: string;
  reload: boolean; enum?: string[]; minimum?: number; maximum?: number; exclusiveMinimum?: number;
}

const camel = (s: string) => s.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

/** One row per option completer-lsp reads, from src/schema.json (`npm run gen:settings`). */
export const OPTIONS: readonly OptionSpec[] = Object.entries(schema as Record<string, SchemaRow>).map(
  ([name, r]) => ({
    setting: camel(name), option: name, type: r.type, default: r.default ?? "", description: r.description,
    reload: r.reload, enum: r.enum, maximum: r.maximum,
    ...(r.exclusiveMinimum !== undefined ? { minimum: r.exclusiveMinimum, exclusiveMinimum: true }
      : r.minimum !== undefined ? { minimum: r.minimum } : {}),
  }));

export type InitOptions = Record<string, string | number | boolean>;

export interface MappedOptions {
  options: InitOptions;
  /** One line per setting that was dropped, for the output channel / a warning. */
  warnings: string[];
}

/** Checks one value against its row; returns the value to send or an error message. */
export function checkValue(spec: OptionSpec, value: unknown): { value?: string | number | boolean; error?: string } {
  const name = `completer.${spec.setting}`;
  switch (spec.type) {
    case "boolean":
      if (typeof value !== "boolean") return { error: `${name}: expected true or false, got ${JSON.stringify(value)}` };
      return { value };
    case "string": {
      if (typeof value !== "string") return { error: `${name}: expected a string, got ${JSON.stringify(value)}` };
      const v = value.trim();
      if (spec.enum && !spec.enum.includes(v)) {
        return { error: `${name}: ${JSON.stringify(v)} is not one of ${spec.enum.join(", ")}` };
      }
      return { value: v };
    }
    case "integer":
    case "number": {
      if (typeof value !== "number" || !Number.isFinite(value)) {
        return { error: `${name}: expected a number, got ${JSON.stringify(value)}` };
      }
      if (spec.type === "integer" && !Number.isInteger(value)) {
        return { error: `${name}: expected an integer, got ${value}` };
      }
      if (spec.minimum !== undefined && (spec.exclusiveMinimum ? value <= spec.minimum : value < spec.minimum)) {
        return { error: `${name}: ${value} is below the minimum (${spec.exclusiveMinimum ? ">" : "≥"} ${spec.minimum})` };
      }
      if (spec.maximum !== undefined && value > spec.maximum) {
        return { error: `${name}: ${value} is above the maximum (≤ ${spec.maximum})` };
      }
      return { value };
    }
  }
}

/**
 * `userValues`: setting key → the value the user set (undefined when unset). Only explicitly
 * set values are sent: the server keeps its own defaults for the rest, so the two cannot
 * disagree about a default. Empty strings mean "unset" (the settings UI cannot delete a value).
 * Invalid values are dropped with a warning and the server default applies.
 */
export function toInitializationOptions(userValues: Record<string, unknown>): MappedOptions {
  const options: InitOptions = {};
  const warnings: string[] = [];
  for (const spec of OPTIONS) {
    const raw = userValues[spec.setting];
    if (raw === undefined || raw === null || (spec.type === "string" && raw === "")) continue;
    const { value, error } = checkValue(spec, raw);
    if (error !== undefined) warnings.push(`${error}; using the server default`);
    else if (value !== undefined && value !== "") options[spec.option] = value;
  }
  const known = new Set(OPTIONS.map((o) => o.setting));
  for (const key of Object.keys(userValues)) {
    if (!known.has(key)) warnings.push(`completer.${key}: unknown setting, ignored`);
  }
  return { options, warnings };
}

/**
 * The `completer` settings object for `workspace/didChangeConfiguration` that takes the server
 * from `before` to `after` (both from toInitializationOptions): changed and newly set values,
 * and the default (null for an optional string) for options no longer set. The server applies
 * it without a restart, reloading the models only for options marked `reload`.
 */
export function settingsChange(before: InitOptions, after: InitOptions): Record<string, unknown> {
  const change: Record<string, unknown> = {};
  for (const o of OPTIONS) {
    const a = after[o.option];
    if (a !== undefined && a !== before[o.option]) change[o.option] = a;
    else if (a === undefined && before[o.option] !== undefined) change[o.option] = o.default === "" ? null : o.default;
  }
  return change;
}

/** The options in `change` whose new value makes the server load the models again. */
export function reloads(change: Record<string, unknown>): string[] {
  return OPTIONS.filter((o) => o.reload && o.option in change).map((o) => o.option);
}
