/**
 * VS Code glue: starts codespec-lsp over stdio with vscode-languageclient (which provides the
 * inline completions, the progress UI for the model load and the server's accept command), and
 * adds a status-bar item, four commands and the settings plumbing. The decisions live in
 * settings.ts and status.ts, which tests run without VS Code.
 *
 * Accept events: VS Code runs an accepted item's `command`, which the client forwards to the
 * server as workspace/executeCommand (`codespec.didAcceptCompletion`). The stable API has no
 * "shown" or "partially accepted" hook (Copilot uses proposed API for those), so
 * `codespec/didShowCompletion` is sent when an answer reaches VS Code uncancelled, and
 * partial accepts are not reported.
 */

import * as readline from 'node:readline';

import * as vscode from 'vscode';
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  type LanguageClientOptions,
  type ServerOptions,
  State,
} from 'vscode-languageclient/node';

import {
  documentSelector,
  type ExtensionSettings,
  needsRestart,
  readSettings,
  serverCommand,
  serverSettings,
} from './settings';
import { LevelReader, logLine } from './log';
import { type Phase, type Stats, statsLines, statusView } from './status';

const SECTION = 'codespec';
const DID_SHOW = 'codespec/didShowCompletion';
const READY = 'codespec/ready';
// The ready notification and the stats poll may both report one load: one re-ask.
const READY_DEDUP_MS = 1000;
const POLL_LOADING_MS = 1000;
const POLL_READY_MS = 5000;

function settingsNow(): ExtensionSettings {
  return readSettings(vscode.workspace.getConfiguration(SECTION));
}

/** The LSP shape of an item VS Code got from the client, for the server's feedback counters. */
function asProtocolItem(item: vscode.InlineCompletionItem): object {
  const insertText = typeof item.insertText === 'string' ? item.insertText : item.insertText.value;
  const command = item.command
    ? { title: item.command.title, command: item.command.command, arguments: item.command.arguments }
    : undefined;
  return { insertText, command };
}

export class Codespec implements vscode.Disposable {
  client: LanguageClient | undefined;
  settings: ExtensionSettings = settingsNow();
  readonly output: vscode.LogOutputChannel;
  readonly statusItem: vscode.StatusBarItem;
  private stats: Stats | null = null;
  private lastReadyAt = 0;
  /** Re-asks made because the models became ready (for the tests and the details list). */
  reasked = 0;
  private lastError: string | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private clientListener: vscode.Disposable | undefined;
  private disposed = false;
  private readonly disposables: vscode.Disposable[] = [];

  constructor() {
    // One channel for the life of the extension, so a restart does not open a second one.
    this.output = vscode.window.createOutputChannel('codespec', { log: true });
    this.statusItem = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
    this.statusItem.command = 'codespec.showStats';
    this.statusItem.name = 'codespec';
    this.disposables.push(
      this.output,
      this.statusItem,
      vscode.commands.registerCommand('codespec.toggle', () => this.toggle()),
      vscode.commands.registerCommand('codespec.restart', () => this.restart()),
      vscode.commands.registerCommand('codespec.showStats', () => this.showStats()),
      vscode.commands.registerCommand('codespec.showLog', () => this.output.show(true)),
      vscode.workspace.onDidChangeConfiguration((e) => {
        if (e.affectsConfiguration(SECTION)) void this.onSettingsChanged();
      }),
    );
  }

  private phase(): Phase {
    if (!this.settings.enable) return 'disabled';
    if (!this.client) return 'stopped';
    switch (this.client.state) {
      case State.Running:
        return 'running';
      case State.Starting:
        return 'starting';
      default:
        return 'stopped';
    }
  }

  private render(): void {
    const view = statusView(this.phase(), this.stats, this.lastError);
    this.statusItem.text = view.text;
    this.statusItem.tooltip = view.tooltip;
  }

  private clientOptions(): LanguageClientOptions {
    return {
      documentSelector: documentSelector(this.settings),
      initializationOptions: () => serverSettings(this.settings),
      outputChannel: this.output,
      // Each stderr line at its own level (vscode-languageclient would file them all as errors).
      stdioOptions: {
        stdout: (input, channel) => {
          readline.createInterface({ input, crlfDelay: Infinity }).on('line', (l) => channel.info(l));
        },
        stderr: (input, channel) => {
          const reader = new LevelReader();
          readline.createInterface({ input, crlfDelay: Infinity }).on('line', (l) => logLine(reader, channel, l));
        },
      },
      middleware: {
        provideInlineCompletionItems: async (document, position, context, token, next) => {
          if (!this.settings.enable) return null;
          const result = await next(document, position, context, token);
          const items = Array.isArray(result) ? result : result?.items;
          if (items && items.length > 0 && !token.isCancellationRequested && this.client) {
            void this.client.sendNotification(DID_SHOW, { item: asProtocolItem(items[0]) });
          }
          return result;
        },
      },
    };
  }

  async start(): Promise<void> {
    const { command, args } = serverCommand(this.settings);
    const serverOptions: ServerOptions = { command, args };
    const client = new LanguageClient('codespec', 'codespec', serverOptions, this.clientOptions());
    this.client = client;
    this.stats = null;
    this.lastError = undefined;
    this.clientListener = client.onDidChangeState(() => this.render());
    this.render();
    // Shown from the first start on: before it there is nothing to report.
    this.statusItem.show();
    try {
      await client.start();
      client.onNotification(READY, () => this.onReady());
    } catch (err) {
      this.lastError = err instanceof Error ? err.message : String(err);
      this.output.error(`codespec-lsp failed to start (${command} ${args.join(' ')}): ${this.lastError}`);
      void vscode.window
        .showErrorMessage(
          `codespec: could not start "${command}". Set codespec.server.path to the codespec-lsp executable.`,
          'Open Settings',
          'Show Log',
        )
        .then((choice) => {
          if (choice === 'Open Settings') {
            void vscode.commands.executeCommand('workbench.action.openSettings', 'codespec.server');
          } else if (choice === 'Show Log') {
            this.output.show(true);
          }
        });
    }
    this.render();
    this.schedulePoll(0);
  }

  async stop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.clientListener?.dispose();
    this.clientListener = undefined;
    if (client) {
      try {
        if (client.state !== State.Stopped) await client.stop();
      } catch (err) {
        this.output.warn(`stopping codespec-lsp: ${String(err)}`);
      }
      await client.dispose();
    }
    this.render();
  }

  async restart(): Promise<void> {
    this.settings = settingsNow();
    await this.stop();
    await this.start();
  }

  async toggle(): Promise<void> {
    const cfg = vscode.workspace.getConfiguration(SECTION);
    // Write where the value is set now, so a workspace setting is not shadowed by a global one.
    const inspect = cfg.inspect<boolean>('enable');
    const target =
      inspect?.workspaceFolderValue !== undefined
        ? vscode.ConfigurationTarget.WorkspaceFolder
        : inspect?.workspaceValue !== undefined
          ? vscode.ConfigurationTarget.Workspace
          : vscode.ConfigurationTarget.Global;
    await cfg.update('enable', !this.settings.enable, target);
  }

  async onSettingsChanged(): Promise<void> {
    const before = this.settings;
    this.settings = settingsNow();
    if (needsRestart(before, this.settings)) {
      await this.restart();
      return;
    }
    if (this.client?.state === State.Running) {
      await this.client.sendNotification(DidChangeConfigurationNotification.type, {
        settings: serverSettings(this.settings),
      });
    }
    this.render();
    this.schedulePoll(0);
  }

  /**
   * The models are loaded (`codespec/ready`, or the stats poll saw loading turn to ready): what
   * was asked while they loaded got empty answers, so ask VS Code to ask again at the cursor, so
   * that a user who typed and paused sees a suggestion without another keystroke.
   */
  onReady(): void {
    const now = Date.now();
    if (now - this.lastReadyAt < READY_DEDUP_MS) return;
    this.lastReadyAt = now;
    const editor = vscode.window.activeTextEditor;
    if (!this.settings.enable || !editor || !this.settings.languages.includes(editor.document.languageId)) return;
    this.reasked += 1;
    void vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
  }

  /** `codespec/stats`, or null when the server is not running or does not answer. */
  async fetchStats(): Promise<Stats | null> {
    if (this.client?.state !== State.Running) return null;
    try {
      const before = this.stats?.state;
      this.stats = await this.client.sendRequest<Stats>('codespec/stats');
      if (before === 'loading' && this.stats?.state === 'ready') this.onReady();
      this.lastError = undefined;
    } catch (err) {
      this.lastError = err instanceof Error ? err.message : String(err);
      this.stats = null;
    }
    this.render();
    return this.stats;
  }

  private schedulePoll(delayMs: number): void {
    if (this.timer) clearTimeout(this.timer);
    if (this.disposed) return;
    this.timer = setTimeout(async () => {
      const stats = await this.fetchStats();
      const settled = stats?.state === 'ready' || stats?.state === 'error';
      this.schedulePoll(settled ? POLL_READY_MS : POLL_LOADING_MS);
    }, delayMs);
  }

  async showStats(): Promise<void> {
    const stats = await this.fetchStats();
    type Item = vscode.QuickPickItem & { run?: () => unknown };
    const actions: Item[] = [
      { label: this.settings.enable ? '$(circle-slash) Turn suggestions off' : '$(zap) Turn suggestions on', run: () => this.toggle() },
      { label: '$(debug-restart) Restart the server', run: () => this.restart() },
      { label: '$(output) Show the server log', run: () => this.output.show(true) },
    ];
    const lines: Item[] = stats
      ? statsLines(stats).map((label) => ({ label }))
      : [{ label: `codespec-lsp is not running${this.lastError ? `: ${this.lastError}` : ''}` }];
    const picked = await vscode.window.showQuickPick<Item>(
      [
        ...actions,
        { label: 'codespec/stats', kind: vscode.QuickPickItemKind.Separator },
        ...lines,
      ],
      { title: 'codespec', placeHolder: statusView(this.phase(), stats, this.lastError).text.replace(/\$\([^)]*\)\s*/g, '') },
    );
    await picked?.run?.();
  }

  async dispose(): Promise<void> {
    this.disposed = true;
    if (this.timer) clearTimeout(this.timer);
    await this.stop();
    for (const d of this.disposables.splice(0)) d.dispose();
  }
}

let instance: Codespec | undefined;

function wanted(doc: vscode.TextDocument, s: ExtensionSettings): boolean {
  return s.languages.includes(doc.languageId) && (doc.uri.scheme === 'file' || doc.uri.scheme === 'untitled');
}

/**
 * VS Code activates the extension once start-up has finished (activation events cannot follow a
 * setting such as codespec.languages); the server, which loads the models, starts only when a
 * document of one of those languages is open.
 */
export async function activate(context: vscode.ExtensionContext): Promise<Codespec> {
  const codespec = new Codespec();
  instance = codespec;
  context.subscriptions.push({ dispose: () => void codespec.dispose() });
  if (vscode.workspace.textDocuments.some((d) => wanted(d, codespec.settings))) {
    await codespec.start();
    return codespec;
  }
  const waiting = vscode.workspace.onDidOpenTextDocument((doc) => {
    if (codespec.client || !wanted(doc, codespec.settings)) return;
    waiting.dispose();
    void codespec.start();
  });
  context.subscriptions.push(waiting);
  return codespec;
}

export async function deactivate(): Promise<void> {
  await instance?.dispose();
  instance = undefined;
}
