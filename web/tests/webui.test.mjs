// The chat page `hesper-rs serve` answers at `/`, in Debian's headless Chromium driven by
// puppeteer-core, against the built binary serving the built-in model with an API key:
//   node web/tests/webui.test.mjs [target/release/hesper-rs]
// The page asks for the key, then a chat turn and a text completion typed into it stream the
// text the API gives for the same request and seed. Prints one line per test and a closing
// `test result:` line in cargo's format; exits 1 when a test fails. Writes the page after a
// chat to target/webui/page.png.
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { launchBrowser } from './harness.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const bin = resolve(process.argv[2] || join(root, 'target/release/hesper-rs'));
const out = join(root, 'target/webui');
const scratch = mkdtempSync(join(tmpdir(), 'hesper-webui-'));
mkdirSync(out, { recursive: true });
const KEY = 'page-test-key';

function assert(cond, message) {
  if (!cond) throw new Error(message);
}

const port = await new Promise((r) => {
  const s = createServer().listen(0, '127.0.0.1', () => {
    const p = s.address().port;
    s.close(() => r(p));
  });
});
const base = `http://127.0.0.1:${port}/`;
const server = spawn(bin, ['serve', '--port', String(port), '--api-key', KEY, '-np', '2', '--log-disable'], {
  stdio: ['ignore', 'ignore', 'inherit'],
});
for (let i = 0; ; i++) {
  const up = await fetch(`${base}health`).then((r) => r.ok, () => false);
  if (up) break;
  assert(i < 300, 'the server did not come up in 30 s');
  await new Promise((r) => setTimeout(r, 100));
}

// The API's answer to a request, with the key.
async function api(path, body) {
  const r = await fetch(base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${await r.text()}`);
  return r.json();
}

const browser = await launchBrowser(join(scratch, 'profile'));
const page = await browser.newPage();
await page.setViewport({ width: 1000, height: 900 });
const consoleLines = [];
page.on('console', (m) => consoleLines.push(m.text()));
page.on('pageerror', (e) => consoleLines.push(`page error: ${e.message}`));
const text = (sel) => page.$eval(sel, (e) => e.textContent);
const set = (sel, value) => page.$eval(sel, (e, v) => { e.value = v; e.dispatchEvent(new Event('change')); }, value);

// Types `message` in the page and sends it; the finished answer's text and how it ended.
async function ask(message) {
  const before = await page.$$eval('.turn.assistant', (t) => t.length);
  await page.type('#prompt', message);
  await page.click('#send');
  await page.waitForFunction((n) => {
    const t = document.querySelectorAll('.turn.assistant');
    return t.length > n && t[t.length - 1].dataset.done;
  }, { timeout: 60_000, polling: 50 }, before);
  return page.$$eval('.turn.assistant', (t) => ({ text: t[t.length - 1].textContent, done: t[t.length - 1].dataset.done }));
}

const tests = [];
const test = (name, fn) => tests.push([name, fn]);
const SAMPLING = { temperature: 0.9, top_k: 40, top_p: 0.95, seed: 7, max_tokens: 24 };

test('the page loads at / without a key, and asks for one', async () => {
  const res = await page.goto(base, { waitUntil: 'load' });
  assert(res.status() === 200, `GET / answered ${res.status()}`);
  await page.waitForFunction(() => !document.querySelector('#model').textContent.startsWith('Connecting'), { timeout: 10_000 });
  const model = await text('#model');
  assert(/API key/.test(model), `the page should ask for the key: ${model}`);
});

test('with the key typed in, it names the model', async () => {
  await set('#api-key', KEY);
  await page.waitForFunction(() => document.querySelector('#model').textContent.includes('hesper-kjv'), { timeout: 10_000 });
  const stored = await page.evaluate(() => sessionStorage.getItem('hesper-api-key'));
  assert(stored === KEY, `the key is kept in the tab: ${stored}`);
});

test("a chat turn streams the API's answer for the same seed", async () => {
  for (const [k, v] of Object.entries(SAMPLING)) await set(`#${k}`, String(v));
  await set('#mode', 'chat');
  const message = 'Who begat Isaac?';
  const got = await ask(message);
  const want = await api('v1/chat/completions', { messages: [{ role: 'user', content: message }], ...SAMPLING });
  const expected = want.choices[0].message.content;
  assert(got.done === 'true', `the answer ended ${got.done}: ${await text('#error')}`);
  assert(expected.length > 0 && got.text === expected, `page ${JSON.stringify(got.text)} vs API ${JSON.stringify(expected)}`);
  const tokens = await page.$eval('#stats', (e) => e.dataset.tokens);
  assert(tokens === String(want.usage.completion_tokens), `stats ${tokens} vs ${want.usage.completion_tokens}`);
  // The second turn goes with the first one's history.
  const second = await ask('And then?');
  const again = await api('v1/chat/completions', {
    messages: [{ role: 'user', content: message }, { role: 'assistant', content: expected }, { role: 'user', content: 'And then?' }],
    ...SAMPLING,
  });
  assert(second.text === again.choices[0].message.content, `second turn ${JSON.stringify(second.text)} vs ${JSON.stringify(again.choices[0].message.content)}`);
  await page.screenshot({ path: join(out, 'page.png'), fullPage: true });
});

test("a text completion streams the API's text", async () => {
  await page.click('#new-chat');
  await set('#mode', 'complete');
  const prompt = 'And it came to pass';
  const got = await ask(prompt);
  const want = await api('v1/completions', { prompt, ...SAMPLING });
  assert(got.text === want.choices[0].text, `page ${JSON.stringify(got.text)} vs API ${JSON.stringify(want.choices[0].text)}`);
});

test('a wrong key is an error line, not an answer', async () => {
  await set('#api-key', 'wrong');
  const got = await ask('Hello');
  assert(got.done === 'failed', `ended ${got.done}`);
  const error = await text('#error');
  assert(/Invalid API Key/.test(error) && /API key above/.test(error), error);
  await set('#api-key', KEY);
});

let passed = 0;
let failed = 0;
for (const [name, fn] of tests) {
  const t0 = Date.now();
  try {
    await fn();
    passed++;
    console.log(`test ${name} ... ok (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } catch (e) {
    failed++;
    console.log(`test ${name} ... FAILED (${((Date.now() - t0) / 1000).toFixed(1)} s)\n    ${e.message}`);
    await page.screenshot({ path: join(out, `failed-${passed + failed}.png`), fullPage: true }).catch(() => {});
  }
}
if (failed) console.log(`browser console:\n  ${consoleLines.slice(-30).join('\n  ')}`);
console.log(`page: ${join(out, 'page.png')}`);
console.log(`\ntest result: ${failed ? 'FAILED' : 'ok'}. ${passed} passed; ${failed} failed; 0 ignored; 0 measured; 0 filtered out`);
await browser.close();
server.kill();
rmSync(scratch, { recursive: true, force: true });
process.exit(failed ? 1 : 0);
