/**
 * Settings → `initializationOptions` for completer-lsp.
 *
 * Owns the table of server options (one row per option: the VS Code setting, the server's
 * name for it — the `completer` CLI flag with underscores — its type, bounds and default) and
 * the validation that turns user settings into the options object. package.json's
 * `contributes.configuration` mirrors this table; a test keeps the two equal.
 */

export type OptionType = "string" | "integer" | "number" | "boolean";

export interface OptionSpec {
  /** Setting key under `completer.` (camelCase, as VS Code settings are). */
  setting: string;
  /** initializationOptions key (the CLI flag name with underscores). */
  option: string;
  type: OptionType;
  /** The server's default; only used for the settings UI, never sent. */
  default: string | number | boolean;
  description: string;
  enum?: string[];
  /** Additional accepted string form, for values an enum cannot list (cuda:N). */
  pattern?: string;
  minimum?: number;
  maximum?: number;
  /** Bounds are exclusive rather than inclusive. */
  exclusiveMinimum?: boolean;
}

export const OPTIONS: readonly OptionSpec[] = [
  { setting: "target", option: "target", type: "string", default: "",
    description: "Target model: HF model directory or hub id. Empty: the embedded default pair." },
  { setting: "draft", option: "draft", type: "string", default: "",
    description: "Draft model sharing the target's tokenizer. Empty: the embedded default pair." },
  { setting: "device", option: "device", type: "string", default: "auto",
    enum: ["auto", "cpu", "cuda"], pattern: "^cuda:[0-9]+$",
    description: "auto | cpu | cuda | cuda:N" },
  { setting: "dtype", option: "dtype", type: "string", default: "auto",
    enum: ["auto", "float32", "bfloat16", "float16"],
    description: "Weights dtype. auto: float32 on CPU, bfloat16 on CUDA." },
  { setting: "quant", option: "quant", type: "string", default: "auto",
    enum: ["auto", "none", "fp16", "int8", "nf4", "fast-int8", "mixed"],
    description: "Target weights. auto: fp16 storage for a 16-bit checkpoint on CPU, else none." },
  { setting: "quantGroups", option: "quant_groups", type: "string",
    default: "embed=fp16,attn=int8,mlp=int4,head=int8",
    description: "Per-module-group precision for quant=mixed (embed, attn, mlp, head)." },
  { setting: "drafter", option: "drafter", type: "string", default: "combined",
    enum: ["combined", "model", "ngram", "fastpath", "none"],
    description: "Who proposes draft tokens for speculative decoding (none: plain decoding)." },
  { setting: "draftLen", option: "draft_len", type: "integer", default: 4, minimum: 1, maximum: 8,
    description: "Initial draft length k (adapted per document from acceptance)." },
  { setting: "maxNewTokens", option: "max_new_tokens", type: "integer", default: 64, minimum: 1,
    maximum: 1024, description: "Most tokens one completion may generate." },
  { setting: "temperature", option: "temperature", type: "number", default: 0, minimum: 0,
    maximum: 2, description: "Sampling temperature; 0 is greedy." },
  { setting: "topP", option: "top_p", type: "number", default: 1, minimum: 0, maximum: 1,
    exclusiveMinimum: true, description: "Nucleus sampling mass, in (0, 1]." },
  { setting: "kvBudgetMb", option: "kv_budget_mb", type: "number", default: 256, minimum: 0,
    exclusiveMinimum: true, description: "Memory for all per-document KV caches together (MB)." },
  { setting: "seed", option: "seed", type: "integer", default: 0, minimum: 0,
    description: "Random seed for sampling." },
  { setting: "engine", option: "engine", type: "string", default: "", pattern: "^wss?://",
    description: "ws://HOST:PORT of a running `completer serve` to use instead of loading models in the language server. Empty: in-process models." },
  { setting: "debounceMs", option: "debounce_ms", type: "integer", default: 75, minimum: 0,
    maximum: 5000, description: "Server-side debounce per document (ms): a newer request cancels the older one." },
  { setting: "warmup", option: "warmup", type: "boolean", default: true,
    description: "Prefill the model's cache on syntax triggers (newline, `(`, `=`, `:`) while typing." },
  { setting: "multiline", option: "multiline", type: "boolean", default: true,
    description: "Offer multi-line completions where the syntax allows (e.g. a block body)." },
  { setting: "maxLines", option: "max_lines", type: "integer", default: 16, minimum: 1, maximum: 200,
    description: "Most lines of a multi-line completion." },
  { setting: "completeInComments", option: "complete_in_comments", type: "boolean", default: false,
    description: "Offer completions inside comments." },
  { setting: "completeInStrings", option: "complete_in_strings", type: "boolean", default: false,
    description: "Offer completions inside string literals." },
  { setting: "completeInDocstrings", option: "complete_in_docstrings", type: "boolean", default: false,
    description: "Offer completions inside docstrings." },
];

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
      const inEnum = spec.enum ? spec.enum.includes(v) : false;
      const matches = spec.pattern ? new RegExp(spec.pattern).test(v) : false;
      if ((spec.enum || spec.pattern) && !inEnum && !matches) {
        const allowed = [...(spec.enum ?? []), ...(spec.pattern ? [`/${spec.pattern}/`] : [])].join(", ");
        return { error: `${name}: ${JSON.stringify(v)} is not one of ${allowed}` };
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

/** The package.json `contributes.configuration.properties` entries this table implies. */
export function configurationProperties(): Record<string, Record<string, unknown>> {
  const props: Record<string, Record<string, unknown>> = {};
  for (const o of OPTIONS) {
    const p: Record<string, unknown> = { type: o.type, default: o.default, markdownDescription: o.description };
    if (o.enum && !o.pattern) p.enum = o.enum;
    // Empty is "unset"; a pattern next to an enum admits the forms the enum cannot list.
    if (o.pattern) p.pattern = o.enum ? `^(${o.enum.join("|")})$|${o.pattern}` : `^$|${o.pattern}`;
    if (o.minimum !== undefined) p[o.exclusiveMinimum ? "exclusiveMinimum" : "minimum"] = o.minimum;
    if (o.maximum !== undefined) p.maximum = o.maximum;
    props[`completer.${o.setting}`] = p;
  }
  return props;
}
