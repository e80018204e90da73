import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ms, percent, statsLines, statusView } from '../src/status';

const ready = {
  state: 'ready',
  requests: 40,
  answered: 31,
  cancelled: 6,
  superseded: 3,
  typing_through_hits: 5,
  cache_reused_tokens: 900,
  prefill_tokens: 120,
  acceptance_rate: 0.8125,
  tokens_per_target_forward: 2.4567,
  latency_ms_p50: 43.4,
  latency_ms_p95: 181.9,
  draft: 'tiny/draft',
  target: 'tiny/target',
  device: 'cpu',
};

test('ready: acceptance rate and median latency in the bar, the rest in the tooltip', () => {
  const v = statusView('running', ready);
  assert.equal(v.text, '$(zap) codespec 81% · 43 ms');
  assert.match(v.tooltip, /draft tiny\/draft → target tiny\/target on cpu/);
  assert.match(v.tooltip, /2\.46 tokens per target forward/);
  assert.match(v.tooltip, /p50 43 ms, p95 182 ms/);
  assert.match(v.tooltip, /31 answered of 40 requests/);
  assert.match(v.tooltip, /Click for details/);
});

test('ready with nothing answered yet shows no made-up numbers', () => {
  const v = statusView('running', { ...ready, answered: 0, acceptance_rate: 0, latency_ms_p50: 0 });
  assert.equal(v.text, '$(zap) codespec');
});

test('loading, with progress when the server reports it', () => {
  assert.equal(statusView('running', { state: 'loading' }).text, '$(loading~spin) codespec: loading');
  assert.equal(statusView('running', { state: 'loading', progress: 0.4 }).text, '$(loading~spin) codespec: loading 40%');
  assert.equal(statusView('running', { state: 'loading', progress: 75 }).text, '$(loading~spin) codespec: loading 75%');
});

test('starting, stopped, disabled and a model error each look different', () => {
  const texts = new Set([
    statusView('starting', null).text,
    statusView('stopped', null, 'spawn codespec-lsp ENOENT').text,
    statusView('disabled', ready).text,
    statusView('running', { state: 'error' }).text,
    statusView('running', ready).text,
  ]);
  assert.equal(texts.size, 5);
  assert.match(statusView('stopped', null, 'spawn codespec-lsp ENOENT').tooltip, /ENOENT/);
  // Off wins over whatever the server last said.
  assert.equal(statusView('disabled', ready).text, '$(circle-slash) codespec');
});

test('numbers are formatted for people; missing ones show a dash', () => {
  assert.equal(percent(0.5), '50%');
  assert.equal(percent(null), '–');
  assert.equal(ms(4.26), '4.3 ms');
  assert.equal(ms(1234.5), '1235 ms');
  assert.equal(ms(undefined), '–');
});

test('details list: contract keys first in a fixed order, then any extra keys sorted', () => {
  const lines = statsLines({ ...ready, zeta: 1, alpha: { nested: true } });
  assert.equal(lines[0], 'state: ready');
  assert.deepEqual(lines.slice(1, 4), ['draft: tiny/draft', 'target: tiny/target', 'device: cpu']);
  assert.ok(lines.includes('acceptance_rate: 81%'));
  assert.ok(lines.includes('tokens_per_target_forward: 2.457'));
  assert.ok(lines.includes('latency_ms_p95: 182 ms'));
  assert.deepEqual(lines.slice(-2), ['alpha: {"nested":true}', 'zeta: 1']);
});

test('the backend is in the bar and the tooltip when the server names it', () => {
  const v = statusView('running', { ...ready, backend: 'vllm' });
  assert.equal(v.text, '$(zap) codespec vllm 81% · 43 ms');
  assert.match(v.tooltip, /^vllm: draft tiny\/draft/);
  assert.equal(statusView('running', { ...ready, answered: 0, backend: 'local' }).text, '$(zap) codespec local');
  assert.equal(statsLines({ state: 'ready', backend: 'llama-server', draft: 'd' })[1], 'backend: llama-server');
});
