/**
 * VS Code glue for completer-lsp: starts the server over stdio with initializationOptions from
 * the settings, reports accepted/rejected completions (`completer/feedback`) and shows model
 * loading ($/progress) in the status bar. Ghost text, Tab, and word/line partial accept are
 * VS Code's own inline-suggestion UI; the logic lives in options.ts, feedback.ts and status.ts.
 */
import * as vscode from "vscode";
import {
  LanguageClient, LanguageClientOptions, ServerOptions, State, TransportKind,
  WorkDoneProgress, WorkDoneProgressCreateRequest,
} from "vscode-languageclient/node";
import { FeedbackParams, FeedbackTracker, textAfterCursor } from "./feedback";
import { OPTIONS, toInitializationOptions } from "./options";
import { StatusModel } from "./status";

const LANGUAGES = ["python", "javascript", "typescript", "go", "rust"];
const ACCEPT_CMD = "completer.accepted";

let client: LanguageClient | undefined;

function readSettings(): Record<string, unknown> {
  // Only values the user set anywhere count; unset ones leave the server's defaults in force.
  const cfg = vscode.workspace.getConfiguration("completer");
  const values: Record<string, unknown> = {};
  for (const o of OPTIONS) {
    const i = cfg.inspect(o.setting);
    values[o.setting] = i?.workspaceFolderValue ?? i?.workspaceValue ?? i?.globalValue;
  }
  return values;
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const log = vscode.window.createOutputChannel("completer", { log: true });
  const item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  item.command = "completer.showStats";
  const status = new StatusModel();
  const tracker = new FeedbackTracker();
  const render = () => {
    const v = status.view();
    item.text = v.text;
    item.tooltip = v.tooltip;
    item.show();
  };
  context.subscriptions.push(log, item);

  const sendFeedback = (p: FeedbackParams | undefined) => {
    if (p && client?.state === State.Running) {
      client.sendNotification("completer/feedback", p).catch((e) => log.warn(`feedback: ${e}`));
    }
  };

  const start = async () => {
    const cfg = vscode.workspace.getConfiguration("completer");
    const { options, warnings } = toInitializationOptions(readSettings());
    for (const w of warnings) log.warn(w);
    if (warnings.length) {
      void vscode.window.showWarningMessage(`completer: ${warnings.length} setting(s) ignored; see the completer output.`);
    }
    const serverOptions: ServerOptions = {
      command: cfg.get<string>("server.path") || "completer-lsp",
      args: cfg.get<string[]>("server.args") ?? [],
      transport: TransportKind.stdio,
    };
    const clientOptions: LanguageClientOptions = {
      documentSelector: LANGUAGES.flatMap((language) => [
        { scheme: "file", language }, { scheme: "untitled", language },
      ]),
      initializationOptions: options,
      outputChannel: log,
      middleware: {
        async provideInlineCompletionItems(document, position, ctx, token, next) {
          const uri = document.uri.toString();
          sendFeedback(tracker.beforeRequest(uri));
          const result = await next(document, position, ctx, token);
          if (!result) return result;
          const items = Array.isArray(result) ? result : result.items;
          items.forEach((it, i) => {
            const insert = typeof it.insertText === "string" ? it.insertText : it.insertText?.value ?? "";
            const typed = it.range && it.range.start.isBefore(position)
              ? document.getText(new vscode.Range(it.range.start, position)) : "";
            const text = textAfterCursor(insert, typed);
            if (i === 0) tracker.offered(uri, text, document.offsetAt(position));
            it.command = { title: "completer: accepted", command: ACCEPT_CMD, arguments: [uri, text, it.command] };
          });
          return result;
        },
      },
    };
    client = new LanguageClient("completer", "completer", serverOptions, clientOptions);
    client.onDidChangeState((e) => {
      if (e.newState === State.Starting) status.starting();
      else if (e.newState === State.Running) status.running();
      else status.stopped();
      render();
    });
    status.starting();
    render();
    try {
      await client.start();
    } catch (e) {
      status.failed(`could not start ${serverOptions.command}: ${e}`);
      render();
      return;
    }
    // Replaces the client's own progress notifications (runs after start, before any message
    // from the server is read) so load progress lands in the status bar item.
    const c = client;
    c.onRequest(WorkDoneProgressCreateRequest.type, ({ token }) => {
      c.onProgress(WorkDoneProgress.type, token, (value) => {
        status.progress(token, value);
        render();
      });
    });
    status.running();
    render();
  };

  const stop = async () => {
    const c = client;
    client = undefined;
    if (c) await c.stop();
  };

  context.subscriptions.push(
    vscode.commands.registerCommand(ACCEPT_CMD, async (uri: string, text: string, inner?: vscode.Command) => {
      sendFeedback(tracker.accepted(uri, text));
      if (inner) await vscode.commands.executeCommand(inner.command, ...(inner.arguments ?? []));
    }),
    vscode.commands.registerCommand("completer.showStats", async () => {
      if (client?.state !== State.Running) {
        void vscode.window.showInformationMessage(status.view().tooltip);
        return;
      }
      const stats = await client.sendRequest("completer/stats", {});
      log.info(`stats: ${JSON.stringify(stats)}`);
      log.show(true);
    }),
    vscode.commands.registerCommand("completer.restart", async () => {
      await stop();
      await start();
    }),
    vscode.workspace.onDidChangeTextDocument((e) => {
      tracker.changed(e.document.uri.toString(), e.contentChanges.map((c) => ({
        offset: c.rangeOffset, length: c.rangeLength, text: c.text,
      })));
    }),
    vscode.workspace.onDidCloseTextDocument((d) => sendFeedback(tracker.closed(d.uri.toString()))),
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (e.affectsConfiguration("completer")) {
        log.info("settings changed: restarting completer-lsp");
        await stop();
        await start();
      }
    }),
    { dispose: () => void stop() },
  );
  await start();
}

export async function deactivate(): Promise<void> {
  const c = client;
  client = undefined;
  if (c) await c.stop();
}
