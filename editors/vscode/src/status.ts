/**
 * Status-bar text, tooltip and the details list from `codespec/stats`. No `vscode` import: the
 * tests feed it plain objects. Codicons (`$(name)`) are the status bar's own icon syntax.
 */

/** `codespec/stats` as the server sends it; every field may be missing from an older server. */
export interface Stats {
  state?: 'loading' | 'ready' | 'error' | string;
  requests?: number;
  answered?: number;
  cancelled?: number;
  superseded?: number;
  typing_through_hits?: number;
  cache_reused_tokens?: number;
  prefill_tokens?: number;
  acceptance_rate?: number | null;
  tokens_per_target_forward?: number | null;
  latency_ms_p50?: number | null;
  latency_ms_p95?: number | null;
  draft?: string | null;
  target?: string | null;
  device?: string | null;
  /** `local`, `vllm`, `llama-server` or `openai` (servers with the remote backend). */
  backend?: string | null;
  [key: string]: unknown;
}

/** What the extension knows besides the stats. */
export type Phase = 'starting' | 'running' | 'stopped' | 'disabled';

export interface StatusView {
  text: string;
  tooltip: string;
}

function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

export function percent(v: unknown): string {
  const n = num(v);
  return n === null ? '–' : `${Math.round(n * 100)}%`;
}

export function ms(v: unknown): string {
  const n = num(v);
  return n === null ? '–' : `${n < 10 ? n.toFixed(1) : Math.round(n)} ms`;
}

/** A loading server may say how far it is: a 0..1 fraction or a 0..100 percentage. */
function progress(stats: Stats): string {
  for (const key of ['progress', 'load_progress']) {
    const n = num(stats[key]);
    if (n !== null) return ` ${Math.round(n <= 1 ? n * 100 : n)}%`;
  }
  return '';
}

function models(stats: Stats): string {
  const where = stats.device ? ` on ${stats.device}` : '';
  const backend = stats.backend ? `${stats.backend}: ` : '';
  return `${backend}draft ${stats.draft ?? '?'} → target ${stats.target ?? '?'}${where}`;
}

/** The backend as the status bar names it, e.g. ` vllm`; nothing from a server that does not say. */
function backendLabel(stats: Stats): string {
  return typeof stats.backend === 'string' && stats.backend !== '' ? ` ${stats.backend}` : '';
}

export function statusView(phase: Phase, stats?: Stats | null, error?: string): StatusView {
  const click = 'Click for details';
  if (phase === 'disabled') {
    return { text: '$(circle-slash) codespec', tooltip: `codespec: suggestions are off. ${click}` };
  }
  if (phase === 'stopped') {
    return {
      text: '$(error) codespec',
      tooltip: `codespec-lsp is not running${error ? `: ${error}` : ''}. ${click}`,
    };
  }
  if (phase === 'starting' || !stats) {
    return { text: '$(sync~spin) codespec', tooltip: 'codespec-lsp is starting' };
  }
  if (stats.state === 'loading') {
    return {
      text: `$(loading~spin) codespec: loading${progress(stats)}`,
      tooltip: `Loading ${models(stats)}. Suggestions start once the models are ready.`,
    };
  }
  if (stats.state === 'error') {
    const why = typeof stats.error === 'string' ? `: ${stats.error}` : '';
    return {
      text: '$(error) codespec: model error',
      tooltip: `The models failed to load${why}. See "codespec: Show the server log". ${click}`,
    };
  }
  const answered = num(stats.answered) ?? 0;
  const text =
    answered === 0
      ? `$(zap) codespec${backendLabel(stats)}`
      : `$(zap) codespec${backendLabel(stats)} ${percent(stats.acceptance_rate)} · ${ms(stats.latency_ms_p50)}`;
  const tooltip = [
    models(stats),
    `draft acceptance ${percent(stats.acceptance_rate)}, ` +
      `${num(stats.tokens_per_target_forward)?.toFixed(2) ?? '–'} tokens per target forward`,
    `latency p50 ${ms(stats.latency_ms_p50)}, p95 ${ms(stats.latency_ms_p95)}`,
    `${answered} answered of ${num(stats.requests) ?? 0} requests`,
    click,
  ].join('\n');
  return { text, tooltip };
}

/** One line per stat, for the details list; known keys first in a fixed order. */
export function statsLines(stats: Stats): string[] {
  const order = [
    'state', 'backend', 'draft', 'target', 'device', 'requests', 'answered', 'cancelled', 'superseded',
    'typing_through_hits', 'acceptance_rate', 'tokens_per_target_forward', 'latency_ms_p50',
    'latency_ms_p95', 'cache_reused_tokens', 'prefill_tokens',
  ];
  const keys = [...order.filter((k) => k in stats), ...Object.keys(stats).filter((k) => !order.includes(k)).sort()];
  return keys.map((k) => {
    const v = stats[k];
    let shown: string;
    if (k === 'acceptance_rate') shown = percent(v);
    else if (k.startsWith('latency_ms')) shown = ms(v);
    else if (typeof v === 'number' && !Number.isInteger(v)) shown = v.toFixed(3);
    else if (v !== null && typeof v === 'object') shown = JSON.stringify(v);
    else shown = String(v);
    return `${k}: ${shown}`;
  });
}
