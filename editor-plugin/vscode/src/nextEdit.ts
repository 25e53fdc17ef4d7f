/**
 * Next-edit suggestions without the editor: when to ask `completer/nextEdit`, which reply to
 * show, what to draw for it, and what Tab and Esc do. extension.ts turns the results into
 * decorations, a context key (`completer.nextEditShown`, which binds Tab and Esc) and edits.
 *
 *  - Asking: `nextEditDebounceMs` after the user's last change to a document, and at once after
 *    the user accepts a completion or a next edit (chained suggestions). A change aborts the
 *    request in flight and dismisses what is shown (reported as rejected).
 *  - Staleness: a reply computed on another document version than the current one is dropped;
 *    a shown suggestion whose document changed is never applied (Tab drops it instead).
 *  - Tab: an edit out of view is announced at the cursor and the first Tab jumps there; an edit
 *    in view is applied (reported as accepted), then the next suggestion is asked for.
 *  - Jumps (the server's `jump`, another place or file past the region): "Tab to jump" at the
 *    cursor; Tab opens the target there (a target whose version changed since is refused) and
 *    asks at once: the next Tab applies that answer, made for the document as it is then.
 *    "Apply everywhere" (completer.nextEdit.applyAll) applies every place the answer lists at
 *    once, unless an open target changed since.
 *  - Esc: dismissed, reported as rejected.
 *
 * Positions are LSP positions in UTF-16 code units, as VS Code's are.
 */

export interface Pos { line: number; character: number }
export interface Range { start: Pos; end: Pos }
export interface TextEdit { range: Range; newText: string }

/**
 * The next place past the region (another file too, open or not): the edit it will get, in
 * that document's coordinates, and its version when it was open (a closed file has none).
 */
export interface Jump { uri: string; range: Range; version?: number; edits: TextEdit[] }

/**
 * The result of `completer/nextEdit`: `version` is the document version it was computed on;
 * `jump` the next place outside the shown edits, `left` the places still to go.
 */
export interface NextEditReply {
  id: string; version: number; edits: TextEdit[]; reason?: string; jump?: Jump; left?: number;
  /** Every place left past the region (the jump's first), for applying the change everywhere at once. */
  locations?: Jump[];
}

/** `completer/feedback` for a next edit. */
export interface NextEditFeedback { id: string; kind: "nextEdit"; accepted: boolean }

/** A reply being shown for the document `uri`. */
export interface Suggestion extends NextEditReply { uri: string }

export const DEFAULT_DEBOUNCE_MS = 300;

/** Longest text drawn inline; the whole edit is in the hover. */
const MAX_INLINE = 80;

const before = (a: Pos, b: Pos) => a.line < b.line || (a.line === b.line && a.character < b.character);

function isPos(p: unknown): p is Pos {
  const q = p as Pos;
  return typeof q === "object" && q !== null && Number.isInteger(q.line) && Number.isInteger(q.character) &&
    q.line >= 0 && q.character >= 0;
}

/**
 * The reply's edits sorted by position, or an error when the reply is malformed: an edit
 * without a range or text, a range that ends before it starts, edits that overlap.
 */
export function checkEdits(reply: unknown): { edits?: TextEdit[]; error?: string } {
  const r = reply as NextEditReply;
  if (typeof r !== "object" || r === null || typeof r.id !== "string" || !Number.isInteger(r.version) ||
      !Array.isArray(r.edits)) {
    return { error: "expected {id, version, edits}" };
  }
  for (const e of r.edits) {
    if (typeof e !== "object" || e === null || typeof e.newText !== "string" || !isPos(e.range?.start) ||
        !isPos(e.range?.end) || before(e.range.end, e.range.start)) {
      return { error: `bad edit ${JSON.stringify(e).slice(0, 200)}` };
    }
  }
  const edits = [...r.edits].sort((a, b) => before(a.range.start, b.range.start) ? -1 : 1);
  for (let i = 1; i < edits.length; i++) {
    if (before(edits[i].range.start, edits[i - 1].range.end)) return { error: "overlapping edits" };
  }
  if (r.jump !== undefined && r.jump !== null) {
    const j = r.jump;
    if (typeof j !== "object" || typeof j.uri !== "string" || !isPos(j.range?.start) || !isPos(j.range?.end) ||
        (j.version !== undefined && j.version !== null && !Number.isInteger(j.version)) || !Array.isArray(j.edits) ||
        j.edits.some((e) => typeof e?.newText !== "string" || !isPos(e.range?.start) || !isPos(e.range?.end))) {
      return { error: `bad jump ${JSON.stringify(j).slice(0, 200)}` };
    }
  }
  return { edits };
}

/** The file name of a URI (what a jump into another file is labelled with). */
function fileName(uri: string): string {
  return decodeURIComponent(uri.slice(uri.lastIndexOf("/") + 1));
}

/**
 * The "Tab to jump" marker of a jump-only suggestion, drawn at the end of the cursor's line:
 * where it goes (file and line) and what it will change there.
 */
export function jumpLabel(s: Suggestion, text: string, cursor: Pos): { at: Pos; text: string; status: string } | null {
  const j = s.jump;
  if (!j || s.edits.length > 0) return null;
  const lines = text.split("\n");
  const where = (j.uri === s.uri ? "" : fileName(j.uri) + ":") + `${j.range.start.line + 1}`;
  const what = j.edits.length ? ` → ${inline(j.edits.map((e) => e.newText).join(" "))}` : " (needs your edit)";
  const left = s.left && s.left > 1 ? ` · ${s.left} left` : "";
  return {
    at: { line: cursor.line, character: lines[cursor.line]?.length ?? 0 },
    text: `  ⇥ Tab to jump: ${where}${what}`,
    status: `$(arrow-right) Tab to jump: ${where}${left}`,
  };
}

/** Offset of `p` in `text` (UTF-16), or -1 when it is not in the text. */
function offsetAt(text: string, starts: number[], p: Pos): number {
  if (p.line >= starts.length) return -1;
  const lineEnd = p.line + 1 < starts.length ? starts[p.line + 1] - 1 : text.length;
  const off = starts[p.line] + p.character;
  return off <= lineEnd ? off : -1;
}

function lineStarts(text: string): number[] {
  const starts = [0];
  for (let i = text.indexOf("\n"); i >= 0; i = text.indexOf("\n", i + 1)) starts.push(i + 1);
  return starts;
}

/**
 * `text` with the sorted, non-overlapping `edits` applied, and the offset in the result right
 * after the last edit (where the cursor goes); null when an edit lies outside the text.
 */
export function applyEdits(text: string, edits: readonly TextEdit[]): { text: string; cursor: number } | null {
  const starts = lineStarts(text);
  let out = "", last = 0;
  for (const e of edits) {
    const from = offsetAt(text, starts, e.range.start), to = offsetAt(text, starts, e.range.end);
    if (from < 0 || to < 0 || from < last) return null;
    out += text.slice(last, from) + e.newText;
    last = to;
  }
  return { text: out + text.slice(last), cursor: out.length };
}

/** What to draw for a suggestion. */
export interface Drawing {
  /** Ghost text at a position (a multi-line text is drawn on one line, its breaks as ⏎). */
  inserts: { at: Pos; text: string }[];
  /** Text the suggestion removes: struck through. */
  deletes: Range[];
  /** Hover on the edited lines: the lines as they would read after the suggestion. */
  hover: { range: Range; markdown: string };
  /** An edit out of view: announced at the end of the cursor's line (Tab jumps to it). */
  jump?: { at: Pos; text: string };
}

function inline(text: string): string {
  const one = text.replace(/\n/g, "⏎");
  return one.length > MAX_INLINE ? one.slice(0, MAX_INLINE - 1) + "…" : one;
}

/**
 * The drawing of `edits` (sorted, as checkEdits returns them) on the document `text` whose
 * cursor is at `cursor`; `inView` says whether a position is on screen. A multi-line insert or
 * an edit out of view is previewed in full by the hover (VS Code cannot draw virtual lines).
 */
export function draw(text: string, edits: readonly TextEdit[], cursor: Pos, inView: (p: Pos) => boolean,
                     language = ""): Drawing | null {
  const after = applyEdits(text, edits);
  if (!after || edits.length === 0) return null;
  const first = edits[0].range.start, lastEnd = edits[edits.length - 1].range.end;
  const lines = text.split("\n");
  // The edited lines as they read afterwards: from the first edit's line to the last one's,
  // shifted by what the edits add or remove.
  const added = edits.reduce((n, e) => n + e.newText.split("\n").length - 1 - (e.range.end.line - e.range.start.line), 0);
  const newLines = after.text.split("\n").slice(first.line, lastEnd.line + added + 1);
  const fence = "```";
  const drawing: Drawing = {
    inserts: edits.filter((e) => e.newText).map((e) => ({ at: e.range.end, text: inline(e.newText) })),
    deletes: edits.filter((e) => before(e.range.start, e.range.end)).map((e) => e.range),
    hover: {
      range: { start: { line: first.line, character: 0 }, end: { line: lastEnd.line, character: lines[lastEnd.line].length } },
      markdown: `completer: next edit (Tab applies, Esc dismisses)\n\n${fence}${language}\n${newLines.join("\n")}\n${fence}`,
    },
  };
  if (!inView(first)) {
    drawing.jump = {
      at: { line: cursor.line, character: lines[cursor.line]?.length ?? 0 },
      text: `  ⇥ line ${first.line + 1}: ${inline(newLines[0].trim())}`,
    };
  }
  return drawing;
}

export type TabAction =
  | { kind: "none" }                       // nothing shown: the key does its usual
  | { kind: "stale" }                      // the document changed since: dropped, nothing applied
  | { kind: "jump"; to: Pos }              // out of view: move the cursor there first
  | { kind: "go"; uri: string; to: Pos }   // the server's jump: open `uri` there (then call arrived())
  | { kind: "apply"; edits: TextEdit[] }   // apply these (then call applied())
  | { kind: "everywhere"; edits: Map<string, TextEdit[]> };  // apply these, document by document

/** What the controller needs from the editor. */
export interface Host {
  /** Ask the server for `uri` at its cursor; `signal` aborts when a newer change comes. */
  ask(uri: string, signal: AbortSignal): Promise<unknown>;
  /** The document's current version, undefined when it is not open. */
  version(uri: string): number | undefined;
  /** Draw (or, with undefined, clear) the suggestion for `uri`. */
  show(uri: string, s: Suggestion | undefined): void;
  feedback(p: NextEditFeedback): void;
  /** Whether to ask for `uri` now (next_edit on, completions not switched off or snoozed). */
  enabled(uri: string): boolean;
  debounceMs(): number;
  warn(message: string): void;
}

export interface Timers {
  set(fn: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

const realTimers: Timers = {
  set: (fn, ms) => setTimeout(fn, ms),
  clear: (h) => clearTimeout(h as ReturnType<typeof setTimeout>),
};

export class NextEditController {
  private timers = new Map<string, unknown>();
  private inflight = new Map<string, AbortController>();
  private shown = new Map<string, Suggestion>();
  /** Documents whose next change is our own apply, not the user's. */
  private applying = new Set<string>();

  constructor(private host: Host, private clock: Timers = realTimers) {}

  suggestion(uri: string): Suggestion | undefined {
    return this.shown.get(uri);
  }

  /** The user changed `uri`: what is shown goes, a request in flight is dropped, ask after the debounce. */
  changed(uri: string): void {
    if (this.applying.delete(uri)) return;
    this.drop(uri, false);
    this.abort(uri);
    this.schedule(uri, this.host.debounceMs());
  }

  /** The user accepted a completion in `uri`: ask at once (a chained suggestion). */
  chained(uri: string): void {
    this.schedule(uri, 0);
  }

  /** The document closed: nothing more for it. */
  closed(uri: string): void {
    this.drop(uri, false);
    this.abort(uri);
    this.clock.clear(this.timers.get(uri));
    this.timers.delete(uri);
  }

  /** Esc: dismisses what is shown (rejected); false when nothing was. */
  escape(uri: string): boolean {
    return this.drop(uri, false);
  }

  /** Tab. `inView` says whether a position is on screen. */
  tab(uri: string, inView: (p: Pos) => boolean): TabAction {
    const s = this.shown.get(uri);
    if (!s) return { kind: "none" };
    if (s.version !== this.host.version(uri)) {
      this.drop(uri, false);
      return { kind: "stale" };
    }
    if (s.edits.length === 0 && s.jump) {
      const j = s.jump;
      const now = this.host.version(j.uri);
      if (j.version !== undefined && j.version !== null && now !== undefined && now !== j.version) {
        this.drop(uri, false); // the target changed since the answer: never followed blindly
        return { kind: "stale" };
      }
      this.drop(uri, true);
      return { kind: "go", uri: j.uri, to: j.range.start };
    }
    const start = s.edits[0].range.start;
    if (!inView(start)) return { kind: "jump", to: start };
    this.drop(uri, true);
    this.applying.add(uri);
    return { kind: "apply", edits: s.edits };
  }

  /** The editor applied Tab's edits (`ok`) or refused them: then ask for the next one. */
  applied(uri: string, ok: boolean): void {
    if (!ok) this.applying.delete(uri);
    else this.chained(uri);
  }

  /**
   * "Apply everywhere": the shown suggestion's edits and those of every place it lists, by
   * document (`everywhere`); `stale` when this document or an open target changed version since
   * the answer (then nothing is applied); `none` without a suggestion that lists places.
   */
  everywhere(uri: string): TabAction {
    const s = this.shown.get(uri);
    if (!s || !s.locations?.length) return { kind: "none" };
    const changed = (u: string, v: number | undefined | null) => {
      const now = this.host.version(u);
      return v !== undefined && v !== null && now !== undefined && now !== v;
    };
    if (changed(uri, s.version) || s.locations.some((l) => changed(l.uri, l.version))) {
      this.drop(uri, false);
      return { kind: "stale" };
    }
    const edits = new Map<string, TextEdit[]>([[uri, [...s.edits]]]);
    for (const l of s.locations) edits.set(l.uri, [...(edits.get(l.uri) ?? []), ...l.edits]);
    for (const [u, es] of edits) if (es.length === 0) edits.delete(u);
    this.drop(uri, true);
    return { kind: "everywhere", edits };
  }

  /**
   * The editor went to a jump's place in `uri` (opening it when it was closed): ask there at
   * once; the answer is the edit for that place as the document is now (Tab applies it).
   */
  arrived(uri: string): void {
    this.schedule(uri, 0);
  }

  /** A reply for `uri`: shown unless empty, malformed, or computed on another version. */
  offer(uri: string, reply: unknown): boolean {
    if (reply === null || reply === undefined) return false;
    const { edits, error } = checkEdits(reply);
    if (!edits) {
      this.host.warn(`completer/nextEdit: ${error}`);
      return false;
    }
    const r = reply as NextEditReply;
    if ((edits.length === 0 && !r.jump) || r.version !== this.host.version(uri)) return false;
    this.drop(uri, false);
    const s: Suggestion = { uri, id: r.id, version: r.version, edits, reason: r.reason, jump: r.jump ?? undefined,
                            left: r.left, locations: Array.isArray(r.locations) ? r.locations : undefined };
    this.shown.set(uri, s);
    this.host.show(uri, s);
    return true;
  }

  private schedule(uri: string, ms: number): void {
    this.clock.clear(this.timers.get(uri));
    this.timers.delete(uri);
    if (!this.host.enabled(uri)) return;
    this.timers.set(uri, this.clock.set(() => {
      this.timers.delete(uri);
      void this.ask(uri);
    }, ms));
  }

  private async ask(uri: string): Promise<void> {
    this.abort(uri);
    const ac = new AbortController();
    this.inflight.set(uri, ac);
    let reply: unknown;
    try {
      reply = await this.host.ask(uri, ac.signal);
    } catch (e) {
      if (!ac.signal.aborted) this.host.warn(`completer/nextEdit: ${e}`);
      return;
    } finally {
      if (this.inflight.get(uri) === ac) this.inflight.delete(uri);
    }
    if (!ac.signal.aborted) this.offer(uri, reply);
  }

  private abort(uri: string): void {
    this.inflight.get(uri)?.abort();
    this.inflight.delete(uri);
  }

  /** Clears what is shown for `uri` and reports it; false when nothing was. */
  private drop(uri: string, accepted: boolean): boolean {
    const s = this.shown.get(uri);
    if (!s) return false;
    this.shown.delete(uri);
    this.host.show(uri, undefined);
    this.host.feedback({ id: s.id, kind: "nextEdit", accepted });
    return true;
  }
}
