/**
 * Just enough of the `vscode` module for the real vscode-languageclient to start a server,
 * sync a document and serve inline completions: classes it constructs, events it subscribes
 * to, and the few window/workspace calls on that path. What it does not model is answered by
 * a permissive proxy and recorded in `missing`, so a failure names the API that was needed.
 */

import Module from 'node:module';

export const missing = new Set<string>();

function anything(path: string): any {
  const fn = function () {};
  return new Proxy(fn, {
    get(_t, p) {
      if (p === 'then' || typeof p === 'symbol') return undefined;
      missing.add(`${path}.${String(p)}`);
      return anything(`${path}.${String(p)}`);
    },
    apply: () => anything(`${path}()`),
    construct: () => anything(`new ${path}`),
  });
}

function permissive<T extends object>(path: string, target: T): T {
  return new Proxy(target, {
    get(t, p, r) {
      if (p in t || typeof p === 'symbol' || p === 'then') return Reflect.get(t, p, r);
      missing.add(`${path}.${String(p)}`);
      return anything(`${path}.${String(p)}`);
    },
  });
}

export class Disposable {
  static from(...ds: { dispose(): unknown }[]) {
    return new Disposable(() => ds.forEach((d) => d.dispose()));
  }
  constructor(private readonly fn: () => unknown = () => {}) {}
  dispose() {
    this.fn();
  }
}

export class EventEmitter<T> {
  private listeners: ((e: T) => unknown)[] = [];
  event = (fn: (e: T) => unknown, thisArg?: unknown, disposables?: Disposable[]) => {
    const bound = thisArg === undefined ? fn : fn.bind(thisArg);
    this.listeners.push(bound);
    const d = new Disposable(() => (this.listeners = this.listeners.filter((l) => l !== bound)));
    disposables?.push(d);
    return d;
  };
  fire(e: T) {
    for (const l of [...this.listeners]) l(e);
  }
  dispose() {
    this.listeners = [];
  }
}

export class Position {
  constructor(readonly line: number, readonly character: number) {}
}

export class Range {
  readonly start: Position;
  readonly end: Position;
  constructor(a: any, b: any, c?: number, d?: number) {
    this.start = typeof a === 'number' ? new Position(a, b) : a;
    this.end = typeof a === 'number' ? new Position(c!, d!) : b;
  }
}

export class Uri {
  constructor(readonly scheme: string, readonly path: string) {}
  static parse(s: string) {
    const m = /^([a-z][\w+.-]*):(?:\/\/)?(.*)$/i.exec(s);
    return m ? new Uri(m[1], decodeURIComponent(m[2]).replace(/^(?!\/)/, '/')) : new Uri('file', s);
  }
  static file(p: string) {
    return new Uri('file', p);
  }
  get fsPath() {
    return this.path;
  }
  toString() {
    return `${this.scheme}://${this.path.split('/').map(encodeURIComponent).join('/')}`;
  }
  toJSON() {
    return this.toString();
  }
}

export class CancellationTokenSource {
  private emitter = new EventEmitter<void>();
  token = { isCancellationRequested: false, onCancellationRequested: this.emitter.event };
  cancel() {
    this.token.isCancellationRequested = true;
    this.emitter.fire();
  }
  dispose() {}
}

export class InlineCompletionItem {
  constructor(public insertText: string | { value: string }, public range?: Range, public command?: any) {}
}

export class InlineCompletionList {
  constructor(public items: InlineCompletionItem[]) {}
}

export class SnippetString {
  constructor(public value = '') {}
}

/** A plain-text TextDocument over a string (LF line ends). */
export class TextDocument {
  version = 1;
  isClosed = false;
  isDirty = false;
  isUntitled = false;
  eol = 1;
  constructor(readonly uri: Uri, readonly languageId: string, private text: string) {}
  get fileName() {
    return this.uri.fsPath;
  }
  get lineCount() {
    return this.text.split('\n').length;
  }
  getText() {
    return this.text;
  }
  lineAt(line: number) {
    const text = this.text.split('\n')[line];
    return { text, range: new Range(line, 0, line, text.length) };
  }
  offsetAt(p: Position) {
    const lines = this.text.split('\n');
    return lines.slice(0, p.line).reduce((n, l) => n + l.length + 1, 0) + p.character;
  }
  positionAt(offset: number) {
    const before = this.text.slice(0, offset).split('\n');
    return new Position(before.length - 1, before[before.length - 1].length);
  }
  /** Apply an edit as VS Code would and return the change event it fires. */
  edit(range: Range, text: string) {
    const start = this.offsetAt(range.start);
    const end = this.offsetAt(range.end);
    this.text = this.text.slice(0, start) + text + this.text.slice(end);
    this.version += 1;
    return {
      document: this,
      contentChanges: [{ range, rangeOffset: start, rangeLength: end - start, text }],
      reason: undefined,
    };
  }
}

export function createHost(settings: Record<string, unknown>) {
  const commands = new Map<string, (...args: any[]) => any>();
  const inlineProviders: any[] = [];
  const messages: [string, string][] = [];
  const logs: string[] = [];
  const didOpen = new EventEmitter<any>();
  const didChange = new EventEmitter<any>();
  const didClose = new EventEmitter<any>();
  const configChanged = new EventEmitter<any>();
  const textDocuments: TextDocument[] = [];
  const never = new EventEmitter<any>().event;

  const configuration = (section?: string) =>
    permissive('WorkspaceConfiguration', {
      get: (key: string, fallback?: unknown) => {
        const full = section ? `${section}.${key}` : key;
        return full.startsWith('codespec.') && full.slice(9) in settings ? settings[full.slice(9)] : fallback;
      },
      has: (key: string) => key in settings,
      inspect: (key: string) => ({ key, globalValue: settings[key] }),
      update: async (key: string, value: unknown) => {
        settings[key] = value;
        configChanged.fire({ affectsConfiguration: (s: string) => s === 'codespec' || s === `codespec.${key}` });
      },
    });

  const logChannel = (name: string) =>
    permissive('LogOutputChannel', {
      name,
      logLevel: 2,
      onDidChangeLogLevel: never,
      trace: (m: string) => logs.push(`[trace] ${m}`),
      debug: (m: string) => logs.push(`[debug] ${m}`),
      info: (m: string) => logs.push(`[info] ${m}`),
      warn: (m: string) => logs.push(`[warn] ${m}`),
      error: (m: unknown) => logs.push(`[error] ${String(m)}`),
      append: (m: string) => logs.push(m),
      appendLine: (m: string) => logs.push(m),
      replace: () => {},
      clear: () => {},
      show: () => {},
      hide: () => {},
      dispose: () => {},
    });

  const vscode = permissive('vscode', {
    version: '1.91.0',
    Disposable,
    EventEmitter,
    Position,
    Range,
    Uri,
    CancellationTokenSource,
    InlineCompletionItem,
    InlineCompletionList,
    SnippetString,
    CancellationError: class CancellationError extends Error {},
    // Classes the client subclasses when it loads; never constructed on this path.
    CompletionItem: class {},
    CodeLens: class {},
    DocumentLink: class {},
    CodeAction: class {},
    Diagnostic: class {},
    CallHierarchyItem: class {},
    TypeHierarchyItem: class {},
    SymbolInformation: class {},
    InlayHint: class {},
    StatusBarAlignment: { Left: 1, Right: 2 },
    ConfigurationTarget: { Global: 1, Workspace: 2, WorkspaceFolder: 3 },
    QuickPickItemKind: { Separator: -1, Default: 0 },
    ProgressLocation: { SourceControl: 1, Window: 10, Notification: 15 },
    LogLevel: { Off: 0, Trace: 1, Debug: 2, Info: 3, Warning: 4, Error: 5 },
    InlineCompletionTriggerKind: { Invoke: 0, Automatic: 1 },
    env: permissive('env', { appName: 'Visual Studio Code', language: 'en', machineId: 'test', sessionId: 'test', uiKind: 1 }),
    commands: permissive('commands', {
      registerCommand: (id: string, fn: (...args: any[]) => any) => {
        if (commands.has(id)) throw new Error(`command '${id}' already exists`);
        commands.set(id, fn);
        return new Disposable(() => commands.delete(id));
      },
      executeCommand: async (id: string, ...args: any[]) => {
        const fn = commands.get(id);
        if (!fn) throw new Error(`command '${id}' not found`);
        return fn(...args);
      },
      getCommands: async () => [...commands.keys()],
    }),
    window: permissive('window', {
      activeTextEditor: undefined,
      visibleTextEditors: [],
      tabGroups: permissive('tabGroups', { all: [], onDidChangeTabs: never, onDidChangeTabGroups: never }),
      onDidChangeVisibleTextEditors: never,
      onDidChangeActiveTextEditor: never,
      createOutputChannel: (name: string) => logChannel(name),
      createStatusBarItem: () => permissive('StatusBarItem', { text: '', tooltip: '', show() {}, hide() {}, dispose() {} }),
      showErrorMessage: async (m: string) => void messages.push(['error', m]),
      showWarningMessage: async (m: string) => void messages.push(['warning', m]),
      showInformationMessage: async (m: string) => void messages.push(['info', m]),
      withProgress: async (_o: unknown, task: (p: unknown, t: unknown) => unknown) =>
        task({ report() {} }, new CancellationTokenSource().token),
    }),
    workspace: permissive('workspace', {
      workspaceFolders: undefined,
      textDocuments,
      notebookDocuments: [],
      getConfiguration: configuration,
      onDidChangeConfiguration: configChanged.event,
      onDidOpenTextDocument: didOpen.event,
      onDidChangeTextDocument: didChange.event,
      onDidCloseTextDocument: didClose.event,
      onDidSaveTextDocument: never,
      onWillSaveTextDocument: never,
      onDidChangeWorkspaceFolders: never,
      onDidOpenNotebookDocument: never,
      onDidChangeNotebookDocument: never,
      onDidSaveNotebookDocument: never,
      onDidCloseNotebookDocument: never,
      onDidCreateFiles: never,
      onDidRenameFiles: never,
      onDidDeleteFiles: never,
      onWillCreateFiles: never,
      onWillRenameFiles: never,
      onWillDeleteFiles: never,
    }),
    languages: permissive('languages', {
      match: (selector: any, doc: TextDocument) => {
        const list = Array.isArray(selector) ? selector : [selector];
        return list.some((s: any) =>
          typeof s === 'string' ? s === doc.languageId : (!s.language || s.language === doc.languageId) && (!s.scheme || s.scheme === doc.uri.scheme),
        ) ? 10 : 0;
      },
      registerInlineCompletionItemProvider: (selector: unknown, provider: unknown) => {
        inlineProviders.push({ selector, provider });
        return new Disposable(() => inlineProviders.splice(inlineProviders.findIndex((p) => p.provider === provider), 1));
      },
      createDiagnosticCollection: () => permissive('DiagnosticCollection', { set() {}, delete() {}, clear() {}, dispose() {} }),
    }),
  });

  return {
    vscode,
    commands,
    inlineProviders,
    messages,
    logs,
    open(doc: TextDocument) {
      textDocuments.push(doc);
      didOpen.fire(doc);
    },
    change(event: ReturnType<TextDocument['edit']>) {
      didChange.fire(event);
    },
  };
}

/** Route `require('vscode')` to the host's module. */
export function install(host: ReturnType<typeof createHost>) {
  const loader = Module as unknown as { _load: (request: string, ...rest: unknown[]) => unknown };
  const original = loader._load;
  loader._load = function (request: string, ...rest: unknown[]) {
    return request === 'vscode' ? host.vscode : original.call(this, request, ...rest);
  };
}
