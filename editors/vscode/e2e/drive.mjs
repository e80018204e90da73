// Drives a real VS Code (code-server, started by tests/test_vscode_e2e.py) in headless Chromium
// through puppeteer-core, as a user would: open a Python file, type, wait for the ghost text,
// press Tab, save; then type fast and look at what is drawn. Writes what it saw to $E2E_OUT
// (JSON); the assertions live in the Python test.
//
// Environment: E2E_DIR (the cache with node_modules), E2E_URL, E2E_FILE (file name to open),
// E2E_OUT, E2E_CHROMIUM, E2E_PROFILE (a fresh Chromium profile folder), E2E_TIMEOUT_MS.

import { createRequire } from 'node:module';
import { writeFileSync } from 'node:fs';

const env = process.env;
const require = createRequire(`${env.E2E_DIR}/package.json`);
const puppeteer = require('puppeteer-core');

const TIMEOUT = Number(env.E2E_TIMEOUT_MS || 240000);
const result = { ok: false, log: [] };
const t0 = Date.now();
const log = (m) => result.log.push(`${String(Date.now() - t0).padStart(7)} ms  ${m}`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(what, probe, ms = TIMEOUT) {
  const start = Date.now();
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() - start > ms) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(100);
  }
}

// What the editor draws as ghost text: the inline part on the cursor's line and the lines
// below it, with the cursor's position, read from the DOM as a user would see it.
const ghost = (page) =>
  page.evaluate(() => {
    const editor = document.querySelector('.monaco-editor.focused') || document.querySelector('.monaco-editor');
    if (!editor) return null;
    const inline = [...editor.querySelectorAll('.ghost-text-decoration, .ghost-text-decoration-preview')];
    const below = [...editor.querySelectorAll('.ghost-text .view-line, .suggest-preview-text .view-line')];
    const cursor = editor.querySelector('.cursors-layer .cursor');
    const box = (el) => {
      const r = el.getBoundingClientRect();
      return { top: Math.round(r.top), left: Math.round(r.left), height: Math.round(r.height) };
    };
    const text = (el) => el.textContent.replace(/\u00a0/g, ' ');
    return {
      inline: inline.map(text),
      inlineBoxes: inline.map(box),
      below: below.map(text),
      cursor: cursor ? box(cursor) : null,
    };
  });

const statusText = (page) =>
  page.evaluate(() => {
    const items = [...document.querySelectorAll('.statusbar-item')];
    const mine = items.find((el) => /codespec/.test(el.getAttribute('aria-label') || el.textContent));
    if (!mine) return null;
    return {
      text: mine.textContent.trim(),
      label: mine.getAttribute('aria-label') || '',
      icons: [...mine.querySelectorAll('.codicon')].map((i) => i.className),
    };
  });

async function runCommand(page, title) {
  await page.keyboard.press('F1');
  await page.waitForSelector('.quick-input-widget input', { visible: true });
  await page.keyboard.type(title);
  await sleep(400);
  await page.keyboard.press('Enter');
}

async function main() {
  const browser = await puppeteer.launch({
    executablePath: env.E2E_CHROMIUM,
    headless: true,
    userDataDir: env.E2E_PROFILE,
    // Debian's chromium as root in a container, no GPU, no network beyond 127.0.0.1.
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--window-size=1400,900',
    ],
    defaultViewport: { width: 1400, height: 900 },
  });
  try {
    const page = await browser.newPage();
    page.setDefaultTimeout(TIMEOUT);
    page.on('pageerror', (e) => log(`page error: ${e.message}`));
    await page.goto(env.E2E_URL, { waitUntil: 'domcontentloaded' });
    await page.waitForSelector('.monaco-workbench', { timeout: TIMEOUT });
    log('workbench up');

    // Quick Open the file, as a user would.
    await waitFor('the explorer', () => page.$('.explorer-folders-view, .explorer-viewlet'), 60000).catch(() => null);
    await page.keyboard.down('Control');
    await page.keyboard.press('KeyP');
    await page.keyboard.up('Control');
    await page.waitForSelector('.quick-input-widget input', { visible: true });
    await page.keyboard.type(env.E2E_FILE);
    // Enter only once Quick Open lists the file: on a busy machine its file search can take
    // seconds, and an Enter before that opens nothing.
    await waitFor('the file in Quick Open', () =>
      page.evaluate((name) => [...document.querySelectorAll('.quick-input-list .monaco-list-row')]
        .some((r) => (r.getAttribute('aria-label') || r.textContent || '').includes(name)), env.E2E_FILE), 60000);
    await sleep(200);
    await page.keyboard.press('Enter');
    await page.waitForSelector('.monaco-editor .view-lines', { visible: true });
    await waitFor('the file in the editor', () =>
      page.evaluate(() => /fibonacci/.test(document.querySelector('.monaco-editor .view-lines')?.textContent || '')));
    log('file open');

    // The extension starts the server for the Python file; wait for the models.
    const status = await waitFor('the codespec status to say ready', async () => {
      const s = await statusText(page);
      return s && s.icons.some((c) => c.includes('codicon-zap')) && s;
    });
    result.status_ready = status;
    log(`status: ${status.text}`);

    // Type at the end of the file, pause, and wait for the ghost text.
    await page.click('.monaco-editor .view-lines');
    await page.keyboard.down('Control');
    await page.keyboard.press('End');
    await page.keyboard.up('Control');
    await page.keyboard.type(env.E2E_TYPE_SLOW, { delay: 80 });
    const shown = await waitFor('ghost text', async () => {
      const g = await ghost(page);
      return g && g.inline.join('').trim() !== '' && g;
    });
    result.shown = shown;
    log(`ghost text: ${JSON.stringify(shown.inline)} + ${shown.below.length} lines`);
    await sleep(300);
    await page.keyboard.press('Tab');
    await sleep(300);
    result.after_tab = await ghost(page);
    await page.keyboard.down('Control');
    await page.keyboard.press('KeyS');
    await page.keyboard.up('Control');
    await sleep(800);
    result.saved_after_accept = true;
    log('accepted and saved');

    // A new line, typed fast: every keystroke asks, stale answers must not be drawn.
    await page.keyboard.down('Control');
    await page.keyboard.press('End');
    await page.keyboard.up('Control');
    await page.keyboard.press('Enter');
    // Whatever auto-indent put there goes, so the line holds exactly what is typed.
    await page.keyboard.down('Shift');
    await page.keyboard.press('Home');
    await page.keyboard.up('Shift');
    await page.keyboard.press('Backspace');
    await page.keyboard.type(env.E2E_TYPE_FAST, { delay: 15 });
    const fast = await waitFor('ghost text after fast typing', async () => {
      const g = await ghost(page);
      return g && g.inline.join('').trim() !== '' && g;
    });
    await sleep(1500); // anything stale still in flight would land now
    result.fast = await ghost(page);
    result.fast_first = fast;
    await page.keyboard.press('Escape');
    await page.keyboard.down('Control');
    await page.keyboard.press('KeyS');
    await page.keyboard.up('Control');
    await sleep(800);
    log(`fast: ${JSON.stringify(result.fast.inline)}`);

    // The extension's statistics (quick pick): the server's counts of cancelled/superseded work.
    await runCommand(page, 'codespec: Show statistics');
    result.stats_items = await waitFor('the statistics list', () =>
      page.evaluate(() => {
        const rows = [...document.querySelectorAll('.quick-input-list .monaco-list-row')];
        const labels = rows.map((r) => r.getAttribute('aria-label') || r.textContent);
        return labels.some((l) => /^requests: /.test(l)) && labels;
      }), 30000);
    await page.keyboard.press('Escape');
    result.ok = true;
  } catch (err) {
    result.error = String(err && err.stack ? err.stack : err);
  } finally {
    result.seconds = (Date.now() - t0) / 1000;
    writeFileSync(env.E2E_OUT, JSON.stringify(result, null, 1));
    await browser.close();
  }
}

await main();
