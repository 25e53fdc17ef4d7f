// The ghost text as CodeMirror 6 state: where it sits and what it says, kept through the
// user's typing (typing its next characters keeps the rest: type-through) and dropped by any
// other edit or cursor move; the widget that draws it inline at the cursor (the text after the
// cursor moves right, as in VS Code); and the accept transactions (all, word, line).
import { StateEffect, StateField } from "@codemirror/state";
import { Decoration, EditorView, WidgetType } from "@codemirror/view";
import { nextLine, nextWord, typeThrough } from "./client.js";

/** Show `{at, text}` (a document offset and the ghost text), or null to hide it. */
export const setGhost = StateEffect.define();

/** The one insertion a transaction made, as [from, text], or null for anything else. */
function insertion(tr) {
  let found = null, count = 0;
  tr.changes.iterChanges((fromA, toA, _fromB, _toB, text) => {
    count += 1;
    if (fromA === toA) found = [fromA, text.toString()];
  });
  return count === 1 ? found : null;
}

export const ghostField = StateField.define({
  create: () => null,
  update(ghost, tr) {
    for (const e of tr.effects) if (e.is(setGhost)) return e.value;
    if (!ghost) return null;
    if (tr.docChanged) {
      const ins = insertion(tr);
      const rest = ins && ins[0] === ghost.at ? typeThrough(ghost.text, ins[1]) : null;
      return rest ? { at: ghost.at + ins[1].length, text: rest } : null;
    }
    const sel = tr.state.selection.main;
    return sel.empty && sel.head === ghost.at ? ghost : null;
  },
});

class GhostWidget extends WidgetType {
  constructor(text) { super(); this.text = text; }
  eq(other) { return other.text === this.text; }
  toDOM() {
    const span = document.createElement("span");
    span.className = "cm-ghost";
    span.id = "ghost";
    span.textContent = this.text;
    return span;
  }
  ignoreEvent() { return true; }
}

/** Draws the ghost as a widget after the cursor. */
export const ghostDecorations = EditorView.decorations.compute([ghostField], (state) => {
  const g = state.field(ghostField);
  return g ? Decoration.set([Decoration.widget({ widget: new GhostWidget(g.text), side: 1 }).range(g.at)])
    : Decoration.none;
});

/**
 * The ghost after cycling `step` (1: next, -1: previous) through `texts` (a completion, then its
 * alternatives, all for offset `at`), or null when the ghost shown is not one of them there (the
 * user typed into it, or there is one text only).
 */
export function cycleGhost(state, at, texts, step) {
  const g = state.field(ghostField);
  const i = g && g.at === at ? texts.indexOf(g.text) : -1;
  if (i < 0 || texts.length < 2) return null;
  return { at, text: texts[(i + step + texts.length) % texts.length] };
}

/**
 * Taking `unit` ("all" | "word" | "line") of the ghost shown at the cursor: `{ spec, taken,
 * rest }` with the transaction spec to dispatch, or null when no ghost is shown there.
 */
export function acceptSpec(state, unit) {
  const g = state.field(ghostField);
  const sel = state.selection.main;
  if (!g || !sel.empty || sel.head !== g.at) return null;
  const taken = unit === "word" ? nextWord(g.text) : unit === "line" ? nextLine(g.text) : g.text;
  const rest = g.text.slice(taken.length);
  const end = g.at + taken.length;
  return {
    taken, rest,
    spec: { changes: { from: g.at, insert: taken }, selection: { anchor: end }, scrollIntoView: true,
            effects: setGhost.of(rest ? { at: end, text: rest } : null), userEvent: "input.complete" },
  };
}
