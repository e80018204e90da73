/**
 * The extension's settings and what the server is started with. No `vscode` import: the
 * tests feed it plain objects.
 *
 * Model and budget settings travel as initializationOptions (and workspace/didChangeConfiguration
 * afterwards), never as command-line flags: the server layers CLI < initializationOptions <
 * didChangeConfiguration, so a flag could only ever go stale behind a later change. The command
 * line is `<server.path> serve <server.args...>`, the user's own flags.
 */

/** The subset of vscode.WorkspaceConfiguration this module reads. */
export interface ConfigLike {
  get<T>(section: string): T | undefined;
}

export interface ExtensionSettings {
  enable: boolean;
  serverPath: string;
  serverArgs: string[];
  languages: string[];
  preset: string | null;
  draft: string | null;
  target: string | null;
  device: string;
  dtype: string | null;
  allowDownload: boolean;
  trustRemoteCode: boolean;
  maxTokens: number | null;
  debounceMs: number | null;
  timeBudgetMs: number | null;
  contextTokens: number | null;
  workspaceContext: boolean;
  minConfidence: number | null;
  copyWeight: number | null;
  wordBias: number | null;
  exact: boolean;
  remote: string | null;
  remoteModel: string | null;
  apiKeyEnv: string | null;
  logLevel: string | null;
}

/** The keys codespec-lsp reads (codespec_lsp/config.py); it reports any other key as an error. */
export type ServerSettings = Partial<{
  enable: boolean;
  preset: string;
  draft: string;
  target: string;
  device: string;
  dtype: string;
  allowDownload: boolean;
  trustRemoteCode: boolean;
  maxTokens: number;
  debounceMs: number;
  timeBudgetMs: number;
  contextTokens: number;
  workspaceContext: boolean;
  minConfidence: number;
  copyWeight: number;
  wordBias: number;
  exact: boolean;
  remote: string;
  remoteModel: string;
  apiKeyEnv: string;
  logLevel: string;
}>;

function text(v: unknown): string | null {
  return typeof v === 'string' && v.trim() !== '' ? v.trim() : null;
}

function int(v: unknown): number | null {
  return typeof v === 'number' && Number.isInteger(v) ? v : null;
}

function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

function strings(v: unknown, fallback: string[]): string[] {
  if (!Array.isArray(v)) return fallback;
  return v.filter((s): s is string => typeof s === 'string' && s !== '');
}

export function readSettings(cfg: ConfigLike): ExtensionSettings {
  const languages = strings(cfg.get('languages'), ['python']);
  return {
    enable: cfg.get<boolean>('enable') !== false,
    serverPath: text(cfg.get('server.path')) ?? 'codespec-lsp',
    serverArgs: strings(cfg.get('server.args'), []),
    languages: languages.length > 0 ? languages : ['python'],
    preset: text(cfg.get('preset')),
    draft: text(cfg.get('draft')),
    target: text(cfg.get('target')),
    device: text(cfg.get('device')) ?? 'auto',
    dtype: text(cfg.get('dtype')),
    allowDownload: cfg.get<boolean>('allowDownload') === true,
    trustRemoteCode: cfg.get<boolean>('trustRemoteCode') === true,
    maxTokens: int(cfg.get('maxTokens')),
    debounceMs: int(cfg.get('debounceMs')),
    timeBudgetMs: int(cfg.get('timeBudgetMs')),
    contextTokens: int(cfg.get('contextTokens')),
    workspaceContext: cfg.get<boolean>('workspaceContext') !== false,  // on unless turned off
    minConfidence: num(cfg.get('minConfidence')),
    copyWeight: num(cfg.get('copyWeight')),
    wordBias: num(cfg.get('wordBias')),
    exact: cfg.get<boolean>('exact') === true,
    remote: text(cfg.get('remote')),
    remoteModel: text(cfg.get('remoteModel')),
    apiKeyEnv: text(cfg.get('apiKeyEnv')),
    logLevel: text(cfg.get('logLevel')),
  };
}

/** The server-side keys, in the order they are sent. */
export const SERVER_KEYS = [
  'enable', 'preset', 'draft', 'target', 'device', 'dtype', 'allowDownload', 'trustRemoteCode',
  'maxTokens', 'debounceMs', 'timeBudgetMs', 'contextTokens', 'workspaceContext', 'minConfidence', 'copyWeight',
  'wordBias', 'exact', 'remote', 'remoteModel', 'apiKeyEnv', 'logLevel',
] as const;

/**
 * What the server is told: only what is set, so unset settings keep the server's defaults.
 * Booleans always go: a later didChangeConfiguration that left out `allowDownload: false` would
 * leave the server on the `true` it was started with.
 */
export function serverSettings(s: ExtensionSettings): ServerSettings {
  const out: Record<string, unknown> = {};
  for (const key of SERVER_KEYS) {
    const v = s[key];
    if (v === null) continue;
    out[key] = v;
  }
  return out as ServerSettings;
}

export interface ServerCommand {
  command: string;
  args: string[];
}

export function serverCommand(s: ExtensionSettings): ServerCommand {
  // `serve` is explicit so that user flags such as --log-file reach the serve subcommand.
  const args = s.serverArgs[0] === 'serve' ? [...s.serverArgs] : ['serve', ...s.serverArgs];
  return { command: s.serverPath, args };
}

export function documentSelector(s: ExtensionSettings): { scheme: string; language: string }[] {
  return s.languages.flatMap((language) => [
    { scheme: 'file', language },
    { scheme: 'untitled', language },
  ]);
}

/** Settings that only a new server process (or a new client) can apply. */
export function needsRestart(before: ExtensionSettings, after: ExtensionSettings): boolean {
  const same = (a: string[], b: string[]) => a.length === b.length && a.every((x, i) => x === b[i]);
  return (
    before.serverPath !== after.serverPath ||
    !same(before.serverArgs, after.serverArgs) ||
    !same(before.languages, after.languages)
  );
}
