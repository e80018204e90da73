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
  maxTokens: number | null;
  debounceMs: number | null;
  contextTokens: number | null;
}

/** The keys codespec-lsp reads (codespec_lsp/config.py); it reports any other key as an error. */
export type ServerSettings = Partial<{
  enable: boolean;
  preset: string;
  draft: string;
  target: string;
  device: string;
  maxTokens: number;
  debounceMs: number;
  contextTokens: number;
}>;

function text(v: unknown): string | null {
  return typeof v === 'string' && v.trim() !== '' ? v.trim() : null;
}

function int(v: unknown): number | null {
  return typeof v === 'number' && Number.isInteger(v) ? v : null;
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
    maxTokens: int(cfg.get('maxTokens')),
    debounceMs: int(cfg.get('debounceMs')),
    contextTokens: int(cfg.get('contextTokens')),
  };
}

/** What the server is told: only what is set, so unset settings keep the server's defaults. */
export function serverSettings(s: ExtensionSettings): ServerSettings {
  const out: ServerSettings = { enable: s.enable, device: s.device };
  if (s.preset !== null) out.preset = s.preset;
  if (s.draft !== null) out.draft = s.draft;
  if (s.target !== null) out.target = s.target;
  if (s.maxTokens !== null) out.maxTokens = s.maxTokens;
  if (s.debounceMs !== null) out.debounceMs = s.debounceMs;
  if (s.contextTokens !== null) out.contextTokens = s.contextTokens;
  return out;
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
