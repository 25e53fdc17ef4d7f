/**
 * VS Code glue for next-edit suggestions: asks `completer/nextEdit` through the running client,
 * draws the suggestion as decorations (new text as ghost text, removed text struck through, the
 * edited lines in a hover, an out-of-view edit announced at the cursor, the server's jump as a "Tab to
 * jump" marker at the cursor and a status item; Tab opens its file there), sets the context key
 * `completer.nextEditShown` that binds Tab (`completer.nextEdit.accept`) and Esc
 * (`completer.nextEdit.dismiss`) in package.json, and applies an accepted edit. When to ask,
 * which reply to show, staleness and feedback are nextEdit.ts's.
 */
import * as vscode from "vscode";
import { LanguageClient, State } from "vscode-languageclient/node";
import { DEFAULT_DEBOUNCE_MS, NextEditController, NextEditFeedback, Pos, applyEdits, draw, jumpLabel } from "./nextEdit";

const SHOWN_KEY = "completer.nextEditShown";

export interface NextEditDeps {
  client(): LanguageClient | undefined;
  /** Whether completions are allowed for the document (switches, snooze, its language). */
  allowed(document: vscode.TextDocument): boolean;
  log: vscode.LogOutputChannel;
}

const vpos = (p: Pos) => new vscode.Position(p.line, p.character);

/** Registers the next-edit commands and listeners; returns the controller (for chained asks). */
export function registerNextEdits(context: vscode.ExtensionContext, deps: NextEditDeps): NextEditController {
  const ghost = { color: new vscode.ThemeColor("editorGhostText.foreground"), fontStyle: "italic" };
  const types = {
    insert: vscode.window.createTextEditorDecorationType({
      after: { ...ghost, backgroundColor: new vscode.ThemeColor("diffEditor.insertedTextBackground") },
    }),
    remove: vscode.window.createTextEditorDecorationType({
      textDecoration: "line-through", backgroundColor: new vscode.ThemeColor("diffEditor.removedTextBackground"),
    }),
    hover: vscode.window.createTextEditorDecorationType({}),
    jump: vscode.window.createTextEditorDecorationType({ after: ghost }),
  };
  // "Tab to jump" in the status bar while a jump is offered (the marker at the cursor says where)
  const status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 99);
  status.command = "completer.nextEdit.accept";
  status.tooltip = "completer: the next place this change needs (Tab goes there, Tab again applies; Esc dismisses; " +
    "'completer: Apply the change everywhere' edits every place at once)";
  const documentOf = (uri: string) => vscode.workspace.textDocuments.find((d) => d.uri.toString() === uri);
  const cfg = () => vscode.workspace.getConfiguration("completer");
  const inView = (editor: vscode.TextEditor) => (p: Pos) => editor.visibleRanges.some((r) => r.contains(vpos(p)));

  const render = (editor: vscode.TextEditor) => {
    const doc = editor.document;
    const s = controller.suggestion(doc.uri.toString());
    const d = s ? draw(doc.getText(), s.edits, editor.selection.active, inView(editor), doc.languageId) : null;
    const hover = d ? new vscode.MarkdownString(d.hover.markdown) : undefined;
    editor.setDecorations(types.insert, d ? d.inserts.map((i) => ({
      range: new vscode.Range(vpos(i.at), vpos(i.at)), renderOptions: { after: { contentText: i.text } },
    })) : []);
    editor.setDecorations(types.remove, d ? d.deletes.map((r) => new vscode.Range(vpos(r.start), vpos(r.end))) : []);
    editor.setDecorations(types.hover, d ? [{
      range: new vscode.Range(vpos(d.hover.range.start), vpos(d.hover.range.end)), hoverMessage: hover,
    }] : []);
    const far = s ? jumpLabel(s, doc.getText(), editor.selection.active) : null;
    const mark = d?.jump ?? far;
    editor.setDecorations(types.jump, mark ? [{
      range: new vscode.Range(vpos(mark.at), vpos(mark.at)), hoverMessage: hover,
      renderOptions: { after: { contentText: mark.text } },
    }] : []);
    if (editor === vscode.window.activeTextEditor) {
      if (far) {
        status.text = far.status;
        status.show();
      } else {
        status.hide();
      }
    }
  };
  const renderAll = (uri?: string) => {
    for (const e of vscode.window.visibleTextEditors) if (!uri || e.document.uri.toString() === uri) render(e);
    const active = vscode.window.activeTextEditor;
    const shown = Boolean(active && controller.suggestion(active.document.uri.toString()));
    void vscode.commands.executeCommand("setContext", SHOWN_KEY, shown);
  };

  const controller = new NextEditController({
    ask: async (uri, signal) => {
      const client = deps.client();
      const editor = vscode.window.visibleTextEditors.find((e) => e.document.uri.toString() === uri);
      if (!client || client.state !== State.Running || !editor) return null;
      const cts = new vscode.CancellationTokenSource();
      signal.addEventListener("abort", () => cts.cancel());
      const p = editor.selection.active;
      try {
        return await client.sendRequest("completer/nextEdit",
          { textDocument: { uri }, position: { line: p.line, character: p.character } }, cts.token);
      } finally {
        cts.dispose();
      }
    },
    version: (uri) => documentOf(uri)?.version,
    show: (uri) => renderAll(uri),
    feedback: (p: NextEditFeedback) => {
      const client = deps.client();
      if (client?.state === State.Running) {
        client.sendNotification("completer/feedback", p).catch((e) => deps.log.warn(`feedback: ${e}`));
      }
    },
    enabled: (uri) => {
      const doc = documentOf(uri);
      return doc !== undefined && cfg().get<boolean>("nextEdit") !== false && deps.allowed(doc);
    },
    debounceMs: () => cfg().get<number>("nextEditDebounceMs") ?? DEFAULT_DEBOUNCE_MS,
    warn: (m) => deps.log.warn(m),
  });

  const accept = async () => {
    const editor = vscode.window.activeTextEditor;
    if (!editor) return;
    const uri = editor.document.uri.toString();
    const action = controller.tab(uri, inView(editor));
    if (action.kind === "go") {
      const target = await vscode.window.showTextDocument(
        await vscode.workspace.openTextDocument(vscode.Uri.parse(action.uri)));
      const to = vpos(action.to);
      target.selection = new vscode.Selection(to, to);
      target.revealRange(new vscode.Range(to, to), vscode.TextEditorRevealType.InCenterIfOutsideViewport);
      controller.arrived(action.uri);
    } else if (action.kind === "jump") {
      const to = vpos(action.to);
      editor.selection = new vscode.Selection(to, to);
      editor.revealRange(new vscode.Range(to, to), vscode.TextEditorRevealType.InCenterIfOutsideViewport);
    } else if (action.kind === "apply") {
      const after = applyEdits(editor.document.getText(), action.edits);
      const ok = await editor.edit((b) => {
        for (const e of action.edits) b.replace(new vscode.Range(vpos(e.range.start), vpos(e.range.end)), e.newText);
      });
      if (ok && after) {
        const end = editor.document.positionAt(after.cursor);
        editor.selection = new vscode.Selection(end, end);
      }
      controller.applied(uri, ok);
    } else if (action.kind === "none") {
      await vscode.commands.executeCommand("tab"); // the context key was late: Tab does its usual
    }
  };

  context.subscriptions.push(
    ...Object.values(types),
    status,
    vscode.commands.registerCommand("completer.nextEdit.accept", accept),
    vscode.commands.registerCommand("completer.nextEdit.applyAll", async () => {
      const editor = vscode.window.activeTextEditor;
      if (!editor) return;
      const action = controller.everywhere(editor.document.uri.toString());
      if (action.kind === "stale") void vscode.window.showWarningMessage("completer: a file changed since; nothing applied");
      if (action.kind !== "everywhere") return;
      const edit = new vscode.WorkspaceEdit();
      for (const [uri, edits] of action.edits) {
        for (const e of edits) edit.replace(vscode.Uri.parse(uri), new vscode.Range(vpos(e.range.start), vpos(e.range.end)), e.newText);
      }
      await vscode.workspace.applyEdit(edit);
    }),
    vscode.commands.registerCommand("completer.nextEdit.dismiss", () => {
      const editor = vscode.window.activeTextEditor;
      if (editor) controller.escape(editor.document.uri.toString());
    }),
    vscode.workspace.onDidChangeTextDocument((e) => {
      if (e.contentChanges.length && deps.allowed(e.document)) controller.changed(e.document.uri.toString());
    }),
    vscode.workspace.onDidCloseTextDocument((d) => controller.closed(d.uri.toString())),
    vscode.window.onDidChangeActiveTextEditor(() => renderAll()),
    vscode.window.onDidChangeTextEditorSelection((e) => render(e.textEditor)),
    vscode.window.onDidChangeTextEditorVisibleRanges((e) => render(e.textEditor)),
  );
  return controller;
}
