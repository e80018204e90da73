/**
 * The compiled extension, the real vscode-languageclient and the real codespec-lsp, with
 * vscode-shim standing in for VS Code itself. Runs only when $CODESPEC_LSP names the server
 * executable (tests/test_vscode.py sets it); `npm test` does not include it.
 */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { CancellationTokenSource, createHost, install, missing, Position, Range, TextDocument, Uri } from './vscode-shim';

const server = process.env.CODESPEC_LSP;
const RUNNING = 2; // vscode-languageclient State.Running

async function waitFor<T>(what: string, probe: () => Promise<T | undefined | null | false>, ms: number): Promise<T> {
  const t0 = Date.now();
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() - t0 > ms) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

test(
  'the extension serves inline completions from the real server and reports accepts',
  { skip: server ? false : 'set $CODESPEC_LSP to a codespec-lsp executable', timeout: 600_000 },
  async () => {
    const settings: Record<string, unknown> = {
      enable: true,
      'server.path': server,
      'server.args': process.env.CODESPEC_LSP_LOG ? ['--log-file', process.env.CODESPEC_LSP_LOG] : [],
      languages: ['python'],
      preset: 'tiny',
      device: 'cpu',
    };
    const host = createHost(settings);
    install(host);
    const ext: typeof import('../src/extension') = require('../src/extension');
    // A Python file is open when the extension activates: that starts the server.
    const doc = new TextDocument(
      Uri.file('/tmp/codespec-itest/fib.py'),
      'python',
      'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n',
    );
    host.open(doc);
    const codespec = await ext.activate({ subscriptions: [] } as any);
    try {
      assert.equal(codespec.client?.state, RUNNING, host.logs.join('\n'));
      // The server advertised inline completion, so the client registered a provider for it.
      assert.equal(host.inlineProviders.length, 1, `missing APIs: ${[...missing].join(', ')}`);
      const provider = host.inlineProviders[0].provider;

      const stats = await waitFor('the models to load', async () => {
        const s = await codespec.fetchStats();
        if (s?.state === 'error') throw new Error(`model load failed: ${JSON.stringify(s)}`);
        return s?.state === 'ready' && s;
      }, 300_000);
      assert.match(String(stats.target), /tiny/);

      const at = new Position(2, 8);
      const ask = () =>
        provider.provideInlineCompletionItems(doc, at, { triggerKind: 0, selectedCompletionInfo: undefined }, new CancellationTokenSource().token);
      const result = await ask();
      const items = Array.isArray(result) ? result : result?.items;
      assert.ok(items && items.length >= 1, `no suggestion: ${JSON.stringify(result)}`);
      const item = items[0];
      assert.equal(typeof item.insertText, 'string');
      assert.ok(item.insertText.trim().length > 0);
      assert.deepEqual([item.range.start.line, item.range.start.character], [2, 8]);
      assert.equal(item.command.command, 'codespec.didAcceptCompletion');

      // Accepting: VS Code inserts the text, then runs the item's command, which the client
      // registered from the server's executeCommandProvider.
      host.change(doc.edit(new Range(at, at), item.insertText));
      await host.vscode.commands.executeCommand(item.command.command, ...(item.command.arguments ?? []));
      const counters: any = await codespec.client!.sendRequest('codespec/counters');
      assert.equal(counters.accepted, 1, JSON.stringify(counters));
      assert.ok(counters.shown >= 1, `didShowCompletion not counted: ${JSON.stringify(counters)}`);

      // Off: the extension stops asking, and the server is told.
      await host.vscode.commands.executeCommand('codespec.toggle');
      assert.equal(settings.enable, false);
      assert.equal(await ask(), null);
    } finally {
      await ext.deactivate();
    }
    assert.equal(codespec.client, undefined);
  },
);
