/**
 * Which offered completions were accepted, partly accepted or rejected, as
 * `completer/feedback` payloads ({uri, text, accepted, acceptedChars?}).
 *
 * VS Code tells an extension only about full accepts (the item's command runs after insertion).
 * The rest is inferred per document: an item is "pending" from the moment it is returned until
 *  - its accept command runs → accepted, acceptedChars = its length;
 *  - the next request for the same document, or the document closes → if the edits made since
 *    inserted a prefix of the item at its position (word/line partial accept, or typing it
 *    through), accepted with acceptedChars = that prefix's length; else rejected.
 * A reply that takes back what is still shown of the pending item is a withdrawal
 * (`isWithdrawal`): the extension then holds the accept keys for a moment.
 */

/** How long the accept keys do nothing after a shown ghost was taken back (ms). */
export const ACCEPT_GUARD_MS = 300;

/**
 * True when a reply replacing the ghost `shown` (undefined: none was shown) by `next` ("" for
 * none) takes back something the user saw: the new text does not continue it. The user's Tab,
 * meant for the old ghost, must then do nothing for ACCEPT_GUARD_MS.
 */
export function isWithdrawal(shown: string | undefined, next: string): boolean {
  return Boolean(shown) && !(next.length > 0 && next.startsWith(shown as string));
}

export interface FeedbackParams {
  uri: string;
  text: string;
  accepted: boolean;
  acceptedChars?: number;
}

interface Pending {
  text: string;
  /** Document offset (UTF-16 code units, like VS Code's) where the item's text starts. */
  offset: number;
  /** How much of `text` the edits since the offer have inserted at `offset`. */
  taken: number;
  /** An edit diverged from the item: `taken` stays as it is. */
  frozen: boolean;
}

export interface Edit {
  /** Offset of the replaced range's start, in the document before the edit. */
  offset: number;
  /** Length of the replaced range. */
  length: number;
  text: string;
}

export class FeedbackTracker {
  private pending = new Map<string, Pending>();

  /** A request for `uri` is about to be sent: resolve whatever was offered before. */
  beforeRequest(uri: string): FeedbackParams | undefined {
    return this.resolve(uri);
  }

  /** An item was returned for `uri`; `offset` is where its text would be inserted. */
  offered(uri: string, text: string, offset: number): void {
    if (text.length > 0) this.pending.set(uri, { text, offset, taken: 0, frozen: false });
    else this.pending.delete(uri);
  }

  /** The accept command of an item ran (VS Code inserted the whole item). */
  accepted(uri: string, text: string): FeedbackParams {
    this.pending.delete(uri);
    return { uri, text, accepted: true, acceptedChars: text.length };
  }

  /** Edits to `uri`: extend a typed-through / partly accepted prefix, or note divergence. */
  changed(uri: string, edits: readonly Edit[]): void {
    const p = this.pending.get(uri);
    if (!p || p.frozen) return;
    for (const e of edits) {
      const at = p.offset + p.taken;
      const rest = p.text.slice(p.taken);
      if (e.length === 0 && e.offset === at && e.text.length > 0 && rest.startsWith(e.text)) {
        p.taken += e.text.length;
      } else if (e.offset + e.length <= p.offset) {
        // An edit before the item only shifts it.
        p.offset += e.text.length - e.length;
      } else if (e.offset > at) {
        // Edits after what has been taken so far leave the taken prefix alone.
      } else {
        // Anything else (deleting into it, typing something else at it) ends the match.
        p.frozen = true;
        return;
      }
    }
  }

  /** What VS Code still shows of the item pending for `uri`: the rest after a typed-through
   *  (or partly accepted) prefix; undefined when none is pending or an edit diverged from it. */
  shown(uri: string): string | undefined {
    const p = this.pending.get(uri);
    return p && !p.frozen && p.taken < p.text.length ? p.text.slice(p.taken) : undefined;
  }

  /** The document closed: resolve what was offered in it. */
  closed(uri: string): FeedbackParams | undefined {
    return this.resolve(uri);
  }

  private resolve(uri: string): FeedbackParams | undefined {
    const p = this.pending.get(uri);
    this.pending.delete(uri);
    if (!p) return undefined;
    if (p.taken > 0) return { uri, text: p.text, accepted: true, acceptedChars: p.taken };
    return { uri, text: p.text, accepted: false };
  }
}

/**
 * The part of an item's text that is not yet in the document: an item whose range starts
 * before the cursor repeats what was typed since the range start.
 */
export function textAfterCursor(insertText: string, typedSinceRangeStart: string): string {
  return insertText.startsWith(typedSinceRangeStart) ? insertText.slice(typedSinceRangeStart.length) : insertText;
}
