/**
 * Stand-ins for the `vscode` module (only inside VS Code's extension host) and for
 * vscode-languageclient's LanguageClient (it needs that host too), installed into Node's module
 * loader so src/extension.ts runs unchanged. They record what the extension asks of them.
 */

import Module from 'node:module';

type Listener = (e: { affectsConfiguration(section: string): boolean }) => unknown;

export const State = { Stopped: 1, Running: 2, Starting: 3, StartFailed: 4 } as const;

export class FakeClient {
  static instances: FakeClient[] = [];
  static failStart: Error | null = null;
  static statsReply: unknown = { state: 'loading' };

  state: number = State.Stopped;
  notifications: [string, unknown][] = [];
  handlers = new Map<string, (params: unknown) => void>();
  requests: string[] = [];
  stopped = false;
  disposed = false;
  private listeners: (() => void)[] = [];

  constructor(
    readonly id: string,
    readonly name: string,
    readonly serverOptions: { command: string; args: string[] },
    readonly clientOptions: any,
  ) {
    FakeClient.instances.push(this);
  }

  private setState(s: number) {
    this.state = s;
    for (const l of this.listeners) l();
  }

  onDidChangeState(fn: () => void) {
    this.listeners.push(fn);
    return { dispose: () => (this.listeners = this.listeners.filter((l) => l !== fn)) };
  }

  async start() {
    this.setState(State.Starting);
    if (FakeClient.failStart) {
      this.setState(State.StartFailed);
      throw FakeClient.failStart;
    }
    this.setState(State.Running);
  }

  async stop() {
    this.stopped = true;
    this.setState(State.Stopped);
  }

  async dispose() {
    this.disposed = true;
  }

  async sendNotification(type: string | { method: string }, params: unknown) {
    this.notifications.push([typeof type === 'string' ? type : type.method, params]);
  }

  onNotification(method: string, fn: (params: unknown) => void) {
    this.handlers.set(method, fn);
    return { dispose: () => this.handlers.delete(method) };
  }

  /** The server sending a notification. */
  receive(method: string, params?: unknown) {
    this.handlers.get(method)?.(params);
  }

  async sendRequest(method: string) {
    this.requests.push(method);
    return FakeClient.statsReply;
  }
}

export interface FakeVscode {
  config: Record<string, unknown>;
  commands: Map<string, (...args: unknown[]) => unknown>;
  updates: [string, unknown, number][];
  errors: unknown[][];
  quickPicks: { items: any[]; options: any }[];
  statusItem: { text: string; tooltip: string; command?: string; shown: boolean };
  /** Open documents; a Python file by default, so activation starts the server. */
  documents: { languageId: string; uri: { scheme: string } }[];
  activeLanguage: string | undefined;
  executed: string[];
  openDocument(languageId: string): void;
  outputShown: number;
  module: any;
}

export function makeVscode(config: Record<string, unknown>): FakeVscode {
  const listeners: Listener[] = [];
  const fake: FakeVscode = {
    config,
    commands: new Map(),
    updates: [],
    errors: [],
    quickPicks: [],
    statusItem: { text: '', tooltip: '', shown: false },
    outputShown: 0,
    module: undefined,
    documents: [{ languageId: 'python', uri: { scheme: 'file' } }],
    activeLanguage: 'python',
    executed: [],
    openDocument(languageId: string) {
      const doc = { languageId, uri: { scheme: 'file' } };
      fake.documents.push(doc);
      for (const l of openListeners) l(doc);
    },
  };
  const openListeners: ((d: unknown) => void)[] = [];
  const disposable = { dispose() {} };
  const configuration = {
    get: (key: string) => fake.config[key],
    inspect: (key: string) => ({ key, globalValue: fake.config[key] }),
    update: async (key: string, value: unknown, target: number) => {
      fake.config[key] = value;
      fake.updates.push([key, value, target]);
      const event = { affectsConfiguration: (s: string) => s === 'codespec' || s === `codespec.${key}` };
      await Promise.all(listeners.map((l) => l(event)));
    },
  };
  fake.module = {
    StatusBarAlignment: { Left: 1, Right: 2 },
    ConfigurationTarget: { Global: 1, Workspace: 2, WorkspaceFolder: 3 },
    QuickPickItemKind: { Separator: -1, Default: 0 },
    window: {
      createOutputChannel: () => ({
        show: () => (fake.outputShown += 1),
        trace() {},
        debug() {},
        info() {},
        warn() {},
        error() {},
        dispose() {},
      }),
      createStatusBarItem: () =>
        Object.assign(fake.statusItem, {
          show: () => (fake.statusItem.shown = true),
          dispose() {},
        }),
      get activeTextEditor() {
        return fake.activeLanguage ? { document: { languageId: fake.activeLanguage } } : undefined;
      },
      showErrorMessage: async (...args: unknown[]) => {
        fake.errors.push(args);
        return undefined;
      },
      showQuickPick: async (items: any[], options: any) => {
        fake.quickPicks.push({ items, options });
        return undefined;
      },
    },
    commands: {
      registerCommand: (id: string, fn: (...args: unknown[]) => unknown) => {
        if (fake.commands.has(id)) throw new Error(`command ${id} already exists`);
        fake.commands.set(id, fn);
        return { dispose: () => fake.commands.delete(id) };
      },
      executeCommand: async (id: string) => {
        fake.executed.push(id);
        return undefined;
      },
    },
    workspace: {
      getConfiguration: (section: string) => {
        if (section !== 'codespec') throw new Error(`unexpected section ${section}`);
        return configuration;
      },
      get textDocuments() {
        return fake.documents;
      },
      onDidOpenTextDocument: (fn: (d: unknown) => void) => {
        openListeners.push(fn);
        return { dispose: () => openListeners.splice(openListeners.indexOf(fn), 1) };
      },
      onDidChangeConfiguration: (fn: Listener) => {
        listeners.push(fn);
        return disposable;
      },
    },
  };
  return fake;
}

const languageclient = {
  LanguageClient: FakeClient,
  State,
  DidChangeConfigurationNotification: { type: { method: 'workspace/didChangeConfiguration' } },
};

let current: FakeVscode | undefined;

/** Route `require('vscode')` and `require('vscode-languageclient/node')` to the fakes. */
export function install(fake: FakeVscode): void {
  current = fake;
  const loader = Module as unknown as { _load: (request: string, ...rest: unknown[]) => unknown };
  if ((loader as any).__codespecStubbed) return;
  const original = loader._load;
  loader._load = function (request: string, ...rest: unknown[]) {
    if (request === 'vscode') return current!.module;
    if (request === 'vscode-languageclient/node') return languageclient;
    return original.call(this, request, ...rest);
  };
  (loader as any).__codespecStubbed = true;
}
