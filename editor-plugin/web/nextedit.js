// Next-edit suggestions as CodeMirror 6 state: the server's edits (0-based lines, columns in code
// points) turned into document changes (JS strings count UTF-16 units), the suggestion kept until
// the document changes (a suggestion is never applied to a text other than the one it was
// computed on), drawn in place (removed text struck through, new text as a widget after it), a
// suggestion outside the view announced at the cursor's line (Tab jumps to it first, as in VS Code
// and Neovim), the server's jump past the region (a gutter mark at its line and a hint at the
// cursor; Tab goes there and shows its edit, Tab again applies), the accept transaction, and the
// snapshot of the text before the user's recent edits that the request sends as `before`.
import { ChangeSet, RangeSet, StateEffect, StateField } from "@codemirror/state";
import { Decoration, EditorView, GutterMarker, ViewPlugin, WidgetType, gutter } from "@codemirror/view";

/** A pause this long (ms) ends a burst of edits: the next change starts a new one. */
export const EDIT_PAUSE_MS = 1000;

/** UTF-16 column → code-point column in `line`. */
export function toCodePoints(line, col) {
  return [...line.slice(0, col)].length;
}

/** Code-point column → UTF-16 column in `line`, or -1 past its end. */
export function fromCodePoints(line, col) {
  let units = 0, n = 0;
  for (const ch of line) {
    if (n === col) return units;
    units += ch.length;
    n += 1;
  }
  return n === col ? units : -1;
}

/** The document offset of a server position (0-based line, code-point column), or -1. */
function offsetOf(doc, line, col) {
  if (!Number.isInteger(line) || !Number.isInteger(col) || line < 0 || col < 0) return -1;
  if (line === doc.lines) return col === 0 ? doc.length : -1; // just past a final newline
  if (line > doc.lines) return -1;
  const l = doc.line(line + 1);
  const units = fromCodePoints(l.text, col);
  return units < 0 ? -1 : l.from + units;
}

/**
 * The server's edits as sorted changes `[{from, to, insert}]` on `doc` (a CodeMirror Text), or
 * null when one lies outside it, is malformed, or overlaps another.
 */
export function editsToChanges(doc, edits) {
  const changes = [];
  for (const e of edits) {
    if (!e || typeof e.text !== "string") return null;
    const from = offsetOf(doc, e.start_line, e.start_col), to = offsetOf(doc, e.end_line, e.end_col);
    if (from < 0 || to < from) return null;
    changes.push({ from, to, insert: e.text });
  }
  changes.sort((a, b) => a.from - b.from);
  for (let i = 1; i < changes.length; i++) if (changes[i].from < changes[i - 1].to) return null;
  return changes;
}

/**
 * The text before the user's recent edits: the document as it was before the first change
 * after a pause of EDIT_PAUSE_MS (accepting a suggestion is a change like typing). `now` is the
 * clock (ms).
 */
export class EditSnapshot {
  constructor(text, now = () => performance.now()) {
    this.text = text;
    this.now = now;
    this.last = -Infinity;
  }

  /** A change is about to turn `previous` (the text before it) into something else. */
  changed(previous) {
    const t = this.now();
    if (t - this.last >= EDIT_PAUSE_MS) this.text = previous;
    this.last = t;
  }
}

/**
 * The server's jump in this document (`{start_line, start_col, end_line, end_col, edits}`: the
 * next place past the region a change at a definition needs, with the edit it gets there) as
 * `{pos, line, changes}` on `doc`, or null when it is missing or lies outside the document.
 */
export function jumpOf(doc, jump) {
  if (!jump || typeof jump !== "object") return null;
  const pos = offsetOf(doc, jump.start_line, jump.start_col);
  const changes = editsToChanges(doc, Array.isArray(jump.edits) ? jump.edits : []);
  if (pos < 0 || changes === null) return null;
  return { pos, line: doc.lineAt(pos).number, changes };
}

/** Show `{id, changes, jump?}` (a suggestion: its request id, changes, the jump past them), or null to hide it. */
export const setNextEdit = StateEffect.define();

/** The suggestion shown; any change to the document drops it (its changes were on the old text). */
export const nextEditField = StateField.define({
  create: () => null,
  update(value, tr) {
    for (const e of tr.effects) if (e.is(setNextEdit)) return e.value;
    return tr.docChanged ? null : value;
  },
});

class InsertWidget extends WidgetType {
  constructor(text) { super(); this.text = text; }
  eq(other) { return other.text === this.text; }
  toDOM() {
    const span = document.createElement("span");
    span.className = "cm-next-insert";
    span.textContent = this.text;
    return span;
  }
  ignoreEvent() { return true; }
}

const strike = Decoration.mark({ class: "cm-next-delete" });

/** Removed text struck through, new text as a widget after it. */
export const nextEditDecorations = EditorView.decorations.compute([nextEditField], (state) => {
  const s = state.field(nextEditField);
  if (!s) return Decoration.none;
  const ranges = [];
  for (const c of s.changes) {
    if (c.to > c.from) ranges.push(strike.range(c.from, c.to));
    if (c.insert) ranges.push(Decoration.widget({ widget: new InsertWidget(c.insert), side: 1 }).range(c.to));
  }
  return Decoration.set(ranges, true);
});

/**
 * The suggestion shown when none of it lies in `ranges` (the view's visibleRanges):
 * `{pos, line, down}` (where it starts, its 1-based line, whether it is below the cursor), else null.
 */
export function farEdit(state, ranges) {
  const s = state.field(nextEditField, false);
  if (!s || s.changes.length === 0) return null;
  const from = s.changes[0].from, to = s.changes[s.changes.length - 1].to;
  if (ranges.some((r) => r.from <= to && from <= r.to)) return null;
  return { pos: from, line: state.doc.lineAt(from).number, down: from > state.selection.main.head };
}

/** The transaction spec of Tab on a suggestion outside the view: the cursor to its start, centred. */
export function jumpToNextEditSpec(state, ranges) {
  const far = farEdit(state, ranges);
  if (!far) return null;
  return { selection: { anchor: far.pos }, effects: EditorView.scrollIntoView(far.pos, { y: "center" }),
           userEvent: "select.nextedit" };
}

class JumpWidget extends WidgetType {
  constructor(line, down) { super(); this.line = line; this.down = down; }
  eq(other) { return other.line === this.line && other.down === this.down; }
  toDOM() {
    const span = document.createElement("span");
    span.className = "cm-next-jump";
    span.textContent = `${this.down ? "↓" : "↑"} next edit at line ${this.line} (Tab)`;
    return span;
  }
  ignoreEvent() { return true; }
}

/** The announcement of a suggestion outside the view, at the end of the cursor's line. */
export function jumpHint(state, ranges) {
  const far = farEdit(state, ranges);
  if (!far) return Decoration.none;
  const at = state.doc.lineAt(state.selection.main.head).to;
  return Decoration.set([Decoration.widget({ widget: new JumpWidget(far.line, far.down), side: 1 }).range(at)]);
}

export const nextEditHint = ViewPlugin.fromClass(class {
  constructor(view) { this.decorations = jumpHint(view.state, view.visibleRanges); }
  update(u) {
    if (u.docChanged || u.selectionSet || u.viewportChanged
        || u.startState.field(nextEditField) !== u.state.field(nextEditField)) {
      this.decorations = jumpHint(u.state, u.view.visibleRanges);
    }
  }
}, { decorations: (p) => p.decorations });

/**
 * Tab on a jump (a suggestion with no changes here, a jump past them): the cursor to the place,
 * and the jump's own changes shown there (the next Tab applies them: the document has not
 * changed since they were computed, or the suggestion would be gone). Null without one.
 */
export function followJumpSpec(state) {
  const s = state.field(nextEditField);
  if (!s || s.changes.length > 0 || !s.jump) return null;
  const next = s.jump.changes.length ? { id: s.id, changes: s.jump.changes, arrived: true } : null;
  return { selection: { anchor: s.jump.pos }, effects: [setNextEdit.of(next), EditorView.scrollIntoView(s.jump.pos, { y: "center" })],
           userEvent: "select.nextedit" };
}

class JumpMarker extends GutterMarker {
  toDOM() {
    const span = document.createElement("span");
    span.className = "cm-next-jump-mark";
    span.textContent = "⇥";
    span.title = "completer: the next place this change needs (Tab goes there, Tab again applies)";
    return span;
  }
}
const jumpMarker = new JumpMarker();

/** The gutter mark at a jump's line (the web editor's "Tab to jump"), and the hint at the cursor. */
export const nextEditGutter = gutter({
  class: "cm-next-jump-gutter",
  markers: (view) => {
    const s = view.state.field(nextEditField);
    if (!s || s.changes.length > 0 || !s.jump) return RangeSet.empty;
    return RangeSet.of([jumpMarker.range(view.state.doc.lineAt(s.jump.pos).from)]);
  },
  initialSpacer: () => jumpMarker,
});

class FollowWidget extends WidgetType {
  constructor(text) { super(); this.text = text; }
  eq(other) { return other.text === this.text; }
  toDOM() {
    const span = document.createElement("span");
    span.className = "cm-next-jump";
    span.textContent = this.text;
    return span;
  }
  ignoreEvent() { return true; }
}

/** The hint of a jump-only suggestion at the end of the cursor's line: where, and what changes there. */
export function followHint(state) {
  const s = state.field(nextEditField, false);
  if (!s || s.changes.length > 0 || !s.jump) return Decoration.none;
  const what = s.jump.changes.length ? ` → ${s.jump.changes.map((c) => c.insert).join(" ")}` : " (needs your edit)";
  const at = state.doc.lineAt(state.selection.main.head).to;
  return Decoration.set([Decoration.widget({ widget: new FollowWidget(`⇥ Tab to jump: line ${s.jump.line}${what}`), side: 1 })
    .range(at)]);
}

export const nextEditFollowHint = EditorView.decorations.compute([nextEditField, "selection"], followHint);

/** The transaction spec applying the suggestion shown (cursor after its last change), or null. */
export function acceptNextEditSpec(state) {
  const s = state.field(nextEditField);
  if (!s || s.changes.length === 0) return null;
  const set = ChangeSet.of(s.changes, state.doc.length);
  const end = set.mapPos(s.changes[s.changes.length - 1].to, 1);
  return { changes: set, selection: { anchor: end }, scrollIntoView: true, effects: setNextEdit.of(null),
           userEvent: "input.nextedit" };
}
