import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  documentSelector,
  needsRestart,
  readSettings,
  serverCommand,
  serverSettings,
} from '../src/settings';

/** A WorkspaceConfiguration as VS Code builds it: dotted keys under the `codespec` section. */
function config(values: Record<string, unknown>) {
  return { get: <T>(key: string) => values[key] as T | undefined };
}

// The defaults package.json declares; VS Code hands them over when nothing is set.
const defaults = {
  enable: true,
  'server.path': 'codespec-lsp',
  'server.args': [],
  languages: ['python'],
  preset: null,
  draft: null,
  target: null,
  device: 'auto',
  maxTokens: null,
  debounceMs: null,
  timeBudgetMs: null,
  contextTokens: null,
  dtype: null,
  allowDownload: false,
  trustRemoteCode: false,
  workspaceContext: true,
  minConfidence: null,
  copyWeight: null,
  wordBias: null,
  exact: false,
  remote: null,
  remoteModel: null,
  apiKeyEnv: null,
  logLevel: null,
};

const defaultSwitches = { allowDownload: false, trustRemoteCode: false, workspaceContext: true, exact: false };

test('defaults start `codespec-lsp serve` and tell the server only enable, device and the switches', () => {
  const s = readSettings(config(defaults));
  assert.deepEqual(serverCommand(s), { command: 'codespec-lsp', args: ['serve'] });
  // The switches always go, so turning one off later reaches a server started with it on.
  assert.deepEqual(serverSettings(s), { enable: true, device: 'auto', ...defaultSwitches });
});

test('workspace context is on unless the user turns it off', () => {
  const { workspaceContext: _, ...unset } = defaults;
  assert.equal(serverSettings(readSettings(config(unset))).workspaceContext, true);
  assert.equal(serverSettings(readSettings(config({ ...defaults, workspaceContext: false }))).workspaceContext, false);
});

test('every server setting goes under its own key', () => {
  const s = readSettings(
    config({
      ...defaults,
      dtype: 'bfloat16',
      allowDownload: true,
      trustRemoteCode: true,
      workspaceContext: true,
      minConfidence: 0.35,
      copyWeight: 0,
      wordBias: 4,
      exact: true,
      remote: 'http://127.0.0.1:8000/v1',
      remoteModel: 'codellama',
      apiKeyEnv: 'VLLM_KEY',
      logLevel: 'debug',
    }),
  );
  assert.deepEqual(serverSettings(s), {
    enable: true,
    device: 'auto',
    dtype: 'bfloat16',
    allowDownload: true,
    trustRemoteCode: true,
    workspaceContext: true,
    minConfidence: 0.35,
    copyWeight: 0,
    wordBias: 4,
    exact: true,
    remote: 'http://127.0.0.1:8000/v1',
    remoteModel: 'codellama',
    apiKeyEnv: 'VLLM_KEY',
    logLevel: 'debug',
  });
});

test('set values become initializationOptions in the server\'s camelCase keys', () => {
  const s = readSettings(
    config({
      ...defaults,
      preset: 'tiny',
      draft: ' ./draft ',
      target: '/models/target',
      device: 'cuda:1',
      maxTokens: 64,
      debounceMs: 0,
      timeBudgetMs: 400,
      contextTokens: 1024,
      enable: false,
    }),
  );
  assert.deepEqual(serverSettings(s), {
    enable: false,
    preset: 'tiny',
    draft: './draft',
    target: '/models/target',
    device: 'cuda:1',
    maxTokens: 64,
    debounceMs: 0,
    timeBudgetMs: 400,
    contextTokens: 1024,
    ...defaultSwitches,
  });
});

test('the server never receives keys it does not know (it reports them as errors)', () => {
  const s = readSettings(config({ ...defaults, preset: 'tiny', 'server.args': ['--log-file', 'x'] }));
  const known = [
    'enable', 'preset', 'draft', 'target', 'device', 'dtype', 'allowDownload', 'trustRemoteCode',
    'maxTokens', 'debounceMs', 'timeBudgetMs', 'contextTokens', 'workspaceContext', 'minConfidence', 'copyWeight',
    'wordBias', 'exact', 'remote', 'remoteModel', 'apiKeyEnv', 'logLevel',
  ];
  for (const key of Object.keys(serverSettings(s))) assert.ok(known.includes(key), key);
});

test('blank strings, wrong types and fractions count as unset', () => {
  const s = readSettings(
    config({ ...defaults, preset: '  ', device: '', maxTokens: 12.5, debounceMs: '40', 'server.path': ' ' }),
  );
  assert.equal(s.preset, null);
  assert.equal(s.device, 'auto');
  assert.equal(s.maxTokens, null);
  assert.equal(s.debounceMs, null);
  assert.equal(s.serverPath, 'codespec-lsp');
});

test('user arguments follow `serve`, which is not repeated', () => {
  const withArgs = readSettings(config({ ...defaults, 'server.path': '/venv/bin/codespec-lsp', 'server.args': ['--log-file', '/tmp/c.log'] }));
  assert.deepEqual(serverCommand(withArgs), {
    command: '/venv/bin/codespec-lsp',
    args: ['serve', '--log-file', '/tmp/c.log'],
  });
  const explicit = readSettings(config({ ...defaults, 'server.args': ['serve', '--tcp'] }));
  assert.deepEqual(serverCommand(explicit).args, ['serve', '--tcp']);
});

test('each language is completed in files and untitled buffers; an empty list falls back to python', () => {
  const s = readSettings(config({ ...defaults, languages: ['python', 'cython'] }));
  assert.deepEqual(documentSelector(s), [
    { scheme: 'file', language: 'python' },
    { scheme: 'untitled', language: 'python' },
    { scheme: 'file', language: 'cython' },
    { scheme: 'untitled', language: 'cython' },
  ]);
  assert.deepEqual(readSettings(config({ ...defaults, languages: [] })).languages, ['python']);
});

test('only the executable, its arguments and the languages need a new server', () => {
  const base = readSettings(config(defaults));
  const change = (patch: Record<string, unknown>) => needsRestart(base, readSettings(config({ ...defaults, ...patch })));
  assert.equal(change({ 'server.path': '/other/codespec-lsp' }), true);
  assert.equal(change({ 'server.args': ['--log-file', 'x'] }), true);
  assert.equal(change({ languages: ['python', 'cython'] }), true);
  // Model settings reload inside the running server (workspace/didChangeConfiguration).
  assert.equal(change({ preset: 'tiny', device: 'cpu', maxTokens: 10 }), false);
  assert.equal(change({ enable: false }), false);
});
