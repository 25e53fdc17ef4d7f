/**
 * VS Code glue for completer-lsp: starts the server over stdio with initializationOptions from
 * the settings and sends later setting changes as workspace/didChangeConfiguration (no
 * restart; the server reloads models only for model options), reports accepted/rejected
 * completions (`completer/feedback`), shows model loading ($/progress) and the on/off state in
 * the status bar, whose menu switches completions on/off, per language, snoozes, runs the
 * doctor (`completer/doctor`), shows stats and restarts. Ghost text, Tab, and word/line partial
 * accept are VS Code's own inline-suggestion UI; the logic lives in options.ts, feedback.ts,
 * status.ts, switches.ts and doctor.ts.
 */
import * as vscode from "vscode";
import {
  LanguageClient, LanguageClientOptions, ServerOptions, State, TransportKind,
  WorkDoneProgress, WorkDoneProgressCreateRequest,
} from "vscode-languageclient/node";
import { DoctorReport, doctorLines, doctorNotice } from "./doctor";
import { ACCEPT_GUARD_MS, FeedbackParams, FeedbackTracker, isWithdrawal, textAfterCursor } from "./feedback";
import { InitOptions, OPTIONS, reloads, settingsChange, toInitializationOptions } from "./options";
import { registerNextEdits } from "./nextEditUi";
import { StatusModel } from "./status";
import { MenuAction, SwitchState, allowed, menuItems, offReason } from "./switches";

const LANGUAGES = ["python", "javascript", "typescript", "go", "rust"];
const ACCEPT_CMD = "completer.accepted";

let client: LanguageClient | undefined;

/** The switches for a document of `language` (or the active editor's), now. */
function switchState(snoozedUntil: number | undefined, language?: string): SwitchState {
  language ??= vscode.window.activeTextEditor?.document.languageId;
  const enabled = vscode.workspace.getConfiguration("completer").get<boolean>("enable") !== false;
  const forLanguage = language ? vscode.workspace.getConfiguration("completer", { languageId: language }).get<boolean>("enable") : true;
  return { enabled, language, languageEnabled: forLanguage !== false, snoozedUntil, now: Date.now() };
}

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
  item.command = "completer.menu";
  const status = new StatusModel();
  const tracker = new FeedbackTracker();
  // After a reply takes back a ghost the user saw, the accept keys are bound to a no-op for
  // ACCEPT_GUARD_MS (context key completer.acceptHeld, package.json keybindings): the press was
  // meant for the ghost that went away, so it must neither accept another text nor indent.
  let held: ReturnType<typeof setTimeout> | undefined;
  const holdAcceptKeys = () => {
    clearTimeout(held);
    void vscode.commands.executeCommand("setContext", "completer.acceptHeld", true);
    held = setTimeout(() => void vscode.commands.executeCommand("setContext", "completer.acceptHeld", false),
                      ACCEPT_GUARD_MS);
  };
  let sent: InitOptions = {}; // the options the running server has
  let snoozedUntil: number | undefined;
  let snoozeTimer: NodeJS.Timeout | undefined;
  const render = () => {
    const v = status.view(offReason(switchState(snoozedUntil)));
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

  const nextEdits = registerNextEdits(context, {
    client: () => client,
    allowed: (d) => ["file", "untitled"].includes(d.uri.scheme) && LANGUAGES.includes(d.languageId) &&
      allowed(switchState(snoozedUntil, d.languageId)),
    log,
  });

  const start = async () => {
    const cfg = vscode.workspace.getConfiguration("completer");
    const { options, warnings } = toInitializationOptions(readSettings());
    warn(warnings);
    sent = options;
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
          if (!allowed(switchState(snoozedUntil, document.languageId))) return null;
          const uri = document.uri.toString();
          const shown = tracker.shown(uri);
          sendFeedback(tracker.beforeRequest(uri));
          const result = await next(document, position, ctx, token);
          const items = !result ? [] : Array.isArray(result) ? result : result.items;
          const first = items[0];
          const nextText = first === undefined ? "" : textAfterCursor(
            typeof first.insertText === "string" ? first.insertText : first.insertText?.value ?? "",
            first.range && first.range.start.isBefore(position)
              ? document.getText(new vscode.Range(first.range.start, position)) : "");
          if (!token.isCancellationRequested && isWithdrawal(shown, nextText)) holdAcceptKeys();
          if (!result) return result;
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

  const warn = (warnings: string[]) => {
    for (const w of warnings) log.warn(w);
    if (warnings.length) {
      void vscode.window.showWarningMessage(`completer: ${warnings.length} setting(s) ignored; see the completer output.`);
    }
  };

  const restart = async () => {
    await stop();
    await start();
  };

  /** Settings → the running server, as a change: no restart, no reload for LSP options. */
  const applySettings = async () => {
    const { options, warnings } = toInitializationOptions(readSettings());
    warn(warnings);
    const change = settingsChange(sent, options);
    if (!Object.keys(change).length || client?.state !== State.Running) return;
    const reload = reloads(change);
    log.info(`settings changed: ${Object.keys(change).join(", ")}${reload.length ? " (the server reloads the models)" : ""}`);
    await client.sendNotification("workspace/didChangeConfiguration", { settings: { completer: change } });
    sent = options;
  };

  const snooze = (minutes: number) => {
    if (snoozeTimer) clearTimeout(snoozeTimer);
    snoozedUntil = minutes > 0 ? Date.now() + minutes * 60_000 : undefined;
    snoozeTimer = minutes > 0 ? setTimeout(() => snooze(0), minutes * 60_000) : undefined;
    render();
  };

  const showStats = async () => {
    if (client?.state !== State.Running) {
      void vscode.window.showInformationMessage(status.view().tooltip);
      return;
    }
    const stats = await client.sendRequest("completer/stats", {});
    log.info(`stats: ${JSON.stringify(stats)}`);
    log.show(true);
  };

  /** `completer/doctor`: its lines in the output channel, the first problem as a notification. */
  const runDoctor = async () => {
    if (client?.state !== State.Running) {
      void vscode.window.showWarningMessage(`${status.view().tooltip}; run \`completer doctor\` in a terminal`);
      return;
    }
    const report = await client.sendRequest<DoctorReport>("completer/doctor", {});
    log.info(["completer doctor:", ...doctorLines(report)].join("\n"));
    log.show(true);
    const n = doctorNotice(report);
    if (n.level === "error") void vscode.window.showErrorMessage(n.text);
    else if (n.level === "warning") void vscode.window.showWarningMessage(n.text);
    else void vscode.window.showInformationMessage(n.text);
  };

  const setEnabled = async (on: boolean, language?: string) => {
    const cfg = vscode.workspace.getConfiguration("completer", language ? { languageId: language } : undefined);
    await cfg.update("enable", on, vscode.ConfigurationTarget.Global, language !== undefined);
    if (on && !language) snooze(0);
  };

  const run = async (a: MenuAction) => {
    switch (a.kind) {
      case "enable": return setEnabled(a.on);
      case "language": return setEnabled(a.on, a.language);
      case "snooze": return snooze(a.minutes);
      case "doctor": return runDoctor();
      case "stats": return showStats();
      case "restart": return restart();
    }
  };

  const stop = async () => {
    const c = client;
    client = undefined;
    if (c) await c.stop();
  };

  context.subscriptions.push(
    vscode.commands.registerCommand(ACCEPT_CMD, async (uri: string, text: string, inner?: vscode.Command) => {
      sendFeedback(tracker.accepted(uri, text));
      nextEdits.chained(uri);
      if (inner) await vscode.commands.executeCommand(inner.command, ...(inner.arguments ?? []));
    }),
    vscode.commands.registerCommand("completer.showStats", showStats),
    vscode.commands.registerCommand("completer.doctor", runDoctor),
    vscode.commands.registerCommand("completer.restart", restart),
    vscode.commands.registerCommand("completer.menu", async () => {
      const pick = await vscode.window.showQuickPick(menuItems(switchState(snoozedUntil)), { title: "completer" });
      if (pick) await run(pick.action);
    }),
    vscode.commands.registerCommand("completer.enable", () => setEnabled(true)),
    vscode.commands.registerCommand("completer.disable", () => setEnabled(false)),
    vscode.commands.registerCommand("completer.toggle", () => setEnabled(!switchState(snoozedUntil).enabled)),
    vscode.commands.registerCommand("completer.snooze", async (minutes?: number) => {
      const m = minutes ?? Number(await vscode.window.showInputBox({ prompt: "Snooze completions for how many minutes?", value: "30" }));
      if (Number.isFinite(m) && m >= 0) snooze(m);
    }),
    vscode.commands.registerCommand("completer.held", () => undefined),
    vscode.commands.registerCommand("completer.trigger", () => vscode.commands.executeCommand("editor.action.inlineSuggest.trigger")),
    vscode.commands.registerCommand("completer.acceptWord", () => vscode.commands.executeCommand("editor.action.inlineSuggest.acceptNextWord")),
    vscode.commands.registerCommand("completer.acceptLine", () => vscode.commands.executeCommand("editor.action.inlineSuggest.acceptNextLine")),
    vscode.window.onDidChangeActiveTextEditor(render),
    vscode.workspace.onDidChangeTextDocument((e) => {
      tracker.changed(e.document.uri.toString(), e.contentChanges.map((c) => ({
        offset: c.rangeOffset, length: c.rangeLength, text: c.text,
      })));
    }),
    vscode.workspace.onDidCloseTextDocument((d) => sendFeedback(tracker.closed(d.uri.toString()))),
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (e.affectsConfiguration("completer.server")) {
        log.info("server command changed: restarting completer-lsp");
        await restart();
      } else if (e.affectsConfiguration("completer")) {
        await applySettings();
        render();
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
