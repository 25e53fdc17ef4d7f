/**
 * On/off for completions and the status bar menu, without the editor: completions are asked
 * for in a document only while `completer.enable` is on globally and for its language and no
 * snooze runs. The global switch is a server option too (sent with the other settings), so
 * the server answers empty even to a request already on its way; per language and snooze are
 * the client's alone.
 */

export interface SwitchState {
  /** `completer.enable` (global value). */
  enabled: boolean;
  /** The active editor's language, if any, and `completer.enable` for it. */
  language?: string;
  languageEnabled: boolean;
  /** Date.now() when the snooze ends; undefined when not snoozed. */
  snoozedUntil?: number;
  now: number;
}

export type MenuAction =
  | { kind: "enable"; on: boolean }
  | { kind: "language"; language: string; on: boolean }
  | { kind: "snooze"; minutes: number }
  | { kind: "doctor" }
  | { kind: "stats" }
  | { kind: "restart" };

export interface MenuItem { label: string; description?: string; action: MenuAction }

export function snoozing(s: SwitchState): boolean {
  return s.snoozedUntil !== undefined && s.snoozedUntil > s.now;
}

/** Whether to ask the server for a completion in a document of `s.language`. */
export function allowed(s: SwitchState): boolean {
  return s.enabled && s.languageEnabled && !snoozing(s);
}

/** Why completions are off (for the status bar), or undefined when they are on. */
export function offReason(s: SwitchState): string | undefined {
  if (!s.enabled) return "disabled";
  if (snoozing(s)) return `snoozed for ${Math.ceil((s.snoozedUntil! - s.now) / 60000)} min`;
  if (!s.languageEnabled) return `disabled for ${s.language}`;
  return undefined;
}

/** The quick-pick entries, in order, for the current state. */
export function menuItems(s: SwitchState): MenuItem[] {
  const items: MenuItem[] = [
    s.enabled
      ? { label: "$(circle-slash) Disable completions", description: "everywhere", action: { kind: "enable", on: false } }
      : { label: "$(check) Enable completions", description: "everywhere", action: { kind: "enable", on: true } },
  ];
  if (s.language) {
    items.push(s.languageEnabled
      ? { label: `$(circle-slash) Disable for ${s.language}`, action: { kind: "language", language: s.language, on: false } }
      : { label: `$(check) Enable for ${s.language}`, action: { kind: "language", language: s.language, on: true } });
  }
  if (snoozing(s)) {
    items.push({ label: "$(play) Resume", description: offReason(s), action: { kind: "snooze", minutes: 0 } });
  } else {
    items.push({ label: "$(clock) Snooze 5 minutes", action: { kind: "snooze", minutes: 5 } },
               { label: "$(clock) Snooze 30 minutes", action: { kind: "snooze", minutes: 30 } });
  }
  items.push({ label: "$(pulse) Check the setup (doctor)", description: "the first thing wrong, with its fix",
               action: { kind: "doctor" } },
             { label: "$(graph) Show server stats", action: { kind: "stats" } },
             { label: "$(debug-restart) Restart language server", action: { kind: "restart" } });
  return items;
}
