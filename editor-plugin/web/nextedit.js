// Next-edit suggestions as CodeMirror 6 state: the server's edits (0-based lines, columns in code
// points) turned into document changes (JS strings count UTF-16 units), the suggestion kept until
// the document changes (a suggestion is never applied to a text other than the one it was
// computed on), drawn in place (removed text struck through, new text as a widget after it), a
// suggestion outside the view announced at the cursor's line (Tab jumps to it first, as in VS Code
// and Neovim), the accept transaction, and the snapshot of the text before the user's recent
// edits that the request sends as `before`.
import { ChangeSet, StateEffect, StateField } from "@codemirror/state";
import { Decoration, EditorView, ViewPlugin, WidgetType } from "@codemirror/view";

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

/** Show `{id, changes}` (a suggestion: its request id and changes), or null to hide it. */
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
  if (!s) return null;
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

/** The transaction spec applying the suggestion shown (cursor after its last change), or null. */
export function acceptNextEditSpec(state) {
  const s = state.field(nextEditField);
  if (!s) return null;
  const set = ChangeSet.of(s.changes, state.doc.length);
  const end = set.mapPos(s.changes[s.changes.length - 1].to, 1);
  return { changes: set, selection: { anchor: end }, scrollIntoView: true, effects: setNextEdit.of(null),
           userEvent: "input.nextedit" };
}
