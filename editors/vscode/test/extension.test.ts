import assert from 'node:assert/strict';
import { afterEach, beforeEach, test } from 'node:test';

import { FakeClient, type FakeVscode, install, makeVscode, State } from './stubs';

// package.json's defaults, plus the user's choices the tests look for.
const settings = {
  enable: true,
  'server.path': '/venv/bin/codespec-lsp',
  'server.args': ['--log-file', '/tmp/codespec.log'],
  languages: ['python'],
  preset: 'tiny',
  draft: null,
  target: null,
  device: 'cpu',
  maxTokens: null,
  debounceMs: null,
  contextTokens: null,
};

let vscode: FakeVscode;
let ext: typeof import('../src/extension');

beforeEach(() => {
  FakeClient.instances = [];
  FakeClient.failStart = null;
  FakeClient.statsReply = { state: 'loading' };
  vscode = makeVscode({ ...settings });
  install(vscode);
  // A fresh module per test: it binds `vscode` when loaded.
  delete require.cache[require.resolve('../src/extension')];
  ext = require('../src/extension');
});

afterEach(async () => {
  await ext.deactivate();
});

const context = () => ({ subscriptions: [] as { dispose(): unknown }[] }) as any;
const settle = () => new Promise((r) => setTimeout(r, 20));
const neverCancelled = { isCancellationRequested: false };
const defaultSwitches = { allowDownload: false, trustRemoteCode: false, workspaceContext: true, exact: false };

test('activation starts the configured server with the settings as initializationOptions', async () => {
  await ext.activate(context());
  assert.equal(FakeClient.instances.length, 1);
  const client = FakeClient.instances[0];
  assert.deepEqual(client.serverOptions, {
    command: '/venv/bin/codespec-lsp',
    args: ['serve', '--log-file', '/tmp/codespec.log'],
  });
  assert.deepEqual(client.clientOptions.initializationOptions(), {
    enable: true, device: 'cpu', preset: 'tiny', allowDownload: false, trustRemoteCode: false, workspaceContext: true,
    exact: false,
  });
  assert.deepEqual(client.clientOptions.documentSelector, [
    { scheme: 'file', language: 'python' },
    { scheme: 'untitled', language: 'python' },
  ]);
  assert.equal(client.state, State.Running);
  assert.deepEqual(
    [...vscode.commands.keys()].sort(),
    ['codespec.restart', 'codespec.showLog', 'codespec.showStats', 'codespec.toggle'],
  );
  assert.equal(vscode.statusItem.command, 'codespec.showStats');
});

test('the status bar follows codespec/stats: loading, then acceptance and latency', async () => {
  const codespec = await ext.activate(context());
  await settle();
  assert.equal(vscode.statusItem.text, '$(loading~spin) codespec: loading');
  FakeClient.statsReply = { state: 'ready', answered: 4, requests: 5, acceptance_rate: 0.5, latency_ms_p50: 120 };
  await codespec.fetchStats();
  assert.equal(vscode.statusItem.text, '$(zap) codespec 50% · 120 ms');
  assert.ok(FakeClient.instances[0].requests.includes('codespec/stats'));
});

test('toggle writes the setting, tells the server, and stops asking it for completions', async () => {
  await ext.activate(context());
  const client = FakeClient.instances[0];
  await vscode.commands.get('codespec.toggle')!();
  assert.deepEqual(vscode.updates, [['enable', false, 1]]);
  assert.deepEqual(client.notifications.at(-1), [
    'workspace/didChangeConfiguration',
    { settings: { enable: false, device: 'cpu', preset: 'tiny', ...defaultSwitches } },
  ]);
  assert.equal(vscode.statusItem.text, '$(circle-slash) codespec');
  let asked = false;
  const result = await client.clientOptions.middleware.provideInlineCompletionItems(
    {}, {}, {}, neverCancelled, async () => ((asked = true), []),
  );
  assert.equal(result, null);
  assert.equal(asked, false);
  assert.equal(FakeClient.instances.length, 1, 'a toggle must not restart the server');
});

test('an answer that reaches VS Code is reported shown; a cancelled one is not', async () => {
  await ext.activate(context());
  const client = FakeClient.instances[0];
  const item = {
    insertText: 'return n',
    command: { title: 'codespec: accepted', command: 'codespec.didAcceptCompletion', arguments: ['c1'] },
  };
  const provide = client.clientOptions.middleware.provideInlineCompletionItems;
  const answer = await provide({}, {}, {}, neverCancelled, async () => ({ items: [item] }));
  assert.deepEqual(answer, { items: [item] });
  assert.deepEqual(client.notifications, [['codespec/didShowCompletion', { item }]]);
  await provide({}, {}, {}, { isCancellationRequested: true }, async () => [item]);
  assert.equal(client.notifications.length, 1);
});

test('a new server path restarts the server; a model setting only reconfigures it', async () => {
  const codespec = await ext.activate(context());
  const first = FakeClient.instances[0];
  // A model setting: one notification to the same server, which reloads by itself.
  vscode.config.maxTokens = 32;
  await codespec.onSettingsChanged();
  assert.equal(FakeClient.instances.length, 1);
  assert.deepEqual(first.notifications.at(-1), [
    'workspace/didChangeConfiguration',
    { settings: { enable: true, device: 'cpu', preset: 'tiny', maxTokens: 32, ...defaultSwitches } },
  ]);
  // The executable: the old server stops, a new one starts with the new command.
  vscode.config['server.path'] = '/other/codespec-lsp';
  await codespec.onSettingsChanged();
  assert.ok(first.stopped && first.disposed);
  assert.equal(FakeClient.instances.length, 2);
  assert.equal(FakeClient.instances[1].serverOptions.command, '/other/codespec-lsp');
  assert.equal(FakeClient.instances[1].state, State.Running);
});

test('a server that cannot start leaves an error in the status bar and a way to fix it', async () => {
  FakeClient.failStart = new Error('spawn /venv/bin/codespec-lsp ENOENT');
  await ext.activate(context());
  assert.equal(vscode.statusItem.text, '$(error) codespec');
  assert.match(vscode.statusItem.tooltip, /ENOENT/);
  assert.equal(vscode.errors.length, 1);
  assert.ok(vscode.errors[0].includes('Open Settings'));
});

test('show stats lists actions and every stat; show log opens the output channel', async () => {
  FakeClient.statsReply = { state: 'ready', answered: 1, requests: 1, acceptance_rate: 1, draft: 'd', target: 't' };
  await ext.activate(context());
  await vscode.commands.get('codespec.showStats')!();
  const labels = vscode.quickPicks[0].items.map((i: any) => i.label);
  assert.ok(labels.some((l: string) => l.includes('Restart the server')));
  assert.ok(labels.includes('state: ready'));
  assert.ok(labels.includes('acceptance_rate: 100%'));
  await vscode.commands.get('codespec.showLog')!();
  assert.equal(vscode.outputShown, 1);
});


test('with no document of a configured language open, the server waits for one', async () => {
  vscode.documents = [{ languageId: 'markdown', uri: { scheme: 'file' } }];
  vscode.config.languages = ['python', 'rust'];
  await ext.activate(context());
  assert.equal(FakeClient.instances.length, 0, 'no server for a markdown file');
  assert.equal(vscode.statusItem.shown, false, 'no status before there is a server');
  vscode.openDocument('rust');
  await settle();
  assert.equal(FakeClient.instances.length, 1, 'a rust file (in codespec.languages) starts it');
  assert.equal(vscode.statusItem.shown, true);
  vscode.openDocument('python');
  await settle();
  assert.equal(FakeClient.instances.length, 1, 'one server for every language');
});

test('codespec/ready makes VS Code ask again at the cursor, once per load', async () => {
  const codespec = await ext.activate(context());
  const client = FakeClient.instances[0];
  client.receive('codespec/ready', {});
  assert.deepEqual(vscode.executed, ['editor.action.inlineSuggest.trigger']);
  // The stats poll seeing loading turn to ready reports the same load: no second trigger.
  FakeClient.statsReply = { state: 'loading' };
  await codespec.fetchStats();
  FakeClient.statsReply = { state: 'ready' };
  await codespec.fetchStats();
  assert.equal(codespec.reasked, 1);
  assert.equal(vscode.executed.length, 1);
});

test('a server without codespec/ready: the poll seeing the load end re-asks', async () => {
  const codespec = await ext.activate(context());
  FakeClient.statsReply = { state: 'loading' };
  await codespec.fetchStats();
  assert.deepEqual(vscode.executed, []);
  FakeClient.statsReply = { state: 'ready' };
  await codespec.fetchStats();
  assert.deepEqual(vscode.executed, ['editor.action.inlineSuggest.trigger']);
});

test('ready does not trigger in an editor of another language, or while suggestions are off', async () => {
  vscode.activeLanguage = 'markdown';
  const codespec = await ext.activate(context());
  FakeClient.instances[0].receive('codespec/ready');
  assert.deepEqual(vscode.executed, []);
  assert.equal(codespec.reasked, 0);
});

test('the server stderr goes to the output channel at each line\'s own level', async () => {
  await ext.activate(context());
  const { Readable } = await import('node:stream');
  const lines: [string, string][] = [];
  const channel = Object.fromEntries(
    ['trace', 'debug', 'info', 'warn', 'error'].map((l) => [l, (m: string) => lines.push([l, m])]),
  );
  const stderr = Readable.from([
    '2026-12-03 18:00:00,001 INFO codespec_lsp: loading tiny\n',
    '2026-12-03 18:00:01,002 DEBUG codespec_lsp.lsp.scheduler: request 3 file.py 4:8 shown 12 tokens 40 ms\n',
    '2026-12-03 18:00:02,003 ERROR codespec_lsp: load failed\nTraceback (most recent call last):\n',
    '2026-12-03 18:00:03,004 WARNING codespec_lsp: slow\n',
  ]);
  FakeClient.instances[0].clientOptions.stdioOptions.stderr(stderr, channel);
  await new Promise((r) => setTimeout(r, 50));
  assert.deepEqual(lines.map(([l]) => l), ['info', 'debug', 'error', 'error', 'warn']);
});
