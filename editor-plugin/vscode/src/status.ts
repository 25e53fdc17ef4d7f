/**
 * The status bar item's text and tooltip, from the client state and `$/progress` values.
 *
 * Several progress tokens may run at once (target and draft loading); the item shows the most
 * recent one and returns to "ready" only when every token has ended.
 */

export type Phase = "stopped" | "starting" | "loading" | "ready" | "off" | "error";

export interface ProgressValue {
  kind: "begin" | "report" | "end";
  title?: string;
  message?: string;
  percentage?: number;
}

export interface StatusView {
  text: string;
  tooltip: string;
  phase: Phase;
}

export class StatusModel {
  private phase: Phase = "stopped";
  private active = new Map<string, { title: string; message?: string; percentage?: number }>();
  private last?: string;
  private error?: string;

  starting(): void { this.phase = "starting"; this.active.clear(); this.error = undefined; }

  /** The client finished `initialize`: ready unless a load is still being reported. */
  running(): void { if (this.phase !== "error") this.phase = this.active.size ? "loading" : "ready"; }

  stopped(): void { this.phase = "stopped"; this.active.clear(); }

  failed(message: string): void { this.phase = "error"; this.error = message; this.active.clear(); }

  progress(token: string | number, value: ProgressValue): void {
    const key = String(token);
    if (value.kind === "end") {
      this.active.delete(key);
      if (this.last === key) this.last = [...this.active.keys()].pop();
      // The server ends its load with the engine's state: "ready" or "failed: <why>".
      if (value.message?.startsWith("failed")) this.failed(`engine ${value.message}`);
      else if (!this.active.size && this.phase === "loading") this.phase = "ready";
      return;
    }
    const prev = this.active.get(key);
    this.active.set(key, {
      title: value.title ?? prev?.title ?? "loading",
      message: value.message ?? prev?.message,
      percentage: value.percentage ?? prev?.percentage,
    });
    this.last = key;
    if (this.phase !== "error" && this.phase !== "stopped") this.phase = "loading";
  }

  /** `off`: why completions are switched off (switches.ts offReason), shown once ready. */
  view(off?: string): StatusView {
    if (this.phase === "ready" && off) {
      return { phase: "off", text: "$(circle-slash) completer", tooltip: `completer: ${off} (click for the menu)` };
    }
    switch (this.phase) {
      case "loading": {
        const p = this.active.get(this.last ?? "")!;
        const pct = p.percentage !== undefined ? ` ${Math.round(p.percentage)}%` : "";
        const detail = [p.title, p.message].filter(Boolean).join(": ");
        return { phase: "loading", text: `$(sync~spin) completer${pct}`, tooltip: `completer-lsp: ${detail}${pct}` };
      }
      case "ready":
        return { phase: "ready", text: "$(check) completer", tooltip: "completer-lsp: ready (Tab accepts, Ctrl+Right a word, Ctrl+Down a line; click for the menu)" };
      case "starting":
        return { phase: "starting", text: "$(sync~spin) completer", tooltip: "completer-lsp: starting" };
      case "error":
        return { phase: "error", text: "$(error) completer", tooltip: `completer-lsp: ${this.error}` };
      default:
        return { phase: "stopped", text: "$(circle-slash) completer", tooltip: "completer-lsp: stopped" };
    }
  }
}
